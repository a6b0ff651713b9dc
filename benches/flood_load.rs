//! Valid `search` traffic while someone floods the server (issue 12).
//!
//! The server runs as its own process (this profile's `mnemosyne serve`). A
//! valid opaque token runs `search` at concurrency 16 for FLOOD_SECONDS (8),
//! first alone, then while a second process (this benchmark re-executed with
//! `--flood`) sends 200 wrong HTTP Basic passwords and 200 unknown bearers a
//! second. Prints throughput, p50/p99 and the server's RSS. Goals: valid
//! throughput ≥ 90 % of the unflooded figure, p99 ≤ 2×, RSS growth ≤ 50 MB.
//! Loopback only; every loop is bounded in time.
//!
//!   cargo bench --bench flood_load

#[path = "common.rs"]
mod common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use mnemosyne::store::pg::users;
use serde_json::json;

fn main() {
    let args: Vec<String> = std::env::args().collect();
    match args.iter().position(|a| a == "--flood") {
        Some(i) => common::block_on("flood_load", flood(args[i + 1].clone(), args[i + 2].parse().unwrap())),
        None => common::block_on("flood_load", run()),
    };
}

/// The flooding process: 200 wrong Basic passwords and 200 unknown bearers a
/// second against `base`, for `secs` seconds.
async fn flood(base: String, secs: u64) {
    let http = reqwest::Client::new();
    let mut tick = tokio::time::interval(Duration::from_millis(5));
    let end = Instant::now() + Duration::from_secs(secs);
    let mut i = 0u64;
    let mut sent = 0u64;
    while Instant::now() < end {
        tick.tick().await;
        i += 1;
        let (http, base) = (http.clone(), base.clone());
        tokio::spawn(async move {
            let _ = http
                .get(format!(
                    "{base}/mcp_server/api/teams/00000000-0000-0000-0000-000000000001/"
                ))
                .basic_auth("daedalus-service", Some(format!("wrong-{i}")))
                .timeout(Duration::from_secs(5))
                .send()
                .await;
            let _ = http
                .post(format!("{base}/mcp/"))
                .header("Authorization", format!("Bearer mnm_flood_{i}"))
                .header("Accept", "application/json, text/event-stream")
                .json(&json!({"jsonrpc": "2.0", "id": 1, "method": "tools/list"}))
                .timeout(Duration::from_secs(5))
                .send()
                .await;
        });
        sent += 2;
    }
    eprintln!("flood: {sent} requests sent");
}

struct Load {
    http: reqwest::Client,
    url: String,
    token: String,
}

impl Load {
    async fn search(&self) -> bool {
        let params = json!({"name": "search", "arguments": {"query": "harbour tide", "limit": 10},
            "_meta": {"io.modelcontextprotocol/protocolVersion": "2026-07-28",
                      "io.modelcontextprotocol/clientCapabilities": {}}});
        let r = self
            .http
            .post(&self.url)
            .header("Authorization", format!("Bearer {}", self.token))
            .header("Accept", "application/json, text/event-stream")
            .header("MCP-Protocol-Version", "2026-07-28")
            .header("Mcp-Method", "tools/call")
            .header("Mcp-Name", "search")
            .json(&json!({"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": params}))
            .send()
            .await;
        match r {
            Ok(r) if r.status().is_success() => r.text().await.is_ok_and(|t| t.contains("structuredContent")),
            _ => false,
        }
    }
}

/// Requests/s, p50, p99 (ms) and failures at `conc` workers for `secs`.
async fn measure(load: Arc<Load>, conc: usize, secs: u64) -> (f64, f64, f64, usize) {
    let deadline = Instant::now() + Duration::from_secs(secs);
    let started = Instant::now();
    let handles: Vec<_> = (0..conc)
        .map(|_| {
            let load = load.clone();
            tokio::spawn(async move {
                let (mut v, mut failed) = (Vec::new(), 0usize);
                while Instant::now() < deadline {
                    let t = Instant::now();
                    if load.search().await {
                        v.push(t.elapsed());
                    } else {
                        failed += 1;
                    }
                }
                (v, failed)
            })
        })
        .collect();
    let (mut all, mut failed) = (Vec::new(), 0);
    for h in handles {
        let (v, f) = h.await.unwrap();
        all.extend(v);
        failed += f;
    }
    let rps = all.len() as f64 / started.elapsed().as_secs_f64();
    all.sort();
    let pct = |p: f64| all[((all.len() as f64 * p) as usize).min(all.len() - 1)].as_secs_f64() * 1000.0;
    (rps, pct(0.5), pct(0.99), failed)
}

async fn run() {
    let secs: u64 = common::setting("FLOOD_SECONDS", 8);
    let (settings, pool, admin) = common::fresh_settings("flood").await;
    let hash = mnemosyne::auth::basic::hash_password("correct horse").unwrap();
    users::create(&pool, "daedalus-service", Some(&hash), true)
        .await
        .unwrap();
    let server = common::ServerProcess::start(
        env!("CARGO_BIN_EXE_mnemosyne"),
        &settings.database_url,
        &[
            ("MNEMOSYNE_RATE_LIMIT_PER_MINUTE", "0"),
            ("MNEMOSYNE_TOOL_RATE_LIMIT_PER_MINUTE", "0"),
            ("MNEMOSYNE_LOG", "error"),
        ],
    )
    .await;
    let (pid, base) = (server.pid, server.base.clone());
    // A small tenant: 40 items ingested through the API.
    let http = reqwest::Client::new();
    let ws = format!("flood_{}", &uuid::Uuid::new_v4().simple().to_string()[..8]);
    let mut library = String::new();
    for i in 0..40 {
        let r = http
            .post(format!("{base}/library/api/ingest/"))
            .basic_auth("daedalus-service", Some("correct horse"))
            .json(&json!({"workspace_id": ws, "item": {"title": format!("Note {i}")},
                          "content": format!("# Harbour {i}\n\nThe tide in harbour {i} turns twice a day; \
                                              pilots wait for slack water before entering.")}))
            .send()
            .await
            .unwrap();
        assert!(r.status().is_success(), "ingest: {}", r.status());
        library = r.json::<serde_json::Value>().await.unwrap()["library_uid"]
            .as_str()
            .unwrap()
            .to_owned();
    }
    users::create(&pool, "reader", None, false).await.unwrap();
    users::grant(&pool, "reader", &library, users::Role::Owner)
        .await
        .unwrap();
    let token = mnemosyne::service::tokens::mint(&pool, "reader", "load", &[library.clone()], None)
        .await
        .unwrap()
        .plaintext;
    let load = Arc::new(Load {
        http: reqwest::Client::builder().pool_max_idle_per_host(64).build().unwrap(),
        url: format!("{base}/mcp/"),
        token,
    });
    assert!(load.search().await);
    measure(load.clone(), 16, 2).await; // warm-up

    let rss0 = common::rss_mb(pid);
    let (rps, p50, p99, failed) = measure(load.clone(), 16, secs).await;
    println!("\n== valid search, concurrency 16, {secs} s ==");
    println!("alone        : {rps:8.1} req/s  p50 {p50:6.2} ms  p99 {p99:6.2} ms  failed {failed}  RSS {rss0:.1} MB");

    let mut flooder = std::process::Command::new(std::env::current_exe().unwrap())
        .args(["--flood", &base, &(secs + 1).to_string()])
        .spawn()
        .unwrap();
    tokio::time::sleep(Duration::from_millis(500)).await;
    let (frps, fp50, fp99, ffailed) = measure(load.clone(), 16, secs).await;
    let rss1 = common::rss_mb(pid);
    let _ = flooder.wait();
    println!(
        "while flooded: {frps:8.1} req/s  p50 {fp50:6.2} ms  p99 {fp99:6.2} ms  failed {ffailed}  RSS {rss1:.1} MB"
    );
    println!(
        "throughput {:.0} % of alone (goal ≥ 90 %), p99 {:.2}× (goal ≤ 2×), RSS {:+.1} MB (goal ≤ +50)",
        100.0 * frps / rps,
        fp99 / p99,
        rss1 - rss0
    );
    drop(server);
    let graph = mnemosyne::store::graph::ingest::AdminGraph::connect(&settings)
        .await
        .unwrap();
    let _ = graph.delete_libraries(&[library]).await;
    common::drop_db(&admin, &settings.database_url).await;
}
