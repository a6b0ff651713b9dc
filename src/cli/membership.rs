//! `mnemosyne membership grant|revoke|list`: library memberships.

use anyhow::bail;

use super::args::MembershipCmd;
use super::{emit, CLI_ACTOR};
use crate::service::memberships;
use crate::store::pg::users;

/// `membership grant|revoke|list`.
pub(super) async fn run(pool: &sqlx::PgPool, c: MembershipCmd, json: bool) -> anyhow::Result<()> {
    use memberships::Change;
    let (change, username, library_uid, role) = match c {
        MembershipCmd::Grant {
            username,
            library_uid,
            role,
        } => (Change::Grant, username, library_uid, role),
        MembershipCmd::Revoke {
            username,
            library_uid,
            role,
        } => (Change::Revoke, username, library_uid, role),
        MembershipCmd::List { user, library } => {
            let list = users::memberships(pool, user.as_deref(), library.as_deref()).await?;
            let value = list
                .iter()
                .map(|m| serde_json::json!({"username": m.username, "library_uid": m.library_uid, "role": m.role}))
                .collect();
            emit(json, value, || {
                println!("{:<30} {:<40} ROLE", "USER", "LIBRARY");
                for m in &list {
                    println!("{:<30} {:<40} {}", m.username, m.library_uid, m.role);
                }
            });
            return Ok(());
        }
    };
    let granter = memberships::Granter::Cli;
    if let Err(refusal) = memberships::apply(pool, granter, CLI_ACTOR, change, &username, &library_uid, role).await? {
        bail!("{refusal}");
    }
    let (done, human) = match change {
        Change::Grant => (
            "granted",
            format!("granted {} on {library_uid} to {username}", role.as_str()),
        ),
        Change::Revoke => (
            "revoked",
            format!("revoked {} on {library_uid} from {username}", role.as_str()),
        ),
    };
    emit(
        json,
        serde_json::json!({"username": username, "library_uid": library_uid, "role": role, done: true}),
        || println!("{human}"),
    );
    Ok(())
}
