use std::net::TcpListener;

use mnemosyne::store::pg;
use reqwest::StatusCode;
use serde_json::Value;

use crate::helpers::{base_settings, bootstrap_graph, send, TestApp};

#[tokio::test]
async fn migrations_apply_to_an_empty_database_and_are_idempotent() {
    let app = TestApp::spawn().await; // applied once already
    pg::migrate(&app.pg).await.expect("second run is a no-op");
    let tables: Vec<String> = sqlx::query_scalar(
        "SELECT table_name::text FROM information_schema.tables WHERE table_schema = 'public' ORDER BY 1",
    )
    .fetch_all(&app.pg)
    .await
    .unwrap();
    for t in [
        "audit_events",
        "library_memberships",
        "mcp_signing_keys",
        "mcp_tokens",
        "per_turn_jti_uses",
        "team_workspace_assignments",
        "teams",
        "users",
    ] {
        assert!(tables.contains(&t.to_owned()), "missing table {t}: {tables:?}");
    }
    // migrate makes sure exactly one active signing key exists, and only one.
    assert!(mnemosyne::store::pg::keys::ensure_active(&app.pg)
        .await
        .unwrap()
        .is_none());
    let active: i64 = sqlx::query_scalar("SELECT count(*) FROM mcp_signing_keys WHERE retired_at IS NULL")
        .fetch_one(&app.pg)
        .await
        .unwrap();
    assert_eq!(active, 1);
}

#[tokio::test]
async fn graph_schema_bootstrap_is_idempotent_on_arcadedb() {
    let settings = base_settings();
    bootstrap_graph(&settings).await;
    let g = mnemosyne::store::graph::GraphStore::connect(&settings).await.unwrap();
    g.bootstrap_schema().await.expect("second bootstrap is a no-op");
    g.bootstrap_schema().await.expect("third bootstrap is a no-op");
}

#[tokio::test]
async fn readyz_is_200_when_both_stores_answer() {
    let app = TestApp::spawn().await;
    let (status, body) = send(app.http.get(app.url("/readyz"))).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["checks"]["postgres"]["status"], "ok");
    assert_eq!(body["checks"]["graph"]["status"], "ok");
}

fn closed_port() -> u16 {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let p = l.local_addr().unwrap().port();
    drop(l);
    p
}

#[tokio::test]
async fn readyz_is_503_naming_the_graph_when_bolt_is_closed() {
    let port = closed_port();
    let app = TestApp::spawn_with(|s| s.bolt_uri = format!("127.0.0.1:{port}")).await;
    let (status, body) = send(app.http.get(app.url("/readyz"))).await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(body["failing"], serde_json::json!(["graph"]));
    assert_eq!(body["checks"]["postgres"]["status"], "ok");
    assert!(body["message"].as_str().unwrap().contains("graph"));
}

#[tokio::test]
async fn readyz_is_503_naming_postgres_when_it_is_closed() {
    let port = closed_port();
    let app = TestApp::spawn_with(|_| {}).await;
    let mut settings = app.settings.clone();
    settings.database_url = format!("postgres://postgres@127.0.0.1:{port}/nothing");
    settings.listen = "127.0.0.1:0".parse().unwrap();
    let down = mnemosyne::startup::Application::build(settings).await.unwrap();
    let base = format!("http://{}", down.local_addr());
    tokio::spawn(down.run_until(std::future::pending()));
    let (status, body) = send(app.http.get(format!("{base}/readyz"))).await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(body["failing"], serde_json::json!(["postgres"]));
}

#[tokio::test]
async fn metrics_expose_request_counts_and_latency() {
    let app = TestApp::spawn().await;
    app.http.get(app.url("/healthz")).send().await.unwrap();
    app.http.get(app.url("/readyz")).send().await.unwrap();
    let text = app.metrics().await;
    assert!(
        text.contains(r#"http_requests_total{method="GET",route="/healthz",status="200"} 1"#),
        "{text}"
    );
    assert!(
        text.contains(r#"http_request_duration_seconds_bucket{method="GET",route="/readyz""#),
        "{text}"
    );
}

#[tokio::test]
async fn unknown_paths_are_json_404() {
    let app = TestApp::spawn().await;
    let (status, body) = send(app.http.get(app.url("/nope"))).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    assert_eq!(body["error"], "not_found");
}

#[tokio::test]
async fn oversized_bodies_are_json_413() {
    let app = TestApp::spawn_with(|s| s.body_limit_bytes = 1024).await;
    let big = serde_json::json!({"workspace_id": "w", "item": {"title": "t"}, "content": "x".repeat(4096)});
    let (status, body) = send(app.service(reqwest::Method::POST, "/library/api/ingest/").json(&big)).await;
    assert_eq!(status, StatusCode::PAYLOAD_TOO_LARGE);
    assert_eq!(body["error"], "payload_too_large");
}

#[tokio::test]
async fn server_json_describes_this_server_like_the_pallas_registry() {
    let app = TestApp::spawn().await;
    let (status, body) = send(app.http.get(app.url("/.well-known/mcp/server.json"))).await;
    assert_eq!(status, StatusCode::OK);
    let server = &body["servers"][0]["server"];
    assert_eq!(server["name"], "ca.helu.ouranos/mnemosyne");
    assert_eq!(server["version"], env!("CARGO_PKG_VERSION"));
    assert_eq!(server["remotes"][0]["type"], "streamable-http");
    assert!(server["remotes"][0]["url"].as_str().unwrap().ends_with("/mcp/"));
}

/// No Docker engine runs here: check the compose file against what the binary
/// reads instead.
#[test]
fn docker_compose_matches_the_binary() {
    let text = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/docker-compose.yml")).unwrap();
    let doc: Value = serde_yaml_ng::from_str(&text).unwrap();
    let services = doc["services"].as_object().unwrap();
    for s in ["postgres", "neo4j", "migrate", "mnemosyne"] {
        assert!(services.contains_key(s), "service {s} missing");
    }
    assert!(services["neo4j"]["image"].as_str().unwrap().starts_with("neo4j:5"));
    assert!(services["postgres"]["image"]
        .as_str()
        .unwrap()
        .starts_with("postgres:16"));
    // Every MNEMOSYNE_* variable the compose file sets is one the binary reads.
    let help = std::process::Command::new(env!("CARGO_BIN_EXE_mnemosyne"))
        .arg("serve")
        .arg("--help")
        .output()
        .unwrap();
    let help = String::from_utf8_lossy(&help.stdout);
    let mut seen = 0;
    for name in ["migrate", "mnemosyne"] {
        let env = services[name]["environment"]
            .as_object()
            .unwrap_or_else(|| panic!("{name} environment is a map"));
        for k in env.keys() {
            assert!(k.starts_with("MNEMOSYNE_"), "{k}");
            assert!(help.contains(&format!("[env: {k}")), "binary does not read {k}");
            seen += 1;
        }
        assert_eq!(env["MNEMOSYNE_GRAPH_FLAVOR"], "neo4j");
        assert!(env["MNEMOSYNE_DATABASE_URL"]
            .as_str()
            .unwrap()
            .contains("@postgres:5432/"));
        assert!(env["MNEMOSYNE_BOLT_URI"].as_str().unwrap().contains("neo4j:7687"));
    }
    assert!(seen >= 8);
    assert!(services["mnemosyne"]["depends_on"]["migrate"]["condition"] == "service_completed_successfully");
}
