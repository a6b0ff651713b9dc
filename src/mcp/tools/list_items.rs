//! `list_items`: the items of a collection or of a library, a page at a time.

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
use super::cursor::{decode_cursor, items_filter, page_cursor};
use super::tool_body;
use super::{input_schema, one_library, Reply, ToolError};
use crate::mcp::{KnowledgeServer, ToolState};
use crate::store::graph::knowledge::{ItemView, ScopedGraph};
use crate::text::inline;

/// One of `collection_uid` and `library_uid` is required: serde cannot say
/// it, so the schema says it here and `check` enforces it.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
#[schemars(
    transform = null_is_absent,
    extend("anyOf" = [{"required": ["collection_uid"]}, {"required": ["library_uid"]}])
)]
pub struct ListItemsArgs {
    /// Items of this collection
    #[schemars(length(min = UID.min, max = UID.max))]
    pub collection_uid: Option<String>,
    /// next_cursor of the previous page
    pub cursor: Option<String>,
    /// Items of this library
    #[schemars(length(min = UID.min, max = UID.max))]
    pub library_uid: Option<String>,
    #[schemars(range(min = PAGE.min, max = PAGE.max), extend("default" = PAGE.default))]
    pub limit: Option<i64>,
}

impl ToolArgs for ListItemsArgs {
    /// `limit`, defaulted.
    type Checked = i64;

    fn check(&self) -> Result<i64, ArgError> {
        opt_uid("library_uid", &self.library_uid)?;
        opt_uid("collection_uid", &self.collection_uid)?;
        if self.library_uid.is_none() && self.collection_uid.is_none() {
            return Err(ArgError::new(
                "collection_uid",
                "collection_uid or library_uid is required",
            ));
        }
        let limit = int("limit", self.limit, PAGE)?;
        opt_text("cursor", &self.cursor, CURSOR)?;
        Ok(limit)
    }
}

impl ListItemsArgs {
    /// The filter its cursors are bound to.
    pub fn filter(&self) -> String {
        items_filter(self.library_uid.as_deref(), self.collection_uid.as_deref())
    }
}

#[derive(Serialize, JsonSchema)]
pub struct ItemsOut {
    pub items: Vec<ItemView>,
    pub next_cursor: Option<String>,
}

#[tool_router(router = list_items_router, vis = "pub(crate)")]
impl KnowledgeServer {
    #[tool(
        description = "List the items of a collection or of a library, a page at a time.",
        input_schema = input_schema::<ListItemsArgs>(),
        output_schema = schema_for_output::<ItemsOut>(),
        annotations(read_only_hint = true, open_world_hint = false)
    )]
    async fn list_items(
        &self,
        Extension(parts): Extension<Parts>,
        ctx: RequestContext<RoleServer>,
        args: JsonObject,
    ) -> Result<CallToolResult, McpError> {
        tool_body!(self, ctx, parts, args, list_items)
    }
}

async fn call(_: &ToolState, graph: ScopedGraph, args: JsonObject) -> Result<Reply, ToolError> {
    let (a, limit): (ListItemsArgs, i64) = parse(args)?;
    let filter = a.filter();
    let after = decode_cursor(a.cursor.as_deref(), "items", &filter)?;
    let graph = match &a.library_uid {
        Some(uid) => one_library(&graph, uid).await?,
        None => graph,
    };
    // The library the page comes from (the items carry none of their own).
    let mut library = a.library_uid.clone();
    if let Some(c) = &a.collection_uid {
        match graph.collection_library(c).await? {
            Some(l) => library = Some(l),
            None => return Err(ToolError::not_found("collection", c)),
        }
    }
    let mut page = graph
        .list_items(a.collection_uid.as_deref(), &after, limit as usize + 1)
        .await?;
    let next_cursor = page_cursor(&mut page, limit, |i| &i.uid, "items", &filter);
    let mut text = format!("{} item(s)", page.len());
    for i in &page {
        text.push_str(&format!(
            "\n- {} ({}): {} chunk(s)",
            inline(&i.title),
            i.uid,
            i.chunk_count
        ));
    }
    if next_cursor.is_some() {
        text.push_str("\n(more: pass next_cursor as cursor)");
    }
    let reads = match (&library, page.len()) {
        (Some(l), n) if n > 0 => vec![(l.clone(), n as u64)],
        _ => Vec::new(),
    };
    Ok(Reply::structured(
        &ItemsOut {
            items: page,
            next_cursor,
        },
        text,
    )?
    .reading(reads))
}
