#![no_main]
//! The `jwt_claims` target: its properties are in `fuzz/props/jwt_claims.rs`, where the
//! test suite also replays every committed seed (tests/api/fuzz_seeds.rs).
#[path = "../props/jwt_claims.rs"]
mod props;

libfuzzer_sys::fuzz_target!(|data: &[u8]| props::run(data));
