//! Console libraries: counts, memberships and the self-service grants.

use super::*;

#[tokio::test]
async fn libraries_show_counts_and_memberships_keep_an_owner() {
    let app = TestApp::spawn().await;
    let s = seed(&app).await;
    person(&app, "pat").await;
    person(&app, "lee").await;
    staff(&app, "sam").await;
    let mut c = Console::signed_in(&app, "sam", STAFF_PASSWORD).await;
    // The list is paged in uid order over the shared graph: each library is
    // on the page that starts just before its uid.
    let ws_lib = mnemosyne::store::graph::ingest::workspace_library_uid(&s.ws_a);
    for (uid, shown) in [(&s.lib_a, &s.lib_a), (&ws_lib, &s.ws_a), (&s.lib_c, &s.lib_c)] {
        let list = c
            .get(&format!("/admin/libraries?after={}&limit=200", &uid[..uid.len() - 1]))
            .await;
        assert_eq!(list.status, StatusCode::OK);
        assert!(list.body.contains(shown.as_str()), "{uid} not listed");
    }
    let path = format!("/admin/library?uid={}", s.lib_a);
    let detail = c.get(&path).await;
    assert!(detail.body.contains("2 items"), "{}", detail.body);
    let r = c
        .post(
            "/admin/library/grant",
            &[("library_uid", &s.lib_a), ("username", "pat"), ("role", "owner")],
        )
        .await;
    assert_eq!(r.status, StatusCode::SEE_OTHER, "{}", r.body);
    let r = c
        .post(
            "/admin/library/grant",
            &[("library_uid", &s.lib_a), ("username", "lee"), ("role", "boss")],
        )
        .await;
    assert_eq!(r.status, StatusCode::BAD_REQUEST);
    let r = c
        .post(
            "/admin/library/revoke",
            &[("library_uid", &s.lib_a), ("username", "pat"), ("role", "owner")],
        )
        .await;
    assert_eq!(r.status, StatusCode::BAD_REQUEST, "the last owner stays");
    assert!(r.body.contains("at least one owner"));
    c.post(
        "/admin/library/grant",
        &[("library_uid", &s.lib_a), ("username", "lee"), ("role", "owner")],
    )
    .await;
    let r = c
        .post(
            "/admin/library/revoke",
            &[("library_uid", &s.lib_a), ("username", "pat"), ("role", "owner")],
        )
        .await;
    assert_eq!(r.status, StatusCode::SEE_OTHER);
    let m = users::memberships(&app.pg, None, Some(&s.lib_a)).await.unwrap();
    assert_eq!(m.iter().map(|m| m.username.as_str()).collect::<Vec<_>>(), ["lee"]);
    assert_eq!(
        audit_actions(&app, "admin:sam").await,
        ["membership_granted", "membership_granted", "membership_revoked"]
    );
}

#[tokio::test]
async fn on_the_self_service_page_an_owner_grants_any_role_and_a_manager_only_reader() {
    let app = TestApp::spawn().await;
    let lib = app.library("shared").await;
    person(&app, "olga").await;
    person(&app, "mona").await;
    person(&app, "rita").await;
    users::grant(&app.pg, "olga", &lib, Role::Owner).await.unwrap();
    users::grant(&app.pg, "mona", &lib, Role::Manager).await.unwrap();
    let mut mona = Console::signed_in(&app, "mona", STAFF_PASSWORD).await;
    let page = mona.get("/admin/me").await;
    assert!(page.body.contains("Libraries I own or manage"));
    assert!(
        !page.body.contains("<option value=\"manager\">"),
        "a manager is offered reader only"
    );
    let r = mona
        .post(
            "/admin/me/grant",
            &[("library_uid", &lib), ("username", "rita"), ("role", "manager")],
        )
        .await;
    assert_eq!(r.status, StatusCode::BAD_REQUEST);
    assert!(r.body.contains("a manager may not grant manager"), "{}", r.body);
    let r = mona
        .post(
            "/admin/me/grant",
            &[("library_uid", &lib), ("username", "rita"), ("role", "reader")],
        )
        .await;
    assert_eq!(r.location(), "/admin/me?ok=granted");
    let r = mona
        .post(
            "/admin/me/revoke",
            &[("library_uid", &lib), ("username", "olga"), ("role", "owner")],
        )
        .await;
    assert_eq!(r.status, StatusCode::BAD_REQUEST, "a manager cannot remove an owner");
    let mut olga = Console::signed_in(&app, "olga", STAFF_PASSWORD).await;
    let r = olga
        .post(
            "/admin/me/grant",
            &[("library_uid", &lib), ("username", "rita"), ("role", "manager")],
        )
        .await;
    assert_eq!(r.location(), "/admin/me?ok=granted");
    let r = olga
        .post(
            "/admin/me/revoke",
            &[("library_uid", &lib), ("username", "olga"), ("role", "owner")],
        )
        .await;
    assert_eq!(r.status, StatusCode::BAD_REQUEST);
    assert!(r.body.contains("at least one owner"));
    // rita, a reader and manager now, has no say on a library she has no role on.
    let other = app.library("other").await;
    let mut rita = Console::signed_in(&app, "rita", STAFF_PASSWORD).await;
    let r = rita
        .post(
            "/admin/me/grant",
            &[("library_uid", &other), ("username", "rita"), ("role", "owner")],
        )
        .await;
    assert_eq!(r.status, StatusCode::BAD_REQUEST);
    assert!(users::memberships(&app.pg, Some("rita"), Some(&other))
        .await
        .unwrap()
        .is_empty());
    assert_eq!(audit_actions(&app, "admin:mona").await, ["membership_granted"]);
}
