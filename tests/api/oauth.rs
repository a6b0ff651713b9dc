//! The embedded OAuth 2.1 authorization server (issue 48), end to end on the
//! real stores: discovery, registration, the consent page (the console's
//! sign-in, session and CSRF), the token endpoint with PKCE, refresh
//! rotation with reuse detection, revocation, and every refusal's RFC 6749
//! error code.

use std::time::Duration;

use mnemosyne::service::oauth::s256;
use mnemosyne::store::pg::users::{self, Role};
use reqwest::{header, StatusCode};
use serde_json::{json, Value};

use crate::admin::{person, Console, STAFF_PASSWORD};
use crate::helpers::{send, TestApp};

const REDIRECT: &str = "http://127.0.0.1:4000/callback";
/// The same loopback redirect on another port (RFC 8252 §7.3).
const REDIRECT_OTHER_PORT: &str = "http://127.0.0.1:53682/callback";
const VERIFIER: &str = "a-long-random-verifier-of-at-least-forty-three-characters-0123456789";
const STATE: &str = "st4te-xyz";

/// No redirects followed: every answer is looked at.
fn http() -> reqwest::Client {
    reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .timeout(Duration::from_secs(30))
        .build()
        .unwrap()
}

fn location(r: &reqwest::Response) -> String {
    r.headers()
        .get(header::LOCATION)
        .map(|v| v.to_str().unwrap().to_owned())
        .unwrap_or_default()
}

/// The query parameters of a redirect.
fn params(url: &str) -> std::collections::HashMap<String, String> {
    reqwest::Url::parse(url).unwrap().query_pairs().into_owned().collect()
}

/// A test world: a server, a person who owns two libraries (each with one
/// document), and a registered public client.
struct World {
    app: TestApp,
    alice: String,
    lib_a: String,
    lib_b: String,
    client_id: String,
}

/// A server whose public URL is the address it listens on, as a deployment's
/// is (tests otherwise run with the placeholder `http://127.0.0.1:0`): the
/// issuer, `iss` and the MCP resource are then URLs a client can reach.
fn on_its_own_url(s: &mut mnemosyne::config::Settings) {
    let port = crate::helpers::free_port();
    s.listen = format!("127.0.0.1:{port}").parse().unwrap();
    s.public_url = format!("http://127.0.0.1:{port}");
}

async fn world() -> World {
    let app = TestApp::spawn_with(on_its_own_url).await;
    let lib_a = app.library("oauth_a").await;
    let lib_b = app.library("oauth_b").await;
    for (lib, text) in [
        (&lib_a, "Quokkas of Rottnest island are marsupials."),
        (&lib_b, "Quokkas also appear in the second library."),
    ] {
        app.ingest(json!({"library_uid": lib, "item": {"title": "Quokka notes"}, "content": text}))
            .await;
    }
    let alice = person(&app, &format!("alice-{}", app.ns)).await;
    users::grant(&app.pg, &alice, &lib_a, Role::Owner).await.unwrap();
    users::grant(&app.pg, &alice, &lib_b, Role::Manager).await.unwrap();
    let client_id = register(&app, &[REDIRECT]).await;
    World {
        app,
        alice,
        lib_a,
        lib_b,
        client_id,
    }
}

async fn register(app: &TestApp, redirects: &[&str]) -> String {
    let (status, body) = send(app.http.post(app.url("/oauth/register")).json(&json!({
        "client_name": "Test MCP client",
        "redirect_uris": redirects,
        "grant_types": ["authorization_code", "refresh_token"],
        "response_types": ["code"],
        "token_endpoint_auth_method": "none",
    })))
    .await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    assert_eq!(body["token_endpoint_auth_method"], "none");
    body["client_id"].as_str().unwrap().to_owned()
}

impl World {
    fn resource(&self) -> String {
        self.app.url("/mcp")
    }

    /// The authorization request's query, with `change` applied
    /// (`(k, None)` drops a parameter).
    fn authorize_url(&self, change: &[(&str, Option<&str>)]) -> String {
        let challenge = s256(VERIFIER);
        let resource = self.resource();
        let mut p: Vec<(&str, String)> = vec![
            ("response_type", "code".into()),
            ("client_id", self.client_id.clone()),
            ("redirect_uri", REDIRECT_OTHER_PORT.into()),
            ("state", STATE.into()),
            ("scope", "mcp".into()),
            ("code_challenge", challenge),
            ("code_challenge_method", "S256".into()),
            ("resource", resource),
        ];
        for (k, v) in change {
            p.retain(|(pk, _)| pk != k);
            if let Some(v) = v {
                p.push((k, (*v).to_owned()));
            }
        }
        let q: String = form_urlencoded::Serializer::new(String::new())
            .extend_pairs(p.iter().map(|(k, v)| (*k, v.as_str())))
            .finish();
        self.app.url(&format!("/oauth/authorize?{q}"))
    }

    async fn authorize(&self, change: &[(&str, Option<&str>)]) -> reqwest::Response {
        http().get(self.authorize_url(change)).send().await.unwrap()
    }

    /// A checked request's consent page path.
    async fn consent_path(&self) -> String {
        let r = self.authorize(&[]).await;
        assert_eq!(r.status(), StatusCode::SEE_OTHER);
        let to = location(&r);
        assert!(to.starts_with("/admin/oauth/consent?request="), "{to}");
        to
    }

    async fn signed_in(&self) -> Console {
        Console::signed_in(&self.app, &self.alice, STAFF_PASSWORD).await
    }

    /// Consent as alice with `fields` (request and CSRF added): the redirect.
    async fn answer(&self, console: &mut Console, fields: &[(&str, &str)]) -> String {
        let path = self.consent_path().await;
        let page = console.get(&path).await;
        assert_eq!(page.status, StatusCode::OK, "{}", page.body);
        let request = path.rsplit('=').next().unwrap().to_owned();
        let mut all: Vec<(&str, &str)> = vec![("request", &request)];
        all.extend_from_slice(fields);
        // Nothing comes checked: the person ticks every tool.
        all.extend(mnemosyne::mcp::TOOLS.iter().map(|t| ("tool", *t)));
        let r = console.post("/admin/oauth/consent", &all).await;
        assert_eq!(r.status, StatusCode::SEE_OTHER, "{}", r.body);
        r.location().to_owned()
    }

    /// Approves lib_a only; the code.
    async fn code(&self, console: &mut Console) -> String {
        let to = self
            .answer(
                console,
                &[("decision", "approve"), ("library", &self.lib_a), ("lifetime", "30")],
            )
            .await;
        assert!(to.starts_with(REDIRECT_OTHER_PORT), "{to}");
        let p = params(&to);
        assert_eq!(p["state"], STATE);
        assert_eq!(p["iss"], self.app.base, "RFC 9207");
        p["code"].clone()
    }

    async fn token(&self, form: &[(&str, &str)]) -> (StatusCode, Value, reqwest::header::HeaderMap) {
        let r = http()
            .post(self.app.url("/oauth/token"))
            .form(form)
            .send()
            .await
            .unwrap();
        let (status, headers) = (r.status(), r.headers().clone());
        (status, r.json().await.unwrap_or(Value::Null), headers)
    }

    async fn exchange(&self, code: &str, verifier: &str) -> (StatusCode, Value) {
        let (s, v, _) = self
            .token(&[
                ("grant_type", "authorization_code"),
                ("code", code),
                ("redirect_uri", REDIRECT_OTHER_PORT),
                ("client_id", &self.client_id),
                ("code_verifier", verifier),
                ("resource", &self.resource()),
            ])
            .await;
        (s, v)
    }

    async fn refresh(&self, refresh_token: &str) -> (StatusCode, Value) {
        let (s, v, _) = self
            .token(&[
                ("grant_type", "refresh_token"),
                ("refresh_token", refresh_token),
                ("client_id", &self.client_id),
            ])
            .await;
        (s, v)
    }

    /// The whole flow: tokens for lib_a.
    async fn tokens(&self) -> Value {
        let mut c = self.signed_in().await;
        let code = self.code(&mut c).await;
        let (status, body) = self.exchange(&code, VERIFIER).await;
        assert_eq!(status, StatusCode::OK, "{body}");
        body
    }
}

async fn status_on_mcp(app: &TestApp, bearer: &str) -> StatusCode {
    app.mcp(bearer).initialize().await.status
}

fn assert_error(status: StatusCode, body: &Value, want: StatusCode, code: &str) {
    assert_eq!(status, want, "{body}");
    assert_eq!(body["error"], code, "{body}");
    assert!(body["error_description"].is_string(), "{body}");
}

// ---- discovery ----

#[tokio::test]
async fn protected_resource_metadata_names_the_embedded_issuer() {
    let app = TestApp::spawn().await;
    for path in [
        "/.well-known/oauth-protected-resource",
        "/.well-known/oauth-protected-resource/mcp",
    ] {
        let (status, body) = send(app.http.get(app.url(path))).await;
        assert_eq!(status, StatusCode::OK, "{path}");
        assert_eq!(body["resource"], "http://127.0.0.1:0/mcp");
        assert_eq!(body["authorization_servers"], json!(["http://127.0.0.1:0"]));
        assert_eq!(body["scopes_supported"], json!(["mcp"]));
    }
}

#[tokio::test]
async fn authorization_server_metadata_is_rfc_8414_from_the_public_url() {
    let app = TestApp::spawn().await;
    for path in [
        "/.well-known/oauth-authorization-server",
        "/.well-known/openid-configuration",
    ] {
        let (status, m) = send(app.http.get(app.url(path))).await;
        assert_eq!(status, StatusCode::OK, "{path}");
        let b = "http://127.0.0.1:0";
        assert_eq!(m["issuer"], b);
        assert_eq!(m["authorization_endpoint"], format!("{b}/oauth/authorize"));
        assert_eq!(m["token_endpoint"], format!("{b}/oauth/token"));
        assert_eq!(m["registration_endpoint"], format!("{b}/oauth/register"));
        assert_eq!(m["revocation_endpoint"], format!("{b}/oauth/revoke"));
        assert_eq!(m["code_challenge_methods_supported"], json!(["S256"]));
        assert_eq!(m["response_types_supported"], json!(["code"]));
        assert_eq!(
            m["grant_types_supported"],
            json!(["authorization_code", "refresh_token"])
        );
        assert_eq!(m["token_endpoint_auth_methods_supported"], json!(["none"]));
        assert_eq!(m["authorization_response_iss_parameter_supported"], true);
        assert_eq!(m["client_id_metadata_document_supported"], true);
    }
}

#[tokio::test]
async fn a_401_on_mcp_points_at_the_metadata_and_keeps_the_spec_strings() {
    let app = TestApp::spawn().await;
    let ex = app.mcp("").initialize().await;
    assert_eq!(ex.status, StatusCode::UNAUTHORIZED);
    // The scope hint (MCP authorization): the one scope this server issues.
    assert_eq!(
        ex.headers["www-authenticate"],
        "Bearer resource_metadata=\"http://127.0.0.1:0/.well-known/oauth-protected-resource\", scope=\"mcp\""
    );
    let ex = app.mcp("mnm_not-a-token").initialize().await;
    assert_eq!(
        ex.headers["www-authenticate"],
        "Bearer error=\"invalid_token\", error_description=\"Invalid MCP token.\", \
         resource_metadata=\"http://127.0.0.1:0/.well-known/oauth-protected-resource\", scope=\"mcp\""
    );
    assert_eq!(
        ex.json(),
        json!({"error": "invalid_token", "error_description": "Invalid MCP token."})
    );
}

#[tokio::test]
async fn with_oauth_off_there_is_no_metadata_and_a_bare_challenge() {
    let app = TestApp::spawn_with(|s| s.oauth = false).await;
    for path in [
        "/.well-known/oauth-protected-resource",
        "/.well-known/oauth-authorization-server",
    ] {
        let (status, body) = send(app.http.get(app.url(path))).await;
        assert_eq!(status, StatusCode::NOT_FOUND, "{path}");
        assert_eq!(body["message"], "no authorization server is configured");
    }
    let (status, _) = send(app.http.post(app.url("/oauth/register")).json(&json!({}))).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    assert_eq!(app.mcp("").initialize().await.headers["www-authenticate"], "Bearer");
}

// ---- registration ----

#[tokio::test]
async fn registration_refuses_redirects_that_are_not_https_loopback_or_native() {
    let app = TestApp::spawn_with(|s| s.public_url = "https://mnemosyne.example".into()).await;
    for bad in [
        "http://app.example/cb",
        "javascript:alert(1)",
        "https://app.example/cb#x",
        "/cb",
    ] {
        let (status, body) = send(
            app.http
                .post(app.url("/oauth/register"))
                .json(&json!({"redirect_uris": [bad]})),
        )
        .await;
        assert_error(status, &body, StatusCode::BAD_REQUEST, "invalid_redirect_uri");
    }
    let (status, body) = send(
        app.http
            .post(app.url("/oauth/register"))
            .json(&json!({"redirect_uris": ["http://127.0.0.1/cb", "https://app.example/cb"], "grant_types": ["client_credentials"]})),
    )
    .await;
    assert_error(status, &body, StatusCode::BAD_REQUEST, "invalid_client_metadata");
    let (status, body) = send(app.http.post(app.url("/oauth/register")).body("not json")).await;
    assert_error(status, &body, StatusCode::BAD_REQUEST, "invalid_client_metadata");
}

#[tokio::test]
async fn registration_is_rate_limited_per_address_and_audited() {
    // 12 a minute: a burst of two.
    let app = TestApp::spawn_with(|s| s.oauth_registrations_per_minute = 12).await;
    register(&app, &[REDIRECT]).await;
    register(&app, &[REDIRECT]).await;
    let r = app
        .http
        .post(app.url("/oauth/register"))
        .json(&json!({"redirect_uris": [REDIRECT]}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::TOO_MANY_REQUESTS);
    assert!(r.headers().contains_key(header::RETRY_AFTER));
    let n: i64 = sqlx::query_scalar("SELECT count(*) FROM audit_events WHERE action = 'oauth_client_registered'")
        .fetch_one(&app.pg)
        .await
        .unwrap();
    assert_eq!(n, 2);
}

// ---- the whole flow ----

#[tokio::test]
async fn the_flow_grants_exactly_the_library_picked_and_refreshes() {
    let w = world().await;
    // Not signed in: the consent page sends the person to sign in, then back.
    let path = w.consent_path().await;
    let mut c = Console::new(&w.app);
    let page = c.get(&path).await;
    assert_eq!(page.status, StatusCode::SEE_OTHER);
    let login = page.location().to_owned();
    assert!(login.starts_with("/admin/login?next="), "{login}");
    let form = c.get(&login).await;
    assert!(form.body.contains("name=\"next\""), "{}", form.body);
    let r = c
        .post(
            "/admin/login",
            &[("username", &w.alice), ("password", STAFF_PASSWORD), ("next", &path)],
        )
        .await;
    assert_eq!(r.status, StatusCode::SEE_OTHER, "{}", r.body);
    assert_eq!(r.location(), path, "back to the consent page");
    let page = c.get(&path).await;
    assert_eq!(page.status, StatusCode::OK, "{}", page.body);
    assert_eq!(page.headers[header::X_FRAME_OPTIONS], "DENY");
    let csp = page.headers[header::CONTENT_SECURITY_POLICY].to_str().unwrap();
    assert!(csp.contains("frame-ancestors 'none'"), "{csp}");
    assert!(csp.contains("form-action 'self' http://127.0.0.1:53682"), "{csp}");
    assert!(page.body.contains("Test MCP client"), "the client's name");
    assert!(page.body.contains("127.0.0.1"), "the redirect host");
    for lib in [&w.lib_a, &w.lib_b] {
        let boxed = format!("name=\"library\" value=\"{lib}\"");
        let at = page.body.find(&boxed).unwrap_or_else(|| panic!("{lib} offered"));
        let tag_end = page.body[at..].find('>').unwrap();
        assert!(
            !page.body[at..at + tag_end].contains("checked"),
            "nothing granted by default"
        );
    }
    let request = path.rsplit('=').next().unwrap().to_owned();
    for t in mnemosyne::mcp::TOOLS {
        let boxed = format!("name=\"tool\" value=\"{t}\"");
        let at = page.body.find(&boxed).unwrap_or_else(|| panic!("{t} offered"));
        let tag_end = page.body[at..].find('>').unwrap();
        assert!(
            !page.body[at..at + tag_end].contains("checked"),
            "{t}: nothing granted by default"
        );
    }
    let mut fields = vec![
        ("request", request.as_str()),
        ("decision", "approve"),
        ("library", &w.lib_a),
        ("lifetime", "30"),
    ];
    fields.extend(mnemosyne::mcp::TOOLS.iter().map(|t| ("tool", *t)));
    let r = c.post("/admin/oauth/consent", &fields).await;
    assert_eq!(r.status, StatusCode::SEE_OTHER, "{}", r.body);
    let p = params(r.location());
    assert_eq!(p["state"], STATE);
    assert_eq!(p["iss"], w.app.base);

    let (status, body, headers) = w
        .token(&[
            ("grant_type", "authorization_code"),
            ("code", &p["code"]),
            ("redirect_uri", REDIRECT_OTHER_PORT),
            ("client_id", &w.client_id),
            ("code_verifier", VERIFIER),
            ("resource", &w.resource()),
        ])
        .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(headers[header::CACHE_CONTROL], "no-store");
    assert_eq!(body["token_type"], "Bearer");
    let expires_in = body["expires_in"].as_i64().unwrap();
    assert!((3590..=3600).contains(&expires_in), "{expires_in}");
    let access = body["access_token"].as_str().unwrap().to_owned();
    let refresh = body["refresh_token"].as_str().unwrap().to_owned();

    let mut mcp = w.app.mcp(&access).connect().await;
    assert_eq!(mcp.library_uids().await, vec![w.lib_a.clone()]);
    let found = mcp.call_ok("search", json!({"query": "quokkas"})).await;
    let libs: Vec<&str> = found["results"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["library_uid"].as_str().unwrap())
        .collect();
    assert_eq!(libs, vec![w.lib_a.as_str()], "{found}");

    // The access token is an opaque MCP token with an expiry and its grant.
    let (expires, grant): (Option<chrono::DateTime<chrono::Utc>>, Option<i64>) =
        sqlx::query_as("SELECT expires_at, oauth_grant_id FROM mcp_tokens WHERE token_hash = $1")
            .bind(mnemosyne::auth::resolver::token_hash(&access))
            .fetch_one(&w.app.pg)
            .await
            .unwrap();
    assert!(expires.is_some() && grant.is_some());

    // Refresh: rotated; the new access token reads the same library.
    let (status, fresh) = w.refresh(&refresh).await;
    assert_eq!(status, StatusCode::OK, "{fresh}");
    assert_ne!(fresh["refresh_token"], json!(refresh));
    let access2 = fresh["access_token"].as_str().unwrap();
    assert_eq!(
        w.app.mcp(access2).connect().await.library_uids().await,
        vec![w.lib_a.clone()]
    );

    let metrics = w.app.metrics().await;
    for (step, outcome) in [
        ("authorize", "ok"),
        ("consent", "ok"),
        ("token", "ok"),
        ("refresh", "ok"),
    ] {
        let line = format!("oauth_flows_total{{outcome=\"{outcome}\",step=\"{step}\"}} ");
        assert!(
            metrics.lines().any(|l| l.starts_with(&line) && !l.ends_with(" 0")),
            "{line} in {metrics}"
        );
    }
    let actions: Vec<String> =
        sqlx::query_scalar("SELECT action::text FROM audit_events WHERE action LIKE 'oauth%' ORDER BY id")
            .fetch_all(&w.app.pg)
            .await
            .unwrap();
    assert_eq!(actions, ["oauth_client_registered", "oauth_grant_created"]);
}

#[tokio::test]
async fn a_revoked_grant_is_refused_on_the_next_request_on_another_replica() {
    let w = world().await;
    // Behind one balancer: the same public URL, its own listener.
    let mut settings = w.app.settings.clone();
    settings.listen = "127.0.0.1:0".parse().unwrap();
    let other = w.app.replica_with(settings).await;
    let t = w.tokens().await;
    let access = t["access_token"].as_str().unwrap();
    let mut session = other.mcp(access).connect().await;
    assert_eq!(session.list_tools().await.status, StatusCode::OK);
    // Revoked on the first replica's console (My tokens).
    let mut c = w.signed_in().await;
    let me = c.get("/admin/me").await;
    assert!(
        me.body.contains("Connected MCP clients") && me.body.contains("Test MCP client"),
        "{}",
        me.body
    );
    let grant: i64 = sqlx::query_scalar("SELECT id FROM oauth_grants")
        .fetch_one(&w.app.pg)
        .await
        .unwrap();
    let r = c.post("/admin/me/grants/revoke", &[("id", &grant.to_string())]).await;
    assert_eq!(r.status, StatusCode::SEE_OTHER, "{}", r.body);
    let ex = session.list_tools().await;
    assert_eq!(ex.status, StatusCode::UNAUTHORIZED);
    assert_eq!(ex.json()["error_description"], "Invalid MCP token.");
    let (status, body) = w.refresh(t["refresh_token"].as_str().unwrap()).await;
    assert_error(status, &body, StatusCode::BAD_REQUEST, "invalid_grant");
    drop(other);
}

#[tokio::test]
async fn revocation_endpoint_revokes_the_grant_of_a_refresh_token() {
    let w = world().await;
    let t = w.tokens().await;
    let access = t["access_token"].as_str().unwrap();
    assert_eq!(status_on_mcp(&w.app, access).await, StatusCode::OK);
    let r = http()
        .post(w.app.url("/oauth/revoke"))
        .form(&[
            ("token", t["refresh_token"].as_str().unwrap()),
            ("token_type_hint", "refresh_token"),
            ("client_id", &w.client_id),
        ])
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::OK);
    assert_eq!(status_on_mcp(&w.app, access).await, StatusCode::UNAUTHORIZED);
    // Unknown tokens are answered the same (RFC 7009 §2.2).
    let r = http()
        .post(w.app.url("/oauth/revoke"))
        .form(&[("token", "nothing-of-ours"), ("client_id", &w.client_id)])
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::OK);
}

// ---- refusals: RFC 6749 codes ----

#[tokio::test]
async fn authorize_refuses_an_unknown_client_without_redirecting() {
    let w = world().await;
    let r = w.authorize(&[("client_id", Some("mcl_nobody"))]).await;
    assert!(location(&r).is_empty(), "never redirected");
    let (status, body) = crate::helpers::json_of(r).await;
    assert_error(status, &body, StatusCode::UNAUTHORIZED, "invalid_client");
}

#[tokio::test]
async fn authorize_refuses_a_redirect_not_registered_without_redirecting() {
    let w = world().await;
    for bad in [
        "http://127.0.0.1:4000/elsewhere",
        "https://evil.example/callback",
        "http://localhost:4000/callback",
    ] {
        let r = w.authorize(&[("redirect_uri", Some(bad))]).await;
        assert!(location(&r).is_empty(), "{bad}: never redirected");
        let (status, body) = crate::helpers::json_of(r).await;
        assert_error(status, &body, StatusCode::BAD_REQUEST, "invalid_request");
    }
}

/// The refusal redirected to the client: error, state and iss.
async fn refused_by_redirect(w: &World, change: &[(&str, Option<&str>)], code: &str) {
    let r = w.authorize(change).await;
    assert_eq!(r.status(), StatusCode::SEE_OTHER, "{change:?}");
    let to = location(&r);
    assert!(to.starts_with(REDIRECT_OTHER_PORT), "{to}");
    let p = params(&to);
    assert_eq!(p["error"], code, "{change:?}: {to}");
    assert_eq!(p["state"], STATE);
    assert_eq!(p["iss"], w.app.base);
    assert!(!p.contains_key("code"));
}

#[tokio::test]
async fn authorize_without_pkce_is_invalid_request() {
    let w = world().await;
    refused_by_redirect(&w, &[("code_challenge", None)], "invalid_request").await;
    refused_by_redirect(&w, &[("code_challenge_method", None)], "invalid_request").await;
}

#[tokio::test]
async fn authorize_with_plain_pkce_is_invalid_request() {
    let w = world().await;
    refused_by_redirect(
        &w,
        &[
            ("code_challenge_method", Some("plain")),
            ("code_challenge", Some(VERIFIER)),
        ],
        "invalid_request",
    )
    .await;
}

#[tokio::test]
async fn authorize_for_another_servers_resource_is_invalid_target() {
    let w = world().await;
    refused_by_redirect(&w, &[("resource", Some("https://other.example/mcp"))], "invalid_target").await;
    refused_by_redirect(&w, &[("resource", None)], "invalid_target").await;
}

#[tokio::test]
async fn authorize_with_an_unknown_scope_or_response_type_is_refused() {
    let w = world().await;
    refused_by_redirect(&w, &[("scope", Some("admin"))], "invalid_scope").await;
    refused_by_redirect(&w, &[("response_type", Some("token"))], "unsupported_response_type").await;
}

#[tokio::test]
async fn denying_redirects_with_access_denied() {
    let w = world().await;
    let mut c = w.signed_in().await;
    let to = w.answer(&mut c, &[("decision", "deny"), ("library", &w.lib_a)]).await;
    let p = params(&to);
    assert_eq!(p["error"], "access_denied");
    assert_eq!(p["state"], STATE);
    assert_eq!(p["iss"], w.app.base);
    let grants: i64 = sqlx::query_scalar("SELECT count(*) FROM oauth_grants")
        .fetch_one(&w.app.pg)
        .await
        .unwrap();
    assert_eq!(grants, 0);
}

#[tokio::test]
async fn a_grant_for_a_library_the_person_does_not_manage_is_invalid_scope() {
    let w = world().await;
    let foreign = w.app.library("oauth_foreign").await;
    let reader_only = w.app.library("oauth_read").await;
    users::grant(&w.app.pg, &w.alice, &reader_only, Role::Reader)
        .await
        .unwrap();
    for lib in [&foreign, &reader_only] {
        let mut c = w.signed_in().await;
        let to = w
            .answer(
                &mut c,
                &[
                    ("decision", "approve"),
                    ("library", &w.lib_a),
                    ("library", lib),
                    ("lifetime", "30"),
                ],
            )
            .await;
        let p = params(&to);
        assert_eq!(p["error"], "invalid_scope", "{to}");
        assert!(!p.contains_key("code"));
    }
    let grants: i64 = sqlx::query_scalar("SELECT count(*) FROM oauth_grants")
        .fetch_one(&w.app.pg)
        .await
        .unwrap();
    assert_eq!(grants, 0);
}

#[tokio::test]
async fn a_consent_with_a_forged_csrf_token_is_refused() {
    let w = world().await;
    let mut c = w.signed_in().await;
    let path = w.consent_path().await;
    c.get(&path).await;
    let request = path.rsplit('=').next().unwrap().to_owned();
    let r = c
        .post_raw(
            "/admin/oauth/consent",
            &[
                ("csrf", "forged"),
                ("request", &request),
                ("decision", "approve"),
                ("library", &w.lib_a),
            ],
        )
        .await;
    assert_eq!(r.status, StatusCode::FORBIDDEN);
    assert!(r.location().is_empty());
    let codes: i64 = sqlx::query_scalar("SELECT count(*) FROM oauth_codes")
        .fetch_one(&w.app.pg)
        .await
        .unwrap();
    assert_eq!(codes, 0);
}

#[tokio::test]
async fn a_wrong_code_verifier_is_invalid_grant() {
    let w = world().await;
    let mut c = w.signed_in().await;
    let code = w.code(&mut c).await;
    let (status, body) = w
        .exchange(&code, "another-verifier-that-is-long-enough-to-be-valid-0123456789")
        .await;
    assert_error(status, &body, StatusCode::BAD_REQUEST, "invalid_grant");
}

#[tokio::test]
async fn a_token_request_without_a_verifier_is_invalid_request() {
    let w = world().await;
    let mut c = w.signed_in().await;
    let code = w.code(&mut c).await;
    let (status, body, _) = w
        .token(&[
            ("grant_type", "authorization_code"),
            ("code", &code),
            ("redirect_uri", REDIRECT_OTHER_PORT),
            ("client_id", &w.client_id),
        ])
        .await;
    assert_error(status, &body, StatusCode::BAD_REQUEST, "invalid_request");
}

#[tokio::test]
async fn token_requests_name_the_rfc_6749_error() {
    let w = world().await;
    let (status, body, _) = w
        .token(&[("grant_type", "password"), ("client_id", &w.client_id)])
        .await;
    assert_error(status, &body, StatusCode::BAD_REQUEST, "unsupported_grant_type");
    let (status, body, _) = w
        .token(&[
            ("grant_type", "authorization_code"),
            ("code", "x"),
            ("client_id", "mcl_nobody"),
        ])
        .await;
    assert_error(status, &body, StatusCode::UNAUTHORIZED, "invalid_client");
    let (status, body, _) = w
        .token(&[
            ("grant_type", "authorization_code"),
            ("code", "never-issued"),
            ("client_id", &w.client_id),
            ("code_verifier", VERIFIER),
        ])
        .await;
    assert_error(status, &body, StatusCode::BAD_REQUEST, "invalid_grant");
    let (status, body, _) = w
        .token(&[
            ("grant_type", "refresh_token"),
            ("refresh_token", "mnr_x"),
            ("client_id", &w.client_id),
            ("resource", "https://other.example/mcp"),
        ])
        .await;
    assert_error(status, &body, StatusCode::BAD_REQUEST, "invalid_target");
}

#[tokio::test]
async fn an_expired_code_is_invalid_grant() {
    let w = world().await;
    let mut c = w.signed_in().await;
    let code = w.code(&mut c).await;
    sqlx::query("UPDATE oauth_codes SET expires_at = now() - interval '1 second'")
        .execute(&w.app.pg)
        .await
        .unwrap();
    let (status, body) = w.exchange(&code, VERIFIER).await;
    assert_error(status, &body, StatusCode::BAD_REQUEST, "invalid_grant");
}

#[tokio::test]
async fn a_reused_code_is_invalid_grant_and_revokes_what_the_first_use_issued() {
    let w = world().await;
    let mut c = w.signed_in().await;
    let code = w.code(&mut c).await;
    let (status, first) = w.exchange(&code, VERIFIER).await;
    assert_eq!(status, StatusCode::OK, "{first}");
    let access = first["access_token"].as_str().unwrap();
    assert_eq!(status_on_mcp(&w.app, access).await, StatusCode::OK);
    let (status, body) = w.exchange(&code, VERIFIER).await;
    assert_error(status, &body, StatusCode::BAD_REQUEST, "invalid_grant");
    assert_eq!(status_on_mcp(&w.app, access).await, StatusCode::UNAUTHORIZED);
    let (status, body) = w.refresh(first["refresh_token"].as_str().unwrap()).await;
    assert_error(status, &body, StatusCode::BAD_REQUEST, "invalid_grant");
    let n: i64 = sqlx::query_scalar("SELECT count(*) FROM audit_events WHERE action = 'oauth_code_reused'")
        .fetch_one(&w.app.pg)
        .await
        .unwrap();
    assert_eq!(n, 1);
}

#[tokio::test]
async fn a_reused_refresh_token_is_invalid_grant_and_revokes_the_whole_grant() {
    let w = world().await;
    let t = w.tokens().await;
    let old = t["refresh_token"].as_str().unwrap();
    let (status, fresh) = w.refresh(old).await;
    assert_eq!(status, StatusCode::OK, "{fresh}");
    let access = fresh["access_token"].as_str().unwrap();
    assert_eq!(status_on_mcp(&w.app, access).await, StatusCode::OK);
    let (status, body) = w.refresh(old).await;
    assert_error(status, &body, StatusCode::BAD_REQUEST, "invalid_grant");
    assert_eq!(status_on_mcp(&w.app, access).await, StatusCode::UNAUTHORIZED);
    let (status, body) = w.refresh(fresh["refresh_token"].as_str().unwrap()).await;
    assert_error(status, &body, StatusCode::BAD_REQUEST, "invalid_grant");
    let n: i64 = sqlx::query_scalar("SELECT count(*) FROM audit_events WHERE action = 'oauth_refresh_reused'")
        .fetch_one(&w.app.pg)
        .await
        .unwrap();
    assert_eq!(n, 1);
}

#[tokio::test]
async fn the_tools_picked_on_the_consent_page_are_the_tokens_allowlist() {
    let w = world().await;
    let mut c = w.signed_in().await;
    let path = w.consent_path().await;
    c.get(&path).await;
    let request = path.rsplit('=').next().unwrap().to_owned();
    let r = c
        .post(
            "/admin/oauth/consent",
            &[
                ("request", &request),
                ("decision", "approve"),
                ("library", &w.lib_a),
                ("tool", "list_libraries"),
                ("lifetime", "1"),
            ],
        )
        .await;
    let code = params(r.location())["code"].clone();
    let (status, t) = w.exchange(&code, VERIFIER).await;
    assert_eq!(status, StatusCode::OK, "{t}");
    let mut mcp = w.app.mcp(t["access_token"].as_str().unwrap()).connect().await;
    assert_eq!(mcp.library_uids().await, vec![w.lib_a.clone()]);
    let ex = mcp.call_raw("search", json!({"query": "quokkas"}), None).await;
    assert!(
        ex.response().get("error").is_some(),
        "search was not granted: {:?}",
        ex.response()
    );
    // A tool beyond the person's ceiling cannot be granted.
    sqlx::query("UPDATE users SET max_tools = '{search}' WHERE username = $1")
        .bind(&w.alice)
        .execute(&w.app.pg)
        .await
        .unwrap();
    let to = w
        .answer(
            &mut c,
            &[("decision", "approve"), ("library", &w.lib_a), ("lifetime", "1")],
        )
        .await;
    assert_eq!(params(&to)["error"], "invalid_scope", "{to}");
}

#[tokio::test]
async fn a_token_from_another_client_is_invalid_grant() {
    let w = world().await;
    let other = register(&w.app, &[REDIRECT]).await;
    let mut c = w.signed_in().await;
    let code = w.code(&mut c).await;
    let (status, body, _) = w
        .token(&[
            ("grant_type", "authorization_code"),
            ("code", &code),
            ("client_id", &other),
            ("code_verifier", VERIFIER),
        ])
        .await;
    assert_error(status, &body, StatusCode::BAD_REQUEST, "invalid_grant");
}

#[tokio::test]
async fn a_person_who_stops_managing_a_library_stops_reading_it_through_oauth() {
    let w = world().await;
    let t = w.tokens().await;
    let access = t["access_token"].as_str().unwrap();
    assert_eq!(
        w.app.mcp(access).connect().await.library_uids().await,
        vec![w.lib_a.clone()]
    );
    users::revoke(&w.app.pg, &w.alice, &w.lib_a, Role::Owner).await.unwrap();
    tokio::time::sleep(Duration::from_millis(150)).await; // NOTIFY delivery
    assert!(w.app.mcp(access).connect().await.library_uids().await.is_empty());
}

// ---- operators ----

#[tokio::test]
async fn the_cli_adds_lists_and_removes_clients_and_revokes_grants() {
    let w = world().await;
    let out = w.app.cli_ok(&[
        "--json",
        "oauth",
        "client",
        "add",
        "--name",
        "Operator client",
        "--redirect-uri",
        "http://127.0.0.1:7777/cb",
    ]);
    let added: Value = serde_json::from_str(&out).unwrap();
    let id = added["client_id"].as_str().unwrap().to_owned();
    let list: Value = serde_json::from_str(&w.app.cli_ok(&["--json", "oauth", "client", "list"])).unwrap();
    assert!(list
        .as_array()
        .unwrap()
        .iter()
        .any(|c| c["client_id"] == id.as_str() && c["source"] == "cli"));
    let (ok, _, err) = w
        .app
        .cli(&["oauth", "client", "add", "--name", "x", "--redirect-uri", "ftp://x/"]);
    assert!(!ok && err.contains("invalid_redirect_uri"), "{err}");

    let t = w.tokens().await;
    let access = t["access_token"].as_str().unwrap();
    let grants: Value = serde_json::from_str(&w.app.cli_ok(&["--json", "oauth", "grant", "list"])).unwrap();
    assert_eq!(grants.as_array().unwrap().len(), 1);
    assert_eq!(grants[0]["libraries"], json!([w.lib_a]));
    let gid = grants[0]["id"].to_string();
    w.app.cli_ok(&["oauth", "grant", "revoke", &gid]);
    tokio::time::sleep(Duration::from_millis(150)).await; // NOTIFY delivery
    assert_eq!(status_on_mcp(&w.app, access).await, StatusCode::UNAUTHORIZED);

    w.app.cli_ok(&["oauth", "client", "remove", &id]);
    let (ok, _, _) = w.app.cli(&["oauth", "client", "remove", &id]);
    assert!(!ok);
}

#[tokio::test]
async fn staff_see_and_revoke_every_grant() {
    let w = world().await;
    let t = w.tokens().await;
    let staff = crate::admin::staff(&w.app, &format!("staff-{}", w.app.ns)).await;
    let mut c = Console::signed_in(&w.app, &staff, STAFF_PASSWORD).await;
    let page = c.get("/admin/tokens").await;
    assert!(
        page.body.contains("Connected OAuth clients") && page.body.contains(&w.alice),
        "{}",
        page.body
    );
    let grant: i64 = sqlx::query_scalar("SELECT id FROM oauth_grants")
        .fetch_one(&w.app.pg)
        .await
        .unwrap();
    let r = c.post("/admin/grants/revoke", &[("id", &grant.to_string())]).await;
    assert_eq!(r.status, StatusCode::SEE_OTHER, "{}", r.body);
    assert_eq!(
        status_on_mcp(&w.app, t["access_token"].as_str().unwrap()).await,
        StatusCode::UNAUTHORIZED
    );
}

/// A self-registered client with a web redirect: its malformed requests are
/// shown to the person, never bounced to that address (else anyone could
/// register `https://evil.example/` and use this server as an open
/// redirector, RFC 9700 §4.11.2). A loopback redirect still gets the error.
#[tokio::test]
async fn authorize_errors_of_a_self_registered_web_redirect_are_shown_not_redirected() {
    let mut web = world().await;
    let loopback_client = web.client_id.clone();
    let evil = "https://evil.example/landing";
    web.client_id = register(&web.app, &[evil]).await;
    for change in [
        vec![("redirect_uri", Some(evil)), ("code_challenge", None)],
        vec![("redirect_uri", Some(evil)), ("response_type", Some("token"))],
        vec![
            ("redirect_uri", Some(evil)),
            ("resource", Some("https://other.example/mcp")),
        ],
    ] {
        let r = web.authorize(&change).await;
        assert_eq!(r.status(), StatusCode::BAD_REQUEST, "{change:?}");
        assert!(r.headers().get("location").is_none(), "{change:?}: redirected");
    }
    // The well-formed request still goes to the consent page.
    let r = web.authorize(&[("redirect_uri", Some(evil))]).await;
    assert_eq!(r.status(), StatusCode::SEE_OTHER);
    assert!(location(&r).starts_with("/admin/oauth/consent?request="));
    web.client_id = loopback_client;
    refused_by_redirect(&web, &[("code_challenge", None)], "invalid_request").await;
}

// ---- Client ID Metadata Documents ----

/// A client's web site: serves its Client ID Metadata Documents on a
/// loopback port (plain http: the servers under test run on a loopback
/// http public URL, the development mode where that is allowed), and counts
/// the connections made to it and the requests per path.
struct DocSite {
    base: String,
    connections: std::sync::Arc<std::sync::atomic::AtomicUsize>,
    hits: std::sync::Arc<std::sync::Mutex<std::collections::HashMap<String, usize>>>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for DocSite {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl DocSite {
    async fn start() -> DocSite {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let base = format!("http://127.0.0.1:{}", listener.local_addr().unwrap().port());
        let connections = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let hits = std::sync::Arc::new(std::sync::Mutex::new(std::collections::HashMap::new()));
        let (b, c, h) = (base.clone(), connections.clone(), hits.clone());
        // Ends when the site is dropped (aborted); each connection is capped.
        let task = tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                c.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                let (b, h) = (b.clone(), h.clone());
                tokio::spawn(async move {
                    let _ = tokio::time::timeout(Duration::from_secs(30), DocSite::serve(stream, &b, &h)).await;
                });
            }
        });
        DocSite {
            base,
            connections,
            hits,
            task,
        }
    }

    fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base)
    }

    fn hits(&self, path: &str) -> usize {
        self.hits.lock().unwrap().get(path).copied().unwrap_or(0)
    }

    fn connections(&self) -> usize {
        self.connections.load(std::sync::atomic::Ordering::SeqCst)
    }

    /// A document for `path`: its client_id is its URL.
    fn document(base: &str, path: &str) -> String {
        json!({
            "client_id": format!("{base}{path}"),
            "client_name": "Doc-described client",
            "client_uri": "https://client.example/",
            "redirect_uris": [REDIRECT],
            "grant_types": ["authorization_code", "refresh_token"],
            "response_types": ["code"],
            "token_endpoint_auth_method": "none",
        })
        .to_string()
    }

    async fn serve(
        mut stream: tokio::net::TcpStream,
        base: &str,
        hits: &std::sync::Mutex<std::collections::HashMap<String, usize>>,
    ) {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let mut head = Vec::new();
        let mut buf = [0u8; 1024];
        while !head.windows(4).any(|w| w == b"\r\n\r\n") {
            match stream.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(n) => head.extend_from_slice(&buf[..n]),
            }
            if head.len() > 16 * 1024 {
                return;
            }
        }
        let head = String::from_utf8_lossy(&head).into_owned();
        let path = head.split_whitespace().nth(1).unwrap_or("/").to_owned();
        *hits.lock().unwrap().entry(path.clone()).or_insert(0) += 1;
        let answer = |status: &str, headers: &str, body: &str| {
            format!(
                "HTTP/1.1 {status}\r\n{headers}Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
                body.len()
            )
        };
        let out = match path.as_str() {
            "/good" | "/cached" => answer(
                "200 OK",
                "Content-Type: application/json; charset=utf-8\r\nCache-Control: max-age=600\r\n",
                &Self::document(base, &path),
            ),
            "/mismatch" => answer(
                "200 OK",
                "Content-Type: application/json\r\n",
                &Self::document(base, "/someone-else"),
            ),
            "/text" => answer("200 OK", "Content-Type: text/html\r\n", "<html>not a document</html>"),
            "/redirect" => answer("302 Found", &format!("Location: {base}/good\r\n"), ""),
            "/big" => {
                // 256 KiB without a length: read until the cap, then given up.
                let _ = stream
                    .write_all(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nConnection: close\r\n\r\n")
                    .await;
                let chunk = [b' '; 4096];
                for _ in 0..64 {
                    if stream.write_all(&chunk).await.is_err() {
                        return;
                    }
                }
                return;
            }
            "/slow" => {
                // A byte every half second, for at most 20 s.
                let _ = stream
                    .write_all(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nConnection: close\r\n\r\n")
                    .await;
                for _ in 0..40 {
                    if stream.write_all(b" ").await.is_err() || stream.flush().await.is_err() {
                        return;
                    }
                    tokio::time::sleep(Duration::from_millis(500)).await;
                }
                return;
            }
            "/elsewhere" => {
                let mut doc: Value = serde_json::from_str(&Self::document(base, &path)).unwrap();
                doc["redirect_uris"] = json!(["http://localhost:4000/callback"]);
                answer("200 OK", "Content-Type: application/json\r\n", &doc.to_string())
            }
            _ if path.starts_with("/distinct/") => answer(
                "200 OK",
                "Content-Type: application/json\r\n",
                &Self::document(base, &path),
            ),
            _ => answer("404 Not Found", "", ""),
        };
        let _ = stream.write_all(out.as_bytes()).await;
        let _ = stream.shutdown().await;
    }
}

/// An authorization request naming `client_id` is refused on a page shown to
/// the person (never a redirect): its status and RFC 6749 error.
async fn shown_refusal(w: &World, client_id: &str) -> (StatusCode, Value) {
    let r = w.authorize(&[("client_id", Some(client_id))]).await;
    assert!(location(&r).is_empty(), "{client_id}: never redirected");
    crate::helpers::json_of(r).await
}

#[tokio::test]
async fn a_client_metadata_document_registers_its_client_end_to_end() {
    let site = DocSite::start().await;
    let mut w = world().await;
    w.client_id = site.url("/good");
    let path = w.consent_path().await;
    let mut c = w.signed_in().await;
    let page = c.get(&path).await;
    assert_eq!(page.status, StatusCode::OK, "{}", page.body);
    assert!(page.body.contains("Doc-described client"), "the document's name");
    let doc_host = site.base.trim_start_matches("http://");
    assert!(page.body.contains(doc_host), "the document's host: {}", page.body);
    assert!(
        page.body.contains("<code>127.0.0.1</code>"),
        "the redirect's host: {}",
        page.body
    );
    assert_eq!(page.headers[header::X_FRAME_OPTIONS], "DENY");
    let request = path.rsplit('=').next().unwrap().to_owned();
    let mut fields = vec![
        ("request", request.as_str()),
        ("decision", "approve"),
        ("library", &w.lib_a),
        ("lifetime", "30"),
    ];
    fields.extend(mnemosyne::mcp::TOOLS.iter().map(|t| ("tool", *t)));
    let r = c.post("/admin/oauth/consent", &fields).await;
    assert_eq!(r.status, StatusCode::SEE_OTHER, "{}", r.body);
    let to = r.location().to_owned();
    assert!(to.starts_with(REDIRECT_OTHER_PORT), "{to}");
    let code = params(&to)["code"].clone();
    let (status, t) = w.exchange(&code, VERIFIER).await;
    assert_eq!(status, StatusCode::OK, "{t}");
    let mut mcp = w.app.mcp(t["access_token"].as_str().unwrap()).connect().await;
    assert_eq!(mcp.library_uids().await, vec![w.lib_a.clone()]);
    let found = mcp.call_ok("search", json!({"query": "quokkas"})).await;
    assert!(!found["results"].as_array().unwrap().is_empty(), "{found}");
    let (status, fresh) = w.refresh(t["refresh_token"].as_str().unwrap()).await;
    assert_eq!(status, StatusCode::OK, "{fresh}");

    // Fetched once: the authorization, the exchange and the refresh used the cache.
    assert_eq!(site.hits("/good"), 1);
    let (source, name): (String, String) =
        sqlx::query_as("SELECT source, client_name FROM oauth_clients WHERE client_id = $1")
            .bind(&w.client_id)
            .fetch_one(&w.app.pg)
            .await
            .unwrap();
    assert_eq!((source.as_str(), name.as_str()), ("cimd", "Doc-described client"));
    let used: Vec<(String, Value)> =
        sqlx::query_as("SELECT target, detail FROM audit_events WHERE action = 'oauth_client_metadata_used'")
            .fetch_all(&w.app.pg)
            .await
            .unwrap();
    assert_eq!(used.len(), 1, "{used:?}");
    assert_eq!(used[0].0, w.client_id);
    assert_eq!(used[0].1["fetched"], true);
    assert_eq!(used[0].1["document_host"], doc_host);
}

#[tokio::test]
async fn a_document_is_cached_a_second_authorization_does_not_fetch_it() {
    let site = DocSite::start().await;
    let mut w = world().await;
    w.client_id = site.url("/cached");
    w.consent_path().await;
    w.consent_path().await;
    assert_eq!(site.hits("/cached"), 1);
    let fetched: Vec<Value> = sqlx::query_scalar(
        "SELECT detail->'fetched' FROM audit_events WHERE action = 'oauth_client_metadata_used' ORDER BY id",
    )
    .fetch_all(&w.app.pg)
    .await
    .unwrap();
    assert_eq!(fetched, [json!(true), json!(false)], "every use audited");
}

#[tokio::test]
async fn a_document_whose_client_id_is_not_its_url_is_refused() {
    let site = DocSite::start().await;
    let w = world().await;
    let (status, body) = shown_refusal(&w, &site.url("/mismatch")).await;
    assert_error(status, &body, StatusCode::UNAUTHORIZED, "invalid_client");
    assert!(
        body["error_description"]
            .as_str()
            .unwrap()
            .contains("client_id is not its URL"),
        "{body}"
    );
    assert_eq!(site.hits("/mismatch"), 1);
}

#[tokio::test]
async fn an_oversized_document_is_refused() {
    let site = DocSite::start().await;
    let w = world().await;
    let (status, body) = shown_refusal(&w, &site.url("/big")).await;
    assert_error(status, &body, StatusCode::UNAUTHORIZED, "invalid_client");
    assert!(
        body["error_description"]
            .as_str()
            .unwrap()
            .contains("larger than 64 KiB"),
        "{body}"
    );
}

#[tokio::test]
async fn a_document_slower_than_the_time_cap_is_refused() {
    let site = DocSite::start().await;
    let w = world().await;
    let started = std::time::Instant::now();
    let (status, body) = tokio::time::timeout(Duration::from_secs(20), shown_refusal(&w, &site.url("/slow")))
        .await
        .expect("the fetch gives up by itself");
    assert_error(status, &body, StatusCode::UNAUTHORIZED, "invalid_client");
    assert!(
        body["error_description"].as_str().unwrap().contains("within 5 s"),
        "{body}"
    );
    let took = started.elapsed();
    assert!(took < Duration::from_secs(10), "{took:?}");
}

#[tokio::test]
async fn a_document_behind_a_redirect_is_refused_and_the_redirect_not_followed() {
    let site = DocSite::start().await;
    let w = world().await;
    let (status, body) = shown_refusal(&w, &site.url("/redirect")).await;
    assert_error(status, &body, StatusCode::UNAUTHORIZED, "invalid_client");
    assert!(
        body["error_description"]
            .as_str()
            .unwrap()
            .contains("redirects are not followed"),
        "{body}"
    );
    assert_eq!(site.hits("/good"), 0, "the redirect was not followed");
}

#[tokio::test]
async fn a_document_not_served_as_json_is_refused_and_the_refusal_cached() {
    let site = DocSite::start().await;
    let w = world().await;
    for _ in 0..2 {
        let (status, body) = shown_refusal(&w, &site.url("/text")).await;
        assert_error(status, &body, StatusCode::UNAUTHORIZED, "invalid_client");
        assert!(
            body["error_description"]
                .as_str()
                .unwrap()
                .contains("not served as JSON"),
            "{body}"
        );
    }
    assert_eq!(site.hits("/text"), 1, "a refusal is remembered, not fetched again");
}

#[tokio::test]
async fn a_redirect_uri_the_document_does_not_list_is_refused_without_redirecting() {
    let site = DocSite::start().await;
    let mut w = world().await;
    w.client_id = site.url("/good");
    for bad in ["http://127.0.0.1:4000/elsewhere", "https://evil.example/callback"] {
        let r = w.authorize(&[("redirect_uri", Some(bad))]).await;
        assert!(location(&r).is_empty(), "{bad}: never redirected");
        let (status, body) = crate::helpers::json_of(r).await;
        assert_error(status, &body, StatusCode::BAD_REQUEST, "invalid_request");
    }
    // A malformed request of a document client with a loopback redirect
    // goes back to it, as for any client.
    refused_by_redirect(&w, &[("code_challenge", None)], "invalid_request").await;
}

#[tokio::test]
async fn document_fetches_are_rate_limited_per_address() {
    let site = DocSite::start().await;
    // 6 a minute: a burst of one.
    let app = TestApp::spawn_with(|s| {
        on_its_own_url(s);
        s.oauth_metadata_fetches_per_minute = 6;
    })
    .await;
    let mut w = World {
        app,
        alice: String::new(),
        lib_a: String::new(),
        lib_b: String::new(),
        client_id: site.url("/distinct/1"),
    };
    let r = w.authorize(&[]).await;
    assert_eq!(r.status(), StatusCode::SEE_OTHER);
    // A cached document costs no fetch.
    let r = w.authorize(&[]).await;
    assert_eq!(r.status(), StatusCode::SEE_OTHER);
    w.client_id = site.url("/distinct/2");
    let r = w.authorize(&[]).await;
    assert_eq!(r.status(), StatusCode::TOO_MANY_REQUESTS);
    assert!(r.headers().contains_key(header::RETRY_AFTER));
    assert!(location(&r).is_empty());
    let (_, body) = crate::helpers::json_of(r).await;
    assert_eq!(body["error"], "temporarily_unavailable", "{body}");
    assert_eq!(site.hits("/distinct/1"), 1);
    assert_eq!(site.hits("/distinct/2"), 0);
}

#[tokio::test]
async fn in_production_a_non_https_or_loopback_document_is_refused_without_connecting() {
    let site = DocSite::start().await;
    let port = site.base.rsplit(':').next().unwrap().to_owned();
    let app = TestApp::spawn_with(|s| s.public_url = "https://mnemosyne.example".into()).await;
    let w = World {
        client_id: String::new(),
        alice: String::new(),
        lib_a: String::new(),
        lib_b: String::new(),
        app,
    };
    for client_id in [
        site.url("/good"),
        format!("https://127.0.0.1:{port}/good"),
        format!("https://localhost:{port}/good"),
        format!("https://[::1]:{port}/good"),
    ] {
        let (status, body) = shown_refusal(&w, &client_id).await;
        assert_error(status, &body, StatusCode::UNAUTHORIZED, "invalid_client");
    }
    let (status, body, _) = w
        .token(&[
            ("grant_type", "authorization_code"),
            ("code", "x"),
            ("code_verifier", VERIFIER),
            ("client_id", &format!("https://127.0.0.1:{port}/good")),
        ])
        .await;
    assert_error(status, &body, StatusCode::UNAUTHORIZED, "invalid_client");
    assert_eq!(site.connections(), 0, "no connection was made");
}

/// What the person sees when their browser lands on a refused request: a
/// page (not JSON, never a redirect to the client), unframeable.
#[tokio::test]
async fn a_refusal_shown_to_a_browser_is_a_page_not_a_redirect() {
    let site = DocSite::start().await;
    let w = world().await;
    for client_id in ["mcl_nobody".to_owned(), site.url("/mismatch")] {
        let r = http()
            .get(w.authorize_url(&[("client_id", Some(&client_id))]))
            .header(header::ACCEPT, "text/html,application/xhtml+xml,*/*;q=0.8")
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), StatusCode::UNAUTHORIZED, "{client_id}");
        assert!(location(&r).is_empty(), "{client_id}: never redirected");
        assert_eq!(r.headers()[header::X_FRAME_OPTIONS], "DENY");
        assert!(r.headers()[header::CONTENT_TYPE]
            .to_str()
            .unwrap()
            .starts_with("text/html"));
        let body = r.text().await.unwrap();
        assert!(body.contains("invalid_client"), "{body}");
    }
}

/// A document served from one host sending the person back to another: the
/// consent page says so.
#[tokio::test]
async fn the_consent_page_warns_when_a_documents_redirect_goes_to_another_host() {
    let site = DocSite::start().await;
    let mut w = world().await;
    w.client_id = site.url("/elsewhere");
    let r = w
        .authorize(&[("redirect_uri", Some("http://localhost:4000/callback"))])
        .await;
    assert_eq!(r.status(), StatusCode::SEE_OTHER);
    let path = location(&r);
    let mut c = w.signed_in().await;
    let page = c.get(&path).await;
    assert_eq!(page.status, StatusCode::OK, "{}", page.body);
    assert!(page.body.contains("<code>localhost</code>"), "{}", page.body);
    assert!(
        page.body.contains("another host than the one describing it"),
        "{}",
        page.body
    );
    // The same document's client, sent back to its own host: no warning.
    w.client_id = site.url("/good");
    let path = w.consent_path().await;
    let page = c.get(&path).await;
    assert!(
        !page.body.contains("another host than the one describing it"),
        "{}",
        page.body
    );
}
