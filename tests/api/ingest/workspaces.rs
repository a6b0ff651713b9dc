//! Workspace read and cascade delete, grants included.

use super::*;

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
    let g = &app.state.admin;
    assert!(g.find_library(lib).await.unwrap().is_none());
    assert!(g.find_item(out["item_uid"].as_str().unwrap()).await.unwrap().is_none());
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
