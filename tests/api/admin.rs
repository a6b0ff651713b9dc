//! The admin console (issue 16): sign-in, sessions, CSRF, and every page and
//! action — through plain HTTP as a browser without JavaScript sends it.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use mnemosyne::service::accounts;
use mnemosyne::store::pg::users::{self, Role};
use reqwest::{header, StatusCode};
use serde_json::json;

use crate::helpers::{TestApp, SERVICE_PASSWORD, SERVICE_USER};
use crate::mcp::seed;

pub const STAFF_PASSWORD: &str = "staff-password-123";

/// A browser without JavaScript: no redirects followed, cookies kept by hand.
pub struct Console {
    http: reqwest::Client,
    base: String,
    pub cookies: Vec<(String, String)>,
    pub csrf: String,
}

pub struct Page {
    pub status: StatusCode,
    pub headers: reqwest::header::HeaderMap,
    pub body: String,
}

impl Page {
    pub fn location(&self) -> &str {
        self.headers
            .get(header::LOCATION)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("")
    }
}

/// The value of the first `name="csrf"` hidden field.
fn csrf_in(html: &str) -> Option<String> {
    let at = html.find("name=\"csrf\" value=\"")? + "name=\"csrf\" value=\"".len();
    Some(html[at..].split('"').next()?.to_owned())
}

impl Console {
    pub fn new(app: &TestApp) -> Console {
        Console {
            http: reqwest::Client::builder()
                .redirect(reqwest::redirect::Policy::none())
                .timeout(Duration::from_secs(30))
                .build()
                .unwrap(),
            base: app.base.clone(),
            cookies: Vec::new(),
            csrf: String::new(),
        }
    }

    fn keep_cookies(&mut self, headers: &reqwest::header::HeaderMap) {
        for v in headers.get_all(header::SET_COOKIE) {
            let v = v.to_str().unwrap();
            let (kv, attrs) = v.split_once(';').unwrap_or((v, ""));
            let (k, val) = kv.split_once('=').unwrap();
            self.cookies.retain(|(n, _)| n != k);
            if !attrs.contains("Max-Age=0") {
                self.cookies.push((k.to_owned(), val.to_owned()));
            }
        }
    }

    fn cookie_header(&self) -> String {
        self.cookies
            .iter()
            .map(|(k, v)| format!("{k}={v}"))
            .collect::<Vec<_>>()
            .join("; ")
    }

    async fn finish(&mut self, r: reqwest::Response) -> Page {
        let status = r.status();
        let headers = r.headers().clone();
        self.keep_cookies(&headers);
        let body = r.text().await.unwrap();
        if let Some(c) = csrf_in(&body) {
            self.csrf = c;
        }
        Page { status, headers, body }
    }

    pub async fn get(&mut self, path: &str) -> Page {
        let r = self
            .http
            .get(format!("{}{path}", self.base))
            .header(header::COOKIE, self.cookie_header())
            .send()
            .await
            .unwrap();
        self.finish(r).await
    }

    /// POSTs the fields as a form, with this session's CSRF token.
    pub async fn post(&mut self, path: &str, fields: &[(&str, &str)]) -> Page {
        let csrf = self.csrf.clone();
        let mut all: Vec<(&str, &str)> = vec![("csrf", &csrf)];
        all.extend_from_slice(fields);
        self.post_raw(path, &all).await
    }

    /// POSTs exactly these fields (no CSRF token added).
    pub async fn post_raw(&mut self, path: &str, fields: &[(&str, &str)]) -> Page {
        let body: String = form_urlencoded::Serializer::new(String::new())
            .extend_pairs(fields)
            .finish();
        let r = self
            .http
            .post(format!("{}{path}", self.base))
            .header(header::COOKIE, self.cookie_header())
            .header(header::CONTENT_TYPE, "application/x-www-form-urlencoded")
            .body(body)
            .send()
            .await
            .unwrap();
        self.finish(r).await
    }

    /// The sign-in form, then the POST; the answer to the POST.
    pub async fn sign_in(&mut self, username: &str, password: &str) -> Page {
        let form = self.get("/admin/login").await;
        assert_eq!(form.status, StatusCode::OK, "{}", form.body);
        self.post("/admin/login", &[("username", username), ("password", password)])
            .await
    }

    /// A signed-in console (asserts the sign-in succeeded).
    pub async fn signed_in(app: &TestApp, username: &str, password: &str) -> Console {
        let mut c = Console::new(app);
        let r = c.sign_in(username, password).await;
        assert_eq!(r.status, StatusCode::SEE_OTHER, "sign-in failed: {}", r.body);
        let home = r.location().to_owned();
        let page = c.get(&home).await;
        assert_eq!(page.status, StatusCode::OK, "{}", page.body);
        c
    }
}

/// A staff user; returns its name.
pub async fn staff(app: &TestApp, name: &str) -> String {
    accounts::create(&app.pg, "test", name, Some(STAFF_PASSWORD), false, true)
        .await
        .unwrap();
    name.to_owned()
}

/// A person who is not staff, with a password.
pub async fn person(app: &TestApp, name: &str) -> String {
    accounts::create(&app.pg, "test", name, Some(STAFF_PASSWORD), false, false)
        .await
        .unwrap();
    name.to_owned()
}

/// The `mnm_…` plaintext on a page, if any.
fn plaintext_in(html: &str) -> Option<String> {
    let at = html.find("mnm_")?;
    Some(
        html[at..]
            .chars()
            .take_while(|c| c.is_ascii_alphanumeric() || *c == '_' || *c == '-')
            .collect(),
    )
}

/// The team JWT on a rotation page.
fn jwt_in(html: &str) -> Option<String> {
    let at = html.find("eyJ")?;
    Some(
        html[at..]
            .chars()
            .take_while(|c| c.is_ascii_alphanumeric() || "-_.".contains(*c))
            .collect(),
    )
}

/// The changes `actor` made (its console sign-ins and sign-outs left out).
async fn audit_actions(app: &TestApp, actor: &str) -> Vec<String> {
    sqlx::query_scalar(
        "SELECT action::text FROM audit_events WHERE actor = $1 AND action NOT LIKE 'console\\_%' ORDER BY id",
    )
    .bind(actor)
    .fetch_all(&app.pg)
    .await
    .unwrap()
}

const STAFF_PAGES: &[&str] = &[
    "/admin/",
    "/admin/libraries",
    "/admin/library?uid=x",
    "/admin/library/delete?uid=x",
    "/admin/tokens",
    "/admin/tokens/new",
    "/admin/teams",
    "/admin/teams/6f1c1d8e-2b7a-4c1e-9f3d-0d3e5a7b9c21",
    "/admin/keys",
    "/admin/keys/retire?kid=x",
    "/admin/users",
    "/admin/search",
    "/admin/audit",
];

const STAFF_ACTIONS: &[&str] = &[
    "/admin/tokens",
    "/admin/tokens/revoke",
    "/admin/teams/6f1c1d8e-2b7a-4c1e-9f3d-0d3e5a7b9c21/rotate",
    "/admin/teams/6f1c1d8e-2b7a-4c1e-9f3d-0d3e5a7b9c21/workspaces",
    "/admin/teams/6f1c1d8e-2b7a-4c1e-9f3d-0d3e5a7b9c21/deactivate",
    "/admin/keys",
    "/admin/keys/retire",
    "/admin/users",
    "/admin/users/active",
    "/admin/users/staff",
    "/admin/users/password",
    "/admin/library/grant",
    "/admin/library/revoke",
    "/admin/library/rename",
    "/admin/library/delete",
];

#[tokio::test]
async fn every_page_and_action_without_a_session_redirects_to_sign_in() {
    let app = TestApp::spawn().await;
    let mut c = Console::new(&app);
    for path in STAFF_PAGES.iter().chain(&["/admin/me"]) {
        let p = c.get(path).await;
        assert_eq!(p.status, StatusCode::SEE_OTHER, "{path}");
        assert_eq!(p.location(), "/admin/login", "{path}");
    }
    for path in STAFF_ACTIONS
        .iter()
        .chain(&["/admin/me/tokens", "/admin/me/tokens/revoke", "/admin/logout"])
    {
        let p = c.post_raw(path, &[("csrf", "x")]).await;
        assert_eq!(p.status, StatusCode::SEE_OTHER, "{path}");
        assert_eq!(p.location(), "/admin/login", "{path}");
    }
    // A made-up session cookie is no session.
    c.cookies.push(("mnemosyne_admin".into(), "made-up".into()));
    assert_eq!(c.get("/admin/").await.location(), "/admin/login");
}

#[tokio::test]
async fn a_non_staff_user_gets_403_on_staff_pages_and_actions_and_has_the_self_service_page() {
    let app = TestApp::spawn().await;
    let name = person(&app, "pat").await;
    let mut c = Console::new(&app);
    let r = c.sign_in(&name, STAFF_PASSWORD).await;
    assert_eq!(r.location(), "/admin/me");
    let me = c.get("/admin/me").await;
    assert_eq!(me.status, StatusCode::OK);
    assert!(me.body.contains("My tokens"));
    assert!(!me.body.contains("href=\"/admin/users\""), "no staff navigation");
    for path in STAFF_PAGES {
        assert_eq!(c.get(path).await.status, StatusCode::FORBIDDEN, "{path}");
    }
    for path in STAFF_ACTIONS {
        assert_eq!(c.post(path, &[]).await.status, StatusCode::FORBIDDEN, "{path}");
    }
}

#[tokio::test]
async fn service_accounts_and_wrong_passwords_cannot_sign_in() {
    let app = TestApp::spawn().await;
    staff(&app, "sam").await;
    let mut c = Console::new(&app);
    let r = c.sign_in(SERVICE_USER, SERVICE_PASSWORD).await;
    assert_eq!(r.status, StatusCode::UNAUTHORIZED);
    assert!(r.body.contains("Wrong username or password."));
    let r = c.sign_in("sam", "not-the-password").await;
    assert_eq!(r.status, StatusCode::UNAUTHORIZED);
    assert!(
        r.body.contains("value=\"sam\""),
        "the form comes back with the username"
    );
    assert!(!c.cookies.iter().any(|(k, _)| k == "mnemosyne_admin"));
    // A disabled user's right password answers like a wrong one.
    accounts::set_active(&app.pg, "test", "sam", false).await.unwrap();
    assert_eq!(c.sign_in("sam", STAFF_PASSWORD).await.status, StatusCode::UNAUTHORIZED);
}

#[tokio::test]
async fn failed_sign_ins_are_throttled_with_retry_after() {
    let app = TestApp::spawn_with(|s| s.basic_failures_per_minute = 6).await;
    staff(&app, "sam").await;
    let mut c = Console::new(&app);
    let mut last = None;
    for _ in 0..12 {
        let r = c.sign_in("sam", "wrong-password").await;
        if r.status == StatusCode::TOO_MANY_REQUESTS {
            last = Some(r);
            break;
        }
        assert_eq!(r.status, StatusCode::UNAUTHORIZED);
    }
    let r = last.expect("throttled after repeated failures");
    assert!(r.headers.get(header::RETRY_AFTER).is_some());
    assert!(r.body.contains("Too many failed sign-ins"), "{}", r.body);
}

#[tokio::test]
async fn sign_in_sets_a_strict_httponly_session_cookie_and_sign_out_ends_it() {
    let app = TestApp::spawn().await;
    staff(&app, "sam").await;
    let mut c = Console::new(&app);
    let r = c.sign_in("sam", STAFF_PASSWORD).await;
    assert_eq!(r.location(), "/admin/");
    let set: Vec<&str> = r
        .headers
        .get_all(header::SET_COOKIE)
        .iter()
        .map(|v| v.to_str().unwrap())
        .collect();
    let session = set.iter().find(|c| c.starts_with("mnemosyne_admin=")).unwrap();
    for attr in ["HttpOnly", "SameSite=Strict", "Path=/admin"] {
        assert!(session.contains(attr), "{session}");
    }
    assert!(!session.contains("Secure"), "http public URL: no Secure");
    let overview = c.get("/admin/").await;
    assert_eq!(overview.status, StatusCode::OK);
    assert_eq!(overview.headers["cache-control"], "no-store");
    assert!(overview.headers["content-security-policy"]
        .to_str()
        .unwrap()
        .contains("default-src 'none'"));
    // Signing in again replaces the session: the previous id is dead.
    let before = c.cookies.clone();
    let mut form = Console::new(&app);
    form.get("/admin/login").await;
    c.cookies.extend(form.cookies.clone());
    c.csrf = form.csrf.clone();
    let again = c
        .post("/admin/login", &[("username", "sam"), ("password", STAFF_PASSWORD)])
        .await;
    assert_eq!(again.status, StatusCode::SEE_OTHER);
    let mut old = Console::new(&app);
    old.cookies = before;
    assert_eq!(old.get("/admin/").await.location(), "/admin/login");
    c.get("/admin/").await;
    let stolen = c.cookies.clone();
    let out = c.post("/admin/logout", &[]).await;
    assert_eq!(out.location(), "/admin/login");
    // The old cookie is dead server-side, not just deleted in this browser.
    c.cookies = stolen;
    assert_eq!(c.get("/admin/").await.location(), "/admin/login");
}

fn set_cookies(page: &Page) -> Vec<String> {
    page.headers
        .get_all(header::SET_COOKIE)
        .iter()
        .map(|v| v.to_str().unwrap().to_owned())
        .collect()
}

#[tokio::test]
async fn console_cookies_are_host_prefixed_and_secure_when_the_public_url_is_https() {
    let app = TestApp::spawn_with(|s| s.public_url = "https://mnemosyne.example".into()).await;
    staff(&app, "sam").await;
    let mut c = Console::new(&app);
    let form = c.get("/admin/login").await;
    let r = c
        .post("/admin/login", &[("username", "sam"), ("password", STAFF_PASSWORD)])
        .await;
    assert_eq!(r.status, StatusCode::SEE_OTHER, "{}", r.body);
    let all: Vec<String> = set_cookies(&form).into_iter().chain(set_cookies(&r)).collect();
    for name in ["__Host-mnemosyne_admin_login=", "__Host-mnemosyne_admin="] {
        assert!(all.iter().any(|c| c.starts_with(name)), "{name} in {all:?}");
    }
    for cookie in &all {
        assert!(cookie.starts_with("__Host-"), "{cookie}");
        let attrs: Vec<&str> = cookie.split(';').skip(1).map(str::trim).collect();
        for attr in ["Secure", "Path=/", "HttpOnly", "SameSite=Strict"] {
            assert!(attrs.contains(&attr), "{attr} in {cookie}");
        }
        assert!(
            !attrs.iter().any(|a| a.to_ascii_lowercase().starts_with("domain")),
            "{cookie}"
        );
    }
    assert_eq!(c.get("/admin/").await.status, StatusCode::OK);
    // The unprefixed name is not read at all: it is what another host could plant.
    let session = c
        .cookies
        .iter()
        .find(|(k, _)| k == "__Host-mnemosyne_admin")
        .unwrap()
        .1
        .clone();
    let mut plain = Console::new(&app);
    plain.cookies.push(("mnemosyne_admin".into(), session));
    assert_eq!(plain.get("/admin/").await.location(), "/admin/login");
}

#[tokio::test]
async fn a_request_carrying_the_session_cookie_twice_is_not_signed_in() {
    let app = TestApp::spawn().await;
    staff(&app, "sam").await;
    let mut c = Console::signed_in(&app, "sam", STAFF_PASSWORD).await;
    let real = c.cookies.clone();
    // A planted cookie before or after the real one: neither is picked.
    for planted_first in [true, false] {
        let mut twice = real.clone();
        let planted = ("mnemosyne_admin".to_owned(), "planted-by-a-sibling".to_owned());
        if planted_first {
            twice.insert(0, planted);
        } else {
            twice.push(planted);
        }
        c.cookies = twice;
        let p = c.get("/admin/").await;
        assert_eq!(p.status, StatusCode::SEE_OTHER, "planted first: {planted_first}");
        assert_eq!(p.location(), "/admin/login");
    }
    // The same id twice is refused as well: the request is ambiguous.
    let id = real.iter().find(|(k, _)| k == "mnemosyne_admin").unwrap().1.clone();
    c.cookies = real.clone();
    c.cookies.push(("mnemosyne_admin".into(), id));
    assert_eq!(c.get("/admin/").await.location(), "/admin/login");
    // The real cookie alone still signs in: nothing was ended server-side.
    c.cookies = real;
    assert_eq!(c.get("/admin/").await.status, StatusCode::OK);
}

#[tokio::test]
async fn a_sign_in_carrying_the_double_submit_cookie_twice_is_refused() {
    let app = TestApp::spawn().await;
    staff(&app, "sam").await;
    let mut c = Console::new(&app);
    c.get("/admin/login").await;
    let real = c.cookies.clone();
    let token = c.csrf.clone();
    let planted = ("mnemosyne_admin_login".to_owned(), "planted".to_owned());
    // A sibling plants its own sign-in cookie next to the real one: whichever
    // value the form carries, neither cookie is trusted.
    for csrf in [token.as_str(), "planted"] {
        c.cookies = real.iter().cloned().chain([planted.clone()]).collect();
        let r = c
            .post_raw(
                "/admin/login",
                &[("csrf", csrf), ("username", "sam"), ("password", STAFF_PASSWORD)],
            )
            .await;
        assert_eq!(r.status, StatusCode::FORBIDDEN, "{csrf}: {}", r.body);
        assert!(!c.cookies.iter().any(|(k, _)| k == "mnemosyne_admin"), "{csrf}");
    }
    // The real cookie alone signs in.
    c.cookies = real;
    let r = c
        .post_raw(
            "/admin/login",
            &[("csrf", &token), ("username", "sam"), ("password", STAFF_PASSWORD)],
        )
        .await;
    assert_eq!(r.status, StatusCode::SEE_OTHER, "{}", r.body);
}

#[tokio::test]
async fn sessions_expire_when_idle_and_when_old() {
    let app = TestApp::spawn_with(|s| s.admin_session_idle_secs = 1).await;
    staff(&app, "sam").await;
    let mut c = Console::signed_in(&app, "sam", STAFF_PASSWORD).await;
    tokio::time::sleep(Duration::from_millis(2100)).await;
    assert_eq!(c.get("/admin/").await.location(), "/admin/login", "idle expiry");

    let app = TestApp::spawn_with(|s| s.admin_session_absolute_secs = 2).await;
    staff(&app, "sam").await;
    let mut c = Console::signed_in(&app, "sam", STAFF_PASSWORD).await;
    for _ in 0..3 {
        tokio::time::sleep(Duration::from_millis(800)).await;
        c.get("/admin/").await;
    }
    assert_eq!(c.get("/admin/").await.location(), "/admin/login", "absolute expiry");
}

#[tokio::test]
async fn disabling_a_user_ends_their_session_and_removing_staff_gives_403() {
    let app = TestApp::spawn().await;
    staff(&app, "sam").await;
    staff(&app, "kim").await;
    let mut sam = Console::signed_in(&app, "sam", STAFF_PASSWORD).await;
    let mut kim = Console::signed_in(&app, "kim", STAFF_PASSWORD).await;
    kim.get("/admin/users").await;
    let r = kim
        .post("/admin/users/staff", &[("username", "sam"), ("staff", "off")])
        .await;
    assert_eq!(r.status, StatusCode::SEE_OTHER, "{}", r.body);
    assert_eq!(sam.get("/admin/").await.status, StatusCode::FORBIDDEN);
    assert_eq!(sam.get("/admin/me").await.status, StatusCode::OK);
    let r = kim
        .post("/admin/users/active", &[("username", "sam"), ("active", "off")])
        .await;
    assert_eq!(r.status, StatusCode::SEE_OTHER, "{}", r.body);
    assert_eq!(sam.get("/admin/me").await.location(), "/admin/login");
    // Nobody locks themselves out.
    let r = kim
        .post("/admin/users/active", &[("username", "kim"), ("active", "off")])
        .await;
    assert_eq!(r.status, StatusCode::CONFLICT);
    assert_eq!(
        audit_actions(&app, "admin:kim").await,
        ["user_staff_set", "user_disabled"]
    );
}

#[tokio::test]
async fn a_post_without_or_with_a_wrong_csrf_token_is_403_and_changes_nothing() {
    let app = TestApp::spawn().await;
    staff(&app, "sam").await;
    person(&app, "pat").await;
    let mut c = Console::signed_in(&app, "sam", STAFF_PASSWORD).await;
    for fields in [
        vec![("username", "pat"), ("active", "off")],
        vec![("csrf", "forged"), ("username", "pat"), ("active", "off")],
    ] {
        let r = c.post_raw("/admin/users/active", &fields).await;
        assert_eq!(r.status, StatusCode::FORBIDDEN);
        assert!(r.body.contains("Form refused"));
    }
    // Another session's token is not this session's.
    let other = Console::signed_in(&app, "sam", STAFF_PASSWORD).await;
    let r = c
        .post_raw(
            "/admin/users/active",
            &[("csrf", &other.csrf), ("username", "pat"), ("active", "off")],
        )
        .await;
    assert_eq!(r.status, StatusCode::FORBIDDEN);
    assert!(users::by_username(&app.pg, "pat").await.unwrap().unwrap().active);
    // The sign-in form has its own token: a POST without the form's cookie is refused.
    let mut fresh = Console::new(&app);
    let r = fresh
        .post_raw(
            "/admin/login",
            &[("csrf", "x"), ("username", "sam"), ("password", STAFF_PASSWORD)],
        )
        .await;
    assert_eq!(r.status, StatusCode::FORBIDDEN);
}

#[tokio::test]
async fn the_token_picker_offers_only_libraries_the_user_owns_or_manages() {
    let app = TestApp::spawn().await;
    let (a, b, c_lib) = (
        app.library("own").await,
        app.library("managed").await,
        app.library("read").await,
    );
    person(&app, "pat").await;
    users::grant(&app.pg, "pat", &a, Role::Owner).await.unwrap();
    users::grant(&app.pg, "pat", &b, Role::Manager).await.unwrap();
    users::grant(&app.pg, "pat", &c_lib, Role::Reader).await.unwrap();
    staff(&app, "sam").await;
    let mut c = Console::signed_in(&app, "sam", STAFF_PASSWORD).await;
    let step1 = c.get("/admin/tokens/new").await;
    assert!(step1.body.contains("<option value=\"pat\">"), "{}", step1.body);
    let picker = c.get("/admin/tokens/new?user=pat").await;
    assert_eq!(picker.status, StatusCode::OK);
    assert!(picker.body.contains(&format!("value=\"{a}\"")));
    assert!(picker.body.contains(&format!("value=\"{b}\"")));
    assert!(
        !picker.body.contains(&format!("value=\"{c_lib}\"")),
        "reader role is not offered"
    );
    // A forged choice outside the picker is refused, naming the field; nothing is written.
    let r = c
        .post(
            "/admin/tokens",
            &[("user", "pat"), ("name", "x"), ("library", &a), ("library", &c_lib)],
        )
        .await;
    assert_eq!(r.status, StatusCode::BAD_REQUEST);
    assert!(r.body.contains("is not owner or manager of"), "{}", r.body);
    assert!(r.body.contains(&c_lib));
    assert!(plaintext_in(&r.body).is_none());
    let r = c
        .post(
            "/admin/tokens",
            &[("user", "pat"), ("library", &a), ("expires_at", "someday")],
        )
        .await;
    assert_eq!(r.status, StatusCode::BAD_REQUEST);
    assert!(r.body.contains("Expiry:"));
    assert!(mnemosyne::store::pg::tokens::list(&app.pg, Some("pat"))
        .await
        .unwrap()
        .is_empty());
}

#[tokio::test]
async fn a_minted_token_is_shown_exactly_once_works_on_mcp_and_is_refused_after_revoke() {
    let app = TestApp::spawn().await;
    let s = seed(&app).await;
    person(&app, "pat").await;
    users::grant(&app.pg, "pat", &s.lib_a, Role::Owner).await.unwrap();
    users::grant(&app.pg, "pat", &s.lib_c, Role::Manager).await.unwrap();
    staff(&app, "sam").await;
    let mut c = Console::signed_in(&app, "sam", STAFF_PASSWORD).await;
    c.get("/admin/tokens/new?user=pat").await;
    let r = c
        .post(
            "/admin/tokens",
            &[
                ("user", "pat"),
                ("name", "laptop"),
                ("library", &s.lib_c),
                ("library", &s.lib_a),
                ("expires_at", "2099-01-01T00:00"),
            ],
        )
        .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.body);
    let plaintext = plaintext_in(&r.body).expect("plaintext on the result page");
    assert_eq!(
        r.body.matches(&plaintext).count(),
        2,
        "once in the box, once in the client snippet"
    );
    for page in ["/admin/tokens", "/admin/audit", "/admin/search", "/admin/"] {
        assert!(
            !c.get(page).await.body.contains(&plaintext),
            "{page} shows the plaintext"
        );
    }
    let mut mcp = app.mcp(&plaintext).connect().await;
    assert_eq!(
        mcp.library_uids().await,
        [s.lib_c.clone(), s.lib_a.clone()],
        "picker order kept"
    );
    let hits = mcp.call_ok("search", json!({"query": "Zanzibarine"})).await;
    let libs: std::collections::BTreeSet<String> = hits["results"]
        .as_array()
        .unwrap()
        .iter()
        .map(|h| h["library_uid"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(libs, [s.lib_a.clone(), s.lib_c.clone()].into_iter().collect());
    let id = mnemosyne::store::pg::tokens::list(&app.pg, Some("pat")).await.unwrap()[0].id;
    let list = c.get("/admin/tokens").await;
    assert!(list.body.contains("laptop") && list.body.contains("2099-01-01"));
    let r = c.post("/admin/tokens/revoke", &[("id", &id.to_string())]).await;
    assert_eq!(r.status, StatusCode::SEE_OTHER);
    assert_eq!(r.location(), "/admin/tokens?ok=token-revoked");
    let refused = app.mcp(&plaintext).initialize().await;
    assert_eq!(refused.status, StatusCode::UNAUTHORIZED);
    assert_eq!(refused.json()["error_description"], "Invalid MCP token.");
    assert_eq!(
        audit_actions(&app, "admin:sam").await,
        ["token_created", "token_revoked"]
    );
    let detail: serde_json::Value =
        sqlx::query_scalar("SELECT detail FROM audit_events WHERE action = 'token_created'")
            .fetch_one(&app.pg)
            .await
            .unwrap();
    assert_eq!(detail["user"], "pat");
    assert!(!detail.to_string().contains("mnm_"));
}

#[tokio::test]
async fn a_token_without_libraries_is_allowed_and_reads_nothing() {
    let app = TestApp::spawn().await;
    seed(&app).await;
    person(&app, "pat").await;
    staff(&app, "sam").await;
    let mut c = Console::signed_in(&app, "sam", STAFF_PASSWORD).await;
    let r = c.post("/admin/tokens", &[("user", "pat"), ("name", "empty")]).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.body);
    let plaintext = plaintext_in(&r.body).unwrap();
    let mut mcp = app.mcp(&plaintext).connect().await;
    assert!(mcp.library_uids().await.is_empty());
}

#[tokio::test]
async fn the_self_service_page_mints_and_revokes_only_your_own_tokens() {
    let app = TestApp::spawn().await;
    let (a, b) = (app.library("mine").await, app.library("theirs").await);
    person(&app, "pat").await;
    person(&app, "lee").await;
    users::grant(&app.pg, "pat", &a, Role::Manager).await.unwrap();
    users::grant(&app.pg, "lee", &b, Role::Owner).await.unwrap();
    let lee_token = app_token(&app, "lee", &b).await;
    let mut c = Console::signed_in(&app, "pat", STAFF_PASSWORD).await;
    let me = c.get("/admin/me").await;
    assert!(me.body.contains(&format!("value=\"{a}\"")));
    assert!(!me.body.contains(&format!("value=\"{b}\"")));
    let r = c.post("/admin/me/tokens", &[("name", "cli"), ("library", &b)]).await;
    assert_eq!(r.status, StatusCode::BAD_REQUEST, "not theirs to scope");
    let r = c.post("/admin/me/tokens", &[("name", "cli"), ("library", &a)]).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.body);
    let plaintext = plaintext_in(&r.body).unwrap();
    assert_eq!(app.mcp(&plaintext).connect().await.library_uids().await, [a.clone()]);
    // lee's token is not on pat's page and cannot be revoked by pat.
    let me = c.get("/admin/me").await;
    assert!(me.body.contains("cli"));
    let lee_id = mnemosyne::store::pg::tokens::list(&app.pg, Some("lee")).await.unwrap()[0].id;
    let r = c.post("/admin/me/tokens/revoke", &[("id", &lee_id.to_string())]).await;
    assert_eq!(r.status, StatusCode::NOT_FOUND);
    assert_eq!(app.mcp(&lee_token).connect().await.library_uids().await, [b.clone()]);
    let own_id = mnemosyne::store::pg::tokens::list(&app.pg, Some("pat")).await.unwrap()[0].id;
    let r = c.post("/admin/me/tokens/revoke", &[("id", &own_id.to_string())]).await;
    assert_eq!(r.location(), "/admin/me?ok=token-revoked");
    assert_eq!(app.mcp(&plaintext).initialize().await.status, StatusCode::UNAUTHORIZED);
}

async fn app_token(app: &TestApp, user: &str, lib: &str) -> String {
    mnemosyne::service::tokens::mint(&app.pg, user, "t", &[lib.to_owned()], None)
        .await
        .unwrap()
        .plaintext
}

#[tokio::test]
async fn rotating_a_team_shows_the_jwt_once_with_its_secrets_snippet_and_the_old_one_is_refused() {
    let app = TestApp::spawn().await;
    let s = seed(&app).await;
    let (id, old) = app.create_team("Kottos").await;
    app.put_workspaces(id, &[s.ws_a.clone()]).await;
    staff(&app, "sam").await;
    let mut c = Console::signed_in(&app, "sam", STAFF_PASSWORD).await;
    let list = c.get("/admin/teams").await;
    assert!(list.body.contains("Kottos") && list.body.contains(&s.ws_a));
    c.get(&format!("/admin/teams/{id}")).await;
    let r = c.post(&format!("/admin/teams/{id}/rotate"), &[]).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.body);
    let new = jwt_in(&r.body).unwrap();
    assert!(r.body.contains("fastagent.secrets.yaml"));
    assert!(r.body.contains(&format!("Authorization: Bearer {new}")));
    let refused = app.mcp(&old).initialize().await;
    assert_eq!(refused.status, StatusCode::UNAUTHORIZED);
    assert_eq!(refused.json()["error_description"], "Invalid MCP token.");
    assert_eq!(app.mcp(&new).connect().await.library_uids().await, [s.lib_a.clone()]);
    assert!(!c.get(&format!("/admin/teams/{id}")).await.body.contains(&new));
    assert_eq!(audit_actions(&app, "admin:sam").await, ["team_rotated"]);
}

#[tokio::test]
async fn team_workspaces_are_edited_and_a_deactivated_team_is_refused() {
    let app = TestApp::spawn().await;
    let s = seed(&app).await;
    let (id, jwt) = app.create_team("Kottos").await;
    staff(&app, "sam").await;
    let mut c = Console::signed_in(&app, "sam", STAFF_PASSWORD).await;
    c.get(&format!("/admin/teams/{id}")).await;
    let long = "w".repeat(65);
    let bad = format!("{}\n{long}", s.ws_a);
    let r = c
        .post(&format!("/admin/teams/{id}/workspaces"), &[("workspace_ids", &bad)])
        .await;
    assert_eq!(r.status, StatusCode::BAD_REQUEST);
    assert!(
        r.body.contains("workspace_ids[1]") || r.body.contains("at most 64"),
        "{}",
        r.body
    );
    assert!(r.body.contains(&long), "the form comes back as typed");
    let both = format!("{}\n{}\n{}", s.ws_b, s.ws_a, s.ws_b);
    let r = c
        .post(&format!("/admin/teams/{id}/workspaces"), &[("workspace_ids", &both)])
        .await;
    assert_eq!(r.status, StatusCode::SEE_OTHER);
    assert_eq!(r.location(), format!("/admin/teams/{id}?ok=team-workspaces"));
    assert_eq!(
        app.mcp(&jwt).connect().await.library_uids().await,
        [s.lib_b.clone(), s.lib_a.clone()]
    );
    let r = c.post(&format!("/admin/teams/{id}/deactivate"), &[]).await;
    assert_eq!(r.status, StatusCode::SEE_OTHER);
    let refused = app.mcp(&jwt).initialize().await;
    assert_eq!(refused.json()["error_description"], "Token has been deactivated.");
    let page = c.get(&format!("/admin/teams/{id}?ok=team-deactivated")).await;
    assert!(page.body.contains("deactivated"));
    assert!(!page.body.contains("/rotate\""), "no rotate form on an inactive team");
    assert_eq!(
        audit_actions(&app, "admin:sam").await,
        ["team_workspaces_updated", "team_deleted"]
    );
}

#[tokio::test]
async fn signing_keys_show_the_secret_once_and_retiring_needs_confirmation_and_stops_its_jwts() {
    let app = TestApp::spawn().await;
    staff(&app, "sam").await;
    let mut c = Console::signed_in(&app, "sam", STAFF_PASSWORD).await;
    c.get("/admin/keys").await;
    let r = c.post("/admin/keys", &[]).await;
    assert_eq!(r.status, StatusCode::OK);
    let newest = mnemosyne::store::pg::keys::newest_active(&app.pg)
        .await
        .unwrap()
        .unwrap();
    assert!(r.body.contains(&newest.secret_hex));
    let list = c.get("/admin/keys").await;
    assert!(list.body.contains(&newest.kid) && !list.body.contains(&newest.secret_hex));
    let (_, jwt) = app.create_team("Signed with the newest").await;
    assert_eq!(app.mcp(&jwt).initialize().await.status, StatusCode::OK);
    let confirm = c.get(&format!("/admin/keys/retire?kid={}", newest.kid)).await;
    assert!(confirm.body.contains("stops working"), "{}", confirm.body);
    let r = c.post("/admin/keys/retire", &[("kid", &newest.kid)]).await;
    assert_eq!(r.location(), "/admin/keys?ok=key-retired");
    let refused = app.mcp(&jwt).initialize().await;
    assert_eq!(refused.json()["error_description"], "Invalid MCP token.");
    assert_eq!(
        audit_actions(&app, "admin:sam").await,
        ["signing_key_created", "signing_key_retired"]
    );
}

#[tokio::test]
async fn users_are_created_with_named_errors_reset_and_disabled_users_tokens_stop() {
    let app = TestApp::spawn().await;
    let lib = app.library("l").await;
    staff(&app, "sam").await;
    let mut c = Console::signed_in(&app, "sam", STAFF_PASSWORD).await;
    c.get("/admin/users").await;
    let r = c
        .post(
            "/admin/users",
            &[("username", "bad name"), ("password", "long-enough-1")],
        )
        .await;
    assert_eq!(r.status, StatusCode::BAD_REQUEST);
    assert!(r.body.contains("username must be"), "{}", r.body);
    let r = c
        .post(
            "/admin/users",
            &[("username", "amy"), ("password", "short"), ("staff", "on")],
        )
        .await;
    assert_eq!(r.status, StatusCode::BAD_REQUEST);
    assert!(r.body.contains("at least 8 characters"));
    assert!(r.body.contains("value=\"amy\""), "the form comes back filled in");
    let r = c
        .post("/admin/users", &[("username", "amy"), ("password", "long-enough-1")])
        .await;
    assert_eq!(r.location(), "/admin/users?ok=user-created");
    let r = c
        .post("/admin/users", &[("username", "amy"), ("password", "long-enough-1")])
        .await;
    assert!(r.body.contains("already exists"));
    users::grant(&app.pg, "amy", &lib, Role::Owner).await.unwrap();
    let token = app_token(&app, "amy", &lib).await;
    let r = c
        .post(
            "/admin/users/password",
            &[("username", "amy"), ("new_password", "new-password-2")],
        )
        .await;
    assert_eq!(r.status, StatusCode::SEE_OTHER);
    Console::signed_in(&app, "amy", "new-password-2").await;
    let r = c
        .post("/admin/users/staff", &[("username", SERVICE_USER), ("staff", "on")])
        .await;
    assert_eq!(r.status, StatusCode::BAD_REQUEST, "a service account cannot be staff");
    let r = c
        .post("/admin/users/active", &[("username", "amy"), ("active", "off")])
        .await;
    assert_eq!(r.location(), "/admin/users?ok=user-disabled");
    let refused = app.mcp(&token).initialize().await;
    assert_eq!(refused.json()["error_description"], "User account is disabled.");
    assert_eq!(
        audit_actions(&app, "admin:sam").await,
        ["user_created", "user_password_set", "user_disabled"]
    );
}

#[tokio::test]
async fn libraries_show_counts_and_memberships_keep_an_owner() {
    let app = TestApp::spawn().await;
    let s = seed(&app).await;
    person(&app, "pat").await;
    person(&app, "lee").await;
    staff(&app, "sam").await;
    let mut c = Console::signed_in(&app, "sam", STAFF_PASSWORD).await;
    // The list is paged in uid order over the shared graph: each library is
    // on the page that starts just before its uid.
    let ws_lib = mnemosyne::store::graph::ingest::workspace_library_uid(&s.ws_a);
    for (uid, shown) in [(&s.lib_a, &s.lib_a), (&ws_lib, &s.ws_a), (&s.lib_c, &s.lib_c)] {
        let list = c
            .get(&format!("/admin/libraries?after={}&limit=200", &uid[..uid.len() - 1]))
            .await;
        assert_eq!(list.status, StatusCode::OK);
        assert!(list.body.contains(shown.as_str()), "{uid} not listed");
    }
    let path = format!("/admin/library?uid={}", s.lib_a);
    let detail = c.get(&path).await;
    assert!(detail.body.contains("2 items"), "{}", detail.body);
    let r = c
        .post(
            "/admin/library/grant",
            &[("library_uid", &s.lib_a), ("username", "pat"), ("role", "owner")],
        )
        .await;
    assert_eq!(r.status, StatusCode::SEE_OTHER, "{}", r.body);
    let r = c
        .post(
            "/admin/library/grant",
            &[("library_uid", &s.lib_a), ("username", "lee"), ("role", "boss")],
        )
        .await;
    assert_eq!(r.status, StatusCode::BAD_REQUEST);
    let r = c
        .post(
            "/admin/library/revoke",
            &[("library_uid", &s.lib_a), ("username", "pat"), ("role", "owner")],
        )
        .await;
    assert_eq!(r.status, StatusCode::BAD_REQUEST, "the last owner stays");
    assert!(r.body.contains("at least one owner"));
    c.post(
        "/admin/library/grant",
        &[("library_uid", &s.lib_a), ("username", "lee"), ("role", "owner")],
    )
    .await;
    let r = c
        .post(
            "/admin/library/revoke",
            &[("library_uid", &s.lib_a), ("username", "pat"), ("role", "owner")],
        )
        .await;
    assert_eq!(r.status, StatusCode::SEE_OTHER);
    let m = users::memberships(&app.pg, None, Some(&s.lib_a)).await.unwrap();
    assert_eq!(m.iter().map(|m| m.username.as_str()).collect::<Vec<_>>(), ["lee"]);
    assert_eq!(
        audit_actions(&app, "admin:sam").await,
        ["membership_granted", "membership_granted", "membership_revoked"]
    );
}

#[tokio::test]
async fn admin_search_spans_every_library_and_search_as_shows_a_principals_view() {
    let app = TestApp::spawn().await;
    let s = seed(&app).await;
    let (team, _) = app.create_team("Kottos").await;
    app.put_workspaces(team, &[s.ws_b.clone()]).await;
    staff(&app, "sam").await;
    let mut c = Console::signed_in(&app, "sam", STAFF_PASSWORD).await;
    let r = c.get("/admin/search?q=Zanzibarine").await;
    assert_eq!(r.status, StatusCode::OK);
    for lib in [&s.lib_a, &s.lib_b, &s.lib_c] {
        assert!(r.body.contains(lib.as_str()), "{lib} missing");
    }
    let r = c.get(&format!("/admin/search?q=Zanzibarine&library={}", s.lib_c)).await;
    assert!(r.body.contains(&s.lib_c) && !r.body.contains(&format!("<code>{}</code>", s.lib_a)));
    let r = c.get(&format!("/admin/search?q=Zanzibarine&as=team:{team}")).await;
    assert!(r.body.contains("resolved_libraries (1)"), "{}", r.body);
    assert!(r.body.contains(&format!("<td><code>{}</code></td>", s.lib_b)));
    assert!(!r.body.contains(&format!("<td><code>{}</code></td>", s.lib_a)));
    app.opaque_token(&[s.lib_c.clone()]).await;
    let id = mnemosyne::store::pg::tokens::list(&app.pg, None)
        .await
        .unwrap()
        .last()
        .unwrap()
        .id;
    let r = c.get(&format!("/admin/search?q=Zanzibarine&as=token:{id}")).await;
    assert!(r.body.contains("resolved_libraries (1)"));
    assert!(r.body.contains(&format!("<td><code>{}</code></td>", s.lib_c)));
    mnemosyne::service::tokens::revoke(&app.pg, &app.state.changes, id)
        .await
        .unwrap()
        .unwrap();
    let r = c.get(&format!("/admin/search?q=Zanzibarine&as=token:{id}")).await;
    assert!(r.body.contains("refused on /mcp: Invalid MCP token."), "{}", r.body);
}

#[tokio::test]
async fn the_overview_shows_health_and_counts_and_audit_filters_by_action_and_actor() {
    let app = TestApp::spawn().await;
    app.create_team("Kottos").await;
    staff(&app, "sam").await;
    let mut c = Console::signed_in(&app, "sam", STAFF_PASSWORD).await;
    let o = c.get("/admin/").await;
    assert!(o.body.contains("Store health"));
    assert!(!o.body.contains("<script"), "no JavaScript");
    let css = c.get("/admin/static/admin.css").await;
    assert_eq!(css.status, StatusCode::OK);
    assert!(css.headers["content-type"].to_str().unwrap().starts_with("text/css"));
    assert!(css.body.contains("@media"), "phone widths");
    assert!(o.body.contains("<b>1</b>active teams"), "{}", o.body);
    c.post("/admin/keys", &[]).await;
    let all = c.get("/admin/audit").await;
    assert!(all.body.contains("team_created") && all.body.contains("signing_key_created"));
    let newest_first = all.body.find("signing_key_created").unwrap() < all.body.find("team_created").unwrap();
    assert!(newest_first);
    let by_action = c.get("/admin/audit?action=team_created").await;
    assert!(by_action.body.contains(SERVICE_USER) && !by_action.body.contains("<td>signing_key_created</td>"));
    let by_actor = c.get("/admin/audit?actor=admin:sam").await;
    assert!(by_actor.body.contains("<td>signing_key_created</td>") && !by_actor.body.contains("<td>team_created</td>"));
}

#[tokio::test]
async fn cli_token_create_without_a_library_and_json_output() {
    let app = TestApp::spawn().await;
    let run = |args: &[&str]| {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_mnemosyne"))
            .args(args)
            .env("MNEMOSYNE_DATABASE_URL", &app.settings.database_url)
            .output()
            .unwrap();
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        String::from_utf8(out.stdout).unwrap()
    };
    run(&["user", "create", "pat"]);
    let created: serde_json::Value =
        serde_json::from_str(&run(&["token", "create", "--user", "pat", "--json"])).unwrap();
    let token = created["token"].as_str().unwrap();
    assert!(token.starts_with("mnm_"));
    assert_eq!(created["libraries"], json!([]));
    assert!(app.mcp(token).connect().await.library_uids().await.is_empty());
    let listed: serde_json::Value = serde_json::from_str(&run(&["token", "list", "--json"])).unwrap();
    assert_eq!(listed[0]["user"], "pat");
    assert!(!listed.to_string().contains(token));
    let key: serde_json::Value = serde_json::from_str(&run(&["signing-key", "create", "--json"])).unwrap();
    assert_eq!(key["secret"].as_str().unwrap().len(), 64);
    let users: serde_json::Value = serde_json::from_str(&run(&["user", "list", "--json"])).unwrap();
    assert!(users
        .as_array()
        .unwrap()
        .iter()
        .any(|u| u["username"] == "pat" && u["staff"] == false));
    let lib = app.uid("lib");
    let granted: serde_json::Value =
        serde_json::from_str(&run(&["membership", "grant", "pat", &lib, "manager", "--json"])).unwrap();
    assert_eq!(
        granted,
        json!({"username": "pat", "library_uid": lib, "role": "manager", "granted": true})
    );
    assert_eq!(
        run(&["membership", "revoke", "pat", &lib, "manager"]).trim(),
        format!("revoked manager on {lib} from pat")
    );
    run(&["user", "set-staff", "pat"]);
    assert!(users::by_username(&app.pg, "pat").await.unwrap().unwrap().is_staff);
    run(&["user", "set-staff", "pat", "--off"]);
    assert!(!users::by_username(&app.pg, "pat").await.unwrap().unwrap().is_staff);
    assert_eq!(
        run(&["token", "create", "--user", "pat"]).lines().count(),
        2,
        "human format by default"
    );
}

#[tokio::test]
async fn on_the_self_service_page_an_owner_grants_any_role_and_a_manager_only_reader() {
    let app = TestApp::spawn().await;
    let lib = app.library("shared").await;
    person(&app, "olga").await;
    person(&app, "mona").await;
    person(&app, "rita").await;
    users::grant(&app.pg, "olga", &lib, Role::Owner).await.unwrap();
    users::grant(&app.pg, "mona", &lib, Role::Manager).await.unwrap();
    let mut mona = Console::signed_in(&app, "mona", STAFF_PASSWORD).await;
    let page = mona.get("/admin/me").await;
    assert!(page.body.contains("Libraries I own or manage"));
    assert!(
        !page.body.contains("<option value=\"manager\">"),
        "a manager is offered reader only"
    );
    let r = mona
        .post(
            "/admin/me/grant",
            &[("library_uid", &lib), ("username", "rita"), ("role", "manager")],
        )
        .await;
    assert_eq!(r.status, StatusCode::BAD_REQUEST);
    assert!(r.body.contains("a manager may not grant manager"), "{}", r.body);
    let r = mona
        .post(
            "/admin/me/grant",
            &[("library_uid", &lib), ("username", "rita"), ("role", "reader")],
        )
        .await;
    assert_eq!(r.location(), "/admin/me?ok=granted");
    let r = mona
        .post(
            "/admin/me/revoke",
            &[("library_uid", &lib), ("username", "olga"), ("role", "owner")],
        )
        .await;
    assert_eq!(r.status, StatusCode::BAD_REQUEST, "a manager cannot remove an owner");
    let mut olga = Console::signed_in(&app, "olga", STAFF_PASSWORD).await;
    let r = olga
        .post(
            "/admin/me/grant",
            &[("library_uid", &lib), ("username", "rita"), ("role", "manager")],
        )
        .await;
    assert_eq!(r.location(), "/admin/me?ok=granted");
    let r = olga
        .post(
            "/admin/me/revoke",
            &[("library_uid", &lib), ("username", "olga"), ("role", "owner")],
        )
        .await;
    assert_eq!(r.status, StatusCode::BAD_REQUEST);
    assert!(r.body.contains("at least one owner"));
    // rita, a reader and manager now, has no say on a library she has no role on.
    let other = app.library("other").await;
    let mut rita = Console::signed_in(&app, "rita", STAFF_PASSWORD).await;
    let r = rita
        .post(
            "/admin/me/grant",
            &[("library_uid", &other), ("username", "rita"), ("role", "owner")],
        )
        .await;
    assert_eq!(r.status, StatusCode::BAD_REQUEST);
    assert!(users::memberships(&app.pg, Some("rita"), Some(&other))
        .await
        .unwrap()
        .is_empty());
    assert_eq!(audit_actions(&app, "admin:mona").await, ["membership_granted"]);
}

#[tokio::test]
async fn a_console_revoke_applies_on_the_next_request_of_another_replica() {
    let app = TestApp::spawn().await;
    let lib = app.library("l").await;
    let other = app.second_instance().await;
    let token = app.opaque_token(&[lib.clone()]).await;
    let mut on_other = other.mcp(&token).connect().await;
    assert_eq!(
        on_other.library_uids().await,
        [lib.clone()],
        "cached on the other replica"
    );
    staff(&app, "sam").await;
    let mut c = Console::signed_in(&app, "sam", STAFF_PASSWORD).await;
    c.get("/admin/tokens").await;
    let id = mnemosyne::store::pg::tokens::list(&app.pg, None).await.unwrap()[0].id;
    let r = c.post("/admin/tokens/revoke", &[("id", &id.to_string())]).await;
    assert_eq!(
        r.location(),
        "/admin/tokens?ok=token-revoked",
        "fence confirmed by both replicas"
    );
    // No wait: the console answered after the fence.
    let refused = other.mcp(&token).initialize().await;
    assert_eq!(refused.status, StatusCode::UNAUTHORIZED);
}

#[tokio::test]
async fn a_staff_user_with_a_150_character_name_can_write_and_is_audited() {
    let app = TestApp::spawn().await;
    let name = "s".repeat(150);
    staff(&app, &name).await;
    let mut c = Console::signed_in(&app, &name, STAFF_PASSWORD).await;
    let r = c
        .post(
            "/admin/users",
            &[("username", "newcomer"), ("password", "a-long-password")],
        )
        .await;
    assert_eq!(r.status, StatusCode::SEE_OTHER, "{}", r.body);
    assert_eq!(audit_actions(&app, &format!("admin:{name}")).await, ["user_created"]);
}

#[tokio::test]
async fn a_switch_field_other_than_on_or_off_is_a_400_naming_it_and_changes_nothing() {
    let app = TestApp::spawn().await;
    staff(&app, "sam").await;
    person(&app, "pat").await;
    let mut c = Console::signed_in(&app, "sam", STAFF_PASSWORD).await;
    for (path, field) in [("/admin/users/active", "active"), ("/admin/users/staff", "staff")] {
        let r = c.post(path, &[("username", "pat"), (field, "true")]).await;
        assert_eq!(r.status, StatusCode::BAD_REQUEST, "{}", r.body);
        assert!(r.body.contains(&format!("{field} must be on or off")), "{}", r.body);
    }
    let pat = users::by_username(&app.pg, "pat").await.unwrap().unwrap();
    assert!(pat.active && !pat.is_staff);
    let r = c.post("/admin/tokens/revoke", &[("id", "not-a-number")]).await;
    assert_eq!(r.status, StatusCode::BAD_REQUEST);
    assert!(r.body.contains("id must be a token id"), "{}", r.body);
}

#[tokio::test]
async fn console_sign_in_failures_count_per_account_across_addresses() {
    use axum::extract::FromRef;
    use mnemosyne::auth::basic::{verify_password, Accept, BasicContext};
    let app = TestApp::spawn_with(|s| s.basic_failures_per_minute = 6).await;
    staff(&app, "sam").await;
    let ctx = BasicContext::from_ref(&app.state);
    // A guess from each of 20 addresses: each address stays under its own
    // limit, but the account's limit is reached.
    let mut throttled = 0;
    for i in 0..20 {
        let r = verify_password(
            &ctx,
            "sam".into(),
            format!("guess-{i}"),
            format!("10.0.0.{i}"),
            Accept::Person,
        )
        .await;
        match r {
            Err(mnemosyne::error::ApiError::RateLimited { .. }) => throttled += 1,
            Err(mnemosyne::error::ApiError::BasicUnauthorized) => {}
            other => panic!("{other:?}"),
        }
    }
    assert!(throttled > 0, "guessing from many addresses is throttled per account");
    // HTTP Basic keeps counting per address only: the service account is not
    // locked out by guesses from elsewhere.
    let mut basic_throttled = 0;
    for i in 0..20 {
        let r = verify_password(
            &ctx,
            SERVICE_USER.into(),
            format!("guess-{i}"),
            format!("10.1.0.{i}"),
            Accept::ServiceAccount,
        )
        .await;
        if matches!(r, Err(mnemosyne::error::ApiError::RateLimited { .. })) {
            basic_throttled += 1;
        }
    }
    assert_eq!(basic_throttled, 0);
}

/// The value of the first `name="once"` hidden field.
fn once_in(html: &str) -> String {
    let at = html.find("name=\"once\" value=\"").expect("a once field") + "name=\"once\" value=\"".len();
    html[at..].split('"').next().unwrap().to_owned()
}

#[tokio::test]
async fn reloading_a_result_page_does_not_create_a_key_or_rotate_a_team_twice() {
    let app = TestApp::spawn().await;
    staff(&app, "sam").await;
    let mut c = Console::signed_in(&app, "sam", STAFF_PASSWORD).await;
    let keys_before: i64 = sqlx::query_scalar("SELECT count(*) FROM mcp_signing_keys")
        .fetch_one(&app.pg)
        .await
        .unwrap();
    let page = c.get("/admin/keys").await;
    let once = once_in(&page.body);
    let csrf = c.csrf.clone();
    // The browser sends the form; then a reload sends exactly the same body.
    let first = c.post_raw("/admin/keys", &[("csrf", &csrf), ("once", &once)]).await;
    assert_eq!(first.status, StatusCode::OK, "{}", first.body);
    let again = c.post_raw("/admin/keys", &[("csrf", &csrf), ("once", &once)]).await;
    assert_eq!(again.status, StatusCode::CONFLICT);
    assert!(again.body.contains("already submitted"), "{}", again.body);
    let keys_after: i64 = sqlx::query_scalar("SELECT count(*) FROM mcp_signing_keys")
        .fetch_one(&app.pg)
        .await
        .unwrap();
    assert_eq!(keys_after, keys_before + 1, "one key, not two");
    // A rotation: the JWT shown by the first answer stays the team's JWT.
    let (team, _) = app.create_team("Reloaded").await;
    let detail = c.get(&format!("/admin/teams/{team}")).await;
    let once = once_in(&detail.body);
    let csrf = c.csrf.clone();
    let path = format!("/admin/teams/{team}/rotate");
    let rotated = c.post_raw(&path, &[("csrf", &csrf), ("once", &once)]).await;
    assert_eq!(rotated.status, StatusCode::OK, "{}", rotated.body);
    let jwt = jwt_in(&rotated.body).expect("the new JWT on the result page");
    assert_eq!(
        c.post_raw(&path, &[("csrf", &csrf), ("once", &once)]).await.status,
        StatusCode::CONFLICT
    );
    assert_eq!(app.mcp(&jwt).initialize().await.status, StatusCode::OK);
    // A fresh form (the page opened again) works as before.
    let detail = c.get(&format!("/admin/teams/{team}")).await;
    let once = once_in(&detail.body);
    let csrf = c.csrf.clone();
    assert_eq!(
        c.post_raw(&path, &[("csrf", &csrf), ("once", &once)]).await.status,
        StatusCode::OK
    );
}

/// Hardening 3, row 4: a signed-in person posting a 4 MiB form of distinct
/// `library=` values gets a prompt 400 naming `libraries` (a cap checked
/// before any per-value work), and the server keeps answering meanwhile.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_four_mib_library_form_is_a_fast_400_and_healthz_keeps_answering() {
    let app = TestApp::spawn().await;
    let a = app.library("mine").await;
    person(&app, "pat").await;
    users::grant(&app.pg, "pat", &a, Role::Owner).await.unwrap();
    let mut c = Console::signed_in(&app, "pat", STAFF_PASSWORD).await;
    let values: Vec<String> = (0..170_000).map(|i| format!("lib_{i:08}x")).collect();
    let mut fields: Vec<(&str, &str)> = vec![("name", "flood")];
    fields.extend(values.iter().map(|v| ("library", v.as_str())));
    let done = Arc::new(AtomicBool::new(false));
    let probe = {
        let (http, url, done) = (app.http.clone(), app.url("/healthz"), done.clone());
        tokio::spawn(async move {
            let mut answered = 0;
            // Bounded: at most 600 probes (60 s).
            for _ in 0..600 {
                if done.load(Ordering::SeqCst) {
                    break;
                }
                let r = tokio::time::timeout(Duration::from_secs(1), http.get(&url).send()).await;
                assert!(
                    matches!(r, Ok(Ok(ref r)) if r.status().is_success()),
                    "healthz did not answer within 1 s"
                );
                answered += 1;
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            answered
        })
    };
    let r = c.post("/admin/me/tokens", &fields).await;
    done.store(true, Ordering::SeqCst);
    assert_eq!(
        r.status,
        StatusCode::BAD_REQUEST,
        "{}",
        &r.body[..r.body.len().min(300)]
    );
    assert!(r.body.contains("libraries"), "names the field");
    assert!(probe.await.unwrap() >= 1);
}
