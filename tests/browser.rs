//! Real-browser tests of the admin console (issue 16): Debian's Chromium,
//! headless, driven over WebDriver by a chromedriver this harness starts on a
//! free loopback port and kills at the end. Screenshots of every page go to
//! `target/admin-screenshots/`. `scripts/test` installs `chromium` and
//! `chromium-driver` when absent and runs this binary once (ArcadeDB pass).

#![allow(clippy::cloned_ref_to_slice_refs)]

#[path = "api/helpers.rs"]
#[allow(dead_code)]
mod helpers;

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use fantoccini::{Client, ClientBuilder, Locator};
use helpers::TestApp;
use mnemosyne::service::accounts;
use mnemosyne::store::pg::users::{self, Role};
use serde_json::{json, Value};

const PASSWORD: &str = "browser-staff-pw";

/// One Chromium at a time: on two cores, two browsers side by side made the
/// console walk-through read a page mid-navigation (seen once in six runs).
static ONE_BROWSER: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// chromedriver in its own process group; the whole group (Chromium too) is
/// killed when this is dropped, panic or not.
struct Driver {
    child: Child,
    url: String,
}

impl Driver {
    fn start() -> Driver {
        use std::os::unix::process::CommandExt;
        let bin = ["chromedriver", "/usr/bin/chromedriver"]
            .into_iter()
            .find(|b| {
                Command::new(b)
                    .arg("--version")
                    .output()
                    .is_ok_and(|o| o.status.success())
            })
            .expect("chromedriver not found: `apt-get install -y chromium chromium-driver` (scripts/test does)");
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let child = Command::new(bin)
            .arg(format!("--port={port}"))
            .arg("--allowed-ips=127.0.0.1")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .process_group(0)
            .spawn()
            .expect("chromedriver starts");
        Driver {
            child,
            url: format!("http://127.0.0.1:{port}"),
        }
    }

    async fn wait_ready(&self) {
        let http = reqwest::Client::new();
        let deadline = Instant::now() + Duration::from_secs(20);
        while Instant::now() < deadline {
            if let Ok(r) = http.get(format!("{}/status", self.url)).send().await {
                if r.status().is_success() {
                    return;
                }
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        panic!("chromedriver did not answer on {} within 20 s", self.url);
    }
}

impl Drop for Driver {
    /// SIGTERM to chromedriver first (it ends its browsers and reaps them),
    /// then, after at most 3 s, SIGKILL to the whole group.
    fn drop(&mut self) {
        let pid = self.child.id() as i32;
        // SAFETY: kill(2) on our own child and its process group; no memory involved.
        unsafe {
            libc::kill(pid, libc::SIGTERM);
        }
        let deadline = Instant::now() + Duration::from_secs(3);
        while Instant::now() < deadline {
            if matches!(self.child.try_wait(), Ok(Some(_))) {
                break;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        // SAFETY: as above.
        unsafe {
            libc::kill(-pid, libc::SIGKILL);
        }
        let _ = self.child.wait();
    }
}

fn screenshot_dir() -> PathBuf {
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/target")));
    let dir = target.join("admin-screenshots");
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

struct Browser {
    c: Client,
    base: String,
    shots: PathBuf,
}

impl Browser {
    async fn open(driver: &Driver, base: &str) -> Browser {
        let mut caps = serde_json::Map::new();
        caps.insert(
            "goog:chromeOptions".into(),
            json!({"args": ["--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu",
                            "--window-size=1280,1000", "--no-first-run", "--disable-extensions"],
                   "binary": "/usr/bin/chromium"}),
        );
        caps.insert("pageLoadStrategy".into(), json!("normal"));
        caps.insert(
            "timeouts".into(),
            json!({"pageLoad": 20_000, "script": 10_000, "implicit": 3_000}),
        );
        let c = tokio::time::timeout(
            Duration::from_secs(60),
            ClientBuilder::new(hyper_util::client::legacy::connect::HttpConnector::new())
                .capabilities(caps)
                .connect(&driver.url),
        )
        .await
        .expect("a browser session within 60 s")
        .expect("a browser session");
        Browser {
            c,
            base: base.to_owned(),
            shots: screenshot_dir(),
        }
    }

    async fn goto(&self, path: &str) {
        self.c.goto(&format!("{}{path}", self.base)).await.unwrap();
    }

    async fn path(&self) -> String {
        let u = self.c.current_url().await.unwrap();
        match u.query() {
            Some(q) => format!("{}?{q}", u.path()),
            None => u.path().to_owned(),
        }
    }

    /// The path (and query) once it is `want`, waiting up to 10 s for a
    /// navigation a click started.
    async fn wait_path(&self, want: &str) -> String {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let now = self.path().await;
            if now == want || Instant::now() > deadline {
                return now;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// The page's text once it contains `needle` (up to 10 s).
    async fn wait_text(&self, needle: &str) -> String {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let body = self.body().await;
            if body.contains(needle) || Instant::now() > deadline {
                return body;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    async fn shot(&self, name: &str) {
        let png = self.c.screenshot().await.unwrap();
        std::fs::write(self.shots.join(format!("{name}.png")), png).unwrap();
    }

    async fn css(&self, sel: &str) -> fantoccini::elements::Element {
        self.c
            .find(Locator::Css(sel))
            .await
            .unwrap_or_else(|e| panic!("{sel}: {e}"))
    }

    /// The element's text. A click may still be navigating: an element found
    /// on the page being left goes stale, and is looked up again (bounded).
    async fn text(&self, sel: &str) -> String {
        for _ in 0..100 {
            match self.css(sel).await.text().await {
                Ok(t) => return t,
                Err(e) if left_behind(&e) => tokio::time::sleep(Duration::from_millis(50)).await,
                Err(e) => panic!("{sel}: {e}"),
            }
        }
        panic!("{sel}: still stale after 5 s of navigation")
    }

    async fn body(&self) -> String {
        self.text("body").await
    }

    async fn fill(&self, sel: &str, value: &str) {
        let e = self.css(sel).await;
        e.clear().await.unwrap();
        e.send_keys(value).await.unwrap();
    }

    async fn click(&self, sel: &str) {
        self.css(sel).await.click().await.unwrap();
    }
}

/// An element of the page a navigation is leaving. WebDriver says so with
/// "stale element reference"; Chromium sometimes answers first with an
/// inspector error instead (CI, stop 38: "Node with given id does not belong
/// to the document").
fn left_behind(e: &fantoccini::error::CmdError) -> bool {
    e.is_stale_element_reference() || e.to_string().contains("does not belong to the document")
}

async fn mcp_search_libraries(app: &TestApp, bearer: &str, q: &str) -> Vec<String> {
    let mut mcp = app.mcp(bearer).connect().await;
    let out = mcp.call_ok("search", json!({"query": q})).await;
    let mut libs: Vec<String> = out["results"]
        .as_array()
        .unwrap()
        .iter()
        .map(|h| h["library_uid"].as_str().unwrap().to_owned())
        .collect();
    libs.sort();
    libs.dedup();
    libs
}

#[tokio::test]
async fn an_operator_does_the_spec_9_workflows_in_a_real_browser() {
    let app = TestApp::spawn().await;
    // A word only this test's chunks contain (the graph is shared between tests).
    let word = format!("quokka{}", &app.ns[1..7]);
    let ws_a = app.uid("ws_a");
    let ws_b = app.uid("ws_b");
    let a: Value = app
        .ingest_ws(
            &ws_a,
            "Field notes",
            &format!("# Notes\n\nThe {word} lives on Rottnest Island."),
        )
        .await;
    let b: Value = app
        .ingest_ws(
            &ws_b,
            "Travel log",
            &format!("# Log\n\nWe photographed a {word} at dawn."),
        )
        .await;
    let lib_a = a["library_uid"].as_str().unwrap().to_owned();
    let lib_b = b["library_uid"].as_str().unwrap().to_owned();
    let lib_c = app.library("handbook").await;
    app.ingest(json!({"library_uid": lib_c, "item": {"title": "Handbook"},
                      "content": format!("# Handbook\n\nNever feed a {word}.")}))
        .await;
    accounts::create(&app.pg, "test", "pat", None, false, false)
        .await
        .unwrap();
    users::grant(&app.pg, "pat", &lib_a, Role::Owner).await.unwrap();
    users::grant(&app.pg, "pat", &lib_c, Role::Reader).await.unwrap();
    accounts::create(&app.pg, "test", "sam", Some(PASSWORD), false, true)
        .await
        .unwrap();
    let (team, old_jwt) = app.create_team("Kottos").await;
    app.put_workspaces(team, &[ws_b.clone()]).await;

    let _one = ONE_BROWSER.lock().await;
    let driver = Driver::start();
    driver.wait_ready().await;
    let br = Browser::open(&driver, &app.base).await;

    // Sign in.
    br.goto("/admin/").await;
    assert_eq!(br.path().await, "/admin/login");
    br.shot("01-sign-in").await;
    br.fill("input[name=username]", "sam").await;
    br.fill("input[name=password]", PASSWORD).await;
    br.click("form[action='/admin/login'] button[type=submit]").await;
    assert_eq!(br.wait_path("/admin/").await, "/admin/");
    assert!(br.body().await.contains("Store health: ok"), "{}", br.body().await);
    br.shot("02-overview").await;

    // Mint a token through the picker: pick the user, then the libraries.
    br.goto("/admin/tokens/new").await;
    br.css("select[name=user]").await.select_by_value("pat").await.unwrap();
    br.shot("03-token-pick-user").await;
    br.click("form[action='/admin/tokens/new'] button[type=submit]").await;
    let picker = br.css("form[action='/admin/tokens']").await.html(false).await.unwrap();
    assert!(picker.contains(&lib_a), "owned library offered");
    assert!(!picker.contains(&lib_c), "a reader role is not offered");
    assert!(!picker.contains(&lib_b), "no role: not offered");
    br.fill("input[name=name]", "Claude Desktop").await;
    br.click(&format!("input[type=checkbox][value='{lib_a}']")).await;
    br.shot("04-token-pick-libraries").await;
    br.click("form[action='/admin/tokens'] button[type=submit]").await;
    let plaintext = br.text(".secret pre code").await;
    assert!(plaintext.starts_with("mnm_"), "{plaintext}");
    br.shot("05-token-created").await;

    // The plaintext works on /mcp and sees exactly its library.
    assert_eq!(mcp_search_libraries(&app, &plaintext, &word).await, [lib_a.clone()]);

    // The list never shows it again; revoke it in the browser.
    br.goto("/admin/tokens").await;
    assert!(!br.c.source().await.unwrap().contains(&plaintext));
    br.shot("06-tokens").await;
    br.click("form[action='/admin/tokens/revoke'] button").await;
    assert_eq!(
        br.wait_path("/admin/tokens?ok=token-revoked").await,
        "/admin/tokens?ok=token-revoked"
    );
    let refused = app.mcp(&plaintext).initialize().await;
    assert_eq!(refused.status, reqwest::StatusCode::UNAUTHORIZED);

    // Rotate the team; the old JWT is refused, the new one works.
    assert_eq!(app.mcp(&old_jwt).connect().await.library_uids().await, [lib_b.clone()]);
    br.goto("/admin/teams").await;
    br.shot("07-teams").await;
    br.click(&format!("a[href='/admin/teams/{team}']")).await;
    br.shot("08-team-detail").await;
    br.click(&format!("form[action='/admin/teams/{team}/rotate'] button"))
        .await;
    let new_jwt = br.text(".secret pre code").await;
    assert!(br.body().await.contains("fastagent.secrets.yaml"));
    br.shot("09-team-rotated").await;
    let refused = app.mcp(&old_jwt).initialize().await;
    assert_eq!(refused.status, reqwest::StatusCode::UNAUTHORIZED);
    assert_eq!(app.mcp(&new_jwt).connect().await.library_uids().await, [lib_b.clone()]);

    // The admin search finds a chunk in every library.
    br.goto("/admin/search").await;
    br.fill("input[name=q]", &word).await;
    br.click("form[action='/admin/search'] button[type=submit]").await;
    let results = br.css("div.table").await.text().await.unwrap();
    for lib in [&lib_a, &lib_b, &lib_c] {
        assert!(results.contains(lib.as_str()), "{lib} missing from {results}");
    }
    br.shot("10-search").await;
    // … and "search as" the team shows its view.
    br.css("select[name=as]")
        .await
        .select_by_value(&format!("team:{team}"))
        .await
        .unwrap();
    br.click("form[action='/admin/search'] button[type=submit]").await;
    let body = br.wait_text("resolved_libraries (1)").await;
    assert!(body.contains("resolved_libraries (1)"), "{body}");
    br.shot("11-search-as-team").await;

    // The other pages render (screenshots for review).
    for (name, path) in [
        ("12-libraries", "/admin/libraries".to_owned()),
        ("13-library", format!("/admin/library?uid={lib_a}")),
        ("14-keys", "/admin/keys".to_owned()),
        ("15-users", "/admin/users".to_owned()),
        ("16-audit", "/admin/audit".to_owned()),
        ("17-my-tokens", "/admin/me".to_owned()),
    ] {
        br.goto(&path).await;
        assert!(br.css("main h1").await.text().await.is_ok(), "{path}");
        br.shot(name).await;
    }
    let kid = mnemosyne::store::pg::keys::newest_active(&app.pg)
        .await
        .unwrap()
        .unwrap()
        .kid;
    br.goto(&format!("/admin/keys/retire?kid={kid}")).await;
    assert!(br.body().await.contains("stops working"));
    br.shot("18-key-retire-confirm").await;
    // Phone width.
    br.c.set_window_size(390, 844).await.unwrap();
    br.goto("/admin/tokens").await;
    br.shot("19-tokens-phone").await;
    br.c.set_window_size(1280, 1000).await.unwrap();

    // Sign out: the console is closed again.
    br.click("form.signout button").await;
    assert_eq!(br.wait_path("/admin/login").await, "/admin/login");
    br.goto("/admin/").await;
    assert_eq!(br.path().await, "/admin/login");
    br.shot("20-signed-out").await;
    br.c.close().await.unwrap();
}

/// A page of another origin, served on its own loopback port: it calls
/// `/mcp` with `fetch` as a browser MCP client would (no bearer first, to
/// read the challenge; then initialize, the session id from the response
/// headers, and a search) and writes what it got into `#out` as JSON.
fn mcp_page(mcp: &str, token: &str, word: &str) -> String {
    let script = r#"
const out = document.getElementById('out');
const HEADERS = {'Content-Type': 'application/json', 'Accept': 'application/json, text/event-stream'};
async function rpc(body, sid) {
  const h = Object.assign({'Authorization': 'Bearer ' + TOKEN, 'MCP-Protocol-Version': '2025-11-25'}, HEADERS);
  if (sid) h['Mcp-Session-Id'] = sid;
  const r = await fetch(MCP, {method: 'POST', headers: h, body: JSON.stringify(body)});
  const text = await r.text();
  let msg = null;
  if ((r.headers.get('content-type') || '').includes('text/event-stream')) {
    for (const line of text.split('\n')) {
      const d = line.startsWith('data:') ? line.slice(5).trim() : '';
      if (d) { const m = JSON.parse(d); if (m.id === body.id) msg = m; }
    }
  } else if (text) { msg = JSON.parse(text); }
  return {status: r.status, sid: r.headers.get('mcp-session-id'), msg};
}
(async () => {
  try {
    const anon = await fetch(MCP, {method: 'POST', headers: HEADERS, body: '{}'});
    const challenge = anon.headers.get('www-authenticate');
    const init = await rpc({jsonrpc: '2.0', id: 1, method: 'initialize', params: {protocolVersion: '2025-11-25',
                            capabilities: {}, clientInfo: {name: 'browser-page', version: '0'}}});
    await rpc({jsonrpc: '2.0', method: 'notifications/initialized'}, init.sid);
    const found = await rpc({jsonrpc: '2.0', id: 2, method: 'tools/call',
                             params: {name: 'search', arguments: {query: WORD}}}, init.sid);
    out.textContent = JSON.stringify({anon_status: anon.status, challenge, session: init.sid,
                                      results: found.msg.result.structuredContent.results});
  } catch (e) {
    out.textContent = JSON.stringify({error: String(e)});
  }
})();
"#;
    format!(
        "<!doctype html><html><head><title>MCP page</title></head><body><pre id=\"out\"></pre><script>\
         const MCP = {mcp:?}; const TOKEN = {token:?}; const WORD = {word:?};{script}</script></body></html>"
    )
}

/// Serves `page` at `/` on `listener` until the test ends.
fn serve_page(listener: tokio::net::TcpListener, page: String) {
    let app = axum::Router::new().route(
        "/",
        axum::routing::get(move || async move { axum::response::Html(page) }),
    );
    tokio::spawn(async move { axum::serve(listener, app).await });
}

/// `#out` once the page's script wrote it (up to 15 s).
async fn page_outcome(br: &Browser) -> Value {
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let text = br.text("#out").await;
        if !text.is_empty() {
            return serde_json::from_str(&text).unwrap_or_else(|e| panic!("{e}: {text}"));
        }
        assert!(Instant::now() < deadline, "the page wrote nothing within 15 s");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

async fn loopback_listener() -> (tokio::net::TcpListener, String) {
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let origin = format!("http://127.0.0.1:{}", l.local_addr().unwrap().port());
    (l, origin)
}

#[tokio::test]
async fn a_page_of_an_allowed_origin_searches_over_mcp_and_an_unlisted_one_is_refused() {
    let (listed, listed_origin) = loopback_listener().await;
    let (unlisted, unlisted_origin) = loopback_listener().await;
    let allowed = listed_origin.clone();
    let app = TestApp::spawn_with(move |s| s.allowed_origins = vec![allowed]).await;
    let word = format!("wombat{}", &app.ns[1..7]);
    let ws = app.uid("ws_cors");
    let a = app
        .ingest_ws(
            &ws,
            "Burrow notes",
            &format!("# Burrows\n\nA {word} dug under the fence."),
        )
        .await;
    let lib = a["library_uid"].as_str().unwrap().to_owned();
    let token = app.opaque_token(&[lib.clone()]).await;
    let mcp = format!("{}/mcp", app.base);
    serve_page(listed, mcp_page(&mcp, &token, &word));
    serve_page(unlisted, mcp_page(&mcp, &token, &word));

    let _one = ONE_BROWSER.lock().await;
    let driver = Driver::start();
    driver.wait_ready().await;
    let br = Browser::open(&driver, &listed_origin).await;

    br.goto("/").await;
    let got = page_outcome(&br).await;
    assert_eq!(got["anon_status"], 401, "{got}");
    // Exposed headers: the page can read its challenge and its session.
    let challenge = format!(
        "Bearer resource_metadata=\"{}/.well-known/oauth-protected-resource\", scope=\"mcp\"",
        app.settings.public_url.trim_end_matches('/')
    );
    assert_eq!(got["challenge"], challenge.as_str(), "{got}");
    assert!(got["session"].as_str().is_some_and(|s| !s.is_empty()), "{got}");
    let results = got["results"].as_array().unwrap_or_else(|| panic!("{got}"));
    assert_eq!(results.len(), 1, "{got}");
    assert_eq!(results[0]["library_uid"], lib.as_str());
    assert!(results[0]["text"].as_str().unwrap().contains(&word));

    // The same page from an origin nobody listed: the preflight is refused,
    // so the browser lets no request through.
    br.c.goto(&format!("{unlisted_origin}/")).await.unwrap();
    let got = page_outcome(&br).await;
    assert_eq!(got, json!({"error": "TypeError: Failed to fetch"}));
    br.c.close().await.unwrap();
}

#[tokio::test]
async fn cors_preflight_is_answered_for_allowed_origins_only() {
    let allowed = "http://127.0.0.1:1";
    let app = TestApp::spawn_with(|s| s.allowed_origins = vec![format!("{allowed}/")]).await;
    let http = reqwest::Client::new();
    let preflight = |origin: &str| {
        http.request(reqwest::Method::OPTIONS, app.url("/mcp/"))
            .header("Origin", origin)
            .header("Access-Control-Request-Method", "POST")
            .header(
                "Access-Control-Request-Headers",
                "authorization, content-type, mcp-session-id, mcp-param-query",
            )
            .send()
    };
    let r = preflight(allowed).await.unwrap();
    assert_eq!(r.status(), reqwest::StatusCode::NO_CONTENT);
    let h = |name: &str| r.headers()[name].to_str().unwrap().to_owned();
    assert_eq!(h("access-control-allow-origin"), allowed);
    assert_eq!(h("access-control-allow-methods"), "GET, POST, DELETE, OPTIONS");
    assert_eq!(
        h("access-control-allow-headers"),
        "authorization, content-type, accept, last-event-id, mcp-session-id, mcp-protocol-version, mcp-method, \
         mcp-name, mcp-param-query"
    );

    // A foreign Host (DNS rebinding) is refused even for an allowed origin.
    let r = http
        .request(reqwest::Method::OPTIONS, app.url("/mcp/"))
        .header("Host", "attacker.example")
        .header("Origin", allowed)
        .header("Access-Control-Request-Method", "POST")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), reqwest::StatusCode::FORBIDDEN);
    assert!(r.headers().get("access-control-allow-origin").is_none());

    // Another origin: 403, with nothing a browser would accept.
    let r = preflight("http://127.0.0.1:2").await.unwrap();
    assert_eq!(r.status(), reqwest::StatusCode::FORBIDDEN);
    assert!(r.headers().get("access-control-allow-origin").is_none());
    let r = http
        .post(app.url("/mcp/"))
        .header("Origin", "http://evil.example")
        .json(&json!({}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), reqwest::StatusCode::FORBIDDEN);

    // An allowed origin's refused request still names it and exposes the challenge.
    let r = http
        .post(app.url("/mcp/"))
        .header("Origin", allowed)
        .json(&json!({}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), reqwest::StatusCode::UNAUTHORIZED);
    assert_eq!(r.headers()["access-control-allow-origin"], allowed);
    assert_eq!(
        r.headers()["access-control-expose-headers"],
        "Mcp-Session-Id, WWW-Authenticate, Retry-After"
    );
    assert_eq!(
        r.headers()["www-authenticate"],
        format!(
            "Bearer resource_metadata=\"{}/.well-known/oauth-protected-resource\", scope=\"mcp\"",
            app.settings.public_url.trim_end_matches('/')
        )
    );
}

/// Issue 48: a person connects an MCP client through the OAuth flow in a
/// real browser — the console's sign-in, then the consent page, where they
/// grant one of their two libraries; the client's token reads exactly it.
#[tokio::test]
async fn a_person_grants_one_of_two_libraries_on_the_oauth_consent_page() {
    // The public URL is where it listens: the issuer and the resource are real URLs.
    let port = helpers::free_port();
    let app = TestApp::spawn_with(|s| {
        s.listen = format!("127.0.0.1:{port}").parse().unwrap();
        s.public_url = format!("http://127.0.0.1:{port}");
    })
    .await;
    let word = format!("wombat{}", &app.ns[1..7]);
    let lib_a = app.library("granted").await;
    let lib_b = app.library("withheld").await;
    for lib in [&lib_a, &lib_b] {
        app.ingest(json!({"library_uid": lib, "item": {"title": "Notes"},
                          "content": format!("# Notes\n\nA {word} in {lib}.")}))
            .await;
    }
    accounts::create(&app.pg, "test", "olive", Some(PASSWORD), false, false)
        .await
        .unwrap();
    users::grant(&app.pg, "olive", &lib_a, Role::Owner).await.unwrap();
    users::grant(&app.pg, "olive", &lib_b, Role::Manager).await.unwrap();

    // The client's loopback redirect: a page that only says it was reached.
    let (listener, callback_origin) = loopback_listener().await;
    serve_page(
        listener,
        "<!doctype html><title>callback</title><p>back in the client</p>".into(),
    );
    let redirect = format!("{callback_origin}/");
    let http = reqwest::Client::new();
    let reg: Value = http
        .post(app.url("/oauth/register"))
        .json(
            &json!({"client_name": "Browser test client", "redirect_uris": [redirect],
                      "token_endpoint_auth_method": "none"}),
        )
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let client_id = reg["client_id"].as_str().unwrap().to_owned();
    let verifier = "browser-test-verifier-0123456789-0123456789-0123456789";
    let query: String = form_urlencoded::Serializer::new(String::new())
        .extend_pairs([
            ("response_type", "code"),
            ("client_id", client_id.as_str()),
            ("redirect_uri", redirect.as_str()),
            ("state", "browser-state"),
            ("code_challenge", mnemosyne::service::oauth::s256(verifier).as_str()),
            ("code_challenge_method", "S256"),
            ("resource", app.url("/mcp").as_str()),
        ])
        .finish();

    let _one = ONE_BROWSER.lock().await;
    let driver = Driver::start();
    driver.wait_ready().await;
    let br = Browser::open(&driver, &app.base).await;
    br.goto(&format!("/oauth/authorize?{query}")).await;
    assert!(br.path().await.starts_with("/admin/login?next="), "{}", br.path().await);
    br.fill("input[name=username]", "olive").await;
    br.fill("input[name=password]", PASSWORD).await;
    br.click("form[action='/admin/login'] button[type=submit]").await;
    let consent = br.wait_text("Connect an MCP client").await;
    assert!(
        consent.contains("Browser test client") && consent.contains(&lib_b),
        "{consent}"
    );
    br.shot("oauth-consent").await;
    for lib in [&lib_a, &lib_b] {
        let boxed = br.css(&format!("input[name=library][value='{lib}']")).await;
        assert!(!boxed.is_selected().await.unwrap(), "nothing granted by default");
    }
    for tool in mnemosyne::mcp::TOOLS {
        let boxed = br.css(&format!("input[name=tool][value='{tool}']")).await;
        assert!(
            !boxed.is_selected().await.unwrap(),
            "{tool}: nothing granted by default"
        );
    }
    // The person ticks what they grant: one library, and the one tool used.
    br.click(&format!("input[name=library][value='{lib_a}']")).await;
    br.click("input[name=tool][value='search']").await;
    br.click("button[value=approve]").await;
    br.wait_text("back in the client").await;
    let url = br.c.current_url().await.unwrap();
    assert_eq!(url.origin().ascii_serialization(), callback_origin);
    let q: std::collections::HashMap<String, String> = url.query_pairs().into_owned().collect();
    assert_eq!(q["state"], "browser-state");
    assert_eq!(q["iss"], app.base);

    let token: Value = http
        .post(app.url("/oauth/token"))
        .form(&[
            ("grant_type", "authorization_code"),
            ("code", q["code"].as_str()),
            ("redirect_uri", redirect.as_str()),
            ("client_id", client_id.as_str()),
            ("code_verifier", verifier),
        ])
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let access = token["access_token"].as_str().unwrap_or_else(|| panic!("{token}"));
    assert_eq!(mcp_search_libraries(&app, access, &word).await, vec![lib_a]);
}
