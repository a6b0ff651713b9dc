//! Hardening round 5 (issue 54): deletes that stay deleted when Postgres
//! fails between the graph commit and the index record.
//!
//! The fault is real and placed exactly: a trigger in the test's own
//! database terminates the connection (`pg_terminate_backend` of its own
//! backend) that records the search index change of one item, after the
//! graph transaction committed. The server answers 503, as it did when its
//! Postgres restarted at that moment (the measurement: the client's
//! retry then answered 404 and the deleted text stayed searchable on both
//! replicas).

use std::time::{Duration, Instant};

use reqwest::{Method, StatusCode};
use serde_json::json;

use crate::helpers::{send, McpClient, TestApp};
use crate::search::search;
use crate::search_index::until_indexed;

/// Terminates the connection that records a search index change of `item`.
async fn fail_records_of(app: &TestApp, item: &str) {
    // (No bind parameters in DDL: the item uid is the test's own.)
    assert!(item.chars().all(|c| c.is_ascii_alphanumeric() || c == '_'));
    fail_records_where(app, &format!("NEW.item_uid = '{item}'")).await;
}

/// Terminates the connection of every index change record matching `when`.
async fn fail_records_where(app: &TestApp, when: &str) {
    sqlx::query(
        "CREATE OR REPLACE FUNCTION test_kill_record() RETURNS trigger AS $$
         BEGIN PERFORM pg_terminate_backend(pg_backend_pid()); RETURN NEW; END $$ LANGUAGE plpgsql",
    )
    .execute(&app.pg)
    .await
    .unwrap();
    sqlx::query(&format!(
        "CREATE TRIGGER test_kill_record BEFORE INSERT ON index_changes FOR EACH ROW
         WHEN ({when}) EXECUTE FUNCTION test_kill_record()"
    ))
    .execute(&app.pg)
    .await
    .unwrap();
}

/// Postgres is back: records succeed again.
async fn restore_records(app: &TestApp) {
    sqlx::query("DROP TRIGGER test_kill_record ON index_changes")
        .execute(&app.pg)
        .await
        .unwrap();
}

async fn served(c: &mut McpClient, word: &str) -> bool {
    !search(c, word, json!({})).await.is_empty()
}

/// Two replicas on one database and graph, a library with one item holding
/// `word`, both replicas answering from their built index; the clients.
async fn two_replicas_with(word: &str) -> (TestApp, TestApp, String, McpClient, McpClient) {
    let a = TestApp::spawn().await;
    let b = a.second_instance().await;
    let lib = a.library("deletes").await;
    let item = a.uid("doomed");
    a.ingest(json!({"library_uid": lib, "item": {"uid": item, "title": "Doomed"}, "content": format!("{word} petals fall")}))
        .await;
    a.ingest(json!({"library_uid": lib, "item": {"uid": a.uid("kept"), "title": "Kept"}, "content": "kelp forests stay"}))
        .await;
    let token = a.opaque_token(&[lib]).await;
    let (mut on_a, mut on_b) = (a.mcp(&token).connect().await, b.mcp(&token).connect().await);
    until_indexed(&a, &mut on_a, word).await;
    until_indexed(&b, &mut on_b, word).await;
    (a, b, item, on_a, on_b)
}

#[tokio::test]
async fn a_delete_whose_index_record_failed_is_not_served_after_its_retry_on_any_replica() {
    let word = "zygomorphic";
    let (a, b, item, mut on_a, mut on_b) = two_replicas_with(word).await;
    fail_records_of(&a, &item).await;
    let (status, body) = send(a.service(Method::DELETE, &format!("/library/api/items/{item}/"))).await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{body}");
    // While Postgres cannot record, the retry cannot answer either.
    let (status, _) = send(a.service(Method::DELETE, &format!("/library/api/items/{item}/"))).await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
    restore_records(&a).await;
    // The client retries (on the other replica, as a balancer may send it):
    // the graph has nothing left (404), and no replica serves the text.
    let (status, _) = send(b.service(Method::DELETE, &format!("/library/api/items/{item}/"))).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    assert!(!served(&mut on_a, word).await, "replica a serves the deleted text");
    assert!(!served(&mut on_b, word).await, "replica b serves the deleted text");
    // Neither does a replica started afterwards, and the rest is still found.
    for client in [&mut on_a, &mut on_b] {
        assert!(served(client, "kelp").await);
    }
    let c = a.second_instance().await;
    let lib = on_a.library_uids().await;
    let mut on_c = c.mcp(&a.opaque_token(&lib).await).connect().await;
    assert!(!served(&mut on_c, word).await, "a new replica serves the deleted text");
    assert!(served(&mut on_c, "kelp").await);
}

#[tokio::test]
async fn a_write_or_delete_whose_record_failed_and_was_never_retried_is_recorded_by_the_sweep() {
    let word = "quinquefoliate";
    let (a, b, item, mut on_a, mut on_b) = two_replicas_with(word).await;
    // A re-ingest replaces the item's text; its record fails; no retry.
    fail_records_of(&a, &item).await;
    let lib = on_a.library_uids().await.remove(0);
    let (status, body) = send(a.service(Method::POST, "/library/api/ingest/").json(
        &json!({"library_uid": lib, "item": {"uid": item, "title": "Doomed"}, "content": "trifoliate now"}),
    ))
    .await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{body}");
    restore_records(&a).await;
    // The sweep (every 5 s, for intents older than 5 s) records it: bounded wait.
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let (old_a, old_b) = (served(&mut on_a, word).await, served(&mut on_b, word).await);
        if !old_a && !old_b {
            break;
        }
        assert!(Instant::now() < deadline, "the replaced text is still served (a: {old_a}, b: {old_b})");
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    assert!(served(&mut on_a, "trifoliate").await && served(&mut on_b, "trifoliate").await);
    // Then a delete, the same way.
    fail_records_of(&a, &item).await;
    let (status, _) = send(b.service(Method::DELETE, &format!("/library/api/items/{item}/"))).await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
    restore_records(&a).await;
    let deadline = Instant::now() + Duration::from_secs(30);
    while served(&mut on_a, "trifoliate").await || served(&mut on_b, "trifoliate").await {
        assert!(Instant::now() < deadline, "the deleted text is still served");
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    assert!(served(&mut on_a, "kelp").await && served(&mut on_b, "kelp").await);
    // Nothing is left pending once the intents expire; none were lost meanwhile.
    let pending: i64 = sqlx::query_scalar("SELECT count(*) FROM index_intents WHERE item_uid = $1")
        .bind(&item)
        .fetch_one(&a.pg)
        .await
        .unwrap();
    assert!(pending >= 1, "the failed writes' intents are kept until they expire");
}

#[tokio::test]
async fn a_workspace_delete_whose_record_failed_is_not_served_after_its_retry() {
    let a = TestApp::spawn().await;
    let b = a.second_instance().await;
    let ws = a.uid("ws");
    let out = a.ingest_ws(&ws, "Plan", "sesquipedalian plans").await;
    let lib = out["library_uid"].as_str().unwrap().to_owned();
    let token = a.opaque_token(&[lib.clone()]).await;
    let (mut on_a, mut on_b) = (a.mcp(&token).connect().await, b.mcp(&token).connect().await);
    until_indexed(&a, &mut on_a, "sesquipedalian").await;
    until_indexed(&b, &mut on_b, "sesquipedalian").await;
    // The delete records the whole library's change twice: once its chunks
    // are gone, and once the library is. The last record fails.
    let seq: i64 = sqlx::query_scalar("SELECT seq FROM index_sequences WHERE library_uid = $1")
        .bind(&lib)
        .fetch_one(&a.pg)
        .await
        .unwrap();
    assert!(lib.chars().all(|c| c.is_ascii_alphanumeric() || c == '_'));
    fail_records_where(&a, &format!("NEW.library_uid = '{lib}' AND NEW.seq > {}", seq + 1)).await;
    let (status, _) = send(a.service(Method::DELETE, &format!("/library/api/workspaces/{ws}/"))).await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
    restore_records(&a).await;
    let (status, _) = send(b.service(Method::DELETE, &format!("/library/api/workspaces/{ws}/"))).await;
    assert!(status.is_success(), "{status}");
    // The token's grant went with the workspace; a staff view through a
    // fresh token of the same uid finds nothing either.
    let again = a.opaque_token(&[lib]).await;
    for app in [&a, &b] {
        let mut c = app.mcp(&again).connect().await;
        assert!(!served(&mut c, "sesquipedalian").await);
    }
    assert!(!served(&mut on_a, "sesquipedalian").await && !served(&mut on_b, "sesquipedalian").await);
}
