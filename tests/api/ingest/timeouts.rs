//! An ingest the server stops waiting for (its graph wait, or the whole
//! request's deadline) answers the retry-safe 503, and the retry leaves the
//! item whole.

use super::*;

/// Hardening 3, row 13: an ingest whose graph wait runs out is a 503 that
/// says the request is safe to send again (the abandoned write may still
/// commit after the answer: it is whole or absent), and after the retry the
/// item is whole — its chunks are exactly one request's.
#[tokio::test]
async fn a_timed_out_ingest_is_a_retry_safe_503_and_the_retry_leaves_the_item_whole() {
    let app = TestApp::spawn().await;
    let mut settings = app.settings.clone();
    settings.store_timeout_ms = 50;
    let impatient = app.replica_with(settings).await;
    let ws = app.uid("ws");
    let uid = app.uid("big");
    let content = (0..400)
        .map(|p| (0..100).map(|w| format!("r13x{p}w{w}")).collect::<Vec<_>>().join(" "))
        .collect::<Vec<_>>()
        .join("\n\n");
    let body = json!({"workspace_id": ws, "item": {"title": "Big", "uid": uid}, "content": content});
    let (status, answer) = send(impatient.service(Method::POST, "/library/api/ingest/").json(&body)).await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{answer}");
    assert_eq!(answer["error"], "unavailable");
    assert_eq!(answer["store"], "graph");
    assert_eq!(answer["retry_safe"], true);
    assert!(
        answer["message"]
            .as_str()
            .unwrap()
            .contains("sending the same request again is safe"),
        "{answer}"
    );
    // The same request again, with time to finish (it may meet the first
    // one's write still running: they touch the same fence, one waits).
    let (status, retried) = send(app.service(Method::POST, "/library/api/ingest/").json(&body)).await;
    assert!(status.is_success(), "{status} {retried}");
    let expected = retried["chunk_count"].as_i64().unwrap();
    assert!(expected > 1);
    let item = app
        .state
        .admin
        .find_item(&uid)
        .await
        .unwrap()
        .expect("the item is there after the retry");
    assert_eq!(item.chunk_count, expected);
    let rows = app
        .state
        .admin
        .rows_for_tests(
            neo4rs::query("MATCH (c:Chunk {item_uid: $item}) RETURN c.ordinal AS ordinal ORDER BY ordinal")
                .param("item", uid.as_str()),
        )
        .await
        .unwrap();
    let ordinals: Vec<i64> = rows.iter().map(|r| r.get("ordinal").unwrap()).collect();
    assert_eq!(
        ordinals,
        (0..expected).collect::<Vec<_>>(),
        "one request's chunks, whole"
    );
}

/// A graph that accepts connections and never answers (a hung server) holds
/// an ingest past the whole-request deadline: the answer is the same 503 as
/// a store timeout's, `retry_safe` and `Retry-After` included (before: the
/// generic 503 without `retry_safe`).
#[tokio::test]
async fn an_ingest_past_the_request_deadline_is_a_retry_safe_503() {
    // Accepts and holds every connection without reading or writing; stops
    // with the test.
    let hole = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = hole.local_addr().unwrap().port();
    let held = tokio::spawn(async move {
        let mut conns = Vec::new();
        while let Ok((c, _)) = hole.accept().await {
            conns.push(c);
        }
    });
    let app = TestApp::spawn_with(|s| {
        s.bolt_uri = format!("127.0.0.1:{port}");
        s.store_timeout_ms = 30_000;
        s.request_timeout_secs = 2;
    })
    .await;
    // Verifies (and caches) the service account's password; the graph call
    // behind it runs into the deadline too.
    let (status, _) = send(app.service(Method::GET, "/library/api/workspaces/warm-up/")).await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
    let r = app
        .service(Method::POST, "/library/api/ingest/")
        .json(&json!({"workspace_id": app.uid("ws"), "item": {"title": "Doc"}, "content": "text"}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert!(r.headers().contains_key("retry-after"));
    let body: Value = r.json().await.unwrap();
    assert_eq!(body["retry_safe"], json!(true), "{body}");
    assert_eq!(body["error"], "unavailable");
    held.abort();
}
