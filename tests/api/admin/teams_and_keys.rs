//! Console teams (rotation, workspaces, deactivation) and signing keys.

use super::*;

#[tokio::test]
async fn rotating_a_team_shows_the_jwt_once_with_its_secrets_snippet_and_the_old_one_is_refused() {
    let app = TestApp::spawn().await;
    let s = seed(&app).await;
    let (id, old) = app.create_team("Kottos").await;
    app.put_workspaces(id, &[s.ws_a.clone()]).await;
    staff(&app, "sam").await;
    let mut c = Console::signed_in(&app, "sam", STAFF_PASSWORD).await;
    let list = c.get("/admin/teams").await;
    assert!(list.body.contains("Kottos") && list.body.contains(&s.ws_a));
    c.get(&format!("/admin/teams/{id}")).await;
    let r = c.post(&format!("/admin/teams/{id}/rotate"), &[]).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.body);
    let new = jwt_in(&r.body).unwrap();
    assert!(r.body.contains("fastagent.secrets.yaml"));
    assert!(r.body.contains(&format!("Authorization: Bearer {new}")));
    let refused = app.mcp(&old).initialize().await;
    assert_eq!(refused.status, StatusCode::UNAUTHORIZED);
    assert_eq!(refused.json()["error_description"], "Invalid MCP token.");
    assert_eq!(app.mcp(&new).connect().await.library_uids().await, [s.lib_a.clone()]);
    assert!(!c.get(&format!("/admin/teams/{id}")).await.body.contains(&new));
    assert_eq!(audit_actions(&app, "admin:sam").await, ["team_rotated"]);
}

#[tokio::test]
async fn team_workspaces_are_edited_and_a_deactivated_team_is_refused() {
    let app = TestApp::spawn().await;
    let s = seed(&app).await;
    let (id, jwt) = app.create_team("Kottos").await;
    staff(&app, "sam").await;
    let mut c = Console::signed_in(&app, "sam", STAFF_PASSWORD).await;
    c.get(&format!("/admin/teams/{id}")).await;
    let long = "w".repeat(65);
    let bad = format!("{}\n{long}", s.ws_a);
    let r = c
        .post(&format!("/admin/teams/{id}/workspaces"), &[("workspace_ids", &bad)])
        .await;
    assert_eq!(r.status, StatusCode::BAD_REQUEST);
    assert!(
        r.body.contains("workspace_ids[1]") || r.body.contains("at most 64"),
        "{}",
        r.body
    );
    assert!(r.body.contains(&long), "the form comes back as typed");
    let both = format!("{}\n{}\n{}", s.ws_b, s.ws_a, s.ws_b);
    let r = c
        .post(&format!("/admin/teams/{id}/workspaces"), &[("workspace_ids", &both)])
        .await;
    assert_eq!(r.status, StatusCode::SEE_OTHER);
    assert_eq!(r.location(), format!("/admin/teams/{id}?ok=team-workspaces"));
    assert_eq!(
        app.mcp(&jwt).connect().await.library_uids().await,
        [s.lib_b.clone(), s.lib_a.clone()]
    );
    let r = c.post(&format!("/admin/teams/{id}/deactivate"), &[]).await;
    assert_eq!(r.status, StatusCode::SEE_OTHER);
    let refused = app.mcp(&jwt).initialize().await;
    assert_eq!(refused.json()["error_description"], "Token has been deactivated.");
    let page = c.get(&format!("/admin/teams/{id}?ok=team-deactivated")).await;
    assert!(page.body.contains("deactivated"));
    assert!(!page.body.contains("/rotate\""), "no rotate form on an inactive team");
    assert_eq!(
        audit_actions(&app, "admin:sam").await,
        ["team_workspaces_updated", "team_deleted"]
    );
}

#[tokio::test]
async fn signing_keys_show_the_secret_once_and_retiring_needs_confirmation_and_stops_its_jwts() {
    let app = TestApp::spawn().await;
    staff(&app, "sam").await;
    let mut c = Console::signed_in(&app, "sam", STAFF_PASSWORD).await;
    c.get("/admin/keys").await;
    let r = c.post("/admin/keys", &[]).await;
    assert_eq!(r.status, StatusCode::OK);
    let newest = mnemosyne::store::pg::keys::newest_active(&app.pg)
        .await
        .unwrap()
        .unwrap();
    assert!(r.body.contains(&newest.secret_hex));
    let list = c.get("/admin/keys").await;
    assert!(list.body.contains(&newest.kid) && !list.body.contains(&newest.secret_hex));
    let (_, jwt) = app.create_team("Signed with the newest").await;
    assert_eq!(app.mcp(&jwt).initialize().await.status, StatusCode::OK);
    let confirm = c.get(&format!("/admin/keys/retire?kid={}", newest.kid)).await;
    assert!(confirm.body.contains("stops working"), "{}", confirm.body);
    let r = c.post("/admin/keys/retire", &[("kid", &newest.kid)]).await;
    assert_eq!(r.location(), "/admin/keys?ok=key-retired");
    let refused = app.mcp(&jwt).initialize().await;
    assert_eq!(refused.json()["error_description"], "Invalid MCP token.");
    assert_eq!(
        audit_actions(&app, "admin:sam").await,
        ["signing_key_created", "signing_key_retired"]
    );
}
