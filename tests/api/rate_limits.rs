//! Rate limits that hold across replicas (issue 24): the configured rate is
//! for the whole deployment, each replica enforcing its share of it (the rate
//! divided by the live replicas the auth heartbeat counts), and a token or a
//! team may carry its own rate.

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use mnemosyne::auth::changes::AuthChanges;
use mnemosyne::service::credential_limits;
use mnemosyne::store::pg::tokens;
use reqwest::StatusCode;

use crate::helpers::{McpClient, TestApp};

/// Waits (bounded) until every replica counts `n` live replicas.
async fn until_replicas(apps: &[&TestApp], n: usize) {
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let seen: Vec<usize> = apps
            .iter()
            .map(|a| a.state.mcp.auth.caches.live_replicas().load(Ordering::SeqCst))
            .collect();
        if seen.iter().all(|s| *s == n) {
            return;
        }
        assert!(Instant::now() < deadline, "replicas never counted {n}: {seen:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Requests accepted out of `rounds` on each client in turn, and how long
/// the hammering took (to bound the refill it allowed).
async fn hammer(clients: &mut [McpClient], rounds: usize) -> (usize, f64) {
    let started = Instant::now();
    let mut accepted = 0;
    for _ in 0..rounds {
        for c in clients.iter_mut() {
            let status = c.list_tools().await.status;
            assert!(
                status == StatusCode::OK || status == StatusCode::TOO_MANY_REQUESTS,
                "{status}"
            );
            accepted += usize::from(status == StatusCode::OK);
        }
    }
    (accepted, started.elapsed().as_secs_f64())
}

/// What the configured rate admits for one principal over `secs`: its burst
/// (ten seconds' worth) plus the refill.
fn admitted(per_minute: f64, secs: f64) -> f64 {
    per_minute / 6.0 + per_minute / 60.0 * secs
}

#[tokio::test]
async fn one_principal_hammering_two_replicas_gets_the_configured_rate_not_twice() {
    let app = TestApp::spawn_with(|s| {
        s.rate_limit_per_minute = 120;
        s.tool_rate_limit_per_minute = 0;
    })
    .await;
    let other = app.second_instance().await;
    until_replicas(&[&app, &other], 2).await;
    let token = app.opaque_token(&[]).await;
    let mut clients = [app.mcp(&token).stateless(), other.mcp(&token).stateless()];
    let (accepted, secs) = hammer(&mut clients, 40).await;
    let want = admitted(120.0, secs);
    println!("accepted {accepted} of 80 in {secs:.2} s; the configured rate admits {want:.1}");
    assert!(
        (accepted as f64) >= 0.8 * 20.0 && (accepted as f64) <= 1.2 * want,
        "accepted {accepted} of 80 in {secs:.2} s; the configured rate admits {want:.1}"
    );
}

#[tokio::test]
async fn a_token_with_its_own_rate_gets_it_over_both_replicas() {
    let app = TestApp::spawn_with(|s| {
        s.rate_limit_per_minute = 120;
        s.tool_rate_limit_per_minute = 0;
    })
    .await;
    let other = app.second_instance().await;
    until_replicas(&[&app, &other], 2).await;
    let slow = app.opaque_token(&[]).await;
    let fast = app.opaque_token(&[]).await;
    let ids: Vec<i64> = tokens::list(&app.pg, None)
        .await
        .unwrap()
        .iter()
        .map(|t| t.id)
        .collect();
    let changes = AuthChanges::new(app.pg.clone(), Some(app.state.mcp.auth.caches.clone()));
    // 12 a minute: a burst of 2 over the deployment, one per replica.
    credential_limits::set_token_rate_limit(&app.pg, &changes, "test", ids[0], Some(12))
        .await
        .unwrap()
        .unwrap();
    credential_limits::set_token_rate_limit(&app.pg, &changes, "test", ids[1], Some(0))
        .await
        .unwrap()
        .unwrap();
    let mut clients = [app.mcp(&slow).stateless(), other.mcp(&slow).stateless()];
    let (accepted, secs) = hammer(&mut clients, 10).await;
    assert!(
        accepted >= 2 && (accepted as f64) <= 1.2 * admitted(12.0, secs) + 1.0,
        "accepted {accepted} of 20 in {secs:.2} s"
    );
    // 0: no limit at all, where the configured rate would stop it at ~20.
    let mut clients = [app.mcp(&fast).stateless(), other.mcp(&fast).stateless()];
    assert_eq!(hammer(&mut clients, 30).await.0, 60);
}

#[tokio::test]
async fn a_rate_set_in_the_console_applies_on_the_next_request_of_another_replica() {
    use crate::admin::{staff, Console, STAFF_PASSWORD};
    let app = TestApp::spawn().await;
    let other = app.second_instance().await;
    let token = app.opaque_token(&[]).await;
    let id = tokens::list(&app.pg, None).await.unwrap()[0].id;
    let (team, jwt) = app.create_team("Throttled").await;
    staff(&app, "sam").await;
    let mut c = Console::signed_in(&app, "sam", STAFF_PASSWORD).await;

    let page = c.get(&format!("/admin/tokens/{id}/tools")).await;
    assert!(page.body.contains("the configured rate"), "{}", page.body);
    let r = c
        .post(&format!("/admin/tokens/{id}/rate"), &[("per_minute", "lots")])
        .await;
    assert_eq!(r.status, StatusCode::BAD_REQUEST);
    assert!(r.body.contains("A whole number of requests a minute"), "{}", r.body);
    // 6 a minute: a burst of one, whatever the replica count.
    let r = c
        .post(&format!("/admin/tokens/{id}/rate"), &[("per_minute", "6")])
        .await;
    assert_eq!(r.status, StatusCode::SEE_OTHER, "{}", r.body);
    assert_eq!(r.location(), "/admin/tokens?ok=token-rate");
    let mut there = other.mcp(&token).stateless();
    assert_eq!(there.list_tools().await.status, StatusCode::OK);
    assert_eq!(there.list_tools().await.status, StatusCode::TOO_MANY_REQUESTS);

    c.get(&format!("/admin/teams/{team}")).await;
    let r = c
        .post(&format!("/admin/teams/{team}/rate"), &[("per_minute", "6")])
        .await;
    assert_eq!(r.status, StatusCode::SEE_OTHER, "{}", r.body);
    let mut there = other.mcp(&jwt).stateless();
    assert_eq!(there.list_tools().await.status, StatusCode::OK);
    assert_eq!(there.list_tools().await.status, StatusCode::TOO_MANY_REQUESTS);
    let page = c.get(&format!("/admin/teams/{team}?ok=team-rate")).await;
    assert!(page.body.contains("Rate limit saved"), "{}", page.body);

    let audited: Vec<(String, String, serde_json::Value)> = sqlx::query_as(
        "SELECT actor, action, detail FROM audit_events WHERE action LIKE '%rate_limit_set' ORDER BY id",
    )
    .fetch_all(&app.pg)
    .await
    .unwrap();
    assert_eq!(
        audited,
        [
            (
                "admin:sam".to_owned(),
                "token_rate_limit_set".to_owned(),
                serde_json::json!({"per_minute": 6})
            ),
            (
                "admin:sam".to_owned(),
                "team_rate_limit_set".to_owned(),
                serde_json::json!({"per_minute": 6})
            ),
        ]
    );
}
