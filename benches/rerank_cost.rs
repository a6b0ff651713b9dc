//! What the reranker costs a hybrid search (issue 51): `search` p50 in
//! hybrid mode on two servers over the same stores and the same library,
//! one without a reranker and one with it, beside each other. The reranker
//! is a local server of this bench's own on 127.0.0.1 speaking the
//! Cohere/vLLM shape and scoring by shared words (no cross-encoder weights
//! are reachable here), so the difference is the client's side: the
//! candidates' texts read, the request, its answer checked, the reorder —
//! a real cross-encoder's own latency comes on top. Quality is not
//! measured (docs/search.md, "Reranker").
//!
//!   cargo bench --bench rerank_cost   (RERANK_ITEMS=200, RERANK_SEARCHES=60, RERANK_CANDIDATES=50)

mod common;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::StreamExt;
use serde_json::{json, Value};

use common::{SERVICE_PASSWORD as PASSWORD, SERVICE_USER as USER};

/// Scores each document by the query's words it holds.
async fn rerank(
    axum::extract::State(calls): axum::extract::State<Arc<AtomicUsize>>,
    axum::Json(body): axum::Json<Value>,
) -> axum::Json<Value> {
    calls.fetch_add(1, Ordering::Relaxed);
    let query = body["query"].as_str().unwrap_or("").to_lowercase();
    let words: Vec<&str> = query.split_whitespace().collect();
    let results: Vec<Value> = body["documents"]
        .as_array()
        .map(|d| d.as_slice())
        .unwrap_or_default()
        .iter()
        .enumerate()
        .map(|(i, d)| {
            let d = d.as_str().unwrap_or("").to_lowercase();
            let score = words.iter().filter(|w| d.contains(*w)).count() as f64;
            json!({"index": i, "relevance_score": score})
        })
        .collect();
    axum::Json(json!({"results": results}))
}

/// One hybrid search of `query`: how long it took and its note.
async fn search(http: &reqwest::Client, base: &str, token: &str, query: &str) -> (Duration, Option<String>) {
    common::timed_search(
        http,
        base,
        token,
        json!({"query": query, "mode": "hybrid", "limit": 10}),
    )
    .await
}

fn main() {
    common::block_on("rerank_cost", run());
}

async fn run() {
    let items: usize = common::setting("RERANK_ITEMS", 200);
    let searches: usize = common::setting("RERANK_SEARCHES", 60);
    let candidates: u16 = common::setting("RERANK_CANDIDATES", 50);

    let calls = Arc::new(AtomicUsize::new(0));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let reranker = format!("http://{}/v1", listener.local_addr().unwrap());
    let router = axum::Router::new()
        .route("/v1/rerank", axum::routing::post(rerank))
        .with_state(calls.clone());
    tokio::spawn(async move { axum::serve(listener, router).await });

    let (mut settings, pool, admin) = common::fresh_settings("rerank").await;
    settings.public_url = "http://127.0.0.1:0".into();
    settings.rate_limit_per_minute = 0;
    settings.tool_rate_limit_per_minute = 0;
    settings.search_concurrency = 0;
    settings.user_search_concurrency = 0;
    if settings.embed_model.is_none() {
        settings.embed_model =
            Some(std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join(".dev/models/multilingual-e5-small"));
    }
    settings.embed_url = None;
    let ns = format!("rc{}", &uuid::Uuid::new_v4().simple().to_string()[..8]);
    settings.embed_scope_prefix = ns.clone();
    // Each replica its own index directory.
    let index = std::env::temp_dir().join(format!("mnemosyne-bench-{ns}"));
    common::service_user(&pool).await;
    let mut started = Vec::new();
    for with in [false, true] {
        let mut s = settings.clone();
        s.index_dir = Some(index.join(if with { "with" } else { "without" }));
        if with {
            s.rerank_url = Some(reranker.clone());
            s.rerank_model = Some("bench-reranker".into());
            s.rerank_candidates = candidates;
        }
        let app = mnemosyne::startup::Application::build(s).await.unwrap();
        let base = format!("http://{}", app.local_addr());
        let state = app.state().clone();
        tokio::spawn(app.run_until(std::future::pending()));
        started.push((base, state));
    }
    let http = reqwest::Client::builder().pool_max_idle_per_host(32).build().unwrap();
    let base = started[0].0.clone();
    let lib = format!("{ns}_lib");
    let token = common::reader_library(&http, &base, &pool, &lib).await;
    let corpus = common::corpus();
    let docs: Vec<(String, String)> = (0..items)
        .map(|i| {
            let (title, text) = &corpus[i % corpus.len()];
            (format!("{title} ({i})"), text.clone())
        })
        .collect();
    futures::stream::iter(docs.iter().map(|(title, text)| {
        let (http, base, lib) = (&http, &base, &lib);
        async move {
            let r = http
                .post(format!("{base}/library/api/ingest/"))
                .basic_auth(USER, Some(PASSWORD))
                .json(&json!({"library_uid": lib, "item": {"title": title}, "content": text}))
                .send()
                .await
                .unwrap();
            assert!(r.status().is_success(), "ingest: {}", r.status());
        }
    }))
    .buffer_unordered(4)
    .collect::<Vec<()>>()
    .await;
    let deadline = Instant::now() + Duration::from_secs(1800);
    while !started[0].1.admin.embedding_backlog(&ns).await.unwrap().is_empty() {
        assert!(Instant::now() < deadline, "the embedding queue did not drain");
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    tokio::time::sleep(mnemosyne::store::graph::vectors::STAMP_TTL + Duration::from_millis(200)).await;

    let queries: Vec<String> =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/benches/quality/queries.jsonl"))
            .unwrap()
            .lines()
            .filter_map(|l| serde_json::from_str::<Value>(l).ok())
            .filter_map(|q| q["text"].as_str().map(str::to_owned))
            .collect();
    // Every query once on each first (query vectors cached alike, indexes
    // built), then the timed rounds, alternating.
    for q in queries.iter().take(searches) {
        for (b, _) in &started {
            search(&http, b, &token, q).await;
        }
    }
    let sent_before = calls.load(Ordering::Relaxed);
    let (mut without, mut with) = (Vec::new(), Vec::new());
    let mut notes = 0;
    for q in queries.iter().take(searches) {
        without.push(search(&http, &started[0].0, &token, q).await.0);
        let (took, note) = search(&http, &started[1].0, &token, q).await;
        notes += usize::from(note.is_some());
        with.push(took);
    }
    let sent = calls.load(Ordering::Relaxed) - sent_before;
    let n = with.len();
    let (a, b) = (common::p50_ms(&mut without), common::p50_ms(&mut with));
    println!(
        "rerank_cost: {items} items, {n} hybrid searches each (limit 10), {candidates} candidates to a local reranker (word-overlap scores)"
    );
    println!("| hybrid search p50 | without reranker | with reranker | difference |");
    println!("|---|---:|---:|---:|");
    println!("| ms | {a:.2} | {b:.2} | {:+.2} |", b - a);
    println!("reranker requests during the timed rounds: {sent} of {n}; results with a note (not reranked): {notes}");
    let _ = std::fs::remove_dir_all(&index);
    common::drop_db(&admin, &settings.database_url).await;
}
