//! `list_collections`: collections (optionally of one library), a page at a time.

use http::request::Parts;
use rmcp::{
    handler::server::tool::{schema_for_output, Extension},
    model::{CallToolResult, JsonObject},
    service::RequestContext,
    tool, tool_router, ErrorData as McpError, RoleServer,
};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::args::{int, null_is_absent, opt_text, opt_uid, parse, ArgError, ToolArgs, CURSOR, PAGE, UID};
use super::cursor::{decode_cursor, page_cursor};
use super::tool_body;
use super::{input_schema, one_library, tally, Reply, ToolError};
use crate::mcp::{KnowledgeServer, ToolState};
use crate::store::graph::knowledge::{CollectionView, ScopedGraph};
use crate::text::inline;

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
#[schemars(transform = null_is_absent)]
pub struct ListCollectionsArgs {
    /// next_cursor of the previous page
    pub cursor: Option<String>,
    #[schemars(range(min = PAGE.min, max = PAGE.max), extend("default" = PAGE.default))]
    pub limit: Option<i64>,
    /// Only this library's collections
    #[schemars(length(min = UID.min, max = UID.max))]
    pub library_uid: Option<String>,
}

impl ToolArgs for ListCollectionsArgs {
    /// `limit`, defaulted.
    type Checked = i64;

    fn check(&self) -> Result<i64, ArgError> {
        opt_uid("library_uid", &self.library_uid)?;
        let limit = int("limit", self.limit, PAGE)?;
        opt_text("cursor", &self.cursor, CURSOR)?;
        Ok(limit)
    }
}

impl ListCollectionsArgs {
    /// The filter its cursors are bound to.
    pub fn filter(&self) -> &str {
        self.library_uid.as_deref().unwrap_or("")
    }
}

#[derive(Serialize, JsonSchema)]
pub struct CollectionsOut {
    pub collections: Vec<CollectionView>,
    pub next_cursor: Option<String>,
}

#[tool_router(router = list_collections_router, vis = "pub(crate)")]
impl KnowledgeServer {
    #[tool(
        description = "List collections (optionally of one library), a page at a time.",
        input_schema = input_schema::<ListCollectionsArgs>(),
        output_schema = schema_for_output::<CollectionsOut>(),
        annotations(read_only_hint = true, open_world_hint = false)
    )]
    async fn list_collections(
        &self,
        Extension(parts): Extension<Parts>,
        ctx: RequestContext<RoleServer>,
        args: JsonObject,
    ) -> Result<CallToolResult, McpError> {
        tool_body!(self, ctx, parts, args, list_collections)
    }
}

async fn call(_: &ToolState, graph: ScopedGraph, args: JsonObject) -> Result<Reply, ToolError> {
    let (a, limit): (ListCollectionsArgs, i64) = parse(args)?;
    let after = decode_cursor(a.cursor.as_deref(), "collections", a.filter())?;
    let graph = match &a.library_uid {
        Some(uid) => one_library(&graph, uid).await?,
        None => graph,
    };
    let mut page = graph.list_collections(&after, limit as usize + 1).await?;
    let next_cursor = page_cursor(&mut page, limit, |c| &c.uid, "collections", a.filter());
    let mut text = format!("{} collection(s)", page.len());
    for c in &page {
        text.push_str(&format!(
            "\n- {} ({}) in library {}: {} item(s)",
            inline(&c.name),
            c.uid,
            c.library_uid,
            c.item_count
        ));
    }
    if next_cursor.is_some() {
        text.push_str("\n(more: pass next_cursor as cursor)");
    }
    let reads = tally(page.iter().map(|c| c.library_uid.as_str()));
    Ok(Reply::structured(
        &CollectionsOut {
            collections: page,
            next_cursor,
        },
        text,
    )?
    .reading(reads))
}
