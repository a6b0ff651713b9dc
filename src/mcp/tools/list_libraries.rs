//! `list_libraries`: the caller's libraries, in its order, with counts.

use http::request::Parts;
use rmcp::{
    handler::server::tool::{schema_for_output, Extension},
    model::{CallToolResult, JsonObject},
    service::RequestContext,
    tool, tool_router, ErrorData as McpError, RoleServer,
};
use schemars::JsonSchema;
use serde::Serialize;

use super::args::{parse, NoArgs};
use super::tool_body;
use super::{input_schema, tally, Reply, ToolError};
use crate::mcp::{KnowledgeServer, ToolState};
use crate::store::graph::knowledge::{LibraryView, ScopedGraph};
use crate::text::inline;

#[derive(Serialize, JsonSchema)]
pub struct LibrariesOut {
    pub libraries: Vec<LibraryView>,
}

#[tool_router(router = list_libraries_router, vis = "pub(crate)")]
impl KnowledgeServer {
    #[tool(
        description = "List the libraries you may read, in your order, with collection and item counts.",
        input_schema = input_schema::<NoArgs>(),
        output_schema = schema_for_output::<LibrariesOut>(),
        annotations(read_only_hint = true, open_world_hint = false)
    )]
    async fn list_libraries(
        &self,
        Extension(parts): Extension<Parts>,
        ctx: RequestContext<RoleServer>,
        args: JsonObject,
    ) -> Result<CallToolResult, McpError> {
        tool_body!(self, ctx, parts, args, list_libraries)
    }
}

async fn call(_: &ToolState, graph: ScopedGraph, args: JsonObject) -> Result<Reply, ToolError> {
    let (NoArgs {}, ()) = parse(args)?;
    let libraries = graph.list_libraries().await?;
    let mut text = format!(
        "{} librar{}",
        libraries.len(),
        if libraries.len() == 1 { "y" } else { "ies" }
    );
    for l in &libraries {
        text.push_str(&format!(
            "\n- {} ({}): {} collection(s), {} item(s){}",
            inline(&l.name),
            l.uid,
            l.collection_count,
            l.item_count,
            if l.description.is_empty() {
                String::new()
            } else {
                format!(" — {}", inline(&l.description))
            }
        ));
    }
    let reads = tally(libraries.iter().map(|l| l.uid.as_str()));
    Ok(Reply::structured(&LibrariesOut { libraries }, text)?.reading(reads))
}
