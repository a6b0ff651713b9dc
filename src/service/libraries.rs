//! Deleting a workspace's Library (DESIGN §6) together with every grant on
//! it. A workspace's library uid is derived from its id, so a workspace
//! deleted and later ingested again gets the same uid back: memberships and
//! token scopes naming it must go with the content, or they would silently
//! grant whatever is ingested next. Used by the library REST API.

use serde_json::json;
use sqlx::PgPool;

use super::Propagation;
use crate::auth::changes::AuthChanges;
use crate::ids::WorkspaceId;
use crate::store::graph::ingest::workspace_library_uid;
use crate::store::graph::{GraphError, GraphStore};
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
    graph: &GraphStore,
    pg: &PgPool,
    changes: &AuthChanges,
    actor: &str,
    ws: &WorkspaceId,
) -> Result<WorkspaceDeleted, DeleteError> {
    // Uids only: counting a large workspace's chunks first could outlast the timeout.
    let deleted: Vec<String> = graph
        .libraries_for_workspaces(&[ws.to_string()])
        .await?
        .remove(ws.as_str())
        .unwrap_or_default();
    let mut cleared = deleted.clone();
    let own = workspace_library_uid(ws.as_str());
    if !cleared.contains(&own) {
        // Not found under the workspace: absent (a retry, or grants made before
        // the first ingest) — cleared; or held by a library that is not this
        // workspace's — its grants are its own.
        match graph.admin().find_library(&own).await? {
            None => cleared.push(own),
            Some(Some(w)) if w == ws.as_str() => cleared.push(own),
            Some(_) => {}
        }
    }
    graph.admin().delete_libraries(&deleted).await?;
    let payload = |t: &str| format!("{t}:*");
    let mut notes = Vec::new();
    if !deleted.is_empty() {
        notes.push(format!("workspace:{ws}"));
    }
    let cleanup = async {
        let mut tx = pg.begin().await?;
        let memberships_removed = grants::remove_memberships(&mut tx, &cleared).await?;
        let tokens_changed = grants::remove_from_tokens(&mut tx, &cleared).await?;
        if memberships_removed > 0 {
            notes.push(payload("library_memberships"));
        }
        if tokens_changed > 0 {
            notes.push(payload("mcp_tokens"));
        }
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
