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

fn env(name: &str, default: u64) -> u64 {
    std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

fn rss_mb(pid: u32) -> f64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<f64>().ok())
        .map(|kb| kb / 1024.0)
        .unwrap_or(f64::NAN)
}

fn main() {
    if std::env::args().any(|a| a == "--list") {
        println!("session_memory: bench");
        return;
    }
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(run());
}

async fn run() {
    let sessions = env("SESSIONS", 20_000);
    let idle = env("IDLE_SECS", 10);
    let conc = env("CONCURRENCY", 16) as usize;
    let (settings, pool, admin) = common::fresh_settings("sessions").await;
    users::create(&pool, "mem", None, false).await.unwrap();
    let (_, token) = mnemosyne::cli::create_token(&pool, "mem", "mem", &[], None)
        .await
        .unwrap();
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_mnemosyne"))
        .arg("serve")
        .env("MNEMOSYNE_DATABASE_URL", &settings.database_url)
        .env("MNEMOSYNE_LISTEN", format!("127.0.0.1:{port}"))
        .env("MNEMOSYNE_PUBLIC_URL", format!("http://127.0.0.1:{port}"))
        .env("MNEMOSYNE_SESSION_IDLE_SECS", idle.to_string())
        .env("MNEMOSYNE_SESSIONS_PER_CREDENTIAL", (sessions + 1).to_string())
        .env("MNEMOSYNE_SESSIONS_MAX", (sessions + 1).to_string())
        .env("MNEMOSYNE_RATE_LIMIT_PER_MINUTE", "0")
        .env("MNEMOSYNE_LOG", "warn")
        .spawn()
        .unwrap();
    let pid = child.id();
    let base = format!("http://127.0.0.1:{port}");
    for _ in 0..100 {
        if reqwest::get(format!("{base}/readyz"))
            .await
            .is_ok_and(|r| r.status().is_success())
        {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
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
    let baseline = rss_mb(pid);
    println!("server RSS baseline after warm-up: {baseline:.1} MB");
    for wave in 1..=2 {
        let t0 = Instant::now();
        let (ok, failed) = open(sessions).await;
        let peak = rss_mb(pid);
        println!(
            "wave {wave}: {ok} sessions opened ({failed} failed) in {:.1} s; RSS {peak:.1} MB (+{:.1})",
            t0.elapsed().as_secs_f64(),
            peak - baseline
        );
        // Bounded wait for the idle timeout to close them all.
        let mut after = peak;
        for s in 0..(idle + 30) {
            tokio::time::sleep(Duration::from_secs(1)).await;
            after = rss_mb(pid);
            if s % 5 == 4 {
                println!("  t+{:>3} s: RSS {after:.1} MB", s + 1);
            }
        }
        println!(
            "wave {wave}: after expiry RSS {after:.1} MB ({:+.1} MB vs baseline; goal ≤ +50)",
            after - baseline
        );
    }
    let _ = child.kill();
    let _ = child.wait();
    common::drop_db(&admin, &settings.database_url).await;
}
