//! `get_health`: this server's health as Pallas reads it
//! (spec/PALLAS_MCP_INTERFACE.md §2).

use std::time::Duration;

use chrono::{SecondsFormat, Utc};
use http::request::Parts;
use rmcp::{
    handler::server::tool::Extension,
    model::{CallToolResult, JsonObject},
    service::RequestContext,
    tool, tool_router, ErrorData as McpError, RoleServer,
};
use serde_json::{json, Value};

use super::args::{parse, NoArgs};
use super::{input_schema, Reply, ToolError};
use crate::api::health::Probes;
use crate::mcp::KnowledgeServer;

#[tool_router(router = get_health_router, vis = "pub(crate)")]
impl KnowledgeServer {
    #[tool(
        description = "Returns the health status of this server and its stores.",
        input_schema = input_schema::<NoArgs>(),
        annotations(read_only_hint = true, open_world_hint = false)
    )]
    async fn get_health(
        &self,
        Extension(parts): Extension<Parts>,
        ctx: RequestContext<RoleServer>,
        args: JsonObject,
    ) -> Result<CallToolResult, McpError> {
        let probes = self.probes().clone();
        Ok(self.run(&ctx, &parts, "get_health", call(probes, args)).await)
    }
}

async fn call(probes: Probes, args: JsonObject) -> Result<Reply, ToolError> {
    let NoArgs {} = parse(args)?;
    // The health report is a text block only (Pallas §2), no structured content.
    Ok(Reply::text(health(&probes).await.to_string()))
}

/// Pallas spec §2: `ok`, `degraded` (slow store) or `error` (a store down),
/// with a message when not ok. Both probes run concurrently, bounded.
pub async fn health(probes: &Probes) -> Value {
    let started = std::time::Instant::now();
    let (pg, graph) = probes.run(Duration::from_millis(700)).await;
    let elapsed = started.elapsed();
    let timestamp = Utc::now().to_rfc3339_opts(SecondsFormat::Secs, true);
    let mut down = Vec::new();
    if let Err(e) = &pg {
        down.push(format!("PostgreSQL unreachable ({e})"));
    }
    if let Err(e) = &graph {
        down.push(format!("graph store unreachable ({e})"));
    }
    if !down.is_empty() {
        json!({"status": "error", "timestamp": timestamp, "message": down.join("; ")})
    } else if elapsed > Duration::from_millis(300) {
        json!({"status": "degraded", "timestamp": timestamp,
               "message": format!("stores slow to answer ({} ms)", elapsed.as_millis())})
    } else {
        json!({"status": "ok", "timestamp": timestamp})
    }
}
