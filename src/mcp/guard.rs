//! The guard in front of `/mcp`: Host/Origin checks, bearer resolution on
//! every HTTP request, rate limits, and the binding of MCP sessions to the
//! credential that opened them (rmcp does not do this). Tool handlers read the
//! `Principal` from the request extensions; a request that fails here never
//! reaches rmcp.

use axum::{
    extract::{Request, State},
    http::{header, HeaderMap, StatusCode},
    middleware::Next,
    response::{IntoResponse, Response},
};
use rmcp::transport::streamable_http_server::session::SessionManager;
use serde_json::json;

use std::net::SocketAddr;
use std::sync::Arc;

use crate::auth::failure::{closing, AuthError};
use crate::auth::resolver::{PendingJti, RequestContext};
use crate::auth::{Authenticator, Principal};
use crate::config::Settings;
use crate::error::{session_not_found, ApiError, RpcError};
use crate::limits::RateLimits;
use crate::mcp::calls::{record_call, tool_label, Outcome};
use crate::mcp::sessions::{Opener, OwnedSessions, Refusal, SessionLimits, OPENER};
use crate::metrics::Metrics;

/// What the guard needs: one per replica, shared by every `/mcp` request.
pub struct Guard {
    pub settings: Arc<Settings>,
    pub auth: Arc<Authenticator>,
    pub metrics: Metrics,
    /// Host header values accepted (DNS-rebinding protection).
    pub allowed_hosts: Vec<String>,
    /// Origin header values accepted.
    pub allowed_origins: Vec<String>,
    /// Legacy MCP sessions with their owners (rmcp's session manager inside).
    pub sessions: Arc<OwnedSessions>,
    /// Per-principal and per-tool token buckets (in memory, per replica).
    pub limits: Arc<RateLimits>,
    /// Concurrent searches per credential.
    pub search_slots: crate::limits::search::SearchSlots,
    /// Cancelled at shutdown, once the requests in flight are answered: ends
    /// rmcp's GET event streams and session workers.
    pub streams: tokio_util::sync::CancellationToken,
    /// What bounds the reads of the shared session table made before any
    /// authentication (`before_auth`).
    pub lookups: SessionLookups,
}

/// The reads of the shared session table that a session id this replica
/// does not hold costs before the bearer is resolved (issue 54: a flood of
/// random ids from one address queued every other request's Postgres work).
/// Three bounds, cheapest first: an id found absent is remembered (no read
/// for it again: session ids are the server's, an absent one never comes
/// back); each client address (`proxies::rate_key`) gets `PER_ADDRESS` reads
/// a second (burst `BURST`), then 429 without a read; and at most
/// `IN_FLIGHT` such reads run at once on a replica (then 429 too), so they
/// never hold more than a few of the pool's connections. A legitimate client
/// reads once per session per replica (the replica then holds the session).
pub struct SessionLookups {
    absent: moka::sync::Cache<String, ()>,
    per_address: governor::DefaultKeyedRateLimiter<String>,
    in_flight: Arc<tokio::sync::Semaphore>,
}

impl SessionLookups {
    pub const PER_ADDRESS: u32 = 20;
    pub const BURST: u32 = 40;
    pub const IN_FLIGHT: usize = 4;

    fn new() -> Self {
        let quota = governor::Quota::per_second(std::num::NonZeroU32::new(Self::PER_ADDRESS).expect("non-zero"))
            .allow_burst(std::num::NonZeroU32::new(Self::BURST).expect("non-zero"));
        SessionLookups {
            absent: moka::sync::Cache::builder()
                .max_capacity(100_000)
                .time_to_live(std::time::Duration::from_secs(600))
                .build(),
            per_address: governor::RateLimiter::dashmap(quota),
            in_flight: Arc::new(tokio::sync::Semaphore::new(Self::IN_FLIGHT)),
        }
    }

    /// Forgets idle addresses' buckets.
    pub fn shrink(&self) {
        self.per_address.retain_recent();
        self.per_address.shrink_to_fit();
    }
}

impl Guard {
    pub fn new(
        settings: Arc<Settings>,
        auth: Arc<Authenticator>,
        metrics: Metrics,
        addr: SocketAddr,
        pg: sqlx::PgPool,
    ) -> Self {
        let (allowed_hosts, mut allowed_origins) = allowed_hosts_and_origins(&settings.public_url, addr);
        // MNEMOSYNE_ALLOWED_ORIGINS: browser pages of other origins (CORS).
        allowed_origins.extend(
            settings
                .allowed_origins
                .iter()
                .map(|o| o.trim_end_matches('/').to_ascii_lowercase()),
        );
        Guard {
            sessions: Arc::new(OwnedSessions::new(SessionLimits::from_settings(&settings), pg)),
            // Deployment-wide rates, shared among the replicas the auth
            // heartbeat counts.
            limits: Arc::new(RateLimits::shared(
                settings.rate_limit_per_minute,
                settings.tool_rate_limit_per_minute,
                auth.caches.live_replicas(),
            )),
            search_slots: crate::limits::search::SearchSlots::with_user_limit(
                settings.search_concurrency,
                settings.user_search_concurrency,
            ),
            streams: tokio_util::sync::CancellationToken::new(),
            lookups: SessionLookups::new(),
            settings,
            auth,
            metrics,
            allowed_hosts,
            allowed_origins,
        }
    }
}

impl Guard {
    /// Whether a request's `Origin` may call `/mcp` (and gets CORS answers).
    fn allows_origin(&self, origin: &str) -> bool {
        self.allowed_origins
            .contains(&origin.trim_end_matches('/').to_ascii_lowercase())
    }

    fn allows_host(&self, host: &str) -> bool {
        self.allowed_hosts.contains(&host.to_ascii_lowercase())
    }
}

/// Hosts and origins accepted on `/mcp`: the public URL's, plus the bound
/// loopback address itself (so a local client of the actual port works).
fn allowed_hosts_and_origins(public_url: &str, addr: SocketAddr) -> (Vec<String>, Vec<String>) {
    let mut hosts = Vec::new();
    let mut origins = Vec::new();
    if let Ok(uri) = public_url.parse::<http::Uri>() {
        if let Some(auth) = uri.authority() {
            hosts.push(auth.as_str().to_ascii_lowercase());
            hosts.push(auth.host().to_ascii_lowercase());
            let scheme = uri.scheme_str().unwrap_or("http");
            origins.push(format!("{scheme}://{}", auth.as_str().to_ascii_lowercase()));
        }
    }
    if addr.ip().is_loopback() {
        for h in ["127.0.0.1", "localhost"] {
            hosts.push(format!("{h}:{}", addr.port()));
            origins.push(format!("http://{h}:{}", addr.port()));
        }
    }
    (hosts, origins)
}

pub const SESSION_HEADER: &str = "mcp-session-id";
pub const PROTOCOL_HEADER: &str = "mcp-protocol-version";

fn header_str(h: &HeaderMap, name: impl axum::http::header::AsHeaderName) -> Option<&str> {
    h.get(name).and_then(|v| v.to_str().ok())
}

fn bearer(h: &HeaderMap) -> Option<&str> {
    let v = header_str(h, header::AUTHORIZATION)?;
    let (scheme, token) = v.split_once(' ')?;
    scheme.eq_ignore_ascii_case("bearer").then(|| token.trim())
}

/// 403 in the error table's shape (`ApiError` closes the connection too).
fn forbidden(msg: &str) -> Response {
    ApiError::Forbidden(msg.to_owned()).into_response()
}

/// A header that is present but not visible ASCII cannot be compared with an
/// allow-list: refuse it rather than treat it as absent.
enum Header<'a> {
    Absent,
    Value(&'a str),
    Garbled,
}

fn header(h: &HeaderMap, name: impl axum::http::header::AsHeaderName) -> Header<'_> {
    match h.get(name) {
        None => Header::Absent,
        Some(v) => match v.to_str() {
            Ok(s) => Header::Value(s),
            Err(_) => Header::Garbled,
        },
    }
}

/// `YYYY-MM-DD`, the shape of every MCP protocol revision.
fn protocol_version_shaped(v: &str) -> bool {
    let b = v.as_bytes();
    b.len() == 10
        && b.iter().enumerate().all(|(i, c)| match i {
            4 | 7 => *c == b'-',
            _ => c.is_ascii_digit(),
        })
}

/// A `MCP-Protocol-Version` this server cannot speak (not even shaped like
/// a revision). A JSON-RPC request gets the protocol's
/// UnsupportedProtocolVersionError (HTTP 400, its id, `data.supported` and
/// `data.requested`), as rmcp answers a well-shaped unknown revision; the
/// body is read against the same bounds as any body read before
/// authentication. Anything else (a notification, no JSON) gets a plain 400
/// naming the header.
async fn bad_protocol_header(req: Request, limit: usize, deadline: std::time::Duration) -> Response {
    let requested: String = req
        .headers()
        .get(PROTOCOL_HEADER)
        .map(|v| String::from_utf8_lossy(v.as_bytes()).chars().take(64).collect())
        .unwrap_or_default();
    let id = if req.method() == http::Method::POST {
        match tokio::time::timeout(deadline, axum::body::to_bytes(req.into_body(), limit)).await {
            Ok(Ok(body)) => request_id_of(&body),
            _ => None,
        }
    } else {
        None
    };
    match id {
        Some(id) => closing(
            RpcError {
                status: StatusCode::BAD_REQUEST,
                id,
                code: rmcp::model::ErrorCode::UNSUPPORTED_PROTOCOL_VERSION.0,
                message: "Unsupported protocol version".into(),
                data: json!({
                    "requested": requested,
                    "supported": rmcp::model::ProtocolVersion::KNOWN_VERSIONS
                        .iter()
                        .map(|v| v.as_str())
                        .collect::<Vec<_>>(),
                }),
                retry_after: None,
            }
            .into_response(),
        ),
        None => ApiError::bad_field(
            "MCP-Protocol-Version",
            "MCP-Protocol-Version must be a protocol revision such as 2025-11-25",
        )
        .into_response(),
    }
}

/// Most of a body read before authentication to find a request's id.
const PRE_AUTH_BODY_LIMIT: usize = 64 * 1024;

/// The id of a JSON-RPC request (a message with a `method` and an `id`).
fn request_id_of(body: &[u8]) -> Option<serde_json::Value> {
    #[derive(serde::Deserialize)]
    struct Message {
        id: Option<serde_json::Value>,
        method: Option<serde::de::IgnoredAny>,
    }
    let m: Message = serde_json::from_slice(body).ok()?;
    m.method?;
    m.id.filter(|id| id.is_string() || id.is_number())
}

fn too_many_sessions(refusal: Refusal, retry_after_secs: u64) -> Response {
    let message = match refusal {
        Refusal::CredentialCap => "This credential has too many open MCP sessions; close one (DELETE) or wait.",
        Refusal::UserCap => {
            "This credential's user has too many open MCP sessions over all their tokens; close one (DELETE) or wait."
        }
        Refusal::GlobalCap => "This server has too many open MCP sessions; try again later.",
    };
    ApiError::RateLimited {
        retry_after_secs,
        message: message.to_owned(),
    }
    .into_response()
}

/// The JSON-RPC id and tool of a `tools/call` body (unknown tools are
/// `other`, so no caller-chosen string becomes a bucket or a label).
fn tool_call_of(body: &[u8]) -> Option<(serde_json::Value, &'static str)> {
    #[derive(serde::Deserialize)]
    struct Call {
        #[serde(default)]
        id: serde_json::Value,
        method: Option<String>,
        params: Option<Params>,
    }
    #[derive(serde::Deserialize)]
    struct Params {
        name: Option<String>,
    }
    let call: Call = serde_json::from_slice(body).ok()?;
    if call.method.as_deref() != Some("tools/call") {
        return None;
    }
    let name = call.params.and_then(|p| p.name).unwrap_or_default();
    Some((call.id, tool_label(&name)))
}

/// HTTP 429 with a JSON-RPC error for the call, so SDKs surface it.
fn tool_rate_limited(id: serde_json::Value, calls: &str, retry_after_secs: u64) -> Response {
    RpcError {
        status: StatusCode::TOO_MANY_REQUESTS,
        id,
        code: -32000,
        message: format!("Rate limited: too many {calls} calls for this credential; retry after {retry_after_secs} s."),
        data: json!({"retry_after": retry_after_secs}),
        retry_after: Some(retry_after_secs),
    }
    .into_response()
}

/// Request headers a browser MCP client sends (Streamable HTTP, both eras).
const CORS_ALLOW_HEADERS: [&str; 8] = [
    "authorization",
    "content-type",
    "accept",
    "last-event-id",
    "mcp-session-id",
    "mcp-protocol-version",
    "mcp-method",
    "mcp-name",
];
/// Response headers a browser MCP client must read: its session, and why it
/// was refused (the 401 challenge, the 429 wait).
const CORS_EXPOSE_HEADERS: &str = "Mcp-Session-Id, WWW-Authenticate, Retry-After";

/// The CORS preflight answer for an allowed origin: the methods and headers
/// MCP needs, plus the `Mcp-Param-*` headers (SEP-2243) it asked for.
fn preflight(origin: &http::HeaderValue, requested: Option<&str>) -> Response {
    let mut allow: Vec<String> = CORS_ALLOW_HEADERS.iter().map(|h| (*h).to_owned()).collect();
    for h in requested.unwrap_or_default().split(',') {
        let h = h.trim().to_ascii_lowercase();
        if h.starts_with("mcp-param-")
            && h.len() <= 128
            && h.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
            && !allow.contains(&h)
        {
            allow.push(h);
        }
    }
    let mut r = StatusCode::NO_CONTENT.into_response();
    let h = r.headers_mut();
    h.insert(header::ACCESS_CONTROL_ALLOW_ORIGIN, origin.clone());
    h.insert(
        header::ACCESS_CONTROL_ALLOW_METHODS,
        http::HeaderValue::from_static("GET, POST, DELETE, OPTIONS"),
    );
    if let Ok(v) = http::HeaderValue::from_str(&allow.join(", ")) {
        h.insert(header::ACCESS_CONTROL_ALLOW_HEADERS, v);
    }
    h.insert(header::ACCESS_CONTROL_MAX_AGE, http::HeaderValue::from_static("600"));
    h.insert(
        header::VARY,
        http::HeaderValue::from_static("Origin, Access-Control-Request-Method, Access-Control-Request-Headers"),
    );
    r
}

/// CORS for browser clients (issue 24): a preflight from an allowed origin
/// is answered here, before any auth (a preflight carries no credentials);
/// every answer to an allowed origin, refusals included, names it and
/// exposes the headers an MCP client reads. Any other Origin stays 403, and
/// the Host check (DNS rebinding) holds for preflights too.
pub async fn guard(State(state): State<Arc<Guard>>, req: Request, next: Next) -> Response {
    let origin = match header(req.headers(), header::ORIGIN) {
        Header::Value(o) if state.allows_origin(o) => req.headers().get(header::ORIGIN).cloned(),
        _ => None,
    };
    if req.method() == http::Method::OPTIONS && req.headers().contains_key(header::ACCESS_CONTROL_REQUEST_METHOD) {
        match header(req.headers(), header::HOST) {
            Header::Absent => {}
            Header::Value(host) if state.allows_host(host) => {}
            _ => return forbidden("Host header is not allowed"),
        }
        return match &origin {
            Some(o) => preflight(o, header_str(req.headers(), header::ACCESS_CONTROL_REQUEST_HEADERS)),
            None => forbidden("Origin is not allowed"),
        };
    }
    let mut resp = checked(State(state), req, next).await;
    if let Some(o) = origin {
        let h = resp.headers_mut();
        h.insert(header::ACCESS_CONTROL_ALLOW_ORIGIN, o);
        h.insert(
            header::ACCESS_CONTROL_EXPOSE_HEADERS,
            http::HeaderValue::from_static(CORS_EXPOSE_HEADERS),
        );
        h.append(header::VARY, http::HeaderValue::from_static("Origin"));
    }
    resp
}

/// Everything before rmcp: cheap checks first (Host, Origin, protocol header,
/// session id, the session's existence), then the bearer and the session's
/// owner, then the rates; a request that fails here never reaches rmcp and
/// consumes nothing (a per-turn jti is given back).
async fn checked(State(state): State<Arc<Guard>>, req: Request, next: Next) -> Response {
    let (req, session) = match before_auth(&state, req).await {
        Ok(r) => r,
        Err(resp) => return resp,
    };
    let (principal, pending) = match authenticate(&state, req.headers(), session.as_ref()).await {
        Ok(r) => r,
        Err(resp) => return resp,
    };
    let (req, slot) = match within_rates(&state, &principal, req).await {
        Ok(r) => r,
        // Refused before anything was served: the turn may retry.
        Err(resp) => return give_back(&state, pending.as_ref(), resp).await,
    };
    let is_delete = req.method() == http::Method::DELETE;
    let credential = principal.credential().clone();
    let user = principal.user().cloned();
    let mut req = req;
    req.extensions_mut().insert::<Principal>(principal);
    if let Some(named) = &session {
        // On a session a dropped connection is not a cancel (the client may
        // resume the stream with Last-Event-ID): the work runs on, its slot
        // held until it ends.
        let mut resp = match on_session(&state, named, req, (credential, user), is_delete, next).await {
            Ok(r) => r,
            Err(refused) => return refused,
        };
        if is_delete && resp.status().is_success() {
            // Terminated: nothing to send back (clients expect 200 or 204).
            *resp.status_mut() = StatusCode::NO_CONTENT;
        }
        return holding(resp, slot, None);
    }
    // Outside a session, the caller is gone when this future is dropped
    // (a JSON answer still being made) or the answer's body is (an event
    // stream): either cancels the work.
    let gone = slot.as_ref().map(|c| c.gone.clone().drop_guard());
    let resp = open_session(&state, req, (credential, user), pending, next).await;
    holding(resp, slot, gone)
}

/// A request on an existing session. A session this replica holds is
/// marked served in the shared table (at most every quarter idle timeout),
/// which also finds a session ended on another replica meanwhile. One opened
/// elsewhere (or whose copy here closed a moment ago) is rebuilt here by
/// rmcp, bound to its owner — whom the bearer has just matched — through the
/// opener.
async fn on_session(
    state: &Guard,
    named: &NamedSession,
    req: Request,
    (credential, user): (Arc<str>, Option<Arc<str>>),
    is_delete: bool,
    next: Next,
) -> Result<Response, Response> {
    if named.stored {
        if !is_delete && state.sessions.at_global_cap() {
            let wait = SessionLimits::from_settings(&state.settings).idle.as_secs().min(60);
            return Err(too_many_sessions(Refusal::GlobalCap, wait));
        }
    } else if !is_delete {
        match state.sessions.touch(&named.id).await {
            Ok(true) => {}
            Ok(false) => return Err(session_not_found()),
            Err(e) => {
                tracing::warn!(error = %e, "could not mark an MCP session served");
                return Err(AuthError::Unavailable("postgres").into_response_with(None, None));
            }
        }
    }
    let opener = Opener::new(credential, user);
    let resp = OPENER.scope(opener.clone(), next.run(req)).await;
    if opener.store_unavailable() {
        // The session could not be rebuilt: Postgres, not the request.
        return Err(AuthError::Unavailable("postgres").into_response_with(None, None));
    }
    Ok(resp)
}

/// A tool call's tie to its caller, in the request's extensions: the tool
/// runs while it holds a clone (`KnowledgeServer::run`), and stops at its
/// next await point once `gone` is cancelled — when the answer's body (a
/// JSON answer or an event stream) is dropped, which is when the connection
/// closed (or the answer was sent: the work is done then). A search's slot
/// is held by the clones, so it is held until the work ended *and* the
/// answer was sent or dropped: a client that closes its socket at once no
/// longer frees a slot its search still runs on.
#[derive(Clone)]
pub struct Caller {
    pub gone: tokio_util::sync::CancellationToken,
    _slot: Option<Arc<crate::limits::search::SearchSlot>>,
}

/// The response, holding the call's `Caller` (its slot, if any) and, for a
/// call outside a session, the guard that cancels its work (`gone`), until
/// the body has been sent or dropped.
fn holding(resp: Response, caller: Option<Caller>, gone: Option<tokio_util::sync::DropGuard>) -> Response {
    let Some(caller) = caller else { return resp };
    resp.map(|body| {
        axum::body::Body::new(crate::drain::Holding {
            body,
            _held: (caller, gone),
        })
    })
}

/// A session a request names: its id and the credential that owns it.
struct NamedSession {
    id: String,
    owner: Arc<str>,
    /// Opened on another replica: this one holds no copy yet.
    stored: bool,
}

/// The checks before the bearer, cheapest first: Host, Origin, the protocol
/// header, the session id and the session's existence. An unknown session is
/// refused here, before the bearer is resolved or a jti consumed (a session
/// this replica does not hold costs one primary-key read first).
async fn before_auth(state: &Guard, req: Request) -> Result<(Request, Option<NamedSession>), Response> {
    let headers = req.headers();
    match header(headers, header::HOST) {
        Header::Absent => {}
        Header::Value(host) if state.allows_host(host) => {}
        _ => return Err(forbidden("Host header is not allowed")),
    }
    match header(headers, header::ORIGIN) {
        Header::Absent => {}
        Header::Value(origin) if state.allows_origin(origin) => {}
        _ => return Err(forbidden("Origin is not allowed")),
    }
    match header(headers, PROTOCOL_HEADER) {
        Header::Absent => {}
        Header::Value(v) if protocol_version_shaped(v) => {}
        // Only the JSON-RPC id is needed from a body read before the bearer.
        _ => {
            let limit = state.settings.body_limit_bytes.min(PRE_AUTH_BODY_LIMIT);
            return Err(bad_protocol_header(req, limit, body_deadline(state)).await);
        }
    }
    let id: Option<String> = match header(headers, SESSION_HEADER) {
        Header::Absent => None,
        // rmcp's session ids are UUIDs; anything unlike a session id is simply
        // unknown (and must not reach the replay table).
        Header::Value(s) if !s.is_empty() && s.len() <= 128 && s.bytes().all(|b| b.is_ascii_graphic()) => {
            Some(s.to_owned())
        }
        _ => return Err(session_not_found()),
    };
    // A session exists exactly while it has an owner: held here, or in the
    // shared table (one primary-key read).
    let session = match id {
        Some(id) => match state.sessions.owner(&id) {
            Some(owner) => Some(NamedSession {
                id,
                owner,
                stored: false,
            }),
            None => match stored_owner(state, req.extensions().get().copied(), &id).await? {
                Ok(Some(o)) => Some(NamedSession {
                    id,
                    owner: o.credential.into(),
                    stored: true,
                }),
                Ok(None) => {
                    state.lookups.absent.insert(id, ());
                    return Err(session_not_found());
                }
                Err(e) => {
                    tracing::warn!(error = %e, "could not read the shared MCP session table");
                    return Err(AuthError::Unavailable("postgres").into_response_with(None, None));
                }
            },
        },
        None => None,
    };
    Ok((req, session))
}

/// The owner of a session this replica does not hold, read from the shared
/// table within `SessionLookups`' bounds: the outer error is the answer
/// when a bound refuses the read (or the id is known absent).
async fn stored_owner(
    state: &Guard,
    address: Option<crate::proxies::ClientAddress>,
    id: &str,
) -> Result<Result<Option<crate::store::pg::sessions::Owner>, sqlx::Error>, Response> {
    if state.lookups.absent.contains_key(id) {
        return Err(session_not_found());
    }
    let refused = || {
        ApiError::RateLimited {
            retry_after_secs: 1,
            message: "Too many requests naming MCP sessions this server does not hold; retry later.".into(),
        }
        .into_response()
    };
    if let Some(crate::proxies::ClientAddress(ip)) = address {
        if state
            .lookups
            .per_address
            .check_key(&crate::proxies::rate_key(ip))
            .is_err()
        {
            return Err(refused());
        }
    }
    // A short wait for a permit (clients rebuilding their sessions after a
    // replica restart arrive together), then 429.
    let permit = tokio::time::timeout(
        std::time::Duration::from_secs(1),
        state.lookups.in_flight.clone().acquire_owned(),
    )
    .await;
    let Ok(Ok(_permit)) = permit else {
        return Err(refused());
    };
    Ok(state.sessions.stored_owner(id).await)
}

/// How long a body read by the guard may take to arrive.
fn body_deadline(state: &Guard) -> std::time::Duration {
    std::time::Duration::from_secs(state.settings.header_timeout_secs.max(1))
}

/// Resolves the bearer against the session it names. A missing bearer is
/// counted and challenged; another credential's session looks exactly like
/// a missing one.
async fn authenticate(
    state: &Guard,
    headers: &HeaderMap,
    session: Option<&NamedSession>,
) -> Result<(Principal, Option<PendingJti>), Response> {
    let resource_metadata = state.settings.resource_authorization_server().map(|_| {
        format!(
            "{}/.well-known/oauth-protected-resource",
            state.settings.public_url.trim_end_matches('/')
        )
    });
    // The scopes are this server's own only when it issues the tokens.
    let scope = state
        .settings
        .oauth_issuer()
        .map(|_| crate::service::oauth::SCOPES.join(" "));
    let Some(token) = bearer(headers).filter(|t| !t.is_empty()) else {
        state.metrics.auth_failures.with_label_values(&["missing"]).inc();
        return Err(AuthError::Missing.into_response_with(resource_metadata.as_deref(), scope.as_deref()));
    };
    let ctx = RequestContext {
        session_id: session.map(|s| s.id.as_str()),
        session_owner: session.map(|s| &*s.owner),
    };
    match state.auth.authenticate(token, ctx).await {
        Ok(r) => Ok(r),
        Err(AuthError::ForeignSession) => Err(session_not_found()),
        Err(e) => Err(e.into_response_with(resource_metadata.as_deref(), scope.as_deref())),
    }
}

/// A refusal after the bearer served nothing: a per-turn jti consumed by
/// this request is given back, so the turn may retry with the same token.
async fn give_back(state: &Guard, pending: Option<&PendingJti>, resp: Response) -> Response {
    if let Some(p) = pending {
        let _ = state.auth.release(p).await;
    }
    resp
}

/// The credential's request rate, then (per-tool limits on, a POST) the
/// rate of the tool it calls, then (a `search`) one of the credential's
/// search slots. Returns the request, its body read and put back when the
/// tool had to be found, and the slot to hold while it is answered.
async fn within_rates(
    state: &Guard,
    principal: &Principal,
    req: Request,
) -> Result<(Request, Option<Caller>), Response> {
    // A token also counts against its user's bucket, shared by all the
    // user's tokens (issues 32, 54: minting more tokens adds no rate): at the
    // user's ceiling when it has one, else at the configured rate — unless
    // the token carries a rate of its own, which an operator gave it.
    let limited = state
        .limits
        .request(principal.subject(), principal.rate_limit_per_minute())
        .and_then(|()| match (principal.user_rate(), principal.user()) {
            (Some((user, rate)), _) => state.limits.request(user, Some(rate)),
            (None, Some(user)) if principal.rate_limit_per_minute().is_none() => state.limits.request(user, None),
            _ => Ok(()),
        });
    if let Err(l) = limited {
        state
            .metrics
            .rate_limited
            .with_label_values(&[principal.kind().as_str(), "-"])
            .inc();
        return Err(ApiError::RateLimited {
            retry_after_secs: l.retry_after_secs(),
            message: "Too many requests for this credential; retry later.".into(),
        }
        .into_response());
    }
    if !((state.limits.per_tool() || state.search_slots.is_on()) && req.method() == http::Method::POST) {
        return Ok((req, None));
    }
    let (parts, body) = req.into_parts();
    // Bounded in size and in time: a body that never arrives holds nothing.
    let read = tokio::time::timeout(
        body_deadline(state),
        axum::body::to_bytes(body, state.settings.body_limit_bytes),
    )
    .await;
    let bytes = match read {
        Ok(Ok(b)) => b,
        Ok(Err(_)) => return Err(ApiError::PayloadTooLarge.into_response()),
        Err(_) => return Err(ApiError::bad_field("body", "the request body did not arrive in time").into_response()),
    };
    let mut slot = None;
    let tool_call = tool_call_of(&bytes);
    if let Some((id, tool)) = tool_call.clone() {
        if state.limits.per_tool() {
            if let Some(refused) = over_tool_rate(state, principal, id.clone(), tool) {
                return Err(refused);
            }
        }
        if tool == "search" {
            match state
                .search_slots
                .acquire(principal.subject(), principal.user().map(|u| &**u))
                .await
            {
                Some(s) => slot = Some(s),
                None => {
                    refused_call(state, principal, tool);
                    // A search beyond the credential's concurrent searches
                    // (`MNEMOSYNE_SEARCH_CONCURRENCY`, after the queue's wait).
                    return Err(tool_rate_limited(id, "concurrent search", 1));
                }
            }
        }
    }
    let caller = tool_call.map(|_| Caller {
        gone: tokio_util::sync::CancellationToken::new(),
        _slot: slot.map(Arc::new),
    });
    let mut req = Request::from_parts(parts, axum::body::Body::from(bytes));
    if let Some(c) = &caller {
        req.extensions_mut().insert(c.clone());
    }
    Ok((req, caller))
}

/// Counts a tool call refused by a limit (metrics and usage).
fn refused_call(state: &Guard, principal: &Principal, tool: &'static str) {
    state
        .metrics
        .rate_limited
        .with_label_values(&[principal.kind().as_str(), tool])
        .inc();
    record_call(&state.metrics, Some(principal), tool, Outcome::Refused);
}

/// The per-tool rate of one `tools/call`: over it, the call is refused (and
/// counted) with a JSON-RPC error, the answer returned here. A call of no tool of ours by a credential
/// without an allowlist is counted here, as rmcp answers it (a credential
/// with one has it refused and counted by the server, as any tool it may not
/// use).
fn over_tool_rate(state: &Guard, principal: &Principal, id: serde_json::Value, tool: &'static str) -> Option<Response> {
    // A token's calls also count against its user's bucket of the tool,
    // shared by all the user's tokens (issue 54: 25 tokens are not 25 rates).
    let user_key = principal.user().map(|u| format!("user\u{0}{u}"));
    let limited = state
        .limits
        .tool_call(principal.subject(), tool)
        .and_then(|()| match &user_key {
            Some(k) => state.limits.tool_call(k, tool),
            None => Ok(()),
        });
    if let Err(l) = limited {
        refused_call(state, principal, tool);
        return Some(tool_rate_limited(id, tool, l.retry_after_secs()));
    }
    if tool == "other" && principal.tools().is_every() {
        // rmcp answers it with a JSON-RPC error: no tool of ours ran.
        record_call(&state.metrics, Some(principal), "other", Outcome::ProtocolError);
    }
    None
}

/// A request with no session yet may open one, owned by this credential:
/// over the session caps it is refused (and its jti given back); a per-turn
/// jti it consumed is bound to the new session.
async fn open_session(
    state: &Guard,
    req: Request,
    (credential, user): (Arc<str>, Option<Arc<str>>),
    pending: Option<PendingJti>,
    next: Next,
) -> Response {
    let opener = Opener::new(credential, user);
    let resp = OPENER.scope(opener.clone(), next.run(req)).await;
    if opener.store_unavailable() {
        // Nothing was served: the turn may retry with the same token.
        let down = AuthError::Unavailable("postgres").into_response_with(None, None);
        return give_back(state, pending.as_ref(), down).await;
    }
    if let Some(refusal) = opener.refusal() {
        // Nothing was served: the turn may retry with the same token.
        let refused = too_many_sessions(
            refusal,
            SessionLimits::from_settings(&state.settings).idle.as_secs().min(60),
        );
        return give_back(state, pending.as_ref(), refused).await;
    }
    if let (Some(p), Some(new_sid)) = (pending, header_str(resp.headers(), SESSION_HEADER)) {
        let new_sid = new_sid.to_owned();
        if let Err(e) = state.auth.bind_session(&p, &new_sid).await {
            // The turn's jti could not be bound to its session: close the
            // session and fail the initialize (the client may retry with a
            // new turn) rather than refuse its own next call as a replay.
            tracing::warn!(?e, "could not bind per-turn jti to its session");
            let _ = state.sessions.close_session(&new_sid.into()).await;
            if let Err(e) = state.auth.release(&p).await {
                tracing::warn!(?e, "could not release the per-turn jti; the turn needs a new token");
            }
            return AuthError::Unavailable("postgres").into_response_with(None, None);
        }
    }
    resp
}
