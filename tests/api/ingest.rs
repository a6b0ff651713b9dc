//! Ingest and workspace lifecycle (DESIGN §6), memberships and opaque tokens.

use reqwest::{Method, StatusCode};
use serde_json::{json, Value};

use crate::helpers::{send, TestApp};

#[tokio::test]
async fn ingest_then_search_finds_the_text_through_mcp() {
    let app = TestApp::spawn().await;
    let ws = app.uid("ws");
    let out = app
        .ingest(json!({"workspace_id": ws, "item": {"title": "Notes", "source_uri": "file:///notes.md", "mime_type": "text/markdown"},
                       "content": "# Notes\n\nThe axolotl regenerates limbs."}))
        .await;
    assert_eq!(out["status"], "created");
    assert_eq!(out["chunk_count"], 1);
    let lib = out["library_uid"].as_str().unwrap().to_owned();
    let token = app.opaque_token(&[lib.clone()]).await;
    let mut c = app.mcp(&token).connect().await;
    let hits = c.call_ok("search", json!({"query": "axolotl"})).await;
    assert_eq!(hits["results"][0]["item_uid"], out["item_uid"]);
    assert_eq!(hits["results"][0]["collection_uid"], out["collection_uid"]);
    assert_eq!(hits["results"][0]["item_title"], "Notes");
    let cols = c.call_ok("list_collections", json!({"library_uid": lib})).await;
    assert_eq!(cols["collections"][0]["name"], "Files");
    let items = c
        .call_ok("list_items", json!({"collection_uid": out["collection_uid"]}))
        .await;
    assert_eq!(items["items"][0]["source_uri"], "file:///notes.md");
    assert_eq!(items["items"][0]["mime_type"], "text/markdown");
}

#[tokio::test]
async fn reingest_replaces_the_chunks_and_unchanged_content_is_a_no_op() {
    let app = TestApp::spawn().await;
    let ws = app.uid("ws");
    let body = |content: &str| json!({"workspace_id": ws, "item": {"title": "Doc", "uid": app.uid("doc")}, "content": content});
    let first = app.ingest(body("The quetzal sings at dawn.")).await;
    let lib = first["library_uid"].as_str().unwrap().to_owned();
    let (status, same) = send(
        app.service(Method::POST, "/library/api/ingest/")
            .json(&body("The quetzal sings at dawn.")),
    )
    .await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(same["status"], "unchanged");
    let (status, replaced) = send(
        app.service(Method::POST, "/library/api/ingest/")
            .json(&body("The narwhal dives at dusk.")),
    )
    .await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(replaced["status"], "replaced");
    assert_eq!(replaced["item_uid"], first["item_uid"]);
    let token = app.opaque_token(&[lib]).await;
    let mut c = app.mcp(&token).connect().await;
    assert_eq!(
        c.call_ok("search", json!({"query": "quetzal"})).await["results"],
        json!([]),
        "old text gone"
    );
    assert_eq!(
        c.call_ok("search", json!({"query": "narwhal"})).await["results"]
            .as_array()
            .unwrap()
            .len(),
        1
    );
}

#[tokio::test]
async fn item_delete_removes_it_and_its_chunks() {
    let app = TestApp::spawn().await;
    let out = app.ingest_ws(&app.uid("ws"), "Doc", "The pangolin curls up.").await;
    let item = out["item_uid"].as_str().unwrap();
    let r = app
        .service(Method::DELETE, &format!("/library/api/items/{item}/"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::NO_CONTENT);
    let r = app
        .service(Method::DELETE, &format!("/library/api/items/{item}/"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::NOT_FOUND);
    let token = app
        .opaque_token(&[out["library_uid"].as_str().unwrap().to_owned()])
        .await;
    let mut c = app.mcp(&token).connect().await;
    assert_eq!(
        c.call_ok("search", json!({"query": "pangolin"})).await["results"],
        json!([])
    );
}

#[tokio::test]
async fn workspace_get_shows_its_library_and_counts() {
    let app = TestApp::spawn().await;
    let ws = app.uid("ws");
    app.ingest_ws(&ws, "One", "first document").await;
    let two = app.ingest_ws(&ws, "Two", "second document").await;
    let (status, body) = send(app.service(Method::GET, &format!("/library/api/workspaces/{ws}/"))).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(body["library_uid"], two["library_uid"]);
    assert_eq!(body["item_count"], 2);
    assert_eq!(body["collection_count"], 1);
    assert_eq!(body["chunk_count"], 2);
    let (status, _) = send(app.service(Method::GET, "/library/api/workspaces/nope-nothing/")).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
}

#[tokio::test]
async fn workspace_delete_cascades_and_an_attached_team_loses_it_on_the_next_request() {
    let app = TestApp::spawn().await;
    let other = app.second_instance().await;
    let ws = app.uid("ws");
    let keep = app.uid("keep");
    let out = app.ingest_ws(&ws, "Doc", "The okapi hides.").await;
    let kept = app.ingest_ws(&keep, "Doc", "The okapi hides too.").await;
    let (id, jwt) = app.create_team("Kottos").await;
    app.put_workspaces(id, &[ws.clone(), keep.clone()]).await;
    let mut c = other.mcp(&jwt).connect().await;
    assert_eq!(c.library_uids().await.len(), 2);
    let r = app
        .service(Method::DELETE, &format!("/library/api/workspaces/{ws}/"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::NO_CONTENT);
    assert_eq!(
        c.library_uids().await,
        vec![kept["library_uid"].as_str().unwrap().to_owned()]
    );
    // nothing of it is left in the graph
    let lib = out["library_uid"].as_str().unwrap();
    let g = &app.state.graph;
    assert!(g.find_library(lib).await.unwrap().is_none());
    assert!(g.find_item(out["item_uid"].as_str().unwrap()).await.unwrap().is_none());
    let token = app.opaque_token(&[lib.to_owned()]).await;
    let mut c = app.mcp(&token).connect().await;
    assert_eq!(
        c.call_ok("search", json!({"query": "okapi"})).await["results"],
        json!([])
    );
}

#[tokio::test]
async fn library_create_and_ingest_into_it() {
    let app = TestApp::spawn().await;
    let (status, body) = send(
        app.service(Method::POST, "/library/api/libraries/")
            .json(&json!({"name": "Handbook"})),
    )
    .await;
    assert_eq!(status, StatusCode::CREATED);
    let uid = body["uid"].as_str().unwrap().to_owned();
    assert!(uid.starts_with("lib_"));
    let lib = app.library("mine").await;
    let (status, _) = send(
        app.service(Method::POST, "/library/api/libraries/")
            .json(&json!({"uid": lib, "name": "dup"})),
    )
    .await;
    assert_eq!(status, StatusCode::CONFLICT);
    let out = app
        .ingest(json!({"library_uid": lib, "item": {"title": "T"}, "content": "text"}))
        .await;
    assert_eq!(out["library_uid"], lib);
    let (status, body) = send(
        app.service(Method::POST, "/library/api/ingest/")
            .json(&json!({"library_uid": app.uid("missing"), "item": {"title": "T"}, "content": "x"})),
    )
    .await;
    assert_eq!(status, StatusCode::NOT_FOUND, "{body}");
}

#[tokio::test]
async fn bad_ingest_input_is_400_naming_the_field_and_changes_nothing() {
    let app = TestApp::spawn().await;
    let ws = app.uid("ws");
    let cases: Vec<(Value, &str)> = vec![
        (json!({"item": {"title": "T"}, "content": "x"}), "workspace_id"),
        (
            json!({"workspace_id": ws, "library_uid": "l", "item": {"title": "T"}, "content": "x"}),
            "library_uid",
        ),
        (
            json!({"workspace_id": ws, "item": {"title": ""}, "content": "x"}),
            "item.title",
        ),
        (
            json!({"workspace_id": ws, "item": {"title": "T", "uid": "bad uid"}, "content": "x"}),
            "item.uid",
        ),
        (json!({"workspace_id": ws, "item": {"title": "T"}}), "content"),
        (
            json!({"workspace_id": ws, "item": {"title": "T"}, "content": 5}),
            "content",
        ),
        (
            json!({"workspace_id": ws, "item": {"title": "T"}, "content": "x", "extra": 1}),
            "extra",
        ),
        (
            json!({"workspace_id": "x".repeat(65), "item": {"title": "T"}, "content": "x"}),
            "workspace_id",
        ),
        (
            json!({"workspace_id": ws, "collection": "", "item": {"title": "T"}, "content": "x"}),
            "collection",
        ),
    ];
    for (body, field) in cases {
        let (status, out) = send(app.service(Method::POST, "/library/api/ingest/").json(&body)).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{body}: {out}");
        assert_eq!(out["field"], field, "{body}: {out}");
    }
    // invalid UTF-8 and invalid JSON
    for raw in [b"{\"workspace_id\": \"\xff\xfe\"}".to_vec(), b"{not json".to_vec()] {
        let (status, out) = send(
            app.service(Method::POST, "/library/api/ingest/")
                .header("content-type", "application/json")
                .body(raw),
        )
        .await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{out}");
        assert_eq!(out["error"], "bad_request");
    }
    assert!(
        app.state.graph.workspace_libraries(&ws).await.unwrap().is_empty(),
        "nothing was written"
    );
}

#[tokio::test]
async fn oversized_ingest_is_413_and_changes_nothing() {
    let app = TestApp::spawn_with(|s| s.body_limit_bytes = 2048).await;
    let ws = app.uid("ws");
    let body = json!({"workspace_id": ws, "item": {"title": "Big"}, "content": "word ".repeat(2000)});
    let (status, out) = send(app.service(Method::POST, "/library/api/ingest/").json(&body)).await;
    assert_eq!(status, StatusCode::PAYLOAD_TOO_LARGE, "{out}");
    assert!(app.state.graph.workspace_libraries(&ws).await.unwrap().is_empty());
}

#[tokio::test]
async fn ingest_requires_the_service_account() {
    let app = TestApp::spawn().await;
    let r = app
        .http
        .post(app.url("/library/api/ingest/"))
        .json(&json!({"workspace_id": "w", "item": {"title": "T"}, "content": "x"}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::UNAUTHORIZED);
}

fn cli(app: &TestApp, args: &[&str]) -> (bool, String, String) {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_mnemosyne"))
        .args(args)
        .env("MNEMOSYNE_DATABASE_URL", &app.settings.database_url)
        .output()
        .unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[tokio::test]
async fn token_create_needs_owner_or_manager_and_reader_is_refused() {
    let app = TestApp::spawn().await;
    let (a, b, c) = (app.uid("a"), app.uid("b"), app.uid("c"));
    assert!(cli(&app, &["user", "create", "bob"]).0);
    assert!(cli(&app, &["membership", "grant", "bob", &a, "owner"]).0);
    assert!(cli(&app, &["membership", "grant", "bob", &b, "manager"]).0);
    assert!(cli(&app, &["membership", "grant", "bob", &c, "reader"]).0);
    let (ok, out, _) = cli(
        &app,
        &[
            "token",
            "create",
            "--user",
            "bob",
            "--library",
            &a,
            "--library",
            &b,
            "--name",
            "laptop",
        ],
    );
    assert!(ok);
    let plaintext = out.lines().last().unwrap().trim().to_owned();
    assert!(plaintext.starts_with("mnm_"));
    let (ok, _, err) = cli(
        &app,
        &["token", "create", "--user", "bob", "--library", &a, "--library", &c],
    );
    assert!(!ok);
    assert!(err.contains(&c) && err.contains("not owner or manager"), "{err}");
    assert!(!err.contains(&format!("{a},")), "{err}");
    // list shows the token but never its hash or plaintext
    let (ok, list, _) = cli(&app, &["token", "list"]);
    assert!(ok);
    assert!(list.contains("laptop") && list.contains(&format!("{a},{b}")));
    assert!(!list.contains(&plaintext) && !list.contains(&mnemosyne::auth::resolver::token_hash(&plaintext)));
    // membership list and revoke
    let (_, m, _) = cli(&app, &["membership", "list", "--user", "bob"]);
    assert_eq!(m.lines().count(), 4, "{m}");
    assert!(cli(&app, &["membership", "revoke", "bob", &c, "reader"]).0);
    assert!(!cli(&app, &["membership", "revoke", "bob", &c, "reader"]).0);
    // revoke the token: refused on the next request
    let id = list
        .lines()
        .nth(1)
        .unwrap()
        .split_whitespace()
        .next()
        .unwrap()
        .to_owned();
    assert_eq!(app.mcp(&plaintext).initialize().await.status, StatusCode::OK);
    assert!(cli(&app, &["token", "revoke", &id]).0);
    tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    assert_eq!(app.mcp(&plaintext).initialize().await.status, StatusCode::UNAUTHORIZED);
}

#[tokio::test]
async fn user_disable_via_cli_refuses_their_tokens() {
    let app = TestApp::spawn().await;
    let lib = app.uid("l");
    cli(&app, &["user", "create", "carol"]);
    cli(&app, &["membership", "grant", "carol", &lib, "owner"]);
    let (_, out, _) = cli(&app, &["token", "create", "--user", "carol", "--library", &lib]);
    let plaintext = out.lines().last().unwrap().trim().to_owned();
    assert_eq!(app.mcp(&plaintext).initialize().await.status, StatusCode::OK);
    assert!(cli(&app, &["user", "disable", "carol"]).0);
    tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    let ex = app.mcp(&plaintext).initialize().await;
    assert_eq!(ex.json()["error_description"], "User account is disabled.");
    let (ok, _, err) = cli(&app, &["user", "disable", "nobody"]);
    assert!(!ok && err.contains("no such user"));
}

#[tokio::test]
async fn an_item_uid_never_moves_between_libraries() {
    let app = TestApp::spawn().await;
    let a = app.library("a").await;
    let b = app.library("b").await;
    let item = app.uid("shared_item");
    app.ingest(json!({"library_uid": a, "item": {"title": "T", "uid": item}, "content": "in library a"}))
        .await;
    let (status, body) = send(
        app.service(Method::POST, "/library/api/ingest/")
            .json(&json!({"library_uid": b, "item": {"title": "T", "uid": item}, "content": "in library b"})),
    )
    .await;
    assert_eq!(status, StatusCode::CONFLICT, "{body}");
    assert_eq!(app.state.graph.find_item(&item).await.unwrap().unwrap().library_uid, a);
}

#[tokio::test]
async fn a_workspace_never_ingests_into_a_library_it_does_not_own() {
    let app = TestApp::spawn().await;
    let ws = app.uid("ws");
    // a user-managed library squatting on the uid the workspace would derive
    let squat = mnemosyne::store::graph::ingest::derived_uid("lib", &["workspace", &ws]);
    let (status, _) = send(
        app.service(Method::POST, "/library/api/libraries/")
            .json(&json!({"uid": squat, "name": "squat"})),
    )
    .await;
    assert_eq!(status, StatusCode::CREATED);
    let (status, body) = send(
        app.service(Method::POST, "/library/api/ingest/")
            .json(&json!({"workspace_id": ws, "item": {"title": "T"}, "content": "private words"})),
    )
    .await;
    assert_eq!(status, StatusCode::CONFLICT, "{body}");
    app.state.graph.delete_libraries(&[squat]).await.unwrap();
}
