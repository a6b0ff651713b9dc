//! What every handler shares, built once per replica, and the one face through
//! which handlers announce auth changes to every replica.

use std::net::SocketAddr;
use std::sync::Arc;

use sqlx::PgPool;

use crate::auth::basic::{BasicContext, BasicGuard};
use crate::auth::cache::{AuthCaches, Unconfirmed};
use crate::auth::Authenticator;
use crate::config::Settings;
use crate::mcp::guard::Guard;
use crate::metrics::Metrics;
use crate::store::graph::GraphStore;
use crate::store::pg;

/// Shared by every handler (cheap to clone: handles and `Arc`s).
#[derive(Clone)]
pub struct AppState {
    pub settings: Arc<Settings>,
    pub pg: PgPool,
    pub graph: GraphStore,
    pub metrics: Metrics,
    pub auth: Arc<Authenticator>,
    /// Announcing auth changes (workspace libraries, fences) to every replica.
    pub changes: AuthChanges,
    /// The `/mcp` guard: hosts, origins, session owners, rate limits.
    pub mcp: Arc<Guard>,
    /// HTTP Basic flood protection (argon2 permits, failure throttles).
    pub basic: Arc<BasicGuard>,
}

impl AppState {
    /// Connects (lazily) to both stores; `addr` is the bound listener's
    /// address (a loopback one is accepted as Host/Origin on `/mcp`).
    pub async fn new(settings: Settings, addr: SocketAddr) -> anyhow::Result<Self> {
        let settings = Arc::new(settings);
        let pg = pg::pool(&settings.database_url, settings.store_timeout())?;
        let metrics = Metrics::new();
        let graph = GraphStore::connect(&settings).await?.with_metrics(&metrics);
        metrics
            .build_info
            .with_label_values(&[env!("CARGO_PKG_VERSION"), &settings.graph_flavor.to_string()])
            .set(1);
        let caches = Arc::new(AuthCaches::new(settings.cache_max_staleness()));
        for c in caches.collectors() {
            metrics.register(c);
        }
        let auth = Arc::new(
            Authenticator::new(
                pg.clone(),
                graph.clone(),
                caches.clone(),
                metrics.clone(),
                settings.store_timeout(),
            )
            .with_cold_lookups(settings.cold_lookups),
        );
        let basic = Arc::new(BasicGuard::new(
            std::thread::available_parallelism().map(|n| n.get()).unwrap_or(2),
            settings.basic_failures_per_minute,
        ));
        let mcp = Arc::new(Guard::new(settings.clone(), auth.clone(), metrics.clone(), addr));
        Ok(AppState {
            changes: AuthChanges { pg: pg.clone(), caches },
            settings,
            pg,
            graph,
            metrics,
            auth,
            mcp,
            basic,
        })
    }
}

impl axum::extract::FromRef<AppState> for BasicContext {
    fn from_ref(state: &AppState) -> Self {
        BasicContext {
            pg: state.pg.clone(),
            auth: state.auth.clone(),
            guard: state.basic.clone(),
            metrics: state.metrics.clone(),
        }
    }
}

/// Makes committed auth changes visible on every replica's next request.
#[derive(Clone)]
pub struct AuthChanges {
    pg: PgPool,
    caches: Arc<AuthCaches>,
}

impl AuthChanges {
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
                tracing::error!(error = %e, workspace, "could not announce workspace change");
                self.caches.workspace_libraries.invalidate_all();
            }
        }
    }

    /// Waits (bounded) until every live replica has seen the changes committed
    /// so far; `Err` says how many did not confirm (they stopped trusting
    /// their caches).
    pub async fn fence(&self) -> Result<(), Unconfirmed> {
        self.caches.fence(&self.pg).await
    }
}
