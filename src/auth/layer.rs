//! The axum layer in front of `/mcp`: Host/Origin checks, bearer resolution on
//! every HTTP request, and the binding of MCP sessions to their principal
//! (rmcp does not do this). Tool handlers read the `Principal` from the request
//! extensions; a request that fails here never reaches rmcp.

use std::sync::Arc;
use std::time::Duration;

use axum::{
    extract::{Request, State},
    http::{header, HeaderMap, StatusCode},
    middleware::Next,
    response::{IntoResponse, Response},
    Json,
};
use moka::future::Cache;
use serde_json::json;

use super::failure::AuthError;
use super::principal::{Principal, PrincipalKind};
use super::resolver::RequestContext;
use crate::startup::AppState;

pub const SESSION_HEADER: &str = "mcp-session-id";

/// Session id → the principal (kind, subject) that opened it. Sessions live in
/// this replica's rmcp session manager, so the binding is local too.
#[derive(Clone)]
pub struct SessionOwners(Cache<String, Arc<(PrincipalKind, String)>>);

impl SessionOwners {
    pub fn new() -> Self {
        SessionOwners(
            Cache::builder()
                .max_capacity(1_000_000)
                .time_to_idle(Duration::from_secs(24 * 3600))
                .build(),
        )
    }
}

impl Default for SessionOwners {
    fn default() -> Self {
        Self::new()
    }
}

fn header_str(h: &HeaderMap, name: impl axum::http::header::AsHeaderName) -> Option<&str> {
    h.get(name).and_then(|v| v.to_str().ok())
}

fn bearer(h: &HeaderMap) -> Option<&str> {
    let v = header_str(h, header::AUTHORIZATION)?;
    let (scheme, token) = v.split_once(' ')?;
    scheme.eq_ignore_ascii_case("bearer").then(|| token.trim())
}

/// Refusals are sent before the request body is read: close the connection so
/// a keep-alive client never writes its next request into an unread body.
pub fn closing(mut r: Response) -> Response {
    r.headers_mut()
        .insert(header::CONNECTION, http::HeaderValue::from_static("close"));
    r
}

fn forbidden(msg: &str) -> Response {
    closing(
        (
            StatusCode::FORBIDDEN,
            Json(json!({"error": "forbidden", "message": msg})),
        )
            .into_response(),
    )
}

/// Byte for byte what rmcp answers for a session it does not know, so another
/// principal's session is indistinguishable from a missing one. The body is
/// read first (bounded), as rmcp does, so the connection stays usable.
async fn session_not_found(req: Request, limit: usize) -> Response {
    let _ = axum::body::to_bytes(req.into_body(), limit).await;
    let mut r = (StatusCode::NOT_FOUND, "Not Found: Session not found").into_response();
    r.headers_mut().remove(header::CONTENT_TYPE);
    r
}

pub async fn mcp_auth(State(state): State<AppState>, mut req: Request, next: Next) -> Response {
    let headers = req.headers();
    if let Some(host) = header_str(headers, header::HOST) {
        let host = host.to_ascii_lowercase();
        if !state.allowed_hosts.contains(&host) {
            return forbidden("Host header is not allowed");
        }
    }
    if let Some(origin) = header_str(headers, header::ORIGIN) {
        let origin = origin.trim_end_matches('/').to_ascii_lowercase();
        if !state.allowed_origins.contains(&origin) {
            return forbidden("Origin is not allowed");
        }
    }
    let resource_metadata = state.settings.authorization_server.as_ref().map(|_| {
        format!(
            "{}/.well-known/oauth-protected-resource",
            state.settings.public_url.trim_end_matches('/')
        )
    });
    let Some(token) = bearer(headers).filter(|t| !t.is_empty()) else {
        state.metrics.auth_failures.with_label_values(&["missing"]).inc();
        return AuthError::Missing.into_response_with(resource_metadata.as_deref());
    };
    let session = header_str(headers, SESSION_HEADER).map(str::to_owned);
    // rmcp's session ids are UUIDs; anything unlike a session id is simply
    // unknown (and must not reach the replay table).
    if session
        .as_deref()
        .is_some_and(|s| s.is_empty() || s.len() > 128 || !s.bytes().all(|b| b.is_ascii_graphic()))
    {
        return session_not_found(req, state.settings.body_limit_bytes).await;
    }
    let ctx = RequestContext {
        session_id: session.as_deref(),
    };
    let (principal, pending) = match state.auth.authenticate(token, ctx).await {
        Ok(r) => r,
        Err(e) => return e.into_response_with(resource_metadata.as_deref()),
    };
    let is_delete = req.method() == http::Method::DELETE;
    if let Some(sid) = &session {
        match state.session_owners.0.get(sid).await {
            Some(owner) if owner.0 == principal.kind && owner.1 == principal.subject => {}
            Some(_) => return session_not_found(req, state.settings.body_limit_bytes).await,
            // rmcp answers DELETE of an unknown session with 202; the spec
            // wants 404, as for any other request on it.
            None if is_delete => return session_not_found(req, state.settings.body_limit_bytes).await,
            // Unknown to this replica: rmcp answers 404 itself.
            None => {}
        }
    }
    let owner = Arc::new((principal.kind, principal.subject.clone()));
    req.extensions_mut().insert::<Principal>(principal);
    let mut resp = next.run(req).await;
    if is_delete {
        if let Some(sid) = &session {
            if resp.status().is_success() {
                state.session_owners.0.invalidate(sid).await;
                // Terminated: nothing to send back (clients expect 200 or 204).
                *resp.status_mut() = StatusCode::NO_CONTENT;
            }
        }
    }
    if session.is_none() {
        if let Some(new_sid) = header_str(resp.headers(), SESSION_HEADER).map(str::to_owned) {
            state.session_owners.0.insert(new_sid.clone(), owner).await;
            if let Some(p) = pending {
                if let Err(e) = state.auth.bind_session(&p, &new_sid).await {
                    // The jti stays consumed without a session: later uses are
                    // refused as replays (fail closed).
                    tracing::warn!(?e, "could not bind per-turn jti to its session");
                }
            }
        }
    }
    resp
}
