//! The MCP server: one `KnowledgeServer` per session (and per stateless
//! request) over the tools of `tools/`, and the one wrapper every tool call
//! runs in (progress, deadline, metrics, log line).

use std::sync::Arc;
use std::time::Duration;

use http::request::Parts;
use rmcp::{
    handler::server::router::tool::ToolRouter,
    handler::server::tool::ToolCallContext,
    model::{
        CacheScope, CallToolRequestParams, CallToolResponse, CallToolResult, Implementation, ListToolsResult,
        PaginatedRequestParams, ProgressNotificationParam, ProtocolVersion, ResultType, ServerCapabilities,
        ServerConfig,
    },
    service::RequestContext,
    tool_handler, ErrorData, RoleServer, ServerHandler,
};
use tracing::Instrument;

use super::calls::{record_call, tool_label, Outcome};
use super::tools::{into_result, Reply, ToolError};
use crate::auth::{Principal, ToolGrant};
use crate::metrics::Metrics;
use crate::search::engine::Engine;
use crate::service::health::Probes;
use crate::store::graph::knowledge::{KnowledgeGraph, ScopedGraph};

/// What the tools reach: scoped views of the graph, the store probes, the
/// call deadline and the metrics — never the admin handle.
#[derive(Clone)]
pub struct ToolState {
    knowledge: KnowledgeGraph,
    probes: Probes,
    /// Search's front door (`search::engine`).
    search: Engine,
    metrics: Metrics,
    deadline: Duration,
}

impl ToolState {
    /// The store probes (`get_health`).
    pub(super) fn probes(&self) -> &Probes {
        &self.probes
    }

    /// Search's front door (`search`).
    pub(super) fn search(&self) -> &Engine {
        &self.search
    }

    /// Built by `startup` from the application's handles (`mcp` sits above
    /// the stores and below the application state).
    pub fn new(
        knowledge: KnowledgeGraph,
        probes: Probes,
        search: Engine,
        metrics: Metrics,
        deadline: Duration,
    ) -> Self {
        ToolState {
            knowledge,
            probes,
            search,
            metrics,
            deadline,
        }
    }
}

#[derive(Clone)]
pub struct KnowledgeServer {
    state: ToolState,
    /// Shared: rmcp builds a server per session and per stateless request.
    tool_router: Arc<ToolRouter<KnowledgeServer>>,
}

impl KnowledgeServer {
    pub fn new(state: ToolState, tool_router: Arc<ToolRouter<KnowledgeServer>>) -> Self {
        KnowledgeServer { state, tool_router }
    }

    /// Built once and cloned into each session's server.
    pub fn router() -> ToolRouter<KnowledgeServer> {
        Self::search_router()
            + Self::get_chunk_router()
            + Self::list_libraries_router()
            + Self::list_collections_router()
            + Self::list_items_router()
            + Self::get_health_router()
    }

    /// The caller's view of the graph, from the principal the auth layer put
    /// on the request. No principal (cannot happen behind the layer) reads
    /// nothing: fail closed.
    pub(super) fn graph_of(&self, parts: &Parts) -> ScopedGraph {
        match parts.extensions.get::<Principal>() {
            Some(p) => self.state.knowledge.scoped(p),
            None => self.state.knowledge.nothing(),
        }
    }

    /// What the tools reach besides the caller's view (`tools::tool_body`).
    pub(super) fn tools(&self) -> &ToolState {
        &self.state
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
    pub(super) async fn run(
        &self,
        ctx: &RequestContext<RoleServer>,
        parts: &Parts,
        tool: &'static str,
        work: impl std::future::Future<Output = Result<Reply, ToolError>>,
    ) -> CallToolResult {
        let started = std::time::Instant::now();
        let span = tracing::info_span!("mcp.tool", tool, outcome = tracing::field::Empty);
        let running = Running::new(self.state.metrics.tool_calls_running.with_label_values(&[tool]));
        Self::progress(ctx, tool, "started").await;
        // One deadline for the whole call, however many store queries it
        // makes; and it stops when its caller has gone (the guard's
        // `Caller`, whose clone here also holds a search's slot meanwhile).
        let deadline = self.state.deadline;
        let caller = parts.extensions.get::<crate::mcp::guard::Caller>().cloned();
        let work = async {
            let gone = async {
                match &caller {
                    Some(c) => c.gone.cancelled().await,
                    None => std::future::pending().await,
                }
            };
            // rmcp's own token: the client's notifications/cancelled (and,
            // outside a session, its disconnect).
            tokio::select! {
                out = work => out,
                () = gone => Err(ToolError::CallerGone),
                () = ctx.ct.cancelled() => Err(ToolError::CallerGone),
            }
        };
        let out = tokio::time::timeout(deadline, work)
            .instrument(span.clone())
            .await
            .unwrap_or(Err(ToolError::TimedOut(deadline)));
        drop((running, caller));
        // A caller that has gone reads no progress (and sending it would
        // wait for rmcp's drain of a closed stream).
        if !matches!(out, Err(ToolError::CallerGone)) {
            Self::progress(ctx, tool, if out.is_err() { "failed" } else { "completed" }).await;
        }
        let outcome = if out.is_err() { Outcome::ToolError } else { Outcome::Ok };
        span.record("outcome", outcome.as_str());
        let elapsed = started.elapsed();
        let principal = parts.extensions.get::<Principal>();
        record_call(&self.state.metrics, principal, tool, outcome);
        if let (Ok(reply), Some(p)) = (&out, principal) {
            let (reads, query) = reply.reads();
            if !reads.is_empty() {
                let reader = crate::activity::Reader::new(p.kind().as_str(), p.subject(), p.user().map(|u| &**u));
                self.state.metrics.activity.record(&reader, tool, query, reads);
            }
        }
        self.state
            .metrics
            .tool_duration
            .with_label_values(&[tool])
            .observe(elapsed.as_secs_f64());
        let outcome = outcome.as_str();
        let request_id = parts.extensions.get::<crate::telemetry::RequestId>();
        tracing::info!(
            request_id = request_id.map_or("-", |r| &*r.0),
            tool,
            principal = principal.map_or("none", |p| p.kind().as_str()),
            libraries = principal.map_or(0, |p| p.libraries().len()),
            outcome,
            duration_ms = elapsed.as_secs_f64() * 1000.0,
            "tool call"
        );
        into_result(out)
    }
}

/// A running tool call, counted in `mcp_tool_calls_running` until dropped
/// (also when its request is dropped mid-way).
struct Running(prometheus::IntGauge);

impl Running {
    fn new(g: prometheus::IntGauge) -> Self {
        g.inc();
        Running(g)
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        self.0.dec();
    }
}

/// The tools the request's credential may use. No principal (cannot happen
/// behind the auth layer) may use none: fail closed.
fn grant_of(ctx: &RequestContext<RoleServer>) -> ToolGrant {
    ctx.extensions
        .get::<Parts>()
        .and_then(|p| p.extensions.get::<Principal>())
        .map_or_else(|| ToolGrant::Only(Arc::from([])), |p| p.tools().clone())
}

/// The JSON-RPC error for a tool the credential may not use (issue 24): the
/// same whether the tool exists or not, so it tells nothing of the others.
fn not_available(name: &str) -> ErrorData {
    let shown: String = name.chars().filter(|c| !c.is_control()).take(64).collect();
    ErrorData::invalid_params(format!("Tool {shown} is not available to this credential."), None)
}

#[tool_handler(router = self.tool_router)]
impl ServerHandler for KnowledgeServer {
    /// Only the tools the credential may use (issue 24).
    async fn list_tools(
        &self,
        _request: Option<PaginatedRequestParams>,
        context: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, ErrorData> {
        let grant = grant_of(&context);
        let hints = context
            .protocol_version()
            .is_some_and(|v| v >= ProtocolVersion::V_2026_07_28);
        Ok(ListToolsResult {
            result_type: Some(ResultType::COMPLETE),
            tools: self
                .tool_router
                .list_all()
                .into_iter()
                .filter(|t| grant.allows(&t.name))
                .collect(),
            meta: None,
            next_cursor: None,
            ttl_ms: hints.then_some(0),
            // The list depends on the credential: no shared cache may keep it.
            cache_scope: hints.then_some(CacheScope::Private),
        })
    }

    /// Refuses a tool the credential may not use before rmcp routes the call
    /// (counted `refused`); runs the others.
    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, ErrorData> {
        if !grant_of(&context).allows(&request.name) {
            // Only our tool names become labels; anything else is `other`.
            let tool = tool_label(&request.name);
            let principal = context
                .extensions
                .get::<Parts>()
                .and_then(|p| p.extensions.get::<Principal>());
            record_call(&self.state.metrics, principal, tool, Outcome::Refused);
            tracing::info!(
                tool,
                principal = principal.map_or("none", |p| p.kind().as_str()),
                outcome = "refused",
                "tool call not available to this credential"
            );
            return Err(not_available(&request.name));
        }
        let tcc = ToolCallContext::new(self, request, context);
        self.tool_router.call(tcc).await
    }

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

    /// The one deliberately ignored difference between the hand-written
    /// schemas of the fixture and the derived ones: the `format: int64` hints
    /// schemars adds to integers, which do not change what a client may send
    /// or will receive. Everything else (types, required, bounds, defaults,
    /// descriptions, `anyOf`, `additionalProperties`) must be equal.
    fn normalised(v: &Value) -> Value {
        match v {
            Value::Object(m) => Value::Object(
                m.iter()
                    // A `format` hint is a string; a property named `format` would be an object.
                    .filter(|(k, v)| !(k.as_str() == "format" && v.is_string()))
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
        let now = published();
        // A deliberate schema change: UPDATE_TOOL_SCHEMAS=1 rewrites the
        // fixture (then review its diff).
        if std::env::var_os("UPDATE_TOOL_SCHEMAS").is_some() {
            let path = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/tool_schemas.json");
            std::fs::write(path, serde_json::to_string_pretty(&now).unwrap() + "\n").unwrap();
        }
        let fixture: Value = serde_json::from_str(include_str!("../../tests/fixtures/tool_schemas.json")).unwrap();
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
