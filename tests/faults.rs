//! Faults (issue 13), produced for real on store processes this binary starts
//! itself — its own ArcadeDB and its own PostgreSQL cluster — so the parallel
//! suite never feels them. Run serially (`--test-threads=1`, as scripts/test
//! does). Under a bounded mixed load with credentials of different scopes each
//! test asserts: no answer wider than the credential; no wrong "not found" or
//! empty answer for data that exists; errors in the documented shapes (503,
//! `isError`); every request started ≥ 1 s after the store returned succeeds;
//! nothing hangs past the store timeout plus a margin; the server lives on.

// `&[x.clone()]` reads better than `slice::from_ref(&x)` in test arrangements.
#![allow(clippy::cloned_ref_to_slice_refs)]

#[allow(dead_code)]
#[path = "api/helpers.rs"]
mod helpers;

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use helpers::{free_port, McpClient, TestApp};
use mnemosyne::auth::changes::AuthChanges;
use mnemosyne::config::Settings;
use mnemosyne::service::ingest::{self, Document, DocumentIn};
use mnemosyne::store::graph::GraphStore;
use reqwest::StatusCode;
use serde_json::json;

const STORE_TIMEOUT_MS: u64 = 2_000;
/// Store timeout of the setup (schema, seed data), which is not under test.
const SETUP_TIMEOUT_MS: u64 = 60_000;
/// How long after its store is back (answering a query of its own) the
/// server may still fail a request. A restarted JVM runs its first queries
/// interpreted: on a loaded 2-core CI machine a few took longer than the
/// 2 s store timeout within the first second (CI, stop 37), so the grace is
/// 2 s; what must never happen is a failure after it.
const RECOVERY_GRACE: Duration = Duration::from_secs(2);

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn signal(pid: u32, sig: &str) {
    let ok = Command::new("kill")
        .args([sig, &pid.to_string()])
        .status()
        .unwrap()
        .success();
    assert!(ok, "kill {sig} {pid}");
}

async fn wait_port(port: u16, secs: u64) {
    for _ in 0..secs * 10 {
        if tokio::net::TcpStream::connect(("127.0.0.1", port)).await.is_ok() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("nothing listens on {port} after {secs} s");
}

/// An ArcadeDB of this test's own (the jars and JRE `scripts/dev up` unpacked).
struct OwnGraph {
    child: Option<Child>,
    restarts: usize,
    root: tempdir::Dir,
    bolt: u16,
    http: u16,
    password: String,
}

mod tempdir {
    /// A directory removed on drop.
    pub struct Dir(pub std::path::PathBuf);
    impl Dir {
        pub fn new(tag: &str) -> Dir {
            let p = std::env::temp_dir().join(format!("mnemosyne-{tag}-{}", uuid::Uuid::new_v4().simple()));
            std::fs::create_dir_all(&p).unwrap();
            Dir(p)
        }
    }
    impl Drop for Dir {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }
}

impl OwnGraph {
    async fn start() -> OwnGraph {
        let mut g = OwnGraph {
            child: None,
            restarts: 0,
            root: tempdir::Dir::new("arcadedb"),
            bolt: free_port(),
            http: free_port(),
            password: uuid::Uuid::new_v4().simple().to_string(),
        };
        g.launch().await;
        g
    }

    async fn launch(&mut self) {
        let home = repo().join(".dev/arcadedb/arcadedb_embedded");
        let log = std::fs::File::create(self.root.0.join("server.log")).unwrap();
        let child = Command::new(home.join("jre/bin/java"))
            .current_dir(&self.root.0)
            .args([
                "-Xms128m",
                "-Xmx512m",
                &format!("-Darcadedb.server.rootPath={}", self.root.0.display()),
                &format!("-Darcadedb.server.rootPassword={}", self.password),
                "-Darcadedb.server.httpIncomingHost=127.0.0.1",
                &format!("-Darcadedb.server.httpIncomingPort={}", self.http),
                "-Darcadedb.bolt.host=127.0.0.1",
                &format!("-Darcadedb.bolt.port={}", self.bolt),
                "-Darcadedb.server.defaultDatabases=mnemosyne[root]",
                "-Darcadedb.server.plugins=Bolt:com.arcadedb.bolt.BoltProtocolPlugin",
                "-cp",
                &format!("{}/jars/*", home.display()),
                "com.arcadedb.server.ArcadeDBServer",
            ])
            .stdout(Stdio::from(log.try_clone().unwrap()))
            .stderr(Stdio::from(log))
            .spawn()
            .expect("java from .dev/arcadedb (run scripts/dev up)");
        self.child = Some(child);
        wait_port(self.bolt, 90).await;
        let log = self.root.0.join("server.log");
        for _ in 0..300 {
            if std::fs::read_to_string(&log)
                .unwrap_or_default()
                .matches("Server started")
                .count()
                >= self.starts()
            {
                return;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        panic!("ArcadeDB did not start");
    }

    /// How many times the server has started in this root (restart counting).
    fn starts(&self) -> usize {
        1 + self.restarts
    }

    fn pid(&self) -> u32 {
        self.child.as_ref().unwrap().id()
    }

    fn apply(&self, s: &mut Settings) {
        s.bolt_uri = format!("127.0.0.1:{}", self.bolt);
        s.bolt_user = "root".into();
        s.bolt_password = mnemosyne::config::Secret(self.password.clone());
        s.bolt_database = "mnemosyne".into();
        s.graph_flavor = mnemosyne::config::GraphFlavor::Arcadedb;
        s.arcadedb_http_url = format!("http://127.0.0.1:{}", self.http);
    }

    /// Kills the server (SIGKILL, as a crash), starts it again on the same
    /// data, and returns once it answers a query of this test's own (through
    /// a connection of its own, not the app's): the store is back.
    async fn crash_and_restart(&mut self, down: Duration, settings: &Settings) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
        tokio::time::sleep(down).await;
        self.restarts += 1;
        self.launch().await;
        let mut s = settings.clone();
        s.store_timeout_ms = 5_000;
        // Bounded: 60 attempts, half a second apart.
        for _ in 0..60 {
            if let Ok(g) = GraphStore::connect(&s).await {
                if g.ping().await.is_ok() {
                    return;
                }
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
        panic!("the restarted graph never answered a query");
    }
}

impl Drop for OwnGraph {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// A PostgreSQL cluster of this test's own (Debian's binaries, as
/// `scripts/dev up` installs them), so it can be paused without touching the
/// cluster the parallel suite uses.
struct OwnPostgres {
    data: tempdir::Dir,
    bin: PathBuf,
    port: u16,
}

fn pg_command(bin: &std::path::Path, tool: &str) -> Command {
    // Postgres refuses to run as root: run as the `postgres` user then.
    if unsafe { libc::geteuid() } == 0 {
        let mut c = Command::new("runuser");
        c.args(["-u", "postgres", "--"]).arg(bin.join(tool));
        c
    } else {
        Command::new(bin.join(tool))
    }
}

impl OwnPostgres {
    async fn start() -> OwnPostgres {
        let bin = std::fs::read_dir("/usr/lib/postgresql")
            .expect("Debian's postgresql (scripts/dev up installs it)")
            .filter_map(|e| e.ok().map(|e| e.path().join("bin")))
            .filter(|p| p.join("initdb").exists())
            .max()
            .expect("initdb");
        let data = tempdir::Dir::new("pg");
        if unsafe { libc::geteuid() } == 0 {
            assert!(Command::new("chown")
                .args(["-R", "postgres"])
                .arg(&data.0)
                .status()
                .unwrap()
                .success());
        }
        let pgdata = data.0.join("data");
        let out = pg_command(&bin, "initdb")
            .args(["-D"])
            .arg(&pgdata)
            .args(["-U", "postgres", "--auth=trust"])
            .output()
            .unwrap();
        assert!(out.status.success(), "initdb: {}", String::from_utf8_lossy(&out.stderr));
        let port = free_port();
        let out = pg_command(&bin, "pg_ctl")
            .args(["-D"])
            .arg(&pgdata)
            .args(["-l"])
            .arg(data.0.join("server.log"))
            .args(["-w", "-t", "60", "-o"])
            .arg(format!("-p {port} -k /tmp -c listen_addresses=127.0.0.1"))
            .arg("start")
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "pg_ctl start: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        OwnPostgres { data, bin, port }
    }

    fn url(&self) -> String {
        format!("postgres://postgres@127.0.0.1:{}/postgres", self.port)
    }

    /// The postmaster and every backend of this cluster.
    fn pids(&self) -> Vec<u32> {
        let pidfile = std::fs::read_to_string(self.data.0.join("data/postmaster.pid")).unwrap();
        let master: u32 = pidfile.lines().next().unwrap().trim().parse().unwrap();
        let out = Command::new("pgrep")
            .args(["-P", &master.to_string()])
            .output()
            .unwrap();
        let mut pids: Vec<u32> = String::from_utf8_lossy(&out.stdout)
            .lines()
            .filter_map(|l| l.trim().parse().ok())
            .collect();
        pids.push(master);
        pids
    }

    fn pause(&self) {
        self.signal_all("-STOP");
    }

    fn resume(&self) {
        self.signal_all("-CONT");
    }

    /// Signals the postmaster and every backend; a backend that exited
    /// between listing and signalling is gone, not an error (CI saw
    /// `kill -CONT` fail on one).
    fn signal_all(&self, sig: &str) {
        for p in self.pids() {
            let ok = Command::new("kill")
                .args([sig, &p.to_string()])
                .stderr(Stdio::null())
                .status()
                .unwrap()
                .success();
            assert!(
                ok || !std::path::Path::new(&format!("/proc/{p}")).exists(),
                "kill {sig} {p}"
            );
        }
    }
}

impl Drop for OwnPostgres {
    fn drop(&mut self) {
        self.resume();
        let _ = pg_command(&self.bin, "pg_ctl")
            .args(["-D"])
            .arg(self.data.0.join("data"))
            .args(["-m", "immediate", "stop"])
            .output();
    }
}

/// What one credential may see, and what exists there.
#[derive(Clone)]
struct Expect {
    bearer: String,
    libraries: Vec<String>,
    chunk: String,
}

#[derive(Default)]
struct Tally {
    ok: usize,
    documented_errors: usize,
    wrong: Vec<String>,
    /// Requests that started `RECOVERY_GRACE` or more after the store came
    /// back and failed (with how long after).
    late_failures: Vec<String>,
    hung: usize,
}

/// One request of a worker: a tool call checked against what exists.
async fn probe(c: &mut McpClient, e: &Expect, n: usize) -> Result<(), String> {
    let (tool, args) = match n % 3 {
        0 => ("search", json!({"query": "pelican"})),
        1 => ("get_chunk", json!({"chunk_uid": e.chunk})),
        _ => ("list_libraries", json!({})),
    };
    let ex = c.call_raw(tool, args, None).await;
    if ex.status == StatusCode::SERVICE_UNAVAILABLE {
        return Err("documented:503".into());
    }
    if ex.status != StatusCode::OK {
        return Err(format!("wrong: {tool} HTTP {}", ex.status));
    }
    let r = &ex.response()["result"];
    if r["isError"] == json!(true) {
        let text = r["content"][0]["text"].as_str().unwrap_or_default();
        return if text.contains("unavailable right now") || text.contains("deadline") {
            Err("documented:isError".into())
        } else {
            Err(format!("wrong: {tool} isError {text}"))
        };
    }
    let out = &r["structuredContent"];
    let libs: Vec<String> = match tool {
        "search" => out["results"]
            .as_array()
            .unwrap()
            .iter()
            .map(|h| h["library_uid"].as_str().unwrap().to_owned())
            .collect(),
        "get_chunk" => vec![out["chunk"]["library_uid"].as_str().unwrap_or_default().to_owned()],
        _ => out["libraries"]
            .as_array()
            .unwrap()
            .iter()
            .map(|l| l["uid"].as_str().unwrap().to_owned())
            .collect(),
    };
    if let Some(l) = libs.iter().find(|l| !e.libraries.contains(l)) {
        return Err(format!("wrong: {tool} answered from {l}, outside the credential"));
    }
    match tool {
        "search" if libs.is_empty() => Err("wrong: search found nothing for data that exists".into()),
        "list_libraries" if libs != e.libraries => Err(format!("wrong: list_libraries {libs:?}")),
        _ => Ok(()),
    }
}

/// Runs `workers` clients per credential until `stop`, each request bounded
/// by the store timeout plus a margin.
async fn load(app: &TestApp, creds: &[Expect], stop: Arc<AtomicBool>, back: Arc<Mutex<Option<Instant>>>) -> Tally {
    let http = reqwest::Client::builder()
        .timeout(Duration::from_millis(STORE_TIMEOUT_MS * 3 + 2_000))
        .build()
        .unwrap();
    let mut handles = Vec::new();
    for e in creds {
        for w in 0..2 {
            let (e, stop, back, http, url) = (e.clone(), stop.clone(), back.clone(), http.clone(), app.url("/mcp/"));
            handles.push(tokio::spawn(async move {
                let mut t = Tally::default();
                let mut c = McpClient::new(http, url, &e.bearer).stateless();
                // Bounded: at most 5,000 requests per worker.
                for n in 0..5_000 {
                    if stop.load(Ordering::SeqCst) {
                        break;
                    }
                    let started = Instant::now();
                    let res = tokio::time::timeout(
                        Duration::from_millis(STORE_TIMEOUT_MS * 3 + 3_000),
                        probe(&mut c, &e, n + w),
                    )
                    .await;
                    let since_back = back.lock().unwrap().and_then(|b| started.checked_duration_since(b));
                    match res {
                        Err(_) => t.hung += 1,
                        Ok(Ok(())) => t.ok += 1,
                        Ok(Err(m)) if m.starts_with("documented") => {
                            t.documented_errors += 1;
                            if let Some(after) = since_back.filter(|a| *a >= RECOVERY_GRACE) {
                                t.late_failures.push(format!("{m} at +{} ms", after.as_millis()));
                            }
                        }
                        Ok(Err(m)) => t.wrong.push(m),
                    }
                    tokio::time::sleep(Duration::from_millis(5)).await;
                }
                t
            }));
        }
    }
    let mut all = Tally::default();
    for h in handles {
        let t = h.await.unwrap();
        all.ok += t.ok;
        all.documented_errors += t.documented_errors;
        all.wrong.extend(t.wrong);
        all.late_failures.extend(t.late_failures);
        all.hung += t.hung;
    }
    all
}

/// The app (over `pg`'s or the shared Postgres, and `graph`), seeded, with an
/// opaque token, a team JWT and a per-turn-like second token of different scopes.
async fn scenario(graph: &OwnGraph, tweak: impl FnOnce(&mut Settings)) -> (TestApp, Vec<Expect>) {
    let app = TestApp::spawn_with(|s| {
        graph.apply(s);
        s.store_timeout_ms = STORE_TIMEOUT_MS;
        s.tool_deadline_ms = STORE_TIMEOUT_MS * 2;
        s.rate_limit_per_minute = 0;
        s.tool_rate_limit_per_minute = 0;
        tweak(s);
    })
    .await;
    // Setup is not under test: a freshly started ArcadeDB on a busy machine
    // can take longer than the faults' short store timeout to create its
    // schema and first types (CI failed here: "no answer within 2000 ms"), so
    // the schema and the seed data go through a handle with a long timeout.
    let mut patient = app.settings.clone();
    patient.store_timeout_ms = SETUP_TIMEOUT_MS;
    let g = GraphStore::connect(&patient).await.unwrap();
    g.bootstrap_schema().await.expect("schema on the test's own graph");
    let g = g.into_handles();
    let ws_a = app.uid("ws_a");
    let ws_b = app.uid("ws_b");
    let seed = |ws: String, title: &'static str, content: &'static str| {
        let (g, changes) = (g.clone(), AuthChanges::new(app.pg.clone(), None));
        async move {
            let doc = DocumentIn {
                workspace_id: Some(ws),
                title: title.into(),
                content: content.into(),
                ..Default::default()
            };
            ingest::ingest(&g.admin, &changes, 2000, Document::parse(doc).unwrap())
                .await
                .expect("seeding the test's own graph")
                .library_uid
        }
    };
    let lib_a = seed(
        ws_a.clone(),
        "Pelicans",
        "# Pelicans\n\nThe pelican migrates along the coast.",
    )
    .await;
    let lib_b = seed(ws_b.clone(), "Anatomy", "# Anatomy\n\nA pelican has a throat pouch.").await;
    let chunk_of = |lib: &str| {
        let lib = lib.to_owned();
        let g = g.clone();
        async move {
            let principal = mnemosyne::auth::Principal::for_tests([lib]);
            mnemosyne::search::engine::Engine::default()
                .run(
                    &g.knowledge.scoped(&principal),
                    &mnemosyne::search::engine::Search::keyword("pelican", 1),
                )
                .await
                .unwrap()[0]
                .chunk_uid
                .clone()
        }
    };
    let token = app.opaque_token(&[lib_a.clone()]).await;
    let (team, team_jwt) = app.create_team("Kottos").await;
    app.put_workspaces(team, &[ws_b.clone()]).await;
    let both = app.opaque_token(&[lib_a.clone(), lib_b.clone()]).await;
    let creds = vec![
        Expect {
            bearer: token,
            libraries: vec![lib_a.clone()],
            chunk: chunk_of(&lib_a).await,
        },
        Expect {
            bearer: team_jwt,
            libraries: vec![lib_b.clone()],
            chunk: chunk_of(&lib_b).await,
        },
        Expect {
            bearer: both,
            libraries: vec![lib_a.clone(), lib_b.clone()],
            chunk: chunk_of(&lib_b).await,
        },
    ];
    (app, creds)
}

fn check(t: &Tally, what: &str) {
    println!(
        "{what}: {} ok, {} documented errors, {} wrong, {} late failures, {} hung",
        t.ok,
        t.documented_errors,
        t.wrong.len(),
        t.late_failures.len(),
        t.hung
    );
    assert!(
        t.wrong.is_empty(),
        "{what}: wrong answers: {:?}",
        &t.wrong[..t.wrong.len().min(10)]
    );
    assert!(
        t.late_failures.is_empty(),
        "{what}: failures ≥ {} s after recovery: {:?}",
        RECOVERY_GRACE.as_secs(),
        t.late_failures
    );
    assert_eq!(t.hung, 0, "{what}: requests hung past the store timeout");
    assert!(t.ok > 0, "{what}: nothing succeeded");
}

/// Runs the load, applies `fault` after 1 s, marks the store back when it
/// returns, keeps loading `after` more, then stops.
async fn under_load<F, Fut>(app: &TestApp, creds: &[Expect], after: Duration, fault: F) -> Tally
where
    F: FnOnce() -> Fut,
    Fut: std::future::Future<Output = ()>,
{
    let stop = Arc::new(AtomicBool::new(false));
    let back = Arc::new(Mutex::new(None));
    let runner = load(app, creds, stop.clone(), back.clone());
    let driver = async {
        tokio::time::sleep(Duration::from_secs(1)).await;
        fault().await;
        *back.lock().unwrap() = Some(Instant::now());
        tokio::time::sleep(after).await;
        stop.store(true, Ordering::SeqCst);
    };
    let (t, ()) = tokio::join!(runner, driver);
    // The replica is alive and serves.
    let r = app.http.get(app.url("/healthz")).send().await.unwrap();
    assert_eq!(r.status(), StatusCode::OK);
    t
}

#[tokio::test]
async fn graph_paused_then_resumed_gives_no_wrong_answer() {
    let graph = OwnGraph::start().await;
    let (app, creds) = scenario(&graph, |_| {}).await;
    let pid = graph.pid();
    let t = under_load(&app, &creds, Duration::from_secs(4), || async move {
        signal(pid, "-STOP");
        tokio::time::sleep(Duration::from_secs(3)).await;
        signal(pid, "-CONT");
    })
    .await;
    check(&t, "graph SIGSTOP 3 s");
    assert!(t.documented_errors > 0, "the pause was felt");
}

#[tokio::test]
async fn graph_killed_and_restarted_gives_no_wrong_answer() {
    let mut graph = OwnGraph::start().await;
    let (app, creds) = scenario(&graph, |_| {}).await;
    let (graph_ref, settings) = (&mut graph, &app.settings);
    let t = under_load(&app, &creds, Duration::from_secs(6), || async move {
        graph_ref.crash_and_restart(Duration::from_secs(1), settings).await;
    })
    .await;
    check(&t, "graph SIGKILL + restart");
    assert!(t.documented_errors > 0, "the crash was felt");
}

#[tokio::test]
async fn postgres_paused_then_resumed_gives_no_wrong_answer() {
    let graph = OwnGraph::start().await;
    let pg = OwnPostgres::start().await;
    let url = pg.url();
    // Caches off: every request reads Postgres, so the pause is felt by all.
    let (app, creds) = scenario(&graph, |s| {
        s.database_url = url.clone();
        s.cache_max_staleness_secs = 0;
    })
    .await;
    let pg_ref = &pg;
    let t = under_load(&app, &creds, Duration::from_secs(4), || async move {
        pg_ref.pause();
        tokio::time::sleep(Duration::from_secs(3)).await;
        pg_ref.resume();
    })
    .await;
    check(&t, "postgres SIGSTOP 3 s");
    assert!(t.documented_errors > 0, "the pause was felt");
}

#[tokio::test]
async fn terminated_postgres_connections_give_no_wrong_answer_and_no_false_replay() {
    let graph = OwnGraph::start().await;
    let (app, creds) = scenario(&graph, |s| s.cache_max_staleness_secs = 0).await;
    let admin = sqlx::PgPool::connect(&app.settings.database_url).await.unwrap();
    let db = app.settings.database_url.rsplit_once('/').unwrap().1.to_owned();
    let (admin_ref, db_ref) = (&admin, &db);
    // Per-turn turns (initialize + calls) run alongside: none may be refused
    // as a replay of itself.
    let mut jwts = Vec::new();
    for _ in 0..20 {
        jwts.push(app.per_turn_jwt(&[]).await);
    }
    let turns = async {
        let mut false_replays = 0;
        for jwt in &jwts {
            let mut c = app.mcp(jwt);
            let ex = c.initialize().await;
            if ex.status != StatusCode::OK {
                assert_eq!(ex.status, StatusCode::SERVICE_UNAVAILABLE, "{ex:?}");
                continue;
            }
            for _ in 0..3 {
                let ex = c.list_tools().await;
                if ex.status == StatusCode::UNAUTHORIZED && ex.body.contains("replay") {
                    false_replays += 1;
                }
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        false_replays
    };
    let faults = under_load(&app, &creds, Duration::from_secs(3), || async move {
        // Terminate every connection of the server's database, every 0.5 s for 3 s.
        for _ in 0..6 {
            let _ = sqlx::query(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity
                  WHERE datname = $1 AND pid <> pg_backend_pid()",
            )
            .bind(db_ref)
            .execute(admin_ref)
            .await;
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    });
    let (t, false_replays) = tokio::join!(faults, turns);
    check(&t, "postgres connections terminated");
    assert_eq!(false_replays, 0, "a turn was refused as a replay of itself");
}

/// Issue 54: a search's slot is held until its work ends, and work whose
/// caller left stops. The test's own graph paused (SIGSTOP) and no search
/// index (every search reads the graph), every search hangs in its graph
/// query; each client sends a search (statelessly, with a progress token,
/// so rmcp answers with an event stream and runs the call on a task of its
/// own), reads the first event (progress 0: the search started) and closes
/// its connection. Counted from the server's own gauge: never more searches
/// running than the credential's slots, and none left running once their
/// callers are gone.
#[tokio::test]
async fn searches_whose_callers_left_hold_their_slots_until_they_stop() {
    const SLOTS: usize = 2;
    let graph = OwnGraph::start().await;
    let (app, creds) = scenario(&graph, |s| {
        s.index_dir = None;
        s.search_concurrency = SLOTS;
        s.store_timeout_ms = 10_000;
        s.tool_deadline_ms = 10_000;
    })
    .await;
    let token = creds[0].bearer.clone();
    let mut warm = app.mcp(&token).stateless();
    assert_eq!(
        warm.call_ok("search", json!({"query": "pelican"})).await["results"]
            .as_array()
            .map(Vec::len),
        Some(1)
    );
    let running = || {
        app.state
            .metrics
            .tool_calls_running
            .with_label_values(&["search"])
            .get()
    };
    assert_eq!(running(), 0);
    // Calls that ran (whatever ended them), as the server counts them: the
    // gauge is sampled every 10 ms, and a call whose caller left at once can
    // start and stop between two samples (seen on a loaded machine).
    let ran = || {
        ["ok", "tool_error"]
            .iter()
            .map(|o| app.state.metrics.tool_calls.with_label_values(&["search", o]).get())
            .sum::<u64>()
    };
    let ran_before = ran();
    signal(graph.pid(), "-STOP");
    let http = reqwest::Client::builder().pool_max_idle_per_host(0).build().unwrap();
    // 12 clients at once, each dropping its connection after the first event.
    let client = |i: usize| {
        let (http, url, token) = (http.clone(), app.url("/mcp/"), token.clone());
        async move {
            let body = json!({"jsonrpc": "2.0", "id": i, "method": "tools/call",
                "params": {"name": "search", "arguments": {"query": "pelican"},
                           "_meta": {"progressToken": format!("p{i}"),
                                     "io.modelcontextprotocol/protocolVersion": helpers::STATELESS,
                                     "io.modelcontextprotocol/clientCapabilities": {}}}});
            let sent = http
                .post(url)
                .header("Authorization", format!("Bearer {token}"))
                .header("Accept", "application/json, text/event-stream")
                .header("MCP-Protocol-Version", helpers::STATELESS)
                .header("Mcp-Method", "tools/call")
                .header("Mcp-Name", "search")
                .json(&body)
                .send();
            if let Ok(Ok(mut resp)) = tokio::time::timeout(Duration::from_secs(3), sent).await {
                let _ = tokio::time::timeout(Duration::from_secs(3), resp.chunk()).await;
            }
        }
    };
    let done = AtomicBool::new(false);
    let sample = async {
        let mut most = 0;
        // Bounded: at most 10 s of samples.
        for _ in 0..1_000 {
            most = most.max(running());
            if done.load(Ordering::SeqCst) {
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        most
    };
    let clients = async {
        futures::future::join_all((0..12).map(client)).await;
        done.store(true, Ordering::SeqCst);
    };
    let (mut most, ()) = tokio::join!(sample, clients);
    // Bounded: the stopped calls leave the gauge within a few seconds (the
    // deadline they would otherwise run to is 10 s).
    let deadline = Instant::now() + Duration::from_secs(5);
    while running() > 0 && Instant::now() < deadline {
        most = most.max(running());
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let left = running();
    signal(graph.pid(), "-CONT");
    println!("searches running at most {most} (slots {SLOTS}); {left} left after their callers went");
    assert!(
        most >= 1 || ran() > ran_before,
        "the searches did run (hung on the paused graph, or stopped as their callers left)"
    );
    assert!(most <= SLOTS as i64, "{most} searches ran at once on {SLOTS} slots");
    assert_eq!(left, 0, "searches kept running after their callers left");
    // And the credential searches again once the graph is back.
    let mut after = app.mcp(&token).stateless();
    for _ in 0..50 {
        let out = after.call("search", json!({"query": "pelican"})).await;
        if out["isError"] != json!(true) {
            assert_eq!(out["structuredContent"]["results"].as_array().map(Vec::len), Some(1));
            return;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    panic!("the credential could not search after the graph came back");
}

/// A TCP relay to the graph's Bolt port that holds back, once, the request
/// that carries `marker` (a statement's text): the graph never sees that
/// statement until `hold` has passed, as if it were taking that long.
struct StallRelay {
    port: u16,
    armed: Arc<AtomicBool>,
    stalled: Arc<AtomicBool>,
    /// Requests that carried `marker` (the held one included).
    seen: Arc<std::sync::atomic::AtomicUsize>,
}

impl StallRelay {
    async fn start(target: u16, marker: &'static [u8], hold: Duration) -> StallRelay {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let (armed, stalled) = (Arc::new(AtomicBool::new(false)), Arc::new(AtomicBool::new(false)));
        let seen = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let (a, st, count) = (armed.clone(), stalled.clone(), seen.clone());
        tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let Ok(server) = tokio::net::TcpStream::connect(("127.0.0.1", target)).await else {
                    continue;
                };
                let (a, st, count) = (a.clone(), st.clone(), count.clone());
                tokio::spawn(async move {
                    use tokio::io::{AsyncReadExt, AsyncWriteExt};
                    let (mut cr, mut cw) = client.into_split();
                    let (mut sr, mut sw) = server.into_split();
                    let down = tokio::spawn(async move { tokio::io::copy(&mut sr, &mut cw).await });
                    let mut buf = vec![0u8; 64 * 1024];
                    // The last bytes of the previous read: a marker split
                    // across two reads is still seen.
                    let mut tail: Vec<u8> = Vec::new();
                    loop {
                        let n = match cr.read(&mut buf).await {
                            Ok(0) | Err(_) => break,
                            Ok(n) => n,
                        };
                        let mut seen = tail.clone();
                        seen.extend_from_slice(&buf[..n]);
                        let carries = seen.windows(marker.len()).any(|w| w == marker);
                        if carries {
                            count.fetch_add(1, Ordering::SeqCst);
                        }
                        if carries && a.swap(false, Ordering::SeqCst) {
                            st.store(true, Ordering::SeqCst);
                            tokio::time::sleep(hold).await;
                        }
                        let keep = seen.len().saturating_sub(marker.len());
                        tail = seen.split_off(keep);
                        if sw.write_all(&buf[..n]).await.is_err() {
                            break;
                        }
                    }
                    down.abort();
                });
            }
        });
        StallRelay {
            port,
            armed,
            stalled,
            seen,
        }
    }
}

/// A library delete whose batch gets no answer within the store timeout,
/// while the graph itself still answers (the statement held back on its way,
/// as a 5,000-chunk batch of a large library takes ~10 s on ArcadeDB), goes on
/// in smaller batches and finishes instead of failing as an outage.
#[tokio::test]
async fn a_library_delete_whose_batch_runs_out_of_time_goes_on_in_smaller_batches() {
    let graph = OwnGraph::start().await;
    let app = TestApp::spawn_with(|s| graph.apply(s)).await;
    let mut patient = app.settings.clone();
    patient.store_timeout_ms = SETUP_TIMEOUT_MS;
    let setup = GraphStore::connect(&patient).await.unwrap();
    setup.bootstrap_schema().await.expect("schema on the test's own graph");
    let setup = setup.into_handles();
    let changes = AuthChanges::new(app.pg.clone(), None);
    let ws = app.uid("ws_delete");
    let content = (0..300)
        .map(|i| format!("Paragraph {i} tells of the pelican's flight number {i} along the coast."))
        .collect::<Vec<_>>()
        .join("\n\n");
    let doc = DocumentIn {
        workspace_id: Some(ws.clone()),
        title: "Flights".into(),
        content,
        ..Default::default()
    };
    let lib = ingest::ingest(&setup.admin, &changes, 100, Document::parse(doc).unwrap())
        .await
        .expect("seeding the test's own graph")
        .library_uid;
    let held = setup.admin.workspace_libraries(&ws).await.unwrap();
    assert!(held[0].chunk_count > 250, "{} chunks", held[0].chunk_count);

    // Twice the other fault tests' timeout: the smaller batches and the
    // ping must each answer within it on a loaded CI machine.
    let timeout = Duration::from_millis(2 * STORE_TIMEOUT_MS);
    let relay = StallRelay::start(graph.bolt, b"LIMIT $batch", timeout * 2).await;
    let mut through = app.settings.clone();
    through.bolt_uri = format!("127.0.0.1:{}", relay.port);
    through.store_timeout_ms = 2 * STORE_TIMEOUT_MS;
    let g = GraphStore::connect(&through).await.unwrap();
    g.ping().await.expect("the graph through the relay");
    let g = g.into_handles();
    relay.armed.store(true, Ordering::SeqCst);
    let out = g.admin.delete_libraries(&[lib.clone()]).await;
    assert!(relay.stalled.load(Ordering::SeqCst), "the first batch was held back");
    out.expect("the delete went on in smaller batches");
    // The held chunk batch, then at least two smaller chunk batches (250
    // of the 300 chunks, then the rest) and the item batch: the delete went
    // on by batches, not only by the final transaction's sweep.
    let batches = relay.seen.load(Ordering::SeqCst);
    assert!(batches >= 4, "{batches} batch statements");
    assert!(
        setup.admin.workspace_libraries(&ws).await.unwrap().is_empty(),
        "the library and its chunks are gone"
    );
}
