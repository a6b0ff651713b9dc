//! Issue 53 part 1 (the spec's v2 scope): libraries granted to a team
//! directly, beside its workspaces (DESIGN §3, §4).

use reqwest::{Method, StatusCode};
use serde_json::{json, Value};
use uuid::Uuid;

use crate::admin::{audit_actions, staff, Console, STAFF_PASSWORD};
use crate::helpers::{send, TestApp};
use crate::mcp::seed;

impl TestApp {
    /// PUT /mcp_server/api/teams/{id}/libraries/ → its body (must be 200).
    pub async fn put_libraries(&self, id: Uuid, uids: &[String]) -> Value {
        let (status, body) = send(
            self.service(Method::PUT, &format!("/mcp_server/api/teams/{id}/libraries/"))
                .json(&json!({"library_uids": uids})),
        )
        .await;
        assert_eq!(status, StatusCode::OK, "{body}");
        body
    }
}

fn result_libraries(out: &Value) -> Vec<String> {
    out["results"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["library_uid"].as_str().unwrap().to_owned())
        .collect()
}

/// A chunk uid of `library` (found through a token that reads only it).
async fn chunk_of(app: &TestApp, library: &str) -> String {
    let token = app.opaque_token(&[library.to_owned()]).await;
    let out = app
        .mcp(&token)
        .connect()
        .await
        .call_ok("search", json!({"query": "zanzibarine"}))
        .await;
    out["results"][0]["chunk_uid"].as_str().unwrap().to_owned()
}

#[tokio::test]
async fn a_team_with_one_direct_library_reads_exactly_it() {
    let app = TestApp::spawn().await;
    let s = seed(&app).await;
    let (id, jwt) = app.create_team("Handbook readers").await;
    assert_eq!(
        app.put_libraries(id, &[s.lib_c.clone()]).await,
        json!({"library_uids": [s.lib_c]})
    );
    let mut c = app.mcp(&jwt).connect().await;
    assert_eq!(c.library_uids().await, [s.lib_c.clone()]);
    let hits = result_libraries(&c.call_ok("search", json!({"query": "zanzibarine"})).await);
    assert!(!hits.is_empty());
    assert!(hits.iter().all(|l| *l == s.lib_c), "{hits:?}");
    // a workspace library's chunk is as absent as a made-up uid
    let other = chunk_of(&app, &s.lib_a).await;
    let out = c.call("get_chunk", json!({"chunk_uid": other})).await;
    assert_eq!(out["isError"], true);
    assert_eq!(out["content"][0]["text"], format!("chunk not found: {other}"));
}

#[tokio::test]
async fn workspace_libraries_come_first_then_direct_ones_in_order_without_duplicates() {
    let app = TestApp::spawn().await;
    let s = seed(&app).await;
    let (id, jwt) = app.create_team("Kottos").await;
    app.put_workspaces(id, &[s.ws_b.clone()]).await;
    let missing = app.uid("lib_not_yet");
    // lib_b is the workspace's library too: it stays where the workspace put it
    let stored = app
        .put_libraries(
            id,
            &[s.lib_c.clone(), missing.clone(), s.lib_a.clone(), s.lib_b.clone()],
        )
        .await;
    assert_eq!(stored, json!({"library_uids": [s.lib_c, missing, s.lib_a, s.lib_b]}));
    let mut c = app.mcp(&jwt).connect().await;
    // the unknown uid is dropped, as an unknown workspace is
    assert_eq!(
        c.library_uids().await,
        [s.lib_b.clone(), s.lib_c.clone(), s.lib_a.clone()]
    );
    // GET shows both lists, as stored
    for path in [
        format!("/mcp_server/api/teams/{id}/libraries/"),
        format!("/mcp_server/api/teams/{id}/libraries"),
    ] {
        let (status, body) = send(app.service(Method::GET, &path)).await;
        assert_eq!(status, StatusCode::OK);
        assert_eq!(
            body,
            json!({"workspace_ids": [s.ws_b], "library_uids": [s.lib_c, missing, s.lib_a, s.lib_b]})
        );
    }
    let (_, detail) = send(app.service(Method::GET, &format!("/mcp_server/api/teams/{id}/"))).await;
    assert_eq!(detail["workspace_ids"], json!([s.ws_b]));
    assert_eq!(detail["library_uids"], json!([s.lib_c, missing, s.lib_a, s.lib_b]));
    // the unknown library is created: readable on the next request, last
    let created = app.library("lib_not_yet").await;
    assert_eq!(created, missing);
    assert_eq!(
        c.library_uids().await,
        [s.lib_b.clone(), s.lib_c.clone(), missing.clone(), s.lib_a.clone()]
    );
}

#[tokio::test]
async fn a_library_removed_from_the_team_is_unreadable_on_the_next_request_on_another_replica() {
    let app = TestApp::spawn().await;
    let other = app.second_instance().await;
    let s = seed(&app).await;
    let (id, jwt) = app.create_team("Kottos").await;
    app.put_libraries(id, &[s.lib_c.clone(), s.lib_a.clone()]).await;
    let chunk = chunk_of(&app, &s.lib_c).await;
    let mut c2 = other.mcp(&jwt).connect().await;
    // warm the other replica's caches
    assert_eq!(c2.library_uids().await, [s.lib_c.clone(), s.lib_a.clone()]);
    let out = c2.call_ok("get_chunk", json!({"chunk_uid": chunk})).await;
    assert_eq!(out["chunk"]["library_uid"], s.lib_c.as_str());
    app.put_libraries(id, &[s.lib_a.clone()]).await;
    assert_eq!(c2.library_uids().await, [s.lib_a.clone()]);
    let hits = result_libraries(&c2.call_ok("search", json!({"query": "zanzibarine"})).await);
    assert!(hits.iter().all(|l| *l == s.lib_a), "{hits:?}");
    assert_eq!(c2.call("get_chunk", json!({"chunk_uid": chunk})).await["isError"], true);
}

#[tokio::test]
async fn a_deleted_library_is_dropped_from_every_team_on_every_replica() {
    let app = TestApp::spawn().await;
    let other = app.second_instance().await;
    let s = seed(&app).await;
    let (id, jwt) = app.create_team("Kottos").await;
    app.put_libraries(id, &[s.lib_c.clone(), s.lib_a.clone()]).await;
    let mut c2 = other.mcp(&jwt).connect().await;
    assert_eq!(c2.library_uids().await, [s.lib_c.clone(), s.lib_a.clone()]);
    let (status, body) = send(app.service(Method::DELETE, &format!("/library/api/libraries/{}/", s.lib_c))).await;
    assert!(status.is_success(), "{status} {body}");
    assert_eq!(c2.library_uids().await, [s.lib_a.clone()]);
    // its grant went with it: a library re-created under the uid is not inherited
    let (_, libs) = send(app.service(Method::GET, &format!("/mcp_server/api/teams/{id}/libraries/"))).await;
    assert_eq!(libs["library_uids"], json!([s.lib_a]));
    app.library("lib_c").await;
    assert_eq!(c2.library_uids().await, [s.lib_a.clone()]);
}

#[tokio::test]
async fn a_workspace_only_team_resolves_as_before_without_the_direct_grants_cache() {
    let app = TestApp::spawn().await;
    let s = seed(&app).await;
    let (id, jwt) = app.create_team("Kottos").await;
    app.put_workspaces(id, &[s.ws_b.clone(), s.ws_a.clone()]).await;
    let mut c = app.mcp(&jwt).connect().await;
    assert_eq!(c.library_uids().await, [s.lib_b.clone(), s.lib_a.clone()]);
    assert_eq!(c.library_uids().await, [s.lib_b.clone(), s.lib_a.clone()]);
    let (_, detail) = send(app.service(Method::GET, &format!("/mcp_server/api/teams/{id}/"))).await;
    assert_eq!(detail["library_uids"], json!([]));
    let metrics = app.metrics().await;
    assert!(
        !metrics
            .lines()
            .any(|l| l.starts_with("auth_cache_requests_total{cache=\"team_libraries\"") && !l.ends_with(" 0")),
        "a workspace-only team never looks at team_libraries"
    );
    // emptying the direct list of a team that had one gives the workspace path back
    app.put_libraries(id, &[s.lib_c.clone()]).await;
    assert_eq!(
        c.library_uids().await,
        [s.lib_b.clone(), s.lib_a.clone(), s.lib_c.clone()]
    );
    app.put_libraries(id, &[]).await;
    assert_eq!(c.library_uids().await, [s.lib_b.clone(), s.lib_a.clone()]);
}

#[tokio::test]
async fn put_libraries_replaces_is_idempotent_and_validates_like_workspaces() {
    let app = TestApp::spawn().await;
    let (id, _) = app.create_team("Kottos").await;
    let path = format!("/mcp_server/api/teams/{id}/libraries/");
    assert_eq!(
        app.put_libraries(id, &["a".into(), "b".into()]).await,
        json!({"library_uids": ["a", "b"]})
    );
    assert_eq!(
        app.put_libraries(id, &["c".into()]).await,
        json!({"library_uids": ["c"]})
    );
    assert_eq!(
        app.put_libraries(id, &["c".into()]).await,
        json!({"library_uids": ["c"]})
    );
    assert_eq!(
        app.put_libraries(id, &["d".into(), "d".into(), "c".into()]).await,
        json!({"library_uids": ["d", "c"]})
    );
    // without the trailing slash too
    let (status, body) = send(
        app.service(Method::PUT, path.trim_end_matches('/'))
            .json(&json!({"library_uids": []})),
    )
    .await;
    assert_eq!((status, body), (StatusCode::OK, json!({"library_uids": []})));
    for (body, field) in [
        (json!({"library_uids": [""]}), "library_uids[0]"),
        (json!({"library_uids": ["ok", "x".repeat(65)]}), "library_uids[1]"),
        (json!({"library_uids": ["ok", "has space"]}), "library_uids[1]"),
        (json!({"library_uids": "lib"}), "library_uids"),
        (json!({}), "library_uids"),
        (
            json!({"library_uids": (0..1001).map(|i| format!("l{i}")).collect::<Vec<_>>()}),
            "library_uids",
        ),
    ] {
        let (status, out) = send(app.service(Method::PUT, &path).json(&body)).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{out}");
        assert_eq!(out["field"], field, "{out}");
    }
    // nothing of the refused PUTs was stored
    let (_, got) = send(app.service(Method::GET, &path)).await;
    assert_eq!(got["library_uids"], json!([]));
    // unknown team, bad id, no Basic auth
    let unknown = format!("/mcp_server/api/teams/{}/libraries/", Uuid::new_v4());
    for m in [Method::GET, Method::PUT] {
        let (status, _) = send(app.service(m, &unknown).json(&json!({"library_uids": []}))).await;
        assert_eq!(status, StatusCode::NOT_FOUND);
    }
    let (status, out) = send(app.service(Method::GET, "/mcp_server/api/teams/nope/libraries/")).await;
    assert_eq!((status, out["field"].clone()), (StatusCode::BAD_REQUEST, json!("id")));
    let r = app
        .http
        .put(app.url(&path))
        .json(&json!({"library_uids": ["a"]}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::UNAUTHORIZED);
    assert_eq!(r.headers()["www-authenticate"], "Basic realm=\"mnemosyne\"");
}

#[tokio::test]
async fn every_change_of_the_direct_libraries_is_audited_and_a_no_op_is_not() {
    let app = TestApp::spawn().await;
    let (id, _) = app.create_team("Kottos").await;
    app.put_libraries(id, &["lib_x".into(), "lib_y".into()]).await;
    app.put_libraries(id, &["lib_x".into(), "lib_y".into()]).await;
    app.put_libraries(id, &["lib_y".into()]).await;
    let rows: Vec<(String, String, String, Value)> = sqlx::query_as(
        "SELECT actor::text, action::text, target::text, detail FROM audit_events
          WHERE action = 'team_libraries_updated' ORDER BY id",
    )
    .fetch_all(&app.pg)
    .await
    .unwrap();
    let target = id.to_string();
    assert_eq!(
        rows,
        [
            (
                crate::helpers::SERVICE_USER.to_owned(),
                "team_libraries_updated".to_owned(),
                target.clone(),
                json!({"library_uids": ["lib_x", "lib_y"]})
            ),
            (
                crate::helpers::SERVICE_USER.to_owned(),
                "team_libraries_updated".to_owned(),
                target,
                json!({"library_uids": ["lib_y"]})
            ),
        ]
    );
}

#[tokio::test]
async fn the_cli_sets_and_shows_a_teams_direct_libraries() {
    let app = TestApp::spawn().await;
    let s = seed(&app).await;
    let (id, jwt) = app.create_team("Kottos").await;
    app.put_workspaces(id, &[s.ws_a.clone()]).await;
    let id_s = id.to_string();
    let out = app.cli_ok(&["--json", "team", "set-libraries", &id_s, &s.lib_c, &s.lib_b]);
    let v: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["library_uids"], json!([s.lib_c, s.lib_b]));
    assert_eq!(
        app.mcp(&jwt).connect().await.library_uids().await,
        [s.lib_a.clone(), s.lib_c.clone(), s.lib_b.clone()]
    );
    let shown: Value = serde_json::from_str(&app.cli_ok(&["--json", "team", "show", &id_s])).unwrap();
    assert_eq!(shown["workspace_ids"], json!([s.ws_a]));
    assert_eq!(shown["library_uids"], json!([s.lib_c, s.lib_b]));
    let (ok, _, err) = app.cli(&["team", "set-libraries", &id_s, "bad uid"]);
    assert!(!ok);
    assert!(err.contains("library_uids[0]"), "{err}");
    // no uid clears them
    app.cli_ok(&["team", "set-libraries", &id_s]);
    assert_eq!(app.mcp(&jwt).connect().await.library_uids().await, [s.lib_a.clone()]);
    let actors: Vec<String> =
        sqlx::query_scalar("SELECT actor::text FROM audit_events WHERE action = 'team_libraries_updated' ORDER BY id")
            .fetch_all(&app.pg)
            .await
            .unwrap();
    assert_eq!(actors, ["cli", "cli"]);
}

#[tokio::test]
async fn the_console_team_page_sets_the_direct_libraries() {
    let app = TestApp::spawn().await;
    let s = seed(&app).await;
    let (id, jwt) = app.create_team("Kottos").await;
    staff(&app, "sam").await;
    let mut c = Console::signed_in(&app, "sam", STAFF_PASSWORD).await;
    let page = c.get(&format!("/admin/teams/{id}")).await;
    assert!(page.body.contains("name=\"library_uids\""));
    let bad = format!("{}\nnot valid", s.lib_c);
    let r = c
        .post(&format!("/admin/teams/{id}/libraries"), &[("library_uids", &bad)])
        .await;
    assert_eq!(r.status, StatusCode::BAD_REQUEST);
    assert!(r.body.contains("library_uids[1]"), "{}", r.body);
    assert!(r.body.contains("not valid"), "the form comes back as typed");
    let both = format!("{}\n{}", s.lib_c, s.lib_a);
    let r = c
        .post(&format!("/admin/teams/{id}/libraries"), &[("library_uids", &both)])
        .await;
    assert_eq!(r.status, StatusCode::SEE_OTHER);
    assert_eq!(r.location(), format!("/admin/teams/{id}?ok=team-libraries"));
    assert_eq!(
        app.mcp(&jwt).connect().await.library_uids().await,
        [s.lib_c.clone(), s.lib_a.clone()]
    );
    let list = c.get("/admin/teams").await;
    assert!(list.body.contains(&s.lib_c));
    assert_eq!(audit_actions(&app, "admin:sam").await, ["team_libraries_updated"]);
}
