//! Session and credential isolation (issue 9): a session belongs to the exact
//! credential that opened it; sessions are bounded; no secret in any output;
//! `nbf`; membership revocation; a silently dead listener; cheap checks first.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use reqwest::StatusCode;
use serde_json::json;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

use crate::helpers::{McpClient, TestApp};
use crate::mcp::seed;

/// A client that sends its requests on `session` (owned by someone else).
fn on_session(app: &TestApp, bearer: &str, session: &str) -> McpClient {
    let mut c = McpClient::new(app.http.clone(), app.url("/mcp/"), bearer);
    c.session = Some(session.to_owned());
    c
}

/// GET on a session (stream resumption when `last_event_id` is set).
async fn get_stream(app: &TestApp, bearer: &str, session: &str, last_event_id: Option<&str>) -> StatusCode {
    get_stream_at(&app.http, &app.url("/mcp/"), bearer, session, last_event_id).await
}

async fn get_stream_at(
    http: &reqwest::Client,
    url: &str,
    bearer: &str,
    session: &str,
    last_event_id: Option<&str>,
) -> StatusCode {
    let mut req = http
        .get(url)
        .header("Accept", "text/event-stream")
        .header("Authorization", format!("Bearer {bearer}"))
        .header("Mcp-Session-Id", session)
        .header("MCP-Protocol-Version", "2025-11-25")
        .timeout(Duration::from_secs(2));
    if let Some(id) = last_event_id {
        req = req.header("Last-Event-ID", id);
    }
    match req.send().await {
        Ok(r) => r.status(),
        // A stream that was opened and then timed out: it was served.
        Err(e) if e.is_timeout() => StatusCode::OK,
        Err(e) => panic!("GET failed: {e}"),
    }
}

async fn delete_session(app: &TestApp, bearer: &str, session: &str) -> StatusCode {
    app.http
        .delete(app.url("/mcp/"))
        .header("Authorization", format!("Bearer {bearer}"))
        .header("Mcp-Session-Id", session)
        .header("MCP-Protocol-Version", "2025-11-25")
        .send()
        .await
        .unwrap()
        .status()
}

#[tokio::test]
async fn per_turn_b_on_per_turn_a_session_gets_404_on_post_get_and_delete() {
    let app = TestApp::spawn().await;
    let s = seed(&app).await;
    // Same `sub` (daedalus-chat), different turns and libraries.
    let a = app.per_turn_jwt(&[s.lib_a.clone()]).await;
    let b = app.per_turn_jwt(&[s.lib_b.clone()]).await;
    let mut ca = app.mcp(&a).connect().await;
    let sid = ca.session.clone().unwrap();

    let mut cb = on_session(&app, &b, &sid);
    let ex = cb.list_tools().await;
    assert_eq!(ex.status, StatusCode::NOT_FOUND);
    assert_eq!(ex.body, "Not Found: Session not found");
    assert_eq!(
        cb.call_raw("search", json!({"query": "pelican"}), None).await.status,
        StatusCode::NOT_FOUND
    );
    assert_eq!(get_stream(&app, &b, &sid, None).await, StatusCode::NOT_FOUND);
    for id in ["0", "1", "0/0", "1/0", "2/1"] {
        assert_eq!(
            get_stream(&app, &b, &sid, Some(id)).await,
            StatusCode::NOT_FOUND,
            "Last-Event-ID {id}"
        );
    }
    assert_eq!(delete_session(&app, &b, &sid).await, StatusCode::NOT_FOUND);

    // A's session is intact and still sees only A's library.
    assert_eq!(ca.library_uids().await, [s.lib_a.clone()]);
    // B's jti was not consumed by its attempts: B opens its own turn.
    let mut own = app.mcp(&b).connect().await;
    assert_eq!(own.library_uids().await, [s.lib_b.clone()]);
    // A may end its own session; then it is gone for everyone.
    assert_eq!(delete_session(&app, &a, &sid).await, StatusCode::NO_CONTENT);
    assert_eq!(ca.list_tools().await.status, StatusCode::NOT_FOUND);
}

#[tokio::test]
async fn per_turn_a_gets_every_answer_under_a_concurrent_stream_of_b_attempts() {
    let app = TestApp::spawn().await;
    let s = seed(&app).await;
    let a = app.per_turn_jwt(&[s.lib_a.clone()]).await;
    let b = app.per_turn_jwt(&[s.lib_b.clone()]).await;
    let mut ca = app.mcp(&a).connect().await;
    let sid = ca.session.clone().unwrap();
    let done = Arc::new(AtomicBool::new(false));

    let attacker = {
        let (done, http, url) = (done.clone(), app.http.clone(), app.url("/mcp/"));
        let (b, sid) = (b.clone(), sid.clone());
        tokio::spawn(async move {
            let mut refused = 0usize;
            // Bounded: at most 400 attempts, and it stops when A is done.
            for i in 0..400 {
                if done.load(Ordering::SeqCst) {
                    break;
                }
                let status = match i % 3 {
                    0 => {
                        let mut c = McpClient::new(http.clone(), url.clone(), &b);
                        c.session = Some(sid.clone());
                        c.call_raw("search", json!({"query": "pelican"}), None).await.status
                    }
                    1 => get_stream_at(&http, &url, &b, &sid, Some(&format!("{}/0", i % 7))).await,
                    _ => get_stream_at(&http, &url, &b, &sid, None).await,
                };
                assert_eq!(status, StatusCode::NOT_FOUND, "attempt {i}");
                refused += 1;
            }
            refused
        })
    };
    for i in 0..40 {
        let out = ca.call_ok("search", json!({"query": "pelican"})).await;
        let libs: Vec<&str> = out["results"]
            .as_array()
            .unwrap()
            .iter()
            .map(|r| r["library_uid"].as_str().unwrap())
            .collect();
        assert!(!libs.is_empty(), "call {i}: A's answer is missing");
        assert!(libs.iter().all(|l| *l == s.lib_a), "call {i}: {libs:?}");
    }
    done.store(true, Ordering::SeqCst);
    let refused = attacker.await.unwrap();
    assert!(refused > 0, "the attacker made attempts");
}

#[tokio::test]
async fn a_team_token_cannot_resume_another_team_tokens_stream() {
    let app = TestApp::spawn().await;
    let (t1, jwt1) = app.create_team("Kottos").await;
    let (_, jwt2) = app.create_team("Briareos").await;
    let c1 = app.mcp(&jwt1).connect().await;
    let sid = c1.session.clone().unwrap();
    for id in [None, Some("0"), Some("1/0")] {
        assert_eq!(get_stream(&app, &jwt2, &sid, id).await, StatusCode::NOT_FOUND);
    }
    assert_eq!(
        on_session(&app, &jwt2, &sid).list_tools().await.status,
        StatusCode::NOT_FOUND
    );
    // The same team after a rotation holds another credential.
    let r = app
        .service(reqwest::Method::POST, &format!("/mcp_server/api/teams/{t1}/rotate/"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::OK);
    let rotated = r.json::<serde_json::Value>().await.unwrap()["jwt"]
        .as_str()
        .unwrap()
        .to_owned();
    assert_eq!(get_stream(&app, &rotated, &sid, Some("0")).await, StatusCode::NOT_FOUND);
}

#[tokio::test]
async fn an_opaque_token_cannot_use_another_tokens_session_of_the_same_user() {
    let app = TestApp::spawn().await;
    let a = app.opaque_token(&[]).await;
    let b = app.opaque_token(&[]).await;
    let ca = app.mcp(&a).connect().await;
    let sid = ca.session.clone().unwrap();
    assert_eq!(
        on_session(&app, &b, &sid).list_tools().await.status,
        StatusCode::NOT_FOUND
    );
    assert_eq!(get_stream(&app, &b, &sid, Some("0")).await, StatusCode::NOT_FOUND);
    assert_eq!(delete_session(&app, &b, &sid).await, StatusCode::NOT_FOUND);
}

#[tokio::test]
async fn an_unknown_session_is_refused_before_the_bearer_is_resolved() {
    let app = TestApp::spawn().await;
    let jwt = app.per_turn_jwt(&[]).await;
    let ex = on_session(&app, &jwt, "00000000-0000-0000-0000-000000000000")
        .list_tools()
        .await;
    assert_eq!(ex.status, StatusCode::NOT_FOUND);
    // Its jti was not consumed by the refused request.
    assert_eq!(app.mcp(&jwt).initialize().await.status, StatusCode::OK);
}

#[tokio::test]
async fn the_session_cap_per_credential_answers_429_with_retry_after() {
    let app = TestApp::spawn_with(|s| s.sessions_per_credential = 2).await;
    let token = app.opaque_token(&[]).await;
    let first = app.mcp(&token).connect().await;
    let _second = app.mcp(&token).connect().await;
    let ex = app.mcp(&token).initialize().await;
    assert_eq!(ex.status, StatusCode::TOO_MANY_REQUESTS, "{ex:?}");
    assert!(ex.headers.contains_key("retry-after"));
    assert_eq!(ex.json()["error"], "rate_limited");
    // Another credential is not affected by this one's cap.
    let other = app.opaque_token(&[]).await;
    assert_eq!(app.mcp(&other).initialize().await.status, StatusCode::OK);
    // Closing one gives its place back.
    assert_eq!(
        delete_session(&app, &token, first.session.as_deref().unwrap()).await,
        StatusCode::NO_CONTENT
    );
    assert_eq!(app.mcp(&token).initialize().await.status, StatusCode::OK);
    // Stateless requests open no session and are not counted.
    let mut stateless = app.mcp(&token).stateless();
    assert_eq!(stateless.list_tools().await.status, StatusCode::OK);
}

#[tokio::test]
async fn the_global_session_cap_answers_429_and_a_refused_turn_can_retry() {
    let app = TestApp::spawn_with(|s| s.sessions_max = 2).await;
    let a = app.opaque_token(&[]).await;
    let b = app.opaque_token(&[]).await;
    let ca = app.mcp(&a).connect().await;
    let _cb = app.mcp(&b).connect().await;
    let turn = app.per_turn_jwt(&[]).await;
    let ex = app.mcp(&turn).initialize().await;
    assert_eq!(ex.status, StatusCode::TOO_MANY_REQUESTS);
    assert!(ex.headers.contains_key("retry-after"));
    assert_eq!(app.state.mcp.sessions.open(), 2);
    delete_session(&app, &a, ca.session.as_deref().unwrap()).await;
    // The refused turn's jti was given back: the same token opens its session.
    assert_eq!(app.mcp(&turn).initialize().await.status, StatusCode::OK);
}

#[tokio::test]
async fn idle_sessions_expire_and_give_their_place_back() {
    let app = TestApp::spawn_with(|s| {
        s.session_idle_secs = 1;
        s.sessions_per_credential = 1;
    })
    .await;
    let token = app.opaque_token(&[]).await;
    let mut c = app.mcp(&token).connect().await;
    assert_eq!(app.state.mcp.sessions.open(), 1);
    // Bounded wait for the idle timeout to close it (not a timing assertion).
    for _ in 0..100 {
        if app.state.mcp.sessions.open() == 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(app.state.mcp.sessions.open(), 0, "the idle session was closed");
    assert_eq!(c.list_tools().await.status, StatusCode::NOT_FOUND);
    assert_eq!(app.mcp(&token).initialize().await.status, StatusCode::OK);
}

#[tokio::test]
async fn migrate_output_holds_no_secret() {
    let settings = crate::helpers::base_settings();
    let (server, _) = settings.database_url.rsplit_once('/').unwrap();
    let db = format!("mnemosyne_migrate_{}", &uuid::Uuid::new_v4().simple().to_string()[..10]);
    let admin = sqlx::PgPool::connect(&format!("{server}/postgres")).await.unwrap();
    sqlx::query(&format!("CREATE DATABASE \"{db}\""))
        .execute(&admin)
        .await
        .unwrap();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_mnemosyne"))
        .arg("migrate")
        .env("MNEMOSYNE_DATABASE_URL", format!("{server}/{db}"))
        .output()
        .unwrap();
    let printed = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    sqlx::query(&format!("DROP DATABASE \"{db}\" WITH (FORCE)"))
        .execute(&admin)
        .await
        .unwrap();
    assert!(out.status.success(), "{printed}");
    assert!(printed.contains("signing key created: kid="), "{printed}");
    let hex_run = printed
        .split(|c: char| !c.is_ascii_hexdigit())
        .map(str::len)
        .max()
        .unwrap_or(0);
    assert!(hex_run < 64, "a 64-hex secret was printed: {printed}");
}

#[tokio::test]
async fn nbf_in_the_future_is_invalid() {
    let app = TestApp::spawn().await;
    let now = chrono::Utc::now().timestamp();
    let jwt = app
        .sign(
            json!({"iss": "daedalus", "sub": "daedalus-chat", "iat": now, "exp": now + 300,
                     "nbf": now + 3600, "jti": uuid::Uuid::new_v4().to_string(), "libs": []}),
        )
        .await;
    let ex = app.mcp(&jwt).initialize().await;
    assert_eq!(ex.status, StatusCode::UNAUTHORIZED);
    assert_eq!(ex.json()["error_description"], "Invalid MCP token.");
}

/// A new user `name`, owner of both seeded libraries, and a token for both.
async fn owner_token_for_both(app: &TestApp, s: &crate::mcp::Seed, name: &str) -> String {
    mnemosyne::store::pg::users::create(&app.pg, name, None, false)
        .await
        .unwrap()
        .unwrap();
    for l in [&s.lib_a, &s.lib_b] {
        mnemosyne::store::pg::users::grant(&app.pg, name, l, mnemosyne::store::pg::users::Role::Owner)
            .await
            .unwrap();
    }
    mnemosyne::service::tokens::mint(&app.pg, name, "t", &[s.lib_a.clone(), s.lib_b.clone()], None)
        .await
        .unwrap()
        .plaintext
}

#[tokio::test]
async fn a_membership_revoke_removes_the_library_from_the_tokens_next_request_on_the_second_instance() {
    let app = TestApp::spawn().await;
    let s = seed(&app).await;
    let b = app.second_instance().await;
    // One user, owner of both libraries, one token for both.
    let name = "ariadne";
    let token = owner_token_for_both(&app, &s, name).await;
    let mut on_b = b.mcp(&token).connect().await;
    assert_eq!(on_b.library_uids().await, [s.lib_a.clone(), s.lib_b.clone()]);
    // Revoked through the CLI (a separate process, as an operator would).
    app.cli_ok(&["membership", "revoke", name, &s.lib_b, "owner"]);
    // The next request on B (bounded wait for the NOTIFY to arrive, as any
    // replica's next request would after the CLI returns).
    let mut libs = Vec::new();
    for _ in 0..50 {
        libs = on_b.library_uids().await;
        if libs.len() == 1 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(libs, [s.lib_a.clone()]);
    let out = on_b
        .call_ok("search", json!({"query": "pelican", "library_uids": [s.lib_b]}))
        .await;
    assert_eq!(out["results"], json!([]));
}

#[tokio::test]
async fn a_non_ascii_origin_is_refused_without_consuming_the_jti() {
    let app = TestApp::spawn().await;
    let jwt = app.per_turn_jwt(&[]).await;
    let origin = reqwest::header::HeaderValue::from_bytes(b"http://127.0.0.1\xff").unwrap();
    let host = reqwest::header::HeaderValue::from_bytes("h\u{f6}st".as_bytes()).unwrap();
    let mut c = app.mcp(&jwt);
    let body = json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "t", "version": "0"}}});
    for (name, value) in [("Origin", origin), ("Host", host)] {
        let r = app
            .http
            .post(app.url("/mcp/"))
            .header("Accept", "application/json, text/event-stream")
            .header("Authorization", format!("Bearer {jwt}"))
            .header(name, value)
            .json(&body)
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), StatusCode::FORBIDDEN, "{name}");
    }
    let bad_protocol = app
        .http
        .post(app.url("/mcp/"))
        .header("Accept", "application/json, text/event-stream")
        .header("Authorization", format!("Bearer {jwt}"))
        .header("MCP-Protocol-Version", "latest; drop table")
        .json(&body)
        .send()
        .await
        .unwrap();
    assert_eq!(bad_protocol.status(), StatusCode::BAD_REQUEST);
    // The protocol's UnsupportedProtocolVersionError, with the request's id.
    let err = bad_protocol.json::<serde_json::Value>().await.unwrap();
    assert_eq!(err["id"], 1, "{err}");
    assert_eq!(err["error"]["code"], -32022, "{err}");
    assert_eq!(err["error"]["data"]["requested"], "latest; drop table");
    // None of these consumed the turn's jti.
    assert_eq!(c.initialize().await.status, StatusCode::OK);
}

/// A TCP proxy to Postgres that can freeze (not close) the LISTEN connection
/// of the replica behind it: the connection stays open and listed in
/// `pg_stat_activity`, but nothing flows through it.
pub(crate) struct FreezingProxy {
    pub(crate) port: u16,
    pub(crate) freeze: Arc<AtomicBool>,
    /// Closes the Postgres side of the LISTEN connection while the replica's
    /// side stays open and silent (a partition): the backend leaves
    /// `pg_stat_activity` at once, the replica notices nothing.
    sever: Arc<AtomicBool>,
}

impl FreezingProxy {
    pub(crate) async fn start(upstream: String) -> FreezingProxy {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let freeze = Arc::new(AtomicBool::new(false));
        let sever = Arc::new(AtomicBool::new(false));
        let (f, sv) = (freeze.clone(), sever.clone());
        tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let Ok(server) = TcpStream::connect(&upstream).await else {
                    continue;
                };
                let is_listener = Arc::new(AtomicBool::new(false));
                let (cr, cw) = client.into_split();
                let (sr, sw) = server.into_split();
                let flags = Flags {
                    freeze: f.clone(),
                    sever: sv.clone(),
                    is_listener: is_listener.clone(),
                };
                tokio::spawn(pump(cr, sw, flags.clone(), true));
                tokio::spawn(pump(sr, cw, flags, false));
            }
        });
        FreezingProxy { port, freeze, sever }
    }

    /// Severs the LISTEN connection of the replica `instance` behind the
    /// proxy and waits (bounded) until its backend has left
    /// `pg_stat_activity`; the replica notices nothing.
    pub(crate) async fn sever_listener(&self, pg: &sqlx::PgPool, instance: &str) {
        self.sever.store(true, Ordering::SeqCst);
        for _ in 0..200 {
            let n: i64 = sqlx::query_scalar("SELECT count(*) FROM pg_stat_activity WHERE application_name = $1")
                .bind(format!("mnemosyne-listener:{instance}"))
                .fetch_one(pg)
                .await
                .unwrap();
            if n == 0 {
                return;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        panic!("the listener backend of {instance} did not leave pg_stat_activity");
    }
}

#[derive(Clone)]
struct Flags {
    freeze: Arc<AtomicBool>,
    sever: Arc<AtomicBool>,
    is_listener: Arc<AtomicBool>,
}

async fn pump(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    flags: Flags,
    client_side: bool,
) {
    let Flags {
        freeze,
        sever,
        is_listener,
    } = flags;
    let severed = || is_listener.load(Ordering::SeqCst) && sever.load(Ordering::SeqCst);
    let mut buf = vec![0u8; 16 * 1024];
    loop {
        let n = tokio::select! {
            r = from.read(&mut buf) => match r {
                Ok(0) | Err(_) => 0,
                Ok(n) => n,
            },
            // Severed: stop carrying (checked every 10 ms).
            _ = async { while !severed() { tokio::time::sleep(Duration::from_millis(10)).await } } => 0,
        };
        if n == 0 {
            if severed() && !client_side {
                // Postgres' side is gone; the replica's side is held open and
                // silent (bounded: 30 s, then the test is over).
                tokio::time::sleep(Duration::from_secs(30)).await;
            }
            // Client → server severed: dropping `to` closes the backend.
            return;
        }
        if client_side
            && !is_listener.load(Ordering::SeqCst)
            && buf[..n].windows(19).any(|w| w == b"mnemosyne-listener:")
        {
            is_listener.store(true, Ordering::SeqCst);
        }
        // Bounded: a frozen connection waits at most 60 s, then the test is over.
        for _ in 0..3000 {
            if !(is_listener.load(Ordering::SeqCst) && freeze.load(Ordering::SeqCst)) {
                break;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        if to.write_all(&buf[..n]).await.is_err() {
            return;
        }
    }
}

#[tokio::test]
async fn a_replica_whose_listener_is_blocked_stops_trusting_its_caches_within_the_bound() {
    let app = TestApp::spawn().await;
    let s = seed(&app).await;
    let url = url_parts(&app.settings.database_url);
    let proxy = FreezingProxy::start(url.host_port.clone()).await;
    let mut settings = app.settings.clone();
    settings.database_url = format!("{}127.0.0.1:{}/{}", url.prefix, proxy.port, url.db);
    let b = app.replica_with(settings).await;
    let token = app.opaque_token(&[s.lib_a.clone()]).await;
    let (team, team_jwt) = app.create_team("Kottos").await;
    // Warm B's caches.
    let mut on_b = b.mcp(&token).connect().await;
    assert_eq!(on_b.library_uids().await, [s.lib_a.clone()]);
    assert!(b.state.auth.caches.usable());

    proxy.freeze.store(true, Ordering::SeqCst);
    // Revoked behind every server's back (plain SQL): only B's listener could
    // tell it, and it hears nothing now.
    sqlx::query("UPDATE mcp_tokens SET active = false")
        .execute(&app.pg)
        .await
        .unwrap();
    // Within the trust window (plus a margin) B stops trusting its caches.
    let mut untrusted = false;
    for _ in 0..100 {
        if !b.state.auth.caches.usable() {
            untrusted = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(untrusted, "B kept trusting a listener that hears nothing");
    let ex = on_b.list_tools().await;
    assert_eq!(
        ex.status,
        StatusCode::UNAUTHORIZED,
        "revoked token still served: {ex:?}"
    );
    assert_eq!(ex.json()["error_description"], "Invalid MCP token.");

    // A team change on A cannot be confirmed by B: A says so (the change is
    // committed, and B no longer uses its caches).
    let r = app
        .service(
            reqwest::Method::PUT,
            &format!("/mcp_server/api/teams/{team}/workspaces/"),
        )
        .json(&json!({"workspace_ids": [s.ws_a.clone()]}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::ACCEPTED);
    assert_eq!(r.headers()["mnemosyne-propagation"], "unconfirmed");
    let body: serde_json::Value = r.json().await.unwrap();
    assert_eq!(body["propagation"]["confirmed"], false);
    assert_eq!(body["propagation"]["status"], 200);
    assert_eq!(body["workspace_ids"], json!([s.ws_a.clone()]));
    assert_eq!(b.mcp(&team_jwt).connect().await.library_uids().await, [s.lib_a.clone()]);

    // Unfrozen, B hears its heartbeat again and trusts (fresh) caches.
    proxy.freeze.store(false, Ordering::SeqCst);
    let mut trusted = false;
    for _ in 0..100 {
        if b.state.auth.caches.usable() {
            trusted = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(trusted, "B's listener recovered");
}

pub(crate) struct UrlParts {
    pub(crate) prefix: String,
    pub(crate) host_port: String,
    pub(crate) db: String,
}

pub(crate) fn url_parts(url: &str) -> UrlParts {
    let (scheme, rest) = url.split_once("://").unwrap();
    let (authority, db) = rest.split_once('/').unwrap();
    let (userinfo, host_port) = match authority.rsplit_once('@') {
        Some((u, h)) => (format!("{u}@"), h.to_owned()),
        None => (String::new(), authority.to_owned()),
    };
    UrlParts {
        prefix: format!("{scheme}://{userinfo}"),
        host_port,
        db: db.to_owned(),
    }
}

#[tokio::test]
async fn the_replay_sweep_keeps_a_jti_until_no_replica_could_accept_it() {
    let app = TestApp::spawn().await;
    use mnemosyne::store::pg::auth::{sweep_jtis, CLOCK_SKEW_ALLOWANCE_SECS};
    // expires_at = exp + leeway. One just past it (a replica whose clock runs
    // behind could still accept the token), one past the skew allowance too.
    for (jti, ago) in [("recent", 60), ("old", CLOCK_SKEW_ALLOWANCE_SECS + 60)] {
        sqlx::query(
            "INSERT INTO per_turn_jti_uses (jti, session_id, expires_at)
             VALUES ($1, NULL, now() - make_interval(secs => $2))",
        )
        .bind(jti)
        .bind(ago as f64)
        .execute(&app.pg)
        .await
        .unwrap();
    }
    assert_eq!(sweep_jtis(&app.pg).await.unwrap(), 1);
    let left: Vec<String> = sqlx::query_scalar("SELECT jti FROM per_turn_jti_uses")
        .fetch_all(&app.pg)
        .await
        .unwrap();
    assert_eq!(left, ["recent"]);
}

/// Hardening 3, row 1: a replica whose LISTEN connection was just lost (the
/// backend is gone from `pg_stat_activity`, the replica has not noticed and
/// still trusts its caches) must not serve a stale answer after a writer's
/// 2xx: the writer's fence counts it (its heartbeat registration) and waits
/// for its acknowledgement, which cannot come, so the change is reported as
/// unconfirmed once that replica's trust has lapsed.
#[tokio::test]
async fn revocation_holds_through_listener_loss() {
    let app = TestApp::spawn().await;
    let s = seed(&app).await;
    let url = url_parts(&app.settings.database_url);
    let proxy = FreezingProxy::start(url.host_port.clone()).await;
    let mut settings = app.settings.clone();
    settings.database_url = format!("{}127.0.0.1:{}/{}", url.prefix, proxy.port, url.db);
    let b = app.replica_with(settings).await;
    let (team, team_jwt) = app.create_team("Kottos").await;
    app.put_workspaces(team, &[s.ws_a.clone()]).await;
    let mut on_b = b.mcp(&team_jwt).connect().await;
    assert_eq!(on_b.library_uids().await, [s.lib_a.clone()]);
    let b_instance = b.state.auth.caches.instance.to_string();
    // B's heartbeat has registered it (bounded wait).
    let mut registered = false;
    for _ in 0..100 {
        let n: i64 = sqlx::query_scalar("SELECT count(*) FROM auth_replicas WHERE instance = $1")
            .bind(&b_instance)
            .fetch_one(&app.pg)
            .await
            .unwrap();
        if n == 1 {
            registered = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(registered, "B's heartbeat registered it");

    proxy.sever_listener(&app.pg, &b_instance).await;
    // The race this guards: B has not noticed and still trusts its caches.
    assert!(b.state.auth.caches.usable(), "B trusts its caches after the loss");

    let r = app
        .service(
            reqwest::Method::PUT,
            &format!("/mcp_server/api/teams/{team}/workspaces/"),
        )
        .json(&json!({"workspace_ids": []}))
        .send()
        .await
        .unwrap();
    assert!(r.status().is_success(), "{}", r.status());
    // B could not acknowledge: the writer says so (the change is committed).
    assert_eq!(r.status(), StatusCode::ACCEPTED);
    assert_eq!(r.headers()["mnemosyne-propagation"], "unconfirmed");
    // After the 2xx, B never serves the old library.
    for _ in 0..5 {
        assert_eq!(
            on_b.library_uids().await,
            Vec::<String>::new(),
            "stale answer on B after the writer's 2xx"
        );
    }
}

/// Hardening 3, row 14: a malformed `MCP-Protocol-Version` on a JSON-RPC
/// request is the protocol's UnsupportedProtocolVersionError (HTTP 400, the
/// request's id, the supported revisions, the requested value echoed), as the
/// 2026-07-28 conformance checks expect; it is still refused before the
/// bearer is looked at (no credential here).
#[tokio::test]
async fn a_malformed_protocol_version_is_the_json_rpc_unsupported_version_error() {
    let app = TestApp::spawn().await;
    let r = app
        .http
        .post(app.url("/mcp"))
        .header("Accept", "application/json, text/event-stream")
        .header("MCP-Protocol-Version", "v999.0.0")
        .json(&json!({"jsonrpc": "2.0", "id": 301, "method": "server/discover", "params": {}}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::BAD_REQUEST);
    let body: serde_json::Value = r.json().await.unwrap();
    assert_eq!(body["jsonrpc"], "2.0");
    assert_eq!(body["id"], 301, "{body}");
    assert_eq!(body["error"]["code"], -32022);
    assert_eq!(body["error"]["data"]["requested"], "v999.0.0");
    let supported = body["error"]["data"]["supported"].as_array().unwrap();
    for v in ["2025-06-18", "2025-11-25", "2026-07-28"] {
        assert!(supported.iter().any(|s| s == v), "{v} in {supported:?}");
    }
    // A notification (no id) still gets the plain 400 naming the header.
    let r = app
        .http
        .post(app.url("/mcp"))
        .header("Accept", "application/json, text/event-stream")
        .header("MCP-Protocol-Version", "v999.0.0")
        .json(&json!({"jsonrpc": "2.0", "method": "notifications/initialized"}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::BAD_REQUEST);
    assert_eq!(
        r.json::<serde_json::Value>().await.unwrap()["field"],
        "MCP-Protocol-Version"
    );
}

/// Hardening 3, row 5: an owner who minted a token and is then demoted to
/// reader no longer reads the library through it (a token reads only what
/// its user could mint it for now), on the next request of another replica.
#[tokio::test]
async fn a_demoted_owners_token_stops_reading_the_library_on_the_other_replica() {
    let app = TestApp::spawn().await;
    let s = seed(&app).await;
    let b = app.second_instance().await;
    let name = "pasiphae";
    let token = owner_token_for_both(&app, &s, name).await;
    let mut on_b = b.mcp(&token).connect().await;
    assert_eq!(on_b.library_uids().await, [s.lib_a.clone(), s.lib_b.clone()]);
    // Demoted on lib_b through the CLI: reader granted, owner revoked.
    for (verb, role) in [("grant", "reader"), ("revoke", "owner")] {
        app.cli_ok(&["membership", verb, name, &s.lib_b, role]);
    }
    let mut libs = Vec::new();
    for _ in 0..50 {
        libs = on_b.library_uids().await;
        if libs.len() == 1 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(libs, [s.lib_a.clone()], "a reader's token does not read the library");
    let out = on_b
        .call_ok("search", json!({"query": "pelican", "library_uids": [s.lib_b]}))
        .await;
    assert_eq!(out["results"], json!([]));
}
