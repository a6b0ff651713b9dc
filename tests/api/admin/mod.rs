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

mod cheap_pages;
mod forms;
mod libraries;
mod limits;
mod pages;
mod people;
mod sign_in;
mod teams_and_keys;
mod tokens;

pub const STAFF_PASSWORD: &str = "staff-password-123";

/// A browser without JavaScript: no redirects followed, cookies kept by hand.
pub struct Console {
    http: reqwest::Client,
    base: String,
    pub cookies: Vec<(String, String)>,
    pub csrf: String,
    /// Sent with every request (e.g. what a proxy forwards).
    headers: Vec<(String, String)>,
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
            headers: Vec::new(),
        }
    }

    /// A console whose every request carries `name: value`.
    pub fn with_header(mut self, name: &str, value: &str) -> Console {
        self.headers.push((name.to_owned(), value.to_owned()));
        self
    }

    fn extra(&self, mut req: reqwest::RequestBuilder) -> reqwest::RequestBuilder {
        for (k, v) in &self.headers {
            req = req.header(k, v);
        }
        req
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
            .extra(self.http.get(format!("{}{path}", self.base)))
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
            .extra(self.http.post(format!("{}{path}", self.base)))
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
pub fn plaintext_in(html: &str) -> Option<String> {
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
pub async fn audit_actions(app: &TestApp, actor: &str) -> Vec<String> {
    sqlx::query_scalar(
        "SELECT action::text FROM audit_events WHERE actor = $1 AND action NOT LIKE 'console\\_%' ORDER BY id",
    )
    .bind(actor)
    .fetch_all(&app.pg)
    .await
    .unwrap()
}

async fn app_token(app: &TestApp, user: &str, lib: &str) -> String {
    mnemosyne::service::tokens::mint(&app.pg, user, "t", &[lib.to_owned()], None)
        .await
        .unwrap()
        .plaintext
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
