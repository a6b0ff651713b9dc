//! The one thing every request is resolved to.

use std::fmt;
use std::sync::Arc;

/// How the bearer was recognised (DESIGN §3).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum PrincipalKind {
    /// Opaque MCP token.
    Token,
    /// Legacy per-turn JWT minted by Daedalus.
    PerTurn,
    /// Long-lived team JWT minted by this server.
    Team,
}

impl PrincipalKind {
    pub fn as_str(self) -> &'static str {
        match self {
            PrincipalKind::Token => "token",
            PrincipalKind::PerTurn => "per_turn",
            PrincipalKind::Team => "team",
        }
    }
}

impl fmt::Display for PrincipalKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The caller of one request: who, and the ordered, de-duplicated list of Library
/// uids it may read. Empty means nothing (fail-closed).
#[derive(Clone, Debug)]
pub struct Principal {
    pub kind: PrincipalKind,
    /// `token:<id>`, the per-turn `sub`, or `team:<uuid>`.
    pub subject: String,
    /// The exact credential: `token:<id>`, `jti:<jti>` (per-turn) or
    /// `team:<uuid>:<jti>`. Sessions belong to it (many per-turn JWTs share
    /// one `sub`; a rotated team JWT is another credential).
    pub credential: Arc<str>,
    pub libraries: Scope,
}

/// `resolved_libraries` as a type: knowledge queries take a `&Scope`, so none can
/// be written without it. Only the auth layer (and tests) construct one.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Scope(Arc<[String]>);

impl Scope {
    /// Keeps the first occurrence of each uid, in order (DESIGN §3).
    pub fn new<I: IntoIterator<Item = String>>(uids: I) -> Self {
        let mut seen = std::collections::HashSet::new();
        let v: Vec<String> = uids.into_iter().filter(|u| seen.insert(u.clone())).collect();
        Scope(v.into())
    }

    pub fn uids(&self) -> &[String] {
        &self.0
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scope_dedups_keeping_first_occurrence() {
        let s = Scope::new(["b", "a", "b", "c", "a"].map(String::from));
        assert_eq!(s.uids(), ["b", "a", "c"]);
    }

    #[test]
    fn narrow_never_widens_and_keeps_order() {
        let s = Scope::new(["b", "a", "c"].map(String::from));
        let n = s.narrow(&["c".into(), "zzz".into(), "b".into()]);
        assert_eq!(n.uids(), ["b", "c"]);
    }
}
