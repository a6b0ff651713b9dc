//! Traces over OTLP (issue 15): the server, run as its own process with
//! `MNEMOSYNE_OTLP_ENDPOINT` pointing at a tiny in-process OTLP/HTTP receiver,
//! exports spans for the auth resolution, the tool call and its store queries
//! — and never token material or query text. (Its own binary: the exporter is
//! process-global.)

use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::{body::Bytes, extract::State, routing::post, Router};
use mnemosyne::config::Settings;
use mnemosyne::store::pg::{self, users};
use serde_json::json;

type Received = Arc<Mutex<Vec<u8>>>;

async fn receive(State(received): State<Received>, body: Bytes) -> &'static str {
    received.lock().unwrap().extend_from_slice(&body);
    ""
}

fn contains(haystack: &[u8], needle: &str) -> bool {
    haystack.windows(needle.len()).any(|w| w == needle.as_bytes())
}

#[tokio::test]
async fn spans_reach_the_collector_without_secrets() {
    // The receiver.
    let received: Received = Default::default();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let collector = format!("http://{}", listener.local_addr().unwrap());
    let app = Router::new()
        .route("/v1/traces", post(receive))
        .with_state(received.clone());
    tokio::spawn(async move { axum::serve(listener, app).await });

    // A fresh database with a token.
    let settings = Settings::from_env().expect("settings (run scripts/dev up)");
    let (server, _) = settings.database_url.rsplit_once('/').unwrap();
    let db = format!("mnemosyne_otlp_{}", &uuid::Uuid::new_v4().simple().to_string()[..10]);
    let admin = sqlx::PgPool::connect(&format!("{server}/postgres")).await.unwrap();
    sqlx::query(&format!("CREATE DATABASE \"{db}\""))
        .execute(&admin)
        .await
        .unwrap();
    let url = format!("{server}/{db}");
    let pool = pg::pool(&url, Duration::from_secs(5)).unwrap();
    pg::migrate(&pool).await.unwrap();
    pg::keys::ensure_active(&pool).await.unwrap();
    users::create(&pool, "tracer", None, false).await.unwrap();
    users::grant(&pool, "tracer", "lib_otlp_test", users::Role::Owner)
        .await
        .unwrap();
    let token = mnemosyne::service::tokens::mint(&pool, "tracer", "t", &["lib_otlp_test".into()], None)
        .await
        .unwrap()
        .plaintext;

    // The server, exporting to the receiver.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let base = format!("http://127.0.0.1:{port}");
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_mnemosyne"))
        .arg("serve")
        .env("MNEMOSYNE_DATABASE_URL", &url)
        .env_remove("MNEMOSYNE_EMBED_MODEL")
        .env("MNEMOSYNE_LISTEN", format!("127.0.0.1:{port}"))
        .env("MNEMOSYNE_PUBLIC_URL", &base)
        .env("MNEMOSYNE_OTLP_ENDPOINT", &collector)
        .env("OTEL_BSP_SCHEDULE_DELAY", "100")
        .env("MNEMOSYNE_LOG", "warn")
        .spawn()
        .unwrap();
    let http = reqwest::Client::new();
    let mut ready = false;
    for _ in 0..100 {
        if http.get(format!("{base}/healthz")).send().await.is_ok() {
            ready = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(ready, "server did not start");
    let r = http
        .post(format!("{base}/mcp/"))
        .header("Authorization", format!("Bearer {token}"))
        .header("Accept", "application/json, text/event-stream")
        .header("MCP-Protocol-Version", "2026-07-28")
        .header("Mcp-Method", "tools/call")
        .header("Mcp-Name", "search")
        .json(&json!({"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {
            "name": "search", "arguments": {"query": "zanzibarine pelicans"},
            "_meta": {"io.modelcontextprotocol/protocolVersion": "2026-07-28",
                      "io.modelcontextprotocol/clientCapabilities": {}}}}))
        .send()
        .await
        .unwrap();
    assert!(r.status().is_success(), "{}", r.status());

    // Bounded wait for the batch exporter.
    let mut got = Vec::new();
    for _ in 0..100 {
        got = received.lock().unwrap().clone();
        if contains(&got, "mcp.tool") && contains(&got, "auth.resolve") && contains(&got, "graph.query") {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let _ = child.kill();
    let _ = child.wait();
    sqlx::query(&format!("DROP DATABASE \"{db}\" WITH (FORCE)"))
        .execute(&admin)
        .await
        .unwrap();
    assert!(contains(&got, "mcp.tool"), "no tool span exported");
    assert!(contains(&got, "auth.resolve"), "no auth span exported");
    assert!(contains(&got, "graph.query"), "no store query span exported");
    // The token's library is not in the graph: the search stops after
    // looking its libraries up (search_libraries.cypher).
    assert!(
        contains(&got, "search_libraries.cypher"),
        "store spans name their Cypher file"
    );
    assert!(contains(&got, "mnemosyne"), "service name");
    assert!(!contains(&got, &token), "token material exported");
    assert!(!contains(&got, &token[4..20]), "token material exported");
    assert!(!contains(&got, "zanzibarine"), "query text exported");
}
