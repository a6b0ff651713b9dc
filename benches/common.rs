//! Shared set-up for benchmarks: a fresh database on the dev services.
#![allow(dead_code)] // each benchmark uses part of it

use mnemosyne::config::Settings;
use mnemosyne::store::pg;

/// Settings pointing at a new, migrated database named `mnemosyne_bench_<tag>_<rand>`,
/// and the graph's schema in place (constraints, scoping indexes, the full-text
/// index; idempotent), as `mnemosyne migrate` leaves it: on a graph `scripts/dev up`
/// has just created, a search would otherwise fail and concurrent ingests could
/// duplicate a uid no constraint guards yet.
pub async fn fresh_settings(tag: &str) -> (Settings, sqlx::PgPool, String) {
    let mut s = Settings::from_env().expect("settings (run scripts/dev up)");
    let (server, _) = s.database_url.rsplit_once('/').expect("database URL");
    let admin = format!("{server}/postgres");
    let db = format!(
        "mnemosyne_bench_{tag}_{}",
        &uuid::Uuid::new_v4().simple().to_string()[..8]
    );
    let a = sqlx::PgPool::connect(&admin)
        .await
        .expect("Postgres reachable (run scripts/dev up)");
    sqlx::query(&format!("CREATE DATABASE \"{db}\""))
        .execute(&a)
        .await
        .unwrap();
    a.close().await;
    s.database_url = format!("{server}/{db}");
    s.listen = "127.0.0.1:0".parse().unwrap();
    let pool = pg::pool(&s.database_url, std::time::Duration::from_secs(5)).unwrap();
    pg::migrate(&pool).await.unwrap();
    pg::keys::ensure_active(&pool).await.unwrap();
    mnemosyne::store::graph::GraphStore::connect(&s)
        .await
        .expect("graph reachable (run scripts/dev up)")
        .with_timeout(std::time::Duration::from_secs(600))
        .bootstrap_schema()
        .await
        .expect("graph schema");
    (s, pool, admin)
}

pub async fn drop_db(admin: &str, url: &str) {
    let db = url.rsplit_once('/').unwrap().1;
    if let Ok(a) = sqlx::PgPool::connect(admin).await {
        let _ = sqlx::query(&format!("DROP DATABASE IF EXISTS \"{db}\" WITH (FORCE)"))
            .execute(&a)
            .await;
    }
}

/// A numeric setting of a benchmark from the environment, or its default.
pub fn setting<T: std::str::FromStr>(name: &str, default: T) -> T {
    std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

/// A deterministic pseudo-random unit vector of the model's width.
pub fn unit_vector(seed: u64) -> Vec<f32> {
    let mut x = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
    let v: Vec<f32> = (0..mnemosyne::embed::DIM)
        .map(|_| {
            x = x.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            ((x >> 40) as f32 / (1u64 << 24) as f32) - 0.5
        })
        .collect();
    let n = v.iter().map(|a| a * a).sum::<f32>().sqrt();
    v.into_iter().map(|a| a / n).collect()
}

/// Runs the benchmark on two workers (the machines have two cores); `--list`
/// (cargo's bench discovery) prints its name and runs nothing.
pub fn block_on<F: std::future::Future>(name: &str, f: F) -> Option<F::Output> {
    if std::env::args().any(|a| a == "--list") {
        println!("{name}: bench");
        return None;
    }
    // The allocator and one core per text, as `serve` sets them (main.rs):
    // the embedding model then runs on its caller's thread, at the worker's
    // priority.
    mnemosyne::memory::tune_allocator();
    if std::env::var_os("RAYON_NUM_THREADS").is_none() {
        std::env::set_var("RAYON_NUM_THREADS", "1");
    }
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    Some(rt.block_on(f))
}

/// The CPU time a process has used so far (user + system), in seconds
/// (from /proc; NaN when it cannot be read).
pub fn cpu_seconds(pid: u32) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    // Fields after the command name (which may hold spaces) in its parentheses.
    let fields: Vec<&str> = stat
        .rsplit_once(')')
        .map(|(_, rest)| rest.split_whitespace().collect())
        .unwrap_or_default();
    // utime and stime are fields 14 and 15 of the line, 12 and 13 after ')'.
    let ticks = |i: usize| fields.get(i).and_then(|v| v.parse::<f64>().ok());
    // SAFETY: sysconf only reads a system constant.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64;
    match (ticks(11), ticks(12)) {
        (Some(u), Some(s)) if hz > 0.0 => (u + s) / hz,
        _ => f64::NAN,
    }
}

/// Resident memory of a process, in MB (from /proc).
pub fn rss_mb(pid: u32) -> f64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<f64>().ok())
        .map(|kb| kb / 1024.0)
        .unwrap_or(f64::NAN)
}

/// `mnemosyne serve` as its own process on a free loopback port, over the
/// benchmark's database; killed on drop.
pub struct ServerProcess {
    child: std::process::Child,
    pub pid: u32,
    pub base: String,
}

impl ServerProcess {
    /// Starts `bin` with `env` on top of the database and address settings
    /// and waits (bounded) until `/readyz` answers.
    pub async fn start(bin: &str, database_url: &str, env: &[(&str, &str)]) -> ServerProcess {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let base = format!("http://127.0.0.1:{port}");
        let mut cmd = std::process::Command::new(bin);
        cmd.arg("serve")
            .env("MNEMOSYNE_DATABASE_URL", database_url)
            .env("MNEMOSYNE_LISTEN", format!("127.0.0.1:{port}"))
            .env("MNEMOSYNE_PUBLIC_URL", &base)
            .env("MNEMOSYNE_LOG", "warn");
        for (k, v) in env {
            cmd.env(k, v);
        }
        let child = cmd.spawn().unwrap();
        for _ in 0..100 {
            if reqwest::get(format!("{base}/readyz"))
                .await
                .is_ok_and(|r| r.status().is_success())
            {
                break;
            }
            tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        }
        ServerProcess {
            pid: child.id(),
            child,
            base,
        }
    }
}

/// A load-generating bench's server, unlimited: `bin_var` names a binary to
/// run as its own process (as deployed, or an older build); else the server
/// runs in this process. Returns its base URL and the process, if any (kept
/// alive until dropped).
pub async fn start_server(bin_var: &str, settings: &Settings) -> (String, Option<ServerProcess>) {
    match std::env::var(bin_var) {
        Ok(bin) => {
            let s = ServerProcess::start(
                &bin,
                &settings.database_url,
                &[
                    ("MNEMOSYNE_RATE_LIMIT_PER_MINUTE", "0"),
                    ("MNEMOSYNE_TOOL_RATE_LIMIT_PER_MINUTE", "0"),
                    ("MNEMOSYNE_EMBED_SCOPE_PREFIX", &settings.embed_scope_prefix),
                ],
            )
            .await;
            println!("server: {bin}, its own process at {}", s.base);
            (s.base.clone(), Some(s))
        }
        Err(_) => {
            let mut settings = settings.clone();
            settings.rate_limit_per_minute = 0;
            settings.tool_rate_limit_per_minute = 0;
            let app = mnemosyne::startup::Application::build(settings).await.unwrap();
            let base = format!("http://{}", app.local_addr());
            tokio::spawn(app.run_until(std::future::pending()));
            tokio::time::sleep(std::time::Duration::from_millis(300)).await;
            println!("server: in process");
            (base, None)
        }
    }
}

impl Drop for ServerProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Words of the synthetic corpora (search_load, ingest_load).
pub const WORDS: &[&str] = &[
    "harbour",
    "tidal",
    "turbine",
    "kelp",
    "carbon",
    "sediment",
    "glacier",
    "current",
    "salinity",
    "plankton",
    "estuary",
    "reef",
    "delta",
    "monsoon",
    "aquifer",
    "basalt",
    "lagoon",
    "fjord",
    "dune",
    "marsh",
    "trench",
    "upwelling",
    "gyre",
    "shoal",
    "brine",
    "cobble",
    "silt",
    "tundra",
    "permafrost",
    "mangrove",
];

/// The committed quality corpus's documents, (title, text) each.
pub fn corpus() -> Vec<(String, String)> {
    let corpus = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/benches/quality/corpus.jsonl"))
        .expect("benches/quality/corpus.jsonl");
    corpus
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .map(|v| {
            (
                v["title"].as_str().unwrap_or("").to_owned(),
                v["text"].as_str().unwrap_or("").to_owned(),
            )
        })
        .collect()
}

/// Chunks a second of a plain client of an OpenAI-compatible `url`: `texts` in requests of `batch`,
/// `in_flight` at once.
pub async fn plain_embeddings(url: &str, texts: &[String], batch: usize, in_flight: usize) -> f64 {
    plain_embeddings_timed(url, texts, batch, in_flight).await.0
}

/// `plain_embeddings`, and its rate from its first answer to its last (the
/// texts after the first answer over that time: the steady rate, as a worker's
/// drain is read from its first stored batch).
pub async fn plain_embeddings_timed(url: &str, texts: &[String], batch: usize, in_flight: usize) -> (f64, f64) {
    use futures::StreamExt;
    use serde_json::{json, Value};
    let client = reqwest::Client::new();
    let t = std::time::Instant::now();
    let answered: Vec<(usize, std::time::Duration)> = futures::stream::iter(texts.chunks(batch).map(<[String]>::to_vec))
        .map(|part| {
            let client = client.clone();
            async move {
                let body = json!({"model": "multilingual-e5-small", "input": part, "encoding_format": "float", "input_type": "passage"});
                let v: Value = client.post(url).json(&body).send().await.unwrap().json().await.unwrap();
                (v["data"].as_array().map_or(0, Vec::len), t.elapsed())
            }
        })
        .buffer_unordered(in_flight)
        .collect()
        .await;
    assert_eq!(answered.iter().map(|a| a.0).sum::<usize>(), texts.len());
    let overall = texts.len() as f64 / t.elapsed().as_secs_f64();
    // In the order they were answered.
    let (first, last) = (answered[0], answered[answered.len() - 1]);
    let steady = match last.1.checked_sub(first.1) {
        Some(d) if answered.len() > 1 && !d.is_zero() => (texts.len() - first.0) as f64 / d.as_secs_f64(),
        _ => overall,
    };
    (overall, steady)
}

/// A stateless (2026-07-28) MCP `search` call with `arguments`, to `mcp_url`
/// (`…/mcp/`), as a bearer of `token`: the request, to send.
pub fn stateless_search(
    http: &reqwest::Client,
    mcp_url: &str,
    token: &str,
    arguments: serde_json::Value,
) -> reqwest::RequestBuilder {
    let body = serde_json::json!({"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {
        "name": "search", "arguments": arguments,
        "_meta": {"io.modelcontextprotocol/protocolVersion": "2026-07-28",
                  "io.modelcontextprotocol/clientCapabilities": {}}}});
    http.post(mcp_url)
        .header("Authorization", format!("Bearer {token}"))
        .header("Accept", "application/json, text/event-stream")
        .header("MCP-Protocol-Version", "2026-07-28")
        .header("Mcp-Method", "tools/call")
        .header("Mcp-Name", "search")
        .json(&body)
}

/// The service user benches ingest as (Basic auth).
pub const SERVICE_USER: &str = "bench-service";
pub const SERVICE_PASSWORD: &str = "bench password, not a secret";

/// Creates `SERVICE_USER` in `pool`.
pub async fn service_user(pool: &sqlx::PgPool) {
    let hash = mnemosyne::auth::basic::hash_password(SERVICE_PASSWORD).unwrap();
    mnemosyne::store::pg::users::create(pool, SERVICE_USER, Some(&hash), true)
        .await
        .unwrap();
}

/// Creates library `lib` through the service API of `base`, and a user
/// `reader` owning it: that user's token for it.
pub async fn reader_library(http: &reqwest::Client, base: &str, pool: &sqlx::PgPool, lib: &str) -> String {
    let r = http
        .post(format!("{base}/library/api/libraries/"))
        .basic_auth(SERVICE_USER, Some(SERVICE_PASSWORD))
        .json(&serde_json::json!({"uid": lib, "name": lib}))
        .send()
        .await
        .unwrap();
    assert!(r.status().is_success(), "library create: {}", r.status());
    mnemosyne::store::pg::users::create(pool, "reader", None, false)
        .await
        .unwrap();
    mnemosyne::store::pg::users::grant(pool, "reader", lib, mnemosyne::store::pg::users::Role::Owner)
        .await
        .unwrap();
    mnemosyne::service::tokens::mint(pool, "reader", "reader", &[lib.to_owned()], None)
        .await
        .unwrap()
        .plaintext
}

/// One stateless MCP `search` of `base` (`stateless_search`) with
/// `arguments`: how long it took and its note. A failed search panics.
pub async fn timed_search(
    http: &reqwest::Client,
    base: &str,
    token: &str,
    arguments: serde_json::Value,
) -> (std::time::Duration, Option<String>) {
    let t = std::time::Instant::now();
    let r = stateless_search(http, &format!("{base}/mcp/"), token, arguments)
        .send()
        .await
        .unwrap();
    let text = r.text().await.unwrap();
    let took = t.elapsed();
    let json: serde_json::Value = serde_json::from_str(&text).unwrap_or_else(|_| {
        text.lines()
            .filter_map(|l| l.strip_prefix("data:"))
            .filter_map(|d| serde_json::from_str::<serde_json::Value>(d.trim()).ok())
            .find(|v| v.get("result").is_some())
            .unwrap_or_else(|| panic!("no answer in {text}"))
    });
    let result = &json["result"];
    assert!(result["isError"] != serde_json::json!(true), "search failed: {json}");
    let note = result["structuredContent"]["note"].as_str().map(str::to_owned);
    (took, note)
}

/// The median of `v`, in ms (sorts it).
pub fn p50_ms(v: &mut [std::time::Duration]) -> f64 {
    v.sort();
    v[v.len() / 2].as_secs_f64() * 1000.0
}
