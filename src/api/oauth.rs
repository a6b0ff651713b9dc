//! The embedded authorization server's HTTP surface (issue 48): RFC 8414
//! metadata, RFC 7591 registration, the authorization endpoint (which hands
//! the person to the console's consent page), the token endpoint and RFC
//! 7009 revocation. The workflows are in `service::oauth`; this only reads
//! requests and renders answers, every refusal as RFC 6749's JSON.

use std::collections::HashMap;

use axum::{
    body::Bytes,
    extract::{Query, Request, State},
    http::{header, HeaderValue, Method, StatusCode},
    middleware,
    response::{IntoResponse, Redirect, Response},
    routing::{get, post},
    Json, Router,
};
use serde_json::json;

use crate::service::oauth::{self as service, AuthorizeRefusal, Issuer, OAuthError};
use crate::state::AppState;

/// Largest registration or token request read.
const FORM_LIMIT: usize = 64 * 1024;

pub fn routes() -> Router<AppState> {
    Router::new()
        .route("/.well-known/oauth-authorization-server", get(metadata))
        .route("/.well-known/oauth-authorization-server/{*rest}", get(metadata))
        .route("/.well-known/openid-configuration", get(metadata))
        .route("/.well-known/openid-configuration/{*rest}", get(metadata))
        .route("/oauth/register", post(register))
        .route("/oauth/authorize", get(authorize))
        .route("/oauth/token", post(token))
        .route("/oauth/revoke", post(revoke))
        .layer(middleware::from_fn(cross_origin))
}

/// The embedded server's issuer; None when it is off (then `off()`).
fn issuer(state: &AppState) -> Option<Issuer> {
    state
        .settings
        .oauth_issuer()
        .map(|_| Issuer::new(&state.settings.public_url))
}

/// The 404 of a deployment without the embedded server.
fn off() -> Response {
    crate::error::ApiError::NotFound("no authorization server is configured".into()).into_response()
}

/// Browser-based MCP clients call these endpoints from their own origin.
/// None of them reads a cookie, so any origin may (the consent page, under
/// `/admin`, stays same-origin).
async fn cross_origin(req: Request, next: middleware::Next) -> Response {
    let preflight = req.method() == Method::OPTIONS;
    let mut resp = if preflight {
        StatusCode::NO_CONTENT.into_response()
    } else {
        next.run(req).await
    };
    let h = resp.headers_mut();
    h.insert(header::ACCESS_CONTROL_ALLOW_ORIGIN, HeaderValue::from_static("*"));
    if preflight {
        h.insert(
            header::ACCESS_CONTROL_ALLOW_METHODS,
            HeaderValue::from_static("GET, POST, OPTIONS"),
        );
        h.insert(
            header::ACCESS_CONTROL_ALLOW_HEADERS,
            HeaderValue::from_static("Content-Type, Authorization, MCP-Protocol-Version"),
        );
        h.insert(header::ACCESS_CONTROL_MAX_AGE, HeaderValue::from_static("600"));
    }
    resp
}

/// An RFC 6749 §5.2 error answer (401 for `invalid_client`, 503 when a
/// store did not answer), never cached.
pub fn error_response(e: &OAuthError) -> Response {
    let status = match e {
        OAuthError::InvalidClient(_) => StatusCode::UNAUTHORIZED,
        OAuthError::RateLimited(_) => StatusCode::TOO_MANY_REQUESTS,
        OAuthError::Store(err) => {
            tracing::error!(error = %err, "oauth: store error");
            StatusCode::SERVICE_UNAVAILABLE
        }
        _ => StatusCode::BAD_REQUEST,
    };
    let body = match e {
        OAuthError::Store(_) => json!({"error": e.code(), "error_description": "The store did not answer; retry."}),
        _ => json!({"error": e.code(), "error_description": e.to_string()}),
    };
    let mut r = no_store((status, Json(body)).into_response());
    if let OAuthError::RateLimited(secs) = e {
        if let Ok(v) = HeaderValue::from_str(&secs.to_string()) {
            r.headers_mut().insert(header::RETRY_AFTER, v);
        }
    }
    r
}

/// A refusal shown to the person at `/oauth/authorize` (never a redirect):
/// a page when a browser asks for HTML — the person is the one reading it —
/// else RFC 6749's JSON. Same status either way; the page cannot be framed.
fn shown(e: &OAuthError, wants_html: bool) -> Response {
    let json = error_response(e);
    if !wants_html {
        return json;
    }
    let text = match e {
        OAuthError::Store(_) => "The store did not answer; retry.".to_owned(),
        _ => e.to_string(),
    };
    let page = crate::admin::view::bare(
        "This sign-in cannot go on",
        &format!("The MCP client's request was refused ({}): {text}", e.code()),
    );
    let mut r = no_store((json.status(), page).into_response());
    let h = r.headers_mut();
    for (k, v) in json.headers() {
        if k == header::RETRY_AFTER {
            h.insert(k.clone(), v.clone());
        }
    }
    h.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    h.insert(header::X_CONTENT_TYPE_OPTIONS, HeaderValue::from_static("nosniff"));
    h.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static("default-src 'none'; style-src 'self'; frame-ancestors 'none'; base-uri 'none'"),
    );
    r
}

fn no_store(mut r: Response) -> Response {
    let h = r.headers_mut();
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    h.insert(header::PRAGMA, HeaderValue::from_static("no-cache"));
    r
}

fn count(state: &AppState, step: &str, outcome: &str) {
    state.metrics.oauth_flows.with_label_values(&[step, outcome]).inc();
}

/// GET /.well-known/oauth-authorization-server (and the OpenID path).
async fn metadata(State(state): State<AppState>) -> Response {
    match issuer(&state) {
        Some(i) => Json(i.metadata()).into_response(),
        None => off(),
    }
}

/// POST /oauth/register (RFC 7591): rate-limited per client address,
/// audited. Public clients only (`token_endpoint_auth_method: none`).
async fn register(State(state): State<AppState>, req: Request) -> Response {
    let Some(issuer) = issuer(&state) else {
        return off();
    };
    let (parts, body) = req.into_parts();
    let address = crate::auth::basic::client_address(&parts);
    if let Err(l) = state.oauth_registrations.request(&format!("ip:{address}"), None) {
        count(&state, "register", "rate_limited");
        return crate::error::ApiError::RateLimited {
            retry_after_secs: l.retry_after_secs(),
            message: "Too many client registrations from your address; retry later.".into(),
        }
        .into_response();
    }
    let Ok(bytes) = axum::body::to_bytes(body, FORM_LIMIT).await else {
        count(&state, "register", "invalid_client_metadata");
        return error_response(&OAuthError::InvalidClientMetadata(
            "the registration is too large".into(),
        ));
    };
    let Ok(request) = serde_json::from_slice::<serde_json::Value>(&bytes) else {
        count(&state, "register", "invalid_client_metadata");
        return error_response(&OAuthError::InvalidClientMetadata(
            "the registration is not JSON".into(),
        ));
    };
    match service::register(&state.pg, &issuer, &format!("oauth:{address}"), "dcr", &request).await {
        Ok(answer) => {
            count(&state, "register", "ok");
            tracing::info!(client_id = ?answer["client_id"], "oauth: client registered");
            no_store((StatusCode::CREATED, Json(answer)).into_response())
        }
        Err(e) => {
            count(&state, "register", e.code());
            error_response(&e)
        }
    }
}

/// GET /oauth/authorize: checks the request, keeps it, and sends the
/// browser to the console's consent page (where the console's cookies
/// are; the person signs in there first when they have to).
///
/// A `client_id` that is an https URL is a Client ID Metadata Document
/// (`service::oauth::cimd`): an unusable one is shown, never redirected.
async fn authorize(State(state): State<AppState>, req: Request) -> Response {
    let Some(issuer) = issuer(&state) else {
        return off();
    };
    let (parts, _) = req.into_parts();
    let address = crate::auth::basic::client_address(&parts);
    let wants_html = parts
        .headers
        .get(header::ACCEPT)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|a| a.contains("text/html"));
    let Ok(Query(q)) = Query::<HashMap<String, String>>::try_from_uri(&parts.uri) else {
        count(&state, "authorize", "invalid_request");
        return shown(&OAuthError::InvalidRequest("the query is malformed".into()), wants_html);
    };
    let take = |k: &str| q.get(k).cloned();
    let query = service::AuthorizeQuery {
        response_type: take("response_type"),
        client_id: take("client_id"),
        redirect_uri: take("redirect_uri"),
        state: take("state"),
        scope: take("scope"),
        code_challenge: take("code_challenge"),
        code_challenge_method: take("code_challenge_method"),
        resource: take("resource"),
    };
    match service::authorize(&state.pg, &issuer, &state.oauth_documents, &address, &query).await {
        Ok(id) => {
            count(&state, "authorize", "ok");
            Redirect::to(&format!("/admin/oauth/consent?request={id}")).into_response()
        }
        Err(refusal) => {
            count(&state, "authorize", refusal.error().code());
            match refusal {
                AuthorizeRefusal::Shown(e) => shown(&e, wants_html),
                AuthorizeRefusal::Redirect { to, .. } => Redirect::to(&to).into_response(),
            }
        }
    }
}

/// The parameters of a form body; a parameter sent twice is refused
/// (RFC 6749 §3.2).
fn form_params(body: &[u8]) -> Result<HashMap<String, String>, OAuthError> {
    let mut out = HashMap::new();
    for (k, v) in form_urlencoded::parse(body) {
        if out.insert(k.clone().into_owned(), v.into_owned()).is_some() {
            return Err(OAuthError::InvalidRequest(format!("{k} is sent more than once")));
        }
    }
    Ok(out)
}

/// The body of a token or revocation request: a form, read whole.
async fn read_form(headers: &axum::http::HeaderMap, body: Bytes) -> Result<HashMap<String, String>, OAuthError> {
    let form = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.to_ascii_lowercase().starts_with("application/x-www-form-urlencoded"));
    if !form {
        return Err(OAuthError::InvalidRequest(
            "the body must be application/x-www-form-urlencoded".into(),
        ));
    }
    form_params(&body)
}

/// POST /oauth/token: `authorization_code` (with its `code_verifier`) or
/// `refresh_token` (rotated; a used one revokes the grant).
async fn token(State(state): State<AppState>, req: Request) -> Response {
    let Some(issuer) = issuer(&state) else {
        return off();
    };
    let (parts, body) = req.into_parts();
    let address = crate::auth::basic::client_address(&parts);
    let Ok(body) = axum::body::to_bytes(body, FORM_LIMIT).await else {
        count(&state, "token", "invalid_request");
        return error_response(&OAuthError::InvalidRequest("the token request is too large".into()));
    };
    let mut p = match read_form(&parts.headers, body).await {
        Ok(p) => p,
        Err(e) => {
            count(&state, "token", e.code());
            return error_response(&e);
        }
    };
    let form = service::TokenForm {
        grant_type: p.remove("grant_type"),
        code: p.remove("code"),
        redirect_uri: p.remove("redirect_uri"),
        client_id: p.remove("client_id"),
        code_verifier: p.remove("code_verifier"),
        refresh_token: p.remove("refresh_token"),
        resource: p.remove("resource"),
        scope: p.remove("scope"),
    };
    let step = if form.grant_type.as_deref() == Some("refresh_token") {
        "refresh"
    } else {
        "token"
    };
    match service::token(
        &state.pg,
        &issuer,
        &state.oauth_documents,
        &address,
        state.settings.oauth_access_token_secs,
        &form,
    )
    .await
    {
        Ok(issued) => {
            count(&state, step, "ok");
            tracing::info!(grant = issued.grant_id, step, "oauth: tokens issued");
            no_store(Json(issued.body()).into_response())
        }
        Err((e, reuse)) => {
            if let Some(service::Reuse::Revoked(grant)) = reuse {
                count(&state, step, "reuse_revoked");
                tracing::warn!(
                    grant,
                    step,
                    "oauth: a spent code or refresh token came back; grant revoked"
                );
                let _ = state.changes.fence().await;
            } else {
                count(&state, step, e.code());
            }
            error_response(&e)
        }
    }
}

/// POST /oauth/revoke (RFC 7009): 200 whether or not there was anything to
/// revoke (only an unknown client is refused).
async fn revoke(State(state): State<AppState>, headers: axum::http::HeaderMap, body: Bytes) -> Response {
    if issuer(&state).is_none() {
        return off();
    }
    let p = match read_form(&headers, body).await {
        Ok(p) => p,
        Err(e) => {
            count(&state, "revoke", e.code());
            return error_response(&e);
        }
    };
    let client_id = p.get("client_id").map(String::as_str).unwrap_or("");
    let Some(token) = p.get("token") else {
        count(&state, "revoke", "invalid_request");
        return error_response(&OAuthError::InvalidRequest("token is required".into()));
    };
    match service::revoke(&state.pg, client_id, token).await {
        Ok(revoked) => {
            count(&state, "revoke", "ok");
            if revoked.is_some() {
                let _ = state.changes.fence().await;
            }
            no_store(StatusCode::OK.into_response())
        }
        Err(e) => {
            count(&state, "revoke", e.code());
            error_response(&e)
        }
    }
}
