#![no_main]
//! The `ingest_body` target: its properties are in `fuzz/props/ingest_body.rs`, where the
//! test suite also replays every committed seed (tests/api/fuzz_seeds.rs).
#[path = "../props/ingest_body.rs"]
mod props;

libfuzzer_sys::fuzz_target!(|data: &[u8]| props::run(data));
