//! Sign-in, sessions and CSRF.
//!
//! A session is an opaque random id in a cookie (see [`Cookies`] for its name
//! and attributes: `__Host-` prefixed when the public URL is https), followed
//! by a MAC of it under a key every replica shares (`cookie_value`): a cookie
//! the console did not make is no session, decided without a lookup. Postgres stores only
//! its SHA-256 with the user, a synchronizer CSRF token and the two clocks
//! (idle and absolute expiry). Looking it up checks the user is still active
//! and not a service account, so sign-out, disabling a user or a new password
//! end it on every replica at once. Sign-in failures go through the same
//! throttles and argon2 lanes as HTTP Basic.

use axum::{
    extract::{FromRequest, FromRequestParts, Request, State},
    http::{header, request::Parts, HeaderMap, HeaderValue, StatusCode},
    response::{IntoResponse, Redirect, Response},
};
use base64::Engine;
use rand::RngCore;
use sha2::{Digest, Sha256};

use super::{frame, AdminError, FormData};
use crate::auth::basic::{client_address, verify_password, Accept, BasicContext};
use crate::error::ApiError;
use crate::state::AppState;
use crate::store::pg::admin::{self as store, SessionUser};

/// The session cookie's name in plain-http development.
pub const COOKIE: &str = "mnemosyne_admin";
/// The sign-in form's double-submit CSRF cookie (there is no session yet), in
/// plain-http development.
pub const LOGIN_COOKIE: &str = "mnemosyne_admin_login";
/// The session cookie's name when the public URL is https.
pub const SECURE_COOKIE: &str = "__Host-mnemosyne_admin";
/// The sign-in cookie's name when the public URL is https.
pub const SECURE_LOGIN_COOKIE: &str = "__Host-mnemosyne_admin_login";

/// The console's two cookies as this deployment names and scopes them.
///
/// When `MNEMOSYNE_PUBLIC_URL` is https they carry the `__Host-` prefix, so a
/// browser accepts them only with `Secure; Path=/` and no `Domain`: a sibling
/// subdomain (or a plain-http page on the same host) cannot set or shadow
/// them, and the server reads no unprefixed name at all.
///
/// Browsers refuse `Secure` (and so `__Host-`) cookies over plain http, so in
/// development they keep their unprefixed names with `Path=/admin; HttpOnly;
/// SameSite=Strict`. The equivalent protection there is the parser: a cookie is
/// matched by its exact name, and a request that carries the name twice (a
/// planted cookie from another `Domain` or `Path` next to the real one) is no
/// session and no sign-in token. A planted cookie can then refuse a sign-in,
/// never choose the session. Plain http is for development only.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Cookies {
    pub session: &'static str,
    pub login: &'static str,
    pub secure: bool,
}

impl Cookies {
    pub fn for_public_url(public_url: &str) -> Cookies {
        if public_url.trim().to_ascii_lowercase().starts_with("https://") {
            Cookies {
                session: SECURE_COOKIE,
                login: SECURE_LOGIN_COOKIE,
                secure: true,
            }
        } else {
            Cookies {
                session: COOKIE,
                login: LOGIN_COOKIE,
                secure: false,
            }
        }
    }

    fn of(state: &AppState) -> Cookies {
        Cookies::for_public_url(&state.settings.public_url)
    }

    /// `Set-Cookie` for the console: `max_age` None = until the browser
    /// closes (the server enforces the expiries), Some(0) = delete.
    fn set(&self, name: &str, value: &str, max_age: Option<u64>) -> HeaderValue {
        let mut c = if self.secure {
            format!("{name}={value}; Path=/; HttpOnly; SameSite=Strict; Secure")
        } else {
            format!("{name}={value}; Path=/admin; HttpOnly; SameSite=Strict")
        };
        if let Some(s) = max_age {
            c.push_str(&format!("; Max-Age={s}"));
        }
        HeaderValue::from_str(&c).expect("cookie values are base64url")
    }
}

/// How long a rendered console form may be submitted. Its `once` value
/// carries its render time, so a submission past this is refused whether or
/// not its first submission is still recorded, and the sweep can forget
/// submissions after this long.
pub const FORM_TTL: std::time::Duration = std::time::Duration::from_secs(3600);
/// Margin for replicas' clocks (a form rendered by one, posted to another,
/// recorded by Postgres' clock).
pub const FORM_CLOCK_SKEW: std::time::Duration = std::time::Duration::from_secs(300);
/// Most form submissions a session keeps recorded; past it the oldest are
/// forgotten (a reload of one of those forms within its lifetime would run
/// again: it takes this many other submissions in between).
pub const MAX_ONCE_PER_SESSION: i64 = 256;

/// A form's `once` value: `<unix seconds>.<random>`.
pub(super) fn once_value() -> String {
    format!("{}.{}", chrono::Utc::now().timestamp(), random_token())
}

/// Whether a posted `once` is one the console made and still within its
/// lifetime (allowing `FORM_CLOCK_SKEW` either way).
fn once_is_live(once: &str, now_secs: i64) -> bool {
    let Some((stamp, random)) = once.split_once('.') else {
        return false;
    };
    let Ok(at) = stamp.parse::<i64>() else { return false };
    let (ttl, skew) = (FORM_TTL.as_secs() as i64, FORM_CLOCK_SKEW.as_secs() as i64);
    !random.is_empty() && at <= now_secs + skew && now_secs - at <= ttl
}

pub(super) fn random_token() -> String {
    let mut b = [0u8; 32];
    rand::rngs::OsRng.fill_bytes(&mut b);
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(b)
}

/// The shared key of the session cookies' MACs (`server_secrets`), read (or
/// made, by the first replica) once.
async fn cookie_key(state: &AppState) -> Result<&[u8], ApiError> {
    let key = state
        .cookie_key
        .get_or_try_init(|| async {
            let mut fresh = [0u8; 32];
            rand::rngs::OsRng.fill_bytes(&mut fresh);
            store::server_secret(&state.pg, "console_cookie", &fresh).await
        })
        .await?;
    Ok(key)
}

/// The MAC of a session id under `key`: 16 bytes of HMAC-SHA-256, base64url.
fn cookie_mac(key: &[u8], id: &str) -> String {
    use hmac::{Hmac, Mac};
    let mut mac = <Hmac<Sha256> as Mac>::new_from_slice(key).expect("HMAC takes a key of any length");
    mac.update(id.as_bytes());
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(&mac.finalize().into_bytes()[..16])
}

/// A session cookie's value: `<id>.<MAC of id>`.
fn cookie_value(key: &[u8], id: &str) -> String {
    format!("{id}.{}", cookie_mac(key, id))
}

/// The session id of a cookie value the console made (its MAC holds), else
/// None — without any lookup.
fn session_id<'v>(key: &[u8], value: &'v str) -> Option<&'v str> {
    let (id, mac) = value.rsplit_once('.')?;
    (!id.is_empty() && same(mac, &cookie_mac(key, id))).then_some(id)
}

fn hash_id(id: &str) -> String {
    hex::encode(Sha256::digest(id.as_bytes()))
}

/// Equal in time independent of where they differ.
pub fn same(a: &str, b: &str) -> bool {
    let (a, b) = (a.as_bytes(), b.as_bytes());
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// A cookie's value from the request's `Cookie` headers, matched by its exact
/// name. None when it is absent, not UTF-8, or present more than once (across
/// all `Cookie` headers): a duplicate means someone else set one too, and the
/// request is not trusted to pick the right one.
pub fn cookie<'h>(headers: &'h HeaderMap, name: &str) -> Option<&'h str> {
    let mut found = None;
    for pair in headers
        .get_all(header::COOKIE)
        .iter()
        .flat_map(|v| v.as_bytes().split(|b| *b == b';'))
    {
        let pair = pair.trim_ascii();
        let (k, v) = match pair.iter().position(|b| *b == b'=') {
            Some(at) => (&pair[..at], &pair[at + 1..]),
            None => (pair, &pair[pair.len()..]),
        };
        if k != name.as_bytes() {
            continue;
        }
        if found.is_some() {
            return None;
        }
        found = Some(v);
    }
    std::str::from_utf8(found?).ok()
}

/// A live console session.
#[derive(Clone, Debug)]
pub struct Session {
    pub user: SessionUser,
    id_hash: String,
}

impl Session {
    pub fn csrf(&self) -> &str {
        &self.user.csrf_token
    }

    pub fn username(&self) -> &str {
        &self.user.username
    }
}

/// The session of a request's cookie. A cookie the console did not make (its
/// MAC) is no session, decided before any lookup; a made one passes the
/// session id's own bucket before the session's `touch` UPDATE (issue 32),
/// so a flood of made-up or replayed cookies writes and reads nothing, and
/// no valid session is refused for what others at its address send.
async fn current(headers: &HeaderMap, state: &AppState) -> Result<Option<Session>, ApiError> {
    let Some(value) = cookie(headers, Cookies::of(state).session) else {
        return Ok(None);
    };
    if value.is_empty() || value.len() > 100 {
        return Ok(None);
    }
    let Some(id) = session_id(cookie_key(state).await?, value) else {
        return Ok(None);
    };
    let id_hash = hash_id(id);
    state.console.before_lookup(&id_hash)?;
    let s = &state.settings;
    let user = store::touch_session(
        &state.pg,
        &id_hash,
        s.admin_session_idle_secs.max(1) as i64,
        s.admin_session_absolute_secs.max(1) as i64,
    )
    .await?;
    let Some(user) = user else {
        return Ok(None);
    };
    // Every request of a signed-in user counts against their console rate.
    state.console.user(user.user_id)?;
    Ok(Some(Session { user, id_hash }))
}

/// A signed-in staff user (any page but sign-in and the self-service page).
pub struct Staff(pub Session);

/// Any signed-in user (the self-service page).
pub struct Person(pub Session);

impl FromRequestParts<AppState> for Person {
    type Rejection = AdminError;

    async fn from_request_parts(parts: &mut Parts, state: &AppState) -> Result<Self, Self::Rejection> {
        current(&parts.headers, state)
            .await?
            .map(Person)
            .ok_or(AdminError::SignIn)
    }
}

impl FromRequestParts<AppState> for Staff {
    type Rejection = AdminError;

    async fn from_request_parts(parts: &mut Parts, state: &AppState) -> Result<Self, Self::Rejection> {
        let Person(s) = Person::from_request_parts(parts, state).await?;
        if !s.user.is_staff {
            return Err(AdminError::NotStaff);
        }
        Ok(Staff(s))
    }
}

/// A POSTed form of a signed-in user whose `csrf` field matches the session.
pub struct PersonForm(pub Session, pub FormData);

/// A POSTed form of a staff user whose `csrf` field matches the session.
pub struct StaffForm(pub Session, pub FormData);

impl FromRequest<AppState> for PersonForm {
    type Rejection = AdminError;

    async fn from_request(req: Request, state: &AppState) -> Result<Self, Self::Rejection> {
        let (mut parts, body) = req.into_parts();
        let Person(s) = Person::from_request_parts(&mut parts, state).await?;
        let form = FormData::from_request(Request::from_parts(parts, body), state).await?;
        if !same(form.get("csrf"), s.csrf()) {
            tracing::info!(user = ?s.username(), "admin console: form without the session's CSRF token");
            return Err(AdminError::Csrf);
        }
        // A form the console rendered carries `once`: its second submission
        // (a reload of the result page) is refused, so a rotation, a token or
        // a key is never made twice by accident.
        let once = form.get("once");
        if !once.is_empty() {
            if once.len() > 100 || !once_is_live(once, chrono::Utc::now().timestamp()) {
                return Err(AdminError::FormExpired);
            }
            if !store::first_submission(&state.pg, &s.id_hash, once, MAX_ONCE_PER_SESSION).await? {
                return Err(AdminError::AlreadySubmitted);
            }
        }
        Ok(PersonForm(s, form))
    }
}

impl FromRequest<AppState> for StaffForm {
    type Rejection = AdminError;

    async fn from_request(req: Request, state: &AppState) -> Result<Self, Self::Rejection> {
        let PersonForm(s, form) = PersonForm::from_request(req, state).await?;
        if !s.user.is_staff {
            return Err(AdminError::NotStaff);
        }
        Ok(StaffForm(s, form))
    }
}

fn home(s: &SessionUser) -> &'static str {
    if s.is_staff {
        "/admin/"
    } else {
        "/admin/me"
    }
}

/// GET /admin/login: the form (or home when already signed in).
pub async fn login_form(State(state): State<AppState>, req: Request) -> Result<Response, AdminError> {
    let (parts, _) = req.into_parts();
    let headers = &parts.headers;
    let next = next_of(parts.uri.query().unwrap_or(""));
    if let Some(s) = current(headers, &state).await? {
        return Ok(Redirect::to(next.as_deref().unwrap_or(home(&s.user))).into_response());
    }
    Ok(login_page(&state, headers, StatusCode::OK, "", None, next.as_deref()))
}

/// Where a sign-in may continue to besides home: only the OAuth consent
/// page (issue 48), named by its request id, so `next` is never an open
/// redirect.
pub fn safe_next(next: &str) -> Option<String> {
    let id = next.strip_prefix(CONSENT_NEXT)?;
    (!id.is_empty() && id.len() <= 100 && id.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_'))
        .then(|| next.to_owned())
}

/// The consent page's path, up to its request id.
pub const CONSENT_NEXT: &str = "/admin/oauth/consent?request=";

fn next_of(query: &str) -> Option<String> {
    form_urlencoded::parse(query.as_bytes())
        .find(|(k, _)| k == "next")
        .and_then(|(_, v)| safe_next(&v))
}

/// The sign-in form; its CSRF token is the browser's current sign-in cookie
/// when it has one (two open sign-in tabs both work), else a new one.
fn login_page(
    state: &AppState,
    headers: &HeaderMap,
    status: StatusCode,
    username: &str,
    error: Option<&str>,
    next: Option<&str>,
) -> Response {
    let names = Cookies::of(state);
    let token = cookie(headers, names.login)
        .filter(|t| t.len() == 43 && t.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_'))
        .map(str::to_owned)
        .unwrap_or_else(random_token);
    let mut resp = (status, frame::login(username, &token, error, next)).into_response();
    resp.headers_mut()
        .append(header::SET_COOKIE, names.set(names.login, &token, Some(3600)));
    resp
}

/// Largest sign-in form read (a username, a password and two tokens).
const SIGN_IN_BODY_LIMIT: usize = 16 * 1024;

/// POST /admin/login: the address's sign-in rate, the form (small, read
/// promptly), its CSRF token, then the password through the Basic lanes.
pub async fn login(State(state): State<AppState>, req: Request) -> Result<Response, AdminError> {
    let (parts, body) = req.into_parts();
    let address = client_address(&parts);
    let headers = parts.headers.clone();
    // Sign-ins per client address, before the form is read or hashed.
    if let Err(secs) = state.console.sign_in(&address) {
        tracing::info!(address = ?address, "admin console: sign-in rate limited");
        let msg = format!("Too many sign-ins from your address. Try again in {secs} s.");
        let mut resp = login_page(&state, &headers, StatusCode::TOO_MANY_REQUESTS, "", Some(&msg), None);
        resp.headers_mut().insert(header::RETRY_AFTER, HeaderValue::from(secs));
        return Ok(crate::auth::failure::closing(resp));
    }
    let body = match read_sign_in_body(&state, body).await {
        Ok(body) => body,
        Err(refused) => return Ok(refused),
    };
    let form = FormData::from_request(Request::from_parts(parts, body), &state).await?;
    let names = Cookies::of(&state);
    let expected = cookie(&headers, names.login).unwrap_or("");
    if expected.is_empty() || !same(form.get("csrf"), expected) {
        return Err(AdminError::Csrf);
    }
    let username = form.get("username").trim().to_owned();
    let password = form.get("password").to_owned();
    let next = safe_next(form.get("next"));
    let next = next.as_deref();
    if username.is_empty() || username.len() > 150 || password.is_empty() {
        return Ok(login_page(
            &state,
            &headers,
            StatusCode::BAD_REQUEST,
            &username,
            Some("Enter your username and password."),
            next,
        ));
    }
    // People only: a service account's right password answers like a wrong one.
    let basic = <BasicContext as axum::extract::FromRef<AppState>>::from_ref(&state);
    match verify_password(&basic, username.clone(), password, address, Accept::Person).await {
        Ok(user) => signed_in(&state, &headers, &user, next).await,
        Err(ApiError::BasicUnauthorized) => {
            tracing::info!("admin console: sign-in refused");
            audit_refused_sign_in(&state, &username).await;
            Ok(login_page(
                &state,
                &headers,
                StatusCode::UNAUTHORIZED,
                &username,
                Some("Wrong username or password."),
                next,
            ))
        }
        Err(ApiError::RateLimited { retry_after_secs, .. }) => {
            let msg = format!("Too many failed sign-ins. Try again in {retry_after_secs} s.");
            let mut resp = login_page(
                &state,
                &headers,
                StatusCode::TOO_MANY_REQUESTS,
                &username,
                Some(&msg),
                next,
            );
            resp.headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from(retry_after_secs));
            Ok(resp)
        }
        Err(e) => Err(e.into()),
    }
}

/// The sign-in form's body, read before anyone is authenticated: small, and
/// promptly or not at all (a body trickling in one byte at a time must not
/// hold a connection). Otherwise the answer that refuses it.
async fn read_sign_in_body(state: &AppState, body: axum::body::Body) -> Result<axum::body::Body, Response> {
    let deadline = std::time::Duration::from_secs(state.settings.header_timeout_secs.max(1));
    match tokio::time::timeout(deadline, axum::body::to_bytes(body, SIGN_IN_BODY_LIMIT)).await {
        Ok(Ok(bytes)) => Ok(axum::body::Body::from(bytes)),
        Ok(Err(_)) => Err(crate::auth::failure::closing(ApiError::PayloadTooLarge.into_response())),
        Err(_) => Err(crate::auth::failure::closing(
            (
                StatusCode::REQUEST_TIMEOUT,
                axum::Json(serde_json::json!({"error": "request_timeout",
                    "message": "the sign-in form did not arrive in time"})),
            )
                .into_response(),
        )),
    }
}

/// A right password: a new session (a new id on every sign-in, so no
/// fixation; the browser's previous session, if any, ends here), audited,
/// and home with the session cookie set and the sign-in cookie cleared.
async fn signed_in(
    state: &AppState,
    headers: &HeaderMap,
    user: &crate::store::pg::users::User,
    next: Option<&str>,
) -> Result<Response, AdminError> {
    let names = Cookies::of(state);
    let key = cookie_key(state).await?;
    if let Some(old) = cookie(headers, names.session).and_then(|v| session_id(key, v)) {
        store::delete_session(&state.pg, &hash_id(old)).await?;
    }
    let id = random_token();
    let csrf = random_token();
    store::create_session(
        &state.pg,
        &hash_id(&id),
        user.id,
        &csrf,
        state.settings.admin_session_absolute_secs.max(1) as i64,
    )
    .await?;
    tracing::info!(user = ?user.username, staff = user.is_staff, "admin console: signed in");
    let by = super::actor(&user.username);
    crate::service::audit::after_commit(
        &state.pg,
        &by,
        "console_signed_in",
        &user.username,
        serde_json::json!({}),
    )
    .await;
    let home = if user.is_staff { "/admin/" } else { "/admin/me" };
    let mut resp = Redirect::to(next.unwrap_or(home)).into_response();
    let h = resp.headers_mut();
    h.append(
        header::SET_COOKIE,
        names.set(names.session, &cookie_value(key, &id), None),
    );
    h.append(header::SET_COOKIE, names.set(names.login, "", Some(0)));
    Ok(resp)
}

/// Audits a refused sign-in as an attempt on the account named, when there is
/// one; otherwise without the typed name (it may be a password typed into the
/// wrong field). Throttled attempts are not audited (they are counted).
async fn audit_refused_sign_in(state: &AppState, username: &str) {
    let known = matches!(
        crate::store::pg::users::by_username(&state.pg, username).await,
        Ok(Some(_))
    );
    let (by, target) = if known {
        (super::actor(username), username)
    } else {
        ("admin:?".to_owned(), "")
    };
    let detail = serde_json::json!({"reason": "wrong_password", "known_user": known});
    crate::service::audit::after_commit(&state.pg, &by, "console_sign_in_failed", target, detail).await;
}

/// POST /admin/logout: ends the session everywhere.
pub async fn logout(State(state): State<AppState>, PersonForm(s, _): PersonForm) -> Result<Response, AdminError> {
    store::delete_session(&state.pg, &s.id_hash).await?;
    tracing::info!(user = ?s.username(), "admin console: signed out");
    let by = super::actor(s.username());
    crate::service::audit::after_commit(
        &state.pg,
        &by,
        "console_signed_out",
        s.username(),
        serde_json::json!({}),
    )
    .await;
    let names = Cookies::of(&state);
    let mut resp = Redirect::to("/admin/login").into_response();
    resp.headers_mut()
        .append(header::SET_COOKIE, names.set(names.session, "", Some(0)));
    Ok(resp)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cookie_is_found_among_others() {
        let mut h = HeaderMap::new();
        h.append(
            header::COOKIE,
            HeaderValue::from_static("a=1; mnemosyne_admin=xyz; b=2"),
        );
        assert_eq!(cookie(&h, COOKIE), Some("xyz"));
        assert_eq!(cookie(&h, LOGIN_COOKIE), None);
    }

    #[test]
    fn cookie_names_match_exactly() {
        let mut h = HeaderMap::new();
        h.append(
            header::COOKIE,
            HeaderValue::from_static("__Host-mnemosyne_admin=p; mnemosyne_admin_login=l; Mnemosyne_Admin=c"),
        );
        assert_eq!(cookie(&h, COOKIE), None, "neither a prefix, a suffix nor another case");
        assert_eq!(cookie(&h, SECURE_COOKIE), Some("p"));
        assert_eq!(cookie(&h, LOGIN_COOKIE), Some("l"));
        assert_eq!(cookie(&h, SECURE_LOGIN_COOKIE), None);
    }

    #[test]
    fn a_cookie_sent_twice_is_refused() {
        let mut h = HeaderMap::new();
        h.append(
            header::COOKIE,
            HeaderValue::from_static("mnemosyne_admin=a; mnemosyne_admin=b"),
        );
        assert_eq!(cookie(&h, COOKIE), None, "twice in one header");
        let mut h = HeaderMap::new();
        h.append(header::COOKIE, HeaderValue::from_static("x=1; mnemosyne_admin=a"));
        h.append(header::COOKIE, HeaderValue::from_static("mnemosyne_admin=a"));
        assert_eq!(cookie(&h, COOKIE), None, "once in each of two headers, even equal");
        let mut h = HeaderMap::new();
        h.append(header::COOKIE, HeaderValue::from_static("mnemosyne_admin=a"));
        h.append(
            header::COOKIE,
            HeaderValue::from_bytes(b"mnemosyne_admin=\xff").unwrap(),
        );
        assert_eq!(cookie(&h, COOKIE), None, "a duplicate in a header that is not UTF-8");
    }

    #[test]
    fn https_cookies_are_host_prefixed_and_http_ones_scoped_to_the_console() {
        let c = Cookies::for_public_url("HTTPS://mnemosyne.example");
        assert_eq!((c.session, c.login), (SECURE_COOKIE, SECURE_LOGIN_COOKIE));
        let v = c.set(c.session, "id", None);
        assert_eq!(
            v.to_str().unwrap(),
            "__Host-mnemosyne_admin=id; Path=/; HttpOnly; SameSite=Strict; Secure"
        );
        let c = Cookies::for_public_url("http://localhost:8080");
        assert_eq!((c.session, c.login), (COOKIE, LOGIN_COOKIE));
        let v = c.set(c.login, "", Some(0));
        assert_eq!(
            v.to_str().unwrap(),
            "mnemosyne_admin_login=; Path=/admin; HttpOnly; SameSite=Strict; Max-Age=0"
        );
    }

    #[test]
    fn a_cookie_is_its_session_only_under_its_mac() {
        let key = [7u8; 32];
        let v = cookie_value(&key, "abc");
        assert_eq!(session_id(&key, &v), Some("abc"));
        assert_eq!(session_id(&[8u8; 32], &v), None, "another key");
        let cut = &v[..v.len() - 1];
        for bad in ["abc", "abc.", ".x", "abc.AAAAAAAAAAAAAAAAAAAAAA", cut] {
            assert_eq!(session_id(&key, bad), None, "{bad}");
        }
        assert!(v.len() <= 100, "within the cookie length read");
        assert_eq!(
            session_id(&key, &cookie_value(&key, &random_token())).map(str::len),
            Some(43)
        );
    }

    #[test]
    fn a_once_value_lives_for_the_form_lifetime() {
        let now = 1_800_000_000;
        let ttl = FORM_TTL.as_secs() as i64;
        assert!(once_is_live(&format!("{now}.abc"), now));
        assert!(once_is_live(&format!("{}.abc", now - ttl), now));
        assert!(!once_is_live(&format!("{}.abc", now - ttl - 1), now), "expired");
        assert!(
            once_is_live(&format!("{}.abc", now + 60), now),
            "another replica's clock ahead"
        );
        assert!(!once_is_live(&format!("{}.abc", now + 3600), now), "from the future");
        for made_up in ["abc", "x.abc", &format!("{now}."), ""] {
            assert!(!once_is_live(made_up, now), "{made_up}");
        }
        let v = once_value();
        assert!(once_is_live(&v, chrono::Utc::now().timestamp()), "{v}");
    }

    #[test]
    fn same_compares_whole_values() {
        assert!(same("abc", "abc"));
        assert!(!same("abc", "abd"));
        assert!(!same("abc", "ab"));
        assert!(!same("", "a"));
    }
}
