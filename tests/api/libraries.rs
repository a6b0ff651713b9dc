//! Library lifecycle (issue 23, item 1): an owner or an operator renames or
//! deletes a user-managed library — REST, CLI and console — and a delete
//! takes the content, the memberships and every token's scope of it, on
//! every replica from the next request on. Workspace libraries stay with the
//! workspace API (409).

use mnemosyne::service::libraries::{self, Authority, LibraryError};
use mnemosyne::service::memberships::{self, Change, Granter, Refusal};
use mnemosyne::store::pg::users::{self, Role};
use reqwest::{Method, StatusCode};
use serde_json::{json, Value};

use crate::admin::{staff, Console, STAFF_PASSWORD};
use crate::helpers::{send, TestApp, SERVICE_USER};

async fn audit_of(app: &TestApp, action: &str) -> Vec<(String, String, Value)> {
    sqlx::query_as("SELECT actor::text, target::text, detail FROM audit_events WHERE action = $1 ORDER BY id")
        .bind(action)
        .fetch_all(&app.pg)
        .await
        .unwrap()
}

async fn library_names(c: &mut crate::helpers::McpClient) -> Vec<(String, String)> {
    let out = c.call_ok("list_libraries", json!({})).await;
    out["libraries"]
        .as_array()
        .unwrap()
        .iter()
        .map(|l| {
            (
                l["uid"].as_str().unwrap().to_owned(),
                l["name"].as_str().unwrap().to_owned(),
            )
        })
        .collect()
}

async fn library_in_graph(app: &TestApp, uid: &str) -> bool {
    app.state.admin.library_detail(uid).await.unwrap().is_some()
}

#[tokio::test]
async fn a_rename_shows_in_list_libraries_and_is_audited() {
    let app = TestApp::spawn().await;
    let lib = app.library("handbook").await;
    let t = app.opaque_token(&[lib.clone()]).await;
    let mut c = app.mcp(&t).connect().await;
    assert_eq!(library_names(&mut c).await, vec![(lib.clone(), "handbook".to_owned())]);

    let path = format!("/library/api/libraries/{lib}/");
    let (status, body) = send(
        app.service(Method::PATCH, &path)
            .json(&json!({"name": "Staff handbook", "description": "Read me first"})),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(
        body,
        json!({"uid": lib, "name": "Staff handbook", "description": "Read me first"})
    );
    // The open session sees the new name on its next call.
    assert_eq!(
        library_names(&mut c).await,
        vec![(lib.clone(), "Staff handbook".to_owned())]
    );
    let (_, detail) = send(app.service(Method::GET, &path)).await;
    assert_eq!(detail["description"], "Read me first");

    let (status, body) = send(app.service(Method::PATCH, &path).json(&json!({"name": "  "}))).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
    assert_eq!(body["field"], "name");
    let missing = format!("/library/api/libraries/{}/", app.uid("missing"));
    let (status, _) = send(app.service(Method::PATCH, &missing).json(&json!({"name": "x"}))).await;
    assert_eq!(status, StatusCode::NOT_FOUND);

    let audit = audit_of(&app, "library_renamed").await;
    assert_eq!(audit.len(), 1, "{audit:?}");
    assert_eq!((audit[0].0.as_str(), audit[0].1.as_str()), (SERVICE_USER, lib.as_str()));
    assert_eq!(
        audit[0].2,
        json!({"from": "handbook", "to": "Staff handbook", "description_changed": true})
    );
}

#[tokio::test]
async fn a_delete_reaches_another_replica_on_its_next_search_and_old_tokens_read_nothing() {
    let app = TestApp::spawn().await;
    let other = app.second_instance().await;
    let (lib, keep) = (app.library("doomed").await, app.library("kept").await);
    for l in [&lib, &keep] {
        app.ingest(json!({"library_uid": l, "item": {"title": "Okapi"}, "content": "The okapi hides in the forest."}))
            .await;
    }
    let owner = app.uid("owner");
    users::create(&app.pg, &owner, None, false).await.unwrap().unwrap();
    for l in [&lib, &keep] {
        users::grant(&app.pg, &owner, l, Role::Owner).await.unwrap();
    }
    let minted = mnemosyne::service::tokens::mint(&app.pg, &owner, "t", &[lib.clone(), keep.clone()], None)
        .await
        .unwrap();
    let only = mnemosyne::service::tokens::mint(&app.pg, &owner, "t", &[lib.clone()], None)
        .await
        .unwrap()
        .plaintext;
    // Both tokens read the library on the other replica (cached there).
    let mut c = other.mcp(&minted.plaintext).connect().await;
    let hits = c.call_ok("search", json!({"query": "okapi"})).await;
    assert_eq!(hits["results"].as_array().unwrap().len(), 2, "{hits}");
    let mut c_only = other.mcp(&only).connect().await;
    assert_eq!(c_only.library_uids().await, vec![lib.clone()]);

    let path = format!("/library/api/libraries/{lib}/");
    let (status, body) = send(app.service(Method::DELETE, &path)).await;
    assert_eq!(status, StatusCode::NO_CONTENT, "{body}");

    // The next search on the other replica, in the session opened before.
    let hits = c.call_ok("search", json!({"query": "okapi"})).await;
    let libs: Vec<&str> = hits["results"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["library_uid"].as_str().unwrap())
        .collect();
    assert_eq!(libs, vec![keep.as_str()]);
    assert_eq!(c.library_uids().await, vec![keep.clone()]);
    assert_eq!(c_only.library_uids().await, Vec::<String>::new());
    assert_eq!(
        c_only.call_ok("search", json!({"query": "okapi"})).await["results"],
        json!([])
    );
    assert!(!library_in_graph(&app, &lib).await);
    assert!(users::memberships(&app.pg, None, Some(&lib)).await.unwrap().is_empty());
    let scope: sqlx::types::Json<Vec<String>> =
        sqlx::query_scalar("SELECT allowed_libraries FROM mcp_tokens WHERE id = $1")
            .bind(minted.id)
            .fetch_one(&app.pg)
            .await
            .unwrap();
    assert_eq!(scope.0, vec![keep.clone()]);

    let audit = audit_of(&app, "library_deleted").await;
    assert_eq!(audit.len(), 1, "{audit:?}");
    assert_eq!(
        audit[0].2,
        json!({"name": "doomed", "deleted_from_graph": true, "collections": 1, "items": 1, "chunks": 1,
               "memberships_removed": 1, "tokens_changed": 2})
    );
    assert!(!audit[0].2.to_string().contains(&only), "no secret in the audit");

    // Gone: 404; the same uid created again inherits no grant.
    let (status, _) = send(app.service(Method::DELETE, &path)).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    let (status, _) = send(
        app.service(Method::POST, "/library/api/libraries/")
            .json(&json!({"uid": lib, "name": "reborn"})),
    )
    .await;
    assert_eq!(status, StatusCode::CREATED);
    app.ingest(json!({"library_uid": lib, "item": {"title": "Okapi"}, "content": "The okapi is back."}))
        .await;
    for replica in [&app, &other] {
        let mut c = replica.mcp(&only).connect().await;
        assert_eq!(
            c.call_ok("search", json!({"query": "okapi"})).await["results"],
            json!([])
        );
    }
}

#[tokio::test]
async fn the_last_owner_cannot_be_revoked_but_the_library_can_be_deleted() {
    let app = TestApp::spawn().await;
    let lib = app.library("solo").await;
    let (owner, manager) = (app.uid("owner"), app.uid("manager"));
    for (u, r) in [(&owner, Role::Owner), (&manager, Role::Manager)] {
        users::create(&app.pg, u, None, false).await.unwrap().unwrap();
        users::grant(&app.pg, u, &lib, r).await.unwrap();
    }
    for granter in [Granter::Staff, Granter::Member(&owner)] {
        let refused = memberships::apply(&app.pg, granter, "test", Change::Revoke, &owner, &lib, Role::Owner)
            .await
            .unwrap();
        assert_eq!(refused, Err(Refusal::LastOwner));
    }
    let (g, pg, ch) = (&app.state.admin, &app.pg, &app.state.changes);
    let manager_may_not = libraries::delete(g, pg, ch, "test", Authority::Owner(&manager), &lib).await;
    assert!(
        matches!(&manager_may_not, Err(LibraryError::NotOwner(u)) if *u == lib),
        "{manager_may_not:?}"
    );
    let stranger = libraries::rename(g, pg, "test", Authority::Owner("nobody"), &lib, "x", None).await;
    assert!(matches!(stranger, Err(LibraryError::NotFound(_))), "{stranger:?}");
    assert!(library_in_graph(&app, &lib).await);

    let out = libraries::delete(g, pg, ch, "admin:owner", Authority::Owner(&owner), &lib)
        .await
        .unwrap();
    assert_eq!((out.memberships_removed, out.tokens_changed), (2, 0));
    assert!(!library_in_graph(&app, &lib).await);
    assert!(users::memberships(&app.pg, None, Some(&lib)).await.unwrap().is_empty());
}

#[tokio::test]
async fn workspace_libraries_are_refused_with_a_409_that_names_the_workspace_api() {
    let app = TestApp::spawn().await;
    let ws = app.uid("ws");
    let lib = app.ingest_ws(&ws, "Doc", "Workspace text.").await["library_uid"]
        .as_str()
        .unwrap()
        .to_owned();
    let path = format!("/library/api/libraries/{lib}/");
    let expected = format!(
        "library {lib} is the library of workspace {ws}: it is managed by the workspace API \
         (DELETE /library/api/workspaces/{ws}/), not renamed or deleted on its own"
    );
    let (status, body) = send(app.service(Method::DELETE, &path)).await;
    assert_eq!(
        (status, body["error"].as_str()),
        (StatusCode::CONFLICT, Some("conflict")),
        "{body}"
    );
    assert_eq!(body["message"], json!(expected), "{body}");
    let (status, body) = send(app.service(Method::PATCH, &path).json(&json!({"name": "Mine now"}))).await;
    assert_eq!(status, StatusCode::CONFLICT, "{body}");
    assert_eq!(body["message"], json!(expected));
    let (_, detail) = send(app.service(Method::GET, &path)).await;
    assert_eq!(
        (detail["workspace_id"].as_str(), detail["item_count"].as_i64()),
        (Some(ws.as_str()), Some(1))
    );
    let (ok, _, err) = app.cli(&["library", "delete", &lib, "--yes"]);
    assert!(!ok && err.contains("managed by the workspace API"), "{err}");
    assert!(audit_of(&app, "library_deleted").await.is_empty());
}

#[tokio::test]
async fn the_cli_renames_and_deletes_a_library_and_asks_for_yes() {
    let app = TestApp::spawn().await;
    let lib = app.library("cli").await;
    app.ingest(json!({"library_uid": lib, "item": {"title": "T"}, "content": "Some text."}))
        .await;
    let (ok, out, err) = app.cli(&["library", "rename", &lib, "--name", "Renamed by CLI"]);
    assert!(ok, "{err}");
    assert!(out.contains("Renamed by CLI"), "{out}");
    assert_eq!(
        app.state.admin.library_detail(&lib).await.unwrap().unwrap().name,
        "Renamed by CLI"
    );
    let (ok, _, err) = app.cli(&["library", "delete", &lib]);
    assert!(!ok && err.contains("--yes"), "{err}");
    assert!(library_in_graph(&app, &lib).await, "nothing deleted without --yes");
    let (ok, out, err) = app.cli(&["--json", "library", "delete", &lib, "--yes"]);
    assert!(ok, "{err}");
    let v: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(
        (v["uid"].as_str(), v["items"].as_i64()),
        (Some(lib.as_str()), Some(1)),
        "{v}"
    );
    assert!(!library_in_graph(&app, &lib).await);
    let actors: Vec<String> = sqlx::query_scalar(
        "SELECT actor::text FROM audit_events WHERE action IN ('library_renamed', 'library_deleted') ORDER BY id",
    )
    .fetch_all(&app.pg)
    .await
    .unwrap();
    assert_eq!(actors, ["cli", "cli"]);
    let (ok, _, err) = app.cli(&["library", "delete", &lib, "--yes"]);
    assert!(!ok && err.contains("library not found"), "{err}");
}

#[tokio::test]
async fn the_console_confirms_a_delete_naming_the_counts_for_staff_and_for_an_owner() {
    let app = TestApp::spawn().await;
    let (a, b) = (app.library("staffs").await, app.library("owners").await);
    for l in [&a, &b] {
        app.ingest(json!({"library_uid": l, "item": {"title": "T"}, "content": "Some text."}))
            .await;
    }
    let boss = staff(&app, &app.uid("boss")).await;
    let mut console = Console::signed_in(&app, &boss, STAFF_PASSWORD).await;
    let page = console.get(&format!("/admin/library/delete?uid={a}")).await;
    assert_eq!(page.status, StatusCode::OK, "{}", page.body);
    assert!(
        page.body.contains("1 collection(s), 1 item(s) and 1 chunk(s)") && page.body.contains("0 membership(s)"),
        "{}",
        page.body
    );
    let renamed = console
        .post(
            "/admin/library/rename",
            &[("uid", &a), ("name", "Staff named"), ("description", "")],
        )
        .await;
    assert_eq!(renamed.status, StatusCode::SEE_OTHER, "{}", renamed.body);
    assert_eq!(
        app.state.admin.library_detail(&a).await.unwrap().unwrap().name,
        "Staff named"
    );
    console.get(&format!("/admin/library/delete?uid={a}")).await;
    let done = console.post("/admin/library/delete", &[("uid", &a)]).await;
    assert_eq!(done.status, StatusCode::SEE_OTHER, "{}", done.body);
    assert!(done.location().starts_with("/admin/libraries"), "{}", done.location());
    assert!(!library_in_graph(&app, &a).await);

    // An owner on their own page; a manager of it is refused.
    let owner = crate::admin::person(&app, &app.uid("owner")).await;
    let manager = crate::admin::person(&app, &app.uid("manager")).await;
    users::grant(&app.pg, &owner, &b, Role::Owner).await.unwrap();
    users::grant(&app.pg, &manager, &b, Role::Manager).await.unwrap();
    let mut m = Console::signed_in(&app, &manager, STAFF_PASSWORD).await;
    let page = m.get(&format!("/admin/me/library?uid={b}")).await;
    assert_eq!(page.status, StatusCode::FORBIDDEN, "{}", page.body);
    let mut o = Console::signed_in(&app, &owner, STAFF_PASSWORD).await;
    let me = o.get("/admin/me").await;
    assert!(me.body.contains(&format!("/admin/me/library?uid={b}")), "{}", me.body);
    let page = o.get(&format!("/admin/me/library?uid={b}")).await;
    assert_eq!(page.status, StatusCode::OK, "{}", page.body);
    assert!(page.body.contains("2 membership(s)"), "{}", page.body);
    let refused = m
        .post("/admin/me/library/rename", &[("uid", &b), ("name", "Manager named")])
        .await;
    assert_eq!(refused.status, StatusCode::FORBIDDEN, "{}", refused.body);
    let renamed = o
        .post(
            "/admin/me/library/rename",
            &[("uid", &b), ("name", "Owner named"), ("description", "Mine")],
        )
        .await;
    assert_eq!(renamed.status, StatusCode::SEE_OTHER, "{}", renamed.body);
    let page = o.get(renamed.location()).await;
    assert!(
        page.body.contains("Library renamed.") && page.body.contains("Owner named"),
        "{}",
        page.body
    );
    let done = o.post("/admin/me/library/delete", &[("uid", &b)]).await;
    assert_eq!(done.status, StatusCode::SEE_OTHER, "{}", done.body);
    assert!(!library_in_graph(&app, &b).await);
    let actors: Vec<String> =
        sqlx::query_scalar("SELECT actor::text FROM audit_events WHERE action = 'library_deleted' ORDER BY id")
            .fetch_all(&app.pg)
            .await
            .unwrap();
    assert_eq!(actors, [format!("admin:{boss}"), format!("admin:{owner}")]);
}

#[tokio::test]
async fn a_library_deleted_on_one_replica_is_forgotten_by_the_others_caches() {
    let app = TestApp::spawn().await;
    let other = app.second_instance().await;
    let lib = app.library("polyglot").await;
    let code = |app: &TestApp| {
        let (g, lib) = (app.state.admin.clone(), lib.clone());
        async move { g.language_of(&lib).await.unwrap().code() }
    };
    assert_eq!(code(&other).await, "en", "cached on the other replica");
    let (status, _) = send(app.service(Method::DELETE, &format!("/library/api/libraries/{lib}/"))).await;
    assert_eq!(status, StatusCode::NO_CONTENT);
    let (status, _) = send(
        app.service(Method::POST, "/library/api/libraries/")
            .json(&json!({"uid": lib, "name": "polyglot", "language": "de"})),
    )
    .await;
    assert_eq!(status, StatusCode::CREATED);
    let mut seen = code(&other).await;
    for _ in 0..100 {
        if seen == "de" {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        seen = code(&other).await;
    }
    assert_eq!(seen, "de", "the same uid created again is read afresh");
}
