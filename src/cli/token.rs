//! `mnemosyne token ...`: opaque MCP tokens.

use super::args::{rate_human, tools_human, tools_json, TokenCmd};
use super::{emit, CLI_ACTOR};
use crate::auth::changes::AuthChanges;
use crate::service::credential_limits;
use crate::service::tokens::{self as tokens_service, Minted, TokenError};
use crate::service::tool_grants::ToolAllowlist;
use crate::store::pg::tokens;

fn token_json(t: &tokens::TokenInfo) -> serde_json::Value {
    serde_json::json!({"id": t.id, "name": t.name, "user": t.username, "libraries": t.allowed_libraries.0,
                       "tools": tools_json(t.allowed_tools.as_deref()),
                       "rate_limit_per_minute": t.rate_limit_per_minute, "active": t.active, "expires_at": t.expires_at, "last_used_at": t.last_used_at,
                       "created_at": t.created_at})
}

/// `token create|set-tools|set-rate-limit|list|revoke`.
pub(super) async fn run(pool: &sqlx::PgPool, c: TokenCmd, json: bool, max_live: u32) -> anyhow::Result<()> {
    match c {
        TokenCmd::Create {
            user,
            libraries,
            name,
            expires_at,
            tools,
        } => {
            let allowlist = if tools.is_empty() {
                None
            } else {
                Some(ToolAllowlist::parse("--tool", &tools, &crate::mcp::TOOLS)?)
            };
            let names = allowlist.as_ref().map(ToolAllowlist::names);
            let token = tokens_service::NewToken {
                username: &user,
                name: &name,
                libraries: &libraries,
                tools: allowlist.as_ref(),
                expires_at,
            };
            let Minted { id, plaintext } = tokens_service::mint_with_tools(pool, CLI_ACTOR, &token, max_live)
                .await
                .map_err(|e| match e {
                    TokenError::NotOwnerOrManager { .. } => {
                        anyhow::anyhow!("{e} (grant a role with `mnemosyne membership grant`)")
                    }
                    TokenError::ExpiryInPast => anyhow::anyhow!("--expires-at is in the past"),
                    e => e.into(),
                })?;
            emit(
                json,
                serde_json::json!({"id": id, "user": user, "name": name, "libraries": libraries,
                                   "tools": tools_json(names), "expires_at": expires_at, "token": plaintext}),
                || {
                    if libraries.is_empty() {
                        eprintln!("note: a token with no library reads nothing (fail-closed)");
                    }
                    println!("token {id} created for {user}. Copy it now; it is not shown again:\n{plaintext}")
                },
            );
        }
        TokenCmd::List { user } => {
            let list = tokens::list(pool, user.as_deref()).await?;
            emit(json, list.iter().map(token_json).collect(), || {
                println!(
                    "{:<6} {:<20} {:<20} {:<7} {:<25} {:<25} {:<20} LIBRARIES",
                    "ID", "NAME", "USER", "ACTIVE", "EXPIRES", "LAST USED", "TOOLS"
                );
                for t in &list {
                    println!(
                        "{:<6} {:<20} {:<20} {:<7} {:<25} {:<25} {:<20} {}",
                        t.id,
                        t.name,
                        t.username,
                        t.active,
                        t.expires_at.map(|d| d.to_rfc3339()).unwrap_or_else(|| "never".into()),
                        t.last_used_at.map(|d| d.to_rfc3339()).unwrap_or_else(|| "never".into()),
                        tools_human(t.allowed_tools.as_deref()),
                        t.allowed_libraries.0.join(",")
                    );
                }
            });
        }
        TokenCmd::SetTools { id, tools } => {
            let list = tools.allowlist()?;
            let names = list.as_ref().map(ToolAllowlist::names);
            // The CLI has no caches to fence: the NOTIFY is what applies.
            let changes = AuthChanges::new(pool.clone(), None);
            let _ = crate::service::tokens::set_token_tools(pool, &changes, CLI_ACTOR, id, list.as_ref(), None).await?;
            emit(json, serde_json::json!({"id": id, "tools": tools_json(names)}), || {
                println!("token {id} may use: {}", tools_human(names))
            });
        }
        TokenCmd::SetRateLimit { id, rate } => {
            let changes = AuthChanges::new(pool.clone(), None);
            let _ = credential_limits::set_token_rate_limit(pool, &changes, CLI_ACTOR, id, rate.per_minute).await?;
            emit(
                json,
                serde_json::json!({"id": id, "rate_limit_per_minute": rate.per_minute}),
                || println!("token {id}: {}", rate_human(rate.per_minute)),
            );
        }
        TokenCmd::Revoke { id } => {
            // The CLI has no caches to fence: the NOTIFY is what applies.
            let _ = tokens_service::revoke_by(pool, &AuthChanges::new(pool.clone(), None), CLI_ACTOR, id, None).await?;
            emit(json, serde_json::json!({"id": id, "revoked": true}), || {
                println!("token {id} revoked")
            });
        }
    }
    Ok(())
}
