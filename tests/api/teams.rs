//! Team lifecycle REST, spec §7 and §14.1 / §14.3.

use reqwest::{Method, StatusCode};
use serde_json::{json, Value};
use uuid::Uuid;

use crate::helpers::{send, TestApp, SERVICE_PASSWORD, SERVICE_USER};
use crate::mcp::seed;

#[tokio::test]
async fn create_returns_201_with_a_jwt_once_and_200_without_it_after() {
    let app = TestApp::spawn().await;
    let id = Uuid::new_v4();
    for path in ["/mcp_server/api/teams/", "/mcp_server/api/teams"] {
        let (status, body) = send(
            app.service(Method::POST, path)
                .json(&json!({"id": id, "name": "Kottos"})),
        )
        .await;
        if path.ends_with('/') {
            assert_eq!(status, StatusCode::CREATED);
            assert_eq!(body["id"], id.to_string());
            assert_eq!(body["name"], "Kottos");
            let jwt = body["jwt"].as_str().unwrap();
            // spec §5.2 claims, HS256 with the newest key's kid
            let (kid, secret) = app.signing_key().await;
            assert_eq!(mnemosyne::auth::jwt::header_kid(jwt).unwrap(), kid);
            let c = mnemosyne::auth::jwt::verify_signature(jwt, &secret).unwrap();
            assert_eq!(c.iss, Some(json!("mnemosyne")));
            assert_eq!(c.aud, Some(json!("mnemosyne")));
            assert_eq!(c.typ, Some(json!("team")));
            assert_eq!(c.sub, Some(json!(format!("team:{id}"))));
            let ten_years = c.exp.unwrap().as_i64().unwrap() - c.iat.unwrap().as_i64().unwrap();
            assert!(ten_years >= 10 * 365 * 86400, "{ten_years}");
        } else {
            assert_eq!(status, StatusCode::OK, "idempotent create");
            assert_eq!(body, json!({"id": id, "name": "Kottos"}));
        }
    }
}

#[tokio::test]
async fn idempotent_create_of_an_inactive_team_returns_it_without_a_jwt() {
    let app = TestApp::spawn().await;
    let (id, _) = app.create_team("Kottos").await;
    app.service(Method::DELETE, &format!("/mcp_server/api/teams/{id}/"))
        .send()
        .await
        .unwrap();
    let (status, body) = send(
        app.service(Method::POST, "/mcp_server/api/teams/")
            .json(&json!({"id": id, "name": "Kottos"})),
    )
    .await;
    assert_eq!(status, StatusCode::OK);
    assert!(body.get("jwt").is_none());
}

#[tokio::test]
async fn detail_shows_state_without_a_jwt() {
    let app = TestApp::spawn().await;
    let (id, _) = app.create_team("Kottos").await;
    app.put_workspaces(id, &["ws_b".into(), "ws_a".into()]).await;
    for path in [
        format!("/mcp_server/api/teams/{id}/"),
        format!("/mcp_server/api/teams/{id}"),
    ] {
        let (status, body) = send(app.service(Method::GET, &path)).await;
        assert_eq!(status, StatusCode::OK);
        assert_eq!(body["id"], id.to_string());
        assert_eq!(body["name"], "Kottos");
        assert_eq!(body["active"], true);
        assert!(Uuid::parse_str(body["active_jti"].as_str().unwrap()).is_ok());
        assert_eq!(body["workspace_ids"], json!(["ws_b", "ws_a"]));
        assert!(body.get("jwt").is_none());
    }
}

#[tokio::test]
async fn put_workspaces_replaces_never_unions_and_is_idempotent() {
    let app = TestApp::spawn().await;
    let (id, _) = app.create_team("Kottos").await;
    assert_eq!(
        app.put_workspaces(id, &["a".into(), "b".into()]).await,
        json!({"workspace_ids": ["a", "b"]})
    );
    assert_eq!(
        app.put_workspaces(id, &["c".into()]).await,
        json!({"workspace_ids": ["c"]})
    );
    assert_eq!(
        app.put_workspaces(id, &["c".into()]).await,
        json!({"workspace_ids": ["c"]})
    );
    assert_eq!(
        app.put_workspaces(id, &["d".into(), "d".into(), "c".into()]).await,
        json!({"workspace_ids": ["d", "c"]})
    );
    assert_eq!(app.put_workspaces(id, &[]).await, json!({"workspace_ids": []}));
    // without the trailing slash too
    let (status, body) = send(
        app.service(Method::PUT, &format!("/mcp_server/api/teams/{id}/workspaces"))
            .json(&json!({"workspace_ids": ["x"]})),
    )
    .await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(body, json!({"workspace_ids": ["x"]}));
}

#[tokio::test]
async fn concurrent_puts_end_in_one_submitted_set() {
    let app = TestApp::spawn().await;
    let (id, _) = app.create_team("Kottos").await;
    let sets: Vec<Vec<String>> = (0..8)
        .map(|i| (0..20).map(|j| format!("ws_{i}_{j}")).collect())
        .collect();
    let futs = sets.iter().map(|s| {
        app.service(Method::PUT, &format!("/mcp_server/api/teams/{id}/workspaces/"))
            .json(&json!({"workspace_ids": s}))
            .send()
    });
    for r in futures::future::join_all(futs).await {
        assert_eq!(r.unwrap().status(), StatusCode::OK);
    }
    let (_, body) = send(app.service(Method::GET, &format!("/mcp_server/api/teams/{id}/"))).await;
    let got: Vec<String> = serde_json::from_value(body["workspace_ids"].clone()).unwrap();
    assert!(sets.contains(&got), "a mix of sets: {got:?}");
}

#[tokio::test]
async fn rotate_gives_a_new_jwt_and_the_old_one_stops() {
    let app = TestApp::spawn().await;
    let (id, old) = app.create_team("Kottos").await;
    let (status, body) = send(app.service(Method::POST, &format!("/mcp_server/api/teams/{id}/rotate/"))).await;
    assert_eq!(status, StatusCode::OK);
    let new = body["jwt"].as_str().unwrap();
    assert_ne!(new, old);
    assert_eq!(app.mcp(&old).initialize().await.status, StatusCode::UNAUTHORIZED);
    assert_eq!(app.mcp(new).initialize().await.status, StatusCode::OK);
}

#[tokio::test]
async fn rotate_of_an_inactive_team_is_409_and_unknown_ids_are_404() {
    let app = TestApp::spawn().await;
    let (id, _) = app.create_team("Kottos").await;
    let r = app
        .service(Method::DELETE, &format!("/mcp_server/api/teams/{id}/"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::NO_CONTENT);
    let (status, body) = send(app.service(Method::POST, &format!("/mcp_server/api/teams/{id}/rotate/"))).await;
    assert_eq!(status, StatusCode::CONFLICT);
    assert_eq!(body["error"], "conflict");
    let unknown = Uuid::new_v4();
    for (m, p) in [
        (Method::GET, format!("/mcp_server/api/teams/{unknown}/")),
        (Method::DELETE, format!("/mcp_server/api/teams/{unknown}/")),
        (Method::POST, format!("/mcp_server/api/teams/{unknown}/rotate/")),
    ] {
        let (status, body) = send(app.service(m.clone(), &p)).await;
        assert_eq!(status, StatusCode::NOT_FOUND, "{m} {p}");
        assert_eq!(body["error"], "not_found");
    }
    let (status, _) = send(
        app.service(Method::PUT, &format!("/mcp_server/api/teams/{unknown}/workspaces/"))
            .json(&json!({"workspace_ids": []})),
    )
    .await;
    assert_eq!(status, StatusCode::NOT_FOUND);
}

#[tokio::test]
async fn bad_input_is_400_naming_the_field() {
    let app = TestApp::spawn().await;
    let cases: Vec<(Method, String, Value, &str)> = vec![
        (
            Method::POST,
            "/mcp_server/api/teams/".into(),
            json!({"id": "not-a-uuid", "name": "K"}),
            "id",
        ),
        (
            Method::POST,
            "/mcp_server/api/teams/".into(),
            json!({"id": Uuid::new_v4(), "name": ""}),
            "name",
        ),
        (
            Method::POST,
            "/mcp_server/api/teams/".into(),
            json!({"id": Uuid::new_v4(), "name": "x".repeat(201)}),
            "name",
        ),
        (
            Method::POST,
            "/mcp_server/api/teams/".into(),
            json!({"id": Uuid::new_v4()}),
            "name",
        ),
        (
            Method::POST,
            "/mcp_server/api/teams/".into(),
            json!({"id": Uuid::new_v4(), "name": 5}),
            "name",
        ),
        (Method::GET, "/mcp_server/api/teams/nope/".into(), Value::Null, "id"),
    ];
    for (m, p, body, field) in cases {
        let mut req = app.service(m.clone(), &p);
        if !body.is_null() {
            req = req.json(&body);
        }
        let (status, out) = send(req).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{p} {body}: {out}");
        assert_eq!(out["field"], field, "{p} {body}: {out}");
    }
    let (id, _) = app.create_team("Kottos").await;
    let path = format!("/mcp_server/api/teams/{id}/workspaces/");
    for (body, field) in [
        (json!({"workspace_ids": [""]}), "workspace_ids[0]"),
        (json!({"workspace_ids": ["ok", "x".repeat(65)]}), "workspace_ids[1]"),
        (json!({"workspace_ids": "ws"}), "workspace_ids"),
        (json!({}), "workspace_ids"),
        (
            json!({"workspace_ids": (0..1001).map(|i| format!("w{i}")).collect::<Vec<_>>()}),
            "workspace_ids",
        ),
    ] {
        let (status, out) = send(app.service(Method::PUT, &path).json(&body)).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{out}");
        assert_eq!(out["field"], field, "{out}");
    }
    // invalid JSON
    let (status, out) = send(
        app.service(Method::POST, "/mcp_server/api/teams/")
            .header("content-type", "application/json")
            .body("{oops"),
    )
    .await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert_eq!(out["error"], "bad_request");
}

#[tokio::test]
async fn basic_auth_failures() {
    let app = TestApp::spawn().await;
    let path = "/mcp_server/api/teams/";
    let body = json!({"id": Uuid::new_v4(), "name": "K"});
    // missing
    let r = app.http.post(app.url(path)).json(&body).send().await.unwrap();
    assert_eq!(r.status(), StatusCode::UNAUTHORIZED);
    assert_eq!(r.headers()["www-authenticate"], "Basic realm=\"mnemosyne\"");
    assert_eq!(r.json::<Value>().await.unwrap()["error"], "unauthorized");
    // wrong password, unknown user, garbage header
    for (u, p) in [(SERVICE_USER, "wrong"), ("nobody", SERVICE_PASSWORD)] {
        let r = app
            .http
            .post(app.url(path))
            .basic_auth(u, Some(p))
            .json(&body)
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), StatusCode::UNAUTHORIZED, "{u}");
        assert_eq!(r.headers()["www-authenticate"], "Basic realm=\"mnemosyne\"");
    }
    let r = app
        .http
        .post(app.url(path))
        .header("authorization", "Basic !!!")
        .json(&body)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::UNAUTHORIZED);
    // a valid user who is not a service account
    let hash = mnemosyne::auth::basic::hash_password("a-person-password").unwrap();
    mnemosyne::store::pg::users::create(&app.pg, "alice", Some(&hash), false)
        .await
        .unwrap();
    let r = app
        .http
        .post(app.url(path))
        .basic_auth("alice", Some("a-person-password"))
        .json(&body)
        .send()
        .await
        .unwrap();
    // indistinguishable from a wrong password (issue 12: no answer tells them apart)
    assert_eq!(r.status(), StatusCode::UNAUTHORIZED);
    // a disabled service account
    mnemosyne::store::pg::users::set_active(&app.pg, SERVICE_USER, false)
        .await
        .unwrap();
    tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    let r = app.service(Method::POST, path).json(&body).send().await.unwrap();
    assert_eq!(r.status(), StatusCode::UNAUTHORIZED);
    // nothing was created by any refused call
    let n: i64 = sqlx::query_scalar("SELECT count(*) FROM teams")
        .fetch_one(&app.pg)
        .await
        .unwrap();
    assert_eq!(n, 0);
}

#[tokio::test]
async fn every_change_writes_an_audit_event_without_the_jwt() {
    let app = TestApp::spawn().await;
    let (id, jwt) = app.create_team("Kottos").await;
    app.put_workspaces(id, &["ws".into()]).await;
    let rotated: Value = app
        .service(Method::POST, &format!("/mcp_server/api/teams/{id}/rotate/"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    app.service(Method::DELETE, &format!("/mcp_server/api/teams/{id}/"))
        .send()
        .await
        .unwrap();
    let rows: Vec<(String, String, String, String)> = sqlx::query_as(
        "SELECT actor::text, action::text, target::text, row_to_json(a)::text FROM audit_events a ORDER BY id",
    )
    .fetch_all(&app.pg)
    .await
    .unwrap();
    let actions: Vec<&str> = rows.iter().map(|r| r.1.as_str()).collect();
    assert_eq!(
        actions,
        [
            "team_created",
            "team_workspaces_updated",
            "team_rotated",
            "team_deleted"
        ]
    );
    for (actor, _, target, row) in &rows {
        assert_eq!(actor, SERVICE_USER);
        assert_eq!(target, &id.to_string());
        assert!(!row.contains(&jwt) && !row.contains(rotated["jwt"].as_str().unwrap()));
    }
}

#[tokio::test]
async fn end_to_end_team_sees_exactly_its_attached_workspaces() {
    // spec §14.3, second and third bullets
    let app = TestApp::spawn().await;
    let s = seed(&app).await;
    let (id, jwt) = app.create_team("Kottos").await;
    app.put_workspaces(id, &[s.ws_a.clone(), app.uid("ws_not_yet")]).await;
    let mut c = app.mcp(&jwt).connect().await;
    assert_eq!(c.library_uids().await, vec![s.lib_a.clone()]);
    let out = c.call_ok("search", json!({"query": "zanzibarine"})).await;
    assert!(out["results"]
        .as_array()
        .unwrap()
        .iter()
        .all(|r| r["library_uid"] == s.lib_a.as_str()));
    // a workspace that gets its library later becomes visible on the next request
    app.ingest_ws(&app.uid("ws_not_yet"), "Late", "arrives later zanzibarine")
        .await;
    assert_eq!(c.library_uids().await.len(), 2);
    // detach
    app.put_workspaces(id, &[]).await;
    assert!(c.library_uids().await.is_empty());
}

#[tokio::test]
async fn retiring_the_signing_key_invalidates_team_jwts() {
    let app = TestApp::spawn().await;
    let (_, jwt) = app.create_team("Kottos").await;
    let (kid, _) = app.signing_key().await;
    assert_eq!(app.mcp(&jwt).initialize().await.status, StatusCode::OK);
    app.cli_ok(&["signing-key", "retire", &kid]);
    tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    let ex = app.mcp(&jwt).initialize().await;
    assert_eq!(ex.status, StatusCode::UNAUTHORIZED);
    assert_eq!(ex.json()["error_description"], "Invalid MCP token.");
}

#[tokio::test]
async fn signing_key_cli_prints_the_secret_once_and_list_never() {
    let app = TestApp::spawn().await;
    let run = |args: &[&str]| app.cli_ok(args);
    let created = run(&["signing-key", "create"]);
    let secret = created
        .lines()
        .find_map(|l| l.strip_prefix("secret: "))
        .unwrap()
        .trim()
        .to_owned();
    assert_eq!(secret.len(), 64);
    let listed = run(&["signing-key", "list"]);
    assert!(!listed.contains(&secret));
    assert_eq!(listed.lines().count(), 3, "{listed}");
}

#[tokio::test]
async fn user_create_service_reads_the_password_from_stdin() {
    use std::io::Write;
    let app = TestApp::spawn().await;
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_mnemosyne"))
        .args(["user", "create", "svc2", "--service", "--password-stdin"])
        .env("MNEMOSYNE_DATABASE_URL", &app.settings.database_url)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(b"another-long-password\n")
        .unwrap();
    assert!(child.wait().unwrap().success());
    let r = app
        .http
        .get(app.url(&format!("/mcp_server/api/teams/{}/", Uuid::new_v4())))
        .basic_auth("svc2", Some("another-long-password"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::NOT_FOUND, "authenticated, then 404");
}

/// Hardening 3, row 9: every REST answer that can carry a JWT (create 201,
/// rotate) — and every other answer of the service APIs — is never cached.
#[tokio::test]
async fn responses_that_carry_secrets_are_never_cacheable() {
    let app = TestApp::spawn().await;
    let id = uuid::Uuid::new_v4();
    let team = format!("/mcp_server/api/teams/{id}/");
    let walk = [
        (
            Method::POST,
            "/mcp_server/api/teams/".to_owned(),
            Some(json!({"id": id, "name": "Kottos"})),
        ),
        (
            Method::POST,
            "/mcp_server/api/teams/".to_owned(),
            Some(json!({"id": id, "name": "Kottos"})),
        ),
        (Method::POST, format!("{team}rotate/"), None),
        (Method::GET, team.clone(), None),
        (
            Method::PUT,
            format!("{team}workspaces/"),
            Some(json!({"workspace_ids": []})),
        ),
        (
            Method::POST,
            "/library/api/libraries/".to_owned(),
            Some(json!({"name": "Secrets"})),
        ),
        (Method::DELETE, team.clone(), None),
    ];
    let mut carried_jwt = 0;
    for (method, path, body) in walk {
        let mut req = app.service(method.clone(), &path);
        if let Some(b) = body {
            req = req.json(&b);
        }
        let r = req.send().await.unwrap();
        assert!(r.status().is_success(), "{method} {path}: {}", r.status());
        assert_eq!(
            r.headers().get("cache-control").map(|v| v.to_str().unwrap()),
            Some("no-store"),
            "{method} {path}"
        );
        let text = r.text().await.unwrap();
        if text.contains("\"jwt\"") {
            carried_jwt += 1;
        }
    }
    assert_eq!(carried_jwt, 2, "create (201) and rotate carried a JWT");
}
