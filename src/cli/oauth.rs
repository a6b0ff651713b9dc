//! `mnemosyne oauth ...`: the embedded authorization server's clients and
//! grants (issue 48).

use clap::Subcommand;

use super::args::tools_human;
use super::{emit, CLI_ACTOR};
use crate::auth::changes::AuthChanges;
use crate::service::oauth::{self as service, Issuer};
use crate::store::pg::oauth as store;

#[derive(Subcommand, Debug)]
pub enum OAuthCmd {
    /// OAuth clients (pre-registered, dynamically registered or fetched).
    #[command(subcommand)]
    Client(ClientCmd),
    /// What people granted to clients on the consent page.
    #[command(subcommand)]
    Grant(GrantCmd),
}

#[derive(Subcommand, Debug)]
pub enum ClientCmd {
    /// Pre-register a public client (PKCE, no secret); prints its client_id.
    Add {
        /// The name the consent page shows.
        #[arg(long)]
        name: String,
        /// A redirect URI (repeat for several): https, or http on a
        /// loopback address (any port matches), or a native app's scheme.
        #[arg(long = "redirect-uri", required = true)]
        redirect_uris: Vec<String>,
    },
    /// Every client.
    List,
    /// Remove a client with its grants and tokens.
    Remove { client_id: String },
}

#[derive(Subcommand, Debug)]
pub enum GrantCmd {
    /// Live grants (every grant with --all), of one user with --user.
    List {
        #[arg(long)]
        user: Option<String>,
        #[arg(long)]
        all: bool,
    },
    /// Revoke a grant: its access and refresh tokens stop on the next request.
    Revoke { id: i64 },
}

pub(super) async fn run(
    settings: &crate::config::Settings,
    pool: &sqlx::PgPool,
    c: OAuthCmd,
    json: bool,
) -> anyhow::Result<()> {
    match c {
        OAuthCmd::Client(ClientCmd::Add { name, redirect_uris }) => {
            let issuer = Issuer::new(&settings.public_url);
            let request = serde_json::json!({"client_name": name, "redirect_uris": redirect_uris});
            let answer = service::register(pool, &issuer, CLI_ACTOR, "cli", &request)
                .await
                .map_err(|e| anyhow::anyhow!("{}: {e}", e.code()))?;
            emit(json, answer.clone(), || {
                println!("client {} added ({name})", answer["client_id"].as_str().unwrap_or(""))
            });
        }
        OAuthCmd::Client(ClientCmd::List) => {
            let list = store::clients(pool).await?;
            let v: Vec<serde_json::Value> = list
                .iter()
                .map(|c| {
                    serde_json::json!({"client_id": c.client_id, "client_name": c.client_name,
                                       "redirect_uris": c.redirect_uris, "source": c.source,
                                       "created_at": c.created_at})
                })
                .collect();
            emit(json, v.into(), || {
                println!("{:<30} {:<25} {:<5} REDIRECT URIS", "CLIENT ID", "NAME", "FROM");
                for c in &list {
                    println!(
                        "{:<30} {:<25} {:<5} {}",
                        c.client_id,
                        c.client_name,
                        c.source,
                        c.redirect_uris.join(",")
                    );
                }
            });
        }
        OAuthCmd::Client(ClientCmd::Remove { client_id }) => {
            if !service::remove_client(pool, CLI_ACTOR, &client_id)
                .await
                .map_err(|e| anyhow::anyhow!("{e}"))?
            {
                anyhow::bail!("no client {client_id}");
            }
            emit(
                json,
                serde_json::json!({"client_id": client_id, "removed": true}),
                || println!("client {client_id} removed with its grants"),
            );
        }
        OAuthCmd::Grant(GrantCmd::List { user, all }) => {
            let list = store::grants(pool, user.as_deref(), all).await?;
            let v: Vec<serde_json::Value> = list
                .iter()
                .map(|g| {
                    serde_json::json!({"id": g.id, "client_id": g.client_id, "client_name": g.client_name,
                                       "user": g.username, "libraries": g.allowed_libraries.0,
                                       "tools": g.allowed_tools, "active": g.active,
                                       "expires_at": g.expires_at, "last_used_at": g.last_used_at,
                                       "created_at": g.created_at})
                })
                .collect();
            emit(json, v.into(), || {
                println!(
                    "{:<6} {:<20} {:<25} {:<7} {:<25} {:<20} LIBRARIES",
                    "ID", "USER", "CLIENT", "ACTIVE", "EXPIRES", "TOOLS"
                );
                for g in &list {
                    println!(
                        "{:<6} {:<20} {:<25} {:<7} {:<25} {:<20} {}",
                        g.id,
                        g.username,
                        if g.client_name.is_empty() {
                            &g.client_id
                        } else {
                            &g.client_name
                        },
                        g.active,
                        g.expires_at.to_rfc3339(),
                        tools_human(g.allowed_tools.as_deref()),
                        g.allowed_libraries.0.join(",")
                    );
                }
            });
        }
        OAuthCmd::Grant(GrantCmd::Revoke { id }) => {
            // The CLI has no caches to fence: the NOTIFY is what applies.
            let changes = AuthChanges::new(pool.clone(), None);
            if service::revoke_grant(pool, &changes, CLI_ACTOR, id, None)
                .await
                .map_err(|e| anyhow::anyhow!("{e}"))?
                .is_none()
            {
                anyhow::bail!("no active grant with id {id}");
            }
            emit(json, serde_json::json!({"id": id, "revoked": true}), || {
                println!("grant {id} revoked")
            });
        }
    }
    Ok(())
}
