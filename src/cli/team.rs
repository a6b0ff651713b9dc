//! `mnemosyne team set-tools|set-rate-limit|set-libraries|show`: a team JWT's
//! tools, rate and directly granted libraries.

use super::args::{rate_human, tools_human, tools_json, TeamCmd};
use super::{emit, CLI_ACTOR};
use crate::auth::changes::AuthChanges;
use crate::service::credential_limits;
use crate::service::tool_grants::{self, ToolAllowlist};

/// `team set-tools|set-rate-limit|set-libraries|show` (teams are created
/// through the team REST API).
pub(super) async fn run(pool: &sqlx::PgPool, c: TeamCmd, json: bool) -> anyhow::Result<()> {
    match c {
        TeamCmd::SetLibraries { id, uids } => {
            let id = crate::service::teams::parse_id("id", &id)?;
            // The CLI has no caches to fence: the NOTIFY is what applies.
            let changes = AuthChanges::new(pool.clone(), None);
            let (stored, _) = crate::service::teams::set_libraries(pool, &changes, CLI_ACTOR, id, uids).await?;
            emit(json, serde_json::json!({"id": id, "library_uids": stored}), || {
                if stored.is_empty() {
                    println!("team {id}: no library granted directly");
                } else {
                    println!("team {id} is granted directly: {}", stored.join(", "));
                }
            });
        }
        TeamCmd::Show { id } => {
            let id = crate::service::teams::parse_id("id", &id)?;
            let (t, ws, libs) = crate::service::teams::detail(pool, id).await?;
            emit(
                json,
                serde_json::json!({"id": t.id, "name": t.name, "active": t.active,
                                   "workspace_ids": ws, "library_uids": libs}),
                || {
                    println!(
                        "team {} ({}), {}",
                        t.id,
                        t.name,
                        if t.active { "active" } else { "deactivated" }
                    );
                    println!(
                        "workspaces: {}",
                        if ws.is_empty() { "—".to_owned() } else { ws.join(", ") }
                    );
                    println!(
                        "libraries:  {}",
                        if libs.is_empty() {
                            "—".to_owned()
                        } else {
                            libs.join(", ")
                        }
                    );
                },
            );
        }
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
