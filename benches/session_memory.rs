//! Session memory: opens SESSIONS (default 20,000) legacy MCP sessions against
//! the server running as its own process (built in this profile), never
//! deletes them, lets them expire on the idle timeout, and prints the server's
//! RSS along the way. Goal (issue 9): after they expire, RSS is back within
//! 50 MB of where it started. Bounded: at most SESSIONS requests, loopback only.
//!
//!   cargo bench --bench session_memory            (SESSIONS=20000 IDLE_SECS=10)

#[path = "common.rs"]
mod common;

use std::time::{Duration, Instant};

use mnemosyne::store::pg::users;
use serde_json::json;

fn main() {
    common::block_on("session_memory", run());
}

async fn run() {
    let sessions: u64 = common::setting("SESSIONS", 20_000);
    let idle: u64 = common::setting("IDLE_SECS", 10);
    let conc: usize = common::setting("CONCURRENCY", 16);
    let (settings, pool, admin) = common::fresh_settings("sessions").await;
    users::create(&pool, "mem", None, false).await.unwrap();
    let token = mnemosyne::service::tokens::mint(&pool, "mem", "mem", &[], None)
        .await
        .unwrap()
        .plaintext;
    let caps = (sessions + 1).to_string();
    let idle_s = idle.to_string();
    let server = common::ServerProcess::start(
        env!("CARGO_BIN_EXE_mnemosyne"),
        &settings.database_url,
        &[
            ("MNEMOSYNE_SESSION_IDLE_SECS", &idle_s),
            ("MNEMOSYNE_SESSIONS_PER_CREDENTIAL", &caps),
            ("MNEMOSYNE_SESSIONS_MAX", &caps),
            ("MNEMOSYNE_RATE_LIMIT_PER_MINUTE", "0"),
        ],
    )
    .await;
    let (pid, base) = (server.pid, server.base.clone());
    let http = reqwest::Client::new();
    let url = format!("{base}/mcp/");
    let init = json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "mem", "version": "0"}}});
    // Warm up (allocator arenas, pools, caches) before the baseline.
    let open = |n: u64| {
        let (http, url, token, init) = (http.clone(), url.clone(), token.clone(), init.clone());
        async move {
            let mut ok = 0u64;
            let mut failed = 0u64;
            let per = n.div_ceil(conc as u64);
            let tasks: Vec<_> = (0..conc)
                .map(|_| {
                    let (http, url, token, init) = (http.clone(), url.clone(), token.clone(), init.clone());
                    tokio::spawn(async move {
                        let (mut ok, mut failed) = (0u64, 0u64);
                        for _ in 0..per {
                            let r = http
                                .post(&url)
                                .header("Accept", "application/json, text/event-stream")
                                .header("Authorization", format!("Bearer {token}"))
                                .json(&init)
                                .send()
                                .await;
                            match r {
                                Ok(r) if r.status().is_success() => {
                                    let _ = r.bytes().await;
                                    ok += 1
                                }
                                _ => failed += 1,
                            }
                        }
                        (ok, failed)
                    })
                })
                .collect();
            for t in tasks {
                let (o, f) = t.await.unwrap();
                ok += o;
                failed += f;
            }
            (ok, failed)
        }
    };
    let gauge = || async { reqwest::get(format!("{base}/healthz")).await.map(|_| ()).ok() };
    open(500).await;
    tokio::time::sleep(Duration::from_secs(idle + 3)).await;
    gauge().await;
    let baseline = common::rss_mb(pid);
    println!("server RSS baseline after warm-up: {baseline:.1} MB");
    for wave in 1..=2 {
        let t0 = Instant::now();
        let (ok, failed) = open(sessions).await;
        let peak = common::rss_mb(pid);
        println!(
            "wave {wave}: {ok} sessions opened ({failed} failed) in {:.1} s; RSS {peak:.1} MB (+{:.1})",
            t0.elapsed().as_secs_f64(),
            peak - baseline
        );
        // Bounded wait for the idle timeout to close them all.
        let mut after = peak;
        for s in 0..(idle + 30) {
            tokio::time::sleep(Duration::from_secs(1)).await;
            after = common::rss_mb(pid);
            if s % 5 == 4 {
                println!("  t+{:>3} s: RSS {after:.1} MB", s + 1);
            }
        }
        println!(
            "wave {wave}: after expiry RSS {after:.1} MB ({:+.1} MB vs baseline; goal ≤ +50)",
            after - baseline
        );
    }
    drop(server);
    common::drop_db(&admin, &settings.database_url).await;
}
