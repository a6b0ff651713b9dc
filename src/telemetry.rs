//! Tracing setup: human-readable lines in a terminal, JSON when configured.

use axum::{extract::Request, middleware::Next, response::Response};
use tracing::Instrument;
use tracing_subscriber::{fmt, EnvFilter};

use crate::config::LogFormat;

/// Installs the global subscriber once; later calls are no-ops (tests call it often).
pub fn init(format: LogFormat) {
    let filter = EnvFilter::try_from_env("MNEMOSYNE_LOG")
        .unwrap_or_else(|_| EnvFilter::new("info,sqlx=warn,neo4rs=warn,rmcp=warn"));
    let builder = fmt().with_env_filter(filter).with_writer(std::io::stderr);
    let _ = match format {
        LogFormat::Json => builder
            .json()
            .flatten_event(true)
            .with_current_span(true)
            .with_span_list(true)
            .try_init(),
        LogFormat::Text => builder.try_init(),
    };
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
