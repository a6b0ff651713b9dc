//! Tracing setup: human-readable lines in a terminal, JSON when configured.

use axum::{extract::Request, middleware::Next, response::Response};
use tracing::Instrument;
use tracing_subscriber::{fmt, EnvFilter};

use crate::config::LogFormat;

/// Installs the global subscriber once; later calls are no-ops (tests call it often).
pub fn init(format: LogFormat) {
    let _ = install(format, None);
}

/// Keeps the trace exporter alive; dropping it flushes the spans not yet sent.
pub struct Telemetry {
    provider: Option<opentelemetry_sdk::trace::SdkTracerProvider>,
}

impl Drop for Telemetry {
    fn drop(&mut self) {
        if let Some(p) = self.provider.take() {
            let _ = p.shutdown();
        }
    }
}

/// Logs (text or JSON, filtered by `MNEMOSYNE_LOG`) and, when `otlp_endpoint`
/// is set, spans exported over OTLP/HTTP (`<endpoint>/v1/traces`). Spans carry
/// kinds, counts, names and outcomes — never token material or query text.
pub fn install(format: LogFormat, otlp_endpoint: Option<&str>) -> anyhow::Result<Telemetry> {
    use opentelemetry::trace::TracerProvider as _;
    use opentelemetry_otlp::WithExportConfig;
    use tracing_subscriber::{layer::SubscriberExt, util::SubscriberInitExt, Layer};

    let filter = EnvFilter::try_from_env("MNEMOSYNE_LOG")
        .unwrap_or_else(|_| EnvFilter::new("info,sqlx=warn,neo4rs=warn,rmcp=warn"));
    // The log filter applies to the log lines only: spans are exported
    // whatever MNEMOSYNE_LOG says, and only ours (never the exporter's own
    // HTTP client, which would feed itself).
    let logs = match format {
        LogFormat::Json => fmt::layer()
            .json()
            .flatten_event(true)
            .with_current_span(true)
            .with_span_list(true)
            .with_writer(std::io::stderr)
            .with_filter(filter)
            .boxed(),
        LogFormat::Text => fmt::layer().with_writer(std::io::stderr).with_filter(filter).boxed(),
    };
    let (provider, traces) = match otlp_endpoint.filter(|e| !e.is_empty()) {
        Some(endpoint) => {
            let endpoint = endpoint.trim_end_matches('/');
            let url = if endpoint.ends_with("/v1/traces") {
                endpoint.to_owned()
            } else {
                format!("{endpoint}/v1/traces")
            };
            let exporter = opentelemetry_otlp::SpanExporter::builder()
                .with_http()
                .with_endpoint(url)
                .build()?;
            let provider = opentelemetry_sdk::trace::SdkTracerProvider::builder()
                .with_batch_exporter(exporter)
                .with_resource(
                    opentelemetry_sdk::Resource::builder()
                        .with_service_name("mnemosyne")
                        .build(),
                )
                .build();
            let layer = tracing_opentelemetry::layer()
                .with_tracer(provider.tracer("mnemosyne"))
                .with_filter(tracing_subscriber::filter::Targets::new().with_target("mnemosyne", tracing::Level::INFO));
            (Some(provider), Some(layer))
        }
        None => (None, None),
    };
    let _ = tracing_subscriber::registry().with(logs).with(traces).try_init();
    Ok(Telemetry { provider })
}

pub const REQUEST_ID_HEADER: &str = "x-request-id";

/// The id of one HTTP request: the caller's `X-Request-Id` when it is a
/// reasonable token (1–64 visible ASCII characters), else a new UUID.
#[derive(Clone, Debug)]
pub struct RequestId(pub std::sync::Arc<str>);

/// Outermost middleware: every request gets an id, echoed in the response,
/// carried by a `request{id=…}` span around everything logged while serving
/// it, and put in the request's extensions (tools log it explicitly: rmcp
/// runs session tools on tasks of their own).
pub async fn request_id(mut req: Request, next: Next) -> Response {
    let id: std::sync::Arc<str> = req
        .headers()
        .get(REQUEST_ID_HEADER)
        .and_then(|v| v.to_str().ok())
        .filter(|v| !v.is_empty() && v.len() <= 64 && v.bytes().all(|b| b.is_ascii_graphic()))
        .map(Into::into)
        .unwrap_or_else(|| uuid::Uuid::new_v4().to_string().into());
    req.extensions_mut().insert(RequestId(id.clone()));
    let span = tracing::info_span!("request", id = %id);
    let mut resp = next.run(req).instrument(span).await;
    if let Ok(v) = http::HeaderValue::from_str(&id) {
        resp.headers_mut().insert(REQUEST_ID_HEADER, v);
    }
    resp
}
