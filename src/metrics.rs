//! Prometheus metrics. The struct owns its registry, so every `Application`
//! (and every test app) has its own counters.

use std::time::Instant;

use axum::{
    body::Body,
    extract::{MatchedPath, Request, State},
    middleware::Next,
    response::{IntoResponse, Response},
};
use prometheus::{Encoder, HistogramOpts, HistogramVec, IntCounterVec, Opts, Registry, TextEncoder};

#[derive(Clone)]
pub struct Metrics {
    registry: Registry,
    pub http_requests: IntCounterVec,
    pub http_duration: HistogramVec,
    pub auth_failures: IntCounterVec,
    pub auth_resolutions: IntCounterVec,
    pub rate_limited: IntCounterVec,
}

impl Metrics {
    pub fn new() -> Self {
        let registry = Registry::new();
        let http_requests = IntCounterVec::new(
            Opts::new("http_requests_total", "HTTP requests by route, method and status"),
            &["method", "route", "status"],
        )
        .expect("valid metric");
        let http_duration = HistogramVec::new(
            HistogramOpts::new("http_request_duration_seconds", "HTTP request latency by route").buckets(vec![
                0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5,
            ]),
            &["method", "route"],
        )
        .expect("valid metric");
        let auth_failures = IntCounterVec::new(
            Opts::new("mcp_auth_failures_total", "Bearer authentication failures by reason"),
            &["reason"],
        )
        .expect("valid metric");
        let auth_resolutions = IntCounterVec::new(
            Opts::new(
                "mcp_auth_resolutions_total",
                "Successful bearer resolutions by principal kind",
            ),
            &["kind"],
        )
        .expect("valid metric");
        let rate_limited = IntCounterVec::new(
            Opts::new(
                "mcp_rate_limited_total",
                "Requests refused with 429 by principal kind and tool (\"-\" = any request; \"basic\" = HTTP Basic failures)",
            ),
            &["kind", "tool"],
        )
        .expect("valid metric");
        for c in [
            Box::new(http_requests.clone()) as Box<dyn prometheus::core::Collector>,
            Box::new(http_duration.clone()),
            Box::new(auth_failures.clone()),
            Box::new(auth_resolutions.clone()),
            Box::new(rate_limited.clone()),
        ] {
            registry.register(c).expect("metric registered once");
        }
        Metrics {
            registry,
            http_requests,
            http_duration,
            auth_failures,
            auth_resolutions,
            rate_limited,
        }
    }

    /// The registry in Prometheus text format.
    pub fn render(&self) -> String {
        let mut buf = Vec::new();
        let _ = TextEncoder::new().encode(&self.registry.gather(), &mut buf);
        String::from_utf8(buf).unwrap_or_default()
    }
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

/// Axum middleware: counts every request by its route template (never the raw
/// path, so uids do not explode the label set) and observes its latency.
pub async fn track(State(metrics): State<Metrics>, req: Request<Body>, next: Next) -> Response {
    let start = Instant::now();
    let method = req.method().as_str().to_owned();
    let route = req
        .extensions()
        .get::<MatchedPath>()
        .map(|p| p.as_str().to_owned())
        .unwrap_or_else(|| "unmatched".to_owned());
    let resp = next.run(req).await;
    let status = resp.status().as_u16().to_string();
    metrics
        .http_requests
        .with_label_values(&[&method, &route, &status])
        .inc();
    metrics
        .http_duration
        .with_label_values(&[&method, &route])
        .observe(start.elapsed().as_secs_f64());
    resp
}

pub async fn handler(State(metrics): State<Metrics>) -> impl IntoResponse {
    (
        [(http::header::CONTENT_TYPE, "text/plain; version=0.0.4; charset=utf-8")],
        metrics.render(),
    )
}
