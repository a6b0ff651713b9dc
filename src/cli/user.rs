//! `mnemosyne user ...`: users and service accounts.

use std::io::Read;

use anyhow::{bail, Context};

use super::args::{tools_human, tools_json, UserCmd};
use super::{emit, CLI_ACTOR};
use crate::auth::changes::AuthChanges;
use crate::service::accounts;
use crate::service::tool_grants::ToolAllowlist;
use crate::store::pg::users;

fn read_password_stdin() -> anyhow::Result<String> {
    let mut s = String::new();
    std::io::stdin()
        .read_to_string(&mut s)
        .context("reading password from stdin")?;
    let p = s.lines().next().unwrap_or("").to_owned();
    if p.len() < 8 {
        bail!("password must be at least 8 characters");
    }
    Ok(p)
}

fn user_json(u: &users::User) -> serde_json::Value {
    serde_json::json!({"id": u.id, "username": u.username, "service": u.is_service, "staff": u.is_staff,
                       "active": u.active, "created_at": u.created_at})
}

/// `user create|set-staff|disable|enable|set-password|list`.
pub(super) async fn run(pool: &sqlx::PgPool, c: UserCmd, json: bool) -> anyhow::Result<()> {
    match c {
        UserCmd::Create {
            username,
            service,
            password_stdin,
            staff,
        } => {
            // The service's rules, before a password is read from stdin.
            match accounts::check_new_user(&username, service, staff, password_stdin) {
                Err(accounts::AccountError::StaffWithoutPassword) => {
                    bail!("a staff user signs in with a password: add --password-stdin")
                }
                other => other?,
            }
            let password = if password_stdin {
                Some(read_password_stdin()?)
            } else {
                None
            };
            let u = accounts::create(pool, CLI_ACTOR, &username, password.as_deref(), service, staff).await?;
            emit(json, user_json(&u), || {
                println!(
                    "user created: {} (id {}{}{})",
                    u.username,
                    u.id,
                    if service { ", service account" } else { "" },
                    if staff { ", staff" } else { "" }
                )
            });
        }
        UserCmd::SetTools { username, tools } => {
            let list = if tools.all_tools {
                None
            } else {
                Some(ToolAllowlist::parse("--tool", &tools.tools, &crate::mcp::TOOLS)?)
            };
            let names = list.as_ref().map(ToolAllowlist::names);
            // The CLI has no caches to fence: the NOTIFY is what applies.
            let changes = AuthChanges::new(pool.clone(), None);
            let _ = accounts::set_max_tools(pool, &changes, CLI_ACTOR, &username, list.as_ref()).await?;
            emit(
                json,
                serde_json::json!({"username": username, "max_tools": tools_json(names)}),
                || println!("{username}'s tokens may use at most: {}", tools_human(names)),
            );
        }
        UserCmd::SetRate {
            username, per_minute, ..
        } => {
            let changes = AuthChanges::new(pool.clone(), None);
            let _ = accounts::set_max_rate(pool, &changes, CLI_ACTOR, &username, per_minute).await?;
            emit(
                json,
                serde_json::json!({"username": username, "max_rate_per_minute": per_minute}),
                || match per_minute {
                    Some(n) => println!("{username}'s tokens share at most {n} requests a minute"),
                    None => println!("{username}'s tokens have no rate ceiling"),
                },
            );
        }
        UserCmd::Disable { username } => set_active(pool, &username, false, json).await?,
        UserCmd::Enable { username } => set_active(pool, &username, true, json).await?,
        UserCmd::SetStaff { username, off } => {
            accounts::set_staff(pool, CLI_ACTOR, &username, !off).await?;
            emit(json, serde_json::json!({"username": username, "staff": !off}), || {
                println!("{username}: staff {}", if off { "off" } else { "on" })
            });
        }
        UserCmd::SetPassword { username } => {
            accounts::set_password(pool, CLI_ACTOR, &username, &read_password_stdin()?).await?;
            println!("password set: {username}");
        }
        UserCmd::List => {
            let list = users::list(pool).await?;
            emit(json, list.iter().map(user_json).collect(), || {
                println!(
                    "{:<6} {:<30} {:<8} {:<6} {:<7}",
                    "ID", "USERNAME", "SERVICE", "STAFF", "ACTIVE"
                );
                for u in &list {
                    println!(
                        "{:<6} {:<30} {:<8} {:<6} {:<7}",
                        u.id, u.username, u.is_service, u.is_staff, u.active
                    );
                }
            });
        }
    }
    Ok(())
}

async fn set_active(pool: &sqlx::PgPool, username: &str, active: bool, json: bool) -> anyhow::Result<()> {
    accounts::set_active(pool, CLI_ACTOR, username, active).await?;
    emit(
        json,
        serde_json::json!({"username": username, "active": active}),
        || println!("user {}: {username}", if active { "enabled" } else { "disabled" }),
    );
    Ok(())
}
