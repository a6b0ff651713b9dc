//! Argument validation for tools (SEP-1303): rmcp does not validate arguments
//! against the input schema, so each tool checks its own and a bad one comes
//! back as an `isError` result naming the argument.

use base64::Engine;
use rmcp::model::JsonObject;
use serde_json::Value;
use sha2::{Digest, Sha256};

/// A bad argument: its name and what is wrong.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ArgError {
    pub name: String,
    pub message: String,
}

impl ArgError {
    pub fn new(name: &str, message: impl Into<String>) -> Self {
        ArgError {
            name: name.to_owned(),
            message: message.into(),
        }
    }
}

impl std::fmt::Display for ArgError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Invalid argument `{}`: {}", self.name, self.message)
    }
}

pub struct Args<'a>(pub &'a JsonObject);

impl<'a> Args<'a> {
    /// Refuses arguments the tool does not declare (`additionalProperties: false`).
    pub fn only(&self, allowed: &[&str]) -> Result<(), ArgError> {
        match self.0.keys().find(|k| !allowed.contains(&k.as_str())) {
            Some(k) => Err(ArgError::new(k, "unknown argument")),
            None => Ok(()),
        }
    }

    pub fn string(&self, name: &str, min: usize, max: usize) -> Result<Option<String>, ArgError> {
        match self.0.get(name) {
            None | Some(Value::Null) => Ok(None),
            Some(Value::String(s)) => {
                let n = s.chars().count();
                if n < min || s.trim().is_empty() && min > 0 {
                    Err(ArgError::new(
                        name,
                        format!("must be at least {min} non-blank character(s)"),
                    ))
                } else if n > max {
                    Err(ArgError::new(name, format!("must be at most {max} characters")))
                } else {
                    Ok(Some(s.clone()))
                }
            }
            Some(_) => Err(ArgError::new(name, "must be a string")),
        }
    }

    pub fn required_string(&self, name: &str, min: usize, max: usize) -> Result<String, ArgError> {
        self.string(name, min, max)?
            .ok_or_else(|| ArgError::new(name, "is required"))
    }

    pub fn int(&self, name: &str, min: i64, max: i64, default: i64) -> Result<i64, ArgError> {
        match self.0.get(name) {
            None | Some(Value::Null) => Ok(default),
            Some(Value::Number(n)) => match n.as_i64() {
                Some(v) if (min..=max).contains(&v) => Ok(v),
                _ => Err(ArgError::new(name, format!("must be an integer from {min} to {max}"))),
            },
            Some(_) => Err(ArgError::new(name, format!("must be an integer from {min} to {max}"))),
        }
    }

    pub fn string_list(&self, name: &str, max_items: usize) -> Result<Option<Vec<String>>, ArgError> {
        match self.0.get(name) {
            None | Some(Value::Null) => Ok(None),
            Some(Value::Array(items)) if items.len() <= max_items => items
                .iter()
                .map(|v| match v {
                    Value::String(s) if !s.is_empty() && s.len() <= 64 => Ok(s.clone()),
                    _ => Err(ArgError::new(
                        name,
                        "must be a list of library uids (non-empty strings)",
                    )),
                })
                .collect::<Result<Vec<_>, _>>()
                .map(Some),
            Some(Value::Array(_)) => Err(ArgError::new(name, format!("must have at most {max_items} entries"))),
            Some(_) => Err(ArgError::new(name, "must be a list of strings")),
        }
    }
}

/// Opaque pagination cursors: the last uid of a page, tied to the listing and
/// filter that produced it. A cursor cannot widen anything: every page query
/// applies the caller's scope; a cursor from another listing is refused.
///
/// The listing and filter are bound by a hash (`v2`), never written out: `v1`
/// wrote the filter raw between newlines, so a filter holding a newline (a
/// `library_uid` argument may) shifted the fields, and such a cursor decoded for
/// another filter, or not at all for its own (found by fuzz/fuzz_targets/tool_args.rs).
pub fn encode_cursor(listing: &str, filter: &str, after: &str) -> String {
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(format!("v2\n{}\n{after}", binding(listing, filter)))
}

/// 128 bits of SHA-256 of `listing NUL filter` (listings are constants without NUL).
fn binding(listing: &str, filter: &str) -> String {
    let mut h = Sha256::new();
    h.update(listing.as_bytes());
    h.update([0u8]);
    h.update(filter.as_bytes());
    hex::encode(&h.finalize()[..16])
}

/// The filter of `list_items`: distinct for every (library, collection) pair,
/// unlike a joined `lib|col` (`a|b` + none and `a` + `b|` were one filter).
pub fn items_filter(library_uid: Option<&str>, collection_uid: Option<&str>) -> String {
    serde_json::json!([library_uid, collection_uid]).to_string()
}

pub fn decode_cursor(cursor: Option<&str>, listing: &str, filter: &str) -> Result<String, ArgError> {
    let Some(c) = cursor else { return Ok(String::new()) };
    let bad = || ArgError::new("cursor", "is not a cursor from this listing");
    let raw = base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(c)
        .map_err(|_| bad())?;
    let text = String::from_utf8(raw).map_err(|_| bad())?;
    let mut parts = text.splitn(3, '\n');
    match (parts.next(), parts.next(), parts.next()) {
        (Some("v2"), Some(b), Some(after)) if b == binding(listing, filter) && !after.is_empty() => {
            Ok(after.to_owned())
        }
        _ => Err(bad()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn obj(v: Value) -> JsonObject {
        v.as_object().unwrap().clone()
    }

    #[test]
    fn errors_name_the_argument() {
        let o = obj(json!({"query": "  ", "limit": 99, "x": 1}));
        let a = Args(&o);
        assert_eq!(a.only(&["query", "limit"]).unwrap_err().name, "x");
        assert_eq!(a.required_string("query", 1, 1000).unwrap_err().name, "query");
        assert_eq!(a.int("limit", 1, 50, 10).unwrap_err().name, "limit");
        assert_eq!(a.int("context", 0, 5, 0).unwrap(), 0);
    }

    #[test]
    fn cursor_round_trip_and_tamper() {
        let c = encode_cursor("items", "col_1", "item_9");
        assert_eq!(decode_cursor(Some(&c), "items", "col_1").unwrap(), "item_9");
        assert_eq!(decode_cursor(Some(&c), "items", "col_2").unwrap_err().name, "cursor");
        assert_eq!(
            decode_cursor(Some("garbage!"), "items", "col_1").unwrap_err().name,
            "cursor"
        );
        assert_eq!(decode_cursor(None, "items", "x").unwrap(), "");
    }

    /// Regressions found by fuzz/fuzz_targets/tool_args.rs.
    #[test]
    fn cursor_is_bound_to_exactly_one_listing_and_filter() {
        // A newline in a filter (library_uid is any 1-64 characters).
        let c = encode_cursor("collections", "lib\nx", "col_1");
        assert_eq!(decode_cursor(Some(&c), "collections", "lib\nx").unwrap(), "col_1");
        assert!(decode_cursor(Some(&c), "collections", "lib").is_err());
        let c = encode_cursor("collections", "lib", "x\ncol_1");
        assert!(decode_cursor(Some(&c), "collections", "lib\nx").is_err());
        // `a|b` + no collection and `a` + `b|` are different list_items filters.
        let (f1, f2) = (
            items_filter(Some("a|b"), Some("c")),
            items_filter(Some("a"), Some("b|c")),
        );
        assert_ne!(f1, f2);
        assert_ne!(items_filter(Some("a"), None), items_filter(None, Some("a")));
        let c = encode_cursor("items", &f1, "item_9");
        assert_eq!(decode_cursor(Some(&c), "items", &f1).unwrap(), "item_9");
        assert!(decode_cursor(Some(&c), "items", &f2).is_err());
        assert!(decode_cursor(Some(&c), "collections", &f1).is_err());
    }
}
