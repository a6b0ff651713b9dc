//! Denial-of-service resistance and rate limits (issue 12). Every flood is
//! bounded in count and time and targets this test's own server on 127.0.0.1.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use reqwest::{Method, StatusCode};
use serde_json::json;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

use crate::helpers::{TestApp, SERVICE_USER};
use crate::mcp::seed;

const TEAM_PATH: &str = "/mcp_server/api/teams/00000000-0000-0000-0000-000000000001/";

fn basic(user: &str, password: &str) -> String {
    use base64::Engine;
    format!(
        "Basic {}",
        base64::engine::general_purpose::STANDARD.encode(format!("{user}:{password}"))
    )
}

/// Sends a request with raw TCP and closes the socket without reading.
async fn send_and_disconnect(addr: &str, path: &str, authorization: &str) {
    if let Ok(mut s) = TcpStream::connect(addr).await {
        let req = format!("GET {path} HTTP/1.1\r\nHost: {addr}\r\nAuthorization: {authorization}\r\n\r\n");
        let _ = s.write_all(req.as_bytes()).await;
    }
}

#[tokio::test]
async fn disconnect_after_send_basic_requests_never_run_more_hashes_than_the_permits() {
    // No failure throttle here: every request reaches the verifier.
    let app = TestApp::spawn_with(|s| s.basic_failures_per_minute = 0).await;
    let addr = app.base.trim_start_matches("http://").to_owned();
    let mut tasks = Vec::new();
    for i in 0..200 {
        let (addr, auth) = (addr.clone(), basic(SERVICE_USER, &format!("wrong-{i}")));
        tasks.push(tokio::spawn(async move {
            send_and_disconnect(&addr, TEAM_PATH, &auth).await
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    // Bounded wait until the queued verifications drained (each waits ≤ 2 s).
    for _ in 0..100 {
        let r = app.service(Method::GET, TEAM_PATH).send().await.unwrap();
        if r.status() == StatusCode::NOT_FOUND {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let peak = app.state.basic.peak_hashing();
    assert!(peak >= 1, "the flood reached the verifier");
    // Flights abandoned by clients that hung up are forgotten (bounded wait
    // for the last hashes to finish).
    let mut left = usize::MAX;
    for _ in 0..100 {
        left = app.state.basic.flights();
        if left == 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(left, 0, "abandoned verification flights kept");
    assert!(
        peak <= app.state.basic.max_hashing(),
        "{peak} hashes ran at once (permits: {})",
        app.state.basic.max_hashing()
    );
}

#[tokio::test]
async fn the_service_account_is_served_during_a_flood_of_wrong_passwords_with_a_cold_cache() {
    let app = TestApp::spawn().await;
    // Daedalus has signed in before (as it does all day).
    assert_eq!(
        app.service(Method::GET, TEAM_PATH).send().await.unwrap().status(),
        StatusCode::NOT_FOUND
    );
    let stop = Arc::new(AtomicBool::new(false));
    let mut flood = Vec::new();
    for w in 0..8 {
        let (http, url, stop) = (app.http.clone(), app.url(TEAM_PATH), stop.clone());
        flood.push(tokio::spawn(async move {
            let mut statuses = Vec::new();
            // Bounded: 10 s or 2,000 requests per worker.
            let t0 = Instant::now();
            for i in 0..2000 {
                if stop.load(Ordering::SeqCst) || t0.elapsed() > Duration::from_secs(10) {
                    break;
                }
                let r = http
                    .get(&url)
                    .basic_auth(SERVICE_USER, Some(format!("wrong-{w}-{i}")))
                    .send()
                    .await;
                if let Ok(r) = r {
                    statuses.push(r.status());
                }
            }
            statuses
        }));
    }
    let mut served = 0;
    for _ in 0..10 {
        tokio::time::sleep(Duration::from_millis(500)).await;
        // Cold: the verified-credential cache is emptied before each request.
        app.state.auth.caches.basic.invalidate_all();
        let r = app.service(Method::GET, TEAM_PATH).send().await.unwrap();
        assert_eq!(r.status(), StatusCode::NOT_FOUND, "the service account was refused");
        served += 1;
    }
    stop.store(true, Ordering::SeqCst);
    let mut refused = 0;
    let mut throttled = 0;
    for f in flood {
        for s in f.await.unwrap() {
            assert!(
                [
                    StatusCode::UNAUTHORIZED,
                    StatusCode::TOO_MANY_REQUESTS,
                    StatusCode::SERVICE_UNAVAILABLE
                ]
                .contains(&s),
                "{s}"
            );
            refused += 1;
            throttled += usize::from(s == StatusCode::TOO_MANY_REQUESTS);
        }
    }
    assert_eq!(served, 10);
    assert!(
        refused > 0 && throttled > 0,
        "the flood was throttled ({throttled} of {refused})"
    );
}

#[tokio::test]
async fn failed_basic_attempts_are_throttled_with_retry_after_before_hashing() {
    let app = TestApp::spawn_with(|s| s.basic_failures_per_minute = 6).await;
    assert_eq!(
        app.service(Method::GET, TEAM_PATH).send().await.unwrap().status(),
        StatusCode::NOT_FOUND
    );
    let mut last = StatusCode::OK;
    for i in 0..10 {
        let r = app
            .http
            .get(app.url(TEAM_PATH))
            .basic_auth(SERVICE_USER, Some(format!("wrong-{i}")))
            .send()
            .await
            .unwrap();
        last = r.status();
        if last == StatusCode::TOO_MANY_REQUESTS {
            assert!(r.headers().contains_key("retry-after"));
            let body: serde_json::Value = r.json().await.unwrap();
            assert_eq!(body["error"], "rate_limited");
            break;
        }
        assert_eq!(last, StatusCode::UNAUTHORIZED);
    }
    assert_eq!(last, StatusCode::TOO_MANY_REQUESTS);
    // The right password, verified before, still passes (cold cache too).
    app.state.auth.caches.basic.invalidate_all();
    assert_eq!(
        app.service(Method::GET, TEAM_PATH).send().await.unwrap().status(),
        StatusCode::NOT_FOUND
    );
    let metrics = app.metrics().await;
    assert!(
        metrics.contains("mcp_rate_limited_total{kind=\"basic\",tool=\"-\"}"),
        "{metrics}"
    );
}

#[tokio::test]
async fn unknown_kid_and_unknown_token_floods_leave_the_pool_to_a_valid_credential() {
    let app = TestApp::spawn().await;
    let s = seed(&app).await;
    let valid = app.opaque_token(&[s.lib_a.clone()]).await;
    let (kid, secret) = app.signing_key().await;
    let now = chrono::Utc::now().timestamp();
    let stop = Arc::new(AtomicBool::new(false));
    let mut flood = Vec::new();
    for w in 0..16 {
        let (http, url, stop, secret, kid) = (
            app.http.clone(),
            app.url("/mcp/"),
            stop.clone(),
            secret.clone(),
            kid.clone(),
        );
        flood.push(tokio::spawn(async move {
            let mut n = 0;
            for i in 0..150 {
                if stop.load(Ordering::SeqCst) {
                    break;
                }
                let bearer = if i % 2 == 0 {
                    format!("mnm_unknown_{w}_{i}")
                } else {
                    let claims = json!({"iss": "daedalus", "sub": "x", "iat": now, "exp": now + 60,
                                        "jti": format!("{w}-{i}")});
                    mnemosyne::auth::jwt::sign_hs256(&claims, &format!("{kid}-unknown-{w}-{i}"), &secret).unwrap()
                };
                let r = http
                    .post(&url)
                    .header("Accept", "application/json, text/event-stream")
                    .header("Authorization", format!("Bearer {bearer}"))
                    .json(&json!({"jsonrpc": "2.0", "id": 1, "method": "tools/list"}))
                    .send()
                    .await
                    .unwrap();
                assert_eq!(r.status(), StatusCode::UNAUTHORIZED);
                n += 1;
            }
            n
        }));
    }
    for _ in 0..10 {
        // Cold each time: the valid token is looked up again during the flood.
        app.state.auth.caches.tokens.invalidate_all();
        let mut c = app.mcp(&valid).stateless();
        assert_eq!(c.library_uids().await, [s.lib_a.clone()]);
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    stop.store(true, Ordering::SeqCst);
    let mut total = 0;
    for f in flood {
        total += f.await.unwrap();
    }
    assert!(total > 0);
    // An unknown token is remembered in the negative cache (whenever the
    // caches are trusted: on a loaded machine the heartbeat may lapse during
    // the flood, and the caches are then bypassed — fail closed, but nothing
    // is remembered), so asking again costs no query.
    for _ in 0..100 {
        if app.state.auth.caches.usable() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let again = app
        .http
        .post(app.url("/mcp/"))
        .header("Accept", "application/json, text/event-stream")
        .header("Authorization", "Bearer mnm_unknown_0_0")
        .json(&json!({"jsonrpc": "2.0", "id": 1, "method": "tools/list"}))
        .send()
        .await
        .unwrap();
    assert_eq!(again.status(), StatusCode::UNAUTHORIZED);
    assert!(app
        .state
        .auth
        .caches
        .unknown
        .get(&format!(
            "tok:{}",
            mnemosyne::auth::resolver::token_hash("mnm_unknown_0_0")
        ))
        .await
        .is_some());
    // A token created now is not hidden by that cache (its INSERT notifies).
    let fresh = app.opaque_token(&[s.lib_b.clone()]).await;
    let mut c = app.mcp(&fresh).stateless();
    assert_eq!(c.library_uids().await, [s.lib_b.clone()]);
}

#[tokio::test]
async fn a_client_sending_one_header_byte_at_a_time_is_disconnected_while_a_normal_client_is_served() {
    let app = TestApp::spawn_with(|s| s.header_timeout_secs = 1).await;
    let addr = app.base.trim_start_matches("http://").to_owned();
    let mut slow = TcpStream::connect(&addr).await.unwrap();
    let request = b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Slow: aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa\r\n\r\n";
    let mut closed = false;
    // Bounded: at most 40 bytes, 200 ms apart (8 s) — the server must hang up first.
    for b in request.iter().take(40) {
        if slow.write_all(&[*b]).await.is_err() {
            closed = true;
            break;
        }
        let mut buf = [0u8; 512];
        match tokio::time::timeout(Duration::from_millis(200), slow.read(&mut buf)).await {
            Ok(Ok(0)) | Ok(Err(_)) => {
                closed = true;
                break;
            }
            // The server may answer 408 before closing.
            Ok(Ok(_)) => {}
            Err(_) => {}
        }
        let r = app.http.get(app.url("/healthz")).send().await.unwrap();
        assert_eq!(r.status(), StatusCode::OK, "a normal client is served meanwhile");
    }
    assert!(closed, "the slow client was never disconnected");
}

#[tokio::test]
async fn connections_over_the_cap_are_closed_at_once() {
    let app = TestApp::spawn_with(|s| s.max_connections = 2).await;
    let addr = app.base.trim_start_matches("http://").to_owned();
    // Two idle connections take both places.
    let a = TcpStream::connect(&addr).await.unwrap();
    let _b = TcpStream::connect(&addr).await.unwrap();
    tokio::time::sleep(Duration::from_millis(100)).await;
    let mut third = TcpStream::connect(&addr).await.unwrap();
    let _ = third.write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n").await;
    let mut buf = [0u8; 64];
    let n = tokio::time::timeout(Duration::from_secs(5), third.read(&mut buf))
        .await
        .expect("closed, not left hanging")
        .unwrap_or(0);
    assert_eq!(n, 0, "the third connection was served");
    drop(a);
    // A place is free again (bounded retries while the server notices).
    let mut ok = false;
    for _ in 0..50 {
        if let Ok(r) = reqwest::Client::new().get(app.url("/healthz")).send().await {
            ok = r.status() == StatusCode::OK;
            if ok {
                break;
            }
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(ok);
}

/// A Bolt server that accepts connections and never answers: every graph
/// query hangs until the store timeout.
async fn black_hole() -> u16 {
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = l.local_addr().unwrap().port();
    tokio::spawn(async move {
        let mut held = Vec::new();
        // Bounded: holds at most 64 connections.
        while held.len() < 64 {
            match l.accept().await {
                Ok((s, _)) => held.push(s),
                Err(_) => break,
            }
        }
        tokio::time::sleep(Duration::from_secs(60)).await;
    });
    port
}

#[tokio::test]
async fn a_search_past_its_deadline_returns_is_error() {
    let port = black_hole().await;
    let app = TestApp::spawn_with(|s| {
        s.bolt_uri = format!("127.0.0.1:{port}");
        s.tool_deadline_ms = 300;
    })
    .await;
    let token = app.opaque_token(&["lib_x".into()]).await;
    let mut c = app.mcp(&token).stateless();
    let r = c.call("search", json!({"query": "pelican"})).await;
    assert_eq!(r["isError"], json!(true), "{r}");
    let text = r["content"][0]["text"].as_str().unwrap();
    assert!(text.contains("300 ms deadline"), "{text}");
    assert!(
        r.get("structuredContent").is_none_or(|v| v.is_null()),
        "no partial answer: {r}"
    );
}

#[tokio::test]
async fn over_the_principal_limit_is_429_with_retry_after() {
    let app = TestApp::spawn_with(|s| s.rate_limit_per_minute = 6).await;
    let token = app.opaque_token(&[]).await;
    let other = app.opaque_token(&[]).await;
    let mut c = app.mcp(&token).stateless();
    assert_eq!(c.list_tools().await.status, StatusCode::OK);
    let ex = c.list_tools().await;
    assert_eq!(ex.status, StatusCode::TOO_MANY_REQUESTS);
    assert!(ex.headers.contains_key("retry-after"));
    assert_eq!(ex.json()["error"], "rate_limited");
    // Another principal has its own bucket.
    assert_eq!(app.mcp(&other).stateless().list_tools().await.status, StatusCode::OK);
    let metrics = app.metrics().await;
    assert!(
        metrics.contains("mcp_rate_limited_total{kind=\"token\",tool=\"-\"} 1"),
        "{metrics}"
    );
}

#[tokio::test]
async fn over_the_tool_limit_is_429_with_a_json_rpc_error() {
    let app = TestApp::spawn_with(|s| s.tool_rate_limit_per_minute = 6).await;
    let token = app.opaque_token(&[]).await;
    let mut c = app.mcp(&token).connect().await;
    assert_eq!(
        c.call_raw("search", json!({"query": "x"}), None).await.status,
        StatusCode::OK
    );
    let ex = c.call_raw("search", json!({"query": "x"}), None).await;
    assert_eq!(ex.status, StatusCode::TOO_MANY_REQUESTS);
    assert!(ex.headers.contains_key("retry-after"));
    let body = ex.json();
    assert_eq!(body["jsonrpc"], "2.0");
    assert!(body["error"]["message"].as_str().unwrap().contains("search"), "{body}");
    // Other tools and other requests are not limited by search's bucket.
    assert_eq!(
        c.call_raw("list_libraries", json!({}), None).await.status,
        StatusCode::OK
    );
    assert_eq!(c.list_tools().await.status, StatusCode::OK);
    let metrics = app.metrics().await;
    assert!(
        metrics.contains("mcp_rate_limited_total{kind=\"token\",tool=\"search\"} 1"),
        "{metrics}"
    );
}

/// Hardening 3, row 6: the sign-in form is read before anyone is
/// authenticated, so a body announced large and sent one byte at a time is
/// cut off at the header timeout and the connection closed, while a normal
/// client is served.
#[tokio::test]
async fn a_sign_in_body_sent_one_byte_at_a_time_is_cut_off() {
    let app = TestApp::spawn_with(|s| s.header_timeout_secs = 1).await;
    let addr = app.base.trim_start_matches("http://").to_owned();
    let mut slow = TcpStream::connect(&addr).await.unwrap();
    let head = format!(
        "POST /admin/login HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/x-www-form-urlencoded\r\nContent-Length: 4000000\r\n\r\n"
    );
    slow.write_all(head.as_bytes()).await.unwrap();
    let mut answer = Vec::new();
    let mut closed = false;
    // Bounded: at most 40 bytes, 200 ms apart (8 s) — the server must hang up first.
    for _ in 0..40 {
        if slow.write_all(b"a").await.is_err() {
            closed = true;
            break;
        }
        let mut buf = [0u8; 1024];
        match tokio::time::timeout(Duration::from_millis(200), slow.read(&mut buf)).await {
            Ok(Ok(0)) | Ok(Err(_)) => {
                closed = true;
                break;
            }
            Ok(Ok(n)) => answer.extend_from_slice(&buf[..n]),
            Err(_) => {}
        }
        let r = app.http.get(app.url("/healthz")).send().await.unwrap();
        assert_eq!(r.status(), StatusCode::OK, "a normal client is served meanwhile");
    }
    assert!(closed, "the slow sign-in body was never cut off");
    let answer = String::from_utf8_lossy(&answer);
    assert!(
        answer.is_empty() || answer.starts_with("HTTP/1.1 408") || answer.starts_with("HTTP/1.1 413"),
        "{answer}"
    );
}
