//! The one face through which a committed auth-relevant change (a team, a
//! token, a workspace's Library) is made visible on every replica.

use std::sync::Arc;

use sqlx::PgPool;

use crate::auth::cache::{AuthCaches, Unconfirmed};
use crate::store::pg;

/// Makes committed auth changes visible on every replica's next request.
#[derive(Clone)]
pub struct AuthChanges {
    pg: PgPool,
    /// A server's own caches (to fence and to drop when NOTIFY fails); the
    /// CLI has none and only notifies.
    caches: Option<Arc<AuthCaches>>,
}

impl AuthChanges {
    pub fn new(pg: PgPool, caches: Option<Arc<AuthCaches>>) -> Self {
        AuthChanges { pg, caches }
    }

    /// A workspace's Library was created or deleted: teams holding the
    /// workspace see the change on their next request, on every replica.
    /// Never fails the caller's write: when the announcement cannot be sent,
    /// this replica drops its workspace cache and the staleness bound covers
    /// the others (logged loudly).
    pub async fn announce_workspace(&self, workspace: &str) {
        match pg::notify(&self.pg, &format!("workspace:{workspace}")).await {
            // Unconfirmed replicas have stopped trusting their caches.
            Ok(()) => {
                let _ = self.fence().await;
            }
            Err(e) => {
                tracing::error!(error = %e, workspace = ?workspace, "could not announce workspace change");
                if let Some(c) = &self.caches {
                    c.workspace_libraries.invalidate_all();
                }
            }
        }
    }

    /// Waits (bounded) until every live replica has seen the changes committed
    /// so far; `Err` says how many did not confirm (they stopped trusting
    /// their caches). Without caches of its own (the CLI) there is nothing
    /// to wait with: the NOTIFY and the staleness bound are what apply.
    pub async fn fence(&self) -> Result<(), Unconfirmed> {
        match &self.caches {
            Some(c) => c.fence(&self.pg).await,
            None => Ok(()),
        }
    }
}
