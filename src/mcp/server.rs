//! The six tools. Each validates its own arguments (a bad one is an `isError`
//! result naming it), reads only inside the caller's scope, and answers with
//! `structuredContent` plus a readable text block.

use std::sync::Arc;
use std::time::Duration;

use chrono::{SecondsFormat, Utc};
use http::request::Parts;
use rmcp::{
    handler::server::{router::tool::ToolRouter, tool::schema_for_output, tool::Extension},
    model::{
        CallToolResult, ContentBlock, Implementation, JsonObject, ProgressNotificationParam, ServerCapabilities,
        ServerConfig,
    },
    service::RequestContext,
    tool, tool_handler, tool_router, ErrorData as McpError, RoleServer, ServerHandler,
};
use schemars::JsonSchema;
use serde::Serialize;
use serde_json::{json, Value};
use tracing::Instrument;

use super::args::{decode_cursor, encode_cursor, items_filter, ArgError, Args};
use crate::api::health::Probes;
use crate::auth::Principal;
use crate::metrics::Metrics;
use crate::state::AppState;
use crate::store::graph::knowledge::{
    ChunkView, CollectionView, ItemView, KnowledgeGraph, LibraryView, ScopedGraph, SearchHit,
};
use crate::store::graph::GraphError;

#[derive(Serialize, JsonSchema)]
pub struct SearchOut {
    pub results: Vec<SearchHit>,
}

#[derive(Serialize, JsonSchema)]
pub struct ChunkOut {
    pub chunk: ChunkView,
    pub neighbors: Vec<ChunkView>,
}

#[derive(Serialize, JsonSchema)]
pub struct LibrariesOut {
    pub libraries: Vec<LibraryView>,
}

#[derive(Serialize, JsonSchema)]
pub struct CollectionsOut {
    pub collections: Vec<CollectionView>,
    pub next_cursor: Option<String>,
}

#[derive(Serialize, JsonSchema)]
pub struct ItemsOut {
    pub items: Vec<ItemView>,
    pub next_cursor: Option<String>,
}

const UID: &str = r#"{"type": "string", "minLength": 1, "maxLength": 64}"#;

fn schema(v: Value) -> Arc<JsonObject> {
    Arc::new(v.as_object().cloned().unwrap_or_default())
}

fn uid_schema(description: &str) -> Value {
    let mut v: Value = serde_json::from_str(UID).unwrap_or_default();
    v["description"] = json!(description);
    v
}

fn search_schema() -> Arc<JsonObject> {
    schema(json!({
        "type": "object",
        "properties": {
            "query": {"type": "string", "minLength": 1, "maxLength": 1000,
                      "description": "Plain text to look for (no query syntax: * and ? are ordinary characters)"},
            "limit": {"type": "integer", "minimum": 1, "maximum": 50, "default": 10},
            "library_uids": {"type": "array", "items": uid_schema("Library uid"), "maxItems": 1000,
                             "description": "Only these libraries (narrows the caller's libraries, never widens)"},
            "collection_uid": uid_schema("Only this collection"),
        },
        "required": ["query"],
        "additionalProperties": false
    }))
}

fn get_chunk_schema() -> Arc<JsonObject> {
    schema(json!({
        "type": "object",
        "properties": {
            "chunk_uid": uid_schema("The chunk to read"),
            "context": {"type": "integer", "minimum": 0, "maximum": 5, "default": 0,
                        "description": "Neighbouring chunks to include on each side"},
        },
        "required": ["chunk_uid"],
        "additionalProperties": false
    }))
}

fn empty_schema() -> Arc<JsonObject> {
    schema(json!({"type": "object", "properties": {}, "additionalProperties": false}))
}

fn page_props() -> Value {
    json!({
        "cursor": {"type": "string", "description": "next_cursor of the previous page"},
        "limit": {"type": "integer", "minimum": 1, "maximum": 200, "default": 50},
    })
}

fn list_collections_schema() -> Arc<JsonObject> {
    let mut props = page_props();
    props["library_uid"] = uid_schema("Only this library's collections");
    schema(json!({"type": "object", "properties": props, "additionalProperties": false}))
}

fn list_items_schema() -> Arc<JsonObject> {
    let mut props = page_props();
    props["library_uid"] = uid_schema("Items of this library");
    props["collection_uid"] = uid_schema("Items of this collection");
    schema(json!({
        "type": "object",
        "properties": props,
        "anyOf": [{"required": ["collection_uid"]}, {"required": ["library_uid"]}],
        "additionalProperties": false
    }))
}

/// A tool's answer before it becomes a `CallToolResult`.
enum Outcome {
    Ok {
        structured: Value,
        text: String,
    },
    /// A plain text answer (no structured content).
    Text(String),
    /// A caller error (bad argument, not found): `isError` with this message.
    Refused(String),
    /// A store failure: `isError` with a clear message, no internals.
    Failed,
    /// The whole call passed its deadline: `isError`, never a partial answer.
    TimedOut(Duration),
}

impl From<ArgError> for Outcome {
    fn from(e: ArgError) -> Self {
        Outcome::Refused(e.to_string())
    }
}

impl From<GraphError> for Outcome {
    fn from(e: GraphError) -> Self {
        tracing::warn!(error = %e, "tool store error");
        Outcome::Failed
    }
}

fn ok<T: Serialize>(out: &T, text: String) -> Outcome {
    match serde_json::to_value(out) {
        Ok(structured) => Outcome::Ok { structured, text },
        Err(_) => Outcome::Failed,
    }
}

fn not_found(what: &str, uid: &str) -> Outcome {
    Outcome::Refused(format!("{what} not found: {uid}"))
}

impl Outcome {
    fn into_result(self) -> CallToolResult {
        match self {
            Outcome::Ok { structured, text } => {
                let mut r = CallToolResult::success(vec![ContentBlock::text(text)]);
                r.structured_content = Some(structured);
                r
            }
            Outcome::Text(text) => CallToolResult::success(vec![ContentBlock::text(text)]),
            Outcome::Refused(msg) => CallToolResult::error(vec![ContentBlock::text(msg)]),
            Outcome::Failed => CallToolResult::error(vec![ContentBlock::text(
                "The knowledge store is unavailable right now; try again shortly.",
            )]),
            Outcome::TimedOut(d) => CallToolResult::error(vec![ContentBlock::text(format!(
                "The call did not finish within its {} ms deadline and was stopped; nothing partial is returned. \
                 Try again, or narrow it (fewer libraries, a shorter query).",
                d.as_millis()
            ))]),
        }
    }

    fn failed(&self) -> bool {
        !matches!(self, Outcome::Ok { .. } | Outcome::Text(_))
    }
}

/// Pages are fetched with one extra row: if it came, drop it and hand out a
/// cursor after the page's last uid.
fn page_cursor<T>(
    page: &mut Vec<T>,
    limit: i64,
    uid: impl Fn(&T) -> &str,
    listing: &str,
    filter: &str,
) -> Option<String> {
    if page.len() as i64 <= limit {
        return None;
    }
    page.truncate(limit as usize);
    page.last().map(|last| encode_cursor(listing, filter, uid(last)))
}

fn snippet(text: &str, n: usize) -> String {
    let mut out = String::with_capacity(n.min(text.len()) + 4);
    for (count, word) in text.split_whitespace().enumerate() {
        if count > 0 {
            out.push(' ');
        }
        out.push_str(word);
        if out.len() >= n {
            let cut = out.char_indices().nth(n).map(|(i, _)| i).unwrap_or(out.len());
            out.truncate(cut);
            out.push('…');
            break;
        }
    }
    out
}

/// What the tools reach: scoped views of the graph, the store probes, the
/// call deadline and the metrics — never the admin handle.
#[derive(Clone)]
pub struct ToolState {
    knowledge: KnowledgeGraph,
    probes: Probes,
    metrics: Metrics,
    deadline: Duration,
}

impl ToolState {
    pub fn new(state: &AppState) -> Self {
        ToolState {
            knowledge: state.graph.knowledge(),
            probes: Probes::new(state),
            metrics: state.metrics.clone(),
            deadline: Duration::from_millis(state.settings.tool_deadline_ms),
        }
    }

    /// The caller's view of the graph, from the principal the auth layer put
    /// on the request. No principal (cannot happen behind the layer) reads
    /// nothing: fail closed.
    fn graph_of(&self, parts: &Parts) -> ScopedGraph {
        match parts.extensions.get::<Principal>() {
            Some(p) => self.knowledge.scoped(p),
            None => self.knowledge.nothing(),
        }
    }
}

#[derive(Clone)]
pub struct KnowledgeServer {
    state: ToolState,
    /// Shared: rmcp builds a server per session and per stateless request.
    tool_router: Arc<ToolRouter<KnowledgeServer>>,
}

#[tool_router]
impl KnowledgeServer {
    pub fn new(state: ToolState, tool_router: Arc<ToolRouter<KnowledgeServer>>) -> Self {
        KnowledgeServer { state, tool_router }
    }

    /// Built once and cloned into each session's server.
    pub fn router() -> ToolRouter<KnowledgeServer> {
        Self::tool_router()
    }

    /// Sends `mnemosyne/<tool>: <phase>` when the client asked for progress.
    async fn progress(ctx: &RequestContext<RoleServer>, tool: &str, phase: &str) {
        if let Some(token) = ctx.meta.get_progress_token() {
            let mut p = ProgressNotificationParam::new(token, if phase == "started" { 0.0 } else { 1.0 })
                .with_message(format!("mnemosyne/{tool}: {phase}"));
            if phase != "started" {
                p = p.with_total(1.0);
            }
            let _ = ctx.peer.notify_progress(p).await;
        }
    }

    /// Runs one tool call: progress notifications, one deadline for the whole
    /// call, its metrics and its log line (tool, principal kind, library count,
    /// outcome, duration — never arguments or tokens).
    async fn run(
        &self,
        ctx: &RequestContext<RoleServer>,
        parts: &Parts,
        tool: &str,
        work: impl std::future::Future<Output = Outcome>,
    ) -> CallToolResult {
        let started = std::time::Instant::now();
        let span = tracing::info_span!("mcp.tool", tool, outcome = tracing::field::Empty);
        Self::progress(ctx, tool, "started").await;
        // One deadline for the whole call, however many store queries it makes.
        let deadline = self.state.deadline;
        let out = tokio::time::timeout(deadline, work)
            .instrument(span.clone())
            .await
            .unwrap_or(Outcome::TimedOut(deadline));
        Self::progress(ctx, tool, if out.failed() { "failed" } else { "completed" }).await;
        let outcome = if out.failed() { "tool_error" } else { "ok" };
        span.record("outcome", outcome);
        let elapsed = started.elapsed();
        let m = &self.state.metrics;
        m.tool_calls.with_label_values(&[tool, outcome]).inc();
        m.tool_duration
            .with_label_values(&[tool])
            .observe(elapsed.as_secs_f64());
        let principal = parts.extensions.get::<Principal>();
        let request_id = parts.extensions.get::<crate::telemetry::RequestId>();
        tracing::info!(
            request_id = request_id.map_or("-", |r| &*r.0),
            tool,
            principal = principal.map_or("none", |p| p.kind.as_str()),
            libraries = principal.map_or(0, |p| p.libraries.len()),
            outcome,
            duration_ms = elapsed.as_secs_f64() * 1000.0,
            "tool call"
        );
        out.into_result()
    }

    #[tool(
        description = "Full-text search over the chunks of the libraries you may read. Returns the best-matching chunks with their library, collection and item uids.",
        input_schema = search_schema(),
        output_schema = schema_for_output::<SearchOut>(),
        annotations(read_only_hint = true, open_world_hint = false)
    )]
    async fn search(
        &self,
        Extension(parts): Extension<Parts>,
        ctx: RequestContext<RoleServer>,
        args: JsonObject,
    ) -> Result<CallToolResult, McpError> {
        Ok(self
            .run(
                &ctx,
                &parts,
                "search",
                self.do_search(self.state.graph_of(&parts), &args),
            )
            .await)
    }

    #[tool(
        description = "Read one chunk by uid, optionally with up to 5 neighbouring chunks of the same item on each side.",
        input_schema = get_chunk_schema(),
        output_schema = schema_for_output::<ChunkOut>(),
        annotations(read_only_hint = true, open_world_hint = false)
    )]
    async fn get_chunk(
        &self,
        Extension(parts): Extension<Parts>,
        ctx: RequestContext<RoleServer>,
        args: JsonObject,
    ) -> Result<CallToolResult, McpError> {
        Ok(self
            .run(
                &ctx,
                &parts,
                "get_chunk",
                self.do_get_chunk(self.state.graph_of(&parts), &args),
            )
            .await)
    }

    #[tool(
        description = "List the libraries you may read, in your order, with collection and item counts.",
        input_schema = empty_schema(),
        output_schema = schema_for_output::<LibrariesOut>(),
        annotations(read_only_hint = true, open_world_hint = false)
    )]
    async fn list_libraries(
        &self,
        Extension(parts): Extension<Parts>,
        ctx: RequestContext<RoleServer>,
        args: JsonObject,
    ) -> Result<CallToolResult, McpError> {
        Ok(self
            .run(
                &ctx,
                &parts,
                "list_libraries",
                self.do_list_libraries(self.state.graph_of(&parts), &args),
            )
            .await)
    }

    #[tool(
        description = "List collections (optionally of one library), a page at a time.",
        input_schema = list_collections_schema(),
        output_schema = schema_for_output::<CollectionsOut>(),
        annotations(read_only_hint = true, open_world_hint = false)
    )]
    async fn list_collections(
        &self,
        Extension(parts): Extension<Parts>,
        ctx: RequestContext<RoleServer>,
        args: JsonObject,
    ) -> Result<CallToolResult, McpError> {
        Ok(self
            .run(
                &ctx,
                &parts,
                "list_collections",
                self.do_list_collections(self.state.graph_of(&parts), &args),
            )
            .await)
    }

    #[tool(
        description = "List the items of a collection or of a library, a page at a time.",
        input_schema = list_items_schema(),
        output_schema = schema_for_output::<ItemsOut>(),
        annotations(read_only_hint = true, open_world_hint = false)
    )]
    async fn list_items(
        &self,
        Extension(parts): Extension<Parts>,
        ctx: RequestContext<RoleServer>,
        args: JsonObject,
    ) -> Result<CallToolResult, McpError> {
        Ok(self
            .run(
                &ctx,
                &parts,
                "list_items",
                self.do_list_items(self.state.graph_of(&parts), &args),
            )
            .await)
    }

    #[tool(
        description = "Returns the health status of this server and its stores.",
        input_schema = empty_schema(),
        annotations(read_only_hint = true, open_world_hint = false)
    )]
    async fn get_health(
        &self,
        Extension(parts): Extension<Parts>,
        ctx: RequestContext<RoleServer>,
        args: JsonObject,
    ) -> Result<CallToolResult, McpError> {
        Ok(self.run(&ctx, &parts, "get_health", self.do_get_health(&args)).await)
    }
}

impl KnowledgeServer {
    async fn do_get_health(&self, args: &JsonObject) -> Outcome {
        if let Err(e) = Args(args).only(&[]) {
            return e.into();
        }
        // The health report is a text block only (Pallas §2), no structured content.
        Outcome::Text(self.health().await.to_string())
    }

    async fn do_search(&self, graph: ScopedGraph, args: &JsonObject) -> Outcome {
        let a = Args(args);
        let parsed = (|| {
            a.only(&["query", "limit", "library_uids", "collection_uid"])?;
            let q = a.required_string("query", 1, 1000)?;
            let limit = a.int("limit", 1, 50, 10)?;
            let libs = a.string_list("library_uids", 1000)?;
            let col = a.string("collection_uid", 1, 64)?;
            Ok::<_, ArgError>((q, limit, libs, col))
        })();
        let (q, limit, libs, col) = match parsed {
            Ok(p) => p,
            Err(e) => return e.into(),
        };
        let graph = match &libs {
            Some(only) => graph.narrow(only),
            None => graph,
        };
        let hits = match graph.search(&q, limit as usize, col.as_deref()).await {
            Ok(h) => h,
            Err(e) => return e.into(),
        };
        let mut text = format!("{} result(s) for \"{}\"", hits.len(), q);
        for (i, h) in hits.iter().enumerate() {
            text.push_str(&format!(
                "\n\n{}. {} (score {:.3}; chunk {} #{}; item {}; collection {}; library {})\n{}",
                i + 1,
                h.item_title,
                h.score,
                h.chunk_uid,
                h.ordinal,
                h.item_uid,
                h.collection_uid,
                h.library_uid,
                snippet(&h.text, 400)
            ));
        }
        ok(&SearchOut { results: hits }, text)
    }

    async fn do_get_chunk(&self, graph: ScopedGraph, args: &JsonObject) -> Outcome {
        let a = Args(args);
        let parsed = (|| {
            a.only(&["chunk_uid", "context"])?;
            Ok::<_, ArgError>((a.required_string("chunk_uid", 1, 64)?, a.int("context", 0, 5, 0)?))
        })();
        let (uid, context) = match parsed {
            Ok(p) => p,
            Err(e) => return e.into(),
        };
        match graph.get_chunk(&uid, context).await {
            Ok(Some((chunk, neighbors))) => {
                let text = format!(
                    "{} — chunk {} #{} (item {}; collection {}; library {})\n\n{}{}",
                    chunk.item_title,
                    chunk.uid,
                    chunk.ordinal,
                    chunk.item_uid,
                    chunk.collection_uid,
                    chunk.library_uid,
                    chunk.text,
                    if neighbors.is_empty() {
                        String::new()
                    } else {
                        format!("\n\n(+{} neighbouring chunk(s))", neighbors.len())
                    }
                );
                ok(&ChunkOut { chunk, neighbors }, text)
            }
            Ok(None) => not_found("chunk", &uid),
            Err(e) => e.into(),
        }
    }

    async fn do_list_libraries(&self, graph: ScopedGraph, args: &JsonObject) -> Outcome {
        if let Err(e) = Args(args).only(&[]) {
            return e.into();
        }
        match graph.list_libraries().await {
            Ok(libraries) => {
                let mut text = format!(
                    "{} librar{}",
                    libraries.len(),
                    if libraries.len() == 1 { "y" } else { "ies" }
                );
                for l in &libraries {
                    text.push_str(&format!(
                        "\n- {} ({}): {} collection(s), {} item(s){}",
                        l.name,
                        l.uid,
                        l.collection_count,
                        l.item_count,
                        if l.description.is_empty() {
                            String::new()
                        } else {
                            format!(" — {}", l.description)
                        }
                    ));
                }
                ok(&LibrariesOut { libraries }, text)
            }
            Err(e) => e.into(),
        }
    }

    /// The view narrowed to one library, or "not found" when it is outside
    /// the scope or does not exist (indistinguishable).
    async fn one_library(graph: &ScopedGraph, uid: &str) -> Result<ScopedGraph, Outcome> {
        match graph.library(uid).await {
            Ok(Some(g)) => Ok(g),
            Ok(None) => Err(not_found("library", uid)),
            Err(e) => Err(e.into()),
        }
    }

    async fn do_list_collections(&self, graph: ScopedGraph, args: &JsonObject) -> Outcome {
        let a = Args(args);
        let parsed = (|| {
            a.only(&["library_uid", "cursor", "limit"])?;
            let lib = a.string("library_uid", 1, 64)?;
            let limit = a.int("limit", 1, 200, 50)?;
            let cursor = a.string("cursor", 1, 1000)?;
            let after = decode_cursor(cursor.as_deref(), "collections", lib.as_deref().unwrap_or(""))?;
            Ok::<_, ArgError>((lib, limit, after))
        })();
        let (lib, limit, after) = match parsed {
            Ok(p) => p,
            Err(e) => return e.into(),
        };
        let graph = match &lib {
            Some(uid) => match Self::one_library(&graph, uid).await {
                Ok(g) => g,
                Err(o) => return o,
            },
            None => graph,
        };
        let mut page = match graph.list_collections(&after, limit as usize + 1).await {
            Ok(p) => p,
            Err(e) => return e.into(),
        };
        let next_cursor = page_cursor(
            &mut page,
            limit,
            |c| &c.uid,
            "collections",
            lib.as_deref().unwrap_or(""),
        );
        let mut text = format!("{} collection(s)", page.len());
        for c in &page {
            text.push_str(&format!(
                "\n- {} ({}) in library {}: {} item(s)",
                c.name, c.uid, c.library_uid, c.item_count
            ));
        }
        if next_cursor.is_some() {
            text.push_str("\n(more: pass next_cursor as cursor)");
        }
        ok(
            &CollectionsOut {
                collections: page,
                next_cursor,
            },
            text,
        )
    }

    async fn do_list_items(&self, graph: ScopedGraph, args: &JsonObject) -> Outcome {
        let a = Args(args);
        let parsed = (|| {
            a.only(&["library_uid", "collection_uid", "cursor", "limit"])?;
            let lib = a.string("library_uid", 1, 64)?;
            let col = a.string("collection_uid", 1, 64)?;
            if lib.is_none() && col.is_none() {
                return Err(ArgError::new(
                    "collection_uid",
                    "collection_uid or library_uid is required",
                ));
            }
            let limit = a.int("limit", 1, 200, 50)?;
            let cursor = a.string("cursor", 1, 1000)?;
            let filter = items_filter(lib.as_deref(), col.as_deref());
            let after = decode_cursor(cursor.as_deref(), "items", &filter)?;
            Ok::<_, ArgError>((lib, col, limit, after, filter))
        })();
        let (lib, col, limit, after, filter) = match parsed {
            Ok(p) => p,
            Err(e) => return e.into(),
        };
        let graph = match &lib {
            Some(uid) => match Self::one_library(&graph, uid).await {
                Ok(g) => g,
                Err(o) => return o,
            },
            None => graph,
        };
        if let Some(c) = &col {
            match graph.has_collection(c).await {
                Ok(true) => {}
                Ok(false) => return not_found("collection", c),
                Err(e) => return e.into(),
            }
        }
        let mut page = match graph.list_items(col.as_deref(), &after, limit as usize + 1).await {
            Ok(p) => p,
            Err(e) => return e.into(),
        };
        let next_cursor = page_cursor(&mut page, limit, |i| &i.uid, "items", &filter);
        let mut text = format!("{} item(s)", page.len());
        for i in &page {
            text.push_str(&format!("\n- {} ({}): {} chunk(s)", i.title, i.uid, i.chunk_count));
        }
        if next_cursor.is_some() {
            text.push_str("\n(more: pass next_cursor as cursor)");
        }
        ok(
            &ItemsOut {
                items: page,
                next_cursor,
            },
            text,
        )
    }

    /// Pallas spec §2: `ok`, `degraded` (slow store) or `error` (a store down),
    /// with a message when not ok. Both probes run concurrently, bounded.
    pub async fn health(&self) -> Value {
        let started = std::time::Instant::now();
        let (pg, graph) = self.state.probes.run(Duration::from_millis(700)).await;
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
}

#[tool_handler(router = self.tool_router)]
impl ServerHandler for KnowledgeServer {
    fn get_info(&self) -> ServerConfig {
        ServerConfig::new(ServerCapabilities::builder().enable_tools().build())
            .with_server_info(
                Implementation::new("mnemosyne", env!("CARGO_PKG_VERSION")).with_title("Mnemosyne knowledge server"),
            )
            .with_instructions(
                "Search and read the knowledge libraries your credential grants. Use `search` to find chunks, \
                 `get_chunk` to read one with its neighbours, and the list tools to browse.",
            )
    }
}

#[cfg(test)]
mod tests {
    use serde_json::{Map, Value};

    use super::KnowledgeServer;

    /// What `tools/list` publishes, per tool: `{name: {inputSchema, outputSchema}}`.
    fn published() -> Value {
        let mut out = Map::new();
        for t in KnowledgeServer::router().list_all() {
            out.insert(
                t.name.to_string(),
                serde_json::json!({
                    "inputSchema": Value::Object((*t.input_schema).clone()),
                    "outputSchema": t.output_schema.map(|s| Value::Object((*s).clone())),
                }),
            );
        }
        Value::Object(out)
    }

    /// Deliberately ignored differences between the hand-written schemas of
    /// the fixture and derived ones: the `$schema` dialect marker, `title`s
    /// (type names) and `format` hints (`int64`): none changes what a client
    /// may send or will receive.
    fn normalised(v: &Value) -> Value {
        match v {
            Value::Object(m) => Value::Object(
                m.iter()
                    .filter(|(k, _)| !matches!(k.as_str(), "$schema" | "title" | "format"))
                    .map(|(k, v)| (k.clone(), normalised(v)))
                    .collect(),
            ),
            Value::Array(a) => Value::Array(a.iter().map(normalised).collect()),
            other => other.clone(),
        }
    }

    /// The schemas as published before the tool arguments were derived
    /// (tests/fixtures/tool_schemas.json, dumped from the hand-written ones):
    /// the same types, required fields, bounds, defaults, `anyOf` and
    /// `additionalProperties: false`.
    #[test]
    fn published_schemas_are_the_fixtures() {
        let fixture: Value = serde_json::from_str(include_str!("../../tests/fixtures/tool_schemas.json")).unwrap();
        let now = published();
        assert_eq!(
            now.as_object().unwrap().keys().collect::<Vec<_>>(),
            fixture.as_object().unwrap().keys().collect::<Vec<_>>()
        );
        for (tool, want) in fixture.as_object().unwrap() {
            assert_eq!(
                normalised(&now[tool]),
                normalised(want),
                "{tool}: published {}",
                serde_json::to_string_pretty(&now[tool]).unwrap()
            );
        }
    }
}
