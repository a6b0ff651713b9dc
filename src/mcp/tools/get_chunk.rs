//! `get_chunk`: one chunk by uid, with neighbouring chunks of its item.

use http::request::Parts;
use rmcp::{
    handler::server::tool::{schema_for_output, Extension},
    model::{CallToolResult, JsonObject},
    service::RequestContext,
    tool, tool_router, ErrorData as McpError, RoleServer,
};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::args::{int, null_is_absent, parse, uid, ArgError, Range, ToolArgs, UID};
use super::tool_body;
use super::{input_schema, tally, Reply, ToolError};
use crate::mcp::{KnowledgeServer, ToolState};
use crate::store::graph::knowledge::{ChunkView, Citation, ScopedGraph};
use crate::text::inline;

const CONTEXT: Range = Range {
    min: 0,
    max: 5,
    default: 0,
};

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
#[schemars(transform = null_is_absent)]
pub struct GetChunkArgs {
    /// The chunk to read
    #[schemars(length(min = UID.min, max = UID.max))]
    pub chunk_uid: String,
    /// Neighbouring chunks to include on each side
    #[schemars(range(min = CONTEXT.min, max = CONTEXT.max), extend("default" = CONTEXT.default))]
    pub context: Option<i64>,
}

impl ToolArgs for GetChunkArgs {
    /// `context`, defaulted.
    type Checked = i64;

    fn check(&self) -> Result<i64, ArgError> {
        uid("chunk_uid", &self.chunk_uid)?;
        int("context", self.context, CONTEXT)
    }
}

#[derive(Serialize, JsonSchema)]
pub struct ChunkOut {
    pub chunk: ChunkView,
    pub neighbors: Vec<ChunkView>,
    /// What to cite: the library's name and the item's source.
    pub source: Citation,
}

#[tool_router(router = get_chunk_router, vis = "pub(crate)")]
impl KnowledgeServer {
    #[tool(
        description = "Read one chunk by uid, optionally with up to 5 neighbouring chunks of the same item on each side, with what to cite (library name, the item's source_uri, mime_type and updated_at).",
        input_schema = input_schema::<GetChunkArgs>(),
        output_schema = schema_for_output::<ChunkOut>(),
        annotations(read_only_hint = true, open_world_hint = false)
    )]
    async fn get_chunk(
        &self,
        Extension(parts): Extension<Parts>,
        ctx: RequestContext<RoleServer>,
        args: JsonObject,
    ) -> Result<CallToolResult, McpError> {
        tool_body!(self, ctx, parts, args, get_chunk)
    }
}

async fn call(_: &ToolState, graph: ScopedGraph, args: JsonObject) -> Result<Reply, ToolError> {
    let (a, context): (GetChunkArgs, i64) = parse(args)?;
    let Some((chunk, neighbors)) = graph.get_chunk(&a.chunk_uid, context).await? else {
        return Err(ToolError::not_found("chunk", &a.chunk_uid));
    };
    let source = graph.citation(&chunk.item_uid, &chunk.library_uid).await?;
    let text = format!(
        "{} — chunk {} #{} (item {}; collection {}; library {} \"{}\"{}{})\n\n{}{}",
        inline(&chunk.item_title),
        chunk.uid,
        chunk.ordinal,
        chunk.item_uid,
        chunk.collection_uid,
        chunk.library_uid,
        inline(&source.library_name),
        source
            .source_uri
            .as_deref()
            .map(|u| format!("; source {}", inline(u)))
            .unwrap_or_default(),
        source
            .updated_at
            .as_deref()
            .map(|u| format!("; updated {}", inline(u)))
            .unwrap_or_default(),
        chunk.text,
        if neighbors.is_empty() {
            String::new()
        } else {
            format!("\n\n(+{} neighbouring chunk(s))", neighbors.len())
        }
    );
    let reads =
        tally(std::iter::once(chunk.library_uid.as_str()).chain(neighbors.iter().map(|n| n.library_uid.as_str())));
    Ok(Reply::structured(
        &ChunkOut {
            chunk,
            neighbors,
            source,
        },
        text,
    )?
    .reading(reads))
}
