//! Library memberships with the spec's rules (§4.1): an owner may grant any
//! role, a manager only `reader`, a reader nothing; a library keeps at least
//! one owner. Staff (console) act with full rights under the last-owner rule;
//! the CLI is the operator's escape hatch and may remove a last owner.

use sqlx::PgPool;

use crate::store::pg::{self, users, users::Role};

/// Why a membership change was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    #[error("no such user: {0}")]
    NoSuchUser(String),
    #[error("{0} has no such role on this library")]
    NotMember(String),
    #[error("a library keeps at least one owner: grant another owner first")]
    LastOwner,
    #[error("a {granter} may not grant {role}")]
    NotAllowed { granter: &'static str, role: &'static str },
    #[error("{0}")]
    BadLibrary(String),
}

impl Refusal {
    pub fn field(&self) -> &'static str {
        match self {
            Refusal::NoSuchUser(_) | Refusal::NotMember(_) => "username",
            Refusal::LastOwner | Refusal::NotAllowed { .. } => "role",
            Refusal::BadLibrary(_) => "library_uid",
        }
    }
}

/// Who may grant what (spec §4.1): the strongest of the granter's roles on the
/// library decides. `None` = no role there.
pub fn may_grant(granter: Option<Role>, role: Role) -> Result<(), Refusal> {
    match (granter, role) {
        (Some(Role::Owner), _) | (Some(Role::Manager), Role::Reader) => Ok(()),
        (g, r) => Err(Refusal::NotAllowed {
            granter: g.map(Role::as_str).unwrap_or("non-member"),
            role: r.as_str(),
        }),
    }
}

fn check_library(uid: &str) -> Result<(), Refusal> {
    crate::ids::LibraryUid::parse("library_uid", uid)
        .map(|_| ())
        .map_err(|e| Refusal::BadLibrary(e.to_string()))
}

/// Who changes a membership.
#[derive(Clone, Copy, Debug)]
pub enum Granter<'a> {
    /// The CLI: full rights, a library's last owner included.
    Cli,
    /// Console staff: full rights, but a library keeps at least one owner.
    Staff,
    /// A member of the library: their own role limits what they may grant or
    /// revoke, and a library keeps at least one owner.
    Member(&'a str),
}

/// A member may grant or revoke a role only as `may_grant` allows, checked
/// inside the transaction that makes the change.
async fn check_granter(
    tx: &mut sqlx::PgConnection,
    granter: Granter<'_>,
    library_uid: &str,
    role: Role,
) -> Result<Result<(), Refusal>, sqlx::Error> {
    match granter {
        Granter::Cli | Granter::Staff => Ok(Ok(())),
        Granter::Member(who) => {
            let theirs = users::strongest_role(&mut *tx, who, library_uid).await?;
            Ok(may_grant(theirs, role))
        }
    }
}

/// A membership change.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Change {
    /// Grant the role (idempotent).
    Grant,
    /// Revoke the role; only the CLI may remove a library's last owner.
    Revoke,
}

impl Change {
    fn action(self) -> &'static str {
        match self {
            Change::Grant => "membership_granted",
            Change::Revoke => "membership_revoked",
        }
    }
}

/// Grants or revokes `role` on `library_uid` for `username` on behalf of
/// `granter`, with its audit event, in one transaction. A member may revoke
/// what they may grant (a manager cannot remove owners or managers).
pub async fn apply(
    pool: &PgPool,
    granter: Granter<'_>,
    actor: &str,
    change: Change,
    username: &str,
    library_uid: &str,
    role: Role,
) -> Result<Result<(), Refusal>, sqlx::Error> {
    if let Err(r) = check_library(library_uid) {
        return Ok(Err(r));
    }
    let mut tx = pool.begin().await?;
    if let Err(r) = check_granter(&mut tx, granter, library_uid, role).await? {
        return Ok(Err(r));
    }
    match change {
        Change::Grant => {
            if !users::grant(&mut *tx, username, library_uid, role).await? {
                return Ok(Err(Refusal::NoSuchUser(username.to_owned())));
            }
        }
        Change::Revoke => {
            let owners = users::lock_owner_count(&mut tx, library_uid).await?;
            if !users::revoke(&mut *tx, username, library_uid, role).await? {
                return Ok(Err(Refusal::NotMember(username.to_owned())));
            }
            if role == Role::Owner && owners <= 1 && !matches!(granter, Granter::Cli) {
                // Rolled back on drop.
                return Ok(Err(Refusal::LastOwner));
            }
        }
    }
    pg::audit(
        &mut tx,
        actor,
        change.action(),
        library_uid,
        serde_json::json!({"user": username, "role": role.as_str()}),
    )
    .await?;
    tx.commit().await?;
    Ok(Ok(()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spec_4_1_who_may_grant_what() {
        let table = [
            (Some(Role::Owner), Role::Owner, true),
            (Some(Role::Owner), Role::Manager, true),
            (Some(Role::Owner), Role::Reader, true),
            (Some(Role::Manager), Role::Owner, false),
            (Some(Role::Manager), Role::Manager, false),
            (Some(Role::Manager), Role::Reader, true),
            (Some(Role::Reader), Role::Reader, false),
            (None, Role::Reader, false),
        ];
        for (granter, role, ok) in table {
            assert_eq!(may_grant(granter, role).is_ok(), ok, "{granter:?} grants {role:?}");
        }
    }
}
