//! Console users: creation, reset, disabling, long names.

use super::*;

#[tokio::test]
async fn users_are_created_with_named_errors_reset_and_disabled_users_tokens_stop() {
    let app = TestApp::spawn().await;
    let lib = app.library("l").await;
    staff(&app, "sam").await;
    let mut c = Console::signed_in(&app, "sam", STAFF_PASSWORD).await;
    c.get("/admin/users").await;
    let r = c
        .post(
            "/admin/users",
            &[("username", "bad name"), ("password", "long-enough-1")],
        )
        .await;
    assert_eq!(r.status, StatusCode::BAD_REQUEST);
    assert!(r.body.contains("username must be"), "{}", r.body);
    let r = c
        .post(
            "/admin/users",
            &[("username", "amy"), ("password", "short"), ("staff", "on")],
        )
        .await;
    assert_eq!(r.status, StatusCode::BAD_REQUEST);
    assert!(r.body.contains("at least 8 characters"));
    assert!(r.body.contains("value=\"amy\""), "the form comes back filled in");
    let r = c
        .post("/admin/users", &[("username", "amy"), ("password", "long-enough-1")])
        .await;
    assert_eq!(r.location(), "/admin/users?ok=user-created");
    let r = c
        .post("/admin/users", &[("username", "amy"), ("password", "long-enough-1")])
        .await;
    assert!(r.body.contains("already exists"));
    users::grant(&app.pg, "amy", &lib, Role::Owner).await.unwrap();
    let token = app_token(&app, "amy", &lib).await;
    let r = c
        .post(
            "/admin/users/password",
            &[("username", "amy"), ("new_password", "new-password-2")],
        )
        .await;
    assert_eq!(r.status, StatusCode::SEE_OTHER);
    Console::signed_in(&app, "amy", "new-password-2").await;
    let r = c
        .post("/admin/users/staff", &[("username", SERVICE_USER), ("staff", "on")])
        .await;
    assert_eq!(r.status, StatusCode::BAD_REQUEST, "a service account cannot be staff");
    let r = c
        .post("/admin/users/active", &[("username", "amy"), ("active", "off")])
        .await;
    assert_eq!(r.location(), "/admin/users?ok=user-disabled");
    let refused = app.mcp(&token).initialize().await;
    assert_eq!(refused.json()["error_description"], "User account is disabled.");
    assert_eq!(
        audit_actions(&app, "admin:sam").await,
        ["user_created", "user_password_set", "user_disabled"]
    );
}

#[tokio::test]
async fn a_staff_user_with_a_150_character_name_can_write_and_is_audited() {
    let app = TestApp::spawn().await;
    let name = "s".repeat(150);
    staff(&app, &name).await;
    let mut c = Console::signed_in(&app, &name, STAFF_PASSWORD).await;
    let r = c
        .post(
            "/admin/users",
            &[("username", "newcomer"), ("password", "a-long-password")],
        )
        .await;
    assert_eq!(r.status, StatusCode::SEE_OTHER, "{}", r.body);
    assert_eq!(audit_actions(&app, &format!("admin:{name}")).await, ["user_created"]);
}
