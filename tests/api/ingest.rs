//! Ingest and workspace lifecycle (DESIGN §6), memberships and opaque tokens.

use reqwest::{Method, StatusCode};
use serde_json::{json, Value};

use mnemosyne::store::graph::GraphStore;

use crate::helpers::{base_settings, send, TestApp};

/// Store timeout of the concurrency tests: they assert that conflicts are
/// retried and nothing is lost, not how fast 64 writers finish on 2 shared
/// cores (a fresh Neo4j in CI once needed more than the usual 10 s).
const UNDER_LOAD_TIMEOUT_MS: u64 = 30_000;

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
    assert!(g.admin().find_library(lib).await.unwrap().is_none());
    assert!(g
        .admin()
        .find_item(out["item_uid"].as_str().unwrap())
        .await
        .unwrap()
        .is_none());
    let token = app.opaque_token(&[lib.to_owned()]).await;
    let mut c = app.mcp(&token).connect().await;
    assert_eq!(
        c.call_ok("search", json!({"query": "okapi"})).await["results"],
        json!([])
    );
}

/// Issue 19, "workspace W deleted, later re-ingested": the deterministic
/// library uid comes back, but no membership and no token scope does.
#[tokio::test]
async fn a_deleted_workspace_takes_its_grants_with_it() {
    use mnemosyne::store::pg::users::{self, Role};
    let app = TestApp::spawn().await;
    let other = app.second_instance().await;
    let ws = app.uid("ws");
    let first = app.ingest_ws(&ws, "Doc", "The okapi hides in the forest.").await;
    let lib = first["library_uid"].as_str().unwrap().to_owned();
    let (a, b) = (app.library("a").await, app.library("b").await);
    let owner = app.uid("owner");
    users::create(&app.pg, &owner, None, false).await.unwrap().unwrap();
    for l in [&lib, &a, &b] {
        users::grant(&app.pg, &owner, l, Role::Owner).await.unwrap();
    }
    use mnemosyne::service::tokens::mint;
    let t = mint(&app.pg, &owner, "t", &[lib.clone()], None)
        .await
        .unwrap()
        .plaintext;
    let t_many = mint(&app.pg, &owner, "t", &[a.clone(), lib.clone(), b.clone()], None)
        .await
        .unwrap();
    // T reads W on the other replica (its token row is cached there).
    let mut c = other.mcp(&t).connect().await;
    assert_eq!(c.library_uids().await, vec![lib.clone()]);
    let hits = c.call_ok("search", json!({"query": "okapi"})).await;
    assert_eq!(hits["results"].as_array().unwrap().len(), 1);

    let delete = || async {
        app.service(Method::DELETE, &format!("/library/api/workspaces/{ws}/"))
            .send()
            .await
            .unwrap()
            .status()
    };
    assert_eq!(delete().await, StatusCode::NO_CONTENT);
    let members_of = |l: String| {
        let pg = app.pg.clone();
        async move { users::memberships(&pg, None, Some(&l)).await.unwrap().len() }
    };
    assert_eq!(members_of(lib.clone()).await, 0);
    assert_eq!(members_of(a.clone()).await, 1);
    let scope: sqlx::types::Json<Vec<String>> =
        sqlx::query_scalar("SELECT allowed_libraries FROM mcp_tokens WHERE id = $1")
            .bind(t_many.id)
            .fetch_one(&app.pg)
            .await
            .unwrap();
    assert_eq!(scope.0, vec![a.clone(), b.clone()], "the rest keep their order");
    let audit: Vec<(String, String, String, Value)> = sqlx::query_as(
        "SELECT actor::text, action::text, target::text, detail FROM audit_events
          WHERE action = 'workspace_deleted' ORDER BY id",
    )
    .fetch_all(&app.pg)
    .await
    .unwrap();
    assert_eq!(audit.len(), 1, "{audit:?}");
    let (actor, _, target, detail) = &audit[0];
    assert_eq!(
        (actor.as_str(), target.as_str()),
        (crate::helpers::SERVICE_USER, ws.as_str())
    );
    assert_eq!(detail["workspace_id"], json!(ws));
    assert_eq!(detail["libraries"], json!([lib]));
    assert_eq!(detail["memberships_removed"], json!(1));
    assert_eq!(detail["tokens_changed"], json!(2));
    assert!(!detail.to_string().contains(&t), "no secret in the audit");

    // A retry finds nothing in the graph and still clears the grants (as after
    // a cleanup that failed once the content was gone).
    users::grant(&app.pg, &owner, &lib, Role::Reader).await.unwrap();
    assert_eq!(delete().await, StatusCode::NO_CONTENT);
    assert_eq!(members_of(lib.clone()).await, 0);
    // Nothing left to change: no further audit event.
    assert_eq!(delete().await, StatusCode::NO_CONTENT);
    let actions: i64 = sqlx::query_scalar("SELECT count(*) FROM audit_events WHERE action = 'workspace_deleted'")
        .fetch_one(&app.pg)
        .await
        .unwrap();
    assert_eq!(actions, 2);

    // W again: the same uid, none of the old grants.
    let again = app.ingest_ws(&ws, "Doc", "The okapi is back in the forest.").await;
    assert_eq!(again["library_uid"], json!(lib));
    assert_eq!(members_of(lib.clone()).await, 0);
    for replica in [&other, &app] {
        let mut c = replica.mcp(&t).connect().await;
        assert_eq!(c.library_uids().await, Vec::<String>::new());
        assert_eq!(
            c.call_ok("search", json!({"query": "okapi"})).await["results"],
            json!([])
        );
    }
    // The session opened before the delete reads nothing either.
    assert_eq!(c.library_uids().await, Vec::<String>::new());
    assert_eq!(
        c.call_ok("search", json!({"query": "okapi"})).await["results"],
        json!([])
    );
    // Even a membership granted again does not bring back the old token's scope.
    users::grant(&app.pg, &owner, &lib, Role::Owner).await.unwrap();
    assert_eq!(c.library_uids().await, Vec::<String>::new());
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
        app.state
            .graph
            .admin()
            .workspace_libraries(&ws)
            .await
            .unwrap()
            .is_empty(),
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
    assert!(app
        .state
        .graph
        .admin()
        .workspace_libraries(&ws)
        .await
        .unwrap()
        .is_empty());
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
    assert_eq!(
        app.state
            .graph
            .admin()
            .find_item(&item)
            .await
            .unwrap()
            .unwrap()
            .library_uid,
        a
    );
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
    app.state.graph.admin().delete_libraries(&[squat]).await.unwrap();
}

// ---- concurrency, no-ops, delete races and outages (issue 10) ----

/// Runs a Cypher read against the real graph (test inspection only).
async fn graph_rows(app: &TestApp, cypher: &str, params: &[(&str, &str)]) -> Vec<neo4rs::Row> {
    rows_of(&app.state.graph, cypher, params).await
}

async fn rows_of(g: &GraphStore, cypher: &str, params: &[(&str, &str)]) -> Vec<neo4rs::Row> {
    let mut q = neo4rs::query(cypher);
    for (k, v) in params {
        q = q.param(k, *v);
    }
    g.rows("test inspection", q).await.expect("graph inspection query")
}

async fn graph_count(app: &TestApp, cypher: &str, params: &[(&str, &str)]) -> i64 {
    graph_rows(app, cypher, params).await[0].get::<i64>("n").unwrap()
}

/// Chunk texts of an item, in ordinal order.
async fn chunk_texts(app: &TestApp, item: &str) -> Vec<String> {
    chunk_texts_in(&app.state.graph, item).await
}

async fn chunk_texts_in(g: &GraphStore, item: &str) -> Vec<String> {
    rows_of(
        g,
        "MATCH (c:Chunk {item_uid: $item}) RETURN c.text AS text, c.ordinal AS ordinal ORDER BY ordinal",
        &[("item", item)],
    )
    .await
    .iter()
    .map(|r| r.get::<String>("text").unwrap())
    .collect()
}

/// A document of `paragraphs` paragraphs of roughly 800 characters, every word
/// unique to (`tag`, `seed`) so chunks of different requests never coincide.
fn document(tag: &str, seed: usize, paragraphs: usize) -> String {
    (0..paragraphs)
        .map(|p| {
            (0..100)
                .map(|w| format!("{tag}{seed}x{p}w{w}"))
                .collect::<Vec<_>>()
                .join(" ")
        })
        .collect::<Vec<_>>()
        .join("\n\n")
}

/// One authenticated request first, so the Basic credentials are verified
/// (argon2) once and not 64 times at the same moment.
async fn warm_service_account(app: &TestApp) {
    let (status, _) = send(app.service(Method::GET, "/library/api/workspaces/warm-up-nothing/")).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
}

async fn post_ingest(app: &TestApp, body: Value) -> (StatusCode, Value) {
    send(app.service(Method::POST, "/library/api/ingest/").json(&body)).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sixty_four_concurrent_first_ingests_into_one_new_workspace_all_succeed() {
    let app = TestApp::spawn_with(|s| s.store_timeout_ms = UNDER_LOAD_TIMEOUT_MS).await;
    warm_service_account(&app).await;
    let ws = app.uid("ws");
    let results = futures::future::join_all((0..64).map(|i| {
        post_ingest(
            &app,
            json!({"workspace_id": ws, "item": {"title": format!("Doc {i}"), "uid": app.uid(&format!("doc{i}"))},
                   "content": document("first", i, 2)}),
        )
    }))
    .await;
    for (status, body) in &results {
        assert!(status.is_success(), "{status} {body}");
    }
    let libs = app.state.graph.admin().workspace_libraries(&ws).await.unwrap();
    assert_eq!(libs.len(), 1, "one Library per workspace");
    assert_eq!(libs[0].item_count, 64);
    assert_eq!(libs[0].collection_count, 1);
    assert!(results.iter().all(|(_, b)| b["library_uid"] == libs[0].uid.as_str()));
    let expected: i64 = results.iter().map(|(_, b)| b["chunk_count"].as_i64().unwrap()).sum();
    assert_eq!(libs[0].chunk_count, expected);
    let items = graph_count(
        &app,
        "MATCH (i:Item) WHERE i.library_uid = $lib RETURN count(i) AS n",
        &[("lib", &libs[0].uid)],
    )
    .await;
    assert_eq!(items, 64, "one Item per item uid");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_reingests_leave_each_item_with_the_chunks_of_one_request() {
    let app = TestApp::spawn_with(|s| s.store_timeout_ms = UNDER_LOAD_TIMEOUT_MS).await;
    warm_service_account(&app).await;
    let ws = app.uid("ws");
    // 64 requests over 8 item uids, every request with its own content and size.
    let requests: Vec<(String, String)> = (0..64)
        .map(|r| (app.uid(&format!("item{}", r % 8)), document("re", r, 1 + r % 4)))
        .collect();
    let results = futures::future::join_all(requests.iter().map(|(uid, content)| {
        post_ingest(
            &app,
            json!({"workspace_id": ws, "item": {"title": "Shared", "uid": uid}, "content": content}),
        )
    }))
    .await;
    for (status, body) in &results {
        assert!(status.is_success(), "{status} {body}");
    }
    let libs = app.state.graph.admin().workspace_libraries(&ws).await.unwrap();
    assert_eq!(libs.len(), 1);
    assert_eq!(libs[0].item_count, 8);
    let max = app.settings.chunk_max_chars;
    let mut total = 0;
    for k in 0..8 {
        let uid = app.uid(&format!("item{k}"));
        let stored = chunk_texts(&app, &uid).await;
        let candidates: Vec<Vec<String>> = requests
            .iter()
            .filter(|(u, _)| *u == uid)
            .map(|(_, c)| mnemosyne::service::ingest::split(c, max))
            .collect();
        assert!(
            candidates.contains(&stored),
            "item {uid}: its {} chunks are not exactly those of one request",
            stored.len()
        );
        let item = app.state.graph.admin().find_item(&uid).await.unwrap().unwrap();
        assert_eq!(item.chunk_count, stored.len() as i64);
        total += stored.len() as i64;
    }
    assert_eq!(libs[0].chunk_count, total, "no chunk left over from a lost request");
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
        app.state.graph.admin().find_item(&uid).await.unwrap().unwrap().title,
        "Doc, renamed"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ingests_racing_a_workspace_delete_leave_no_orphans() {
    let app = TestApp::spawn_with(|s| s.store_timeout_ms = UNDER_LOAD_TIMEOUT_MS).await;
    warm_service_account(&app).await;
    let ws = app.uid("ws");
    let lib = mnemosyne::store::graph::ingest::derived_uid("lib", &["workspace", &ws]);
    for round in 0..3 {
        // Before the delete: "aardvark" documents.
        let before = futures::future::join_all((0..8).map(|i| {
            post_ingest(
                &app,
                json!({"workspace_id": ws, "item": {"title": format!("Before {i}"), "uid": app.uid(&format!("b{round}_{i}"))},
                       "content": format!("aardvark {}", document("before", i, 2))}),
            )
        }))
        .await;
        assert!(before.iter().all(|(s, _)| s.is_success()), "{before:?}");
        // During the delete: racing ingests, some of them re-ingesting the items above.
        let racing = futures::future::join_all((0..24).map(|i| {
            let uid = if i % 3 == 0 {
                app.uid(&format!("b{round}_{}", i % 8))
            } else {
                app.uid(&format!("r{round}_{i}"))
            };
            let body = json!({"workspace_id": ws, "item": {"title": format!("Racing {i}"), "uid": uid},
                              "content": format!("racing {}", document("racing", i, 1 + i % 3))});
            let app = &app;
            async move {
                // Round 0: all at once with the delete; then spread over it,
                // so some land before, some during and some after it.
                tokio::time::sleep(std::time::Duration::from_millis((round * 10 * i) as u64)).await;
                post_ingest(app, body).await
            }
        }));
        let delete = async {
            tokio::time::sleep(std::time::Duration::from_millis(5 * round as u64)).await;
            send(app.service(Method::DELETE, &format!("/library/api/workspaces/{ws}/"))).await
        };
        let (racing, (del_status, del_body)) = tokio::join!(racing, delete);
        assert_eq!(del_status, StatusCode::NO_CONTENT, "{del_body}");
        for (status, body) in &racing {
            assert!(
                status.is_success() || *status == StatusCode::CONFLICT,
                "a racing ingest must land or fail clearly: {status} {body}"
            );
        }
        // Invariants: nothing under a library that is gone, nothing half-written.
        let library_exists = app.state.graph.admin().find_library(&lib).await.unwrap().is_some();
        let chunks = graph_count(
            &app,
            "MATCH (c:Chunk) WHERE c.library_uid = $lib RETURN count(c) AS n",
            &[("lib", &lib)],
        )
        .await;
        let items = graph_count(
            &app,
            "MATCH (i:Item) WHERE i.library_uid = $lib RETURN count(i) AS n",
            &[("lib", &lib)],
        )
        .await;
        if !library_exists {
            assert_eq!(
                (chunks, items),
                (0, 0),
                "round {round}: orphans under the deleted library"
            );
        }
        let rows = graph_rows(
            &app,
            "MATCH (i:Item) WHERE i.library_uid = $lib RETURN i.uid AS uid, i.chunk_count AS n",
            &[("lib", &lib)],
        )
        .await;
        for r in &rows {
            let uid: String = r.get("uid").unwrap();
            let n: i64 = r.get("n").unwrap();
            let texts = chunk_texts(&app, &uid).await;
            assert_eq!(texts.len() as i64, n, "round {round}: item {uid} is half-written");
            assert!(
                texts[0].starts_with("racing"),
                "round {round}: item {uid} survived the delete"
            );
        }
        let stray = graph_count(
            &app,
            "MATCH (c:Chunk) WHERE c.library_uid = $lib AND NOT (c)-[:OF_ITEM]->(:Item) RETURN count(c) AS n",
            &[("lib", &lib)],
        )
        .await;
        assert_eq!(stray, 0, "round {round}: chunks without their item");
        let sum: i64 = rows.iter().map(|r| r.get::<i64>("n").unwrap()).sum();
        assert_eq!(chunks, sum, "round {round}: chunks not accounted for by an item");
    }
    // After the last delete: a fresh ingest, and a team that attaches the
    // workspace sees only what was ingested after the delete.
    send(app.service(Method::DELETE, &format!("/library/api/workspaces/{ws}/"))).await;
    app.ingest(json!({"workspace_id": ws, "item": {"title": "After"}, "content": "The zebrafish glows."}))
        .await;
    let (id, jwt) = app.create_team("Racers").await;
    app.put_workspaces(id, &[ws.clone()]).await;
    let mut c = app.mcp(&jwt).connect().await;
    assert_eq!(c.library_uids().await, vec![lib.clone()]);
    let hits = c.call_ok("search", json!({"query": "zebrafish"})).await;
    assert_eq!(hits["results"].as_array().unwrap().len(), 1);
    for gone in ["aardvark", "racing"] {
        assert_eq!(
            c.call_ok("search", json!({"query": gone})).await["results"],
            json!([]),
            "{gone}: a chunk from before the delete was inherited"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_item_delete_racing_its_reingest_leaves_it_whole_or_gone() {
    let app = TestApp::spawn_with(|s| s.store_timeout_ms = UNDER_LOAD_TIMEOUT_MS).await;
    warm_service_account(&app).await;
    let ws = app.uid("ws");
    let uid = app.uid("doc");
    for round in 0..4 {
        app.ingest(
            json!({"workspace_id": ws, "item": {"title": "Doc", "uid": uid}, "content": document("old", round, 3)}),
        )
        .await;
        let reingest = post_ingest(
            &app,
            json!({"workspace_id": ws, "item": {"title": "Doc", "uid": uid}, "content": document("new", round, 2)}),
        );
        let delete = send(app.service(Method::DELETE, &format!("/library/api/items/{uid}/")));
        let ((s1, b1), (s2, b2)) = tokio::join!(reingest, delete);
        assert!(s1.is_success(), "{s1} {b1}");
        assert!(s2 == StatusCode::NO_CONTENT || s2 == StatusCode::NOT_FOUND, "{s2} {b2}");
        let texts = chunk_texts(&app, &uid).await;
        match app.state.graph.admin().find_item(&uid).await.unwrap() {
            Some(item) => assert_eq!(item.chunk_count, texts.len() as i64),
            None => assert!(texts.is_empty(), "round {round}: chunks of a deleted item"),
        }
    }
}

/// A TCP proxy in front of the real Bolt port that can be cut: after `cut`,
/// it forwards at most `budget` more bytes from the client, then closes every
/// connection and refuses new ones.
struct CuttableProxy {
    port: u16,
    cut: std::sync::Arc<std::sync::atomic::AtomicI64>,
}

impl CuttableProxy {
    async fn start(target: String) -> CuttableProxy {
        use std::sync::atomic::{AtomicI64, Ordering};
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        // i64::MAX = not cut; otherwise the bytes still allowed through.
        let cut = std::sync::Arc::new(AtomicI64::new(i64::MAX));
        let budget = cut.clone();
        tokio::spawn(async move {
            loop {
                let Ok((client, _)) = listener.accept().await else {
                    return;
                };
                if budget.load(Ordering::SeqCst) <= 0 {
                    return; // drops the listener: connection refused from now on
                }
                let Ok(server) = tokio::net::TcpStream::connect(&target).await else {
                    continue;
                };
                let budget = budget.clone();
                tokio::spawn(async move {
                    let (mut cr, mut cw) = client.into_split();
                    let (mut sr, mut sw) = server.into_split();
                    let up = async {
                        let mut buf = vec![0u8; 16 * 1024];
                        loop {
                            let n = match cr.read(&mut buf).await {
                                Ok(0) | Err(_) => return,
                                Ok(n) => n,
                            };
                            let left = budget.fetch_sub(n as i64, Ordering::SeqCst);
                            if left <= 0 {
                                return;
                            }
                            let pass = (left as usize).min(n);
                            if sw.write_all(&buf[..pass]).await.is_err() || pass < n {
                                return;
                            }
                        }
                    };
                    let down = async {
                        let mut buf = vec![0u8; 16 * 1024];
                        loop {
                            let n = match sr.read(&mut buf).await {
                                Ok(0) | Err(_) => return,
                                Ok(n) => n,
                            };
                            if budget.load(Ordering::SeqCst) <= 0 || cw.write_all(&buf[..n]).await.is_err() {
                                return;
                            }
                        }
                    };
                    // Whichever side ends first closes both.
                    tokio::select! { _ = up => {}, _ = down => {} }
                });
            }
        });
        CuttableProxy { port, cut }
    }

    /// From now on, `bytes` more client bytes pass, then everything is cut.
    fn cut_after(&self, bytes: i64) {
        self.cut.store(bytes, std::sync::atomic::Ordering::SeqCst);
    }
}

#[tokio::test]
async fn a_graph_outage_during_ingest_is_503_with_nothing_half_written() {
    let bolt = base_settings().bolt_uri;
    let proxy = CuttableProxy::start(bolt).await;
    let port = proxy.port;
    let app = TestApp::spawn_with(|s| {
        s.bolt_uri = format!("127.0.0.1:{port}");
        s.store_timeout_ms = 3_000;
    })
    .await;
    let ws = app.uid("ws");
    let uid = app.uid("big");
    let first = app
        .ingest(json!({"workspace_id": ws, "item": {"title": "Big", "uid": uid}, "content": document("v1", 0, 4)}))
        .await;
    // The replacement is ~200 kB of chunks; the graph goes away part-way
    // through sending them, inside the item's write transaction.
    proxy.cut_after(60_000);
    let (status, body) = post_ingest(
        &app,
        json!({"workspace_id": ws, "item": {"title": "Big", "uid": uid}, "content": document("v2", 0, 250)}),
    )
    .await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{body}");
    assert_eq!(body["error"], "unavailable");
    assert_eq!(body["store"], "graph");
    // Read through a store on the real port: the old version, whole.
    let real = mnemosyne::store::graph::GraphStore::connect(&base_settings())
        .await
        .unwrap();
    let item = real
        .admin()
        .find_item(&uid)
        .await
        .unwrap()
        .expect("the item is still there");
    assert_eq!(item.chunk_count, first["chunk_count"].as_i64().unwrap());
    let texts = chunk_texts_in(&real, &uid).await;
    assert_eq!(texts.len() as i64, item.chunk_count, "half-written chunks");
    assert!(
        texts.iter().all(|t| t.contains("v10x")),
        "a chunk of the failed request was kept"
    );
    // And a new request while the graph is unreachable is a 503 too.
    let (status, _) = post_ingest(
        &app,
        json!({"workspace_id": ws, "item": {"title": "Other"}, "content": "text"}),
    )
    .await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
}

/// Hardening 3, row 2: right after every auth cache is flushed (a user
/// created elsewhere), a burst of 64 identical service-account requests is
/// verified with one argon2 hash, and every request is served.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn identical_concurrent_credentials_are_verified_once_after_a_flush() {
    let app = TestApp::spawn_with(|s| s.store_timeout_ms = UNDER_LOAD_TIMEOUT_MS).await;
    warm_service_account(&app).await;
    // A user created through the CLI's path: its NOTIFY flushes the caches.
    let before = app.state.basic.hashes();
    let generation = app.state.auth.caches.basic.generation();
    mnemosyne::store::pg::notify(&app.pg, "users:*").await.unwrap();
    let mut flushed = false;
    for _ in 0..200 {
        if app.state.auth.caches.basic.generation() > generation {
            flushed = true;
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    assert!(flushed, "the NOTIFY flushed the Basic cache");
    let ws = app.uid("ws");
    let results = futures::future::join_all((0..64).map(|i| {
        post_ingest(
            &app,
            json!({"workspace_id": ws, "item": {"title": format!("Doc {i}"), "uid": app.uid(&format!("doc{i}"))},
                   "content": document("burst", i, 1)}),
        )
    }))
    .await;
    let failed: Vec<_> = results.iter().filter(|(s, _)| !s.is_success()).collect();
    assert!(failed.is_empty(), "{} of 64 failed: {:?}", failed.len(), failed.first());
    assert_eq!(
        app.state.basic.hashes() - before,
        1,
        "one argon2 hash for 64 identical credentials"
    );
}
