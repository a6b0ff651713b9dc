//! Replicas behind a plain load balancer (issue 31): a legacy MCP session
//! opened on one replica answers on any other, bound to the exact credential
//! that opened it; DELETE and expiry end it everywhere; the caps per
//! credential and per user hold over the whole deployment. Two (or three)
//! in-process apps over the same Postgres database and graph namespace.

use std::time::Duration;

use reqwest::StatusCode;
use serde_json::json;

use crate::helpers::{McpClient, TestApp};
use crate::mcp::seed;

/// A client on `app` that sends its requests on `session`.
fn on(app: &TestApp, bearer: &str, session: &str) -> McpClient {
    let mut c = McpClient::new(app.http.clone(), app.url("/mcp/"), bearer);
    c.session = Some(session.to_owned());
    c
}

async fn delete(app: &TestApp, bearer: &str, session: &str) -> StatusCode {
    app.http
        .delete(app.url("/mcp/"))
        .header("Authorization", format!("Bearer {bearer}"))
        .header("Mcp-Session-Id", session)
        .header("MCP-Protocol-Version", "2025-11-25")
        .send()
        .await
        .unwrap()
        .status()
}

/// Polls `tools/list` on `session` at `app` until it answers `want`
/// (bounded: 50 tries, 100 ms apart); the last status.
async fn settles_to(app: &TestApp, bearer: &str, session: &str, want: StatusCode) -> StatusCode {
    let mut last = StatusCode::OK;
    for _ in 0..50 {
        last = on(app, bearer, session).list_tools().await.status;
        if last == want {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    last
}

#[tokio::test]
async fn a_session_opened_on_one_replica_answers_on_the_others_with_the_same_libraries() {
    let a = TestApp::spawn().await;
    let s = seed(&a).await;
    let b = a.second_instance().await;
    let c = a.second_instance().await;
    let token = a.opaque_token(&[]).await;
    let team = a.create_team("replicas").await;
    a.put_workspaces(team.0, &[s.ws_a.clone()]).await;
    let turn = a.per_turn_jwt(&[s.lib_b.clone()]).await;
    for (bearer, want) in [(&team.1, vec![s.lib_a.clone()]), (&turn, vec![s.lib_b.clone()])] {
        let mut opened = a.mcp(bearer).connect().await;
        let sid = opened.session.clone().unwrap();
        assert_eq!(opened.library_uids().await, want);
        // Round robin over the three replicas, twice.
        for app in [&b, &c, &a, &b, &c] {
            let mut there = on(app, bearer, &sid);
            assert_eq!(there.library_uids().await, want, "on {}", app.base);
            let found = there.call_ok("search", json!({"query": "pelican"})).await;
            assert!(found["results"].is_array(), "{found}");
        }
    }
    // The opaque token's session, opened on B, answers on A.
    let mut on_b = b.mcp(&token).connect().await;
    let sid = on_b.session.clone().unwrap();
    assert_eq!(on(&a, &token, &sid).list_tools().await.status, StatusCode::OK);
    assert_eq!(on_b.list_tools().await.status, StatusCode::OK);
}

#[tokio::test]
async fn an_older_revisions_session_is_rebuilt_in_that_revision() {
    let a = TestApp::spawn().await;
    let b = a.second_instance().await;
    let token = a.opaque_token(&[]).await;
    let mut c = a.mcp(&token);
    let ex = c
        .post(
            json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
                "protocolVersion": "2025-03-26", "capabilities": {},
                "clientInfo": {"name": "old-client", "version": "0"}}}),
            &[],
        )
        .await;
    assert_eq!(ex.status, StatusCode::OK, "{ex:?}");
    assert_eq!(ex.response()["result"]["protocolVersion"], "2025-03-26");
    let sid = ex.headers["mcp-session-id"].to_str().unwrap().to_owned();
    let header = [("MCP-Protocol-Version", "2025-03-26")];
    let mut there = McpClient::new(b.http.clone(), b.url("/mcp/"), &token);
    there.session = Some(sid.clone());
    let n = there
        .post(
            json!({"jsonrpc": "2.0", "method": "notifications/initialized"}),
            &header,
        )
        .await;
    assert!(n.status.is_success(), "{n:?}");
    let listed = there
        .post(
            json!({"jsonrpc": "2.0", "id": 2, "method": "tools/list", "params": {}}),
            &header,
        )
        .await;
    assert_eq!(listed.status, StatusCode::OK, "{listed:?}");
    assert_eq!(listed.response()["result"]["tools"].as_array().unwrap().len(), 6);
    let stored: serde_json::Value = sqlx::query_scalar("SELECT init_params FROM mcp_sessions WHERE id = $1")
        .bind(&sid)
        .fetch_one(&a.pg)
        .await
        .unwrap();
    assert_eq!(stored["protocolVersion"], "2025-03-26");
    assert_eq!(stored["clientInfo"]["name"], "old-client");
}

#[tokio::test]
async fn another_credential_gets_the_unknown_session_answer_on_every_replica() {
    let a = TestApp::spawn().await;
    let s = seed(&a).await;
    let b = a.second_instance().await;
    let owner = a.per_turn_jwt(&[s.lib_a.clone()]).await;
    let other = a.per_turn_jwt(&[s.lib_b.clone()]).await;
    let token = a.opaque_token(&[]).await;
    let mut opened = a.mcp(&owner).connect().await;
    let sid = opened.session.clone().unwrap();
    for app in [&b, &a] {
        for bearer in [&other, &token] {
            let ex = on(app, bearer, &sid).list_tools().await;
            assert_eq!(ex.status, StatusCode::NOT_FOUND, "{ex:?}");
            assert_eq!(ex.body, "Not Found: Session not found");
        }
        assert_eq!(delete(app, &other, &sid).await, StatusCode::NOT_FOUND);
    }
    // B holds no copy built for the wrong credential: the owner's next
    // request there is served with the owner's libraries.
    assert_eq!(on(&b, &owner, &sid).library_uids().await, [s.lib_a.clone()]);
    assert_eq!(opened.library_uids().await, [s.lib_a.clone()]);
    // The refused per-turn JWT was not consumed: it opens its own session.
    assert_eq!(b.mcp(&other).initialize().await.status, StatusCode::OK);
}

#[tokio::test]
async fn delete_on_one_replica_ends_the_session_on_every_replica() {
    let a = TestApp::spawn().await;
    let b = a.second_instance().await;
    let c = a.second_instance().await;
    let token = a.opaque_token(&[]).await;
    let opened = a.mcp(&token).connect().await;
    let sid = opened.session.clone().unwrap();
    // B and C build copies of it.
    for app in [&b, &c] {
        assert_eq!(on(app, &token, &sid).list_tools().await.status, StatusCode::OK);
        assert_eq!(app.state.mcp.sessions.open(), 1);
    }
    assert_eq!(delete(&c, &token, &sid).await, StatusCode::NO_CONTENT);
    for app in [&a, &b, &c] {
        assert_eq!(
            settles_to(app, &token, &sid, StatusCode::NOT_FOUND).await,
            StatusCode::NOT_FOUND,
            "on {}",
            app.base
        );
        assert_eq!(app.state.mcp.sessions.open(), 0, "no copy left on {}", app.base);
    }
    let rows: i64 = sqlx::query_scalar("SELECT count(*) FROM mcp_sessions")
        .fetch_one(&a.pg)
        .await
        .unwrap();
    assert_eq!(rows, 0);
}

#[tokio::test]
async fn the_caps_per_credential_and_per_user_hold_over_the_replicas() {
    let a = TestApp::spawn_with(|s| s.sessions_per_credential = 2).await;
    let b = a.second_instance().await;
    // Two tokens of one user.
    let user = format!("user-{}", a.ns);
    mnemosyne::store::pg::users::create(&a.pg, &user, None, false)
        .await
        .unwrap()
        .unwrap();
    let mint = || async {
        mnemosyne::service::tokens::mint(&a.pg, &user, "test", &[], None)
            .await
            .unwrap()
            .plaintext
    };
    let (token, sibling) = (mint().await, mint().await);
    let first = a.mcp(&token).connect().await;
    let _second = b.mcp(&token).connect().await;
    for app in [&a, &b] {
        let ex = app.mcp(&token).initialize().await;
        assert_eq!(ex.status, StatusCode::TOO_MANY_REQUESTS, "{ex:?}");
        assert!(ex.headers.contains_key("retry-after"));
    }
    // Another token of the same user shares the cap (issue 32) on any replica.
    let ex = b.mcp(&sibling).initialize().await;
    assert_eq!(ex.status, StatusCode::TOO_MANY_REQUESTS, "{ex:?}");
    assert!(ex.body.contains("user has too many open MCP sessions"), "{ex:?}");
    // A team credential is not affected.
    let team = a.create_team("other").await;
    assert_eq!(b.mcp(&team.1).initialize().await.status, StatusCode::OK);
    // Ending the session opened on A, from B, gives its place back.
    assert_eq!(
        delete(&b, &token, first.session.as_deref().unwrap()).await,
        StatusCode::NO_CONTENT
    );
    assert_eq!(a.mcp(&token).initialize().await.status, StatusCode::OK);
}

#[tokio::test]
async fn an_idle_session_ends_on_every_replica() {
    let a = TestApp::spawn_with(|s| {
        s.session_idle_secs = 1;
        s.sessions_per_credential = 1;
    })
    .await;
    let b = a.second_instance().await;
    let token = a.opaque_token(&[]).await;
    let opened = a.mcp(&token).connect().await;
    let sid = opened.session.clone().unwrap();
    // Bounded wait for A's idle timeout to close its copy.
    for _ in 0..100 {
        if a.state.mcp.sessions.open() == 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(a.state.mcp.sessions.open(), 0, "the idle copy was closed");
    let ex = on(&b, &token, &sid).list_tools().await;
    assert_eq!(ex.status, StatusCode::NOT_FOUND, "{ex:?}");
    // Its place is given back everywhere.
    assert_eq!(b.mcp(&token).initialize().await.status, StatusCode::OK);
}

#[tokio::test]
async fn a_session_served_by_another_replica_outlives_the_first_replicas_idle_copy() {
    let a = TestApp::spawn_with(|s| s.session_idle_secs = 2).await;
    let b = a.second_instance().await;
    let token = a.opaque_token(&[]).await;
    let opened = a.mcp(&token).connect().await;
    let sid = opened.session.clone().unwrap();
    // Served on B only, every 300 ms, until A's copy has gone idle (bounded).
    let mut rounds = 0;
    while a.state.mcp.sessions.open() > 0 && rounds < 40 {
        assert_eq!(on(&b, &token, &sid).list_tools().await.status, StatusCode::OK);
        tokio::time::sleep(Duration::from_millis(300)).await;
        rounds += 1;
    }
    assert_eq!(a.state.mcp.sessions.open(), 0, "A's copy went idle");
    // The session itself is alive: B serves it, and A rebuilds it.
    assert_eq!(on(&b, &token, &sid).list_tools().await.status, StatusCode::OK);
    assert_eq!(on(&a, &token, &sid).list_tools().await.status, StatusCode::OK);
}

#[tokio::test]
async fn sessions_of_a_replica_that_shut_down_keep_answering_on_the_others() {
    let a = TestApp::spawn().await;
    let b = a.second_instance().await;
    let token = a.opaque_token(&[]).await;
    let turn = a.per_turn_jwt(&[]).await;
    let mut sids = Vec::new();
    for bearer in [&token, &turn] {
        let opened = b.mcp(bearer).connect().await;
        sids.push((bearer.clone(), opened.session.clone().unwrap()));
    }
    let b_state = b.state.clone();
    drop(b);
    // Bounded wait for B to finish shutting down (its copies closed).
    for _ in 0..150 {
        if b_state.mcp.sessions.open() == 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(b_state.mcp.sessions.open(), 0, "B closed its copies");
    for (bearer, sid) in &sids {
        assert_eq!(on(&a, bearer, sid).list_tools().await.status, StatusCode::OK);
    }
}

#[tokio::test]
async fn a_session_table_out_of_reach_is_a_503_and_the_refused_turn_may_retry() {
    let a = TestApp::spawn().await;
    let b = a.second_instance().await;
    let token = a.opaque_token(&[]).await;
    let opened = a.mcp(&token).connect().await;
    let sid = opened.session.clone().unwrap();
    let turn = a.per_turn_jwt(&[]).await;
    // A real fault: the table is gone for the moment (a missing migration,
    // a broken grant), Postgres itself answers.
    sqlx::query("ALTER TABLE mcp_sessions RENAME TO mcp_sessions_away")
        .execute(&a.pg)
        .await
        .unwrap();
    let ex = a.mcp(&turn).initialize().await;
    assert_eq!(ex.status, StatusCode::SERVICE_UNAVAILABLE, "{ex:?}");
    assert!(ex.json()["error"].is_string(), "a JSON error: {ex:?}");
    let ex = on(&b, &token, &sid).list_tools().await;
    assert_eq!(ex.status, StatusCode::SERVICE_UNAVAILABLE, "{ex:?}");
    sqlx::query("ALTER TABLE mcp_sessions_away RENAME TO mcp_sessions")
        .execute(&a.pg)
        .await
        .unwrap();
    // The refused turn's jti was given back; the session is intact.
    assert_eq!(a.mcp(&turn).initialize().await.status, StatusCode::OK);
    assert_eq!(on(&b, &token, &sid).list_tools().await.status, StatusCode::OK);
}

/// `MNEMOSYNE_DATABASE_LISTEN_URL` takes the two connections that need a
/// server session of their own — the auth LISTEN connection and the embedding
/// leader's advisory lock — where it points, and nothing else: here the same
/// database as another Postgres role, so `pg_stat_activity` shows which URL
/// each connection came through (behind a transaction-pooling PgBouncer the
/// pool's URL is the pooler's and this one the database's).
#[tokio::test]
async fn the_listen_url_carries_the_listener_and_the_leader_lock_and_nothing_else() {
    let first = TestApp::spawn().await;
    let role = format!("{}_listen", first.ns);
    sqlx::query(&format!("CREATE ROLE \"{role}\" LOGIN"))
        .execute(&first.pg)
        .await
        .unwrap();
    let url = &first.settings.database_url;
    let (scheme, rest) = url.split_once("://").unwrap();
    let host = rest.split_once('@').map_or(rest, |(_, h)| h);
    let mut settings = first.settings.clone();
    settings.database_listen_url = Some(format!("{scheme}://{role}@{host}"));
    // A model, so the replica runs the embedding worker and takes the
    // leader lock; its scope holds nothing, so it embeds nothing.
    settings.embed_model = Some(crate::helpers::model_dir());
    settings.embed_scope_prefix = format!("{}-none", first.ns);
    let app = first.replica_with(settings).await; // returns once its listener heard a heartbeat
    let users = |filter: &'static str| {
        let pg = first.pg.clone();
        async move {
            sqlx::query_scalar::<_, String>(&format!(
                "SELECT DISTINCT a.usename::text FROM pg_stat_activity a
                  WHERE a.datname = current_database() AND a.pid <> pg_backend_pid() AND {filter}"
            ))
            .fetch_all(&pg)
            .await
            .unwrap()
        }
    };
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    let lock_holders = loop {
        let holders = users("a.pid IN (SELECT pid FROM pg_locks WHERE locktype = 'advisory' AND granted)").await;
        if !holders.is_empty() {
            break holders;
        }
        assert!(std::time::Instant::now() < deadline, "nobody took the leader lock");
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert_eq!(lock_holders, vec![role.clone()], "the leader lock's connection");
    let listeners = users("a.application_name LIKE 'mnemosyne-listener:%'").await;
    assert!(listeners.contains(&role), "the LISTEN connection: {listeners:?}");
    // Everything else (the first app's listener aside) came through the pool's URL.
    let others = users(
        "a.application_name NOT LIKE 'mnemosyne-listener:%' AND a.pid NOT IN \
                        (SELECT pid FROM pg_locks WHERE locktype = 'advisory' AND granted)",
    )
    .await;
    assert!(
        !others.contains(&role),
        "a pool connection came through the listen URL: {others:?}"
    );
    // The replica serves, its caches live on that listener.
    let token = app.opaque_token(&[]).await;
    assert_eq!(
        app.mcp(&token).connect().await.list_tools().await.status,
        StatusCode::OK
    );
    drop(app);
    // The role goes with the test (its sessions end with the replica's pool).
    for _ in 0..50 {
        if sqlx::query(&format!("DROP ROLE IF EXISTS \"{role}\""))
            .execute(&first.pg)
            .await
            .is_ok()
        {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// A listen URL that does not parse stops the replica at start, naming the setting.
#[tokio::test]
async fn a_bad_listen_url_stops_the_replica_at_start() {
    let mut settings = crate::helpers::base_settings();
    settings.database_listen_url = Some("postgres://[::1".into());
    let err = mnemosyne::state::AppState::new(settings, "127.0.0.1:0".parse().unwrap())
        .await
        .err()
        .expect("refused");
    assert!(format!("{err:#}").contains("MNEMOSYNE_DATABASE_LISTEN_URL"), "{err:#}");
}
