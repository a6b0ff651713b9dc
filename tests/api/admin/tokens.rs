//! Console and CLI tokens: the picker, minting, self-service, revocation across replicas.

use super::*;

#[tokio::test]
async fn the_token_picker_offers_only_libraries_the_user_owns_or_manages() {
    let app = TestApp::spawn().await;
    let (a, b, c_lib) = (
        app.library("own").await,
        app.library("managed").await,
        app.library("read").await,
    );
    person(&app, "pat").await;
    users::grant(&app.pg, "pat", &a, Role::Owner).await.unwrap();
    users::grant(&app.pg, "pat", &b, Role::Manager).await.unwrap();
    users::grant(&app.pg, "pat", &c_lib, Role::Reader).await.unwrap();
    staff(&app, "sam").await;
    let mut c = Console::signed_in(&app, "sam", STAFF_PASSWORD).await;
    let step1 = c.get("/admin/tokens/new").await;
    assert!(step1.body.contains("<option value=\"pat\">"), "{}", step1.body);
    let picker = c.get("/admin/tokens/new?user=pat").await;
    assert_eq!(picker.status, StatusCode::OK);
    assert!(picker.body.contains(&format!("value=\"{a}\"")));
    assert!(picker.body.contains(&format!("value=\"{b}\"")));
    assert!(
        !picker.body.contains(&format!("value=\"{c_lib}\"")),
        "reader role is not offered"
    );
    // A forged choice outside the picker is refused, naming the field; nothing is written.
    let r = c
        .post(
            "/admin/tokens",
            &[("user", "pat"), ("name", "x"), ("library", &a), ("library", &c_lib)],
        )
        .await;
    assert_eq!(r.status, StatusCode::BAD_REQUEST);
    assert!(r.body.contains("is not owner or manager of"), "{}", r.body);
    assert!(r.body.contains(&c_lib));
    assert!(plaintext_in(&r.body).is_none());
    let r = c
        .post(
            "/admin/tokens",
            &[("user", "pat"), ("library", &a), ("expires_at", "someday")],
        )
        .await;
    assert_eq!(r.status, StatusCode::BAD_REQUEST);
    assert!(r.body.contains("Expiry:"));
    assert!(mnemosyne::store::pg::tokens::list(&app.pg, Some("pat"))
        .await
        .unwrap()
        .is_empty());
}

#[tokio::test]
async fn a_minted_token_is_shown_exactly_once_works_on_mcp_and_is_refused_after_revoke() {
    let app = TestApp::spawn().await;
    let s = seed(&app).await;
    person(&app, "pat").await;
    users::grant(&app.pg, "pat", &s.lib_a, Role::Owner).await.unwrap();
    users::grant(&app.pg, "pat", &s.lib_c, Role::Manager).await.unwrap();
    staff(&app, "sam").await;
    let mut c = Console::signed_in(&app, "sam", STAFF_PASSWORD).await;
    c.get("/admin/tokens/new?user=pat").await;
    let r = c
        .post(
            "/admin/tokens",
            &[
                ("user", "pat"),
                ("name", "laptop"),
                ("library", &s.lib_c),
                ("library", &s.lib_a),
                ("expires_at", "2099-01-01T00:00"),
            ],
        )
        .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.body);
    let plaintext = plaintext_in(&r.body).expect("plaintext on the result page");
    assert_eq!(
        r.body.matches(&plaintext).count(),
        2,
        "once in the box, once in the client snippet"
    );
    for page in ["/admin/tokens", "/admin/audit", "/admin/search", "/admin/"] {
        assert!(
            !c.get(page).await.body.contains(&plaintext),
            "{page} shows the plaintext"
        );
    }
    let mut mcp = app.mcp(&plaintext).connect().await;
    assert_eq!(
        mcp.library_uids().await,
        [s.lib_c.clone(), s.lib_a.clone()],
        "picker order kept"
    );
    let hits = mcp.call_ok("search", json!({"query": "Zanzibarine"})).await;
    let libs: std::collections::BTreeSet<String> = hits["results"]
        .as_array()
        .unwrap()
        .iter()
        .map(|h| h["library_uid"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(libs, [s.lib_a.clone(), s.lib_c.clone()].into_iter().collect());
    let id = mnemosyne::store::pg::tokens::list(&app.pg, Some("pat")).await.unwrap()[0].id;
    let list = c.get("/admin/tokens").await;
    assert!(list.body.contains("laptop") && list.body.contains("2099-01-01"));
    let r = c.post("/admin/tokens/revoke", &[("id", &id.to_string())]).await;
    assert_eq!(r.status, StatusCode::SEE_OTHER);
    assert_eq!(r.location(), "/admin/tokens?ok=token-revoked");
    let refused = app.mcp(&plaintext).initialize().await;
    assert_eq!(refused.status, StatusCode::UNAUTHORIZED);
    assert_eq!(refused.json()["error_description"], "Invalid MCP token.");
    assert_eq!(
        audit_actions(&app, "admin:sam").await,
        ["token_created", "token_revoked"]
    );
    let detail: serde_json::Value =
        sqlx::query_scalar("SELECT detail FROM audit_events WHERE action = 'token_created'")
            .fetch_one(&app.pg)
            .await
            .unwrap();
    assert_eq!(detail["user"], "pat");
    assert!(!detail.to_string().contains("mnm_"));
}

#[tokio::test]
async fn a_token_without_libraries_is_allowed_and_reads_nothing() {
    let app = TestApp::spawn().await;
    seed(&app).await;
    person(&app, "pat").await;
    staff(&app, "sam").await;
    let mut c = Console::signed_in(&app, "sam", STAFF_PASSWORD).await;
    let r = c.post("/admin/tokens", &[("user", "pat"), ("name", "empty")]).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.body);
    let plaintext = plaintext_in(&r.body).unwrap();
    let mut mcp = app.mcp(&plaintext).connect().await;
    assert!(mcp.library_uids().await.is_empty());
}

#[tokio::test]
async fn the_self_service_page_mints_and_revokes_only_your_own_tokens() {
    let app = TestApp::spawn().await;
    let (a, b) = (app.library("mine").await, app.library("theirs").await);
    person(&app, "pat").await;
    person(&app, "lee").await;
    users::grant(&app.pg, "pat", &a, Role::Manager).await.unwrap();
    users::grant(&app.pg, "lee", &b, Role::Owner).await.unwrap();
    let lee_token = app_token(&app, "lee", &b).await;
    let mut c = Console::signed_in(&app, "pat", STAFF_PASSWORD).await;
    let me = c.get("/admin/me").await;
    assert!(me.body.contains(&format!("value=\"{a}\"")));
    assert!(!me.body.contains(&format!("value=\"{b}\"")));
    let r = c.post("/admin/me/tokens", &[("name", "cli"), ("library", &b)]).await;
    assert_eq!(r.status, StatusCode::BAD_REQUEST, "not theirs to scope");
    let r = c.post("/admin/me/tokens", &[("name", "cli"), ("library", &a)]).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.body);
    let plaintext = plaintext_in(&r.body).unwrap();
    assert_eq!(app.mcp(&plaintext).connect().await.library_uids().await, [a.clone()]);
    // lee's token is not on pat's page and cannot be revoked by pat.
    let me = c.get("/admin/me").await;
    assert!(me.body.contains("cli"));
    let lee_id = mnemosyne::store::pg::tokens::list(&app.pg, Some("lee")).await.unwrap()[0].id;
    let r = c.post("/admin/me/tokens/revoke", &[("id", &lee_id.to_string())]).await;
    assert_eq!(r.status, StatusCode::NOT_FOUND);
    assert_eq!(app.mcp(&lee_token).connect().await.library_uids().await, [b.clone()]);
    let own_id = mnemosyne::store::pg::tokens::list(&app.pg, Some("pat")).await.unwrap()[0].id;
    let r = c.post("/admin/me/tokens/revoke", &[("id", &own_id.to_string())]).await;
    assert_eq!(r.location(), "/admin/me?ok=token-revoked");
    assert_eq!(app.mcp(&plaintext).initialize().await.status, StatusCode::UNAUTHORIZED);
}

#[tokio::test]
async fn cli_token_create_without_a_library_and_json_output() {
    let app = TestApp::spawn().await;
    let run = |args: &[&str]| app.cli_ok(args);
    run(&["user", "create", "pat"]);
    let created: serde_json::Value =
        serde_json::from_str(&run(&["token", "create", "--user", "pat", "--json"])).unwrap();
    let token = created["token"].as_str().unwrap();
    assert!(token.starts_with("mnm_"));
    assert_eq!(created["libraries"], json!([]));
    assert!(app.mcp(token).connect().await.library_uids().await.is_empty());
    let listed: serde_json::Value = serde_json::from_str(&run(&["token", "list", "--json"])).unwrap();
    assert_eq!(listed[0]["user"], "pat");
    assert!(!listed.to_string().contains(token));
    let key: serde_json::Value = serde_json::from_str(&run(&["signing-key", "create", "--json"])).unwrap();
    assert_eq!(key["secret"].as_str().unwrap().len(), 64);
    let users: serde_json::Value = serde_json::from_str(&run(&["user", "list", "--json"])).unwrap();
    assert!(users
        .as_array()
        .unwrap()
        .iter()
        .any(|u| u["username"] == "pat" && u["staff"] == false));
    let lib = app.uid("lib");
    let granted: serde_json::Value =
        serde_json::from_str(&run(&["membership", "grant", "pat", &lib, "manager", "--json"])).unwrap();
    assert_eq!(
        granted,
        json!({"username": "pat", "library_uid": lib, "role": "manager", "granted": true})
    );
    assert_eq!(
        run(&["membership", "revoke", "pat", &lib, "manager"]).trim(),
        format!("revoked manager on {lib} from pat")
    );
    run(&["user", "set-staff", "pat"]);
    assert!(users::by_username(&app.pg, "pat").await.unwrap().unwrap().is_staff);
    run(&["user", "set-staff", "pat", "--off"]);
    assert!(!users::by_username(&app.pg, "pat").await.unwrap().unwrap().is_staff);
    assert_eq!(
        run(&["token", "create", "--user", "pat"]).lines().count(),
        2,
        "human format by default"
    );
}

#[tokio::test]
async fn a_console_revoke_applies_on_the_next_request_of_another_replica() {
    let app = TestApp::spawn().await;
    let lib = app.library("l").await;
    let other = app.second_instance().await;
    let token = app.opaque_token(&[lib.clone()]).await;
    let mut on_other = other.mcp(&token).connect().await;
    assert_eq!(
        on_other.library_uids().await,
        [lib.clone()],
        "cached on the other replica"
    );
    staff(&app, "sam").await;
    let mut c = Console::signed_in(&app, "sam", STAFF_PASSWORD).await;
    c.get("/admin/tokens").await;
    let id = mnemosyne::store::pg::tokens::list(&app.pg, None).await.unwrap()[0].id;
    let r = c.post("/admin/tokens/revoke", &[("id", &id.to_string())]).await;
    assert_eq!(
        r.location(),
        "/admin/tokens?ok=token-revoked",
        "fence confirmed by both replicas"
    );
    // No wait: the console answered after the fence.
    let refused = other.mcp(&token).initialize().await;
    assert_eq!(refused.status, StatusCode::UNAUTHORIZED);
}
