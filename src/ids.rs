//! The identifiers callers hand us, each with one rule and one `parse()`,
//! used by the REST APIs, the MCP tools, the CLI and the admin console alike.
//!
//! - A **uid** (library, collection, item, chunk) is 1–64 characters of ASCII
//!   letters, digits and `_ - . :` — every uid this server stores or derives
//!   has that shape, so anything else cannot name a stored object.
//! - A **workspace id** is Daedalus's: 1–64 characters of any kind, not blank.
//!
//! A failed parse names the field it came from, so each adapter answers in
//! its own words (REST: 400 with `field`; MCP: `Invalid argument `…``).

use std::fmt;
use std::sync::Arc;

/// Longest uid or workspace id, in characters.
pub const MAX_ID_CHARS: usize = 64;

/// A value that is not a valid identifier, and the field it came from.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{field} {message}")]
pub struct InvalidId {
    pub field: String,
    pub message: String,
}

impl InvalidId {
    fn new(field: &str, message: &str) -> Self {
        InvalidId {
            field: field.to_owned(),
            message: message.to_owned(),
        }
    }
}

/// Whether `s` has the shape of a uid (see the module docs).
pub fn is_uid(s: &str) -> bool {
    !s.is_empty() && s.len() <= MAX_ID_CHARS && s.bytes().all(|b| b.is_ascii_alphanumeric() || b"_-.:".contains(&b))
}

macro_rules! id_type {
    ($(#[$doc:meta])* $name:ident, $check:expr, $rule:literal) => {
        $(#[$doc])*
        #[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize)]
        #[serde(transparent)]
        pub struct $name(String);

        impl $name {
            /// The rule, as error messages and docs state it.
            pub const RULE: &'static str = $rule;

            /// `field` names the value in the error.
            pub fn parse(field: &str, value: impl Into<String>) -> Result<Self, InvalidId> {
                let value = value.into();
                let check: fn(&str) -> bool = $check;
                if check(&value) {
                    Ok($name(value))
                } else {
                    Err(InvalidId::new(field, concat!("must be ", $rule)))
                }
            }

            pub fn as_str(&self) -> &str {
                &self.0
            }

            pub fn into_string(self) -> String {
                self.0
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(&self.0)
            }
        }

        impl AsRef<str> for $name {
            fn as_ref(&self) -> &str {
                &self.0
            }
        }

        impl std::ops::Deref for $name {
            type Target = str;
            fn deref(&self) -> &str {
                &self.0
            }
        }

        impl From<$name> for String {
            fn from(id: $name) -> String {
                id.0
            }
        }
    };
}

id_type!(
    /// A Library's uid.
    LibraryUid,
    is_uid,
    "1-64 characters of letters, digits, _ - . :"
);
id_type!(
    /// A Collection's, Item's or Chunk's uid (same rule as a Library's).
    Uid,
    is_uid,
    "1-64 characters of letters, digits, _ - . :"
);
id_type!(
    /// A Daedalus workspace id.
    WorkspaceId,
    |s| !s.trim().is_empty() && s.chars().count() <= MAX_ID_CHARS,
    "1-64 characters, not blank"
);

/// `resolved_libraries` as a type (beside the ids it lists, below the stores
/// that take it and the auth layer that makes it): the knowledge reads live on a `ScopedGraph`
/// made from a `Principal`'s scope, so none can be written without one. Only
/// the auth layer builds a non-empty one (`from_resolver`; `src/layering.rs`
/// checks no other module names it); tests and benches use `for_tests`
/// (reserved the same way: only `ids` and `auth::principal` may name it).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Scope(Arc<[String]>);

impl Scope {
    /// Keeps the first occurrence of each uid, in order (DESIGN §3). For the
    /// auth layer only: Rust cannot say "only `auth`" of a type below it, so
    /// `src/layering.rs` fails when another module names this function.
    pub(crate) fn from_resolver<I: IntoIterator<Item = String>>(uids: I) -> Self {
        let mut seen = std::collections::HashSet::new();
        let v: Vec<String> = uids.into_iter().filter(|u| seen.insert(u.clone())).collect();
        Scope(v.into())
    }

    /// `new`, for tests and benches only: production scopes come from the
    /// auth layer.
    #[doc(hidden)]
    pub fn for_tests<I: IntoIterator<Item = S>, S: Into<String>>(uids: I) -> Self {
        Scope::from_resolver(uids.into_iter().map(Into::into))
    }

    pub fn uids(&self) -> &[String] {
        &self.0
    }

    /// A short key of the set of libraries (order aside): what per-scope
    /// caches are partitioned by (the query-vector cache).
    pub fn cache_key(&self) -> String {
        use sha2::{Digest, Sha256};
        let mut sorted: Vec<&str> = self.0.iter().map(String::as_str).collect();
        sorted.sort_unstable();
        let mut h = Sha256::new();
        for u in sorted {
            h.update(u.as_bytes());
            h.update([0u8]);
        }
        hex::encode(&h.finalize()[..16])
    }

    pub fn len(&self) -> usize {
        self.0.len()
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    pub fn contains(&self, uid: &str) -> bool {
        self.0.iter().any(|u| u == uid)
    }

    /// Position of a library in the resolved order (search tie-break).
    pub fn position(&self, uid: &str) -> Option<usize> {
        self.0.iter().position(|u| u == uid)
    }

    /// Narrows to `only` (never widens): the uids of `self` that `only` names,
    /// in `self`'s order.
    pub fn narrow(&self, only: &[String]) -> Scope {
        Scope(
            self.0
                .iter()
                .filter(|u| only.contains(u))
                .cloned()
                .collect::<Vec<_>>()
                .into(),
        )
    }
}

impl AsRef<Scope> for Scope {
    fn as_ref(&self) -> &Scope {
        self
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_scopes_cache_key_is_its_set_of_libraries() {
        let key = |u: &[&str]| Scope::from_resolver(u.iter().map(|s| s.to_string())).cache_key();
        assert_eq!(key(&["a", "b"]), key(&["b", "a"]), "the order does not matter");
        assert_ne!(key(&["a"]), key(&["b"]));
        assert_ne!(key(&["ab"]), key(&["a", "b"]), "uids are separated");
    }

    #[test]
    fn scope_dedups_keeping_first_occurrence() {
        let s = Scope::from_resolver(["b", "a", "b", "c", "a"].map(String::from));
        assert_eq!(s.uids(), ["b", "a", "c"]);
    }

    #[test]
    fn narrow_never_widens_and_keeps_order() {
        let s = Scope::from_resolver(["b", "a", "c"].map(String::from));
        let n = s.narrow(&["c".into(), "zzz".into(), "b".into()]);
        assert_eq!(n.uids(), ["b", "c"]);
    }

    const UID_RULE: &str = "1-64 characters of letters, digits, _ - . :";

    #[test]
    fn uids_have_one_rule() {
        assert_eq!(LibraryUid::RULE, UID_RULE);
        assert_eq!(Uid::RULE, UID_RULE);
        assert!(LibraryUid::parse("library_uid", "lib_a-1.x:y").is_ok());
        for bad in ["", "has space", "ünï", &"x".repeat(65)] {
            let e = LibraryUid::parse("library_uid", bad).unwrap_err();
            assert_eq!(e.field, "library_uid");
            assert_eq!(e.to_string(), format!("library_uid must be {UID_RULE}"));
            assert!(Uid::parse("item.uid", bad).is_err());
        }
        assert!(LibraryUid::parse("x", "x".repeat(64)).is_ok());
    }

    #[test]
    fn workspace_ids_are_any_characters_not_blank() {
        assert!(WorkspaceId::parse("workspace_id", "Équipe 7 / α").is_ok());
        assert!(WorkspaceId::parse("workspace_id", "é".repeat(64)).is_ok());
        assert!(WorkspaceId::parse("workspace_id", "é".repeat(65)).is_err());
        assert!(WorkspaceId::parse("workspace_id", "   ").is_err());
        assert!(WorkspaceId::parse("workspace_id", "").is_err());
    }
}
