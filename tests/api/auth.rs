//! Bearer resolution: DESIGN §3 and spec §6.4 / §14.1, end to end over /mcp.

use std::time::Duration;

use reqwest::StatusCode;
use serde_json::{json, Value};
use uuid::Uuid;

use crate::helpers::Capture;
use crate::helpers::{McpClient, TestApp};
use crate::mcp::seed;

fn counter(metrics: &str, reason: &str) -> u64 {
    let needle = format!("mcp_auth_failures_total{{reason=\"{reason}\"}} ");
    metrics
        .lines()
        .find_map(|l| l.strip_prefix(&needle))
        .map(|v| v.trim().parse().unwrap())
        .unwrap_or(0)
}

/// Asserts the exact 401 of DESIGN §3 and that the reason counter moved by one.
async fn assert_refused(app: &TestApp, bearer: &str, message: &str, reason: &str) {
    let before = counter(&app.metrics().await, reason);
    let mut c = app.mcp(bearer);
    let ex = c.initialize().await;
    assert_eq!(ex.status, StatusCode::UNAUTHORIZED, "{message}: {ex:?}");
    // The embedded authorization server (on by default) adds where its
    // metadata is; the spec's strings stay exactly as they were.
    let mut rm = match app.settings.resource_authorization_server() {
        Some(_) => format!(
            ", resource_metadata=\"{}/.well-known/oauth-protected-resource\"",
            app.settings.public_url.trim_end_matches('/')
        ),
        None => String::new(),
    };
    // The scope hint, when this server issues the tokens (its one scope).
    if app.settings.oauth_issuer().is_some() {
        rm.push_str(", scope=\"mcp\"");
    }
    assert_eq!(
        ex.headers["www-authenticate"].to_str().unwrap(),
        format!("Bearer error=\"invalid_token\", error_description=\"{message}\"{rm}")
    );
    assert_eq!(
        ex.json(),
        json!({"error": "invalid_token", "error_description": message})
    );
    let after = counter(&app.metrics().await, reason);
    assert_eq!(after, before + 1, "mcp_auth_failures_total{{reason=\"{reason}\"}}");
}

async fn libs_of(app: &TestApp, bearer: &str) -> Vec<String> {
    app.mcp(bearer).connect().await.library_uids().await
}

#[tokio::test]
async fn missing_header_is_401_with_a_bare_bearer_challenge_without_oauth() {
    let app = TestApp::spawn_with(|s| s.oauth = false).await;
    let mut c = app.mcp("");
    let ex = c.initialize().await;
    assert_eq!(ex.status, StatusCode::UNAUTHORIZED);
    assert_eq!(ex.headers["www-authenticate"], "Bearer");
    assert_eq!(ex.json()["error"], "invalid_request");
}

#[tokio::test]
async fn challenge_carries_resource_metadata_when_an_authorization_server_is_configured() {
    let app = TestApp::spawn_with(|s| s.authorization_server = Some("https://auth.example".into())).await;
    let ex = app.mcp("").initialize().await;
    let ch = ex.headers["www-authenticate"].to_str().unwrap().to_owned();
    assert_eq!(
        ch, "Bearer resource_metadata=\"http://127.0.0.1:0/.well-known/oauth-protected-resource\"",
        "no scope hint: the scopes are the external server's"
    );
    let (status, body) = crate::helpers::send(app.http.get(app.url("/.well-known/oauth-protected-resource"))).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(body["authorization_servers"], json!(["https://auth.example"]));
}

#[tokio::test]
async fn protected_resource_metadata_is_absent_without_an_authorization_server() {
    let app = TestApp::spawn_with(|s| s.oauth = false).await;
    let r = app
        .http
        .get(app.url("/.well-known/oauth-protected-resource"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::NOT_FOUND);
}

// ---- opaque tokens (spec §6.1) ----

#[tokio::test]
async fn opaque_token_resolves_to_allowed_libraries_in_order() {
    let app = TestApp::spawn().await;
    let s = seed(&app).await;
    let token = app
        .opaque_token(&[s.lib_c.clone(), s.lib_a.clone(), s.lib_b.clone()])
        .await;
    assert_eq!(libs_of(&app, &token).await, vec![s.lib_c, s.lib_a, s.lib_b]);
}

#[tokio::test]
async fn opaque_token_with_empty_allowed_libraries_resolves_to_nothing() {
    let app = TestApp::spawn().await;
    seed(&app).await;
    let token = app.opaque_token(&[]).await;
    assert!(libs_of(&app, &token).await.is_empty());
}

#[tokio::test]
async fn opaque_token_unknown_is_invalid() {
    let app = TestApp::spawn().await;
    assert_refused(&app, "mnm_not-a-real-token", "Invalid MCP token.", "token_not_found").await;
}

#[tokio::test]
async fn opaque_token_revoked_is_invalid_on_the_next_request_of_a_live_session() {
    let app = TestApp::spawn().await;
    let token = app.opaque_token(&[]).await;
    let mut c = app.mcp(&token).connect().await;
    assert_eq!(c.list_tools().await.status, StatusCode::OK);
    sqlx::query("UPDATE mcp_tokens SET active = FALSE")
        .execute(&app.pg)
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(100)).await; // NOTIFY delivery
    let ex = c.list_tools().await;
    assert_eq!(ex.status, StatusCode::UNAUTHORIZED);
    assert_eq!(ex.json()["error_description"], "Invalid MCP token.");
    assert_refused(&app, &token, "Invalid MCP token.", "token_not_found").await;
}

#[tokio::test]
async fn opaque_token_expired_is_invalid() {
    let app = TestApp::spawn().await;
    let token = app.opaque_token(&[]).await;
    sqlx::query("UPDATE mcp_tokens SET expires_at = now() - interval '1 second'")
        .execute(&app.pg)
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_refused(&app, &token, "Invalid MCP token.", "token_not_found").await;
}

#[tokio::test]
async fn opaque_token_of_a_disabled_user_is_refused() {
    let app = TestApp::spawn().await;
    let token = app.opaque_token(&[]).await;
    assert!(libs_of(&app, &token).await.is_empty()); // warm the cache
    sqlx::query("UPDATE users SET active = FALSE WHERE NOT is_service")
        .execute(&app.pg)
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_refused(&app, &token, "User account is disabled.", "user_disabled").await;
}

#[tokio::test]
async fn only_the_hash_of_an_opaque_token_is_stored_and_last_used_is_recorded() {
    let app = TestApp::spawn().await;
    let token = app.opaque_token(&[]).await;
    let stored: String = sqlx::query_scalar("SELECT token_hash FROM mcp_tokens")
        .fetch_one(&app.pg)
        .await
        .unwrap();
    assert_ne!(stored, token);
    assert_eq!(stored, mnemosyne::auth::resolver::token_hash(&token));
    let dump: String = sqlx::query_scalar("SELECT row_to_json(t)::text FROM mcp_tokens t")
        .fetch_one(&app.pg)
        .await
        .unwrap();
    assert!(!dump.contains(&token));
    libs_of(&app, &token).await;
    app.state.auth.flush_token_usage().await;
    let used: Option<chrono::DateTime<chrono::Utc>> = sqlx::query_scalar("SELECT last_used_at FROM mcp_tokens")
        .fetch_one(&app.pg)
        .await
        .unwrap();
    assert!(used.is_some());
}

// ---- JWT rules ----

fn claims_per_turn(libs: &[String]) -> Value {
    let now = chrono::Utc::now().timestamp();
    json!({"iss": "daedalus", "aud": "mnemosyne", "sub": "daedalus-chat", "iat": now, "exp": now + 300,
           "jti": Uuid::new_v4().to_string(), "libs": libs})
}

#[tokio::test]
async fn per_turn_jwt_resolves_libs_claim_deduplicated_in_order() {
    let app = TestApp::spawn().await;
    let s = seed(&app).await;
    let jwt = app
        .sign(claims_per_turn(&[s.lib_b.clone(), s.lib_a.clone(), s.lib_b.clone()]))
        .await;
    assert_eq!(libs_of(&app, &jwt).await, vec![s.lib_b, s.lib_a]);
}

#[tokio::test]
async fn per_turn_jwt_without_libs_resolves_to_nothing() {
    let app = TestApp::spawn().await;
    seed(&app).await;
    let mut c = claims_per_turn(&[]);
    c.as_object_mut().unwrap().remove("libs");
    let jwt = app.sign(c).await;
    assert!(libs_of(&app, &jwt).await.is_empty());
}

#[tokio::test]
async fn jwt_failure_rows_have_exact_messages_and_reasons() {
    let app = TestApp::spawn().await;
    let now = chrono::Utc::now().timestamp();
    let (kid, secret) = app.signing_key().await;
    let with = |k: &str, v: Value| {
        let mut c = claims_per_turn(&[]);
        c[k] = v;
        c
    };
    // bad signature
    let forged = mnemosyne::auth::jwt::sign_hs256(&claims_per_turn(&[]), &kid, &[9u8; 32]).unwrap();
    assert_refused(&app, &forged, "Invalid MCP token.", "invalid_token").await;
    // unknown kid
    let unknown = mnemosyne::auth::jwt::sign_hs256(&claims_per_turn(&[]), "no-such-kid", &secret).unwrap();
    assert_refused(&app, &unknown, "Invalid MCP token.", "invalid_token").await;
    // malformed
    assert_refused(
        &app,
        "eyJhbGciOiJIUzI1NiJ9.garbage.sig",
        "Invalid MCP token.",
        "invalid_token",
    )
    .await;
    // expired beyond the 30 s leeway
    let expired = app.sign(with("exp", json!(now - 35))).await;
    assert_refused(&app, &expired, "Token has expired.", "expired").await;
    // issuer not allowed
    let evil = app.sign(with("iss", json!("evil"))).await;
    assert_refused(&app, &evil, "Invalid token issuer.", "invalid_issuer").await;
    // missing required claims
    for k in ["sub", "iat", "jti"] {
        let mut c = claims_per_turn(&[]);
        c.as_object_mut().unwrap().remove(k);
        let t = app.sign(c).await;
        assert_refused(&app, &t, "Invalid MCP token.", "invalid_token").await;
    }
    // per-turn lifetime 601 s
    let long = app
        .sign(json!({"iss": "daedalus", "sub": "d", "iat": now - 1, "exp": now + 600, "jti": "j-long"}))
        .await;
    assert_refused(&app, &long, "Invalid MCP token.", "invalid_token").await;
    // aud present but not mnemosyne
    let aud = app.sign(with("aud", json!("someone-else"))).await;
    assert_refused(&app, &aud, "Invalid MCP token.", "invalid_token").await;
}

#[tokio::test]
async fn exp_just_inside_the_leeway_is_accepted() {
    let app = TestApp::spawn().await;
    let now = chrono::Utc::now().timestamp();
    let mut c = claims_per_turn(&[]);
    c["iat"] = json!(now - 300);
    c["exp"] = json!(now - 25);
    let jwt = app.sign(c).await;
    let ex = app.mcp(&jwt).initialize().await;
    assert_eq!(ex.status, StatusCode::OK, "{ex:?}");
}

#[tokio::test]
async fn algorithms_other_than_hs256_are_refused() {
    use base64::Engine;
    let app = TestApp::spawn().await;
    let (kid, secret) = app.signing_key().await;
    let b64 = base64::engine::general_purpose::URL_SAFE_NO_PAD;
    let payload = b64.encode(claims_per_turn(&[]).to_string());
    let none = format!(
        "{}.{payload}.",
        b64.encode(json!({"alg": "none", "kid": kid}).to_string())
    );
    assert_refused(&app, &none, "Invalid MCP token.", "invalid_token").await;
    let mut h = jsonwebtoken::Header::new(jsonwebtoken::Algorithm::HS512);
    h.kid = Some(kid.clone());
    let hs512 = jsonwebtoken::encode(
        &h,
        &claims_per_turn(&[]),
        &jsonwebtoken::EncodingKey::from_secret(&secret),
    )
    .unwrap();
    assert_refused(&app, &hs512, "Invalid MCP token.", "invalid_token").await;
    // RS256 header over an HMAC signature (algorithm confusion)
    let header = b64.encode(json!({"alg": "RS256", "kid": kid, "typ": "JWT"}).to_string());
    let signing_input = format!("{header}.{payload}");
    use hmac_sig::sign;
    let rs = format!(
        "{signing_input}.{}",
        b64.encode(sign(&secret, signing_input.as_bytes()))
    );
    assert_refused(&app, &rs, "Invalid MCP token.", "invalid_token").await;
}

/// HMAC-SHA256 by hand for the algorithm-confusion token (via jsonwebtoken's
/// own HS256 on an HS256 header, then swapping the header would change the
/// signing input, so compute it directly).
mod hmac_sig {
    pub fn sign(key: &[u8], msg: &[u8]) -> Vec<u8> {
        use sha2::{Digest, Sha256};
        let mut k = [0u8; 64];
        if key.len() > 64 {
            k[..32].copy_from_slice(&Sha256::digest(key));
        } else {
            k[..key.len()].copy_from_slice(key);
        }
        let ipad: Vec<u8> = k.iter().map(|b| b ^ 0x36).collect();
        let opad: Vec<u8> = k.iter().map(|b| b ^ 0x5c).collect();
        let inner = Sha256::new().chain_update(&ipad).chain_update(msg).finalize();
        Sha256::new()
            .chain_update(&opad)
            .chain_update(inner)
            .finalize()
            .to_vec()
    }
}

#[tokio::test]
async fn retired_kid_is_invalid_on_the_next_request() {
    let app = TestApp::spawn().await;
    let jwt = app.per_turn_jwt(&[]).await;
    let mut c = app.mcp(&jwt).connect().await;
    assert_eq!(c.list_tools().await.status, StatusCode::OK);
    let (kid, _) = app.signing_key().await;
    mnemosyne::store::pg::keys::create(&app.pg).await.unwrap();
    assert!(mnemosyne::store::pg::keys::retire(&app.pg, &kid).await.unwrap());
    tokio::time::sleep(Duration::from_millis(100)).await;
    let ex = c.list_tools().await;
    assert_eq!(ex.status, StatusCode::UNAUTHORIZED);
    assert_eq!(ex.json()["error_description"], "Invalid MCP token.");
}

// ---- per-turn replay ----

#[tokio::test]
async fn per_turn_jti_is_reusable_inside_its_session_only() {
    let app = TestApp::spawn().await;
    let s = seed(&app).await;
    let jwt = app.per_turn_jwt(&[s.lib_a.clone()]).await;
    // one turn: initialize + tools/list + tools/call in one session
    let mut c = app.mcp(&jwt).connect().await;
    assert_eq!(c.list_tools().await.status, StatusCode::OK);
    c.call_ok("search", json!({"query": "pelican"})).await;
    // the same jti in a second session is a replay
    assert_refused(&app, &jwt, "Token replay detected.", "replay").await;
    // ... and on a second instance sharing the stores
    let other = app.second_instance().await;
    let ex = other.mcp(&jwt).initialize().await;
    assert_eq!(ex.status, StatusCode::UNAUTHORIZED);
    assert_eq!(ex.json()["error_description"], "Token replay detected.");
    // the first session keeps working
    assert_eq!(c.list_tools().await.status, StatusCode::OK);
}

#[tokio::test]
async fn per_turn_jti_is_single_use_on_the_stateless_revision() {
    let app = TestApp::spawn().await;
    let jwt = app.per_turn_jwt(&[]).await;
    let mut c = app.mcp(&jwt).stateless();
    assert_eq!(c.list_tools().await.status, StatusCode::OK);
    let ex = c.list_tools().await;
    assert_eq!(ex.status, StatusCode::UNAUTHORIZED);
    assert_eq!(ex.json()["error_description"], "Token replay detected.");
}

#[tokio::test]
async fn team_jwts_bypass_the_replay_check() {
    let app = TestApp::spawn().await;
    let (_, jwt) = app.create_team("Mentor").await;
    for _ in 0..3 {
        let mut c = app.mcp(&jwt).connect().await;
        assert_eq!(c.list_tools().await.status, StatusCode::OK);
    }
    let mut c = app.mcp(&jwt).stateless();
    assert_eq!(c.list_tools().await.status, StatusCode::OK);
    assert_eq!(c.list_tools().await.status, StatusCode::OK);
}

#[tokio::test]
async fn a_session_is_refused_to_another_principal() {
    let app = TestApp::spawn().await;
    let a = app.opaque_token(&[]).await;
    let b = app.opaque_token(&[]).await;
    let mut ca = app.mcp(&a).connect().await;
    let mut cb = McpClient::new(app.http.clone(), app.url("/mcp/"), &b);
    cb.session = ca.session.clone();
    let ex = cb.list_tools().await;
    assert_eq!(ex.status, StatusCode::NOT_FOUND);
    assert_eq!(ca.list_tools().await.status, StatusCode::OK);
}

// ---- team JWTs (spec §6.3) ----

#[tokio::test]
async fn team_jwt_resolves_live_to_attached_workspaces() {
    let app = TestApp::spawn().await;
    let s = seed(&app).await;
    let (id, jwt) = app.create_team("Kottos").await;
    assert!(libs_of(&app, &jwt).await.is_empty(), "no workspaces attached: nothing");
    app.put_workspaces(id, &[s.ws_a.clone()]).await;
    assert_eq!(libs_of(&app, &jwt).await, vec![s.lib_a.clone()]);
}

#[tokio::test]
async fn team_jwt_for_a_missing_team_is_invalid() {
    let app = TestApp::spawn().await;
    let (kid, secret) = app.signing_key().await;
    let jwt = mnemosyne::auth::jwt::mint_team_jwt(
        Uuid::new_v4(),
        Uuid::new_v4(),
        &kid,
        &secret,
        chrono::Utc::now().timestamp(),
    )
    .unwrap();
    assert_refused(&app, &jwt, "Invalid MCP token.", "team_not_found").await;
}

#[tokio::test]
async fn team_jwt_with_a_bad_sub_is_invalid() {
    let app = TestApp::spawn().await;
    let now = chrono::Utc::now().timestamp();
    let jwt = app
        .sign(
            json!({"iss": "mnemosyne", "aud": "mnemosyne", "sub": "team:not-a-uuid", "typ": "team",
                     "iat": now, "exp": now + 1000, "jti": Uuid::new_v4().to_string()}),
        )
        .await;
    assert_refused(&app, &jwt, "Invalid MCP token.", "invalid_token").await;
}

#[tokio::test]
async fn team_jwt_after_rotate_is_invalid_on_the_next_request_of_another_instance() {
    let app = TestApp::spawn().await;
    let other = app.second_instance().await;
    let (id, old) = app.create_team("Iolaus").await;
    assert_eq!(
        other.mcp(&old).connect().await.list_tools().await.status,
        StatusCode::OK
    ); // warm other's cache
    let r = app
        .service(reqwest::Method::POST, &format!("/mcp_server/api/teams/{id}/rotate/"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::OK);
    let new: Value = r.json().await.unwrap();
    assert_refused(&other, &old, "Invalid MCP token.", "stale_jti").await;
    assert_eq!(
        other.mcp(new["jwt"].as_str().unwrap()).initialize().await.status,
        StatusCode::OK
    );
}

#[tokio::test]
async fn team_jwt_after_delete_is_deactivated() {
    let app = TestApp::spawn().await;
    let other = app.second_instance().await;
    let (id, jwt) = app.create_team("Harper").await;
    let mut live = other.mcp(&jwt).connect().await;
    let r = app
        .service(reqwest::Method::DELETE, &format!("/mcp_server/api/teams/{id}/"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::NO_CONTENT);
    let ex = live.list_tools().await;
    assert_eq!(ex.status, StatusCode::UNAUTHORIZED);
    assert_eq!(ex.json()["error_description"], "Token has been deactivated.");
    assert_refused(&app, &jwt, "Token has been deactivated.", "team_inactive").await;
}

#[tokio::test]
async fn detached_workspace_is_gone_on_the_next_request_on_both_instances() {
    let app = TestApp::spawn().await;
    let other = app.second_instance().await;
    let s = seed(&app).await;
    let (id, jwt) = app.create_team("Kottos").await;
    app.put_workspaces(id, &[s.ws_a.clone(), s.ws_b.clone()]).await;
    let mut c1 = app.mcp(&jwt).connect().await;
    let mut c2 = other.mcp(&jwt).connect().await;
    assert_eq!(c1.library_uids().await, vec![s.lib_a.clone(), s.lib_b.clone()]);
    assert_eq!(c2.library_uids().await, vec![s.lib_a.clone(), s.lib_b.clone()]);
    app.put_workspaces(id, &[s.ws_b.clone()]).await;
    assert_eq!(c1.library_uids().await, vec![s.lib_b.clone()]);
    assert_eq!(c2.library_uids().await, vec![s.lib_b.clone()]);
    let hits = c2.call_ok("search", json!({"query": "zanzibarine"})).await;
    assert!(hits["results"]
        .as_array()
        .unwrap()
        .iter()
        .all(|r| r["library_uid"] == s.lib_b.as_str()));
}

#[tokio::test]
async fn changes_made_directly_in_postgres_apply_on_the_next_request() {
    let app = TestApp::spawn().await;
    let s = seed(&app).await;
    let (id, jwt) = app.create_team("Kottos").await;
    app.put_workspaces(id, &[s.ws_a.clone()]).await;
    assert_eq!(libs_of(&app, &jwt).await, vec![s.lib_a.clone()]);
    sqlx::query("DELETE FROM team_workspace_assignments WHERE team_id = $1")
        .bind(id)
        .execute(&app.pg)
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(libs_of(&app, &jwt).await.is_empty());
}

#[tokio::test]
async fn a_dropped_listen_connection_does_not_leave_a_stale_cache() {
    let app = TestApp::spawn().await;
    let s = seed(&app).await;
    let (id, jwt) = app.create_team("Kottos").await;
    app.put_workspaces(id, &[s.ws_a.clone()]).await;
    assert_eq!(libs_of(&app, &jwt).await, vec![s.lib_a.clone()]); // cached
                                                                  // Kill the LISTEN backend and change the team behind the server's back
                                                                  // while it is disconnected: that NOTIFY is lost.
    let before = app.state.auth.caches.connections();
    let killed: Vec<bool> = sqlx::query_scalar(
        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity
          WHERE datname = current_database() AND query ILIKE 'LISTEN%'",
    )
    .fetch_all(&app.pg)
    .await
    .unwrap();
    assert!(!killed.is_empty(), "a LISTEN connection exists");
    sqlx::query("DELETE FROM team_workspace_assignments WHERE team_id = $1")
        .bind(id)
        .execute(&app.pg)
        .await
        .unwrap();
    // Once the drop is noticed (milliseconds), the caches are bypassed, and the
    // reconnect starts from empty caches: the lost change is never served stale.
    for _ in 0..500 {
        if app.state.auth.caches.connections() > before {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(app.state.auth.caches.connections() > before, "the listener reconnected");
    assert!(
        libs_of(&app, &jwt).await.is_empty(),
        "stale cache served after a dropped LISTEN"
    );
    assert!(libs_of(&app, &jwt).await.is_empty());
}

#[tokio::test]
async fn with_caches_off_every_request_reads_the_stores() {
    let app = TestApp::spawn_with(|s| s.cache_max_staleness_secs = 0).await;
    let s = seed(&app).await;
    let (id, jwt) = app.create_team("Kottos").await;
    app.put_workspaces(id, &[s.ws_a.clone()]).await;
    assert_eq!(libs_of(&app, &jwt).await, vec![s.lib_a.clone()]);
    sqlx::query("DELETE FROM team_workspace_assignments")
        .execute(&app.pg)
        .await
        .unwrap();
    assert!(libs_of(&app, &jwt).await.is_empty());
}

// ---- fail closed ----

#[tokio::test]
async fn graph_down_during_team_resolution_is_503_never_a_wider_list() {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let app = TestApp::spawn_with(|s| {
        s.bolt_uri = format!("127.0.0.1:{port}");
        s.store_timeout_ms = 1000;
    })
    .await;
    let (id, jwt) = app.create_team("Kottos").await;
    app.put_workspaces(id, &[app.uid("ws")]).await;
    let ex = app.mcp(&jwt).initialize().await;
    assert_eq!(ex.status, StatusCode::SERVICE_UNAVAILABLE, "{ex:?}");
    assert!(ex.headers.get("retry-after").is_some());
    assert_eq!(ex.json()["error"], "unavailable");
}

#[tokio::test]
async fn postgres_down_during_resolution_is_503() {
    let app = TestApp::spawn().await;
    let token = app.opaque_token(&[]).await;
    let mut settings = app.settings.clone();
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    settings.database_url = format!("postgres://postgres@127.0.0.1:{port}/x");
    settings.store_timeout_ms = 1000;
    let down = mnemosyne::startup::Application::build(settings).await.unwrap();
    let url = format!("http://{}/mcp/", down.local_addr());
    tokio::spawn(down.run_until(std::future::pending()));
    let ex = McpClient::new(app.http.clone(), url, &token).initialize().await;
    assert_eq!(ex.status, StatusCode::SERVICE_UNAVAILABLE, "{ex:?}");
    assert_eq!(ex.json()["store"], "postgres");
}

// ---- logs ----

#[tokio::test]
async fn logs_show_principal_kind_and_count_but_no_token_material() {
    let cap = Capture::default();
    let writer = cap.clone();
    // This thread's default (the test runtime is single-threaded, so the app's
    // tasks log here too), whatever another test made the global subscriber.
    let subscriber = tracing_subscriber::fmt()
        .with_env_filter("trace")
        .with_writer(move || writer.clone())
        .with_ansi(false)
        .finish();
    let _guard = tracing::subscriber::set_default(subscriber);
    let app = TestApp::spawn().await;
    let s = seed(&app).await;
    let token = app.opaque_token(&[s.lib_a.clone()]).await;
    let per_turn = app.per_turn_jwt(&[s.lib_b.clone()]).await;
    let (_, team) = app.create_team("Kottos").await;
    for b in [&token, &per_turn, &team] {
        app.mcp(b)
            .connect()
            .await
            .call_ok("search", json!({"query": "pelican"}))
            .await;
    }
    app.mcp(&per_turn).initialize().await; // a replay failure is logged too
    let logs = String::from_utf8(cap.0.lock().unwrap().clone()).unwrap();
    assert!(logs.contains("bearer resolved"), "resolutions are logged");
    assert!(logs.contains("principal=token") && logs.contains("principal=team") && logs.contains("principal=per_turn"));
    assert!(logs.contains("libraries=1"));
    let hash = mnemosyne::auth::resolver::token_hash(&token);
    for secret in [token.as_str(), hash.as_str(), per_turn.as_str(), team.as_str()] {
        assert!(!logs.contains(secret), "token material in logs");
    }
    for part in per_turn.split('.').chain(team.split('.')) {
        assert!(!logs.contains(part), "JWT segment in logs");
    }
}
