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
        .filter(|p| p.is_file())
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

/// Every target has seeds and a replay test above.
#[test]
fn every_fuzz_target_is_replayed() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz");
    let names = |dir: &str, ext: Option<&str>| -> Vec<String> {
        let mut v: Vec<String> = std::fs::read_dir(root.join(dir))
            .unwrap_or_else(|e| panic!("fuzz/{dir}: {e}"))
            .map(|e| e.expect("an entry").path())
            .filter(|p| ext.is_none_or(|x| p.extension().is_some_and(|e| e == x)))
            .map(|p| p.file_stem().unwrap().to_string_lossy().into_owned())
            .collect();
        v.sort();
        v
    };
    let replayed = [
        "ingest_body",
        "jwt_bearer",
        "jwt_claims",
        "markdown_split",
        "scoped_words",
        "tool_args",
    ];
    assert_eq!(names("fuzz_targets", Some("rs")), replayed, "fuzz/fuzz_targets");
    assert_eq!(names("props", Some("rs")), replayed, "fuzz/props");
    assert_eq!(names("corpus", None), replayed, "fuzz/corpus");
    // CI builds no fuzz target (scripts/fuzz does): each stays the three lines
    // that hand libFuzzer's input to the properties compiled here.
    for t in replayed {
        let wrapper = std::fs::read_to_string(root.join(format!("fuzz_targets/{t}.rs"))).unwrap();
        let code: Vec<&str> = wrapper
            .lines()
            .filter(|l| !l.starts_with("//") && !l.is_empty())
            .collect();
        let path = format!("#[path = \"../props/{t}.rs\"]");
        assert_eq!(
            code,
            [
                "#![no_main]",
                path.as_str(),
                "mod props;",
                "libfuzzer_sys::fuzz_target!(|data: &[u8]| props::run(data));",
            ],
            "fuzz/fuzz_targets/{t}.rs"
        );
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
