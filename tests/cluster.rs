//! Three replicas behind HAProxy, round robin, no stickiness (issue 31):
//! `scripts/cluster up 3` with the shipped deploy/haproxy/haproxy.cfg, real
//! `mnemosyne serve` processes over one test database, and the project's own
//! API through the balancer — team REST, ingest then search, MCP sessions in
//! the 2025-11-25 and 2025-03-26 revisions (each rebuilt on every replica),
//! stateless 2026-07-28, and DELETE ending a session everywhere. And two
//! replicas with the embedding model whose leader is SIGKILLed mid-queue.
//! `scripts/test` runs them once per pass (about 15 s and 20–45 s).

#![allow(clippy::cloned_ref_to_slice_refs)]

#[path = "api/helpers.rs"]
#[allow(dead_code)]
mod helpers;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use helpers::{McpClient, TestApp, SERVICE_PASSWORD, SERVICE_USER};
use reqwest::StatusCode;
use serde_json::{json, Value};

const REPLICAS: usize = 3;

/// The cluster of this test: stopped (`scripts/cluster down`) when dropped,
/// whatever the test's outcome.
struct Cluster {
    dir: PathBuf,
    base: String,
    replicas: usize,
}

fn script() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/cluster")
}

/// Where the cluster's ports start: below the kernel's ephemeral range
/// (32768–60999 by default), so that no connection's local port and no
/// test's `127.0.0.1:0` listener can take one between the script's check and
/// the replica's bind. Each test of this file has a range of its own
/// (`slot`), random within it: the two run at once, and in one CI run (stop
/// 64) both failed together, as one's replicas answering the other's
/// balancer would make them (a team "not found", a missing leader gauge).
fn base_port(slot: u16) -> u16 {
    use rand::Rng;
    20_000 + 6_000 * slot + 32 * rand::thread_rng().gen_range(0..185u16)
}

impl Cluster {
    fn up(app: &TestApp) -> Cluster {
        Self::up_with(app, 0, REPLICAS, &[])
    }

    /// `replicas` replicas with `env` added to their settings, on ports of
    /// range `slot` (one per test).
    fn up_with(app: &TestApp, slot: u16, replicas: usize, env: &[(&str, String)]) -> Cluster {
        let dir = std::env::temp_dir().join(format!("mnemosyne-cluster-{}", app.ns));
        let port = base_port(slot);
        let mut cmd = Command::new(script());
        cmd.args(["up", &replicas.to_string()])
            .env("MNEMOSYNE_BIN", env!("CARGO_BIN_EXE_mnemosyne"))
            .env("CLUSTER_DIR", &dir)
            .env("CLUSTER_PORT", port.to_string())
            .env("MNEMOSYNE_DATABASE_URL", &app.settings.database_url)
            // Keyword-only replicas unless `env` names a model (the model
            // would embed on 2 cores).
            .env_remove("MNEMOSYNE_EMBED_MODEL")
            .env("MNEMOSYNE_SHUTDOWN_DELAY_SECS", "0");
        for (k, v) in env {
            cmd.env(k, v);
        }
        let out = cmd.output().expect("run scripts/cluster up");
        let cluster = Cluster {
            dir,
            base: String::from_utf8_lossy(&out.stdout).trim().to_owned(),
            replicas,
        };
        assert!(
            out.status.success(),
            "scripts/cluster up failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        cluster
    }

    fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base)
    }

    /// Each replica's own address (not through the balancer).
    fn replicas(&self) -> Vec<String> {
        (1..=self.replicas)
            .map(|i| {
                let port = std::fs::read_to_string(self.dir.join(format!("replica-{i}.port"))).unwrap();
                format!("http://127.0.0.1:{}", port.trim())
            })
            .collect()
    }

    /// Replica `i`'s (from 0) process id.
    fn pid(&self, i: usize) -> i32 {
        std::fs::read_to_string(self.dir.join(format!("replica-{}.pid", i + 1)))
            .unwrap()
            .trim()
            .parse()
            .unwrap()
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        let _ = Command::new(script())
            .arg("down")
            .env("CLUSTER_DIR", &self.dir)
            .output();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// The `mcp_sessions_active` gauge of one replica.
async fn sessions_on(http: &reqwest::Client, replica: &str) -> i64 {
    let text = http
        .get(format!("{replica}/metrics"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    text.lines()
        .find_map(|l| {
            let (name, value) = l.split_once(' ')?;
            name.ends_with("mcp_sessions_active")
                .then(|| value.trim().parse().ok())?
        })
        .unwrap_or_else(|| panic!("no mcp_sessions_active on {replica}"))
}

/// `search` finds `word` in the caller's libraries.
async fn finds(c: &mut McpClient, word: &str) -> bool {
    let out = c.call_ok("search", json!({"query": word})).await;
    out["results"].as_array().is_some_and(|r| !r.is_empty())
}

#[tokio::test]
async fn three_replicas_behind_round_robin_haproxy_serve_the_whole_api() {
    let app = TestApp::spawn().await;
    let cluster = Cluster::up(&app);
    let http = reqwest::Client::builder()
        .timeout(Duration::from_secs(30))
        .build()
        .unwrap();
    let service = |m: reqwest::Method, path: &str| {
        http.request(m, cluster.url(path))
            .basic_auth(SERVICE_USER, Some(SERVICE_PASSWORD))
    };

    // Team REST and ingest, through the balancer.
    let team = uuid::Uuid::new_v4();
    let r = service(reqwest::Method::POST, "/mcp_server/api/teams/")
        .json(&json!({"id": team, "name": "cluster"}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::CREATED);
    let jwt = r.json::<Value>().await.unwrap()["jwt"].as_str().unwrap().to_owned();
    let ws = app.uid("ws_cluster");
    let r = service(
        reqwest::Method::PUT,
        &format!("/mcp_server/api/teams/{team}/workspaces/"),
    )
    .json(&json!({"workspace_ids": [ws]}))
    .send()
    .await
    .unwrap();
    assert_eq!(r.status(), StatusCode::OK);
    let r = service(reqwest::Method::POST, "/library/api/ingest/")
        .json(&json!({"workspace_id": ws, "item": {"title": "Balancers"},
                      "content": "# Balancers\n\nRound robin spreads the quokkabalance requests evenly."}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::CREATED);

    // A session in today's revision: every call lands on the next replica.
    let mut session = McpClient::new(http.clone(), cluster.url("/mcp/"), &jwt).connect().await;
    let sid = session.session.clone().unwrap();
    for _ in 0..2 * REPLICAS {
        assert_eq!(session.list_tools().await.status, StatusCode::OK);
    }
    // Right after the acknowledged ingest, on whichever replica (bounded).
    let mut found = 0;
    for _ in 0..30 {
        found = if finds(&mut session, "quokkabalance").await {
            found + 1
        } else {
            0
        };
        if found == REPLICAS {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(found, REPLICAS, "every replica finds the ingested chunk");
    // Every replica rebuilt the session (one copy each).
    for replica in cluster.replicas() {
        assert_eq!(sessions_on(&http, &replica).await, 1, "on {replica}");
    }

    // A session in an older revision.
    let mut old = McpClient::new(http.clone(), cluster.url("/mcp/"), &jwt);
    let ex = old
        .post(
            json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
                "protocolVersion": "2025-03-26", "capabilities": {},
                "clientInfo": {"name": "old", "version": "0"}}}),
            &[],
        )
        .await;
    assert_eq!(ex.status, StatusCode::OK, "{ex:?}");
    let old_sid = ex.headers["mcp-session-id"].to_str().unwrap().to_owned();
    let old_header = [
        ("MCP-Protocol-Version", "2025-03-26"),
        ("Mcp-Session-Id", old_sid.as_str()),
    ];
    let n = old
        .post(
            json!({"jsonrpc": "2.0", "method": "notifications/initialized"}),
            &old_header,
        )
        .await;
    assert!(n.status.is_success(), "{n:?}");
    for id in 2..2 + REPLICAS as i64 {
        let ex = old
            .post(
                json!({"jsonrpc": "2.0", "id": id, "method": "tools/call",
                       "params": {"name": "search", "arguments": {"query": "quokkabalance"}}}),
                &old_header,
            )
            .await;
        assert_eq!(ex.status, StatusCode::OK, "{ex:?}");
        assert!(ex.response().get("result").is_some(), "{ex:?}");
    }

    // Stateless 2026-07-28.
    let mut stateless = McpClient::new(http.clone(), cluster.url("/mcp/"), &jwt).stateless();
    for _ in 0..REPLICAS {
        assert_eq!(stateless.list_tools().await.status, StatusCode::OK);
        assert!(finds(&mut stateless, "quokkabalance").await);
    }

    // DELETE through the balancer ends the session on every replica.
    let r = http
        .delete(cluster.url("/mcp/"))
        .header("Authorization", format!("Bearer {jwt}"))
        .header("Mcp-Session-Id", &sid)
        .header("MCP-Protocol-Version", "2025-11-25")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::NO_CONTENT);
    let mut gone = 0;
    for _ in 0..50 {
        gone = if session.list_tools().await.status == StatusCode::NOT_FOUND {
            gone + 1
        } else {
            0
        };
        if gone == REPLICAS {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(gone, REPLICAS, "404 on every replica");
}

/// One number of a replica's `/metrics` (None: absent or unreachable).
async fn gauge(http: &reqwest::Client, replica: &str, name: &str) -> Option<i64> {
    let text = http
        .get(format!("{replica}/metrics"))
        .send()
        .await
        .ok()?
        .text()
        .await
        .ok()?;
    text.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.trim().parse::<f64>().ok())
        .map(|v| v as i64)
}

/// Issue 31: the embedding leader is killed (SIGKILL, mid-queue); the other
/// replica leads within 5 s (it tries the lock once a second; the lock goes
/// with the dead process's connection), drains the queue, and embeds nothing
/// the dead leader had stored: what it embeds plus what the leader was last
/// seen to have embedded is at most the queue, and every chunk ends with a
/// vector (a semantic search finds each one).
#[tokio::test]
async fn killing_the_embedding_leader_hands_the_queue_to_another_replica_within_5_s() {
    // The debug build embeds slowly (its own GELU and softmax unoptimised):
    // short chunks, few of them, batches of two, so the queue outlives the
    // first batch and the survivor drains the rest in seconds.
    const CHUNKS: i64 = 16;
    let app = TestApp::spawn().await;
    let lib = app.library("queue").await;
    let cluster = Cluster::up_with(
        &app,
        1,
        2,
        &[
            ("MNEMOSYNE_EMBED_MODEL", helpers::model_dir().display().to_string()),
            ("MNEMOSYNE_EMBED_SCOPE_PREFIX", app.ns.clone()),
            ("MNEMOSYNE_EMBED_BATCH", "2".into()),
        ],
    );
    // Queued once both replicas are up: one chunk per item.
    for i in 0..CHUNKS {
        app.ingest(json!({"library_uid": lib, "item": {"title": format!("Flat {i}")},
                          "content": format!("Mudflat {i}: tidal flats store carbon in their silt, \
                                              and shorebirds follow the tide line across the mud.")}))
            .await;
    }
    let http = reqwest::Client::builder()
        .timeout(Duration::from_secs(10))
        .build()
        .unwrap();
    let replicas = cluster.replicas();
    // The leader, once it has stored a first batch (bounded: 120 s).
    let started = Instant::now();
    let (leader, seen) = 'found: loop {
        for (i, r) in replicas.iter().enumerate() {
            if gauge(&http, r, "mnemosyne_embedding_leader").await == Some(1) {
                let n = gauge(&http, r, "mnemosyne_embedded_chunks_total").await.unwrap_or(0);
                if n >= 2 {
                    break 'found (i, n);
                }
            }
        }
        assert!(
            started.elapsed() < Duration::from_secs(120),
            "no replica led and embedded"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert!(seen < CHUNKS, "the leader drained the queue before it could be killed");
    let other = &replicas[1 - leader];
    assert_eq!(gauge(&http, other, "mnemosyne_embedding_leader").await, Some(0));
    // SIGKILL: no drain, no goodbye; its lock connection dies with it.
    assert!(Command::new("kill")
        .args(["-KILL", &cluster.pid(leader).to_string()])
        .status()
        .unwrap()
        .success());
    let killed = Instant::now();
    while gauge(&http, other, "mnemosyne_embedding_leader").await != Some(1) {
        assert!(
            killed.elapsed() < Duration::from_secs(5),
            "no replica took over within 5 s of the leader's death"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let takeover = killed.elapsed();
    // The queue drains (bounded: 120 s) on the survivor alone.
    let drained = Instant::now();
    while !app.state.admin.embedding_backlog(&app.ns).await.unwrap().is_empty() {
        assert!(drained.elapsed() < Duration::from_secs(120), "the queue never drained");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let took_over = gauge(&http, other, "mnemosyne_embedded_chunks_total").await.unwrap();
    println!(
        "leader killed after storing {seen} of {CHUNKS} chunks; the survivor led after {} ms and embedded {took_over}",
        takeover.as_millis()
    );
    assert!(took_over >= 1, "the survivor embedded nothing");
    assert!(
        took_over + seen <= CHUNKS,
        "embedded twice: the survivor embedded {took_over}, the dead leader had stored {seen}, of {CHUNKS}"
    );
    // Every chunk has its vector: a semantic search through the survivor
    // finds all of them.
    let token = app.opaque_token(&[lib.clone()]).await;
    let mut c = McpClient::new(http.clone(), format!("{other}/mcp/"), &token)
        .connect()
        .await;
    // A search the survivor answers with a tool error (a store or the
    // model's query slower than the search's deadline while it catches up
    // with the vectors the dead leader stored) is asked again within the
    // same bound; the last answer is shown if the bound passes.
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let r = c
            .call(
                "search",
                json!({"query": "mudflat carbon birds", "mode": "semantic", "limit": 50, "min_relevance": 0}),
            )
            .await;
        let hits = r["structuredContent"]["results"].as_array().map_or(0, Vec::len) as i64;
        if r["isError"] != json!(true) && hits == CHUNKS {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "semantic search finds {hits} of {CHUNKS} chunks (last answer: {r})"
        );
        if r["isError"] == json!(true) {
            println!("the survivor answered a search with an error (asked again): {r}");
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}
