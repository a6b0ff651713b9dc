//! One error table for the HTTP surface: a stable code, the status, a message
//! for the caller. 5xx bodies are opaque; their cause is logged once here.
//!
//! The other error types of the HTTP surface answer through this table or
//! beside it, never with a table of their own:
//! - `auth::AuthError` (the bearer on `/mcp`) answers the spec's exact 401s
//!   (`auth::failure`: OAuth `error` codes and `WWW-Authenticate`, which this
//!   table cannot carry); its store failure is this table's
//!   `StoreUnavailable`.
//! - `admin::AdminError` (the console) renders HTML pages; its `Api` variant
//!   wraps an `ApiError` and keeps its status (and `Retry-After`), showing
//!   the message as a page instead of JSON.
//! - `mcp::tools::ToolError` is not HTTP at all: a tool's failure is an
//!   `isError` tool result inside a 200 JSON-RPC answer (MCP's rule), with
//!   the same discipline (a message for the caller, the cause logged).

use axum::{
    extract::{rejection::JsonRejection, FromRequest, Request},
    http::{header, HeaderValue, StatusCode},
    response::{IntoResponse, Response},
    Json,
};
use serde::de::DeserializeOwned;
use serde_json::json;

#[derive(Clone, Debug, thiserror::Error)]
pub enum ApiError {
    /// 400: bad input; `field` names the offending field when there is one.
    #[error("{message}")]
    BadRequest { field: Option<String>, message: String },
    /// 401 for the Basic-authenticated APIs.
    #[error("authentication required")]
    BasicUnauthorized,
    #[error("{0}")]
    Forbidden(String),
    #[error("{0}")]
    NotFound(String),
    #[error("{0}")]
    Conflict(String),
    #[error("request body too large")]
    PayloadTooLarge,
    #[error("{0}")]
    MethodNotAllowed(String),
    /// 429: over a limit; `Retry-After` says when to come back.
    #[error("{message}")]
    RateLimited { retry_after_secs: u64, message: String },
    /// 503: a store did not answer; the name says which.
    #[error("{0} unavailable")]
    StoreUnavailable(&'static str),
    /// 503 of an ingest whose graph call failed or ran out of time (or the
    /// whole request's deadline): the wait was abandoned, not the Bolt
    /// exchange (see `GraphStore::detached`), so a write already sent may
    /// still commit after this answer and "nothing was written" cannot be
    /// promised. What holds is that the item is written whole or not at all
    /// (one transaction), and that ingest is idempotent per item uid: the
    /// same request again converges on the same item (`unchanged` if the
    /// first one landed). The body says so with `retry_safe: true`.
    #[error("graph unavailable")]
    IngestUnavailable,
    /// 500: never shows its cause to the caller.
    #[error("internal error: {0}")]
    Internal(String),
}

impl ApiError {
    pub fn bad_field(field: &str, message: impl Into<String>) -> Self {
        ApiError::BadRequest {
            field: Some(field.to_owned()),
            message: message.into(),
        }
    }

    pub fn code(&self) -> &'static str {
        match self {
            ApiError::BadRequest { .. } => "bad_request",
            ApiError::BasicUnauthorized => "unauthorized",
            ApiError::Forbidden(_) => "forbidden",
            ApiError::NotFound(_) => "not_found",
            ApiError::Conflict(_) => "conflict",
            ApiError::PayloadTooLarge => "payload_too_large",
            ApiError::MethodNotAllowed(_) => "method_not_allowed",
            ApiError::RateLimited { .. } => "rate_limited",
            ApiError::StoreUnavailable(_) | ApiError::IngestUnavailable => "unavailable",
            ApiError::Internal(_) => "internal_error",
        }
    }

    pub fn status(&self) -> StatusCode {
        match self {
            ApiError::BadRequest { .. } => StatusCode::BAD_REQUEST,
            ApiError::BasicUnauthorized => StatusCode::UNAUTHORIZED,
            ApiError::Forbidden(_) => StatusCode::FORBIDDEN,
            ApiError::NotFound(_) => StatusCode::NOT_FOUND,
            ApiError::Conflict(_) => StatusCode::CONFLICT,
            ApiError::PayloadTooLarge => StatusCode::PAYLOAD_TOO_LARGE,
            ApiError::MethodNotAllowed(_) => StatusCode::METHOD_NOT_ALLOWED,
            ApiError::RateLimited { .. } => StatusCode::TOO_MANY_REQUESTS,
            ApiError::StoreUnavailable(_) | ApiError::IngestUnavailable => StatusCode::SERVICE_UNAVAILABLE,
            ApiError::Internal(_) => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let status = self.status();
        let body = match &self {
            ApiError::BadRequest {
                field: Some(f),
                message,
            } => {
                json!({"error": self.code(), "field": f, "message": message})
            }
            ApiError::Internal(cause) => {
                tracing::error!(?cause, "internal error");
                json!({"error": self.code(), "message": "internal error"})
            }
            ApiError::StoreUnavailable(store) => {
                tracing::warn!(store, "store unavailable");
                json!({"error": self.code(), "store": store, "message": format!("{store} is unavailable, retry later")})
            }
            ApiError::IngestUnavailable => {
                tracing::warn!(store = "graph", "store unavailable");
                json!({"error": self.code(), "store": "graph", "retry_safe": true,
                       "message": "graph is unavailable, retry later; the item may or may not have been written \
                                   (whole either way): sending the same request again is safe"})
            }
            other => json!({"error": other.code(), "message": other.to_string()}),
        };
        let mut resp = (status, Json(body)).into_response();
        // Errors may be answered before the body was read (auth extractors run
        // first): close rather than leave unread bytes on a keep-alive connection.
        resp.headers_mut()
            .insert(header::CONNECTION, HeaderValue::from_static("close"));
        match self {
            ApiError::BasicUnauthorized => {
                resp.headers_mut().insert(
                    header::WWW_AUTHENTICATE,
                    HeaderValue::from_static("Basic realm=\"mnemosyne\""),
                );
            }
            ApiError::StoreUnavailable(_) | ApiError::IngestUnavailable => {
                resp.headers_mut()
                    .insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
            }
            ApiError::RateLimited { retry_after_secs, .. } => {
                if let Ok(v) = HeaderValue::from_str(&retry_after_secs.to_string()) {
                    resp.headers_mut().insert(header::RETRY_AFTER, v);
                }
            }
            _ => {}
        }
        resp
    }
}

/// The one answer for an MCP session that does not exist or belongs to
/// another credential (rmcp's own text, no content type), so the two are
/// indistinguishable; the connection is closed (it is sent before any body
/// is read).
pub fn session_not_found() -> Response {
    let mut r = (StatusCode::NOT_FOUND, "Not Found: Session not found").into_response();
    r.headers_mut().remove(header::CONTENT_TYPE);
    r.headers_mut()
        .insert(header::CONNECTION, HeaderValue::from_static("close"));
    r
}

/// A refusal of an MCP request whose JSON-RPC `id` is known, in MCP's
/// envelope (`{"jsonrpc", "id", "error": {code, message, data}}`) with the
/// refusal's HTTP status, so SDKs surface it as the request's error; with
/// `retry_after`, a `Retry-After` header.
pub struct RpcError {
    pub status: StatusCode,
    pub id: serde_json::Value,
    pub code: i32,
    pub message: String,
    pub data: serde_json::Value,
    pub retry_after: Option<u64>,
}

impl IntoResponse for RpcError {
    fn into_response(self) -> Response {
        let body = json!({"jsonrpc": "2.0", "id": self.id, "error": {
            "code": self.code, "message": self.message, "data": self.data}});
        let mut r = (self.status, Json(body)).into_response();
        if let Some(v) = self
            .retry_after
            .and_then(|s| HeaderValue::from_str(&s.to_string()).ok())
        {
            r.headers_mut().insert(header::RETRY_AFTER, v);
        }
        r
    }
}

impl From<sqlx::Error> for ApiError {
    fn from(e: sqlx::Error) -> Self {
        match e {
            sqlx::Error::PoolTimedOut
            | sqlx::Error::Io(_)
            | sqlx::Error::PoolClosed
            | sqlx::Error::WorkerCrashed
            | sqlx::Error::Tls(_) => ApiError::StoreUnavailable("postgres"),
            sqlx::Error::RowNotFound => ApiError::NotFound("not found".into()),
            other => ApiError::Internal(format!("postgres: {other}")),
        }
    }
}

impl From<crate::store::graph::GraphError> for ApiError {
    fn from(e: crate::store::graph::GraphError) -> Self {
        match e {
            crate::store::graph::GraphError::Unavailable(cause) => {
                // The 503 itself names only the store; the cause goes to the log.
                tracing::warn!(store = "graph", ?cause, "graph unavailable");
                ApiError::StoreUnavailable("graph")
            }
            crate::store::graph::GraphError::Conflict(cause) => {
                tracing::warn!(?cause, "graph write conflict outlasted its retries");
                ApiError::Conflict("concurrent writes to the same data kept conflicting; retry the request".into())
            }
            crate::store::graph::GraphError::Query(m) | crate::store::graph::GraphError::Unsupported(m) => {
                ApiError::Internal(format!("graph: {m}"))
            }
            crate::store::graph::GraphError::Embedding(cause) => {
                tracing::warn!(?cause, "semantic search: no query vector");
                ApiError::StoreUnavailable("the embedding provider")
            }
        }
    }
}

/// `Json<T>` whose rejections are our JSON errors: 413 for an oversized body,
/// 400 naming the field for a body that does not fit `T`.
pub struct ApiJson<T>(pub T);

impl<S, T> FromRequest<S> for ApiJson<T>
where
    T: DeserializeOwned,
    S: Send + Sync,
{
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &S) -> Result<Self, Self::Rejection> {
        let Json(value) = Json::<serde_json::Value>::from_request(req, state)
            .await
            .map_err(json_rejection)?;
        let v: T = serde_path_to_error::deserialize(value).map_err(|e| {
            let path = e.path().to_string();
            let inner = e.into_inner().to_string();
            // An empty key is the empty path.
            let field = if path == "." || path.is_empty() {
                // "missing field `name`" / "unknown field `name`, …" name the
                // field only in the message. Any other top-level error is the
                // body's: a JSON string holding backticks once chose the field
                // (`"a``b"` named an empty one; fuzz/fuzz_targets/ingest_body.rs).
                ["missing field `", "unknown field `"]
                    .iter()
                    .find_map(|p| inner.strip_prefix(p))
                    .and_then(|rest| rest.split('`').next())
                    .filter(|f| !f.is_empty())
                    .unwrap_or("body")
                    .to_owned()
            } else {
                path
            };
            ApiError::BadRequest {
                message: format!("{field}: {inner}"),
                field: Some(field),
            }
        })?;
        Ok(ApiJson(v))
    }
}

fn json_rejection(r: JsonRejection) -> ApiError {
    match r.status() {
        StatusCode::PAYLOAD_TOO_LARGE => ApiError::PayloadTooLarge,
        StatusCode::UNSUPPORTED_MEDIA_TYPE => ApiError::BadRequest {
            field: Some("content-type".into()),
            message: "expected Content-Type: application/json".into(),
        },
        _ => ApiError::BadRequest {
            field: Some("body".into()),
            message: r.body_text(),
        },
    }
}

/// Fallback for unknown paths: a JSON 404 like every other error.
pub async fn not_found() -> ApiError {
    ApiError::NotFound("no such endpoint".into())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, serde::Deserialize)]
    #[serde(deny_unknown_fields)]
    #[allow(dead_code)]
    struct Body {
        name: String,
    }

    async fn field_of(body: &'static str) -> Option<String> {
        let req = axum::http::Request::post("/")
            .header("content-type", "application/json")
            .body(axum::body::Body::from(body))
            .unwrap();
        match ApiJson::<Body>::from_request(req, &()).await {
            Err(ApiError::BadRequest { field, .. }) => field,
            Err(e) => panic!("{e:?}"),
            Ok(ApiJson(b)) => panic!("accepted {b:?}"),
        }
    }

    /// Regression found by fuzz/fuzz_targets/ingest_body.rs.
    #[tokio::test]
    async fn a_refused_body_names_a_field_never_taken_from_its_values() {
        assert_eq!(field_of(r#""a``b""#).await.as_deref(), Some("body"));
        assert_eq!(field_of(r#""x`name`""#).await.as_deref(), Some("body"));
        assert_eq!(field_of("{}").await.as_deref(), Some("name"));
        assert_eq!(field_of(r#"{"name": "n", "other": 1}"#).await.as_deref(), Some("other"));
        assert_eq!(field_of(r#"{"name": "n", "": 1}"#).await.as_deref(), Some("body"));
        assert_eq!(field_of(r#"{"name": 1}"#).await.as_deref(), Some("name"));
    }
}
