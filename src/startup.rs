//! `Application`: builds the stores, the auth layer and the router, binds its own
//! listener (port 0 in tests) and serves until SIGTERM / Ctrl-C.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::{extract::DefaultBodyLimit, middleware, Router};
use tokio::net::TcpListener;

use crate::config::Settings;
use crate::state::AppState;

pub struct Application {
    listener: TcpListener,
    router: Router,
    state: AppState,
}

impl Application {
    /// Connects (lazily) to both stores and binds the listener. Does not migrate.
    pub async fn build(settings: Settings) -> anyhow::Result<Self> {
        let listener = TcpListener::bind(settings.listen).await?;
        let state = AppState::new(settings, listener.local_addr()?).await?;
        check_migrations(&state.pg).await?;
        let router = router(state.clone());
        Ok(Application {
            listener,
            router,
            state,
        })
    }

    pub fn local_addr(&self) -> SocketAddr {
        self.listener.local_addr().expect("bound listener has an address")
    }

    pub fn port(&self) -> u16 {
        self.local_addr().port()
    }

    pub fn state(&self) -> &AppState {
        &self.state
    }

    /// Serves until `shutdown` resolves, then drains in-flight requests. The
    /// background tasks run beside it and are stopped together when it
    /// returns; the counts they keep in memory are flushed last.
    pub async fn run_until(
        self,
        shutdown: impl std::future::Future<Output = ()> + Send + 'static,
    ) -> anyhow::Result<()> {
        let mut background = background_tasks(&self.state);
        tracing::info!(addr = %self.local_addr(), "mnemosyne listening");
        let res = serve(self.listener, self.router, &self.state, shutdown).await;
        background.abort_all();
        self.state.auth.flush_token_usage().await;
        self.state.metrics.usage.flush(&self.state.pg).await;
        self.state.metrics.activity.flush(&self.state.pg).await;
        res
    }

    /// Serves until SIGTERM or Ctrl-C.
    pub async fn run(self) -> anyhow::Result<()> {
        self.run_until(shutdown_signal()).await
    }
}

/// The replica's background work, in one set so it stops as one: the auth
/// channel and heartbeat, the auth and console housekeeping, the usage
/// flush, forgetting deleted libraries, audit retention, the search index's
/// change sweep, shrinking the rate
/// buckets, and (with a model) the embedding worker.
fn background_tasks(state: &AppState) -> tokio::task::JoinSet<()> {
    let mut tasks = tokio::task::JoinSet::new();
    tasks.spawn(crate::auth::cache::listen(
        state.pg.clone(),
        state.pg_session.clone(),
        state.auth.caches.clone(),
    ));
    tasks.spawn(crate::auth::cache::heartbeat(
        state.pg.clone(),
        state.auth.caches.clone(),
    ));
    tasks.spawn(state.auth.clone().housekeeping(Duration::from_secs(15)));
    // MCP sessions shared by the replicas: copies of sessions ended elsewhere
    // close, and expired rows are forgotten.
    tasks.spawn(state.mcp.sessions.clone().follow(state.auth.caches.subscribe()));
    tasks.spawn(state.mcp.sessions.clone().sweep_every(Duration::from_secs(60)));
    tasks.spawn(crate::admin::housekeeping(state.clone()));
    tasks.spawn(crate::usage::flush_every(
        state.pg.clone(),
        state.metrics.usage.clone(),
        Duration::from_secs(state.settings.usage_flush_secs),
    ));
    tasks.spawn(crate::activity::flush_every(
        state.pg.clone(),
        state.metrics.activity.clone(),
        Duration::from_secs(state.settings.usage_flush_secs),
    ));
    tasks.spawn(crate::store::graph::admin::forget_changed_libraries(
        state.admin.clone(),
        state.auth.caches.subscribe(),
    ));
    tasks.spawn(crate::service::audit::retention_loop(
        state.pg.clone(),
        state.settings.audit_retention_days,
        state.settings.usage_retention_days,
        Duration::from_secs(3600),
    ));
    // OAuth requests nobody answered, and codes long past use (issue 48).
    let pg = state.pg.clone();
    tasks.spawn(async move {
        let mut tick = tokio::time::interval(Duration::from_secs(300));
        loop {
            tick.tick().await;
            if let Err(e) = crate::store::pg::oauth::sweep(&pg).await {
                tracing::debug!(error = %e, "oauth sweep");
            }
        }
    });
    let (limits, basic, guard) = (state.mcp.limits.clone(), state.basic.clone(), state.mcp.clone());
    tasks.spawn(crate::store::graph::indexing::sweep_loop(
        state.pg.clone(),
        Duration::from_secs(3600),
    ));
    tasks.spawn(crate::store::graph::indexing::intent_sweep_loop(
        state.pg.clone(),
        Duration::from_secs(5),
    ));
    tasks.spawn(async move {
        let mut tick = tokio::time::interval(Duration::from_secs(60));
        loop {
            tick.tick().await;
            limits.shrink();
            basic.shrink();
            guard.lookups.shrink();
        }
    });
    if let Some(s) = state.search.semantic() {
        // The leader's lock is session-level: its connection goes where the
        // LISTEN connection goes (one of its own, past any pooler).
        let lock = match &state.pg_session {
            Some(o) => sqlx::postgres::PgPoolOptions::new()
                .max_connections(1)
                .acquire_timeout(state.settings.store_timeout())
                .connect_lazy_with(o.clone()),
            None => state.pg.clone(),
        };
        tasks.spawn(crate::service::embedding::run(
            state.admin.clone(),
            state.pg.clone(),
            lock,
            s.clone(),
            crate::service::embedding::WorkerConfig {
                // A remote provider's batches are its requests, that many
                // in flight; the in-process model embeds one batch at a time.
                batch: match state.settings.embed_url {
                    Some(_) => state.settings.embed_request_batch,
                    None => state.settings.embed_batch,
                },
                lanes: match state.settings.embed_url {
                    Some(_) => state.settings.embed_in_flight,
                    None => 1,
                },
                prefix: state.settings.embed_scope_prefix.clone(),
            },
        ));
    }
    tasks
}

/// Refuses to serve a reachable database that lacks migrations this binary
/// needs: requests would fail on missing tables, and the auth heartbeat
/// (`auth_replicas`) could never register, which silently turns every auth
/// cache off. A database that cannot be reached in time is not refused
/// (`serve` starts while Postgres is down; `/readyz` says why).
async fn check_migrations(pool: &sqlx::PgPool) -> anyhow::Result<()> {
    let applied = tokio::time::timeout(
        Duration::from_secs(2),
        sqlx::query_scalar::<_, i64>("SELECT version FROM _sqlx_migrations WHERE success").fetch_all(pool),
    )
    .await;
    let applied: Vec<i64> = match applied {
        Ok(Ok(v)) => v,
        // No migrations table: nothing was ever applied.
        Ok(Err(e)) if e.as_database_error().and_then(|d| d.code()).as_deref() == Some("42P01") => Vec::new(),
        Ok(Err(e)) => {
            tracing::warn!(error = %e, "could not check the database's migrations; serving anyway");
            return Ok(());
        }
        Err(_) => {
            tracing::warn!("could not check the database's migrations in time; serving anyway");
            return Ok(());
        }
    };
    let missing: Vec<String> = crate::store::pg::MIGRATOR
        .iter()
        .filter(|m| !m.migration_type.is_down_migration() && !applied.contains(&m.version))
        .map(|m| format!("{} {}", m.version, m.description))
        .collect();
    if let Some(first) = missing.first() {
        anyhow::bail!(
            "the database is not migrated: {} migration(s) this binary needs are missing (first: {first}); \
             run `mnemosyne migrate` first (serving without them would fail requests and keep the auth caches off)",
            missing.len()
        );
    }
    Ok(())
}

/// The accept loop: at most `max_connections` connections at once (further
/// ones are closed straight away), a header-read timeout on every request
/// (it also bounds how long an idle keep-alive connection waits), TCP_NODELAY,
/// the peer and the client's address (`proxies`) for the handlers, and a
/// graceful drain on shutdown (`drain`): not ready but serving for the
/// shutdown delay, then no new connections, the requests in flight answered
/// within the grace, and only then the event streams ended.
async fn serve(
    listener: TcpListener,
    router: Router,
    state: &AppState,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> anyhow::Result<()> {
    let settings = &state.settings;
    use hyper_util::rt::{TokioIo, TokioTimer};
    use tower::ServiceExt;

    let connections = Arc::new(tokio::sync::Semaphore::new(settings.max_connections.max(1)));
    let trusted: Arc<[crate::proxies::Cidr]> = settings.trusted_proxies.0.clone().into();
    let forwarded_header = settings.forwarded_header;
    let mut http = hyper::server::conn::http1::Builder::new();
    http.timer(TokioTimer::new())
        .header_read_timeout(Duration::from_secs(settings.header_timeout_secs.max(1)))
        .keep_alive(true);
    let graceful = hyper_util::server::graceful::GracefulShutdown::new();
    let mut shutdown = std::pin::pin!(shutdown);
    // Armed by the shutdown signal: the end of the not-ready delay.
    let delay = Duration::from_secs(settings.shutdown_delay_secs);
    let stop = tokio::time::sleep(Duration::from_secs(86_400));
    let mut stop = std::pin::pin!(stop);
    let mut signalled = false;
    loop {
        let (stream, peer) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(a) => a,
                Err(e) => {
                    // EMFILE and friends: back off instead of spinning.
                    tracing::warn!(error = %e, "accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
            _ = &mut shutdown, if !signalled => {
                signalled = true;
                state.drain.start();
                tracing::info!(secs = delay.as_secs(), "shutdown signal received; not ready, still serving");
                stop.as_mut().reset(tokio::time::Instant::now() + delay);
                continue;
            }
            _ = &mut stop, if signalled => break,
        };
        let Ok(permit) = connections.clone().try_acquire_owned() else {
            tracing::debug!(%peer, "connection refused: at MNEMOSYNE_MAX_CONNECTIONS");
            drop(stream);
            continue;
        };
        // TCP_NODELAY: MCP answers on a session are SSE streams written in
        // several small frames; with Nagle's algorithm and delayed ACKs each
        // call waited ~40 ms (measured: session p50 44 ms vs 0.9 ms).
        if let Err(e) = stream.set_nodelay(true) {
            tracing::debug!(error = %e, "could not set TCP_NODELAY");
        }
        let router = router.clone();
        let trusted = trusted.clone();
        let service = hyper::service::service_fn(move |mut req: http::Request<hyper::body::Incoming>| {
            let client = crate::proxies::client_ip(peer.ip(), req.headers(), &trusted, forwarded_header);
            req.extensions_mut().insert(axum::extract::ConnectInfo(peer));
            req.extensions_mut().insert(crate::proxies::ClientAddress(client));
            router.clone().oneshot(req.map(axum::body::Body::new))
        });
        let conn = graceful.watch(http.serve_connection(TokioIo::new(stream), service));
        tokio::spawn(async move {
            let _ = conn.await;
            drop(permit);
        });
    }
    // Stop accepting (new connections are refused, not left in the backlog).
    drop(listener);
    state.drain.start();
    let grace = Duration::from_secs(settings.shutdown_grace_secs);
    let deadline = tokio::time::Instant::now() + grace;
    tracing::info!(in_flight = state.drain.in_flight(), "listener closed; draining");
    if !state.drain.settled(grace).await {
        tracing::warn!(
            in_flight = state.drain.in_flight(),
            secs = grace.as_secs(),
            "requests still in flight after the shutdown grace; closing"
        );
    }
    // The answers are out: end the event streams and session workers (the
    // sessions themselves stay, for the other replicas), then the connections.
    state.mcp.sessions.drain();
    state.mcp.streams.cancel();
    let left = deadline.saturating_duration_since(tokio::time::Instant::now());
    if tokio::time::timeout(left.max(Duration::from_secs(1)), graceful.shutdown())
        .await
        .is_err()
    {
        tracing::warn!("connections still open after the shutdown grace; closing");
    }
    Ok(())
}

async fn shutdown_signal() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! { _ = ctrl_c => {}, _ = term => {} }
}

/// Every route, declared once without a trailing slash: a path that ends in
/// `/` (Daedalus writes `/mcp_server/api/teams/`, clients `/mcp/`) is served
/// by the same route, before routing.
pub fn router(state: AppState) -> Router {
    let routes = routes(state);
    Router::new().fallback_service(tower_http::normalize_path::NormalizePath::trim_trailing_slash(routes))
}

fn routes(state: AppState) -> Router {
    let body_limit = state.settings.body_limit_bytes;
    let metrics = state.metrics.clone();
    let rest = crate::api::teams::routes()
        .merge(crate::api::library::routes())
        .merge(crate::admin::routes())
        .merge(crate::api::oauth::routes())
        .route_layer(middleware::from_fn_with_state(state.clone(), request_deadline))
        .merge(
            crate::api::library::ingest_routes()
                .route_layer(middleware::from_fn_with_state(state.clone(), ingest_deadline)),
        )
        .layer(middleware::map_response(never_cached));
    Router::new()
        .merge(crate::api::health::routes())
        .merge(rest)
        .merge(crate::mcp::routes(tool_state(&state), state.mcp.clone()))
        .fallback(crate::error::not_found)
        .layer(DefaultBodyLimit::max(body_limit))
        .route_layer(middleware::from_fn_with_state(metrics.clone(), crate::metrics::track))
        .layer(middleware::from_fn(crate::telemetry::request_id))
        .layer(middleware::from_fn_with_state(state.drain.clone(), crate::drain::track))
        .with_state(state)
}

/// What the MCP tools get: the knowledge handle, the probes, the metrics and
/// the call deadline (never the admin handle).
fn tool_state(state: &AppState) -> crate::mcp::ToolState {
    crate::mcp::ToolState::new(
        state.knowledge.clone(),
        crate::service::health::Probes::new(
            &state.pg,
            &state.knowledge,
            state.search.semantic(),
            state.search.reranker(),
        ),
        state.search.clone(),
        state.metrics.clone(),
        std::time::Duration::from_millis(state.settings.tool_deadline_ms),
    )
}

/// The REST APIs and the console hand out JWTs, tokens and key secrets:
/// none of their answers may be stored by a cache (a response that sets its
/// own policy, the console's stylesheet, keeps it).
async fn never_cached(mut resp: axum::response::Response) -> axum::response::Response {
    resp.headers_mut()
        .entry(http::header::CACHE_CONTROL)
        .or_insert(http::HeaderValue::from_static("no-store"));
    resp
}

/// The whole-request timeout of the (non-streaming) REST APIs: past it the
/// caller gets a JSON 503 with `Retry-After`, and the work is dropped.
async fn request_deadline(
    axum::extract::State(state): axum::extract::State<AppState>,
    req: axum::extract::Request,
    next: middleware::Next,
) -> axum::response::Response {
    within_deadline(
        &state,
        req,
        next,
        crate::error::ApiError::StoreUnavailable("request deadline"),
    )
    .await
}

/// The ingest route's whole-request timeout: an ingest cut off here may
/// still commit (whole), as after a store timeout, so it gets that 503,
/// which says sending it again is safe.
async fn ingest_deadline(
    axum::extract::State(state): axum::extract::State<AppState>,
    req: axum::extract::Request,
    next: middleware::Next,
) -> axum::response::Response {
    within_deadline(&state, req, next, crate::error::ApiError::IngestUnavailable).await
}

/// Runs the request within `MNEMOSYNE_REQUEST_TIMEOUT_SECS`, else answers
/// `timed_out`.
async fn within_deadline(
    state: &AppState,
    req: axum::extract::Request,
    next: middleware::Next,
    timed_out: crate::error::ApiError,
) -> axum::response::Response {
    use axum::response::IntoResponse;
    let limit = Duration::from_secs(state.settings.request_timeout_secs.max(1));
    match tokio::time::timeout(limit, next.run(req)).await {
        Ok(resp) => resp,
        Err(_) => {
            tracing::warn!(secs = limit.as_secs(), "request timed out");
            timed_out.into_response()
        }
    }
}
