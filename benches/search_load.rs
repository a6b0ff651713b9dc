#![allow(clippy::cloned_ref_to_slice_refs)]
//! Load benchmark for `search` (issue: MCP knowledge tools). Prints numbers;
//! asserts nothing about time. Needs `scripts/dev up`.
//!
//! 1. concurrency 1: MCP `search` over HTTP (stateless 2026-07-28 requests,
//!    auth + rmcp + graph) vs the same Cypher run directly over Bolt;
//! 2. concurrency 32: throughput of both;
//! 3. tenant isolation: the tenant's p50 before and after the other tenants'
//!    corpus grows by each factor of `LOAD_GROWTH` (default "10,100": 10× then 100×).
//!
//! Sizes: LOAD_TENANT_CHUNKS (200), LOAD_OTHER_CHUNKS (2000), LOAD_GROWTH ("10,100"),
//! LOAD_REQUESTS (300 per measurement at concurrency 1), LOAD_SECONDS (8 at 32; 0 skips it),
//! LOAD_WARMUP (20 untimed requests before each concurrency-1 measurement),
//! LOAD_QUERY ("quasar tidal", broad: `tidal` is in most chunks; "magnetar" is
//! in one chunk in a thousand). "raw Lucene" is the anchor: the scoped
//! full-text query alone over Bolt, best 10; "graph path" is the search
//! without the index (what every search did before it).
//! LOAD_ALSO ("|"-separated queries, e.g. "magnetar"): each also measured at
//! concurrency 1 (MCP beside raw Lucene) on the same corpus.
//! LOAD_SERVER_BIN=target/release/mnemosyne runs the server as its own process;
//! then the concurrency-32 runs also print the server's CPU per search (its
//! user + system time over the searches answered; the 32 session opens count too).
//! LOAD_FLOOD_SECONDS (5; 0 skips it): one token runs `LOAD_FLOOD_WIDTHS`
//! ("32,64") concurrent broad searches over the tenant while a second, small
//! tenant (200 chunks) searches one at a time: that tenant's p50/p99 alone and
//! during the flood, its errors, and the flooder's answered and refused (429)
//! calls; then the same from 25 tokens of the flooding user, the searches
//! spread over them (a user's tokens share the user's slots).
//!
//! With an embedding model configured (`MNEMOSYNE_EMBED_MODEL`, as `.dev/env`
//! sets it) it also measures `mode` keyword / hybrid / semantic at
//! concurrency 1, a repeated query and a fresh one each time, and hybrid in
//! the isolation steps. The tenant's chunks get random unit vectors written
//! through the worker's own statements (the cost of exact scoring does not
//! depend on the values; embedding 10,000 chunks for real takes minutes, see
//! `embed_throughput`); the other tenants' first 2,000 chunks too, and the
//! worker is kept idle (scoped to no library) so it takes no CPU. Issue 21's
//! latency run: LOAD_TENANT_CHUNKS=10000. With `MNEMOSYNE_CROSS_MODEL` the vectors are
//! the pair's (`embed::Embedder::is_paired`); `LOAD_CROSS=0` leaves it out.
//! The graph is the one the environment names: `.dev/env` (ArcadeDB), or export
//! `.dev/env.neo4j` for Neo4j (`set -a; . .dev/env.neo4j; set +a`).

mod common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use mnemosyne::analysis::Language;
use mnemosyne::auth::Principal;
use mnemosyne::store::graph::ingest::AdminGraph;
use mnemosyne::store::graph::ingest::{derived_uid, ItemWrite};
use mnemosyne::store::graph::knowledge::ScopedGraph;
use mnemosyne::store::graph::GraphStore;
use mnemosyne::store::pg::users;
use serde_json::json;

/// Deterministic pseudo-random text; about one chunk in ten mentions "quasar".
fn chunk_text(seed: usize) -> String {
    let mut x = seed as u64 * 6364136223846793005 + 1442695040888963407;
    let mut words = Vec::with_capacity(60);
    for _ in 0..60 {
        x = x.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        words.push(common::WORDS[(x >> 33) as usize % common::WORDS.len()]);
    }
    if seed.is_multiple_of(10) {
        words.push("quasar");
    }
    // A selective word (one chunk in a thousand), for the modes' query.
    if seed % 1000 == 7 {
        words.push("magnetar");
    }
    words.join(" ")
}

/// Writes `n` chunks into `lib` as items of up to 250 chunks.
async fn fill(graph: &AdminGraph, lib: &str, start: usize, n: usize) {
    let col = graph.ensure_collection(lib, "Load").await.unwrap();
    let mut done = 0;
    while done < n {
        let k = (n - done).min(250);
        let chunks: Vec<String> = (0..k).map(|i| chunk_text(start + done + i)).collect();
        let uid = derived_uid("item", &[lib, &(start + done).to_string()]);
        graph
            .write_item(&ItemWrite {
                uid: &uid,
                library_uid: lib,
                workspace_id: None,
                collection_uid: &col,
                title: "load document",
                source_uri: None,
                mime_type: None,
                content_sha256: &uid,
                chunks: &chunks,
            })
            .await
            .unwrap();
        done += k;
    }
}

/// Deterministic unit vector of `dim` values.
fn unit_vector(seed: u64, dim: usize) -> Vec<f64> {
    let mut x = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
    let v: Vec<f64> = (0..dim)
        .map(|_| {
            x = x.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            ((x >> 33) as f64 / (1u64 << 31) as f64) - 0.5
        })
        .collect();
    let n = v.iter().map(|a| a * a).sum::<f64>().sqrt();
    v.into_iter().map(|a| a / n).collect()
}

/// A stored vector of the model (`dim` values): a unit vector of the
/// embedding model's width, then, with the cross-language model paired, one
/// of the rest (as the in-process pair stores them).
fn model_vector(seed: u64, dim: usize) -> Vec<f32> {
    let mut v = unit_vector(seed, mnemosyne::embed::DIM);
    if dim > mnemosyne::embed::DIM {
        v.extend(unit_vector(seed ^ 0x9e37_79b9_7f4a_7c15, dim - mnemosyne::embed::DIM));
    }
    v.into_iter().map(|x| x as f32).collect()
}

/// Gives every pending chunk of `lib` a random unit vector of `model`, with
/// the worker's statements (`embed_pending`, `embed_store`); returns how many.
async fn random_vectors(settings: &mnemosyne::config::Settings, model: &str, dim: usize, lib: &str) -> usize {
    use neo4rs::{query, BoltType, ConfigBuilder, Graph};
    let config = ConfigBuilder::default()
        .uri(settings.bolt_uri.as_str())
        .user(settings.bolt_user.as_str())
        .password(settings.bolt_password.expose())
        .db(settings.bolt_database.as_str())
        .build()
        .unwrap();
    let g = Graph::connect(config).unwrap();
    let mut total = 0;
    loop {
        let mut rows = Vec::new();
        let mut r = g
            .execute(
                query(include_str!("../cypher/embed_pending.cypher"))
                    .param("library_uid", lib)
                    .param("n", 500i64)
                    .param("skip", Vec::<String>::new()),
            )
            .await
            .unwrap();
        while let Ok(Some(row)) = r.next().await {
            let uid: String = row.get("uid").unwrap();
            let title: String = row.get("title").unwrap();
            let text: String = row.get("text").unwrap();
            rows.push((uid, title, text));
        }
        if rows.is_empty() {
            return total;
        }
        total += rows.len();
        let batch: Vec<BoltType> = rows
            .into_iter()
            .enumerate()
            .map(|(i, (uid, title, text))| {
                let mut m = std::collections::HashMap::<String, BoltType>::new();
                m.insert("uid".into(), uid.into());
                m.insert("title".into(), title.into());
                m.insert("text".into(), text.into());
                let v = model_vector((total + i) as u64, dim);
                m.insert("vec".into(), mnemosyne::store::graph::vectors::encode(&v).into());
                m.into()
            })
            .collect();
        let mut t = g.start_txn().await.unwrap();
        t.run(
            query(include_str!("../cypher/embed_store.cypher"))
                .param("library_uid", lib)
                .param("model", model)
                .param("rows", batch),
        )
        .await
        .unwrap();
        t.commit().await.unwrap();
    }
}

struct Stats {
    p50: Duration,
    p99: Duration,
    n: usize,
}

fn stats(mut v: Vec<Duration>) -> Stats {
    v.sort();
    let at = |q: f64| v[((v.len() as f64 * q) as usize).min(v.len() - 1)];
    Stats {
        p50: at(0.50),
        p99: at(0.99),
        n: v.len(),
    }
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

/// Failed (timed out) raw Lucene and graph-path searches: a broad query on a
/// large library at concurrency 32 outlasts the store timeout.
static RAW_ERRORS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

struct Target {
    http: reqwest::Client,
    url: String,
    token: String,
    /// The anchor: the scoped full-text query alone, over Bolt (index,
    /// query), best 10 by Lucene's score.
    lucene: (AdminGraph, &'static str, String),
    /// The query of the concurrency-1 and -32 runs (LOAD_QUERY, default
    /// "quasar tidal": `tidal` is in most chunks, a broad query).
    query: String,
    /// The mode of those runs (LOAD_MODE; unset: the server's default).
    mode: Option<String>,
    /// The tenant's view of the graph (the same reads the tool makes).
    graph: ScopedGraph,
}

impl Target {
    /// One `search` call: on a session (legacy revisions) when `session` is
    /// given, else a stateless 2026-07-28 request.
    async fn mcp_search(&self, session: Option<&str>) {
        self.mcp_search_as(session, self.mode.as_deref(), &self.query).await
    }

    /// `search` with `mode` (the server's default when `None`).
    async fn mcp_search_as(&self, session: Option<&str>, mode: Option<&str>, query: &str) {
        let mut args = json!({"query": query, "limit": 10});
        if let Some(m) = mode {
            args["mode"] = json!(m);
        }
        let mut params = json!({"name": "search", "arguments": args});
        let mut req = self
            .http
            .post(&self.url)
            .header("Authorization", format!("Bearer {}", self.token))
            .header("Accept", "application/json, text/event-stream");
        match session {
            Some(sid) => {
                req = req
                    .header("Mcp-Session-Id", sid)
                    .header("MCP-Protocol-Version", "2025-11-25")
            }
            None => {
                params["_meta"] = json!({"io.modelcontextprotocol/protocolVersion": "2026-07-28",
                                         "io.modelcontextprotocol/clientCapabilities": {}});
                req = req
                    .header("MCP-Protocol-Version", "2026-07-28")
                    .header("Mcp-Method", "tools/call")
                    .header("Mcp-Name", "search");
            }
        }
        let body = json!({"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": params});
        let r = req.json(&body).send().await.unwrap();
        assert!(r.status().is_success());
        let text = r.text().await.unwrap();
        assert!(
            text.contains("structuredContent") && !text.contains("\"isError\":true"),
            "{text}"
        );
    }

    /// initialize + notifications/initialized; the session id.
    async fn open_session(&self) -> String {
        let post = |body: serde_json::Value, sid: Option<&str>| {
            let mut req = self
                .http
                .post(&self.url)
                .header("Authorization", format!("Bearer {}", self.token))
                .header("Accept", "application/json, text/event-stream");
            if let Some(s) = sid {
                req = req
                    .header("Mcp-Session-Id", s)
                    .header("MCP-Protocol-Version", "2025-11-25");
            }
            req.json(&body).send()
        };
        let r = post(
            json!({"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {"protocolVersion": "2025-11-25",
                   "capabilities": {}, "clientInfo": {"name": "load", "version": "0"}}}),
            None,
        )
        .await
        .unwrap();
        let sid = r.headers()["mcp-session-id"].to_str().unwrap().to_owned();
        let _ = r.text().await;
        let r = post(
            json!({"jsonrpc": "2.0", "method": "notifications/initialized"}),
            Some(&sid),
        )
        .await
        .unwrap();
        assert!(r.status().is_success());
        sid
    }

    /// One stateless `search`, its answer not checked (waiting for the index).
    async fn mcp_search_quiet(&self) {
        let args = json!({"query": self.query, "limit": 10});
        let _ = common::stateless_search(&self.http, &self.url, &self.token, args)
            .send()
            .await;
    }

    async fn raw_lucene(&self) {
        let (admin, index, lucene) = &self.lucene;
        let q = neo4rs::query(
            "CALL db.index.fulltext.queryNodes($index, $lucene) YIELD node, score \
             RETURN node.uid AS uid, score LIMIT 10",
        )
        .param("index", *index)
        .param("lucene", lucene.as_str());
        match admin.rows_for_tests(q).await {
            Ok(rows) => assert!(!rows.is_empty()),
            Err(_) => {
                RAW_ERRORS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            }
        }
    }

    async fn raw_search(&self) {
        let hits = mnemosyne::search::engine::Engine::default()
            .run(
                &self.graph,
                &mnemosyne::search::engine::Search::keyword(&self.query, 10),
            )
            .await;
        match hits {
            Ok(hits) => assert!(!hits.is_empty()),
            Err(_) => {
                RAW_ERRORS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            }
        }
    }
}

/// One stateless `search` of `query` with `token`: Ok, or the HTTP status
/// (or 0 for a failed exchange or a tool error) — never a panic (floods).
async fn try_search(http: &reqwest::Client, url: &str, token: &str, query: &str) -> Result<(), u16> {
    let params = json!({"name": "search", "arguments": {"query": query, "limit": 10, "mode": "keyword"},
                        "_meta": {"io.modelcontextprotocol/protocolVersion": "2026-07-28",
                                  "io.modelcontextprotocol/clientCapabilities": {}}});
    let body = json!({"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": params});
    let r = http
        .post(url)
        .header("Authorization", format!("Bearer {token}"))
        .header("Accept", "application/json, text/event-stream")
        .header("MCP-Protocol-Version", "2026-07-28")
        .header("Mcp-Method", "tools/call")
        .header("Mcp-Name", "search")
        .json(&body)
        .send()
        .await
        .map_err(|_| 0u16)?;
    let status = r.status().as_u16();
    let text = r.text().await.map_err(|_| 0u16)?;
    match status {
        200 if text.contains("structuredContent") && !text.contains("\"isError\":true") => Ok(()),
        200 => Err(0),
        s => Err(s),
    }
}

async fn sequential<F, Fut>(n: usize, f: F) -> Stats
where
    F: Fn() -> Fut,
    Fut: std::future::Future<Output = ()>,
{
    for _ in 0..common::setting::<usize>("LOAD_WARMUP", 20) {
        f().await; // warm-up (a JVM graph server's JIT needs more than the default)
    }
    let mut v = Vec::with_capacity(n);
    for _ in 0..n {
        let t = Instant::now();
        f().await;
        v.push(t.elapsed());
    }
    stats(v)
}

/// Requests per second at `conc` concurrent workers for `secs` seconds.
#[derive(Clone, Copy, PartialEq)]
enum Mode {
    Lucene,
    Raw,
    Sessions,
    Stateless,
}

async fn throughput(t: Arc<Target>, conc: usize, secs: u64, mode: Mode) -> (f64, Stats) {
    let mut sessions = Vec::new();
    for _ in 0..conc {
        sessions.push(if mode == Mode::Sessions {
            Some(t.open_session().await)
        } else {
            None
        });
    }
    let deadline = Instant::now() + Duration::from_secs(secs);
    let mut handles = Vec::new();
    for session in sessions {
        let t = t.clone();
        handles.push(tokio::spawn(async move {
            let mut v = Vec::new();
            while Instant::now() < deadline {
                let s = Instant::now();
                match mode {
                    Mode::Raw => t.raw_search().await,
                    Mode::Lucene => t.raw_lucene().await,
                    _ => t.mcp_search(session.as_deref()).await,
                }
                v.push(s.elapsed());
            }
            v
        }));
    }
    let started = Instant::now();
    let mut all = Vec::new();
    for h in handles {
        all.extend(h.await.unwrap());
    }
    let rps = all.len() as f64 / started.elapsed().as_secs_f64();
    (rps, stats(all))
}

/// Waits until the server's index of the tenant is built (its first search
/// starts the build; a broad query on a large library may time out on the
/// graph path meanwhile), then until a search is answered from the index
/// alone (`mnemosyne_index_graph_fallbacks_total` did not move); at most
/// 10 min.
async fn wait_indexed(t: Arc<Target>, base: &str) {
    let metric = |name: &'static str| async move {
        let text = reqwest::get(format!("{base}/metrics"))
            .await
            .unwrap()
            .text()
            .await
            .unwrap();
        text.lines()
            .find_map(|l| l.strip_prefix(name).and_then(|v| v.strip_prefix(' ')))
            .and_then(|v| v.trim().parse::<f64>().ok())
            .unwrap_or(0.0)
    };
    // The first search starts the build (its answer, from the graph, is
    // not waited on).
    let first = {
        let t = t.clone();
        tokio::spawn(async move { t.mcp_search_quiet().await })
    };
    for _ in 0..6000 {
        if metric("mnemosyne_index_rebuilds_total").await >= 1.0
            && metric("mnemosyne_index_building_libraries").await == 0.0
        {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let _ = first.await;
    for _ in 0..600 {
        let before = metric("mnemosyne_index_graph_fallbacks_total").await;
        t.mcp_search_quiet().await;
        if metric("mnemosyne_index_graph_fallbacks_total").await == before {
            return;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("the index never answered");
}

/// One token floods (64 concurrent broad searches of the tenant) while a
/// small tenant searches one at a time: the small tenant's latency alone and
/// during the flood. The small tenant's client runs on a thread and runtime
/// of its own, with its own connections: on the bench's runtime its next
/// request would wait behind the 64 flooders' tasks, which measures the load
/// generator, not the server.
async fn flood(t: &Arc<Target>, tokens: &[String], width: usize, small_token: &str, requests: usize, secs: u64) {
    let (url, token) = (t.url.clone(), small_token.to_owned());
    let (solo_tx, solo_rx) = tokio::sync::oneshot::channel();
    let (start_tx, start_rx) = tokio::sync::oneshot::channel::<Instant>();
    let (during_tx, during_rx) = tokio::sync::oneshot::channel();
    std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async move {
            let http = reqwest::Client::new();
            let one = || async {
                let s = Instant::now();
                let out = try_search(&http, &url, &token, "quasar tidal").await;
                (s.elapsed(), out)
            };
            // Alone (after a warm-up of its index).
            for _ in 0..20 {
                let _ = one().await;
            }
            let (mut solo, mut solo_errors) = (Vec::new(), 0);
            for _ in 0..requests {
                let (d, out) = one().await;
                solo_errors += usize::from(out.is_err());
                solo.push(d);
            }
            let _ = solo_tx.send((solo, solo_errors));
            // During the flood, until its deadline.
            let Ok(deadline) = start_rx.await else { return };
            let (mut during, mut errors) = (Vec::new(), 0);
            while Instant::now() < deadline {
                let (d, out) = one().await;
                errors += usize::from(out.is_err());
                during.push(d);
            }
            let _ = during_tx.send((during, errors));
        })
    });
    let (solo, solo_errors) = solo_rx.await.expect("the other tenant's client");
    let solo = stats(solo);
    let deadline = Instant::now() + Duration::from_secs(secs);
    let mut flooders = Vec::new();
    for i in 0..width {
        let token = tokens[i % tokens.len()].clone();
        let (http, url, query) = (t.http.clone(), t.url.clone(), t.query.clone());
        flooders.push(tokio::spawn(async move {
            let (mut ok, mut refused, mut failed) = (0usize, 0usize, 0usize);
            while Instant::now() < deadline {
                match try_search(&http, &url, &token, &query).await {
                    Ok(()) => ok += 1,
                    Err(429) => {
                        refused += 1;
                        tokio::time::sleep(Duration::from_millis(20)).await;
                    }
                    Err(_) => failed += 1,
                }
            }
            (ok, refused, failed)
        }));
    }
    tokio::time::sleep(Duration::from_millis(200)).await;
    let _ = start_tx.send(deadline);
    let (during, errors) = during_rx.await.expect("the other tenant's client");
    let (mut ok, mut refused, mut failed) = (0, 0, 0);
    for f in flooders {
        let (a, b, c) = f.await.unwrap();
        (ok, refused, failed) = (ok + a, refused + b, failed + c);
    }
    let n = during.len();
    let during = stats(during);
    let who = match tokens.len() {
        1 => "one token".to_owned(),
        n => format!("one user's {n} tokens"),
    };
    println!("\n== flood ({secs} s: {who} at {width} concurrent broad searches of the tenant; a 200-chunk tenant at concurrency 1) ==");
    println!(
        "other tenant alone       : p50 {:7.2} ms  p99 {:7.2} ms  ({} requests, {solo_errors} errors)",
        ms(solo.p50),
        ms(solo.p99),
        solo.n
    );
    println!(
        "other tenant during flood: p50 {:7.2} ms  p99 {:7.2} ms  ({n} requests, {errors} errors)",
        ms(during.p50),
        ms(during.p99)
    );
    println!(
        "p50 during / alone = {:.2}× (goal ≤ 2×), p99 {:.2}× (goal ≤ 3×, 0 errors); the flooder: {ok} answered, {refused} refused (429), {failed} failed",
        ms(during.p50) / ms(solo.p50),
        ms(during.p99) / ms(solo.p99)
    );
}

fn main() {
    common::block_on("search_load", run());
}

async fn run() {
    let tenant_chunks = common::setting::<usize>("LOAD_TENANT_CHUNKS", 200);
    let other_chunks = common::setting::<usize>("LOAD_OTHER_CHUNKS", 2000);
    let growth: Vec<usize> = std::env::var("LOAD_GROWTH")
        .unwrap_or_else(|_| "10,100".into())
        .split(',')
        .filter_map(|f| f.trim().parse().ok())
        .collect();
    let requests = common::setting::<usize>("LOAD_REQUESTS", 300);
    let seconds = common::setting::<usize>("LOAD_SECONDS", 8) as u64;

    let (mut settings, pool, admin) = common::fresh_settings("load").await;
    // LOAD_CROSS=0: the embedding model alone, without the cross-language
    // model .dev/env pairs with it (the baseline).
    if std::env::var("LOAD_CROSS").is_ok_and(|v| v == "0") {
        settings.cross_model = None;
    }
    settings.public_url = "http://127.0.0.1:0".into();
    // A load generator is one principal far above any per-principal limit.
    settings.rate_limit_per_minute = 0;
    settings.tool_rate_limit_per_minute = 0;
    // Bulk loads and the final cleanup take longer than a request may.
    let graph = GraphStore::connect(&settings)
        .await
        .unwrap()
        .with_timeout(Duration::from_secs(600));
    let graph = graph.into_handles();
    let ns = format!("ld{}", &uuid::Uuid::new_v4().simple().to_string()[..8]);
    let tenant = format!("{ns}_tenant");
    let others: Vec<String> = (0..10).map(|i| format!("{ns}_other_{i}")).collect();
    for l in std::iter::once(&tenant).chain(&others) {
        graph
            .admin
            .create_library(l, l, "load", Language::English)
            .await
            .unwrap();
    }
    let t0 = Instant::now();
    fill(&graph.admin, &tenant, 0, tenant_chunks).await;
    for (i, l) in others.iter().enumerate() {
        fill(&graph.admin, l, 1_000_000 * (i + 1), other_chunks / others.len()).await;
    }
    println!(
        "corpus: tenant {tenant_chunks} chunks, others {other_chunks} chunks (loaded in {:.1} s)",
        t0.elapsed().as_secs_f64()
    );

    users::create(&pool, "load", None, false).await.unwrap();
    users::grant(&pool, "load", &tenant, users::Role::Owner).await.unwrap();
    let token = mnemosyne::service::tokens::mint(&pool, "load", "load", &[tenant.clone()], None)
        .await
        .unwrap()
        .plaintext;
    // The flood section's other tenant: a small library of its own.
    let small = format!("{ns}_small");
    graph
        .admin
        .create_library(&small, &small, "load", Language::English)
        .await
        .unwrap();
    fill(&graph.admin, &small, 5_000_000, 200).await;
    // Another person's token: a user's tokens share the user's search
    // slots and buckets, and the flood section measures one tenant beside another.
    users::create(&pool, "load-small", None, false).await.unwrap();
    users::grant(&pool, "load-small", &small, users::Role::Owner)
        .await
        .unwrap();
    let small_token = mnemosyne::service::tokens::mint(&pool, "load-small", "load-small", &[small.clone()], None)
        .await
        .unwrap()
        .plaintext;
    // With a model: vectors written here, the worker idle (scoped to no library).
    let model = match &settings.embed_model {
        Some(dir) => {
            // The model as `serve` pairs it (`MNEMOSYNE_CROSS_MODEL`).
            let embedder = mnemosyne::embed::in_process(dir, settings.cross_model.as_deref()).unwrap();
            let (id, dim) = (embedder.id().to_owned(), embedder.dim());
            settings.embed_scope_prefix = format!("{ns}_none");
            let t0 = Instant::now();
            let mut n = random_vectors(&settings, &id, dim, &tenant).await;
            for l in &others {
                n += random_vectors(&settings, &id, dim, l).await;
            }
            println!(
                "vectors: {n} random unit vectors of {id} written in {:.1} s",
                t0.elapsed().as_secs_f64()
            );
            Some(id)
        }
        None => None,
    };
    // In process by default; with LOAD_SERVER_BIN=path/to/mnemosyne the server
    // runs as its own process (as deployed), the load generator here.
    let (base, server) = common::start_server("LOAD_SERVER_BIN", &settings).await;
    let url = format!("{base}/mcp/");
    let query = std::env::var("LOAD_QUERY").unwrap_or_else(|_| "quasar tidal".into());
    println!(
        "query: {query:?}, mode: {}",
        std::env::var("LOAD_MODE").unwrap_or_else(|_| "the server's default".into())
    );
    let words = mnemosyne::analysis::scoped::query_words(Language::English, &query);
    let (_, lucene) = mnemosyne::analysis::scoped::scoped_queries(&[tenant.clone()], &words).remove(0);
    let flavor_index = GraphStore::connect(&settings).await.unwrap().flavor.fulltext_index();
    let target = Arc::new(Target {
        http: reqwest::Client::builder().pool_max_idle_per_host(64).build().unwrap(),
        url,
        token,
        lucene: (AdminGraph::connect(&settings).await.unwrap(), flavor_index, lucene),
        query,
        mode: std::env::var("LOAD_MODE").ok().filter(|m| !m.is_empty()),
        graph: graph.knowledge.scoped(&Principal::for_tests([tenant.clone()])),
    });
    // The server's index of the tenant is built (from the graph) on its
    // first search; measure once it answers.
    if settings.index_dir.is_some() {
        let t0 = Instant::now();
        wait_indexed(target.clone(), &base).await;
        println!(
            "index: the tenant's index answered after {:.1} s",
            t0.elapsed().as_secs_f64()
        );
    }

    let t = target.clone();
    let sid = t.open_session().await;
    let mcp1 = sequential(requests, || t.mcp_search(Some(&sid))).await;
    let stateless1 = sequential(requests, || t.mcp_search(None)).await;
    let raw1 = sequential(requests, || t.raw_search()).await;
    let lucene1 = sequential(requests, || t.raw_lucene()).await;
    println!("\n== concurrency 1 ({} requests) ==", mcp1.n);
    println!(
        "raw Lucene      : p50 {:7.2} ms  p99 {:7.2} ms  (the scoped full-text query alone, best 10)",
        ms(lucene1.p50),
        ms(lucene1.p99)
    );
    println!(
        "graph path      : p50 {:7.2} ms  p99 {:7.2} ms  (ScopedGraph::search without the index: before)",
        ms(raw1.p50),
        ms(raw1.p99)
    );
    println!(
        "MCP (session)   : p50 {:7.2} ms  p99 {:7.2} ms",
        ms(mcp1.p50),
        ms(mcp1.p99)
    );
    println!(
        "MCP (stateless) : p50 {:7.2} ms  p99 {:7.2} ms",
        ms(stateless1.p50),
        ms(stateless1.p99)
    );
    println!(
        "MCP p50 − raw Lucene p50 = {:+.2} ms (goal ≤ +0.3 ms)",
        ms(mcp1.p50) - ms(lucene1.p50)
    );

    // LOAD_ALSO ("|"-separated): more queries at concurrency 1 on the same
    // corpus, each beside its raw Lucene query (a selective point of the
    // curve beside the broad one, without loading a large corpus twice).
    let also = std::env::var("LOAD_ALSO").unwrap_or_default();
    for q in also.split('|').map(str::trim).filter(|q| !q.is_empty()) {
        let words = mnemosyne::analysis::scoped::query_words(Language::English, q);
        let (_, lucene) = mnemosyne::analysis::scoped::scoped_queries(&[tenant.clone()], &words).remove(0);
        let t = Arc::new(Target {
            http: target.http.clone(),
            url: target.url.clone(),
            token: target.token.clone(),
            lucene: (target.lucene.0.clone(), target.lucene.1, lucene),
            query: q.to_owned(),
            mode: target.mode.clone(),
            graph: target.graph.clone(),
        });
        // Stateless: the session of the runs above may have expired while
        // the graph-side baselines ran (minutes on a large library).
        let mcp = sequential(requests, || t.mcp_search(None)).await;
        let lucene = sequential(requests, || t.raw_lucene()).await;
        println!(
            "query {q:?}: MCP (stateless) p50 {:7.2} ms  p99 {:7.2} ms; raw Lucene p50 {:7.2} ms  p99 {:7.2} ms",
            ms(mcp.p50),
            ms(mcp.p99),
            ms(lucene.p50),
            ms(lucene.p99)
        );
    }

    // LOAD_SECONDS=0 skips concurrency 32 (a big tenant's broad query would
    // only measure timeouts).
    if seconds > 0 {
        let (lucene_rps, lucene32) = throughput(target.clone(), 32, seconds, Mode::Lucene).await;
        let (raw_rps, raw32) = throughput(target.clone(), 32, seconds, Mode::Raw).await;
        // The server process's own CPU per search (with LOAD_SERVER_BIN):
        // steadier than req/s on a shared machine, where the load and the
        // stores take the same cores.
        let cpu = || server.as_ref().map_or(f64::NAN, |s| common::cpu_seconds(s.pid));
        let c0 = cpu();
        let (mcp_rps, mcp32) = throughput(target.clone(), 32, seconds, Mode::Sessions).await;
        let c1 = cpu();
        let (sl_rps, sl32) = throughput(target.clone(), 32, seconds, Mode::Stateless).await;
        let c2 = cpu();
        let per_search = |cpu: f64, n: usize| 1e6 * cpu / n.max(1) as f64;
        println!("\n== concurrency 32 ({seconds} s each; 32 MCP sessions) ==");
        println!(
            "raw Lucene      : {lucene_rps:8.1} req/s  p50 {:7.2} ms  p99 {:7.2} ms",
            ms(lucene32.p50),
            ms(lucene32.p99)
        );
        println!(
            "graph path      : {raw_rps:8.1} req/s  p50 {:7.2} ms  p99 {:7.2} ms",
            ms(raw32.p50),
            ms(raw32.p99)
        );
        println!(
            "MCP (sessions)  : {mcp_rps:8.1} req/s  p50 {:7.2} ms  p99 {:7.2} ms",
            ms(mcp32.p50),
            ms(mcp32.p99)
        );
        println!(
            "MCP (stateless) : {sl_rps:8.1} req/s  p50 {:7.2} ms  p99 {:7.2} ms",
            ms(sl32.p50),
            ms(sl32.p99)
        );
        if server.is_some() {
            println!(
                "server CPU per search (sessions / stateless): {:.0} / {:.0} µs (the server process's user + system time over the searches answered)",
                per_search(c1 - c0, mcp32.n),
                per_search(c2 - c1, sl32.n)
            );
        }
        println!(
            "raw Lucene and graph-path searches that failed (store timeout): {}",
            RAW_ERRORS.load(std::sync::atomic::Ordering::Relaxed)
        );
        println!(
            "MCP sessions / raw Lucene throughput = {:.0} % (goal ≥ 100 %); stateless {:.0} %",
            100.0 * mcp_rps / lucene_rps,
            100.0 * sl_rps / lucene_rps
        );
    }

    let flood_seconds = common::setting::<u64>("LOAD_FLOOD_SECONDS", 5);
    if flood_seconds > 0 {
        // The same user's 25 tokens (the first is the tenant's token).
        let mut user_tokens = vec![target.token.clone()];
        for i in 1..25 {
            let name = format!("load-{i}");
            let minted = mnemosyne::service::tokens::mint(&pool, "load", &name, &[tenant.clone()], None)
                .await
                .unwrap();
            user_tokens.push(minted.plaintext);
        }
        let widths: Vec<usize> = std::env::var("LOAD_FLOOD_WIDTHS")
            .unwrap_or_else(|_| "32,64".into())
            .split(',')
            .filter_map(|w| w.trim().parse().ok())
            .collect();
        for &width in &widths {
            let one = std::slice::from_ref(&target.token);
            flood(&target, one, width, &small_token, requests, flood_seconds).await;
            flood(&target, &user_tokens, width, &small_token, requests, flood_seconds).await;
        }
    }

    // Search modes at concurrency 1 (with a model): a repeated query (its
    // vector cached after the first) and a fresh query text each time.
    let mut hybrid1 = None;
    if model.is_some() {
        println!(
            "\n== modes (concurrency 1, stateless, {requests} requests, tenant {tenant_chunks} chunks, query \"magnetar\") =="
        );
        let fresh = std::sync::atomic::AtomicUsize::new(0);
        let mut keyword_p50 = 0.0;
        for (label, mode, fresh_query) in [
            ("keyword          ", "keyword", false),
            ("hybrid (repeated)", "hybrid", false),
            ("hybrid (fresh)   ", "hybrid", true),
            ("semantic (repeat)", "semantic", false),
        ] {
            let t = target.clone();
            let fresh = &fresh;
            let st = sequential(requests, || {
                let t = t.clone();
                async move {
                    // Selective (one chunk in a thousand matches), as most
                    // questions are; the bench's broad query reads a tenth.
                    let q = if fresh_query {
                        format!("magnetar {}", fresh.fetch_add(1, std::sync::atomic::Ordering::Relaxed))
                    } else {
                        "magnetar".to_owned()
                    };
                    t.mcp_search_as(None, Some(mode), &q).await
                }
            })
            .await;
            if mode == "keyword" {
                keyword_p50 = ms(st.p50);
            } else if mode == "hybrid" && !fresh_query {
                hybrid1 = Some(st.p50);
            }
            println!(
                "{label}: p50 {:7.2} ms  p99 {:7.2} ms  (p50 {:+.2} ms vs keyword; goal hybrid ≤ +20, repeated ≤ +3)",
                ms(st.p50),
                ms(st.p99),
                ms(st.p50) - keyword_p50
            );
        }
    }

    // Grow the other tenants step by step (LOAD_GROWTH: comma-separated
    // factors, e.g. "10,100"), measuring the tenant after each step.
    println!("\n== tenant isolation (concurrency 1) ==");
    let mut have = other_chunks;
    for factor in &growth {
        let want = other_chunks * factor;
        if want <= have {
            continue;
        }
        let t0 = Instant::now();
        let extra = want - have;
        for (i, l) in others.iter().enumerate() {
            fill(
                &graph.admin,
                l,
                1_000_000 * (i + 1) + have / others.len(),
                extra / others.len(),
            )
            .await;
        }
        have = want;
        println!(
            "grew other tenants to {want} chunks ({factor}×) in {:.1} s",
            t0.elapsed().as_secs_f64()
        );
        // Let the graph server finish indexing the bulk load before measuring.
        tokio::time::sleep(Duration::from_secs(10)).await;
        let t = target.clone();
        let mcp_big = sequential(requests, || t.mcp_search(Some(&sid))).await;
        if let Some(h1) = hybrid1 {
            let t = target.clone();
            let h = sequential(requests, || t.mcp_search_as(None, Some("hybrid"), "magnetar")).await;
            println!(
                "  hybrid p50 (repeated query): {:7.2} ms → {:7.2} ms  ({:.2}×, goal ≤ 1.1×)",
                ms(h1),
                ms(h.p50),
                ms(h.p50) / ms(h1)
            );
        }
        let raw_big = sequential(requests, || t.raw_search()).await;
        println!(
            "  MCP p50 : {:7.2} ms → {:7.2} ms  ({:.2}×, goal ≤ 1.5×)",
            ms(mcp1.p50),
            ms(mcp_big.p50),
            ms(mcp_big.p50) / ms(mcp1.p50)
        );
        println!(
            "  raw p50 : {:7.2} ms → {:7.2} ms  ({:.2}×)",
            ms(raw1.p50),
            ms(raw_big.p50),
            ms(raw_big.p50) / ms(raw1.p50)
        );
    }

    drop(server);
    let all: Vec<String> = [tenant, small].into_iter().chain(others).collect();
    graph.admin.delete_libraries(&all).await.unwrap();
    common::drop_db(&admin, &settings.database_url).await;
}
