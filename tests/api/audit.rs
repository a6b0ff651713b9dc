//! The audit trail (issue 23, item 3): graph changes audited right after they
//! commit (an unchanged ingest is not), console sign-in and sign-out, the
//! surface of every event, `mnemosyne audit list|export`, and retention.

use reqwest::{Method, StatusCode};
use serde_json::{json, Value};

use crate::admin::{staff, Console, STAFF_PASSWORD};
use crate::helpers::{send, TestApp, SERVICE_USER};

#[derive(Debug, sqlx::FromRow)]
struct Event {
    actor: String,
    surface: String,
    action: String,
    target: Option<String>,
    detail: Value,
}

async fn events(app: &TestApp) -> Vec<Event> {
    sqlx::query_as(
        "SELECT actor::text AS actor, surface, action::text AS action, target::text AS target, detail
           FROM audit_events ORDER BY id",
    )
    .fetch_all(&app.pg)
    .await
    .unwrap()
}

#[tokio::test]
async fn graph_changes_are_audited_after_commit_and_an_unchanged_ingest_is_not() {
    let app = TestApp::spawn().await;
    let ws = app.uid("ws");
    let secret_text = "The okapi hides in the forest of Ituri.";
    let first = app
        .ingest(json!({"workspace_id": ws, "item": {"uid": app.uid("item"), "title": "Okapi"}, "content": secret_text}))
        .await;
    let (lib, item) = (
        first["library_uid"].as_str().unwrap().to_owned(),
        first["item_uid"].as_str().unwrap().to_owned(),
    );
    // The same content again changes nothing and writes no event.
    app.ingest(json!({"workspace_id": ws, "item": {"uid": item, "title": "Okapi"}, "content": secret_text}))
        .await;
    app.ingest(json!({"workspace_id": ws, "item": {"uid": item, "title": "Okapi"}, "content": "Now two okapis."}))
        .await;
    let (status, _) = send(app.service(Method::DELETE, &format!("/library/api/items/{item}/"))).await;
    assert_eq!(status, StatusCode::NO_CONTENT);
    let own = app.library("own").await;
    let (status, _) = send(app.service(Method::DELETE, &format!("/library/api/workspaces/{ws}/"))).await;
    assert_eq!(status, StatusCode::NO_CONTENT);

    let all = events(&app).await;
    let seen: Vec<(&str, &str)> = all
        .iter()
        .map(|e| (e.action.as_str(), e.target.as_deref().unwrap_or("")))
        .collect();
    assert_eq!(
        seen,
        vec![
            ("library_created", lib.as_str()),
            ("item_created", item.as_str()),
            ("item_replaced", item.as_str()),
            ("item_deleted", item.as_str()),
            ("library_created", own.as_str()),
            ("workspace_deleted", ws.as_str()),
        ]
    );
    assert!(
        all.iter().all(|e| e.actor == SERVICE_USER && e.surface == "rest"),
        "{all:?}"
    );
    assert_eq!(all[0].detail, json!({"workspace_id": ws, "by": "ingest"}));
    assert_eq!(
        all[1].detail,
        json!({"library_uid": lib, "collection_uid": first["collection_uid"], "chunk_count": 1})
    );
    assert_eq!(all[4].detail, json!({"name": "own", "language": "en"}));
    for e in &all {
        let d = e.detail.to_string();
        assert!(
            !d.contains("okapi") && !d.contains(SERVICE_USER),
            "no content, no credential: {d}"
        );
    }

    assert_eq!(all[5].detail["deleted_from_graph"], json!([lib]));
}

#[tokio::test]
async fn console_sign_in_failures_and_sign_out_are_audited_without_what_was_typed() {
    let app = TestApp::spawn().await;
    let name = staff(&app, &app.uid("ann")).await;
    let mut wrong = Console::new(&app);
    let r = wrong.sign_in(&name, "not-the-password").await;
    assert_eq!(r.status, StatusCode::UNAUTHORIZED);
    let typed_secret = "hunter2-typed-into-the-username-field";
    let r = wrong.sign_in(typed_secret, "whatever-password").await;
    assert_eq!(r.status, StatusCode::UNAUTHORIZED);
    let mut c = Console::signed_in(&app, &name, STAFF_PASSWORD).await;
    let out = c.post("/admin/logout", &[]).await;
    assert_eq!(out.status, StatusCode::SEE_OTHER);

    let actor = format!("admin:{name}");
    let got: Vec<(String, String, String, Value)> = events(&app)
        .await
        .into_iter()
        .filter(|e| e.action.starts_with("console_"))
        .map(|e| (e.actor, e.surface, e.action, e.detail))
        .collect();
    assert_eq!(
        got,
        vec![
            (
                actor.clone(),
                "console".into(),
                "console_sign_in_failed".into(),
                json!({"reason": "wrong_password", "known_user": true})
            ),
            (
                "admin:?".into(),
                "console".into(),
                "console_sign_in_failed".into(),
                json!({"reason": "wrong_password", "known_user": false})
            ),
            (actor.clone(), "console".into(), "console_signed_in".into(), json!({})),
            (actor.clone(), "console".into(), "console_signed_out".into(), json!({})),
        ]
    );
    let dump: String = sqlx::query_scalar("SELECT string_agg(audit_events::text, ' ') FROM audit_events")
        .fetch_one(&app.pg)
        .await
        .unwrap();
    assert!(!dump.contains(typed_secret) && !dump.contains(STAFF_PASSWORD), "{dump}");

    // The console's audit page filters by surface.
    let mut c = Console::signed_in(&app, &name, STAFF_PASSWORD).await;
    let page = c.get("/admin/audit?surface=console&action=console_signed_out").await;
    assert_eq!(page.status, StatusCode::OK);
    assert!(page.body.contains("console_signed_out"), "{}", page.body);
    let page = c.get("/admin/audit?surface=cli").await;
    assert!(page.body.contains("No events."), "{}", page.body);
}

#[tokio::test]
async fn cli_audit_list_filters_and_export_writes_every_event_as_json_lines() {
    let app = TestApp::spawn().await;
    assert!(app.cli(&["user", "create", "pat"]).0);
    assert!(app.cli(&["user", "disable", "pat"]).0);
    app.library("listed").await;

    let (ok, out, err) = app.cli(&["--json", "audit", "list", "--since", "1h", "--surface", "cli"]);
    assert!(ok, "{err}");
    let listed: Vec<Value> = serde_json::from_str(&out).unwrap();
    let actions: Vec<&str> = listed.iter().map(|e| e["action"].as_str().unwrap()).collect();
    assert_eq!(actions, ["user_disabled", "user_created"], "newest first");
    assert!(listed.iter().all(|e| e["actor"] == "cli" && e["surface"] == "cli"));
    let (ok, out, _) = app.cli(&["--json", "audit", "list", "--action", "library_created"]);
    assert!(ok);
    let listed: Vec<Value> = serde_json::from_str(&out).unwrap();
    assert_eq!(listed.len(), 1);
    assert_eq!(listed[0]["surface"], "rest");
    let (ok, out, _) = app.cli(&["audit", "list", "--actor", "cli"]);
    assert!(
        ok && out.contains("user_created") && !out.contains("library_created"),
        "{out}"
    );

    let (ok, out, err) = app.cli(&["audit", "export", "--since", "2000-01-01"]);
    assert!(ok, "{err}");
    let lines: Vec<Value> = out.lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    let total: i64 = sqlx::query_scalar("SELECT count(*) FROM audit_events")
        .fetch_one(&app.pg)
        .await
        .unwrap();
    assert_eq!(lines.len() as i64, total);
    let ids: Vec<i64> = lines.iter().map(|l| l["id"].as_i64().unwrap()).collect();
    assert!(ids.windows(2).all(|w| w[0] < w[1]), "oldest first: {ids:?}");
    assert!(err.contains(&format!("{total} audit event(s) exported")), "{err}");
    let (ok, out, _) = app.cli(&["audit", "export", "--since", "1h", "--action", "user_disabled"]);
    assert!(ok);
    assert_eq!(out.lines().count(), 1);

    let (ok, _, err) = app.cli(&["audit", "export", "--since", "last tuesday"]);
    assert!(!ok && err.contains("--since \"last tuesday\""), "{err}");
}

#[tokio::test]
async fn events_past_retention_are_swept_when_a_replica_starts_and_on_its_timer() {
    let app = TestApp::spawn_with(|s| s.audit_retention_days = 0).await;
    let insert = |days: i32, target: &'static str| {
        let pg = app.pg.clone();
        async move {
            sqlx::query(
                "INSERT INTO audit_events (at, actor, action, target, surface)
                 VALUES (now() - make_interval(days => $1), 'cli', 'test_event', $2, 'cli')",
            )
            .bind(days)
            .bind(target)
            .execute(&pg)
            .await
            .unwrap();
        }
    };
    insert(500, "old").await;
    insert(399, "kept").await;
    let targets = || async {
        sqlx::query_scalar::<_, String>(
            "SELECT target::text FROM audit_events WHERE action = 'test_event' ORDER BY target",
        )
        .fetch_all(&app.pg)
        .await
        .unwrap()
    };
    // Kept for ever with 0.
    assert_eq!(mnemosyne::service::audit::sweep(&app.pg, 0).await.unwrap(), 0);
    assert_eq!(targets().await, ["kept", "old"]);

    // A replica with the default (400 days) sweeps as it starts.
    let mut settings = app.settings.clone();
    settings.audit_retention_days = crate::helpers::base_settings().audit_retention_days;
    assert_eq!(settings.audit_retention_days, 400);
    let _replica = app.replica_with(settings).await;
    let mut left = targets().await;
    for _ in 0..100 {
        if left == ["kept"] {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        left = targets().await;
    }
    assert_eq!(left, ["kept"]);
    insert(30, "recent").await;
    assert_eq!(mnemosyne::service::audit::sweep(&app.pg, 10).await.unwrap(), 2);
    assert!(targets().await.is_empty());
}
