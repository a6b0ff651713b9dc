//! Prometheus metrics. The struct owns its registry, so every `Application`
//! (and every test app) has its own counters.

use std::time::Instant;

use axum::{
    body::Body,
    extract::{MatchedPath, Request, State},
    middleware::Next,
    response::{IntoResponse, Response},
};
use prometheus::{
    Encoder, Histogram, HistogramOpts, HistogramVec, IntCounter, IntCounterVec, IntGauge, IntGaugeVec, Opts, Registry,
    TextEncoder,
};

/// Latency buckets (seconds) for requests, tools and store queries.
const BUCKETS: [f64; 13] = [
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 10.0,
];

#[derive(Clone)]
pub struct Metrics {
    registry: Registry,
    pub http_requests: IntCounterVec,
    pub http_duration: HistogramVec,
    pub auth_failures: IntCounterVec,
    pub auth_resolutions: IntCounterVec,
    pub rate_limited: IntCounterVec,
    /// `oauth_flows_total{step,outcome}` (issue 48): step = register,
    /// authorize, consent, token, refresh, revoke; outcome = ok or the
    /// RFC 6749 error code answered (access_denied: the person declined).
    pub oauth_flows: IntCounterVec,
    /// `mcp_tool_calls_total{tool,outcome}`: ok, tool_error (an `isError`
    /// answer: bad argument, not found, store down, deadline), refused (rate
    /// limited before it ran, or not available to the credential),
    /// protocol_error (a `tools/call` of no tool of ours).
    pub tool_calls: IntCounterVec,
    pub tool_duration: HistogramVec,
    /// `graph_query_duration_seconds{query}`: query = the Cypher file's name.
    pub graph_query_duration: HistogramVec,
    /// `graph_errors_total{kind}`: unavailable, conflict_retried, query.
    pub graph_errors: IntCounterVec,
    pub pg_pool_connections: IntGaugeVec,
    /// Seconds a new connection took to come out of the pool at the last scrape.
    pub pg_acquire_seconds: prometheus::Gauge,
    /// 1 when the store answered its probe at the last scrape.
    pub store_up: IntGaugeVec,
    pub sessions_active: IntGauge,
    /// `mcp_tool_calls_running{tool}`: tool calls whose work is running now
    /// (a search holds its slot exactly as long).
    pub tool_calls_running: IntGaugeVec,
    pub ingest_chunks: IntCounter,
    pub ingest_duration: Histogram,
    pub build_info: IntGaugeVec,
    /// Tool calls per credential (issue 24): not Prometheus labels (unbounded),
    /// counted in memory and flushed to Postgres.
    pub usage: std::sync::Arc<crate::usage::UsageCounter>,
    /// Per-library read activity (issue 53), flushed like `usage`; replaced
    /// at startup by one built from the settings (on/off, query mode).
    pub activity: std::sync::Arc<crate::activity::ActivityCounter>,
}

impl Metrics {
    /// Every series, with no tool's series created up front (benches, tests).
    pub fn new() -> Self {
        Self::for_tools(&[])
    }

    /// Every series, with each of `tools`' call counters created at zero (the
    /// server passes its tool names: this module sits below `mcp`).
    pub fn for_tools(tools: &[&str]) -> Self {
        let m = Metrics {
            registry: Registry::new(),
            http_requests: counter_vec(
                "http_requests_total",
                "HTTP requests by route, method and status",
                &["method", "route", "status"],
            ),
            http_duration: histogram_vec(
                "http_request_duration_seconds",
                "HTTP request latency by route",
                &["method", "route"],
            ),
            auth_failures: counter_vec(
                "mcp_auth_failures_total",
                "Bearer authentication failures by reason",
                &["reason"],
            ),
            auth_resolutions: counter_vec(
                "mcp_auth_resolutions_total",
                "Successful bearer resolutions by principal kind",
                &["kind"],
            ),
            rate_limited: counter_vec(
                "mcp_rate_limited_total",
                "Requests refused with 429 by principal kind and tool (\"-\" = any request; \"basic\" = HTTP Basic failures)",
                &["kind", "tool"],
            ),
            oauth_flows: counter_vec(
                "oauth_flows_total",
                "OAuth authorization server steps by step and outcome (ok or the error code answered)",
                &["step", "outcome"],
            ),
            tool_calls: counter_vec(
                "mcp_tool_calls_total",
                "MCP tool calls by tool and outcome",
                &["tool", "outcome"],
            ),
            tool_duration: histogram_vec(
                "mcp_tool_duration_seconds",
                "MCP tool call latency by tool",
                &["tool"],
            ),
            graph_query_duration: histogram_vec(
                "graph_query_duration_seconds",
                "Graph query latency by Cypher file (transactions: by their first statement)",
                &["query"],
            ),
            graph_errors: counter_vec(
                "graph_errors_total",
                "Graph store errors: unavailable, conflict_retried, query",
                &["kind"],
            ),
            pg_pool_connections: gauge_vec(
                "pg_pool_connections",
                "PostgreSQL pool connections by state (idle, in_use, max)",
                &["state"],
            ),
            pg_acquire_seconds: prometheus::Gauge::new(
                "pg_pool_acquire_seconds",
                "Seconds a connection took to come out of the PostgreSQL pool (probed at scrape)",
            )
            .expect("valid metric"),
            store_up: gauge_vec(
                "mnemosyne_store_up",
                "1 when the store answered its probe at the last scrape",
                &["store"],
            ),
            tool_calls_running: gauge_vec(
                "mcp_tool_calls_running",
                "MCP tool calls whose work is running on this replica, by tool",
                &["tool"],
            ),
            sessions_active: IntGauge::new("mcp_sessions_active", "Open legacy MCP sessions on this replica")
                .expect("valid metric"),
            ingest_chunks: IntCounter::new("ingest_chunks_total", "Chunks written by ingest").expect("valid metric"),
            ingest_duration: Histogram::with_opts(
                HistogramOpts::new("ingest_duration_seconds", "Ingest request latency (validated requests)")
                    .buckets(BUCKETS.to_vec()),
            )
            .expect("valid metric"),
            build_info: gauge_vec(
                "mnemosyne_build_info",
                "Always 1: the version and graph flavor of this replica",
                &["version", "flavor"],
            ),
            usage: Default::default(),
            activity: Default::default(),
        };
        m.register_own();
        m.create_zero_series(tools);
        m
    }

    /// Registers this struct's own series in its registry.
    fn register_own(&self) {
        for c in [
            Box::new(self.http_requests.clone()) as Box<dyn prometheus::core::Collector>,
            Box::new(self.tool_calls.clone()),
            Box::new(self.tool_duration.clone()),
            Box::new(self.graph_query_duration.clone()),
            Box::new(self.graph_errors.clone()),
            Box::new(self.pg_pool_connections.clone()),
            Box::new(self.pg_acquire_seconds.clone()),
            Box::new(self.store_up.clone()),
            Box::new(self.sessions_active.clone()),
            Box::new(self.tool_calls_running.clone()),
            Box::new(self.ingest_chunks.clone()),
            Box::new(self.ingest_duration.clone()),
            Box::new(self.build_info.clone()),
            Box::new(self.http_duration.clone()),
            Box::new(self.auth_failures.clone()),
            Box::new(self.auth_resolutions.clone()),
            Box::new(self.rate_limited.clone()),
            Box::new(self.oauth_flows.clone()),
        ] {
            self.registry.register(c).expect("metric registered once");
        }
    }

    /// Series that exist from the start, so dashboards and alerts see zeros
    /// rather than nothing.
    fn create_zero_series(&self, tools: &[&str]) {
        for reason in [
            "missing",
            "invalid_token",
            "expired",
            "invalid_issuer",
            "team_not_found",
            "stale_jti",
            "team_inactive",
            "token_not_found",
            "user_disabled",
            "replay",
            "store_unavailable",
        ] {
            self.auth_failures.with_label_values(&[reason]);
        }
        for step in ["register", "authorize", "consent", "token", "refresh", "revoke"] {
            self.oauth_flows.with_label_values(&[step, "ok"]);
        }
        for kind in ["unavailable", "conflict_retried", "query"] {
            self.graph_errors.with_label_values(&[kind]);
        }
        for &tool in tools {
            for outcome in ["ok", "tool_error", "refused"] {
                self.tool_calls.with_label_values(&[tool, outcome]);
            }
        }
        for kind in ["token", "per_turn", "team", "basic"] {
            self.rate_limited.with_label_values(&[kind, "-"]);
        }
    }

    /// Registers a collector owned elsewhere (the auth caches').
    pub fn register(&self, c: Box<dyn prometheus::core::Collector>) {
        if let Err(e) = self.registry.register(c) {
            tracing::warn!(error = %e, "metric not registered");
        }
    }

    /// The registry in Prometheus text format.
    pub fn render(&self) -> String {
        let mut buf = Vec::new();
        let _ = TextEncoder::new().encode(&self.registry.gather(), &mut buf);
        String::from_utf8(buf).unwrap_or_default()
    }
}

fn counter_vec(name: &str, help: &str, labels: &[&str]) -> IntCounterVec {
    IntCounterVec::new(Opts::new(name, help), labels).expect("valid metric")
}

fn gauge_vec(name: &str, help: &str, labels: &[&str]) -> IntGaugeVec {
    IntGaugeVec::new(Opts::new(name, help), labels).expect("valid metric")
}

/// A latency histogram over `BUCKETS`.
fn histogram_vec(name: &str, help: &str, labels: &[&str]) -> HistogramVec {
    HistogramVec::new(HistogramOpts::new(name, help).buckets(BUCKETS.to_vec()), labels).expect("valid metric")
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

/// A bounded label for a request method: the standard methods by name, any
/// other (a caller can send any token) as `other`.
fn method_label(m: &http::Method) -> &'static str {
    use http::Method as M;
    match *m {
        M::GET => "GET",
        M::POST => "POST",
        M::PUT => "PUT",
        M::DELETE => "DELETE",
        M::HEAD => "HEAD",
        M::OPTIONS => "OPTIONS",
        M::PATCH => "PATCH",
        M::TRACE => "TRACE",
        M::CONNECT => "CONNECT",
        _ => "other",
    }
}

/// Axum middleware: counts every request by its route template (never the raw
/// path, so uids do not explode the label set) and observes its latency.
pub async fn track(State(metrics): State<Metrics>, req: Request<Body>, next: Next) -> Response {
    let start = Instant::now();
    let method = method_label(req.method());
    let route = req
        .extensions()
        .get::<MatchedPath>()
        .map(|p| p.as_str().to_owned())
        .unwrap_or_else(|| "unmatched".to_owned());
    let resp = next.run(req).await;
    let status = resp.status().as_u16().to_string();
    metrics
        .http_requests
        .with_label_values(&[method, &route, &status])
        .inc();
    metrics
        .http_duration
        .with_label_values(&[method, &route])
        .observe(start.elapsed().as_secs_f64());
    resp
}

pub async fn handler(State(metrics): State<Metrics>) -> impl IntoResponse {
    (
        [(http::header::CONTENT_TYPE, "text/plain; version=0.0.4; charset=utf-8")],
        metrics.render(),
    )
}
