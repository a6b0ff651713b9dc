//! `/healthz`, `/readyz`, `/metrics`, and the well-known documents.

use std::time::Duration;

use axum::{extract::State, http::StatusCode, response::IntoResponse, routing::get, Json, Router};
use serde_json::json;

use crate::service::health::{self, Verdict};
use crate::state::AppState;

pub fn routes() -> Router<AppState> {
    Router::new()
        .route("/healthz", get(healthz))
        .route("/readyz", get(readyz))
        .route("/metrics", get(metrics))
        .route("/.well-known/mcp/server.json", get(server_json))
        .route("/.well-known/oauth-protected-resource", get(protected_resource))
        .route("/.well-known/oauth-protected-resource/{*rest}", get(protected_resource))
}

async fn healthz() -> impl IntoResponse {
    Json(json!({"status": "ok"}))
}

/// Ready unless the replica is shutting down (the balancer moves its
/// traffic away while it still serves) or the health verdict is `error`
/// (slow stores still serve).
async fn readyz(State(state): State<AppState>) -> axum::response::Response {
    if state.drain.is_draining() {
        return (
            StatusCode::SERVICE_UNAVAILABLE,
            Json(json!({
                "status": "draining",
                "error": "unavailable",
                "message": "not ready: this replica is shutting down",
            })),
        )
            .into_response();
    }
    let h = health::check(&state.pg, &state.knowledge).await;
    let mut failing = Vec::new();
    let mut checks = serde_json::Map::new();
    for (name, r) in [("postgres", &h.postgres), ("graph", &h.graph)] {
        match r {
            Ok(()) => {
                checks.insert(name.into(), json!({"status": "ok"}));
            }
            Err(e) => {
                failing.push(name);
                checks.insert(name.into(), json!({"status": "error", "message": e}));
            }
        }
    }
    if h.verdict() != Verdict::Error {
        (StatusCode::OK, Json(json!({"status": "ready", "checks": checks}))).into_response()
    } else {
        (
            StatusCode::SERVICE_UNAVAILABLE,
            Json(json!({
                "status": "unavailable",
                "error": "unavailable",
                "failing": failing,
                "message": format!("not ready: {} unavailable", failing.join(", ")),
                "checks": checks,
            })),
        )
            .into_response()
    }
}

async fn metrics(State(state): State<AppState>) -> impl IntoResponse {
    // Gauges read at scrape time.
    let m = &state.metrics;
    m.sessions_active.set(state.mcp.sessions.open() as i64);
    let size = i64::from(state.pg.size());
    let idle = state.pg.num_idle() as i64;
    m.pg_pool_connections.with_label_values(&["idle"]).set(idle);
    m.pg_pool_connections.with_label_values(&["in_use"]).set(size - idle);
    m.pg_pool_connections
        .with_label_values(&["max"])
        .set(i64::from(state.pg.options().get_max_connections()));
    state.auth.caches.observe();
    let started = std::time::Instant::now();
    if let Ok(Ok(conn)) = tokio::time::timeout(Duration::from_millis(500), state.pg.acquire()).await {
        m.pg_acquire_seconds.set(started.elapsed().as_secs_f64());
        drop(conn);
    }
    let h = health::check(&state.pg, &state.knowledge).await;
    m.store_up
        .with_label_values(&["postgres"])
        .set(i64::from(h.postgres.is_ok()));
    m.store_up.with_label_values(&["graph"]).set(i64::from(h.graph.is_ok()));
    crate::metrics::handler(State(state.metrics.clone())).await
}

/// This server's registry entry, shaped like the Pallas registry
/// (spec/PALLAS_MCP_INTERFACE.md §1).
async fn server_json(State(state): State<AppState>) -> impl IntoResponse {
    let base = state.settings.public_url.trim_end_matches('/');
    Json(json!({
        "servers": [{
            "server": {
                "$schema": "https://static.modelcontextprotocol.io/schemas/2025-12-11/server.schema.json",
                "name": "ca.helu.ouranos/mnemosyne",
                "title": "Mnemosyne",
                "description": "Authenticated knowledge server: full-text search over the Libraries a bearer may read",
                "version": env!("CARGO_PKG_VERSION"),
                "remotes": [{"type": "streamable-http", "url": format!("{base}/mcp/")}]
            },
            "_meta": {"io.modelcontextprotocol.registry/official": {"status": "active", "isLatest": true}}
        }]
    }))
}

/// RFC 9728 metadata naming the authorization server (the embedded one by
/// default); 404 when none is configured.
async fn protected_resource(State(state): State<AppState>) -> impl IntoResponse {
    match state.settings.resource_authorization_server() {
        Some(issuer) => {
            let base = state.settings.public_url.trim_end_matches('/');
            let mut doc = json!({
                "resource": format!("{base}/mcp"),
                "authorization_servers": [issuer],
                "bearer_methods_supported": ["header"],
                "resource_name": "Mnemosyne",
            });
            if state.settings.oauth_issuer().is_some() {
                doc["scopes_supported"] = json!(crate::service::oauth::SCOPES);
            }
            (StatusCode::OK, Json(doc)).into_response()
        }
        None => crate::error::ApiError::NotFound("no authorization server is configured".into()).into_response(),
    }
}
