//! Tool permissions per credential (issue 24): an optional allowlist of MCP
//! tools on an opaque token or a team (absent = every tool). Changed through
//! the CLI and the console, audited, and applied on every replica's next
//! request: the row triggers announce the change, the fence waits for it.
//! A token's allowlist is set in `tokens` (`set_token_tools`: a token
//! workflow with the token's errors).

use sqlx::PgPool;
use uuid::Uuid;

use super::teams::TeamError;
use super::{bad, BadField, Propagation};
use crate::auth::changes::AuthChanges;
use crate::store::pg::teams;

/// An allowlist as written: names of tools this server has, each once, in
/// the order given. Empty is allowed and means "no tool at all".
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ToolAllowlist(Vec<String>);

impl ToolAllowlist {
    /// Checks every name against `known` (the server's tools, passed down by
    /// the caller) and drops repeats; an unknown name is refused naming
    /// `field` and the tools there are.
    pub fn parse(field: &str, names: &[String], known: &[&str]) -> Result<Self, BadField> {
        let mut out: Vec<String> = Vec::with_capacity(names.len());
        for n in names {
            let n = n.trim();
            if !known.contains(&n) {
                let shown: String = n.chars().filter(|c| !c.is_control()).take(64).collect();
                return Err(bad(
                    field,
                    format!("unknown tool {shown:?}; the tools are: {}", known.join(", ")),
                ));
            }
            if !out.iter().any(|o| o == n) {
                out.push(n.to_owned());
            }
        }
        Ok(ToolAllowlist(out))
    }

    pub fn names(&self) -> &[String] {
        &self.0
    }
}

pub(super) fn stored(tools: Option<&ToolAllowlist>) -> Option<&[String]> {
    tools.map(ToolAllowlist::names)
}

/// Sets a team's allowlist (`None` = every tool) with its audit event; every
/// replica applies it from its next request.
pub async fn set_team_tools(
    pg: &PgPool,
    changes: &AuthChanges,
    actor: &str,
    id: Uuid,
    tools: Option<&ToolAllowlist>,
) -> Result<Propagation, TeamError> {
    if !teams::set_tools(pg, actor, id, stored(tools)).await? {
        return Err(TeamError::NotFound);
    }
    tracing::info!(team = %id, actor, "team tool permissions set");
    Ok(changes.fence().await)
}

#[cfg(test)]
mod tests {
    use super::*;

    const KNOWN: [&str; 3] = ["search", "get_chunk", "get_health"];

    #[test]
    fn an_allowlist_keeps_known_tools_once_in_order() {
        let names = ["get_health", "search", "get_health"].map(String::from);
        let l = ToolAllowlist::parse("tools", &names, &KNOWN).unwrap();
        assert_eq!(l.names(), ["get_health", "search"]);
        assert!(ToolAllowlist::parse("tools", &[], &KNOWN).unwrap().names().is_empty());
    }

    #[test]
    fn an_unknown_tool_is_refused_naming_the_field() {
        let e = ToolAllowlist::parse("tool", &["search".into(), "delete_all".into()], &KNOWN).unwrap_err();
        assert_eq!(e.field, "tool");
        assert_eq!(
            e.message,
            "unknown tool \"delete_all\"; the tools are: search, get_chunk, get_health"
        );
    }
}
