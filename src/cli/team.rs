//! `mnemosyne team set-tools|set-rate-limit`: a team JWT's tools and rate.

use super::args::{rate_human, tools_human, tools_json, TeamCmd};
use super::{emit, CLI_ACTOR};
use crate::auth::changes::AuthChanges;
use crate::service::credential_limits;
use crate::service::tool_grants::{self, ToolAllowlist};

/// `team set-tools|set-rate-limit` (teams are created through the team REST API).
pub(super) async fn run(pool: &sqlx::PgPool, c: TeamCmd, json: bool) -> anyhow::Result<()> {
    match c {
        TeamCmd::SetRateLimit { id, rate } => {
            let id = crate::service::teams::parse_id("id", &id)?;
            let changes = AuthChanges::new(pool.clone(), None);
            let _ = credential_limits::set_team_rate_limit(pool, &changes, CLI_ACTOR, id, rate.per_minute).await?;
            emit(
                json,
                serde_json::json!({"id": id, "rate_limit_per_minute": rate.per_minute}),
                || println!("team {id}: {}", rate_human(rate.per_minute)),
            );
        }
        TeamCmd::SetTools { id, tools } => {
            let id = crate::service::teams::parse_id("id", &id)?;
            let list = tools.allowlist()?;
            let names = list.as_ref().map(ToolAllowlist::names);
            // The CLI has no caches to fence: the NOTIFY is what applies.
            let changes = AuthChanges::new(pool.clone(), None);
            let _ = tool_grants::set_team_tools(pool, &changes, CLI_ACTOR, id, list.as_ref()).await?;
            emit(json, serde_json::json!({"id": id, "tools": tools_json(names)}), || {
                println!("team {id} may use: {}", tools_human(names))
            });
        }
    }
    Ok(())
}
