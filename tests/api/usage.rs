//! Usage per credential (issue 24): tool calls counted per hour by credential,
//! tool, library-count bucket and outcome on every replica, flushed to
//! Postgres in batches, and reported by the console and `mnemosyne usage`.

use mnemosyne::store::pg::tokens;
use reqwest::StatusCode;
use serde_json::{json, Value};

use crate::admin::{staff, Console, STAFF_PASSWORD};
use crate::helpers::TestApp;

#[tokio::test]
async fn tool_calls_are_counted_per_credential_on_every_replica_and_reported() {
    // No timed flush during the test: the replicas are flushed by hand.
    let app = TestApp::spawn_with(|s| s.usage_flush_secs = 3600).await;
    let other = app.second_instance().await;
    let ws = app.uid("ws_usage");
    let a = app.ingest_ws(&ws, "Ledger", "# Ledger\n\nThe wombat tally.").await;
    let lib = a["library_uid"].as_str().unwrap().to_owned();
    let token = app.opaque_token(&[lib.clone()]).await;
    let token_id = tokens::list(&app.pg, None).await.unwrap()[0].id;
    let (team, jwt) = app.create_team("Counters").await;
    app.put_workspaces(team, &[ws.clone()]).await;

    let mut here = app.mcp(&token).connect().await;
    let mut there = other.mcp(&token).stateless();
    for _ in 0..3 {
        here.call_ok("search", json!({"query": "wombat"})).await;
    }
    there.call_ok("search", json!({"query": "wombat"})).await;
    here.call_ok("list_libraries", json!({})).await;
    // A bad argument is a tool error; an unknown tool a protocol error.
    here.call("search", json!({"query": ""})).await;
    let unknown = here.call_raw("no_such_tool", json!({}), None).await;
    assert!(unknown.response().get("error").is_some());
    other
        .mcp(&jwt)
        .connect()
        .await
        .call_ok("list_libraries", json!({}))
        .await;

    // Nothing is in Postgres before a flush (the request path never writes).
    let before: i64 = sqlx::query_scalar("SELECT count(*) FROM usage_hourly")
        .fetch_one(&app.pg)
        .await
        .unwrap();
    assert_eq!(before, 0);
    app.state.metrics.usage.flush(&app.pg).await;
    other.state.metrics.usage.flush(&other.pg).await;

    let rows: Vec<(String, String, String, String, String, i64)> = sqlx::query_as(
        "SELECT credential, kind, tool, libraries, outcome, calls FROM usage_hourly
          ORDER BY credential, tool, outcome",
    )
    .fetch_all(&app.pg)
    .await
    .unwrap();
    let t = format!("token:{token_id}");
    let tm = format!("team:{team}");
    let row = |c: &str, k: &str, tool: &str, o: &str, n: i64| {
        (
            c.to_owned(),
            k.to_owned(),
            tool.to_owned(),
            "1".to_owned(),
            o.to_owned(),
            n,
        )
    };
    let mut want = vec![
        row(&tm, "team", "list_libraries", "ok", 1),
        row(&t, "token", "list_libraries", "ok", 1),
        row(&t, "token", "other", "protocol_error", 1),
        row(&t, "token", "search", "ok", 4),
        row(&t, "token", "search", "tool_error", 1),
    ];
    want.sort();
    assert_eq!(rows, want);
    // A second flush of nothing adds nothing; new calls add to the hour.
    here.call_ok("search", json!({"query": "wombat"})).await;
    app.state.metrics.usage.flush(&app.pg).await;
    app.state.metrics.usage.flush(&app.pg).await;
    let searches: i64 = sqlx::query_scalar(
        "SELECT calls FROM usage_hourly WHERE credential = $1 AND tool = 'search' AND outcome = 'ok'",
    )
    .bind(&t)
    .fetch_one(&app.pg)
    .await
    .unwrap();
    assert_eq!(searches, 5);

    // No credential ever becomes a Prometheus label.
    for replica in [&app, &other] {
        let m = replica.metrics().await;
        assert!(!m.contains(&t) && !m.contains(&team.to_string()), "{m}");
    }

    // The console's Usage page.
    staff(&app, "sam").await;
    let mut c = Console::signed_in(&app, "sam", STAFF_PASSWORD).await;
    let page = c.get("/admin/usage").await;
    assert_eq!(page.status, StatusCode::OK, "{}", page.body);
    for needle in [t.as_str(), tm.as_str(), "Counters", "Top tokens", "Top teams", "search"] {
        assert!(page.body.contains(needle), "{needle} missing: {}", page.body);
    }

    // `mnemosyne usage --json`.
    let report: Value = serde_json::from_str(&app.cli_ok(&["usage", "--days", "7", "--json"])).unwrap();
    assert_eq!(report["days"], 7);
    assert_eq!(
        report["tokens"],
        json!([{"credential": t, "kind": "token", "name": "test", "calls": 8, "refused": 0, "errors": 2}])
    );
    assert_eq!(
        report["teams"],
        json!([{"credential": tm, "kind": "team", "name": "Counters", "calls": 1, "refused": 0, "errors": 0}])
    );
    assert_eq!(report["per_turn"], json!([]));
    assert_eq!(
        report["tools"][0],
        json!({"tool": "search", "calls": 6, "refused": 0, "errors": 1})
    );
}
