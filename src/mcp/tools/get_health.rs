//! `get_health`: this server's health as Pallas reads it
//! (spec/PALLAS_MCP_INTERFACE.md §2).

use http::request::Parts;
use rmcp::{
    handler::server::tool::Extension,
    model::{CallToolResult, JsonObject},
    service::RequestContext,
    tool, tool_router, ErrorData as McpError, RoleServer,
};

use super::args::{parse, NoArgs};
use super::tool_body;
use super::{input_schema, Reply, ToolError};
use crate::mcp::{KnowledgeServer, ToolState};
use crate::store::graph::knowledge::ScopedGraph;

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
        tool_body!(self, ctx, parts, args, get_health)
    }
}

async fn call(tools: &ToolState, graph: ScopedGraph, args: JsonObject) -> Result<Reply, ToolError> {
    let (NoArgs {}, ()) = parse(args)?;
    // The health report is a text block only (Pallas §2), no structured
    // content; what it says of the backlog is the caller's libraries' only.
    Ok(Reply::text(tools.probes().report(&graph).await.to_string()))
}
