//! MCP over Streamable HTTP at `/mcp` (and `/mcp/`, DESIGN §5): rmcp serves the
//! session-based revisions and the stateless 2026-07-28 on one endpoint; the
//! auth layer in front resolves every request's bearer.

pub mod calls;
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
    let mut config = StreamableHttpServerConfig::default()
        .with_allowed_hosts(guard.allowed_hosts.iter().cloned())
        .with_allowed_origins(guard.allowed_origins.iter().cloned())
        .enforce_origin_validation()
        // Stateless (2026-07-28) answers as plain JSON unless a tool streams
        // progress first: less framing per request than SSE.
        .with_json_response(true)
        .with_max_request_body_bytes(guard.settings.body_limit_bytes)
        .with_cancellation_token(guard.streams.clone());
    // Sessions live in Postgres: any replica rebuilds one it does not hold.
    config.session_store = Some(guard.sessions.store());
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

#[cfg(test)]
mod tests {
    use super::*;

    /// A tool's name is written in three places (its file and `#[tool]` fn,
    /// `TOOLS` — metric labels and rate-limit buckets — and its one
    /// `tools::tool_body!`, which counts the call under that same identifier):
    /// they must agree, and the router must serve exactly `TOOLS`.
    #[test]
    fn each_tool_has_one_name_for_its_file_fn_router_entry_and_metric_label() {
        let mut served: Vec<String> = KnowledgeServer::router()
            .list_all()
            .into_iter()
            .map(|t| t.name.to_string())
            .collect();
        served.sort();
        let mut names = TOOLS.to_vec();
        names.sort();
        assert_eq!(served, names, "the router's tools are TOOLS");
        for name in TOOLS {
            let path = format!("{}/src/mcp/tools/{name}.rs", env!("CARGO_MANIFEST_DIR"));
            let src = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}"));
            assert!(
                src.contains(&format!("async fn {name}(")),
                "{path}: its #[tool] fn is {name}"
            );
            assert!(!src.contains("self.run("), "{path}: the call runs through tool_body!");
            let bodies: Vec<&str> = src.match_indices("tool_body!(").map(|(i, _)| &src[i..]).collect();
            assert_eq!(bodies.len(), 1, "{path}: one counted call");
            assert!(
                bodies[0].starts_with(&format!("tool_body!(self, ctx, parts, args, {name})")),
                "{path}: counted under the label {name}"
            );
        }
    }
}
