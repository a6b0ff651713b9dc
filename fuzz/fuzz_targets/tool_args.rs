#![no_main]
//! The `tool_args` target: its properties are in `fuzz/props/tool_args.rs`, where the
//! test suite also replays every committed seed (tests/api/fuzz_seeds.rs).
#[path = "../props/tool_args.rs"]
mod props;

libfuzzer_sys::fuzz_target!(|data: &[u8]| props::run(data));
