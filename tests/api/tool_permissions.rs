//! Tool permissions per credential (issue 24): an allowlist set in the admin
//! console applies on the next MCP request on every replica (an open session
//! included): `tools/list` shows only the allowed tools and any other call is
//! the JSON-RPC error naming it, counted `refused`.

use mnemosyne::store::pg::tokens;
use reqwest::StatusCode;
use serde_json::{json, Value};

use crate::admin::{staff, Console, STAFF_PASSWORD};
use crate::helpers::{McpClient, TestApp};

/// The tool names a `tools/list` shows, sorted.
async fn names(mcp: &mut McpClient) -> Vec<String> {
    let ex = mcp.list_tools().await;
    assert_eq!(ex.status, StatusCode::OK, "{ex:?}");
    let mut n: Vec<String> = ex.response()["result"]["tools"]
        .as_array()
        .unwrap_or_else(|| panic!("{}", ex.response()))
        .iter()
        .map(|t| t["name"].as_str().unwrap().to_owned())
        .collect();
    n.sort();
    n
}

/// The JSON-RPC error of a call the credential may not make.
async fn refused(mcp: &mut McpClient, tool: &str) -> Value {
    let ex = mcp.call_raw(tool, json!({}), None).await;
    assert_eq!(ex.status, StatusCode::OK, "{ex:?}");
    let e = ex.response()["error"].clone();
    assert_eq!(e["code"], -32602, "{e}");
    e
}

fn not_available(tool: &str) -> String {
    format!("Tool {tool} is not available to this credential.")
}

async fn audit_detail(app: &TestApp, action: &str) -> Vec<(String, Value)> {
    sqlx::query_as("SELECT actor, detail FROM audit_events WHERE action = $1 ORDER BY id")
        .bind(action)
        .fetch_all(&app.pg)
        .await
        .unwrap()
}

#[tokio::test]
async fn a_token_allowlist_set_in_the_console_applies_on_the_next_request_on_every_replica() {
    let app = TestApp::spawn().await;
    let other = app.second_instance().await;
    let lib = app.library("handbook").await;
    let token = app.opaque_token(&[lib.clone()]).await;
    let id = tokens::list(&app.pg, None).await.unwrap()[0].id;
    // Sessions opened on both replicas before the change.
    let mut here = app.mcp(&token).connect().await;
    let mut there = other.mcp(&token).connect().await;
    assert_eq!(names(&mut there).await.len(), 6);

    staff(&app, "sam").await;
    let mut c = Console::signed_in(&app, "sam", STAFF_PASSWORD).await;
    let list = c.get("/admin/tokens").await;
    assert!(list.body.contains("every tool"), "{}", list.body);
    assert!(list.body.contains(&format!("/admin/tokens/{id}/tools")));
    let form = c.get(&format!("/admin/tokens/{id}/tools")).await;
    assert_eq!(form.status, StatusCode::OK, "{}", form.body);

    // An unknown tool is refused, naming the field; nothing changes.
    let r = c
        .post(
            &format!("/admin/tokens/{id}/tools"),
            &[("mode", "only"), ("tool", "drop_all")],
        )
        .await;
    assert_eq!(r.status, StatusCode::BAD_REQUEST);
    assert!(r.body.contains("unknown tool &quot;drop_all&quot;"), "{}", r.body);
    assert_eq!(names(&mut there).await.len(), 6);

    let r = c
        .post(
            &format!("/admin/tokens/{id}/tools"),
            &[("mode", "only"), ("tool", "search"), ("tool", "get_chunk")],
        )
        .await;
    assert_eq!(r.status, StatusCode::SEE_OTHER, "{}", r.body);
    assert_eq!(r.location(), "/admin/tokens?ok=token-tools");
    // Fenced: the very next request on either replica sees it.
    for mcp in [&mut here, &mut there] {
        assert_eq!(names(mcp).await, ["get_chunk", "search"]);
        assert_eq!(refused(mcp, "get_health").await["message"], not_available("get_health"));
        assert_eq!(
            refused(mcp, "no_such_tool").await["message"],
            not_available("no_such_tool")
        );
        let ok = mcp.call_ok("search", json!({"query": "anything"})).await;
        assert_eq!(ok["results"], json!([]));
    }
    for replica in [&app, &other] {
        let m = replica.metrics().await;
        assert!(
            m.contains(r#"mcp_tool_calls_total{outcome="refused",tool="get_health"} 1"#),
            "{m}"
        );
        assert!(
            m.contains(r#"mcp_tool_calls_total{outcome="refused",tool="other"} 1"#),
            "{m}"
        );
        assert!(!m.contains(r#"tool="other",outcome="protocol_error""#));
    }
    assert_eq!(
        audit_detail(&app, "token_tools_set").await,
        [("admin:sam".to_owned(), json!({"tools": ["search", "get_chunk"]}))]
    );

    // Every tool again.
    c.get(&format!("/admin/tokens/{id}/tools")).await;
    let r = c.post(&format!("/admin/tokens/{id}/tools"), &[("mode", "every")]).await;
    assert_eq!(r.status, StatusCode::SEE_OTHER, "{}", r.body);
    assert_eq!(names(&mut there).await.len(), 6);
    assert_eq!(names(&mut here).await.len(), 6);
}

#[tokio::test]
async fn a_team_allowlist_set_in_the_console_limits_its_jwt_on_every_replica() {
    let app = TestApp::spawn().await;
    let other = app.second_instance().await;
    let ws = app.uid("ws_tools");
    let a = app.ingest_ws(&ws, "Notes", "# Notes\n\nMonitoring only.").await;
    let lib = a["library_uid"].as_str().unwrap().to_owned();
    let (team, jwt) = app.create_team("Watchers").await;
    app.put_workspaces(team, &[ws.clone()]).await;
    let mut there = other.mcp(&jwt).connect().await;
    assert_eq!(names(&mut there).await.len(), 6);

    staff(&app, "sam").await;
    let mut c = Console::signed_in(&app, "sam", STAFF_PASSWORD).await;
    let page = c.get(&format!("/admin/teams/{team}")).await;
    assert!(
        page.body.contains(&format!("/admin/teams/{team}/tools")),
        "{}",
        page.body
    );
    let r = c
        .post(
            &format!("/admin/teams/{team}/tools"),
            &[("mode", "only"), ("tool", "get_health"), ("tool", "list_libraries")],
        )
        .await;
    assert_eq!(r.status, StatusCode::SEE_OTHER, "{}", r.body);
    assert_eq!(r.location(), format!("/admin/teams/{team}?ok=team-tools"));

    assert_eq!(names(&mut there).await, ["get_health", "list_libraries"]);
    assert_eq!(there.library_uids().await, [lib]);
    let e = refused(&mut there, "search").await;
    assert_eq!(e["message"], not_available("search"));
    // A new client of the other replica too, and the page shows the list.
    assert_eq!(
        names(&mut other.mcp(&jwt).connect().await).await,
        ["get_health", "list_libraries"]
    );
    let page = c.get(&format!("/admin/teams/{team}?ok=team-tools")).await;
    assert!(page.body.contains("Tool permissions saved"), "{}", page.body);
    assert_eq!(
        audit_detail(&app, "team_tools_set").await,
        [(
            "admin:sam".to_owned(),
            json!({"tools": ["get_health", "list_libraries"]})
        )]
    );
}
