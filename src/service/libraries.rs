//! Library lifecycle: deleting a workspace's Library (DESIGN §6), and
//! creating, renaming or deleting a user-managed one (spec §4.1: its owner, or an
//! operator), each delete together with every grant on the library. A
//! workspace's library uid is derived from its id, and a user-managed uid can
//! be chosen again, so a library deleted and later re-created gets the same
//! uid back: memberships and token scopes naming it must go with the content,
//! or they would silently grant whatever is put there next. Used by the
//! library REST API, the console and the CLI.

use serde_json::json;
use sqlx::PgPool;

use super::{audit, check_text, BadField, Propagation};
use crate::analysis::{Language, LANGUAGES};
use crate::auth::changes::AuthChanges;
use crate::ids::{LibraryUid, WorkspaceId};
use crate::store::graph::admin::LibraryDetail;
use crate::store::graph::ingest::workspace_library_uid;
use crate::store::graph::ingest::AdminGraph;
use crate::store::graph::GraphError;
use crate::store::pg::users::{self, Role};
use crate::store::pg::{self, grants};

/// Why a workspace delete did not finish.
#[derive(Debug, thiserror::Error)]
pub enum DeleteError {
    /// Nothing of the grants was touched; the graph content may be partly
    /// deleted (a retry finishes it).
    #[error(transparent)]
    Graph(#[from] GraphError),
    /// The content is deleted but the grants on it could not be removed
    /// (nothing of them changed): retry the delete, which is safe.
    #[error("the workspace's library is deleted but its grants could not be removed: {0}")]
    Grants(sqlx::Error),
}

/// What a workspace delete did.
#[derive(Debug)]
pub struct WorkspaceDeleted {
    /// Libraries deleted from the graph by this call.
    pub deleted: Vec<String>,
    /// Library uids whose grants were cleared: the deleted ones and the
    /// workspace's own uid (unless another library holds it).
    pub cleared: Vec<String>,
    pub memberships_removed: u64,
    pub tokens_changed: u64,
    /// Whether every replica confirmed the change (only when something changed).
    pub propagation: Propagation,
}

/// Deletes the workspace's Library and everything under it, then, in one
/// Postgres transaction, every membership on it and its uid from every
/// token's `allowed_libraries`, with one `workspace_deleted` audit event by
/// `actor`; every replica drops what it cached before this returns (the
/// fence). Idempotent: a retry (the graph has nothing left) still clears the
/// grants, so one after a failed cleanup finishes the job.
pub async fn delete_workspace(
    graph: &AdminGraph,
    pg: &PgPool,
    changes: &AuthChanges,
    actor: &str,
    ws: &WorkspaceId,
) -> Result<WorkspaceDeleted, DeleteError> {
    // Uids only: counting a large workspace's chunks first could outlast the timeout.
    let deleted: Vec<String> = graph.workspace_library_uids(ws.as_str()).await?;
    let mut cleared = deleted.clone();
    let own = workspace_library_uid(ws.as_str());
    if !cleared.contains(&own) {
        // Not found under the workspace: absent (a retry, or grants made before
        // the first ingest) — cleared; or held by a library that is not this
        // workspace's — its grants are its own.
        match graph.find_library(&own).await? {
            None => cleared.push(own),
            Some(Some(w)) if w == ws.as_str() => cleared.push(own),
            Some(_) => {}
        }
    }
    graph.delete_libraries_of(&deleted, Some(ws.as_str())).await?;
    // A retry after a delete whose record failed finds nothing left: its
    // changes are recorded now, before the answer.
    graph.settle_library_deletes(&cleared).await?;
    graph.settle_workspace_delete(ws.as_str()).await?;
    let mut notes = Vec::new();
    if !deleted.is_empty() {
        notes.push(format!("workspace:{ws}"));
    }
    let cleanup = async {
        let mut tx = pg.begin().await?;
        let (memberships_removed, tokens_changed) = remove_grants(&mut tx, &cleared, &mut notes).await?;
        if !notes.is_empty() {
            pg::audit(
                &mut tx,
                actor,
                "workspace_deleted",
                ws.as_str(),
                json!({
                    "workspace_id": ws,
                    "libraries": cleared,
                    "deleted_from_graph": deleted,
                    "memberships_removed": memberships_removed,
                    "tokens_changed": tokens_changed,
                }),
            )
            .await?;
            // The triggers announce each changed row as well; these make the
            // announcement independent of them (identical payloads go once).
            pg::notify_in(&mut tx, &notes).await?;
        }
        tx.commit().await?;
        Ok::<_, sqlx::Error>((memberships_removed, tokens_changed))
    }
    .await;
    match cleanup {
        Ok((memberships_removed, tokens_changed)) => {
            let changed = !deleted.is_empty() || memberships_removed > 0 || tokens_changed > 0;
            let propagation = if changed { changes.fence().await } else { Ok(()) };
            Ok(WorkspaceDeleted {
                deleted,
                cleared,
                memberships_removed,
                tokens_changed,
                propagation,
            })
        }
        Err(e) => {
            tracing::error!(error = %e, workspace = ?ws.as_str(), libraries = ?cleared,
                            "workspace deleted from the graph but its grants were NOT removed: \
                             memberships and tokens still name it until the DELETE is retried");
            if !deleted.is_empty() {
                // Teams must lose the workspace even so.
                changes.announce_workspace(ws).await;
            }
            Err(DeleteError::Grants(e))
        }
    }
}

/// Removes every membership on `uids`, `uids` from every token's scope and
/// every team's direct library grants of them, in the caller's transaction; adds the announcements of what changed to
/// `notes` (the row triggers announce each row as well).
async fn remove_grants(
    tx: &mut sqlx::PgConnection,
    uids: &[String],
    notes: &mut Vec<String>,
) -> Result<(u64, u64), sqlx::Error> {
    let memberships_removed = grants::remove_memberships(&mut *tx, uids).await?;
    let tokens_changed = grants::remove_from_tokens(&mut *tx, uids).await?;
    // A team granted the library directly loses the grant too, so a library
    // re-created under the same uid (a workspace's is deterministic) is not
    // inherited by the teams that read the old one.
    let team_grants_removed = grants::remove_from_teams(&mut *tx, uids).await?;
    if team_grants_removed > 0 {
        notes.push("team_library_grants:*".to_owned());
    }
    if memberships_removed > 0 {
        notes.push("library_memberships:*".to_owned());
    }
    if tokens_changed > 0 {
        notes.push("mcp_tokens:*".to_owned());
    }
    Ok((memberships_removed, tokens_changed))
}

/// On whose authority a library is renamed or deleted (spec §4.1).
#[derive(Clone, Copy, Debug)]
pub enum Authority<'a> {
    /// Console staff, the CLI and the service account's REST API.
    Operator,
    /// A console user: only an owner of the library may.
    Owner(&'a str),
}

/// Why a rename or delete was refused or did not finish.
#[derive(Debug, thiserror::Error)]
pub enum LibraryError {
    #[error(transparent)]
    BadField(#[from] BadField),
    #[error("library not found: {0}")]
    NotFound(String),
    /// Workspace libraries follow their workspace (DESIGN §6).
    #[error(
        "library {uid} is the library of workspace {workspace_id}: it is managed by the workspace API \
         (DELETE /library/api/workspaces/{workspace_id}/), not renamed or deleted on its own"
    )]
    Workspace { uid: String, workspace_id: String },
    #[error("only an owner of library {0} may rename or delete it")]
    NotOwner(String),
    #[error("library {0} is being deleted: delete it again to finish")]
    Deleting(String),
    /// A create naming a uid that is taken.
    #[error("library {0} already exists")]
    Exists(String),
    #[error(transparent)]
    Graph(#[from] GraphError),
    #[error(transparent)]
    Postgres(#[from] sqlx::Error),
    /// The content is deleted but the grants on it could not be removed
    /// (nothing of them changed): retry the delete, which is safe.
    #[error("the library is deleted but its grants could not be removed: {0}")]
    Grants(sqlx::Error),
}

fn parse_uid(uid: &str) -> Result<String, LibraryError> {
    Ok(LibraryUid::parse("uid", uid).map_err(BadField::from)?.into_string())
}

/// An owner check for `Authority::Owner`: no role at all reads as absent.
async fn check_authority(pg: &PgPool, who: Authority<'_>, uid: &str) -> Result<(), LibraryError> {
    match who {
        Authority::Operator => Ok(()),
        Authority::Owner(user) => match users::strongest_role(pg, user, uid).await? {
            Some(Role::Owner) => Ok(()),
            Some(_) => Err(LibraryError::NotOwner(uid.to_owned())),
            None => Err(LibraryError::NotFound(uid.to_owned())),
        },
    }
}

/// The user-managed library `uid` (None when it is not in the graph).
async fn user_managed(graph: &AdminGraph, uid: &str) -> Result<Option<LibraryDetail>, LibraryError> {
    match graph.library_detail(uid).await? {
        Some(LibraryDetail {
            workspace_id: Some(ws), ..
        }) => Err(LibraryError::Workspace {
            uid: uid.to_owned(),
            workspace_id: ws,
        }),
        other => Ok(other),
    }
}

/// A user-managed library to create (`POST /library/api/libraries/`,
/// DESIGN §6), as the caller sent it.
#[derive(Debug, Clone, Default)]
pub struct NewLibrary {
    /// Chosen by the caller, or `lib_<uuid>`.
    pub uid: Option<String>,
    pub name: String,
    pub description: Option<String>,
    /// ISO 639-1 code of the language its text is analyzed in (default `en`).
    pub language: Option<String>,
}

/// What a create did.
#[derive(Debug, Clone)]
pub struct Created {
    pub uid: String,
    pub name: String,
    pub description: String,
    pub language: Language,
}

/// Longest library name, in characters.
pub const MAX_NAME_CHARS: usize = 200;
/// Longest library description, in characters.
pub const MAX_DESCRIPTION_CHARS: usize = 2000;

/// Creates a user-managed library (not tied to a workspace), audited
/// `library_created` right after the graph commits. Fields are checked in
/// order (name, description, language, uid) before any store call; a taken
/// uid is `LibraryError::Exists`.
pub async fn create(graph: &AdminGraph, pg: &PgPool, actor: &str, new: NewLibrary) -> Result<Created, LibraryError> {
    check_text("name", &new.name, 1, MAX_NAME_CHARS)?;
    let description = new.description.unwrap_or_default();
    check_text("description", &description, 0, MAX_DESCRIPTION_CHARS)?;
    let language = match new.language.as_deref() {
        None => Language::English,
        Some(code) => Language::from_code(code).ok_or_else(|| {
            let codes: Vec<&str> = LANGUAGES.iter().map(|(_, c)| *c).collect();
            super::bad("language", format!("language must be one of: {}", codes.join(", ")))
        })?,
    };
    let uid = match new.uid {
        Some(u) => LibraryUid::parse("uid", u).map_err(BadField::from)?.into_string(),
        None => format!("lib_{}", uuid::Uuid::new_v4().simple()),
    };
    if !graph.create_library(&uid, &new.name, &description, language).await? {
        return Err(LibraryError::Exists(uid));
    }
    tracing::info!(actor = ?actor, library = ?uid, "library created");
    // A team granted this uid before it existed reads it from the next
    // request on every replica (the resolver remembers which direct grants
    // the graph holds; this announcement makes it look again).
    if let Err(e) = pg::notify(pg, &format!("library:{uid}")).await {
        tracing::warn!(error = %e, library = ?uid, "could not announce a library create");
    }
    audit::after_commit(
        pg,
        actor,
        "library_created",
        &uid,
        json!({"name": new.name, "language": language.code()}),
    )
    .await;
    Ok(Created {
        uid,
        name: new.name,
        description,
        language,
    })
}

/// What a rename did.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Renamed {
    pub uid: String,
    pub name: String,
    pub description: String,
    pub previous_name: String,
}

/// Renames a user-managed library (and sets its description when given),
/// audited `library_renamed` right after the graph commits. Workspace
/// libraries are refused (`LibraryError::Workspace`).
pub async fn rename(
    graph: &AdminGraph,
    pg: &PgPool,
    actor: &str,
    who: Authority<'_>,
    uid: &str,
    name: &str,
    description: Option<&str>,
) -> Result<Renamed, LibraryError> {
    let uid = parse_uid(uid)?;
    let name = name.trim();
    check_text("name", name, 1, MAX_NAME_CHARS)?;
    if let Some(d) = description {
        check_text("description", d, 0, MAX_DESCRIPTION_CHARS)?;
    }
    check_authority(pg, who, &uid).await?;
    let Some(lib) = user_managed(graph, &uid).await? else {
        return Err(LibraryError::NotFound(uid));
    };
    if lib.deleting {
        return Err(LibraryError::Deleting(uid));
    }
    let description = description.unwrap_or(&lib.description).to_owned();
    if !graph.rename_library(&uid, name, &description).await? {
        // Deleted (or being deleted) since the read.
        return Err(LibraryError::NotFound(uid));
    }
    // Every replica forgets what it cached of the library (see
    // `forget_changed_libraries`); the MCP tools read names from the graph.
    if let Err(e) = pg::notify(pg, &format!("library:{uid}")).await {
        tracing::warn!(error = %e, library = ?uid, "could not announce a library rename");
    }
    super::audit::after_commit(
        pg,
        actor,
        "library_renamed",
        &uid,
        json!({"from": lib.name, "to": name, "description_changed": description != lib.description}),
    )
    .await;
    Ok(Renamed {
        uid,
        name: name.to_owned(),
        description,
        previous_name: lib.name,
    })
}

/// What a library delete did.
#[derive(Debug)]
pub struct LibraryDeleted {
    pub uid: String,
    /// What the graph held when the delete started (None: nothing, a retry).
    pub content: Option<LibraryDetail>,
    pub memberships_removed: u64,
    pub tokens_changed: u64,
    pub propagation: Propagation,
}

/// Deletes a user-managed library and everything under it, then, in one
/// Postgres transaction, every membership on it and its uid from every
/// token's `allowed_libraries`, with one `library_deleted` audit event (the
/// counts, never content); every replica drops what it cached before this
/// returns (the fence). A library's last owner cannot be revoked, but the
/// library can be deleted. A retry after a failed grant cleanup finishes it;
/// nothing in the graph and no grants is `NotFound`.
pub async fn delete(
    graph: &AdminGraph,
    pg: &PgPool,
    changes: &AuthChanges,
    actor: &str,
    who: Authority<'_>,
    uid: &str,
) -> Result<LibraryDeleted, LibraryError> {
    let uid = parse_uid(uid)?;
    check_authority(pg, who, &uid).await?;
    let content = user_managed(graph, &uid).await?;
    if content.is_some() {
        graph.delete_libraries(std::slice::from_ref(&uid)).await?;
    } else {
        graph.settle_library_deletes(std::slice::from_ref(&uid)).await?;
    }
    let cleared = [uid.clone()];
    let cleanup = async {
        let mut tx = pg.begin().await?;
        let mut notes = Vec::new();
        let (memberships_removed, tokens_changed) = remove_grants(&mut tx, &cleared, &mut notes).await?;
        if content.is_some() || !notes.is_empty() {
            let c = content.as_ref();
            pg::audit(
                &mut tx,
                actor,
                "library_deleted",
                &uid,
                json!({
                    "name": c.map(|c| c.name.as_str()),
                    "deleted_from_graph": c.is_some(),
                    "collections": c.map(|c| c.collection_count),
                    "items": c.map(|c| c.item_count),
                    "chunks": c.map(|c| c.chunk_count),
                    "memberships_removed": memberships_removed,
                    "tokens_changed": tokens_changed,
                }),
            )
            .await?;
            notes.push(format!("library:{uid}"));
            pg::notify_in(&mut tx, &notes).await?;
        }
        tx.commit().await?;
        Ok::<_, sqlx::Error>((memberships_removed, tokens_changed))
    }
    .await;
    match cleanup {
        Ok((0, 0)) if content.is_none() => Err(LibraryError::NotFound(uid)),
        Ok((memberships_removed, tokens_changed)) => Ok(LibraryDeleted {
            uid,
            content,
            memberships_removed,
            tokens_changed,
            propagation: changes.fence().await,
        }),
        Err(e) => {
            tracing::error!(error = %e, library = ?uid,
                            "library deleted from the graph but its grants were NOT removed: \
                             memberships and tokens still name it until the delete is retried");
            Err(LibraryError::Grants(e))
        }
    }
}
