//! Ingest of items: create, replace, no-op, delete, validation, library ownership.

use super::*;

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
        app.state.admin.workspace_libraries(&ws).await.unwrap().is_empty(),
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
    assert!(app.state.admin.workspace_libraries(&ws).await.unwrap().is_empty());
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
    assert_eq!(app.state.admin.find_item(&item).await.unwrap().unwrap().library_uid, a);
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
    app.state.admin.delete_libraries(&[squat]).await.unwrap();
}

async fn updated_at(app: &TestApp, uid: &str) -> String {
    graph_rows(
        app,
        "MATCH (i:Item {uid: $uid}) RETURN i.updated_at AS u",
        &[("uid", uid)],
    )
    .await[0]
        .get::<String>("u")
        .unwrap()
}

#[tokio::test]
async fn unchanged_reingest_writes_nothing_and_keeps_updated_at() {
    let app = TestApp::spawn().await;
    let ws = app.uid("ws");
    let uid = app.uid("doc");
    let body = json!({"workspace_id": ws, "item": {"title": "Doc", "uid": uid, "source_uri": "file:///doc.md",
                      "mime_type": "text/markdown"}, "content": "The tapir naps at noon."});
    app.ingest(body.clone()).await;
    let before = updated_at(&app, &uid).await;
    // Timestamps have millisecond resolution: make sure a rewrite would show.
    tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    for _ in 0..2 {
        let (status, out) = post_ingest(&app, body.clone()).await;
        assert_eq!(status, StatusCode::OK, "{out}");
        assert_eq!(out["status"], "unchanged");
        assert_eq!(out["chunk_count"], 1);
    }
    assert_eq!(
        updated_at(&app, &uid).await,
        before,
        "an unchanged re-ingest wrote the item"
    );
    // A changed title is written (and is the only thing that moves).
    let mut retitled = body.clone();
    retitled["item"]["title"] = json!("Doc, renamed");
    let (status, out) = post_ingest(&app, retitled).await;
    assert_eq!(status, StatusCode::OK, "{out}");
    assert_eq!(
        app.state.admin.find_item(&uid).await.unwrap().unwrap().title,
        "Doc, renamed"
    );
}
