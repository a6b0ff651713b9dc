//! What every handler shares, built once per replica, and the one face through
//! which handlers announce auth changes to every replica.

use std::net::SocketAddr;
use std::sync::Arc;

use sqlx::PgPool;

use crate::auth::basic::{BasicContext, BasicGuard};
use crate::auth::cache::AuthCaches;
use crate::auth::changes::AuthChanges;
use crate::auth::Authenticator;
use crate::config::Settings;
use crate::mcp::guard::Guard;
use crate::metrics::Metrics;
use crate::search::engine::Engine;
use crate::search::index::replica::SearchIndex;
use crate::store::graph::ingest::AdminGraph;
use crate::store::graph::knowledge::KnowledgeGraph;
use crate::store::graph::GraphStore;
use crate::store::pg;

/// Shared by every handler (cheap to clone: handles and `Arc`s). It holds
/// the graph's handles, never the connection they were made from:
///
/// ```compile_fail
/// fn unscoped(s: &mnemosyne::state::AppState) {
///     let _ = &s.graph;
/// }
/// ```
#[derive(Clone)]
pub struct AppState {
    pub settings: Arc<Settings>,
    pub pg: PgPool,
    /// Where the connections that need a session of their own go
    /// (`MNEMOSYNE_DATABASE_LISTEN_URL`); None: where `pg` goes.
    pub pg_session: Option<sqlx::postgres::PgConnectOptions>,
    /// Scoped knowledge reads (what the MCP tools get).
    pub knowledge: KnowledgeGraph,
    /// Search's front door: the embedding model and this replica's indexes.
    pub search: Engine,
    /// Ingest, workspace lifecycle and operator reads: unscoped, for the
    /// Basic-authenticated APIs, the console and the embedding worker.
    pub admin: AdminGraph,
    pub metrics: Metrics,
    pub auth: Arc<Authenticator>,
    /// Announcing auth changes (workspace libraries, fences) to every replica.
    pub changes: AuthChanges,
    /// The `/mcp` guard: hosts, origins, session owners, rate limits.
    pub mcp: Arc<Guard>,
    /// HTTP Basic flood protection (argon2 permits, failure throttles).
    pub basic: Arc<BasicGuard>,
    /// The admin console's rate limits (per signed-in user, per sign-in address).
    pub console: Arc<crate::limits::console::ConsoleLimits>,
    /// The key the console's session cookies are signed with
    /// (`server_secrets`), read at the first console request that needs it.
    pub cookie_key: Arc<tokio::sync::OnceCell<Vec<u8>>>,
    /// Shutdown: whether the replica is draining, and its requests in flight.
    pub drain: Arc<crate::drain::Drain>,
    /// Dynamic OAuth client registrations per client address (issue 48).
    pub oauth_registrations: Arc<crate::limits::RateLimits>,
    /// Client ID Metadata Documents fetched (and refused), with their fetch
    /// rate per client address (issue 48).
    pub oauth_documents: Arc<crate::service::oauth::cimd::Documents>,
}

impl AppState {
    /// Connects (lazily) to both stores; `addr` is the bound listener's
    /// address (a loopback one is accepted as Host/Origin on `/mcp`).
    pub async fn new(settings: Settings, addr: SocketAddr) -> anyhow::Result<Self> {
        let settings = Arc::new(settings);
        let pg = pg::pool(&settings.database_url, settings.store_timeout())?;
        let pg_session = settings
            .database_listen_url
            .as_deref()
            .map(pg::session_options)
            .transpose()
            .map_err(|e| anyhow::anyhow!("MNEMOSYNE_DATABASE_LISTEN_URL: {e}"))?;
        let mut metrics = Metrics::for_tools(&crate::mcp::TOOLS);
        metrics.activity = Arc::new(crate::activity::ActivityCounter::new(
            settings.library_activity,
            settings.activity_query,
        ));
        let caches = Arc::new(AuthCaches::new(settings.cache_max_staleness()));
        for c in caches.collectors() {
            metrics.register(c);
        }
        // A write is acknowledged once every replica that searches from the
        // index sequences it heard has heard the write's (or stopped
        // trusting them): concurrent writers share one fence.
        let fence = crate::auth::cache::SharedFence::new(caches.clone(), pg.clone());
        let mut graph = GraphStore::connect(&settings)
            .await?
            .with_metrics(&metrics)
            .with_change_log(pg.clone())
            .with_change_fence(Arc::new(move || {
                let fence = fence.clone();
                Box::pin(async move { fence.wait().await })
            }));
        // The indexes hold this model's vectors (none without one).
        let mut model = String::new();
        let mut dim = crate::embed::DIM;
        let mut semantic = None;
        match embedding_provider(&settings, &metrics).await? {
            Some(provider) => {
                let embedder = Arc::new(crate::embed::Embedder::new(provider, crate::embed::Status::new(&metrics)));
                tracing::info!(
                    model = embedder.id(),
                    "semantic search on: hybrid, keyword and semantic modes"
                );
                model = embedder.id().to_owned();
                dim = embedder.dim();
                // The embedding worker yields to ingest: every item write says so.
                let writes = embedder.status().clone();
                graph = graph.on_item_write(Arc::new(move || writes.note_ingest()));
                semantic = Some(embedder);
            }
            None if settings.cross_model.is_some() => tracing::warn!(
                "semantic search off: no embedding model (MNEMOSYNE_EMBED_MODEL unset; MNEMOSYNE_CROSS_MODEL only pairs with one); search is keyword-only"
            ),
            None => tracing::warn!(
                "semantic search off: no embedding model (MNEMOSYNE_EMBED_MODEL and MNEMOSYNE_EMBED_URL unset); search is keyword-only"
            ),
        }
        let mut index = None;
        match &settings.index_dir {
            Some(dir) => {
                let opened = SearchIndex::open(
                    dir,
                    pg.clone(),
                    settings.index_open_libraries,
                    &model,
                    dim,
                    settings.vector_cache_chunks,
                )?
                .with_known(caches.index.clone(), {
                    let caches = caches.clone();
                    Arc::new(move || caches.usable())
                })
                .lock()?;
                for c in opened.collectors() {
                    metrics.register(c);
                }
                index = Some(Arc::new(opened));
            }
            None => tracing::warn!("no search index (MNEMOSYNE_INDEX_DIR unset): every search reads the graph"),
        }
        metrics
            .build_info
            .with_label_values(&[env!("CARGO_PKG_VERSION"), &settings.graph_flavor.to_string()])
            .set(1);
        let graph = graph.into_handles();
        let reranker = reranker(&settings, &metrics)?;
        match (&reranker, &semantic) {
            (Some(r), Some(_)) => tracing::info!(
                candidates = r.candidates(),
                "reranker on: hybrid and semantic search reorder their best candidates by its score"
            ),
            (Some(_), None) => {
                tracing::warn!(
                    "MNEMOSYNE_RERANK_URL is set but semantic search is off: keyword search is never reranked"
                )
            }
            (None, _) => {}
        }
        let search = Engine::new(semantic, index.map(|ix| (ix, graph.index_source.clone()))).with_reranker(reranker);
        let auth = Arc::new(
            Authenticator::new(
                pg.clone(),
                graph.workspaces,
                caches.clone(),
                metrics.clone(),
                settings.store_timeout(),
            )
            .with_cold_lookups(settings.cold_lookups),
        );
        let basic = Arc::new(
            BasicGuard::new(
                std::thread::available_parallelism().map(|n| n.get()).unwrap_or(2),
                settings.basic_failures_per_minute,
            )
            .with_replicas(caches.live_replicas()),
        );
        let mcp = Arc::new(Guard::new(
            settings.clone(),
            auth.clone(),
            metrics.clone(),
            addr,
            pg.clone(),
        ));
        let console = Arc::new(crate::limits::console::ConsoleLimits::new(
            settings.admin_rate_limit_per_minute,
            settings.admin_sign_in_per_minute,
            caches.live_replicas(),
        ));
        let oauth_registrations = Arc::new(crate::limits::RateLimits::shared(
            settings.oauth_registrations_per_minute,
            0,
            caches.live_replicas(),
        ));
        let metadata_roots = match &settings.oauth_metadata_ca_file {
            Some(path) => crate::config::ca_roots("MNEMOSYNE_OAUTH_METADATA_CA_FILE", path)?,
            None => Vec::new(),
        };
        let oauth_documents = Arc::new(crate::service::oauth::cimd::Documents::new(
            settings.oauth_metadata_fetches_per_minute,
            caches.live_replicas(),
            metadata_roots,
        ));
        Ok(AppState {
            oauth_registrations,
            oauth_documents,
            changes: AuthChanges::new(pg.clone(), Some(caches)),
            settings,
            pg,
            pg_session,
            knowledge: graph.knowledge,
            search,
            admin: graph.admin,
            metrics,
            auth,
            mcp,
            basic,
            console,
            cookie_key: Arc::new(tokio::sync::OnceCell::new()),
            drain: crate::drain::Drain::new(),
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

/// The embedding provider the settings name: the in-process models
/// (MNEMOSYNE_EMBED_MODEL, paired with MNEMOSYNE_CROSS_MODEL), a remote
/// endpoint (MNEMOSYNE_EMBED_URL), or none.
async fn embedding_provider(
    settings: &Settings,
    metrics: &Metrics,
) -> anyhow::Result<Option<Arc<dyn crate::embed::Provider>>> {
    match (&settings.embed_model, &settings.embed_url) {
        (Some(_), Some(_)) => anyhow::bail!("MNEMOSYNE_EMBED_MODEL and MNEMOSYNE_EMBED_URL are both set: choose one"),
        (Some(dir), None) => {
            let provider = crate::embed::in_process(dir, settings.cross_model.as_deref()).map_err(|e| {
                let cross = settings
                    .cross_model
                    .as_ref()
                    .map_or(String::new(), |c| format!(" (MNEMOSYNE_CROSS_MODEL={})", c.display()));
                anyhow::anyhow!("MNEMOSYNE_EMBED_MODEL={}{cross}: {e:#}", dir.display())
            })?;
            Ok(Some(provider))
        }
        (None, Some(url)) => {
            anyhow::ensure!(
                settings.cross_model.is_none(),
                "MNEMOSYNE_CROSS_MODEL pairs only with an in-process model (MNEMOSYNE_EMBED_MODEL), not MNEMOSYNE_EMBED_URL"
            );
            let model = settings.embed_url_model.clone().ok_or_else(|| {
                anyhow::anyhow!("MNEMOSYNE_EMBED_URL needs MNEMOSYNE_EMBED_URL_MODEL (the model name)")
            })?;
            let api_key =
                crate::config::key_file("MNEMOSYNE_EMBED_API_KEY_FILE", settings.embed_api_key_file.as_deref())?;
            let roots = match &settings.embed_ca_file {
                Some(path) => crate::config::ca_roots("MNEMOSYNE_EMBED_CA_FILE", path)?,
                None => Vec::new(),
            };
            let config = crate::embed::remote::RemoteConfig {
                roots,
                base_url: url.clone(),
                model,
                api_key,
                roles: settings.embed_roles,
                batch: settings.embed_request_batch,
                in_flight: settings.embed_in_flight,
                timeout: std::time::Duration::from_millis(settings.embed_timeout_ms),
                query_timeout: std::time::Duration::from_millis(settings.embed_query_timeout_ms),
                kind: settings.embed_calibration,
                dimensions: settings.embed_dimensions,
            };
            let remote = crate::embed::remote::Remote::connect(config, metrics)
                .await
                .map_err(|e| anyhow::anyhow!("MNEMOSYNE_EMBED_URL={}: {e:#}", crate::config::redact_url(url)))?;
            Ok(Some(Arc::new(remote)))
        }
        (None, None) => Ok(None),
    }
}

/// The reranker the settings name (MNEMOSYNE_RERANK_URL), or none.
fn reranker(settings: &Settings, metrics: &Metrics) -> anyhow::Result<Option<Arc<crate::embed::rerank::Reranker>>> {
    let Some(url) = &settings.rerank_url else {
        return Ok(None);
    };
    let api_key = crate::config::key_file("MNEMOSYNE_RERANK_API_KEY_FILE", settings.rerank_api_key_file.as_deref())?;
    let roots = match &settings.rerank_ca_file {
        Some(path) => crate::config::ca_roots("MNEMOSYNE_RERANK_CA_FILE", path)?,
        None => Vec::new(),
    };
    let config = crate::embed::rerank::RerankConfig {
        base_url: url.clone(),
        model: settings.rerank_model.clone(),
        api_key,
        roots,
        api: settings.rerank_api,
        candidates: usize::from(settings.rerank_candidates),
        timeout: std::time::Duration::from_millis(settings.rerank_timeout_ms),
    };
    let reranker = crate::embed::rerank::Reranker::new(config, metrics)
        .map_err(|e| anyhow::anyhow!("MNEMOSYNE_RERANK_URL={}: {e:#}", crate::config::redact_url(url)))?;
    Ok(Some(Arc::new(reranker)))
}
