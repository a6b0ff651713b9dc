#![no_main]
//! Tool arguments (an arbitrary JSON object) through the `Args` parsers with
//! the declarations of every tool in src/mcp/server.rs, and pagination cursors.
//!
//! Properties:
//! - `only` refuses exactly the objects with an undeclared key, naming one;
//! - an accepted string has the declared length in characters and is not blank,
//!   an accepted int is in range (the default when absent or null), an accepted
//!   list has at most the declared entries, each a 1-64 byte string;
//! - a refusal names the argument it is about;
//! - `decode_cursor` gives back what `encode_cursor` was given, and a cursor
//!   issued for one listing and filter never decodes for another listing or
//!   filter (filters as the list tools build them, from the same arguments).
use libfuzzer_sys::fuzz_target;
use mnemosyne::mcp::args::{decode_cursor, encode_cursor, items_filter, ArgError, Args};
use serde_json::{Map, Value};

/// Each tool's declared arguments (src/mcp/server.rs).
const TOOLS: &[&[&str]] = &[
    &["query", "limit", "library_uids", "collection_uid"],
    &["chunk_uid", "context"],
    &["library_uid", "cursor", "limit"],
    &["library_uid", "collection_uid", "cursor", "limit"],
    &[],
];

fn string(a: &Args, o: &Map<String, Value>, name: &str, min: usize, max: usize) -> Option<String> {
    match a.string(name, min, max) {
        Ok(Some(s)) => {
            let n = s.chars().count();
            assert!(n >= min && n <= max, "{name}: {n} chars outside {min}..={max}");
            assert!(min == 0 || !s.trim().is_empty(), "{name}: blank accepted");
            assert_eq!(o.get(name).and_then(Value::as_str), Some(s.as_str()));
            Some(s)
        }
        Ok(None) => {
            assert!(o.get(name).is_none_or(Value::is_null));
            None
        }
        Err(e) => {
            named(&e, name);
            None
        }
    }
}

fn named(e: &ArgError, name: &str) {
    assert_eq!(e.name, name);
    assert!(e.to_string().contains(name));
}

fn int(a: &Args, o: &Map<String, Value>, name: &str, min: i64, max: i64, default: i64) {
    match a.int(name, min, max, default) {
        Ok(v) if o.get(name).is_none_or(Value::is_null) => assert_eq!(v, default),
        Ok(v) => {
            assert!((min..=max).contains(&v));
            assert_eq!(o[name].as_i64(), Some(v));
        }
        Err(e) => named(&e, name),
    }
}

/// The listings and the filter each builds from its arguments
/// (src/mcp/server.rs: list_collections, list_items).
const LISTINGS: [&str; 2] = ["collections", "items"];

fn filter(listing: &str, lib: Option<&str>, col: Option<&str>) -> String {
    match listing {
        "collections" => lib.unwrap_or("").to_owned(),
        _ => items_filter(lib, col),
    }
}

/// What a filter stands for: list_collections takes no collection.
fn meaning<'a>(
    listing: &'a str,
    lib: Option<&'a str>,
    col: Option<&'a str>,
) -> (&'a str, Option<&'a str>, Option<&'a str>) {
    (listing, lib, if listing == "collections" { None } else { col })
}

fuzz_target!(|data: &[u8]| {
    let Ok(o) = serde_json::from_slice::<Map<String, Value>>(data) else {
        return;
    };
    let a = Args(&o);

    for allowed in TOOLS {
        match a.only(allowed) {
            Ok(()) => assert!(o.keys().all(|k| allowed.contains(&k.as_str()))),
            Err(e) => {
                assert!(o.contains_key(&e.name) && !allowed.contains(&e.name.as_str()));
            }
        }
    }
    // search
    string(&a, &o, "query", 1, 1000);
    int(&a, &o, "limit", 1, 50, 10);
    match a.string_list("library_uids", 1000) {
        Ok(Some(l)) => {
            assert!(l.len() <= 1000);
            assert!(l.iter().all(|s| !s.is_empty() && s.len() <= 64));
        }
        Ok(None) => assert!(o.get("library_uids").is_none_or(Value::is_null)),
        Err(e) => named(&e, "library_uids"),
    }
    string(&a, &o, "collection_uid", 1, 64);
    // get_chunk
    string(&a, &o, "chunk_uid", 1, 64);
    int(&a, &o, "context", 0, 5, 0);
    // list_collections / list_items
    let lib = string(&a, &o, "library_uid", 1, 64);
    let col = string(&a, &o, "collection_uid", 1, 64);
    int(&a, &o, "limit", 1, 200, 50);
    let cursor = string(&a, &o, "cursor", 1, 1000);

    // A cursor as given: it decodes for at most one listing and filter, and
    // re-encodes to the same page position.
    if let Some(c) = &cursor {
        for listing in LISTINGS {
            let f = filter(listing, lib.as_deref(), col.as_deref());
            if let Ok(after) = decode_cursor(Some(c), listing, &f) {
                assert!(!after.is_empty());
                let again = encode_cursor(listing, &f, &after);
                assert_eq!(decode_cursor(Some(&again), listing, &f).as_deref(), Ok(after.as_str()));
            }
        }
    }

    // Cursors issued for these arguments' listings never decode for another
    // listing or another (library, collection) pair made of the strings given.
    let strings: Vec<Option<&str>> = std::iter::once(None)
        .chain(
            o.values()
                .filter_map(Value::as_str)
                .filter(|s| !s.is_empty())
                .take(4)
                .map(Some),
        )
        .collect();
    let after = cursor.as_deref().unwrap_or("item_1");
    for listing in LISTINGS {
        let mine = meaning(listing, lib.as_deref(), col.as_deref());
        let f = filter(listing, lib.as_deref(), col.as_deref());
        let c = encode_cursor(listing, &f, after);
        assert_eq!(decode_cursor(Some(&c), listing, &f).as_deref(), Ok(after));
        for l2 in &strings {
            for c2 in &strings {
                for listing2 in LISTINGS {
                    if meaning(listing2, *l2, *c2) != mine {
                        let f2 = filter(listing2, *l2, *c2);
                        assert!(
                            decode_cursor(Some(&c), listing2, &f2).is_err(),
                            "cursor for {mine:?} decodes for {:?}",
                            meaning(listing2, *l2, *c2)
                        );
                    }
                }
            }
        }
    }
});
