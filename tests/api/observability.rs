//! Observability (issue 15): the metric families move as a scripted session
//! says they should; every log line of a request carries its request id.

use reqwest::StatusCode;
use serde_json::json;

use crate::helpers::Capture;
use crate::helpers::TestApp;
use crate::mcp::seed;

/// The value of one sample (`name{labels}`), 0 when absent.
fn sample(metrics: &str, series: &str) -> f64 {
    metrics
        .lines()
        .find_map(|l| l.strip_prefix(series).and_then(|rest| rest.strip_prefix(' ')))
        .map(|v| v.trim().parse().unwrap())
        .unwrap_or(0.0)
}

#[tokio::test]
async fn a_scripted_session_moves_every_family() {
    let app = TestApp::spawn_with(|s| s.tool_rate_limit_per_minute = 60).await;
    let s = seed(&app).await;
    let token = app.opaque_token(&[s.lib_a.clone()]).await;
    let before = app.metrics().await;

    let mut c = app.mcp(&token).connect().await;
    let hits = c.call_ok("search", json!({"query": "pelican"})).await;
    let chunk = hits["results"][0]["chunk_uid"].as_str().unwrap().to_owned();
    c.call_ok("get_chunk", json!({"chunk_uid": chunk})).await;
    // a bad argument: an isError answer
    let bad = c.call("search", json!({"query": ""})).await;
    assert_eq!(bad["isError"], json!(true));
    // a call of a tool that does not exist: a protocol error
    let ex = c.call_raw("no_such_tool", json!({}), None).await;
    assert!(ex.response().get("error").is_some(), "{ex:?}");
    // refused: over search's bucket (burst 10 of 60/min)
    let mut refused = 0;
    for _ in 0..12 {
        if c.call_raw("search", json!({"query": "pelican"}), None).await.status == StatusCode::TOO_MANY_REQUESTS {
            refused += 1;
        }
    }
    assert!(refused > 0);
    // an auth failure
    assert_eq!(app.mcp("mnm_nope").initialize().await.status, StatusCode::UNAUTHORIZED);
    // a cache miss then a hit (a new token's first and second request)
    let other = app.opaque_token(&[s.lib_b.clone()]).await;
    app.mcp(&other).stateless().list_tools().await;
    app.mcp(&other).stateless().list_tools().await;

    let after = app.metrics().await;
    let moved = |series: &str| sample(&after, series) - sample(&before, series);
    assert!(
        moved("mcp_tool_calls_total{outcome=\"ok\",tool=\"search\"}") >= 1.0,
        "{after}"
    );
    assert_eq!(moved("mcp_tool_calls_total{outcome=\"ok\",tool=\"get_chunk\"}"), 1.0);
    assert_eq!(
        moved("mcp_tool_calls_total{outcome=\"tool_error\",tool=\"search\"}"),
        1.0
    );
    assert_eq!(
        moved("mcp_tool_calls_total{outcome=\"protocol_error\",tool=\"other\"}"),
        1.0
    );
    assert_eq!(
        moved("mcp_tool_calls_total{outcome=\"refused\",tool=\"search\"}"),
        refused as f64
    );
    assert!(moved("mcp_tool_duration_seconds_count{tool=\"search\"}") >= 2.0);
    assert_eq!(moved("mcp_auth_failures_total{reason=\"token_not_found\"}"), 1.0);
    assert!(moved("auth_cache_requests_total{cache=\"tokens\",result=\"miss\"}") >= 2.0);
    assert!(moved("auth_cache_requests_total{cache=\"tokens\",result=\"hit\"}") >= 1.0);
    assert_eq!(sample(&after, "auth_listener_connected"), 1.0);
    assert_eq!(sample(&after, "mcp_sessions_active"), 1.0);
    assert!(moved("ingest_chunks_total") == 0.0, "no ingest in this script");
    assert!(sample(&after, "pg_pool_connections{state=\"max\"}") >= 1.0);
    assert!(after.contains("mnemosyne_build_info{flavor="), "{after}");
    assert!(
        after.contains("graph_query_duration_seconds_count{query=\"search.cypher\"}"),
        "{after}"
    );
    // No label holds a token, a uid or a query text.
    for secret in [token.as_str(), other.as_str(), s.lib_a.as_str(), "pelican"] {
        assert!(!after.contains(secret), "{secret} in /metrics");
    }
}

#[tokio::test]
async fn every_log_line_of_a_request_carries_its_request_id_and_no_secret() {
    let cap = Capture::default();
    let writer = cap.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_env_filter("info")
        .with_writer(move || writer.clone())
        .with_ansi(false)
        .json()
        .flatten_event(true)
        .with_current_span(true)
        .with_span_list(true)
        .finish();
    let _guard = tracing::subscriber::set_default(subscriber);
    let app = TestApp::spawn().await;
    let s = seed(&app).await;
    let token = app.opaque_token(&[s.lib_a.clone()]).await;
    cap.0.lock().unwrap().clear();

    let mut c = app.mcp(&token).stateless();
    let ex = c
        .post(
            json!({"jsonrpc": "2.0", "id": 7, "method": "tools/call",
                   "params": {"name": "search", "arguments": {"query": "pelican"}}}),
            &[("X-Request-Id", "req-test-42")],
        )
        .await;
    assert_eq!(ex.status, StatusCode::OK);
    assert_eq!(ex.headers["x-request-id"], "req-test-42");
    // A generated id when none (or a bad one) is sent.
    let r = app.http.get(app.url("/healthz")).send().await.unwrap();
    assert_eq!(r.headers()["x-request-id"].len(), 36);
    // The search started the library's index build in the background; it
    // finishes (bounded wait) and its lines name the request too.
    for _ in 0..400 {
        let building = crate::search_index::metric(&app, "mnemosyne_index_building_libraries").await;
        if building == 0.0 && crate::search_index::metric(&app, "mnemosyne_index_open_libraries").await >= 1.0 {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(25)).await;
    }

    let logs = String::from_utf8(cap.0.lock().unwrap().clone()).unwrap();
    assert!(
        logs.lines()
            .any(|l| l.contains("search index built") && l.contains("req-test-42")),
        "{logs}"
    );
    let lines: Vec<&str> = logs.lines().filter(|l| l.contains("req-test-42")).collect();
    assert!(lines.iter().any(|l| l.contains("bearer resolved")), "{logs}");
    assert!(lines.iter().any(|l| l.contains("tool call")), "{logs}");
    // Every line logged while serving it names it, through its `request` span
    // (or, on a tool's own task, a `request_id` field); healthz logs nothing.
    for line in logs.lines() {
        let v: serde_json::Value = serde_json::from_str(line).unwrap();
        let in_span = v["spans"]
            .as_array()
            .is_some_and(|s| s.iter().any(|s| s["name"] == "request" && s["id"] == "req-test-42"));
        assert!(in_span || v["request_id"] == "req-test-42", "{line}");
    }
    let tool_line = lines.iter().find(|l| l.contains("tool call")).unwrap();
    let v: serde_json::Value = serde_json::from_str(tool_line).unwrap();
    assert_eq!(v["tool"], "search");
    assert_eq!(v["principal"], "token");
    assert_eq!(v["libraries"], 1);
    assert_eq!(v["outcome"], "ok");
    assert!(!logs.contains(&token) && !logs.contains("pelican"), "{logs}");
}

/// Metric names an expression refers to (ours all start with these prefixes).
fn metric_names(expr: &str) -> Vec<String> {
    const PREFIXES: [&str; 7] = ["mcp_", "http_", "graph_", "auth_", "pg_", "ingest_", "mnemosyne_"];
    expr.split(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
        .filter(|w| PREFIXES.iter().any(|p| w.starts_with(p)))
        .map(|w| {
            ["_bucket", "_sum", "_count"]
                .iter()
                .find_map(|s| w.strip_suffix(s))
                .unwrap_or(w)
                .to_owned()
        })
        .collect()
}

#[tokio::test]
async fn the_dashboard_and_alert_rules_reference_only_metrics_that_exist() {
    let app = TestApp::spawn().await;
    // Enough traffic for every labelled family to have a series.
    let s = seed(&app).await;
    let token = app.opaque_token(&[s.lib_a.clone()]).await;
    let mut c = app.mcp(&token).connect().await;
    c.call_ok("search", json!({"query": "pelican"})).await;
    let metrics = app.metrics().await;
    let exists = |name: &str| metrics.contains(&format!("# TYPE {name} "));
    let root = env!("CARGO_MANIFEST_DIR");
    let dashboard: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(format!("{root}/deploy/grafana/dashboards/mnemosyne.json")).unwrap(),
    )
    .expect("the dashboard is JSON");
    let mut exprs: Vec<String> = dashboard["panels"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|p| p["targets"].as_array().unwrap().iter())
        .map(|t| t["expr"].as_str().unwrap().to_owned())
        .collect();
    assert!(
        exprs.len() >= 10,
        "request rate, tools, errors, auth, caches, stores, sessions…"
    );
    let rules: serde_json::Value =
        serde_yaml_ng::from_str(&std::fs::read_to_string(format!("{root}/deploy/prometheus/alerts.yml")).unwrap())
            .expect("the alert rules are YAML");
    let alerts: Vec<&serde_json::Value> = rules["groups"][0]["rules"].as_array().unwrap().iter().collect();
    for a in &alerts {
        exprs.push(a["expr"].as_str().unwrap().to_owned());
    }
    let names: Vec<String> = alerts.iter().map(|a| a["alert"].as_str().unwrap().to_owned()).collect();
    for wanted in ["StoreDown", "AuthFailuresSpike", "ListenerDisconnected", "P99High"] {
        assert!(
            names.iter().any(|n| n.contains(wanted)),
            "{wanted} alert missing: {names:?}"
        );
    }
    for e in &exprs {
        let used = metric_names(e);
        assert!(!used.is_empty(), "{e}");
        for m in used {
            assert!(exists(&m), "{m} (in `{e}`) is not a metric of this server");
        }
    }
}

/// The series names of a scrape (every sample line, labels included).
fn series(metrics: &str) -> std::collections::BTreeSet<String> {
    metrics
        .lines()
        .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
        .filter_map(|l| l.rsplit_once(' ').map(|(s, _)| s.to_owned()))
        .collect()
}

/// Hardening 3, row 3: made-up methods and paths from an unauthenticated
/// caller add no series to `/metrics` (unknown methods count as `other`,
/// unknown paths as `unmatched`).
#[tokio::test]
async fn a_thousand_made_up_methods_and_paths_add_no_metric_series() {
    let app = TestApp::spawn().await;
    // One of each kind first: the `other`/`unmatched` series exist from here.
    let send = |method: String, path: String| {
        let app = &app;
        async move {
            let m = reqwest::Method::from_bytes(method.as_bytes()).unwrap();
            app.http.request(m, app.url(&path)).send().await.unwrap().status()
        }
    };
    send("ZZWARM".into(), "/healthz".into()).await;
    send("GET".into(), "/no-such-path-warm".into()).await;
    send("ZZWARM".into(), "/no-such-path-warm".into()).await;
    // The scrape counts itself: scrape once before the baseline.
    app.metrics().await;
    let before = series(&app.metrics().await);
    for chunk in (0..1000).collect::<Vec<_>>().chunks(50) {
        futures::future::join_all(chunk.iter().map(|i| async move {
            send(format!("ZZ{i}X"), "/healthz".into()).await;
            send("GET".into(), format!("/made-up/{i}")).await;
            send(format!("QQ{i}"), format!("/made-up-too/{i}")).await;
        }))
        .await;
    }
    let after = series(&app.metrics().await);
    let new: Vec<_> = after.difference(&before).filter(|s| s.starts_with("http_")).collect();
    assert!(
        new.is_empty(),
        "new series: {:?}",
        new.iter().take(5).collect::<Vec<_>>()
    );
    assert!(
        after.iter().any(|s| s.contains("method=\"other\"")),
        "unknown methods are counted as other"
    );
}
