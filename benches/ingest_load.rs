//! Load benchmark for ingest (issue 10). Prints numbers; asserts nothing about
//! time. Needs `scripts/dev up`.
//!
//! A fixed synthetic corpus — `INGEST_CHUNKS` chunks (default 20,000) of about
//! 800 characters, as items of `INGEST_ITEM_CHUNKS` (10) chunks spread over
//! `INGEST_WORKSPACES` (20) workspaces — is sent through
//! `POST /library/api/ingest/` at 1, 4 and 16 concurrent clients (each run into
//! new workspaces, so libraries and collections are created under load too),
//! then the same chunks are written straight over Bolt (one transaction per
//! item: upsert the item, create its chunks; no HTTP, no checks) at the same
//! concurrencies as the baseline. Printed per run: chunks/s, p50/p99 per
//! request, non-2xx answers and graph transaction retries.
//!
//! Quick run: `INGEST_CHUNKS=2000 cargo bench --bench ingest_load`; without
//! the embedding worker beside the ingests: `INGEST_WITHOUT_MODEL=1`.
//!
//! With the model, the ingests over, it then reads the embedding worker's
//! steady rate from the server's metrics (chunks given a vector per second, nothing
//! else running) for `INGEST_DRAIN_SECONDS` (120) or until the backlog is
//! empty: what `embed_throughput` measures, as the server runs it (its
//! batches, priority, reads and writes of the graph).

mod common;

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use mnemosyne::analysis::Language;
use mnemosyne::startup::Application;
use mnemosyne::store::graph::ingest::{derived_uid, message_batches};
use mnemosyne::store::graph::GraphStore;
use neo4rs::{query, BoltType, ConfigBuilder, Graph};
use serde_json::json;

const USER: &str = "bench-service";
const PASSWORD: &str = "bench password, not a secret";

/// About 800 characters of deterministic pseudo-random words.
fn paragraph(seed: usize) -> String {
    let mut x = (seed as u64)
        .wrapping_mul(6364136223846793005)
        .wrapping_add(1442695040888963407);
    let mut out = String::with_capacity(820);
    while out.len() < 790 {
        x = x.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        if !out.is_empty() {
            out.push(' ');
        }
        out.push_str(common::WORDS[(x >> 33) as usize % common::WORDS.len()]);
    }
    out
}

struct Doc {
    workspace: usize,
    title: String,
    content: String,
    chunks: Vec<String>,
}

/// The corpus: items of `per_item` paragraphs, round-robin over workspaces.
fn corpus(chunks: usize, per_item: usize, workspaces: usize) -> Vec<Doc> {
    (0..chunks.div_ceil(per_item))
        .map(|i| {
            let paras: Vec<String> = (0..per_item).map(|p| paragraph(i * per_item + p)).collect();
            Doc {
                workspace: i % workspaces,
                title: format!("document {i}"),
                content: paras.join("\n\n"),
                chunks: paras,
            }
        })
        .collect()
}

struct Run {
    label: String,
    clients: usize,
    chunks: usize,
    secs: f64,
    p50: Duration,
    p99: Duration,
    non_2xx: usize,
    retries: u64,
}

fn quantile(v: &mut [Duration], q: f64) -> Duration {
    v.sort();
    v[((v.len() as f64 * q) as usize).min(v.len() - 1)]
}

impl Run {
    fn print(&self) {
        println!(
            "| {:<16} | {:>7} | {:>6} | {:>7.1} | {:>8.0} | {:>8.1} | {:>8.1} | {:>7} | {:>7} |",
            self.label,
            self.clients,
            self.chunks,
            self.secs,
            self.chunks as f64 / self.secs,
            self.p50.as_secs_f64() * 1000.0,
            self.p99.as_secs_f64() * 1000.0,
            self.non_2xx,
            self.retries,
        );
    }
}

/// Runs `work(i)` for every document index on `clients` concurrent workers;
/// per-request latencies and the number of failures.
async fn drive<F, Fut>(n: usize, clients: usize, work: F) -> (f64, Vec<Duration>, usize)
where
    F: Fn(usize) -> Fut + Send + Sync + 'static,
    Fut: std::future::Future<Output = bool> + Send,
{
    let next = Arc::new(AtomicUsize::new(0));
    let work = Arc::new(work);
    let started = Instant::now();
    let handles: Vec<_> = (0..clients)
        .map(|_| {
            let (next, work) = (next.clone(), work.clone());
            tokio::spawn(async move {
                let mut lat = Vec::new();
                let mut failed = 0;
                loop {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    if i >= n {
                        break;
                    }
                    let t = Instant::now();
                    if !work(i).await {
                        failed += 1;
                    }
                    lat.push(t.elapsed());
                }
                (lat, failed)
            })
        })
        .collect();
    let mut all = Vec::new();
    let mut failed = 0;
    for h in handles {
        let (l, f) = h.await.unwrap();
        all.extend(l);
        failed += f;
    }
    (started.elapsed().as_secs_f64(), all, failed)
}

fn main() {
    common::block_on("ingest_load", run());
}

async fn run() {
    let total = common::setting::<usize>("INGEST_CHUNKS", 20_000);
    let per_item = common::setting::<usize>("INGEST_ITEM_CHUNKS", 10);
    let workspaces = common::setting::<usize>("INGEST_WORKSPACES", 20);
    let docs = Arc::new(corpus(total, per_item, workspaces));
    let chunks: usize = docs.iter().map(|d| d.chunks.len()).sum();

    let (mut settings, pool, admin) = common::fresh_settings("ingest").await;
    settings.public_url = "http://127.0.0.1:0".into();
    // One chunk per ~800-character paragraph.
    settings.chunk_max_chars = 1200;
    // INGEST_WITHOUT_MODEL=1: no embedding worker beside the ingests (unsetting
    // MNEMOSYNE_EMBED_MODEL does not do it: `.dev/env` fills it in again).
    if std::env::var("INGEST_WITHOUT_MODEL").is_ok_and(|v| v == "1") {
        settings.embed_model = None;
    }
    let graph = GraphStore::connect(&settings)
        .await
        .unwrap()
        .with_timeout(Duration::from_secs(600));
    let graph = graph.into_handles().admin;
    let hash = mnemosyne::auth::basic::hash_password(PASSWORD).unwrap();
    mnemosyne::store::pg::users::create(&pool, USER, Some(&hash), true)
        .await
        .unwrap();
    let app = Application::build(settings.clone()).await.unwrap();
    let base = format!("http://{}", app.local_addr());
    let state = app.state().clone();
    tokio::spawn(app.run_until(std::future::pending()));
    let http = reqwest::Client::builder().pool_max_idle_per_host(64).build().unwrap();
    let ns = format!("il{}", &uuid::Uuid::new_v4().simple().to_string()[..8]);
    // Verify the Basic credentials once (argon2), as a long-running client would.
    let r = http
        .get(format!("{base}/library/api/workspaces/{ns}-warm/"))
        .basic_auth(USER, Some(PASSWORD))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 404);
    println!(
        "corpus: {chunks} chunks of ~800 characters, {} items of {per_item} chunks, {workspaces} workspaces",
        docs.len()
    );

    let mut runs = Vec::new();
    let mut libraries = Vec::new();
    for clients in [1, 4, 16] {
        let tag = format!("{ns}-c{clients}");
        let before = state.admin.txn_stats().1;
        let (http, base, docs2, tag2) = (http.clone(), base.clone(), docs.clone(), tag.clone());
        let (secs, mut lat, non_2xx) = drive(docs.len(), clients, move |i| {
            let d = &docs2[i];
            let body = json!({"workspace_id": format!("{tag2}-ws{}", d.workspace),
                              "item": {"title": d.title, "uid": format!("{tag2}-item{i}")}, "content": d.content});
            let req = http
                .post(format!("{base}/library/api/ingest/"))
                .basic_auth(USER, Some(PASSWORD))
                .json(&body)
                .send();
            async move {
                match req.await {
                    Ok(r) => {
                        let ok = r.status().is_success();
                        if !ok {
                            eprintln!("{} {}", r.status(), r.text().await.unwrap_or_default());
                        }
                        ok
                    }
                    Err(e) => {
                        eprintln!("request failed: {e}");
                        false
                    }
                }
            }
        })
        .await;
        runs.push(Run {
            label: "HTTP ingest".into(),
            clients,
            chunks,
            secs,
            p50: quantile(&mut lat, 0.5),
            p99: quantile(&mut lat, 0.99),
            non_2xx,
            retries: state.admin.txn_stats().1 - before,
        });
        for w in 0..workspaces {
            libraries.push(derived_uid("lib", &["workspace", &format!("{tag}-ws{w}")]));
        }
    }

    // Baseline: the same chunks straight over Bolt, one transaction per item.
    let config = ConfigBuilder::default()
        .uri(settings.bolt_uri.as_str())
        .user(settings.bolt_user.as_str())
        .password(settings.bolt_password.expose())
        .db(settings.bolt_database.as_str())
        .max_connections(32)
        .build()
        .unwrap();
    let bolt = Arc::new(Graph::connect(config).unwrap());
    let one_message = std::env::var("DIRECT_ONE_MESSAGE").is_ok_and(|v| v == "1");
    for clients in [1, 4, 16] {
        let tag = format!("{ns}-bolt{clients}");
        let libs: Vec<String> = (0..workspaces).map(|w| format!("{tag}-lib{w}")).collect();
        for l in &libs {
            graph.create_library(l, l, "baseline", Language::English).await.unwrap();
        }
        libraries.extend(libs.iter().cloned());
        let (bolt, docs2, libs) = (bolt.clone(), docs.clone(), Arc::new(libs));
        let (secs, mut lat, failed) = drive(docs.len(), clients, move |i| {
            let (bolt, docs2, libs) = (bolt.clone(), docs2.clone(), libs.clone());
            async move {
                let d = &docs2[i];
                let lib = &libs[d.workspace];
                let item = format!("{lib}-item{i}");
                let col = format!("{lib}-col");
                let chunks: Vec<(usize, BoltType)> = d
                    .chunks
                    .iter()
                    .enumerate()
                    .map(|(k, text)| {
                        let indexed = mnemosyne::analysis::scoped::scoped_text(lib, Language::English, &d.title, text);
                        let size = item.len() + text.len() + indexed.scoped.len() + 64;
                        let mut m: HashMap<String, BoltType> = HashMap::new();
                        m.insert("uid".into(), format!("{item}-{k}").into());
                        m.insert("ordinal".into(), (k as i64).into());
                        m.insert("text".into(), text.to_string().into());
                        m.insert("scoped".into(), indexed.scoped.into());
                        m.insert("dl".into(), indexed.dl.into());
                        (size, m.into())
                    })
                    .collect();
                // Same message sizes as the server's writes (see MAX_MESSAGE_BYTES),
                // or DIRECT_ONE_MESSAGE=1 for one statement per item.
                let batches = if one_message {
                    vec![chunks.into_iter().map(|(_, v)| v).collect()]
                } else {
                    message_batches(chunks)
                };
                let write = async {
                    let mut txn = bolt.start_txn().await?;
                    txn.run(
                        query(include_str!("../cypher/ingest_upsert_item.cypher"))
                            .param("uid", item.as_str())
                            .param("library_uid", lib.as_str())
                            .param("collection_uid", col.as_str())
                            .param("title", d.title.as_str())
                            .param("source_uri", BoltType::from(None::<String>))
                            .param("mime_type", BoltType::from(None::<String>))
                            .param("content_sha256", "x")
                            .param("chunk_count", d.chunks.len() as i64)
                            .param("now", "2026-01-01T00:00:00.000Z"),
                    )
                    .await?;
                    for batch in batches {
                        txn.run(
                            query(include_str!("../cypher/ingest_create_chunks.cypher"))
                                .param("item_uid", item.as_str())
                                .param("library_uid", lib.as_str())
                                .param("collection_uid", col.as_str())
                                .param("item_title", d.title.as_str())
                                .param("analysis", mnemosyne::analysis::scoped::ANALYSIS_VERSION)
                                .param("chunks", batch),
                        )
                        .await?;
                    }
                    txn.commit().await
                };
                match write.await {
                    Ok(_) => true,
                    Err(e) => {
                        eprintln!("bolt write failed: {e}");
                        false
                    }
                }
            }
        })
        .await;
        runs.push(Run {
            label: if one_message {
                "direct Bolt (1 msg)"
            } else {
                "direct Bolt"
            }
            .into(),
            clients,
            chunks,
            secs,
            p50: quantile(&mut lat, 0.5),
            p99: quantile(&mut lat, 0.99),
            non_2xx: failed,
            retries: 0,
        });
    }

    println!(
        "\n| what             | clients | chunks | seconds | chunks/s | p50 (ms) | p99 (ms) | non-2xx | retries |"
    );
    println!("|------------------|--------:|-------:|--------:|---------:|---------:|---------:|--------:|--------:|");
    for r in &runs {
        r.print();
    }
    let rate = |label: &str, c: usize| {
        runs.iter()
            .find(|r| r.label == label && r.clients == c)
            .map(|r| r.chunks as f64 / r.secs)
            .unwrap_or(f64::NAN)
    };
    for c in [1, 4, 16] {
        println!(
            "HTTP ingest / direct Bolt at {c:>2} clients: {:.0} %{}",
            100.0 * rate("HTTP ingest", c) / rate("direct Bolt", c),
            if c == 4 { " (goal ≥ 60 %)" } else { "" }
        );
    }
    let (txns, retries, gave_up) = state.admin.txn_stats();
    println!("graph transactions of the server: {txns}, retried {retries}, gave up {gave_up}");
    if settings.embed_model.is_some() {
        drain(&state.metrics).await;
    }

    graph.delete_libraries(&libraries).await.unwrap();
    common::drop_db(&admin, &settings.database_url).await;
}

/// The chunks embedded so far and the backlog, from the server's metrics
/// registry (what `/metrics` serves; the server runs in this process).
fn embedding_counts(metrics: &mnemosyne::metrics::Metrics) -> (f64, f64) {
    let text = metrics.render();
    let read = |name: &str| {
        text.lines()
            .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.trim().parse::<f64>().ok())
            .unwrap_or(f64::NAN)
    };
    (
        read("mnemosyne_embedded_chunks_total"),
        read("mnemosyne_embedding_backlog"),
    )
}

/// The embedding worker's rate once nothing else runs (bounded in time).
async fn drain(metrics: &mnemosyne::metrics::Metrics) {
    let limit = Duration::from_secs(common::setting("INGEST_DRAIN_SECONDS", 120));
    let start = Instant::now();
    let (first, backlog_at_start) = embedding_counts(metrics);
    let (mut last, mut backlog) = (first, backlog_at_start);
    while start.elapsed() < limit && backlog > 0.0 {
        tokio::time::sleep(Duration::from_secs(2)).await;
        (last, backlog) = embedding_counts(metrics);
    }
    let secs = start.elapsed().as_secs_f64();
    println!(
        "embedding worker after the ingests: {:.0} chunks of ~800 characters in {secs:.0} s = {:.1} chunks/s (backlog as the worker last counted it: {backlog_at_start:.0} at the start, {backlog:.0} at the end; the goal, ≥ 20 chunks/s of 1,200 characters, is embed_throughput's batch 16)",
        last - first,
        (last - first) / secs
    );
}
