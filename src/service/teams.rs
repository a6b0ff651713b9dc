//! The team lifecycle (spec §7): register, read, replace workspaces, rotate,
//! deactivate. Every write is one Postgres transaction with its audit event,
//! then a cross-replica fence, so the next request on any replica sees it.
//! Used by the team REST, the admin console and the demo.

use chrono::Utc;
use sqlx::PgPool;
use uuid::Uuid;

use super::{bad, check_len, BadField, Propagation};
use crate::auth::changes::AuthChanges;
use crate::auth::jwt;
use crate::ids::{LibraryUid, WorkspaceId};
use crate::store::pg::teams::Grants;
use crate::store::pg::{keys, teams};

pub use crate::store::pg::teams::Team;

#[derive(Debug, thiserror::Error)]
pub enum TeamError {
    #[error("{0}")]
    BadField(#[from] BadField),
    #[error("team not found")]
    NotFound,
    #[error("team is inactive (deleted); register it under a new id to get a new JWT")]
    Inactive,
    #[error("no active signing key; run `mnemosyne migrate` or `signing-key create`")]
    NoSigningKey,
    #[error("signing a team JWT: {0}")]
    Signing(String),
    #[error(transparent)]
    Store(#[from] sqlx::Error),
}

/// Most workspaces one team may hold.
pub const MAX_WORKSPACES: usize = 1000;
/// Most libraries one team may be granted directly (the same cap as workspaces).
pub const MAX_LIBRARIES: usize = 1000;

/// A team id as the caller wrote it: a UUID.
pub fn parse_id(field: &str, raw: &str) -> Result<Uuid, BadField> {
    Uuid::parse_str(raw).map_err(|_| bad(field, format!("{field} must be a UUID")))
}

fn check_name(name: &str) -> Result<(), BadField> {
    check_len("name", name, 1, 200)
}

/// Validates and de-duplicates (first occurrence kept) workspace ids.
pub fn clean_workspace_ids(ids: Vec<String>) -> Result<Vec<String>, BadField> {
    if ids.len() > MAX_WORKSPACES {
        return Err(bad("workspace_ids", format!("at most {MAX_WORKSPACES} workspace ids")));
    }
    let mut seen = std::collections::HashSet::new();
    let mut out = Vec::with_capacity(ids.len());
    for (i, w) in ids.into_iter().enumerate() {
        let w = WorkspaceId::parse(&format!("workspace_ids[{i}]"), w)?.into_string();
        if seen.insert(w.clone()) {
            out.push(w);
        }
    }
    Ok(out)
}

/// Validates and de-duplicates (first occurrence kept) directly granted
/// library uids, by the workspace ids' rules: a list, at most
/// `MAX_LIBRARIES`, each a valid uid named `library_uids[i]` when not. A uid
/// the graph does not hold is accepted (it resolves to nothing until it does).
pub fn clean_library_uids(uids: Vec<String>) -> Result<Vec<String>, BadField> {
    if uids.len() > MAX_LIBRARIES {
        return Err(bad("library_uids", format!("at most {MAX_LIBRARIES} library uids")));
    }
    let mut seen = std::collections::HashSet::new();
    let mut out = Vec::with_capacity(uids.len());
    for (i, u) in uids.into_iter().enumerate() {
        let u = LibraryUid::parse(&format!("library_uids[{i}]"), u)?.into_string();
        if seen.insert(u.clone()) {
            out.push(u);
        }
    }
    Ok(out)
}

/// Signs a team JWT with the newest active key.
async fn mint(pg: &PgPool, team: Uuid, jti: Uuid) -> Result<String, TeamError> {
    let key = keys::newest_active(pg).await?.ok_or(TeamError::NoSigningKey)?;
    let secret = hex::decode(&key.secret_hex).map_err(|_| TeamError::Signing("corrupt signing key".into()))?;
    jwt::mint_team_jwt(team, jti, &key.kid, &secret, Utc::now().timestamp())
        .map_err(|e| TeamError::Signing(e.to_string()))
}

pub enum Registered {
    /// A new team and its JWT (shown only here).
    New {
        team: Team,
        jwt: String,
        propagation: Propagation,
    },
    /// The id existed: spec §7.1's idempotent answer, no JWT.
    Existing(Team),
}

/// Registers a team (spec §7.1).
pub async fn register(
    pg: &PgPool,
    changes: &AuthChanges,
    actor: &str,
    id: Uuid,
    name: &str,
) -> Result<Registered, TeamError> {
    check_name(name)?;
    // Mint before inserting so a missing key never leaves a team without a JWT.
    let jti = Uuid::new_v4();
    let jwt = mint(pg, id, jti).await?;
    match teams::create(pg, actor, id, name, jti).await? {
        teams::Created::New(team) => {
            tracing::info!(team = %id, actor, "team created");
            Ok(Registered::New {
                team,
                jwt,
                propagation: changes.fence().await,
            })
        }
        teams::Created::Existing(team) => Ok(Registered::Existing(team)),
    }
}

/// A team, its workspaces and its directly granted libraries, each in order.
pub async fn detail(pg: &PgPool, id: Uuid) -> Result<(Team, Vec<String>, Vec<String>), TeamError> {
    teams::get(pg, id).await?.ok_or(TeamError::NotFound)
}

/// Soft delete (spec §7.2): its JWT stops working everywhere.
pub async fn deactivate(pg: &PgPool, changes: &AuthChanges, actor: &str, id: Uuid) -> Result<Propagation, TeamError> {
    if !teams::deactivate(pg, actor, id).await? {
        return Err(TeamError::NotFound);
    }
    tracing::info!(team = %id, actor, "team deleted");
    Ok(changes.fence().await)
}

/// Replaces the workspace set (spec §7.3); returns the stored set.
pub async fn set_workspaces(
    pg: &PgPool,
    changes: &AuthChanges,
    actor: &str,
    id: Uuid,
    workspace_ids: Vec<String>,
) -> Result<(Vec<String>, Propagation), TeamError> {
    let ids = clean_workspace_ids(workspace_ids)?;
    let stored = teams::replace_workspaces(pg, actor, id, &ids)
        .await?
        .ok_or(TeamError::NotFound)?;
    Ok((stored, changes.fence().await))
}

/// Replaces the libraries granted to the team directly (issue 53), order
/// kept; returns the stored list. Audited `team_libraries_updated` when it
/// changed; every replica resolves the team's JWT with it from the next request.
pub async fn set_libraries(
    pg: &PgPool,
    changes: &AuthChanges,
    actor: &str,
    id: Uuid,
    library_uids: Vec<String>,
) -> Result<(Vec<String>, Propagation), TeamError> {
    let uids = clean_library_uids(library_uids)?;
    let stored = teams::replace(pg, actor, id, Grants::Libraries, &uids)
        .await?
        .ok_or(TeamError::NotFound)?;
    Ok((stored, changes.fence().await))
}

/// Rotates the team's JWT (spec §7.4): returns the new one (shown only here);
/// the previous one stops validating everywhere.
pub async fn rotate(
    pg: &PgPool,
    changes: &AuthChanges,
    actor: &str,
    id: Uuid,
) -> Result<(String, Propagation), TeamError> {
    let jti = Uuid::new_v4();
    let jwt = mint(pg, id, jti).await?;
    match teams::rotate(pg, actor, id, jti).await? {
        teams::Rotated::Ok => {
            tracing::info!(team = %id, actor, "team rotated");
            Ok((jwt, changes.fence().await))
        }
        teams::Rotated::NotFound => Err(TeamError::NotFound),
        teams::Rotated::Inactive => Err(TeamError::Inactive),
    }
}

/// Makes sure a team exists, is active and has a fresh JWT (the demo): a new
/// team is registered, an active one rotated, a deleted one re-activated.
pub async fn ensure_active(
    pg: &PgPool,
    changes: &AuthChanges,
    actor: &str,
    id: Uuid,
    name: &str,
) -> Result<(String, Propagation), TeamError> {
    match register(pg, changes, actor, id, name).await? {
        Registered::New { jwt, propagation, .. } => Ok((jwt, propagation)),
        Registered::Existing(t) if t.active => rotate(pg, changes, actor, id).await,
        Registered::Existing(_) => {
            let jti = Uuid::new_v4();
            let jwt = mint(pg, id, jti).await?;
            if !teams::reactivate(pg, actor, id, jti).await? {
                return Err(TeamError::NotFound);
            }
            Ok((jwt, changes.fence().await))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn workspace_ids_are_deduplicated_in_order() {
        let ids = clean_workspace_ids(vec!["b".into(), "a".into(), "b".into()]).unwrap();
        assert_eq!(ids, ["b", "a"]);
    }

    #[test]
    fn library_uids_are_deduplicated_in_order_and_named_when_bad() {
        let uids = clean_library_uids(vec!["lib_b".into(), "lib_a".into(), "lib_b".into()]).unwrap();
        assert_eq!(uids, ["lib_b", "lib_a"]);
        let e = clean_library_uids(vec!["ok".into(), "no spaces".into()]).unwrap_err();
        assert_eq!(e.field, "library_uids[1]");
        let e = clean_library_uids((0..=MAX_LIBRARIES).map(|i| format!("l{i}")).collect()).unwrap_err();
        assert_eq!(e.field, "library_uids");
    }

    #[test]
    fn bad_workspace_id_is_named() {
        let e = clean_workspace_ids(vec!["ok".into(), String::new()]).unwrap_err();
        assert_eq!(e.field, "workspace_ids[1]");
    }
}
