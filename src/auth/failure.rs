//! The failure table of DESIGN §3: exact messages and metric reasons.

use axum::{
    http::{header, HeaderValue, StatusCode},
    response::{IntoResponse, Response},
    Json,
};
use serde_json::json;

/// Why a bearer was refused. `message()` is the spec's exact string.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AuthFailure {
    /// Bad signature, unknown or retired kid, malformed, bad claim or `sub`.
    InvalidToken,
    Expired,
    InvalidIssuer,
    TeamNotFound,
    StaleJti,
    TeamInactive,
    TokenNotFound,
    UserDisabled,
    Replay,
}

impl AuthFailure {
    pub fn message(self) -> &'static str {
        match self {
            AuthFailure::InvalidToken
            | AuthFailure::TeamNotFound
            | AuthFailure::StaleJti
            | AuthFailure::TokenNotFound => "Invalid MCP token.",
            AuthFailure::Expired => "Token has expired.",
            AuthFailure::InvalidIssuer => "Invalid token issuer.",
            AuthFailure::TeamInactive => "Token has been deactivated.",
            AuthFailure::UserDisabled => "User account is disabled.",
            AuthFailure::Replay => "Token replay detected.",
        }
    }

    /// The `reason` label of `mcp_auth_failures_total`.
    pub fn reason(self) -> &'static str {
        match self {
            AuthFailure::InvalidToken => "invalid_token",
            AuthFailure::Expired => "expired",
            AuthFailure::InvalidIssuer => "invalid_issuer",
            AuthFailure::TeamNotFound => "team_not_found",
            AuthFailure::StaleJti => "stale_jti",
            AuthFailure::TeamInactive => "team_inactive",
            AuthFailure::TokenNotFound => "token_not_found",
            AuthFailure::UserDisabled => "user_disabled",
            AuthFailure::Replay => "replay",
        }
    }
}

/// Resolution did not produce a principal.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AuthError {
    /// No `Authorization: Bearer` header.
    Missing,
    Refused(AuthFailure),
    /// A store did not answer: 503, never a guess (fail closed).
    Unavailable(&'static str),
    /// A valid credential on a session another credential owns: answered
    /// exactly like an unknown session (the layer does that).
    ForeignSession,
}

impl From<AuthFailure> for AuthError {
    fn from(f: AuthFailure) -> Self {
        AuthError::Refused(f)
    }
}

impl AuthError {
    /// The HTTP answer; `resource_metadata` is the RFC 9728 URL when an
    /// authorization server is configured, `scope` the scopes a token for
    /// this resource carries when this server issues them (the MCP spec's
    /// scope hint). Both follow the spec's strings, never replace them.
    pub fn into_response_with(self, resource_metadata: Option<&str>, scope: Option<&str>) -> Response {
        closing(self.response(resource_metadata, scope))
    }

    fn response(self, resource_metadata: Option<&str>, scope: Option<&str>) -> Response {
        let mut hints: Vec<String> = Vec::new();
        if let Some(u) = resource_metadata {
            hints.push(format!("resource_metadata=\"{u}\""));
        }
        if let Some(s) = scope {
            hints.push(format!("scope=\"{s}\""));
        }
        let rm: String = hints.iter().map(|h| format!(", {h}")).collect();
        match self {
            AuthError::Missing => {
                let challenge = if hints.is_empty() {
                    "Bearer".to_owned()
                } else {
                    format!("Bearer {}", hints.join(", "))
                };
                let mut r = (
                    StatusCode::UNAUTHORIZED,
                    Json(json!({"error": "invalid_request", "error_description": "Missing bearer token."})),
                )
                    .into_response();
                if let Ok(v) = HeaderValue::from_str(&challenge) {
                    r.headers_mut().insert(header::WWW_AUTHENTICATE, v);
                }
                r
            }
            AuthError::Refused(f) => {
                let msg = f.message();
                let mut r = (
                    StatusCode::UNAUTHORIZED,
                    Json(json!({"error": "invalid_token", "error_description": msg})),
                )
                    .into_response();
                let challenge = format!("Bearer error=\"invalid_token\", error_description=\"{msg}\"{rm}");
                if let Ok(v) = HeaderValue::from_str(&challenge) {
                    r.headers_mut().insert(header::WWW_AUTHENTICATE, v);
                }
                r
            }
            AuthError::Unavailable(store) => crate::error::ApiError::StoreUnavailable(store).into_response(),
            AuthError::ForeignSession => crate::error::session_not_found(),
        }
    }
}

/// Refusals are sent before the request body is read: close the connection so
/// a keep-alive client never writes its next request into an unread body.
pub fn closing(mut r: Response) -> Response {
    r.headers_mut()
        .insert(header::CONNECTION, http::HeaderValue::from_static("close"));
    r
}
