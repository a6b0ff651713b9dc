//! The six tools, one file each. Every tool parses its arguments into a
//! struct whose derived schema is the one `tools/list` publishes (`args`),
//! reads only through the caller's `ScopedGraph`, and returns
//! `Result<Reply, ToolError>`; `into_result` is the one place either becomes
//! a `CallToolResult`.

pub mod args;
pub mod cursor;
pub mod get_chunk;
pub mod get_health;
pub mod list_collections;
pub mod list_items;
pub mod list_libraries;
pub mod search;

use std::sync::Arc;
use std::time::Duration;

use rmcp::model::{CallToolResult, ContentBlock, JsonObject};
use serde::Serialize;
use serde_json::Value;

pub use args::{parse, ArgError, ToolArgs};

/// The one body of every tool method (rmcp's `#[tool]` needs a method per
/// tool): the caller's view of the graph, then the tool file's
/// `call(&ToolState, ScopedGraph, args)` run by `KnowledgeServer::run`
/// (progress, deadline, metrics, log line) under the method's own name.
macro_rules! tool_body {
    ($server:expr, $ctx:expr, $parts:expr, $args:expr, $tool:ident) => {{
        let graph = $server.graph_of(&$parts);
        Ok($server
            .run(&$ctx, &$parts, stringify!($tool), call($server.tools(), graph, $args))
            .await)
    }};
}
pub(crate) use tool_body;

use crate::store::graph::knowledge::ScopedGraph;
use crate::store::graph::GraphError;

/// Why a tool call answers `isError`; the display is the message the caller
/// reads.
#[derive(Debug, thiserror::Error)]
pub enum ToolError {
    /// A bad argument (SEP-1303: the message names it).
    #[error(transparent)]
    Argument(#[from] ArgError),
    /// Absent, or outside the caller's scope: the two are indistinguishable.
    #[error("{what} not found: {uid}")]
    NotFound { what: &'static str, uid: String },
    /// A store failure: a clear message, no internals (the cause is logged).
    #[error("The knowledge store is unavailable right now; try again shortly.")]
    Store(#[from] GraphError),
    /// The answer could not be written as JSON (not expected to happen).
    #[error("The knowledge store is unavailable right now; try again shortly.")]
    Output(#[from] serde_json::Error),
    /// The whole call passed its deadline: never a partial answer.
    #[error(
        "The call did not finish within its {} ms deadline and was stopped; nothing partial is returned. \
         Try again, or narrow it (fewer libraries, a shorter query).",
        .0.as_millis()
    )]
    TimedOut(Duration),
    /// The caller closed its connection: the work stopped, nobody reads
    /// this answer.
    #[error("The call was stopped: its caller closed the connection.")]
    CallerGone,
}

impl ToolError {
    pub fn not_found(what: &'static str, uid: &str) -> Self {
        ToolError::NotFound {
            what,
            uid: uid.to_owned(),
        }
    }
}

/// A tool's answer: a readable text block and, except for `get_health`,
/// the same as `structuredContent`; and what it read, for the per-library
/// activity (`crate::activity`).
pub struct Reply {
    structured: Option<Value>,
    text: String,
    /// Each library the answer carried content from, with how many results
    /// (chunks, collections, items, entries) came from it, in first-seen order.
    reads: Vec<(String, u64)>,
    /// The search text (kept only as the operator chose, `QueryMode`).
    query: Option<String>,
}

impl Reply {
    pub fn structured<T: Serialize>(out: &T, text: String) -> Result<Self, ToolError> {
        Ok(Reply {
            structured: Some(serde_json::to_value(out)?),
            text,
            reads: Vec::new(),
            query: None,
        })
    }

    /// `structured`, from the structured content already made (the caller
    /// answers for it matching the tool's published output schema).
    pub fn structured_value(structured: Value, text: String) -> Self {
        Reply {
            structured: Some(structured),
            text,
            reads: Vec::new(),
            query: None,
        }
    }

    /// A plain text answer (no structured content).
    pub fn text(text: String) -> Self {
        Reply {
            structured: None,
            text,
            reads: Vec::new(),
            query: None,
        }
    }

    /// Says what the answer read (see [`tally`]).
    pub fn reading(mut self, reads: Vec<(String, u64)>) -> Self {
        self.reads = reads;
        self
    }

    /// Says what the search looked for.
    pub fn for_query(mut self, query: &str) -> Self {
        self.query = Some(query.to_owned());
        self
    }

    /// What the answer read (see `reading`) and the query (see `for_query`).
    pub fn reads(&self) -> (&[(String, u64)], Option<&str>) {
        (&self.reads, self.query.as_deref())
    }
}

/// How many results came from each library (one uid per result), in
/// first-seen order: what a `Reply` says it read.
pub fn tally<'a>(libraries: impl IntoIterator<Item = &'a str>) -> Vec<(String, u64)> {
    let mut out: Vec<(String, u64)> = Vec::new();
    for l in libraries {
        match out.iter_mut().find(|(u, _)| u == l) {
            Some((_, n)) => *n += 1,
            None => out.push((l.to_owned(), 1)),
        }
    }
    out
}

/// The one place a tool's result becomes what the client reads.
pub fn into_result(out: Result<Reply, ToolError>) -> CallToolResult {
    match out {
        Ok(Reply { structured, text, .. }) => {
            let mut r = CallToolResult::success(vec![ContentBlock::text(text)]);
            r.structured_content = structured;
            r
        }
        Err(e) => {
            match &e {
                ToolError::Store(cause) => tracing::warn!(error = ?cause.to_string(), "tool store error"),
                ToolError::Output(cause) => tracing::warn!(error = %cause, "tool output error"),
                _ => {}
            }
            CallToolResult::error(vec![ContentBlock::text(e.to_string())])
        }
    }
}

/// The published input schema of `T`: derived, without its top-level title
/// and without `$schema` (MCP's default dialect is the same JSON Schema
/// 2020-12; the schemas have always been published without it).
pub fn input_schema<T: ToolArgs>() -> Arc<JsonObject> {
    let mut schema = rmcp::handler::server::common::schema_for_input::<T>()
        .unwrap_or_else(|e| panic!("input schema of {}: {e}", std::any::type_name::<T>()));
    Arc::make_mut(&mut schema).remove("$schema");
    schema
}

/// The view narrowed to one library, or "not found" when it is outside the
/// scope or does not exist (indistinguishable).
async fn one_library(graph: &ScopedGraph, uid: &str) -> Result<ScopedGraph, ToolError> {
    graph
        .library(uid)
        .await?
        .ok_or_else(|| ToolError::not_found("library", uid))
}
