//! Soak: the server as its own process under a steady mix of every tool,
//! ingest and team changes, for SOAK_MINUTES (30) — loopback only, bounded in
//! time. Every minute it prints the server's RSS, open file descriptors, the
//! minute's request count, p99 and failures. Goal (issue 13): flat memory
//! (≤ 10 % growth after the first minutes' warm-up) and flat p99.
//!
//!   cargo bench --bench soak                   (SOAK_MINUTES=30 SOAK_CLIENTS=8)

#[path = "common.rs"]
mod common;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use mnemosyne::store::pg::users;
use serde_json::{json, Value};

fn fds(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .map(|d| d.count())
        .unwrap_or(0)
}

fn main() {
    common::block_on("soak", run());
}

struct Soak {
    http: reqwest::Client,
    base: String,
    bearers: Vec<String>,
    latencies: Mutex<Vec<Duration>>,
    requests: AtomicU64,
    failures: AtomicU64,
    /// Every failed call by what it was and what came back (printed at the end).
    why: Mutex<std::collections::BTreeMap<String, u64>>,
}

impl Soak {
    fn failed(&self, what: String) {
        *self.why.lock().unwrap().entry(what).or_default() += 1;
    }

    async fn mcp(&self, bearer: &str, tool: &str, args: Value) -> Option<Value> {
        let params = json!({"name": tool, "arguments": args,
            "_meta": {"io.modelcontextprotocol/protocolVersion": "2026-07-28",
                      "io.modelcontextprotocol/clientCapabilities": {}}});
        let r = self
            .http
            .post(format!("{}/mcp/", self.base))
            .header("Authorization", format!("Bearer {bearer}"))
            .header("Accept", "application/json, text/event-stream")
            .header("MCP-Protocol-Version", "2026-07-28")
            .header("Mcp-Method", "tools/call")
            .header("Mcp-Name", tool)
            .json(&json!({"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": params}))
            .send()
            .await;
        let r = match r {
            Ok(r) => r,
            Err(e) => {
                self.failed(format!(
                    "{tool}: transport: {}",
                    if e.is_timeout() { "timeout" } else { "error" }
                ));
                return None;
            }
        };
        if !r.status().is_success() {
            self.failed(format!("{tool}: HTTP {}", r.status().as_u16()));
            return None;
        }
        let Ok(v) = r.json::<Value>().await else {
            self.failed(format!("{tool}: unreadable body"));
            return None;
        };
        if v["result"]["isError"] == json!(true) {
            let text = v["result"]["content"][0]["text"]
                .as_str()
                .unwrap_or("")
                .chars()
                .take(60)
                .collect::<String>();
            self.failed(format!("{tool}: isError {text}"));
            return None;
        }
        Some(v["result"]["structuredContent"].clone())
    }

    async fn service(&self, method: reqwest::Method, path: &str, body: Option<Value>) -> bool {
        let mut req = self
            .http
            .request(method, format!("{}{path}", self.base))
            .basic_auth("daedalus-service", Some("correct horse"));
        if let Some(b) = body {
            req = req.json(&b);
        }
        match req.send().await {
            Ok(r) if r.status().is_success() => true,
            Ok(r) => {
                self.failed(format!("{path}: HTTP {}", r.status().as_u16()));
                false
            }
            Err(_) => {
                self.failed(format!("{path}: transport"));
                false
            }
        }
    }

    /// One step of a client: a tool call, or now and then an ingest or a team change.
    async fn step(&self, client: usize, n: u64, ws: &[String], team: uuid::Uuid) -> bool {
        let bearer = &self.bearers[client % self.bearers.len()];
        match n % 20 {
            0 => {
                let w = &ws[(n as usize / 20) % ws.len()];
                self.service(
                    reqwest::Method::POST,
                    "/library/api/ingest/",
                    // An item uid belongs to one library: keep each uid in one workspace.
                    Some(json!({"workspace_id": w, "item": {"uid": format!("soak-{w}-{client}-{}", n % 50), "title": "Soak"},
                                "content": format!("# Soak {n}\n\nTide tables and harbour pilots, revision {n}.")})),
                )
                .await
            }
            10 if client == 0 => {
                let attach: Vec<&String> = ws.iter().take(1 + (n as usize / 20) % ws.len()).collect();
                self.service(
                    reqwest::Method::PUT,
                    &format!("/mcp_server/api/teams/{team}/workspaces/"),
                    Some(json!({"workspace_ids": attach})),
                )
                .await
            }
            1..=9 => self
                .mcp(bearer, "search", json!({"query": "harbour tide"}))
                .await
                .is_some(),
            11 | 12 => {
                let hits = self.mcp(bearer, "search", json!({"query": "pilots", "limit": 1})).await;
                match hits.and_then(|h| h["results"][0]["chunk_uid"].as_str().map(str::to_owned)) {
                    Some(c) => self
                        .mcp(bearer, "get_chunk", json!({"chunk_uid": c, "context": 1}))
                        .await
                        .is_some(),
                    None => true, // an empty scope (team between changes) is a fine answer
                }
            }
            13 | 14 => self.mcp(bearer, "list_libraries", json!({})).await.is_some(),
            15 | 16 => {
                let libs = self.mcp(bearer, "list_libraries", json!({})).await;
                match libs.and_then(|l| l["libraries"][0]["uid"].as_str().map(str::to_owned)) {
                    Some(l) => {
                        self.mcp(bearer, "list_collections", json!({"library_uid": l}))
                            .await
                            .is_some()
                            && self
                                .mcp(bearer, "list_items", json!({"library_uid": l, "limit": 20}))
                                .await
                                .is_some()
                    }
                    None => true,
                }
            }
            _ => self.mcp(bearer, "get_health", json!({})).await.is_some(),
        }
    }
}

async fn run() {
    let minutes: u64 = common::setting("SOAK_MINUTES", 30);
    let clients: usize = common::setting("SOAK_CLIENTS", 8);
    let (settings, pool, admin) = common::fresh_settings("soak").await;
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
    let http = reqwest::Client::builder()
        .pool_max_idle_per_host(64)
        .timeout(Duration::from_secs(30))
        .build()
        .unwrap();
    let tag = &uuid::Uuid::new_v4().simple().to_string()[..8];
    let ws: Vec<String> = (0..4).map(|i| format!("soak_{tag}_{i}")).collect();
    let mut soak = Soak {
        http,
        base: base.clone(),
        bearers: Vec::new(),
        latencies: Mutex::new(Vec::new()),
        requests: AtomicU64::new(0),
        failures: AtomicU64::new(0),
        why: Mutex::new(Default::default()),
    };
    let mut libraries = Vec::new();
    for (i, w) in ws.iter().enumerate() {
        let r = soak
            .http
            .post(format!("{base}/library/api/ingest/"))
            .basic_auth("daedalus-service", Some("correct horse"))
            .json(&json!({"workspace_id": w, "item": {"title": format!("Seed {i}")},
                          "content": "# Harbour\n\nThe tide turns twice a day; pilots wait for slack water."}))
            .send()
            .await
            .unwrap();
        let v: Value = r.json().await.unwrap();
        libraries.push(v["library_uid"].as_str().unwrap().to_owned());
    }
    users::create(&pool, "reader", None, false).await.unwrap();
    for l in &libraries {
        users::grant(&pool, "reader", l, users::Role::Owner).await.unwrap();
    }
    let token = mnemosyne::service::tokens::mint(&pool, "reader", "soak", &libraries, None)
        .await
        .unwrap()
        .plaintext;
    let team = uuid::Uuid::new_v4();
    let r = soak
        .http
        .post(format!("{base}/mcp_server/api/teams/"))
        .basic_auth("daedalus-service", Some("correct horse"))
        .json(&json!({"id": team, "name": "Soak"}))
        .send()
        .await
        .unwrap();
    let team_jwt = r.json::<Value>().await.unwrap()["jwt"].as_str().unwrap().to_owned();
    soak.bearers = vec![token, team_jwt];
    let soak = Arc::new(soak);

    let end = Instant::now() + Duration::from_secs(minutes * 60);
    let workers: Vec<_> = (0..clients)
        .map(|c| {
            let (soak, ws) = (soak.clone(), ws.clone());
            tokio::spawn(async move {
                let mut n = c as u64;
                while Instant::now() < end {
                    let t = Instant::now();
                    let ok = soak.step(c, n, &ws, team).await;
                    soak.latencies.lock().unwrap().push(t.elapsed());
                    soak.requests.fetch_add(1, Ordering::Relaxed);
                    if !ok {
                        soak.failures.fetch_add(1, Ordering::Relaxed);
                    }
                    n += 1;
                }
            })
        })
        .collect();
    println!("minute   RSS MB   fds   requests   p99 ms   failures");
    let mut first_rss = None;
    for m in 1..=minutes {
        let next = Instant::now() + Duration::from_secs(60);
        tokio::time::sleep_until(next.into()).await;
        let mut lat = std::mem::take(&mut *soak.latencies.lock().unwrap());
        lat.sort();
        let p99 = lat
            .get(((lat.len() as f64) * 0.99) as usize)
            .or(lat.last())
            .map_or(0.0, |d| d.as_secs_f64() * 1000.0);
        let rss = common::rss_mb(pid);
        if m == 2 {
            first_rss = Some(rss);
        }
        println!(
            "{m:>6} {rss:>8.1} {:>5} {:>10} {p99:>8.2} {:>10}",
            fds(pid),
            soak.requests.swap(0, Ordering::Relaxed),
            soak.failures.swap(0, Ordering::Relaxed)
        );
    }
    for w in workers {
        let _ = w.await;
    }
    if let Some(base_rss) = first_rss {
        let last = common::rss_mb(pid);
        println!(
            "RSS after warm-up (minute 2) {base_rss:.1} MB → end {last:.1} MB ({:+.1} %; goal ≤ +10 %)",
            100.0 * (last - base_rss) / base_rss
        );
    }
    println!("failures by call and answer:");
    for (what, n) in soak.why.lock().unwrap().iter() {
        println!("  {n:>6}  {what}");
    }
    drop(server);
    let graph = mnemosyne::store::graph::ingest::AdminGraph::connect(&settings)
        .await
        .unwrap();
    let _ = graph.delete_libraries(&libraries).await;
    common::drop_db(&admin, &settings.database_url).await;
}
