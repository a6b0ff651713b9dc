//! The embedded OAuth 2.1 authorization server (issue 48): the workflows
//! behind `/oauth/…` and the consent page. Clients register (RFC 7591) or
//! are added by an operator; `/oauth/authorize` checks a request and keeps
//! it for the consent page; the person's answer makes a grant and a 60 s
//! single-use code; the token endpoint trades the code (PKCE S256) for an
//! access token — an opaque MCP token of the existing kind, with an expiry
//! and its grant — and a refresh token rotated on every use.
//!
//! The HTTP adapters only render what these return. Every error is one of
//! RFC 6749's codes ([`OAuthError::code`]).

use base64::Engine;
use chrono::{DateTime, Duration, Utc};
use rand::RngCore;
use serde_json::{json, Value};
use sha2::{Digest, Sha256};
use sqlx::PgPool;

use crate::auth::resolver::token_hash;
use crate::store::pg::{self, oauth as store, users};

pub mod cimd;

/// The one scope: reading the libraries picked on the consent page with
/// the tools picked there.
pub const SCOPES: [&str; 1] = ["mcp"];
/// How long an authorization code lives.
pub const CODE_SECS: i64 = 60;
/// How long a checked authorization request waits for the person's answer.
pub const REQUEST_SECS: i64 = 600;
/// The grant lifetimes the consent page offers, in days.
pub const LIFETIME_DAYS: [i64; 4] = [1, 7, 30, 90];
/// The lifetime picked when none is.
pub const DEFAULT_LIFETIME_DAYS: i64 = 30;
/// Most redirect URIs one client may register.
const MAX_REDIRECT_URIS: usize = 10;
/// Longest redirect URI accepted.
const MAX_URI_LEN: usize = 2000;

/// RFC 6749 §4.1.2.1 / §5.2, RFC 7009, RFC 7591 §3.2.2 and RFC 8707 errors.
/// `code()` is exactly the error code on the wire; the text is for the
/// `error_description` (never a secret).
#[derive(Debug, thiserror::Error)]
pub enum OAuthError {
    #[error("{0}")]
    InvalidRequest(String),
    #[error("{0}")]
    InvalidClient(String),
    #[error("{0}")]
    InvalidGrant(String),
    #[error("{0}")]
    UnauthorizedClient(String),
    #[error("grant_type must be authorization_code or refresh_token")]
    UnsupportedGrantType,
    #[error("response_type must be code")]
    UnsupportedResponseType,
    #[error("{0}")]
    InvalidScope(String),
    #[error("{0}")]
    InvalidTarget(String),
    #[error("the person declined")]
    AccessDenied,
    #[error("{0}")]
    InvalidRedirectUri(String),
    #[error("{0}")]
    InvalidClientMetadata(String),
    /// Too many client metadata document fetches from this address: retry
    /// after this many seconds.
    #[error("too many client metadata document fetches from your address; retry later")]
    RateLimited(u64),
    #[error("store unavailable")]
    Store(#[from] sqlx::Error),
}

impl OAuthError {
    pub fn code(&self) -> &'static str {
        match self {
            OAuthError::InvalidRequest(_) => "invalid_request",
            OAuthError::InvalidClient(_) => "invalid_client",
            OAuthError::InvalidGrant(_) => "invalid_grant",
            OAuthError::UnauthorizedClient(_) => "unauthorized_client",
            OAuthError::UnsupportedGrantType => "unsupported_grant_type",
            OAuthError::UnsupportedResponseType => "unsupported_response_type",
            OAuthError::InvalidScope(_) => "invalid_scope",
            OAuthError::InvalidTarget(_) => "invalid_target",
            OAuthError::AccessDenied => "access_denied",
            OAuthError::InvalidRedirectUri(_) => "invalid_redirect_uri",
            OAuthError::InvalidClientMetadata(_) => "invalid_client_metadata",
            OAuthError::RateLimited(_) | OAuthError::Store(_) => "temporarily_unavailable",
        }
    }
}

/// Where this authorization server and its protected resource live, from
/// the public URL (behind a balancer every URL is the public one).
#[derive(Clone, Debug)]
pub struct Issuer {
    /// `https://host[:port][/prefix]`, no trailing slash.
    pub base: String,
}

impl Issuer {
    pub fn new(public_url: &str) -> Issuer {
        Issuer {
            base: public_url.trim_end_matches('/').to_owned(),
        }
    }

    /// The MCP endpoint: the one `resource` tokens are issued for (RFC 8707).
    pub fn resource(&self) -> String {
        format!("{}/mcp", self.base)
    }

    /// Production: https. Every non-loopback redirect must then be https.
    pub fn production(&self) -> bool {
        self.base.to_ascii_lowercase().starts_with("https://")
    }

    /// Development: the public URL is plain http on a loopback host. Only
    /// then are client metadata documents fetched over http, from loopback.
    pub fn loopback_dev(&self) -> bool {
        reqwest::Url::parse(&self.base)
            .is_ok_and(|u| u.scheme() == "http" && is_loopback_host(u.host_str().unwrap_or("")))
    }

    /// The rules client metadata documents are fetched and checked by.
    pub fn document_rules(&self) -> cimd::Rules {
        cimd::Rules {
            dev: self.loopback_dev(),
            production: self.production(),
        }
    }

    /// Whether `resource` names this server's MCP endpoint (with or without
    /// the trailing slash Pallas configs use).
    pub fn is_our_resource(&self, resource: &str) -> bool {
        let r = resource.trim_end_matches('/');
        r == self.resource() || r.eq_ignore_ascii_case(&self.resource())
    }

    /// RFC 8414 metadata (also served at the OpenID-style path).
    pub fn metadata(&self) -> Value {
        let b = &self.base;
        json!({
            "issuer": b,
            "authorization_endpoint": format!("{b}/oauth/authorize"),
            "token_endpoint": format!("{b}/oauth/token"),
            "registration_endpoint": format!("{b}/oauth/register"),
            "revocation_endpoint": format!("{b}/oauth/revoke"),
            "response_types_supported": ["code"],
            "response_modes_supported": ["query"],
            "grant_types_supported": ["authorization_code", "refresh_token"],
            "code_challenge_methods_supported": ["S256"],
            "token_endpoint_auth_methods_supported": ["none"],
            "revocation_endpoint_auth_methods_supported": ["none"],
            "scopes_supported": SCOPES,
            "authorization_response_iss_parameter_supported": true,
            // An https client_id names its metadata document (public clients).
            "client_id_metadata_document_supported": true,
            "service_documentation": format!("{b}/.well-known/mcp/server.json"),
        })
    }
}

// ---- secrets ----

fn random_b64(n: usize) -> String {
    let mut b = vec![0u8; n];
    rand::rngs::OsRng.fill_bytes(&mut b);
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(b)
}

/// PKCE S256 (RFC 7636 §4.2): BASE64URL(SHA256(ASCII(code_verifier))).
pub fn s256(verifier: &str) -> String {
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(Sha256::digest(verifier.as_bytes()))
}

/// RFC 7636 §4.1: 43–128 characters of `[A-Za-z0-9-._~]`.
fn valid_verifier(v: &str) -> bool {
    (43..=128).contains(&v.len()) && v.bytes().all(|b| b.is_ascii_alphanumeric() || b"-._~".contains(&b))
}

/// A challenge as S256 makes it: 43 base64url characters.
fn valid_challenge(c: &str) -> bool {
    c.len() == 43 && c.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
}

/// Equal in time independent of where they differ.
fn same(a: &str, b: &str) -> bool {
    let (a, b) = (a.as_bytes(), b.as_bytes());
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

// ---- redirect URIs ----

fn is_loopback_host(host: &str) -> bool {
    matches!(host, "127.0.0.1" | "[::1]" | "::1" | "localhost")
}

/// A redirect URI a client may register: absolute, no fragment; https, or
/// http on a loopback host (RFC 8252 §7.3; any http host while the server
/// itself is plain-http development), or a private-use scheme of a native
/// app (RFC 8252 §7.1). Never a scheme that runs or reads in the browser.
pub fn check_redirect_uri(uri: &str, production: bool) -> Result<(), String> {
    if uri.is_empty() || uri.len() > MAX_URI_LEN {
        return Err(format!("a redirect URI must be 1 to {MAX_URI_LEN} characters"));
    }
    let u = reqwest::Url::parse(uri).map_err(|_| format!("{uri:?} is not an absolute URI"))?;
    if u.fragment().is_some() {
        return Err(format!("{uri:?} has a fragment (RFC 6749 §3.1.2)"));
    }
    match u.scheme() {
        "https" => Ok(()),
        "http" => {
            let host = u.host_str().unwrap_or("");
            if is_loopback_host(host) || !production {
                Ok(())
            } else {
                Err(format!("{uri:?}: http is only for loopback redirects; use https"))
            }
        }
        "javascript" | "data" | "file" | "vbscript" | "about" | "blob" | "ftp" | "ws" | "wss" => {
            Err(format!("{uri:?}: the {} scheme cannot be a redirect", u.scheme()))
        }
        _ => Ok(()),
    }
}

/// Whether `requested` is one of `registered`: exactly, except that a
/// loopback http redirect's port may differ (RFC 8252 §7.3: native apps
/// get a port from the system when they start).
pub fn redirect_matches(registered: &[String], requested: &str) -> bool {
    if registered.iter().any(|r| r == requested) {
        return true;
    }
    let Ok(want) = reqwest::Url::parse(requested) else {
        return false;
    };
    if want.scheme() != "http" || !is_loopback_host(want.host_str().unwrap_or("")) {
        return false;
    }
    registered.iter().any(|r| {
        reqwest::Url::parse(r).is_ok_and(|have| {
            have.scheme() == "http"
                && have.host_str() == want.host_str()
                && have.path() == want.path()
                && have.query() == want.query()
                && have.username() == want.username()
                && have.password() == want.password()
                && want.fragment().is_none()
        })
    })
}

/// `redirect_uri` with the answer's parameters appended (existing query
/// kept, RFC 6749 §3.1.2).
pub fn redirect_with(redirect_uri: &str, params: &[(&str, &str)]) -> String {
    match reqwest::Url::parse(redirect_uri) {
        Ok(mut u) => {
            u.set_fragment(None);
            {
                let mut q = u.query_pairs_mut();
                for (k, v) in params {
                    q.append_pair(k, v);
                }
            }
            u.to_string()
        }
        Err(_) => redirect_uri.to_owned(),
    }
}

// ---- clients ----

/// What a client's metadata (an RFC 7591 registration or a client metadata
/// document) says, checked: its redirect URIs (1 to 10, each one
/// registration accepts), grant and response types (authorization code,
/// refresh), its name (control characters dropped, 200 characters), and the
/// optional descriptive URIs kept.
pub(crate) struct ClientFields {
    pub redirect_uris: Vec<String>,
    pub grant_types: Vec<String>,
    pub client_name: String,
    /// `client_uri`, `logo_uri`, `software_id`, `software_version` when given.
    pub extra: Vec<(&'static str, Value)>,
}

pub(crate) fn client_fields(
    obj: &serde_json::Map<String, Value>,
    production: bool,
) -> Result<ClientFields, OAuthError> {
    let meta = |m: &str| OAuthError::InvalidClientMetadata(m.to_owned());
    let uris: Vec<String> = match obj.get("redirect_uris") {
        Some(Value::Array(a)) => a
            .iter()
            .map(|v| v.as_str().map(str::to_owned))
            .collect::<Option<_>>()
            .ok_or_else(|| OAuthError::InvalidRedirectUri("redirect_uris must be strings".into()))?,
        _ => {
            return Err(OAuthError::InvalidRedirectUri(
                "redirect_uris is required (a list)".into(),
            ))
        }
    };
    if uris.is_empty() || uris.len() > MAX_REDIRECT_URIS {
        return Err(OAuthError::InvalidRedirectUri(format!(
            "redirect_uris must hold 1 to {MAX_REDIRECT_URIS} URIs"
        )));
    }
    for u in &uris {
        check_redirect_uri(u, production).map_err(OAuthError::InvalidRedirectUri)?;
    }
    let str_list = |k: &str, default: &[&str]| -> Result<Vec<String>, OAuthError> {
        match obj.get(k) {
            None | Some(Value::Null) => Ok(default.iter().map(|s| (*s).to_owned()).collect()),
            Some(Value::Array(a)) => a
                .iter()
                .map(|v| v.as_str().map(str::to_owned))
                .collect::<Option<_>>()
                .ok_or_else(|| meta(&format!("{k} must be a list of strings"))),
            _ => Err(meta(&format!("{k} must be a list of strings"))),
        }
    };
    let grant_types = str_list("grant_types", &["authorization_code", "refresh_token"])?;
    if let Some(g) = grant_types
        .iter()
        .find(|g| !matches!(g.as_str(), "authorization_code" | "refresh_token"))
    {
        return Err(meta(&format!(
            "grant type {g:?} is not offered (authorization_code, refresh_token)"
        )));
    }
    let response_types = str_list("response_types", &["code"])?;
    if response_types.iter().any(|r| r != "code") {
        return Err(meta("response_types must be [\"code\"]"));
    }
    let name: String = obj
        .get("client_name")
        .and_then(Value::as_str)
        .unwrap_or("")
        .chars()
        .filter(|c| !c.is_control())
        .take(200)
        .collect();
    let extra = ["client_uri", "logo_uri", "software_id", "software_version"]
        .into_iter()
        .filter_map(|k| {
            obj.get(k)
                .and_then(Value::as_str)
                .filter(|v| v.len() <= MAX_URI_LEN)
                .map(|v| (k, json!(v)))
        })
        .collect();
    Ok(ClientFields {
        redirect_uris: uris,
        grant_types,
        client_name: name,
        extra,
    })
}

/// Registers a client (RFC 7591 dynamic registration, or an operator's
/// `oauth client add`): public, authorization code with PKCE, refresh.
/// Returns the registration as RFC 7591 §3.2.1 answers it.
pub async fn register(
    pg: &PgPool,
    issuer: &Issuer,
    actor: &str,
    source: &str,
    request: &Value,
) -> Result<Value, OAuthError> {
    let meta = |m: &str| OAuthError::InvalidClientMetadata(m.to_owned());
    let obj = request
        .as_object()
        .ok_or_else(|| meta("the registration must be a JSON object"))?;
    let ClientFields {
        redirect_uris: uris,
        grant_types,
        client_name: name,
        extra,
    } = client_fields(obj, issuer.production())?;
    // Public clients only: PKCE protects the code, and a secret a native
    // app carries is no secret (OAuth 2.1 §2.1). A client that asked for a
    // secret method is told, in the answer, that it has none.
    let client_id = format!("mcl_{}", random_b64(18));
    let now = Utc::now();
    let mut answer = json!({
        "client_id": client_id,
        "client_id_issued_at": now.timestamp(),
        "client_name": name,
        "redirect_uris": uris,
        "grant_types": grant_types,
        "response_types": ["code"],
        "token_endpoint_auth_method": "none",
        "scope": SCOPES.join(" "),
    });
    for (k, v) in extra {
        answer[k] = v;
    }
    let mut tx = pg.begin().await?;
    store::insert_client(&mut *tx, &client_id, &name, &uris, source, &answer).await?;
    pg::audit(
        &mut tx,
        actor,
        "oauth_client_registered",
        &client_id,
        json!({"client_name": name, "redirect_uris": uris, "source": source}),
    )
    .await?;
    tx.commit().await?;
    Ok(answer)
}

/// Removes a client with its grants and tokens (CLI).
pub async fn remove_client(pg: &PgPool, actor: &str, client_id: &str) -> Result<bool, OAuthError> {
    let mut tx = pg.begin().await?;
    if !store::delete_client(&mut *tx, client_id).await? {
        return Ok(false);
    }
    pg::audit(&mut tx, actor, "oauth_client_removed", client_id, json!({})).await?;
    tx.commit().await?;
    Ok(true)
}

// ---- authorization ----

/// The query of `/oauth/authorize`, as sent.
#[derive(Debug, Default, serde::Deserialize)]
pub struct AuthorizeQuery {
    pub response_type: Option<String>,
    pub client_id: Option<String>,
    pub redirect_uri: Option<String>,
    pub state: Option<String>,
    pub scope: Option<String>,
    pub code_challenge: Option<String>,
    pub code_challenge_method: Option<String>,
    pub resource: Option<String>,
}

/// Why an authorization request is refused: before the client and its
/// redirect are known good, the person is told (never redirected, RFC 6749
/// §4.1.2.1); after, the client is, through its redirect.
#[derive(Debug)]
pub enum AuthorizeRefusal {
    Shown(OAuthError),
    Redirect { to: String, error: OAuthError },
}

impl AuthorizeRefusal {
    pub fn error(&self) -> &OAuthError {
        match self {
            AuthorizeRefusal::Shown(e) | AuthorizeRefusal::Redirect { error: e, .. } => e,
        }
    }
}

/// The redirect of a refused or declined request: error, description,
/// state and `iss` (RFC 9207).
pub fn error_redirect(issuer: &Issuer, redirect_uri: &str, state: Option<&str>, e: &OAuthError) -> String {
    let desc = e.to_string();
    let mut p: Vec<(&str, &str)> = vec![("error", e.code()), ("error_description", &desc)];
    if let Some(s) = state {
        p.push(("state", s));
    }
    p.push(("iss", &issuer.base));
    redirect_with(redirect_uri, &p)
}

/// Checks an authorization request and keeps it for the consent page;
/// returns the request's id (its only copy: the store keeps its hash).
///
/// A `client_id` that is a URL names a client metadata document: fetched
/// (or taken from the cache) and checked before anything else, and every
/// such request is an audit event. `requester` is the address the request
/// came from.
pub async fn authorize(
    pg: &PgPool,
    issuer: &Issuer,
    documents: &cimd::Documents,
    requester: &str,
    q: &AuthorizeQuery,
) -> Result<String, AuthorizeRefusal> {
    use AuthorizeRefusal::{Redirect, Shown};
    let client_id = q
        .client_id
        .as_deref()
        .filter(|c| !c.is_empty())
        .ok_or_else(|| Shown(OAuthError::InvalidRequest("client_id is required".into())))?;
    let client = client(pg, issuer, documents, requester, client_id, true)
        .await
        .map_err(Shown)?;
    let redirect_uri = match q.redirect_uri.as_deref() {
        Some(r) if redirect_matches(&client.redirect_uris, r) => r.to_owned(),
        Some(_) => {
            return Err(Shown(OAuthError::InvalidRequest(
                "redirect_uri is not one this client registered".into(),
            )))
        }
        // OAuth 2.1 §4.1.1: optional only when the client registered one.
        None if client.redirect_uris.len() == 1 => client.redirect_uris[0].clone(),
        None => return Err(Shown(OAuthError::InvalidRequest("redirect_uri is required".into()))),
    };
    let state = q.state.as_deref().filter(|s| !s.is_empty());
    // Errors go back to the client's redirect (RFC 6749 §4.1.2.1) — except
    // for a self-registered (or self-described) client whose redirect is a web address: anyone
    // may register one, so redirecting its malformed requests unasked would
    // make this server an open redirector (RFC 9700 §4.11.2); those are
    // shown to the person instead. Loopback and native-app redirects land
    // on the person's own machine.
    let web_redirect = reqwest::Url::parse(&redirect_uri)
        .is_ok_and(|u| matches!(u.scheme(), "http" | "https") && !is_loopback_host(u.host_str().unwrap_or("")));
    let shown_only = matches!(client.source.as_str(), "dcr" | "cimd") && web_redirect;
    let refuse = |error: OAuthError| {
        if shown_only {
            return Shown(error);
        }
        Redirect {
            to: error_redirect(issuer, &redirect_uri, state, &error),
            error,
        }
    };
    if state.is_some_and(|s| s.len() > 1000) {
        return Err(refuse(OAuthError::InvalidRequest(
            "state is longer than 1000 characters".into(),
        )));
    }
    if q.response_type.as_deref() != Some("code") {
        return Err(refuse(OAuthError::UnsupportedResponseType));
    }
    let Some(challenge) = q.code_challenge.as_deref().filter(|c| !c.is_empty()) else {
        return Err(refuse(OAuthError::InvalidRequest(
            "code_challenge is required (PKCE, S256)".into(),
        )));
    };
    match q.code_challenge_method.as_deref() {
        Some("S256") => {}
        Some(m) => {
            return Err(refuse(OAuthError::InvalidRequest(format!(
                "code_challenge_method {:?} is not supported; use S256",
                m.chars().take(20).collect::<String>()
            ))))
        }
        None => {
            return Err(refuse(OAuthError::InvalidRequest(
                "code_challenge_method is required; use S256".into(),
            )))
        }
    }
    if !valid_challenge(challenge) {
        return Err(refuse(OAuthError::InvalidRequest(
            "code_challenge is not an S256 challenge".into(),
        )));
    }
    let scope = check_scope(q.scope.as_deref()).map_err(refuse)?;
    let resource = match q.resource.as_deref() {
        Some(r) if issuer.is_our_resource(r) => issuer.resource(),
        Some(_) => {
            return Err(refuse(OAuthError::InvalidTarget(format!(
                "resource must be this server's MCP endpoint, {}",
                issuer.resource()
            ))))
        }
        None => {
            return Err(refuse(OAuthError::InvalidTarget(format!(
                "resource is required: this server's MCP endpoint, {}",
                issuer.resource()
            ))))
        }
    };
    let id = random_b64(32);
    let pending = store::PendingRequest {
        client_id: client.client_id,
        redirect_uri,
        code_challenge: challenge.to_owned(),
        state: state.map(str::to_owned),
        scope,
        resource,
        expires_at: Utc::now() + Duration::seconds(REQUEST_SECS),
    };
    store::insert_request(pg, &token_hash(&id), &pending)
        .await
        .map_err(|e| Shown(e.into()))?;
    Ok(id)
}

/// The client a `client_id` names: registered here (`mcl_…`), or a client
/// metadata document, fetched or cached, checked, and kept (or refreshed)
/// as a `cimd` client so grants and codes can name it. `audit`: the use is
/// an audit event (every authorization request naming a document).
pub async fn client(
    pg: &PgPool,
    issuer: &Issuer,
    documents: &cimd::Documents,
    requester: &str,
    client_id: &str,
    audit: bool,
) -> Result<store::Client, OAuthError> {
    if !cimd::is_document_url(client_id) {
        return store::client(pg, client_id)
            .await?
            .ok_or_else(|| OAuthError::InvalidClient("unknown client_id".into()));
    }
    let (doc, fetched) = documents
        .get(client_id, issuer.document_rules(), requester)
        .await
        .map_err(|r| match r {
            cimd::Refusal::Invalid(why) => {
                OAuthError::InvalidClient(format!("the client metadata document cannot be used: {why}"))
            }
            cimd::Refusal::RateLimited(secs) => OAuthError::RateLimited(secs),
        })?;
    let mut tx = pg.begin().await?;
    let Some(client) = store::upsert_document_client(
        &mut *tx,
        &doc.client_id,
        &doc.client_name,
        &doc.redirect_uris,
        &doc.metadata,
    )
    .await?
    else {
        return Err(OAuthError::InvalidClient(
            "client_id names a client that is not a metadata document".into(),
        ));
    };
    if audit {
        pg::audit(
            &mut tx,
            &format!("oauth:{requester}"),
            "oauth_client_metadata_used",
            &doc.client_id,
            json!({"client_name": doc.client_name, "redirect_uris": doc.redirect_uris,
                   "document_host": doc.host, "fetched": fetched}),
        )
        .await?;
    }
    tx.commit().await?;
    Ok(client)
}

/// The scope asked for: none, or only scopes this server has.
fn check_scope(scope: Option<&str>) -> Result<String, OAuthError> {
    let asked: Vec<&str> = scope.unwrap_or("").split_ascii_whitespace().collect();
    if let Some(s) = asked.iter().find(|s| !SCOPES.contains(s)) {
        return Err(OAuthError::InvalidScope(format!(
            "unknown scope {:?}; the scopes are: {}",
            s.chars().take(40).collect::<String>(),
            SCOPES.join(" ")
        )));
    }
    Ok(SCOPES.join(" "))
}

/// What the consent page shows for a pending request.
pub struct ConsentView {
    pub request: store::PendingRequest,
    pub client: store::Client,
}

/// The pending request a consent page names, with its client; None when
/// unknown or expired.
pub async fn pending(pg: &PgPool, request_id: &str) -> Result<Option<ConsentView>, OAuthError> {
    if request_id.is_empty() || request_id.len() > 100 {
        return Ok(None);
    }
    let Some(request) = store::request(pg, &token_hash(request_id)).await? else {
        return Ok(None);
    };
    let Some(client) = store::client(pg, &request.client_id).await? else {
        return Ok(None);
    };
    Ok(Some(ConsentView { request, client }))
}

/// The person's answer on the consent page.
pub struct Consent<'a> {
    pub approve: bool,
    pub libraries: &'a [String],
    /// The tools picked (each within the person's ceiling).
    pub tools: &'a [String],
    pub lifetime_days: i64,
    /// The server's tools (passed down: this layer sits below `mcp`).
    pub known_tools: &'a [&'a str],
}

/// Answers a pending request (once): declined, or a grant over what the
/// person picked (only libraries they own or manage, only tools within
/// their ceiling) and a code. Returns where to send the browser; None when
/// the request is unknown, expired or already answered.
pub async fn answer(
    pg: &PgPool,
    issuer: &Issuer,
    request_id: &str,
    user_id: i64,
    username: &str,
    consent: &Consent<'_>,
) -> Result<Option<(String, Result<i64, OAuthError>)>, OAuthError> {
    if request_id.is_empty() || request_id.len() > 100 {
        return Ok(None);
    }
    let mut tx = pg.begin().await?;
    let Some(r) = store::take_request(&mut *tx, &token_hash(request_id)).await? else {
        return Ok(None);
    };
    let refused = |e: &OAuthError| error_redirect(issuer, &r.redirect_uri, r.state.as_deref(), e);
    if !consent.approve {
        tx.commit().await?;
        let e = OAuthError::AccessDenied;
        return Ok(Some((refused(&e), Err(e))));
    }
    match checked_pick(&mut tx, user_id, username, consent).await? {
        Err(e) => {
            tx.commit().await?;
            Ok(Some((refused(&e), Err(e))))
        }
        Ok((libs, tools)) => {
            let expires_at = Utc::now() + Duration::days(consent.lifetime_days);
            let grant_id =
                store::insert_grant(&mut tx, &r.client_id, user_id, &libs, tools.as_deref(), expires_at).await?;
            let code = random_b64(32);
            store::insert_code(
                &mut tx,
                &token_hash(&code),
                grant_id,
                &r.redirect_uri,
                &r.code_challenge,
                &r.resource,
                Utc::now() + Duration::seconds(CODE_SECS),
            )
            .await?;
            pg::audit(
                &mut tx,
                &format!("admin:{username}"),
                "oauth_grant_created",
                &grant_id.to_string(),
                json!({"client_id": r.client_id, "user": username, "libraries": libs, "tools": tools,
                       "expires_at": expires_at}),
            )
            .await?;
            tx.commit().await?;
            let mut p: Vec<(&str, &str)> = vec![("code", &code)];
            if let Some(s) = r.state.as_deref() {
                p.push(("state", s));
            }
            p.push(("iss", &issuer.base));
            Ok(Some((redirect_with(&r.redirect_uri, &p), Ok(grant_id))))
        }
    }
}

/// The libraries (de-duplicated, order kept; each one the person owns or
/// manages) and tools (each known and within the person's ceiling; all of
/// them = no allowlist) of a consent, or the `invalid_scope` it is.
async fn checked_pick(
    tx: &mut sqlx::PgConnection,
    user_id: i64,
    username: &str,
    consent: &Consent<'_>,
) -> Result<Result<(Vec<String>, Option<Vec<String>>), OAuthError>, sqlx::Error> {
    if !LIFETIME_DAYS.contains(&consent.lifetime_days) {
        return Ok(Err(OAuthError::InvalidRequest(
            "the lifetime is not one offered".into(),
        )));
    }
    let mut libs: Vec<String> = Vec::new();
    for l in consent.libraries {
        if crate::ids::LibraryUid::parse("library", l).is_err() || libs.len() >= super::tokens::MAX_TOKEN_LIBRARIES {
            return Ok(Err(OAuthError::InvalidScope(
                "a library picked is not a library uid".into(),
            )));
        }
        if !libs.contains(l) {
            libs.push(l.clone());
        }
    }
    let refused = users::unscopable_libraries(&mut *tx, user_id, &libs).await?;
    if !refused.is_empty() {
        return Ok(Err(OAuthError::InvalidScope(format!(
            "{username} is not owner or manager of: {}",
            refused.join(", ")
        ))));
    }
    let ceiling = tool_ceiling(&mut *tx, user_id, consent.known_tools).await?;
    let mut tools: Vec<String> = Vec::new();
    for t in consent.tools {
        if !ceiling.iter().any(|c| c == t) {
            return Ok(Err(OAuthError::InvalidScope(format!(
                "tool {:?} is not one {username} may grant",
                t.chars().take(40).collect::<String>()
            ))));
        }
        if !tools.contains(t) {
            tools.push(t.clone());
        }
    }
    let all = consent.known_tools.iter().all(|t| tools.iter().any(|p| p == t));
    Ok(Ok((libs, (!all).then_some(tools))))
}

/// The tools a person may grant: the server's (`known`), within their ceiling.
pub async fn tool_ceiling<'e>(
    ex: impl sqlx::PgExecutor<'e>,
    user_id: i64,
    known: &[&str],
) -> Result<Vec<String>, sqlx::Error> {
    let max: Option<Vec<String>> = sqlx::query_scalar("SELECT max_tools FROM users WHERE id = $1")
        .bind(user_id)
        .fetch_optional(ex)
        .await?
        .flatten();
    Ok(known
        .iter()
        .filter(|t| max.as_ref().is_none_or(|m| m.iter().any(|x| x == *t)))
        .map(|t| (*t).to_owned())
        .collect())
}

// ---- tokens ----

/// The form of `/oauth/token`.
#[derive(Debug, Default, serde::Deserialize)]
pub struct TokenForm {
    pub grant_type: Option<String>,
    pub code: Option<String>,
    pub redirect_uri: Option<String>,
    pub client_id: Option<String>,
    pub code_verifier: Option<String>,
    pub refresh_token: Option<String>,
    pub resource: Option<String>,
    pub scope: Option<String>,
}

/// A token answer (RFC 6749 §5.1). Never `Debug`-printed with its values.
pub struct Issued {
    pub access_token: String,
    pub refresh_token: String,
    pub expires_in: i64,
    pub grant_id: i64,
}

impl std::fmt::Debug for Issued {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Issued")
            .field("grant_id", &self.grant_id)
            .field("expires_in", &self.expires_in)
            .finish_non_exhaustive()
    }
}

impl Issued {
    pub fn body(&self) -> Value {
        json!({
            "access_token": self.access_token,
            "token_type": "Bearer",
            "expires_in": self.expires_in,
            "refresh_token": self.refresh_token,
            "scope": SCOPES.join(" "),
        })
    }
}

/// What a token exchange did, for the audit log and the metrics, besides
/// its answer.
#[derive(Debug)]
pub enum Reuse {
    /// A spent code or refresh token came back: the grant is revoked.
    Revoked(i64),
}

/// The token endpoint: a code (with its PKCE verifier) or a refresh token
/// for a new access token and refresh token.
///
/// A metadata-document client's document is checked again (from the cache
/// while it lives): a document withdrawn or broken stops the client.
pub async fn token(
    pg: &PgPool,
    issuer: &Issuer,
    documents: &cimd::Documents,
    requester: &str,
    access_secs: u64,
    form: &TokenForm,
) -> Result<Issued, (OAuthError, Option<Reuse>)> {
    let client_id = form
        .client_id
        .as_deref()
        .filter(|c| !c.is_empty())
        .ok_or((OAuthError::InvalidClient("client_id is required".into()), None))?;
    let client = client(pg, issuer, documents, requester, client_id, false)
        .await
        .map_err(|e| (e, None))?;
    if let Some(r) = form.resource.as_deref() {
        if !issuer.is_our_resource(r) {
            return Err((
                OAuthError::InvalidTarget(format!("resource must be {}", issuer.resource())),
                None,
            ));
        }
    }
    if form.scope.is_some() {
        check_scope(form.scope.as_deref()).map_err(|e| (e, None))?;
    }
    match form.grant_type.as_deref() {
        Some("authorization_code") => exchange_code(pg, &client, access_secs, form).await,
        Some("refresh_token") => refresh(pg, &client, access_secs, form).await,
        None => Err((OAuthError::InvalidRequest("grant_type is required".into()), None)),
        Some(_) => Err((OAuthError::UnsupportedGrantType, None)),
    }
}

async fn exchange_code(
    pg: &PgPool,
    client: &store::Client,
    access_secs: u64,
    form: &TokenForm,
) -> Result<Issued, (OAuthError, Option<Reuse>)> {
    let bad = |m: &str| (OAuthError::InvalidGrant(m.to_owned()), None);
    let code = form
        .code
        .as_deref()
        .filter(|c| !c.is_empty() && c.len() <= 200)
        .ok_or((OAuthError::InvalidRequest("code is required".into()), None))?;
    let Some(verifier) = form.code_verifier.as_deref().filter(|v| !v.is_empty()) else {
        return Err((
            OAuthError::InvalidRequest("code_verifier is required (PKCE)".into()),
            None,
        ));
    };
    let store_err = |e: sqlx::Error| (OAuthError::from(e), None);
    let hash = token_hash(code);
    let mut tx = pg.begin().await.map_err(store_err)?;
    let Some(c) = store::lock_code(&mut tx, &hash).await.map_err(store_err)? else {
        return Err(bad("the code is unknown"));
    };
    if c.client_id != client.client_id {
        return Err(bad("the code was issued to another client"));
    }
    if !c.grant_active {
        // Revoked (by the person, or by an earlier reuse): nothing to issue,
        // and no reuse to report.
        return Err(bad("the grant is revoked"));
    }
    if c.used_at.is_some() {
        // RFC 6749 §4.1.2: a second use revokes what the first issued.
        store::revoke_grant_for_reuse(&mut tx, c.grant_id)
            .await
            .map_err(store_err)?;
        pg::audit(
            &mut tx,
            &format!("oauth:{}", client.client_id),
            "oauth_code_reused",
            &c.grant_id.to_string(),
            json!({"client_id": client.client_id}),
        )
        .await
        .map_err(store_err)?;
        tx.commit().await.map_err(store_err)?;
        return Err((
            OAuthError::InvalidGrant("the code was already used; its grant is revoked".into()),
            Some(Reuse::Revoked(c.grant_id)),
        ));
    }
    // Spent whatever happens next: a code gets one attempt.
    store::spend_code(&mut tx, &hash).await.map_err(store_err)?;
    let outcome = if c.expires_at <= Utc::now() {
        Err(bad("the code has expired"))
    } else if form.redirect_uri.as_deref().is_some_and(|r| r != c.redirect_uri) {
        Err(bad("redirect_uri differs from the authorization request's"))
    } else if !valid_verifier(verifier) || !same(&s256(verifier), &c.code_challenge) {
        Err(bad("code_verifier does not match the code_challenge"))
    } else {
        issue(&mut tx, c.grant_id, &client.client_name, access_secs)
            .await
            .map_err(store_err)
    };
    tx.commit().await.map_err(store_err)?;
    outcome
}

async fn refresh(
    pg: &PgPool,
    client: &store::Client,
    access_secs: u64,
    form: &TokenForm,
) -> Result<Issued, (OAuthError, Option<Reuse>)> {
    let bad = |m: &str| (OAuthError::InvalidGrant(m.to_owned()), None);
    let store_err = |e: sqlx::Error| (OAuthError::from(e), None);
    let token = form
        .refresh_token
        .as_deref()
        .filter(|c| !c.is_empty() && c.len() <= 200)
        .ok_or((OAuthError::InvalidRequest("refresh_token is required".into()), None))?;
    let hash = token_hash(token);
    let mut tx = pg.begin().await.map_err(store_err)?;
    let Some(r) = store::lock_refresh(&mut tx, &hash).await.map_err(store_err)? else {
        return Err(bad("the refresh token is unknown"));
    };
    if r.client_id != client.client_id {
        return Err(bad("the refresh token was issued to another client"));
    }
    if r.used_at.is_some() {
        if r.grant_active {
            // Reuse detection (OAuth 2.1 §4.3.1): someone holds a copy.
            store::revoke_grant_for_reuse(&mut tx, r.grant_id)
                .await
                .map_err(store_err)?;
            pg::audit(
                &mut tx,
                &format!("oauth:{}", client.client_id),
                "oauth_refresh_reused",
                &r.grant_id.to_string(),
                json!({"client_id": client.client_id}),
            )
            .await
            .map_err(store_err)?;
            tx.commit().await.map_err(store_err)?;
            return Err((
                OAuthError::InvalidGrant("the refresh token was already used; its grant is revoked".into()),
                Some(Reuse::Revoked(r.grant_id)),
            ));
        }
        return Err(bad("the grant is revoked"));
    }
    if !r.grant_active {
        return Err(bad("the grant is revoked"));
    }
    if r.grant_expires_at <= Utc::now() {
        return Err(bad("the grant has expired"));
    }
    store::spend_refresh(&mut tx, &hash).await.map_err(store_err)?;
    // The new access token replaces the old: one live token per grant.
    store::retire_access_tokens(&mut tx, r.grant_id)
        .await
        .map_err(store_err)?;
    let issued = issue(&mut tx, r.grant_id, &client.client_name, access_secs)
        .await
        .map_err(store_err)?;
    tx.commit().await.map_err(store_err)?;
    Ok(issued)
}

/// A new access token (an `mcp_tokens` row over the grant's libraries and
/// tools, expiring within the grant) and a new refresh token.
async fn issue(
    tx: &mut sqlx::PgConnection,
    grant_id: i64,
    client_name: &str,
    access_secs: u64,
) -> Result<Issued, sqlx::Error> {
    let g = store::grant(&mut *tx, grant_id)
        .await?
        .ok_or(sqlx::Error::RowNotFound)?;
    // The callers hold the grant's row lock and checked it is active; a
    // revoked grant never gets a token (defence in depth).
    if !g.active {
        return Err(sqlx::Error::RowNotFound);
    }
    let access = crate::service::tokens::new_token_plaintext();
    let expires_at: DateTime<Utc> = (Utc::now() + Duration::seconds(access_secs.max(1) as i64)).min(g.expires_at);
    let name: String = format!(
        "OAuth: {}",
        if client_name.is_empty() {
            &g.client_id
        } else {
            client_name
        }
    )
    .chars()
    .take(200)
    .collect();
    store::insert_access_token(
        tx,
        &store::AccessToken {
            user_id: g.user_id,
            name: &name,
            token_hash: &token_hash(&access),
            libraries: &g.allowed_libraries.0,
            tools: g.allowed_tools.as_deref(),
            expires_at,
            grant_id,
        },
    )
    .await?;
    let refresh = format!("mnr_{}", random_b64(32));
    store::insert_refresh(tx, &token_hash(&refresh), grant_id).await?;
    Ok(Issued {
        access_token: access,
        refresh_token: refresh,
        expires_in: (expires_at - Utc::now()).num_seconds().max(1),
        grant_id,
    })
}

/// RFC 7009: revokes a refresh token (and with it the grant) or an access
/// token this client holds. Anything else is answered the same (200), so
/// the endpoint tells nothing about tokens that are not the caller's.
pub async fn revoke(pg: &PgPool, client_id: &str, token: &str) -> Result<Option<i64>, OAuthError> {
    if store::client(pg, client_id).await?.is_none() {
        return Err(OAuthError::InvalidClient("unknown client_id".into()));
    }
    if token.is_empty() || token.len() > 200 {
        return Ok(None);
    }
    let hash = token_hash(token);
    let mut tx = pg.begin().await?;
    let actor = format!("oauth:{client_id}");
    if let Some(r) = store::lock_refresh(&mut tx, &hash).await? {
        if r.client_id == client_id && r.grant_active {
            store::revoke_grant_for_reuse(&mut tx, r.grant_id).await?;
            pg::audit(
                &mut tx,
                &actor,
                "oauth_grant_revoked",
                &r.grant_id.to_string(),
                json!({"by": "client"}),
            )
            .await?;
            tx.commit().await?;
            return Ok(Some(r.grant_id));
        }
        return Ok(None);
    }
    if let Some((token_id, grant_id, owner)) = store::access_token_grant(&mut tx, &hash).await? {
        if owner == client_id {
            store::deactivate_token(&mut tx, token_id).await?;
            pg::audit(
                &mut tx,
                &actor,
                "token_revoked",
                &token_id.to_string(),
                json!({"grant": grant_id}),
            )
            .await?;
            tx.commit().await?;
            return Ok(Some(grant_id));
        }
    }
    Ok(None)
}

/// Revokes a grant (a person their own, staff or the CLI any) with its
/// audit event; every replica refuses its tokens from the next request.
pub async fn revoke_grant(
    pg: &PgPool,
    changes: &crate::auth::changes::AuthChanges,
    actor: &str,
    id: i64,
    owner: Option<&str>,
) -> Result<Option<super::Propagation>, OAuthError> {
    let mut tx = pg.begin().await?;
    if !store::revoke_grant(&mut tx, id, owner).await? {
        return Ok(None);
    }
    pg::audit(&mut tx, actor, "oauth_grant_revoked", &id.to_string(), json!({})).await?;
    tx.commit().await?;
    Ok(Some(changes.fence().await))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn s256_is_base64url_of_the_sha256_without_padding() {
        // Computed independently: base64.urlsafe_b64encode(sha256(v)).rstrip("=").
        assert_eq!(
            s256("dBjftJeZ4CVP-mJ92K1qF3hpGbmYOiN2MQaCXp7p9ZU"),
            "GfGXChH9v74k2kzah88VbgTsKyDKw11PcM3EE2tnUhI"
        );
        assert!(valid_verifier("dBjftJeZ4CVP-mJ92K1qF3hpGbmYOiN2MQaCXp7p9ZU"));
        assert!(!valid_verifier("short"));
        assert!(valid_challenge("E9Melhoa2OwvFrEMTJguCHaoeK1t8URWbuGJSstw-cM"));
    }

    #[test]
    fn redirects_match_exactly_except_a_loopback_port() {
        let reg = vec![
            "http://127.0.0.1:4000/callback".to_owned(),
            "https://app.example/cb".to_owned(),
        ];
        assert!(redirect_matches(&reg, "http://127.0.0.1:4000/callback"));
        assert!(
            redirect_matches(&reg, "http://127.0.0.1:53123/callback"),
            "RFC 8252 §7.3"
        );
        assert!(!redirect_matches(&reg, "http://127.0.0.1:53123/other"));
        assert!(
            !redirect_matches(&reg, "http://localhost:4000/callback"),
            "another host"
        );
        assert!(redirect_matches(&reg, "https://app.example/cb"));
        assert!(
            !redirect_matches(&reg, "https://app.example:8443/cb"),
            "ports vary on loopback only"
        );
        assert!(!redirect_matches(&reg, "https://app.example/cb?x=1"));
        assert!(!redirect_matches(&reg, "https://evil.example/cb"));
    }

    #[test]
    fn registered_redirects_are_https_or_loopback_in_production() {
        assert!(check_redirect_uri("https://app.example/cb", true).is_ok());
        assert!(check_redirect_uri("http://127.0.0.1/cb", true).is_ok());
        assert!(check_redirect_uri("http://[::1]:8080/cb", true).is_ok());
        assert!(check_redirect_uri("http://app.example/cb", true).is_err());
        assert!(
            check_redirect_uri("http://app.example/cb", false).is_ok(),
            "plain-http development"
        );
        assert!(
            check_redirect_uri("com.example.app:/oauth", true).is_ok(),
            "RFC 8252 §7.1"
        );
        assert!(check_redirect_uri("javascript:alert(1)", false).is_err());
        assert!(check_redirect_uri("https://app.example/cb#frag", true).is_err());
        assert!(check_redirect_uri("/relative", true).is_err());
    }

    #[test]
    fn error_redirects_carry_state_and_iss() {
        let i = Issuer::new("https://mnemosyne.example/");
        let to = error_redirect(
            &i,
            "https://app.example/cb?keep=1",
            Some("xyz"),
            &OAuthError::AccessDenied,
        );
        let u = reqwest::Url::parse(&to).unwrap();
        let q: Vec<(String, String)> = u.query_pairs().into_owned().collect();
        assert_eq!(q[0], ("keep".into(), "1".into()));
        assert!(q.contains(&("error".into(), "access_denied".into())));
        assert!(q.contains(&("state".into(), "xyz".into())));
        assert!(q.contains(&("iss".into(), "https://mnemosyne.example".into())));
    }

    #[test]
    fn the_resource_is_the_mcp_endpoint_with_or_without_its_slash() {
        let i = Issuer::new("https://m.example");
        assert!(i.is_our_resource("https://m.example/mcp"));
        assert!(i.is_our_resource("https://m.example/mcp/"));
        assert!(!i.is_our_resource("https://other.example/mcp"));
        assert!(!i.is_our_resource("https://m.example"));
    }
}
