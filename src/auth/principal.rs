//! The one thing every request is resolved to.

use std::fmt;
use std::sync::Arc;

pub use crate::ids::Scope;

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
/// uids it may read. Empty means nothing (fail-closed). Built only by the
/// auth layer (the resolver; `for_tests` for tests and benches): outside
/// `auth` its fields are read-only.
#[derive(Clone, Debug)]
pub struct Principal {
    pub(in crate::auth) kind: PrincipalKind,
    /// `token:<id>`, the per-turn `sub`, or `team:<uuid>`.
    pub(in crate::auth) subject: String,
    /// The exact credential: `token:<id>`, `jti:<jti>` (per-turn) or
    /// `team:<uuid>:<jti>`. Sessions belong to it (many per-turn JWTs share
    /// one `sub`; a rotated team JWT is another credential).
    pub(in crate::auth) credential: Arc<str>,
    pub(in crate::auth) libraries: Scope,
    /// The MCP tools this credential may see and call (issue 24).
    pub(in crate::auth) tools: ToolGrant,
    /// Its own deployment-wide request rate a minute, instead of the
    /// configured one (0 = no limit); `None` = the configured one.
    pub(in crate::auth) rate_limit_per_minute: Option<u32>,
    /// `user:<id>` of an opaque token's user: all the user's tokens share
    /// its session cap and its rate ceiling (issue 32).
    pub(in crate::auth) user: Option<Arc<str>>,
    /// The user's rate ceiling a minute, if it has one.
    pub(in crate::auth) user_max_rate: Option<u32>,
}

impl Principal {
    pub fn kind(&self) -> PrincipalKind {
        self.kind
    }

    /// `token:<id>`, the per-turn `sub`, or `team:<uuid>`.
    pub fn subject(&self) -> &str {
        &self.subject
    }

    /// The exact credential its sessions belong to.
    pub fn credential(&self) -> &Arc<str> {
        &self.credential
    }

    /// Its resolved libraries, in order.
    pub fn libraries(&self) -> &Scope {
        &self.libraries
    }

    /// The MCP tools it may see and call.
    pub fn tools(&self) -> &ToolGrant {
        &self.tools
    }

    /// Its own request rate a minute, if it has one.
    pub fn rate_limit_per_minute(&self) -> Option<u32> {
        self.rate_limit_per_minute
    }

    /// `user:<id>` of an opaque token's user (what its sessions also count
    /// against).
    pub fn user(&self) -> Option<&Arc<str>> {
        self.user.as_ref()
    }

    /// The user-wide bucket key and rate a minute its requests also count
    /// against, if its user has a rate ceiling.
    pub fn user_rate(&self) -> Option<(&str, u32)> {
        Some((self.user.as_deref()?, self.user_max_rate?))
    }

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
            user: None,
            user_max_rate: None,
        }
    }
}

/// A principal reads its resolved libraries: what store views are made from.
impl AsRef<Scope> for Principal {
    fn as_ref(&self) -> &Scope {
        &self.libraries
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

    /// What both grants allow (a token's allowlist under its user's
    /// ceiling), in this grant's order.
    pub fn within(self, ceiling: &ToolGrant) -> ToolGrant {
        match (self, ceiling) {
            (own, ToolGrant::Every) => own,
            (ToolGrant::Every, c) => c.clone(),
            (ToolGrant::Only(own), c) => ToolGrant::Only(own.iter().filter(|t| c.allows(t)).cloned().collect()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
    fn a_ceiling_only_narrows_a_grant() {
        let only =
            |names: &[&str]| ToolGrant::from_stored(Some(&names.iter().map(|n| n.to_string()).collect::<Vec<_>>()));
        let ceiling = only(&["search", "get_chunk"]);
        assert_eq!(ToolGrant::Every.within(&ceiling), ceiling);
        assert_eq!(
            only(&["get_health", "get_chunk", "search"]).within(&ceiling),
            only(&["get_chunk", "search"])
        );
        assert_eq!(only(&["get_health"]).within(&ceiling), only(&[]));
        assert_eq!(only(&["get_health"]).within(&ToolGrant::Every), only(&["get_health"]));
        assert_eq!(ToolGrant::Every.within(&ToolGrant::Every), ToolGrant::Every);
    }
}
