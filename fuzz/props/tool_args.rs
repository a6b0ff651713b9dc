//! Tool arguments (an arbitrary JSON object) through every tool's argument
//! parser (src/mcp/tools/), and pagination cursors.
//!
//! Properties:
//! - what a tool accepts satisfies the schema it publishes: only declared
//!   arguments (`additionalProperties: false`); each string within its
//!   published `minLength`/`maxLength` characters, and an argument with a
//!   `minLength` not blank; each integer within `minimum`/`maximum`; each list within
//!   `maxItems`, each entry within the entries' bounds; a required argument
//!   present (`list_items`: one of its `anyOf`);
//! - a refusal names an argument the object has, or a required one it lacks;
//! - `decode_cursor` gives back what `encode_cursor` was given, and a cursor
//!   issued for one listing and filter never decodes for another listing or
//!   filter (filters as the list tools build them, from the same arguments).
use mnemosyne::mcp::tools::args::{text, NoArgs, UID};
use mnemosyne::mcp::tools::cursor::{decode_cursor, encode_cursor};
use mnemosyne::mcp::tools::get_chunk::GetChunkArgs;
use mnemosyne::mcp::tools::list_collections::ListCollectionsArgs;
use mnemosyne::mcp::tools::list_items::ListItemsArgs;
use mnemosyne::mcp::tools::search::SearchArgs;
use mnemosyne::mcp::tools::{input_schema, parse, ToolArgs};
use serde_json::{Map, Value};

/// Parses `o` as `T`'s arguments and checks the properties above against
/// `T`'s published schema. Returns the parsed arguments when accepted.
fn tool<T: ToolArgs>(o: &Map<String, Value>) -> Option<T> {
    let schema = input_schema::<T>();
    let props = schema["properties"].as_object().expect("properties");
    let required: Vec<&str> = schema
        .get("required")
        .and_then(Value::as_array)
        .map(|r| r.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default();
    match parse::<T>(o.clone()) {
        Ok((parsed, _checked)) => {
            for (k, v) in o {
                let p = props.get(k).unwrap_or_else(|| panic!("undeclared {k} accepted"));
                if !v.is_null() {
                    conforms(k, v, p, true);
                }
            }
            for r in &required {
                assert!(o.get(*r).is_some_and(|v| !v.is_null()), "{r} missing, accepted");
            }
            if let Some(any) = schema.get("anyOf").and_then(Value::as_array) {
                assert!(any.iter().any(|alt| alt["required"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .all(|r| o.get(r.as_str().unwrap()).is_some_and(|v| !v.is_null()))));
            }
            Some(parsed)
        }
        Err(e) => {
            assert!(
                o.contains_key(&e.name) || props.contains_key(&e.name),
                "refusal names {}, not an argument",
                e.name
            );
            assert!(e.to_string().contains(&format!("`{}`", e.name)));
            None
        }
    }
}

/// An accepted value satisfies its published property schema; an argument
/// (`top`, not a list entry) with a `minLength` is also not blank.
fn conforms(name: &str, v: &Value, p: &Value, top: bool) {
    let bound = |k: &str| p.get(k).and_then(Value::as_u64);
    match p["type"].as_str() {
        Some("string") => {
            let s = v.as_str().unwrap_or_else(|| panic!("{name}: non-string accepted"));
            let n = s.chars().count() as u64;
            assert!(bound("minLength").is_none_or(|m| n >= m), "{name}: {n} chars");
            assert!(bound("maxLength").is_none_or(|m| n <= m), "{name}: {n} chars");
            assert!(
                !top || bound("minLength").is_none_or(|m| m == 0) || !s.trim().is_empty(),
                "{name}: blank"
            );
        }
        Some("integer") => {
            let i = v.as_i64().unwrap_or_else(|| panic!("{name}: non-integer accepted"));
            assert!(p["minimum"].as_i64().is_none_or(|m| i >= m), "{name}: {i}");
            assert!(p["maximum"].as_i64().is_none_or(|m| i <= m), "{name}: {i}");
        }
        Some("array") => {
            let a = v.as_array().unwrap_or_else(|| panic!("{name}: non-list accepted"));
            assert!(
                bound("maxItems").is_none_or(|m| a.len() as u64 <= m),
                "{name}: {} entries",
                a.len()
            );
            for e in a {
                conforms(name, e, &p["items"], false);
            }
        }
        other => panic!("{name}: unexpected schema type {other:?}"),
    }
}

/// The listings and the filter each builds from its arguments.
const LISTINGS: [&str; 2] = ["collections", "items"];

fn filter(listing: &str, lib: Option<&str>, col: Option<&str>) -> String {
    let (lib, col) = (lib.map(str::to_owned), col.map(str::to_owned));
    match listing {
        "collections" => ListCollectionsArgs {
            cursor: None,
            limit: None,
            library_uid: lib,
        }
        .filter()
        .to_owned(),
        _ => ListItemsArgs {
            collection_uid: col,
            cursor: None,
            library_uid: lib,
            limit: None,
        }
        .filter(),
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

/// The target's body: libFuzzer's input, or one committed seed.
pub fn run(data: &[u8]) {
    let Ok(o) = serde_json::from_slice::<Map<String, Value>>(data) else {
        return;
    };
    tool::<SearchArgs>(&o);
    tool::<GetChunkArgs>(&o);
    tool::<NoArgs>(&o);
    let collections = tool::<ListCollectionsArgs>(&o);
    let items = tool::<ListItemsArgs>(&o);

    // A cursor as given: it decodes for at most one listing and filter, and
    // re-encodes to the same page position.
    let accepted = [
        collections
            .as_ref()
            .map(|a| ("collections", a.cursor.clone(), a.filter().to_owned())),
        items.as_ref().map(|a| ("items", a.cursor.clone(), a.filter())),
    ];
    for (listing, cursor, f) in accepted.into_iter().flatten() {
        if let Some(c) = cursor {
            if let Ok(after) = decode_cursor(Some(&c), listing, &f) {
                assert!(!after.is_empty());
                let again = encode_cursor(listing, &f, &after);
                assert_eq!(decode_cursor(Some(&again), listing, &f).as_deref(), Ok(after.as_str()));
            }
        }
    }

    // Cursors issued for one listing and (library, collection) pair never
    // decode for another made of the strings given — uids as the tools take
    // them (an empty or blank one is refused before any cursor is read).
    let uid = |v: &&str| text("uid", v, UID).is_ok();
    let s = |k: &str| o.get(k).and_then(Value::as_str);
    let (lib, col) = (s("library_uid").filter(uid), s("collection_uid").filter(uid));
    let strings: Vec<Option<&str>> = std::iter::once(None)
        .chain(o.values().filter_map(Value::as_str).filter(uid).take(4).map(Some))
        .collect();
    let after = s("cursor").filter(|c| !c.is_empty()).unwrap_or("item_1");
    for listing in LISTINGS {
        let mine = meaning(listing, lib, col);
        let f = filter(listing, lib, col);
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
}
