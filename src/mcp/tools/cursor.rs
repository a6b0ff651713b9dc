//! Pagination cursors of the list tools.

use base64::Engine;
use sha2::{Digest, Sha256};

use super::args::ArgError;

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

/// Pages are fetched with one extra row: if it came, drop it and hand out a
/// cursor after the page's last uid.
pub fn page_cursor<T>(
    page: &mut Vec<T>,
    limit: i64,
    uid: impl Fn(&T) -> &str,
    listing: &str,
    filter: &str,
) -> Option<String> {
    if page.len() as i64 <= limit {
        return None;
    }
    page.truncate(limit as usize);
    page.last().map(|last| encode_cursor(listing, filter, uid(last)))
}

#[cfg(test)]
mod tests {
    use super::*;

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
