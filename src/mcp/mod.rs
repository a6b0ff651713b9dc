//! MCP over Streamable HTTP at `/mcp` (and `/mcp/`, DESIGN §5): rmcp serves the
//! session-based revisions and the stateless 2026-07-28 on one endpoint; the
//! auth layer in front resolves every request's bearer.

pub mod guard;
pub mod server;
pub mod sessions;
pub mod tools;

use std::sync::Arc;

use axum::{middleware, Router};
use rmcp::transport::streamable_http_server::{StreamableHttpServerConfig, StreamableHttpService};

pub use guard::Guard;
pub use server::{KnowledgeServer, ToolState};

/// The tools this server has (metric labels and rate-limit buckets use only
/// these names; anything else is `other`).
pub const TOOLS: [&str; 6] = [
    "search",
    "get_chunk",
    "list_libraries",
    "list_collections",
    "list_items",
    "get_health",
];

/// `/mcp`: the tools behind the guard. It gets the tools' narrow state and the
/// guard, never the application state (which holds the admin handle).
pub fn routes<S: Clone + Send + Sync + 'static>(tools: ToolState, guard: Arc<Guard>) -> Router<S> {
    // Host and Origin are checked by our layer first (so a foreign Origin is 403
    // before any auth work); rmcp checks them again.
    let config = StreamableHttpServerConfig::default()
        .with_allowed_hosts(guard.allowed_hosts.iter().cloned())
        .with_allowed_origins(guard.allowed_origins.iter().cloned())
        .enforce_origin_validation()
        // Stateless (2026-07-28) answers as plain JSON unless a tool streams
        // progress first: less framing per request than SSE.
        .with_json_response(true)
        .with_max_request_body_bytes(guard.settings.body_limit_bytes);
    let router = Arc::new(KnowledgeServer::router());
    let service = StreamableHttpService::new(
        move || Ok(KnowledgeServer::new(tools.clone(), router.clone())),
        guard.sessions.clone(),
        config,
    );
    Router::new()
        .route_service("/mcp", service)
        .layer(middleware::from_fn_with_state(guard, guard::guard))
}
