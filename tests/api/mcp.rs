use reqwest::StatusCode;
use serde_json::{json, Value};

use crate::helpers::TestApp;

/// Three libraries over two workspaces plus one user-managed library.
pub struct Seed {
    pub ws_a: String,
    pub ws_b: String,
    pub lib_a: String,
    pub lib_b: String,
    pub lib_c: String,
}

pub async fn seed(app: &TestApp) -> Seed {
    let ws_a = app.uid("ws_a");
    let ws_b = app.uid("ws_b");
    let a1 = app
        .ingest_ws(
            &ws_a,
            "Pelican migration",
            "# Pelicans\n\nThe pelican migrates along the coast every autumn. Zanzibarine pelicans prefer warm water.",
        )
        .await;
    app.ingest_ws(
        &ws_a,
        "Harbour notes",
        "# Harbour\n\nBoats and nets in the harbour. The lighthouse keeper logs weather.",
    )
    .await;
    let b1 = app
        .ingest_ws(
            &ws_b,
            "Pelican anatomy",
            "# Anatomy\n\nA pelican has a throat pouch. Zanzibarine birds are rare.",
        )
        .await;
    let lib_c = app.library("lib_c").await;
    app.ingest(json!({"library_uid": lib_c, "collection": "Papers", "item": {"title": "Glacier study", "uid": app.uid("glacier")},
                      "content": "# Glaciers\n\nGlacier retreat measured by satellite. Zanzibarine sediment cores."}))
        .await;
    Seed {
        ws_a,
        ws_b,
        lib_a: a1["library_uid"].as_str().unwrap().to_owned(),
        lib_b: b1["library_uid"].as_str().unwrap().to_owned(),
        lib_c,
    }
}

fn result_libs(out: &Value) -> Vec<String> {
    out["results"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["library_uid"].as_str().unwrap().to_owned())
        .collect()
}

#[tokio::test]
async fn tools_are_listed_with_schemas_and_read_only_annotations() {
    let app = TestApp::spawn().await;
    let token = app.opaque_token(&[]).await;
    let mut c = app.mcp(&token).connect().await;
    let ex = c.list_tools().await;
    let tools = ex.response()["result"]["tools"].as_array().unwrap().clone();
    let names: Vec<&str> = tools.iter().map(|t| t["name"].as_str().unwrap()).collect();
    for n in [
        "search",
        "get_chunk",
        "list_libraries",
        "list_collections",
        "list_items",
        "get_health",
    ] {
        assert!(names.contains(&n), "{n} missing from {names:?}");
    }
    for t in &tools {
        assert_eq!(t["annotations"]["readOnlyHint"], true, "{t}");
        assert_eq!(t["inputSchema"]["type"], "object");
        assert_eq!(t["inputSchema"]["additionalProperties"], false, "{t}");
        if t["name"] != "get_health" {
            assert_eq!(t["outputSchema"]["type"], "object", "{t}");
        }
    }
    let health = tools.iter().find(|t| t["name"] == "get_health").unwrap();
    assert_eq!(
        health["inputSchema"],
        json!({"type": "object", "properties": {}, "additionalProperties": false})
    );
}

#[tokio::test]
async fn initialize_advertises_this_server_not_rmcp() {
    let app = TestApp::spawn().await;
    let token = app.opaque_token(&[]).await;
    let mut c = app.mcp(&token);
    let ex = c.initialize().await;
    let info = &ex.response()["result"]["serverInfo"];
    assert_eq!(info["name"], "mnemosyne");
    assert_eq!(info["version"], env!("CARGO_PKG_VERSION"));
    assert!(ex.response()["result"]["capabilities"]["tools"].is_object());
}

#[tokio::test]
async fn principals_of_all_three_kinds_see_exactly_their_libraries() {
    let app = TestApp::spawn().await;
    let s = seed(&app).await;
    // opaque token: lib_c then lib_a (order kept)
    let token = app.opaque_token(&[s.lib_c.clone(), s.lib_a.clone()]).await;
    let mut c = app.mcp(&token).connect().await;
    assert_eq!(c.library_uids().await, vec![s.lib_c.clone(), s.lib_a.clone()]);
    let out = c.call_ok("search", json!({"query": "zanzibarine"})).await;
    let mut libs = result_libs(&out);
    libs.sort();
    let mut want = vec![s.lib_a.clone(), s.lib_c.clone()];
    want.sort();
    assert_eq!(libs, want);
    // per-turn JWT: lib_b only
    let jwt = app.per_turn_jwt(&[s.lib_b.clone()]).await;
    let mut c = app.mcp(&jwt).connect().await;
    assert_eq!(c.library_uids().await, vec![s.lib_b.clone()]);
    let out = c.call_ok("search", json!({"query": "zanzibarine"})).await;
    assert_eq!(result_libs(&out), vec![s.lib_b.clone()]);
    // team JWT attached to ws_b then ws_a
    let (id, team_jwt) = app.create_team("Kottos").await;
    app.put_workspaces(id, &[s.ws_b.clone(), s.ws_a.clone()]).await;
    let mut c = app.mcp(&team_jwt).connect().await;
    assert_eq!(c.library_uids().await, vec![s.lib_b.clone(), s.lib_a.clone()]);
}

#[tokio::test]
async fn search_orders_by_score_then_scope_position_and_narrows_never_widens() {
    let app = TestApp::spawn().await;
    let s = seed(&app).await;
    let token = app.opaque_token(&[s.lib_a.clone(), s.lib_c.clone()]).await;
    let mut c = app.mcp(&token).connect().await;
    let out = c.call_ok("search", json!({"query": "zanzibarine", "limit": 10})).await;
    let scores: Vec<f64> = out["results"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["score"].as_f64().unwrap())
        .collect();
    assert!(scores.windows(2).all(|w| w[0] >= w[1]), "{scores:?}");
    for r in out["results"].as_array().unwrap() {
        for k in [
            "chunk_uid",
            "item_uid",
            "item_title",
            "collection_uid",
            "library_uid",
            "text",
        ] {
            assert!(r[k].as_str().is_some_and(|v| !v.is_empty()), "{k} in {r}");
        }
    }
    // narrowing to a library outside the scope yields nothing (never widens)
    let out = c
        .call_ok("search", json!({"query": "zanzibarine", "library_uids": [s.lib_b]}))
        .await;
    assert_eq!(out["results"], json!([]));
    let out = c
        .call_ok("search", json!({"query": "zanzibarine", "library_uids": [s.lib_c]}))
        .await;
    assert_eq!(result_libs(&out), vec![s.lib_c.clone()]);
    // collection filter
    let col = out["results"][0]["collection_uid"].as_str().unwrap().to_owned();
    let out = c
        .call_ok("search", json!({"query": "zanzibarine", "collection_uid": col}))
        .await;
    assert_eq!(result_libs(&out), vec![s.lib_c.clone()]);
    // limit
    let out = c
        .call_ok(
            "search",
            json!({"query": "zanzibarine pelican harbour glacier", "limit": 1}),
        )
        .await;
    assert_eq!(out["results"].as_array().unwrap().len(), 1);
}

#[tokio::test]
async fn lucene_special_queries_are_plain_text() {
    let app = TestApp::spawn().await;
    let s = seed(&app).await;
    let token = app.opaque_token(&[s.lib_a.clone()]).await;
    let mut c = app.mcp(&token).connect().await;
    for q in [
        "(pelican AND \"coast",
        "a:b",
        "*",
        "?",
        "pelican*",
        "coast~",
        "[x TO y]",
        "\\",
        "NOT OR AND",
    ] {
        let r = c.call("search", json!({"query": q})).await;
        assert_ne!(r["isError"], json!(true), "{q}: {r}");
        assert!(r["structuredContent"]["results"].is_array(), "{q}: {r}");
    }
    let out = c.call_ok("search", json!({"query": "(pelican AND \"coast"})).await;
    assert!(
        !out["results"].as_array().unwrap().is_empty(),
        "escaped words still match"
    );
    let out = c.call_ok("search", json!({"query": "*"})).await;
    assert_eq!(out["results"], json!([]), "* is a character, not a wildcard");
}

#[tokio::test]
async fn invalid_arguments_are_tool_errors_naming_the_argument() {
    let app = TestApp::spawn().await;
    let token = app.opaque_token(&[]).await;
    let mut c = app.mcp(&token).connect().await;
    let cases = [
        ("search", json!({"query": "   "}), "query"),
        ("search", json!({}), "query"),
        ("search", json!({"query": "x".repeat(1001)}), "query"),
        ("search", json!({"query": "a", "limit": 0}), "limit"),
        ("search", json!({"query": "a", "limit": 51}), "limit"),
        ("search", json!({"query": "a", "library_uids": "x"}), "library_uids"),
        ("search", json!({"query": "a", "bogus": 1}), "bogus"),
        ("get_chunk", json!({"chunk_uid": "c", "context": 6}), "context"),
        ("get_chunk", json!({}), "chunk_uid"),
        ("list_items", json!({}), "collection_uid"),
        ("list_collections", json!({"cursor": "forged"}), "cursor"),
        ("list_libraries", json!({"x": 1}), "x"),
    ];
    for (tool, args, name) in cases {
        let r = c.call(tool, args.clone()).await;
        assert_eq!(r["isError"], true, "{tool} {args}: {r}");
        let msg = r["content"][0]["text"].as_str().unwrap();
        assert!(msg.contains(&format!("`{name}`")), "{tool} {args}: {msg}");
    }
}

#[tokio::test]
async fn foreign_uids_look_exactly_like_absent_ones() {
    let app = TestApp::spawn().await;
    let s = seed(&app).await;
    let owner = app.opaque_token(&[s.lib_b.clone()]).await;
    let mut o = app.mcp(&owner).connect().await;
    let hit = o.call_ok("search", json!({"query": "pouch"})).await;
    let foreign_chunk = hit["results"][0]["chunk_uid"].as_str().unwrap().to_owned();
    let foreign_col = hit["results"][0]["collection_uid"].as_str().unwrap().to_owned();

    let token = app.opaque_token(&[s.lib_a.clone()]).await;
    let mut c = app.mcp(&token).connect().await;
    let foreign = c.call("get_chunk", json!({"chunk_uid": foreign_chunk})).await;
    let absent = c.call("get_chunk", json!({"chunk_uid": "no_such_chunk"})).await;
    assert_eq!(foreign["isError"], true);
    assert_eq!(
        foreign["content"][0]["text"]
            .as_str()
            .unwrap()
            .replace(&foreign_chunk, "X"),
        absent["content"][0]["text"]
            .as_str()
            .unwrap()
            .replace("no_such_chunk", "X")
    );
    let foreign = c.call("list_items", json!({"collection_uid": foreign_col})).await;
    let absent = c.call("list_items", json!({"collection_uid": "no_such_col"})).await;
    assert_eq!(foreign["isError"], true);
    assert_eq!(
        foreign["content"][0]["text"]
            .as_str()
            .unwrap()
            .replace(&foreign_col, "X"),
        absent["content"][0]["text"]
            .as_str()
            .unwrap()
            .replace("no_such_col", "X")
    );
    let foreign = c.call("list_collections", json!({"library_uid": s.lib_b})).await;
    assert_eq!(foreign["isError"], true);
    assert_eq!(foreign["content"][0]["text"], format!("library not found: {}", s.lib_b));
    let foreign = c.call("list_items", json!({"library_uid": s.lib_c})).await;
    assert_eq!(foreign["isError"], true);
}

#[tokio::test]
async fn get_chunk_returns_neighbours_in_ordinal_order() {
    let app = TestApp::spawn().await;
    let lib = app.library("big").await;
    let mut doc = String::new();
    for i in 0..30 {
        doc.push_str(&format!(
            "## Section {i}\n\nParagraph {i} about quokka number {i}. {}\n\n",
            "Filler words here. ".repeat(12)
        ));
    }
    let r = app
        .ingest(json!({"library_uid": lib, "item": {"title": "Quokkas"}, "content": doc}))
        .await;
    assert!(r["chunk_count"].as_i64().unwrap() >= 8, "{r}");
    let token = app.opaque_token(&[lib.clone()]).await;
    let mut c = app.mcp(&token).connect().await;
    let items = c.call_ok("list_items", json!({"library_uid": lib})).await;
    assert_eq!(items["items"][0]["chunk_count"], r["chunk_count"]);
    let hit = c.call_ok("search", json!({"query": "Paragraph 15 quokka"})).await;
    let uid = hit["results"][0]["chunk_uid"].as_str().unwrap();
    let out = c.call_ok("get_chunk", json!({"chunk_uid": uid, "context": 2})).await;
    let ord = out["chunk"]["ordinal"].as_i64().unwrap();
    let ords: Vec<i64> = out["neighbors"]
        .as_array()
        .unwrap()
        .iter()
        .map(|n| n["ordinal"].as_i64().unwrap())
        .collect();
    let want: Vec<i64> = (ord - 2..=ord + 2).filter(|o| *o != ord && *o >= 0).collect();
    assert_eq!(ords, want);
    let out = c.call_ok("get_chunk", json!({"chunk_uid": uid})).await;
    assert_eq!(out["neighbors"], json!([]));
}

#[tokio::test]
async fn pagination_visits_every_item_once() {
    let app = TestApp::spawn().await;
    let lib = app.library("paged").await;
    for i in 0..23 {
        app.ingest(
            json!({"library_uid": lib, "collection": if i % 2 == 0 { "Even" } else { "Odd" },
                          "item": {"title": format!("Doc {i}")}, "content": format!("document number {i}")}),
        )
        .await;
    }
    let token = app.opaque_token(&[lib.clone()]).await;
    let mut c = app.mcp(&token).connect().await;
    let mut seen = Vec::new();
    let mut cursor: Option<String> = None;
    let mut pages = 0;
    loop {
        let mut args = json!({"library_uid": lib, "limit": 5});
        if let Some(cur) = &cursor {
            args["cursor"] = json!(cur);
        }
        let page = c.call_ok("list_items", args).await;
        for i in page["items"].as_array().unwrap() {
            seen.push(i["uid"].as_str().unwrap().to_owned());
        }
        pages += 1;
        match page["next_cursor"].as_str() {
            Some(n) => cursor = Some(n.to_owned()),
            None => break,
        }
    }
    assert_eq!(pages, 5);
    let mut dedup = seen.clone();
    dedup.sort();
    dedup.dedup();
    assert_eq!(dedup.len(), 23);
    assert_eq!(seen.len(), 23);
    // collections: two, one page
    let cols = c
        .call_ok("list_collections", json!({"library_uid": lib, "limit": 1}))
        .await;
    assert_eq!(cols["collections"].as_array().unwrap().len(), 1);
    let next = cols["next_cursor"].as_str().unwrap();
    let cols2 = c
        .call_ok("list_collections", json!({"library_uid": lib, "cursor": next}))
        .await;
    assert_eq!(cols2["collections"].as_array().unwrap().len(), 1);
    assert!(cols2["next_cursor"].is_null());
    // a cursor from another listing is refused, never reinterpreted
    let r = c.call("list_collections", json!({"cursor": next})).await;
    assert_eq!(r["isError"], true);
}

#[tokio::test]
async fn empty_scope_answers_empty() {
    let app = TestApp::spawn().await;
    seed(&app).await;
    let token = app.opaque_token(&[]).await;
    let mut c = app.mcp(&token).connect().await;
    assert_eq!(c.call_ok("list_libraries", json!({})).await["libraries"], json!([]));
    assert_eq!(
        c.call_ok("search", json!({"query": "pelican"})).await["results"],
        json!([])
    );
    assert_eq!(c.call_ok("list_collections", json!({})).await["collections"], json!([]));
}

#[tokio::test]
async fn progress_notifications_arrive_with_a_token_and_not_without() {
    let app = TestApp::spawn().await;
    let s = seed(&app).await;
    let token = app.opaque_token(&[s.lib_a.clone()]).await;
    let mut c = app.mcp(&token).connect().await;
    let ex = c.call_raw("search", json!({"query": "pelican"}), Some("tok-1")).await;
    let p = ex.notifications("notifications/progress");
    assert_eq!(p.len(), 2, "{ex:?}");
    assert_eq!(p[0]["params"]["progressToken"], "tok-1");
    assert_eq!(p[0]["params"]["progress"], 0.0);
    assert_eq!(p[0]["params"]["message"], "mnemosyne/search: started");
    assert_eq!(p[1]["params"]["progress"], 1.0);
    assert_eq!(p[1]["params"]["total"], 1.0);
    assert_eq!(p[1]["params"]["message"], "mnemosyne/search: completed");
    let ex = c.call_raw("search", json!({"query": "pelican"}), None).await;
    assert!(ex.notifications("notifications/progress").is_empty());
    let ex = c.call_raw("search", json!({"query": " "}), Some("tok-2")).await;
    let p = ex.notifications("notifications/progress");
    assert_eq!(p.last().unwrap()["params"]["message"], "mnemosyne/search: failed");
}

#[tokio::test]
async fn get_health_reports_ok_as_in_the_pallas_spec() {
    let app = TestApp::spawn().await;
    let token = app.opaque_token(&[]).await;
    let mut c = app.mcp(&token).connect().await;
    let r = c.call("get_health", json!({})).await;
    assert_eq!(r["content"].as_array().unwrap().len(), 1);
    let v: Value = serde_json::from_str(r["content"][0]["text"].as_str().unwrap()).unwrap();
    assert_eq!(v["status"], "ok", "{v}");
    assert!(v["timestamp"].as_str().unwrap().ends_with('Z'));
    assert!(v.get("message").is_none());
}

#[tokio::test]
async fn get_health_reports_error_with_a_message_when_the_graph_is_down() {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let app = TestApp::spawn_with(|s| s.bolt_uri = format!("127.0.0.1:{port}")).await;
    let token = app.opaque_token(&[]).await;
    let mut c = app.mcp(&token).connect().await;
    let started = std::time::Instant::now();
    let r = c.call("get_health", json!({})).await;
    let v: Value = serde_json::from_str(r["content"][0]["text"].as_str().unwrap()).unwrap();
    assert_eq!(v["status"], "error", "{v}");
    assert!(v["message"].as_str().unwrap().contains("graph"));
    // bounded probe, not a timing assertion on the happy path
    assert!(started.elapsed() < std::time::Duration::from_secs(5));
}

#[tokio::test]
async fn stateless_2026_07_28_requests_are_served_without_a_session() {
    let app = TestApp::spawn().await;
    let s = seed(&app).await;
    let token = app.opaque_token(&[s.lib_a.clone()]).await;
    let mut c = app.mcp(&token).stateless();
    let ex = c.list_tools().await;
    assert_eq!(ex.status, StatusCode::OK, "{ex:?}");
    assert!(ex.headers.get("mcp-session-id").is_none());
    let out = c.call_ok("search", json!({"query": "pelican"})).await;
    assert_eq!(result_libs(&out), vec![s.lib_a.clone()]);
}

#[tokio::test]
async fn foreign_origin_is_403_and_own_origin_passes() {
    let app = TestApp::spawn().await;
    let token = app.opaque_token(&[]).await;
    let mut c = app.mcp(&token);
    let ex = c
        .post(
            json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {"protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "x", "version": "0"}}}),
            &[("Origin", "https://evil.example")],
        )
        .await;
    assert_eq!(ex.status, StatusCode::FORBIDDEN);
    let own = app.base.clone();
    let ex = c
        .post(
            json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {"protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "x", "version": "0"}}}),
            &[("Origin", own.as_str())],
        )
        .await;
    assert_eq!(ex.status, StatusCode::OK, "{ex:?}");
}

#[tokio::test]
async fn both_endpoint_spellings_serve_mcp() {
    let app = TestApp::spawn().await;
    let token = app.opaque_token(&[]).await;
    for path in ["/mcp", "/mcp/"] {
        let mut c = crate::helpers::McpClient::new(app.http.clone(), app.url(path), &token)
            .connect()
            .await;
        assert_eq!(c.list_tools().await.status, StatusCode::OK);
    }
}

#[tokio::test]
async fn malformed_json_rpc_is_a_protocol_error() {
    let app = TestApp::spawn().await;
    let token = app.opaque_token(&[]).await;
    let r = app
        .http
        .post(app.url("/mcp/"))
        .header("Authorization", format!("Bearer {token}"))
        .header("Accept", "application/json, text/event-stream")
        .header("Content-Type", "application/json")
        .body("{not json")
        .send()
        .await
        .unwrap();
    assert!(r.status().is_client_error(), "{}", r.status());
}

#[tokio::test]
async fn server_discover_advertises_this_server() {
    let app = TestApp::spawn().await;
    let token = app.opaque_token(&[]).await;
    let mut c = app.mcp(&token).stateless();
    let ex = c
        .post(
            json!({"jsonrpc": "2.0", "id": 7, "method": "server/discover", "params": {}}),
            &[],
        )
        .await;
    assert_eq!(ex.status, StatusCode::OK, "{ex:?}");
    let result = &ex.response()["result"];
    assert!(
        result["supportedVersions"]
            .as_array()
            .unwrap()
            .iter()
            .any(|v| v == "2026-07-28"),
        "{result}"
    );
    assert!(result["capabilities"]["tools"].is_object(), "{result}");
    let info = &result["_meta"]["io.modelcontextprotocol/serverInfo"];
    assert_eq!(info["name"], "mnemosyne", "{result}");
    assert_eq!(info["version"], env!("CARGO_PKG_VERSION"));
}

/// The staff admin search (spec §3.3) reads every library, named explicitly;
/// a principal's view reads only its own.
#[tokio::test]
async fn admin_search_over_every_library_and_a_principals_view() {
    let app = TestApp::spawn().await;
    let s = seed(&app).await;
    // What the console's search reads: every library, named explicitly.
    let uids = app.state.admin.library_list().await.unwrap().into_iter().map(|l| l.uid);
    let every = app.state.knowledge.scoped(&mnemosyne::auth::Scope::for_tests(uids));
    for lib in [&s.lib_a, &s.lib_b, &s.lib_c] {
        assert!(every.scope().contains(lib), "{lib}");
    }
    let mut libs: Vec<String> = app
        .state
        .search
        .run(&every, &mnemosyne::search::engine::Search::keyword("zanzibarine", 50))
        .await
        .unwrap()
        .into_iter()
        .map(|h| h.library_uid)
        .filter(|l| [&s.lib_a, &s.lib_b, &s.lib_c].contains(&l))
        .collect();
    libs.sort();
    libs.dedup();
    let mut want = vec![s.lib_a.clone(), s.lib_b.clone(), s.lib_c.clone()];
    want.sort();
    assert_eq!(libs, want);

    let principal = mnemosyne::auth::Principal::for_tests([s.lib_b.clone()]);
    let mine = app.state.knowledge.scoped(&principal);
    let hits = app
        .state
        .search
        .run(&mine, &mnemosyne::search::engine::Search::keyword("zanzibarine", 50))
        .await
        .unwrap();
    assert!(!hits.is_empty() && hits.iter().all(|h| h.library_uid == s.lib_b));
    assert!(mine.library(&s.lib_a).await.unwrap().is_none(), "outside the scope");
    assert!(mine.library(&s.lib_b).await.unwrap().is_some());
}
