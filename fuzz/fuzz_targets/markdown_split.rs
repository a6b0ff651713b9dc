#![no_main]
//! The `markdown_split` target: its properties are in `fuzz/props/markdown_split.rs`, where the
//! test suite also replays every committed seed (tests/api/fuzz_seeds.rs).
#[path = "../props/markdown_split.rs"]
mod props;

libfuzzer_sys::fuzz_target!(|data: &[u8]| props::run(data));
