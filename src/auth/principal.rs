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
    /// The MCP tools this credential may see and call (issue 24).
    pub tools: ToolGrant,
    /// Its own deployment-wide request rate a minute, instead of the
    /// configured one (0 = no limit); `None` = the configured one.
    pub rate_limit_per_minute: Option<u32>,
}

impl Principal {
    /// An opaque-token principal reading `libraries`, for tests and benches
    /// only: production principals come from the auth layer.
    #[doc(hidden)]
    pub fn for_tests<I: IntoIterator<Item = S>, S: Into<String>>(libraries: I) -> Self {
        Principal {
            kind: PrincipalKind::Token,
            subject: "token:test".into(),
            credential: "token:test".into(),
            libraries: Scope::for_tests(libraries),
            tools: ToolGrant::Every,
            rate_limit_per_minute: None,
        }
    }
}

/// Which MCP tools a credential may use: every tool (no allowlist stored, and
/// every per-turn JWT), or only the named ones (an allowlist on its opaque
/// token or its team; empty = none). Other tools are absent from its
/// `tools/list` and refused when called.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum ToolGrant {
    #[default]
    Every,
    Only(Arc<[String]>),
}

impl ToolGrant {
    /// The grant of a stored allowlist column (`NULL` = every tool).
    pub fn from_stored(allowed: Option<&[String]>) -> Self {
        match allowed {
            None => ToolGrant::Every,
            Some(names) => ToolGrant::Only(names.into()),
        }
    }

    pub fn allows(&self, tool: &str) -> bool {
        match self {
            ToolGrant::Every => true,
            ToolGrant::Only(names) => names.iter().any(|n| n == tool),
        }
    }

    pub fn is_every(&self) -> bool {
        matches!(self, ToolGrant::Every)
    }
}

/// `resolved_libraries` as a type: the knowledge reads live on a `ScopedGraph`
/// made from a `Principal`'s scope, so none can be written without one. Only
/// this crate (the auth layer, the admin handle) builds a non-empty one;
/// tests and benches use `for_tests`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Scope(Arc<[String]>);

impl Scope {
    /// Keeps the first occurrence of each uid, in order (DESIGN §3).
    pub(crate) fn new<I: IntoIterator<Item = String>>(uids: I) -> Self {
        let mut seen = std::collections::HashSet::new();
        let v: Vec<String> = uids.into_iter().filter(|u| seen.insert(u.clone())).collect();
        Scope(v.into())
    }

    /// `new`, for tests and benches only: production scopes come from the
    /// auth layer.
    #[doc(hidden)]
    pub fn for_tests<I: IntoIterator<Item = S>, S: Into<String>>(uids: I) -> Self {
        Scope::new(uids.into_iter().map(Into::into))
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
    fn a_tool_grant_allows_only_what_it_names() {
        assert!(ToolGrant::Every.allows("get_health"));
        let only = ToolGrant::from_stored(Some(&["search".to_owned()]));
        assert!(only.allows("search"));
        assert!(!only.allows("get_health"));
        assert!(!only.allows("Search"));
        assert!(!ToolGrant::from_stored(Some(&[])).allows("search"));
        assert_eq!(ToolGrant::from_stored(None), ToolGrant::Every);
    }

    #[test]
    fn narrow_never_widens_and_keeps_order() {
        let s = Scope::new(["b", "a", "c"].map(String::from));
        let n = s.narrow(&["c".into(), "zzz".into(), "b".into()]);
        assert_eq!(n.uids(), ["b", "c"]);
    }
}
