//! Every committed fuzz seed (`fuzz/corpus/<target>/`) through its target's
//! properties (`fuzz/props/<target>.rs`, the same code libFuzzer runs), as
//! ordinary tests: a change that breaks a property on a known input fails here,
//! with no instrumented build. Mutating beyond the seeds is `scripts/fuzz`'s job
//! (docs/reliability.md, "Fuzzing"). No store is touched.

#[path = "../../fuzz/props/ingest_body.rs"]
mod ingest_body;
#[path = "../../fuzz/props/jwt_bearer.rs"]
mod jwt_bearer;
#[path = "../../fuzz/props/jwt_claims.rs"]
mod jwt_claims;
#[path = "../../fuzz/props/markdown_split.rs"]
mod markdown_split;
#[path = "../../fuzz/props/scoped_words.rs"]
mod scoped_words;
#[path = "../../fuzz/props/tool_args.rs"]
mod tool_args;

use std::path::Path;

/// Runs `run` on every seed of `target`; a failed property panics naming the seed.
fn replay(target: &str, run: fn(&[u8])) {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz/corpus").join(target);
    let mut seeds: Vec<_> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| e.expect("a seed").path())
        .collect();
    seeds.sort();
    assert!(seeds.len() >= 3, "{}: {} seeds", dir.display(), seeds.len());
    for seed in seeds {
        let data = std::fs::read(&seed).expect("seed readable");
        if let Err(panic) = std::panic::catch_unwind(|| run(&data)) {
            let why = (panic.downcast_ref::<String>().map(String::as_str))
                .or_else(|| panic.downcast_ref::<&str>().copied())
                .unwrap_or("a panic");
            panic!("{target}: seed {} breaks a property: {why}", seed.display());
        }
    }
}

#[test]
fn ingest_body_seeds_keep_their_properties() {
    replay("ingest_body", ingest_body::run);
}

#[test]
fn jwt_bearer_seeds_keep_their_properties() {
    replay("jwt_bearer", jwt_bearer::run);
}

#[test]
fn jwt_claims_seeds_keep_their_properties() {
    replay("jwt_claims", jwt_claims::run);
}

#[test]
fn markdown_split_seeds_keep_their_properties() {
    replay("markdown_split", markdown_split::run);
}

#[test]
fn scoped_words_seeds_keep_their_properties() {
    replay("scoped_words", scoped_words::run);
}

#[test]
fn tool_args_seeds_keep_their_properties() {
    replay("tool_args", tool_args::run);
}
