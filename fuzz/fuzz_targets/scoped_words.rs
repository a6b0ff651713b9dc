#![no_main]
//! The `scoped_words` target: its properties are in `fuzz/props/scoped_words.rs`, where the
//! test suite also replays every committed seed (tests/api/fuzz_seeds.rs).
#[path = "../props/scoped_words.rs"]
mod props;

libfuzzer_sys::fuzz_target!(|data: &[u8]| props::run(data));
