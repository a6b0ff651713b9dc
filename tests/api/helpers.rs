//! Test harness: every test gets its own Postgres database and its own uid
//! namespace in the (shared) graph, against the real stores `scripts/dev up`
//! started, and an in-process app on a random port.

use std::time::Duration;

use mnemosyne::auth::jwt;
use mnemosyne::config::Settings;
use mnemosyne::startup::Application;
use mnemosyne::state::AppState;
use mnemosyne::store::graph::ingest::AdminGraph;
use mnemosyne::store::graph::GraphStore;
use mnemosyne::store::pg::{self, keys, users};
use reqwest::StatusCode;
use serde_json::{json, Value};
use sqlx::PgPool;
use tokio::sync::oneshot;
use uuid::Uuid;

pub const SERVICE_USER: &str = "daedalus-service";
pub const SERVICE_PASSWORD: &str = "correct horse battery staple";

pub struct TestApp {
    pub base: String,
    pub ns: String,
    pub pg: PgPool,
    pub settings: Settings,
    pub state: AppState,
    pub http: reqwest::Client,
    shutdown: Option<oneshot::Sender<()>>,
    /// Set on the instance that created the database (drops it at the end).
    owned_db: Option<(String, String)>,
    /// The real graph (before any test tweak), where the namespace is cleaned.
    cleanup_graph: Option<Settings>,
}

fn admin_url(url: &str) -> String {
    let (base, _) = url.rsplit_once('/').expect("database URL has a path");
    format!("{base}/postgres")
}

/// Settings of the dev services, for a fresh test database.
pub fn base_settings() -> Settings {
    let mut s = Settings::from_env().expect("settings from env");
    s.listen = "127.0.0.1:0".parse().unwrap();
    s.public_url = "http://127.0.0.1:0".into();
    s.store_timeout_ms = 10_000;
    // Keyword-only unless a test asks for the model (`with_model`): every
    // app would otherwise embed, on 2 cores, whatever its test ingests.
    s.embed_model = None;
    s.cross_model = None;
    s.embed_url = None;
    // Each app started gets a search index directory of its own under this
    // root (`TestApp::start`), as each replica does in production.
    s.index_dir = Some(test_index_root());
    s
}

/// A port free on 127.0.0.1 now (another process may take it before use).
/// host:port of the run's graph server (its URI may name a scheme:
/// `neo4j://`), for tests that put a proxy in front of it.
pub fn bolt_address() -> String {
    let uri = base_settings().bolt_uri;
    uri.split_once("://").map_or(uri.as_str(), |(_, rest)| rest).to_owned()
}

pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// Where the tests' apps keep their search indexes.
pub fn test_index_root() -> std::path::PathBuf {
    std::env::temp_dir().join("mnemosyne-test-index")
}

/// The embedding model `scripts/dev` installed (MNEMOSYNE_TEST_EMBED_MODEL
/// under scripts/test, else MNEMOSYNE_EMBED_MODEL from .dev/env).
pub fn model_dir() -> std::path::PathBuf {
    ["MNEMOSYNE_TEST_EMBED_MODEL", "MNEMOSYNE_EMBED_MODEL"]
        .iter()
        .filter_map(std::env::var_os)
        .find(|v| !v.is_empty())
        .map(Into::into)
        .expect("the embedding model (scripts/dev up installs it; MNEMOSYNE_EMBED_MODEL)")
}

/// One of the models `scripts/dev` installs side by side under .dev/models
/// (`all-minilm-l6-v2`, `multilingual-e5-small`, `use-m3`), whichever
/// `DEV_EMBED_MODEL` put in .dev/env.
pub fn installed_model(name: &str) -> std::path::PathBuf {
    let dir = model_dir();
    dir.parent().map(|p| p.join(name)).unwrap_or(dir)
}

impl TestApp {
    pub async fn spawn() -> TestApp {
        Self::spawn_with(|_| {}).await
    }

    /// A new app over a new database; `tweak` adjusts settings first.
    pub async fn spawn_with(tweak: impl FnOnce(&mut Settings)) -> TestApp {
        mnemosyne::telemetry::init(mnemosyne::config::LogFormat::Text);
        let mut settings = base_settings();
        let ns = format!("t{}", &Uuid::new_v4().simple().to_string()[..10]);
        let db = format!("mnemosyne_test_{ns}");
        let admin = admin_url(&settings.database_url);
        let admin_pool = sqlx::PgPool::connect(&admin)
            .await
            .expect("connect to the Postgres server (run scripts/dev up)");
        sqlx::query(&format!("CREATE DATABASE \"{db}\""))
            .execute(&admin_pool)
            .await
            .expect("create test database");
        admin_pool.close().await;
        settings.database_url = format!("{}/{db}", admin.rsplit_once('/').unwrap().0);
        // An embedding worker (if a test turns the model on) embeds this
        // test's namespace only.
        settings.embed_scope_prefix = ns.clone();
        bootstrap_graph(&settings).await;
        let real_graph = settings.clone();
        tweak(&mut settings);
        let pool = pg::pool(&settings.database_url, Duration::from_secs(5)).unwrap();
        pg::migrate(&pool).await.expect("migrations apply");
        keys::ensure_active(&pool).await.expect("signing key");
        let hash = mnemosyne::auth::basic::hash_password(SERVICE_PASSWORD).unwrap();
        users::create(&pool, SERVICE_USER, Some(&hash), true).await.unwrap();
        let mut app = Self::start(settings, ns, pool).await;
        app.owned_db = Some((admin, db));
        app.cleanup_graph = Some(real_graph);
        app
    }

    async fn start(mut settings: Settings, ns: String, pool: PgPool) -> TestApp {
        if settings
            .index_dir
            .as_ref()
            .is_some_and(|d| d.starts_with(test_index_root()))
        {
            settings.index_dir = Some(test_index_root().join(format!("{ns}-{}", Uuid::new_v4().simple())));
        }
        let app = Application::build(settings.clone()).await.expect("app builds");
        let base = format!("http://{}", app.local_addr());
        let state = app.state().clone();
        let (tx, rx) = oneshot::channel::<()>();
        tokio::spawn(app.run_until(async move {
            let _ = rx.await;
        }));
        let t = TestApp {
            base,
            ns,
            pg: pool,
            settings,
            state,
            http: reqwest::Client::builder()
                .timeout(Duration::from_secs(30))
                .build()
                .unwrap(),
            shutdown: Some(tx),
            owned_db: None,
            cleanup_graph: None,
        };
        t.wait_listener().await;
        t
    }

    /// Waits until this instance's LISTEN connection is up and has heard its
    /// first heartbeat (caches usable).
    pub async fn wait_listener(&self) {
        if self.settings.cache_max_staleness_secs == 0 {
            return;
        }
        for _ in 0..500 {
            if self.state.auth.caches.usable() {
                return;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        panic!("auth LISTEN never came up");
    }

    /// Another replica over the same database and namespace, with `settings`
    /// (e.g. reaching Postgres another way).
    pub async fn replica_with(&self, settings: Settings) -> TestApp {
        Self::start(settings, self.ns.clone(), self.pg.clone()).await
    }

    /// Another replica over the same stores and namespace.
    pub async fn second_instance(&self) -> TestApp {
        Self::start(self.settings.clone(), self.ns.clone(), self.pg.clone()).await
    }

    pub fn uid(&self, s: &str) -> String {
        format!("{}_{s}", self.ns)
    }

    pub fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base)
    }

    pub fn service(&self, method: reqwest::Method, path: &str) -> reqwest::RequestBuilder {
        self.http
            .request(method, self.url(path))
            .basic_auth(SERVICE_USER, Some(SERVICE_PASSWORD))
    }

    /// Runs the `mnemosyne` CLI binary against this app's database, as an
    /// operator would (its own process; every other setting comes from the
    /// environment, as the app's did): (success, stdout, stderr).
    pub fn cli(&self, args: &[&str]) -> (bool, String, String) {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_mnemosyne"))
            .args(args)
            .env("MNEMOSYNE_DATABASE_URL", &self.settings.database_url)
            .output()
            .expect("run the mnemosyne binary");
        (
            out.status.success(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    }

    /// [`cli`](Self::cli) that must succeed (else the test fails with its
    /// stderr): its stdout.
    pub fn cli_ok(&self, args: &[&str]) -> String {
        let (ok, stdout, stderr) = self.cli(args);
        assert!(ok, "mnemosyne {}: {stderr}", args.join(" "));
        stdout
    }

    /// POST /mcp_server/api/teams/ → (id, jwt).
    pub async fn create_team(&self, name: &str) -> (Uuid, String) {
        let id = Uuid::new_v4();
        let r = self
            .service(reqwest::Method::POST, "/mcp_server/api/teams/")
            .json(&json!({"id": id, "name": name}))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), StatusCode::CREATED);
        let body: Value = r.json().await.unwrap();
        (id, body["jwt"].as_str().unwrap().to_owned())
    }

    pub async fn put_workspaces(&self, id: Uuid, ws: &[String]) -> Value {
        let r = self
            .service(reqwest::Method::PUT, &format!("/mcp_server/api/teams/{id}/workspaces/"))
            .json(&json!({"workspace_ids": ws}))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), StatusCode::OK);
        r.json().await.unwrap()
    }

    /// Ingests a document into a workspace's library; returns the response body.
    pub async fn ingest_ws(&self, ws: &str, title: &str, content: &str) -> Value {
        self.ingest(json!({"workspace_id": ws, "item": {"title": title}, "content": content}))
            .await
    }

    pub async fn ingest(&self, body: Value) -> Value {
        let r = self
            .service(reqwest::Method::POST, "/library/api/ingest/")
            .json(&body)
            .send()
            .await
            .unwrap();
        let status = r.status();
        let v: Value = r.json().await.unwrap();
        assert!(status.is_success(), "ingest failed: {status} {v}");
        v
    }

    /// Creates a user-managed library with a namespaced uid; returns it.
    pub async fn library(&self, name: &str) -> String {
        let uid = self.uid(name);
        let r = self
            .service(reqwest::Method::POST, "/library/api/libraries/")
            .json(&json!({"uid": uid, "name": name, "description": format!("{name} library")}))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), StatusCode::CREATED);
        uid
    }

    /// A user who owns `libs` and an opaque token scoped to them, in order.
    pub async fn opaque_token(&self, libs: &[String]) -> String {
        let name = format!("user-{}", &Uuid::new_v4().simple().to_string()[..8]);
        users::create(&self.pg, &name, None, false).await.unwrap().unwrap();
        for l in libs {
            users::grant(&self.pg, &name, l, users::Role::Owner).await.unwrap();
        }
        let plaintext = mnemosyne::service::tokens::mint(&self.pg, &name, "test", libs, None)
            .await
            .unwrap()
            .plaintext;
        plaintext
    }

    /// The active signing key (kid, secret bytes).
    pub async fn signing_key(&self) -> (String, Vec<u8>) {
        let k = keys::newest_active(&self.pg).await.unwrap().unwrap();
        (k.kid, hex::decode(k.secret_hex).unwrap())
    }

    /// A per-turn JWT as Daedalus mints it.
    pub async fn per_turn_jwt(&self, libs: &[String]) -> String {
        let now = chrono::Utc::now().timestamp();
        self.sign(
            json!({"iss": "daedalus", "aud": "mnemosyne", "sub": "daedalus-chat", "iat": now,
                         "exp": now + 300, "jti": Uuid::new_v4().to_string(), "ws": "ws", "libs": libs}),
        )
        .await
    }

    pub async fn sign(&self, claims: Value) -> String {
        let (kid, secret) = self.signing_key().await;
        jwt::sign_hs256(&claims, &kid, &secret).unwrap()
    }

    pub fn mcp(&self, bearer: &str) -> McpClient {
        McpClient::new(self.http.clone(), self.url("/mcp/"), bearer)
    }

    pub async fn metrics(&self) -> String {
        self.http
            .get(self.url("/metrics"))
            .send()
            .await
            .unwrap()
            .text()
            .await
            .unwrap()
    }
}

/// Idempotent; retried because parallel test processes may race on DDL. Not
/// under test: a long store timeout, so a busy graph (many test processes
/// bootstrapping at once on 2 cores) is waited for, not failed.
pub async fn bootstrap_graph(settings: &Settings) {
    let mut patient = settings.clone();
    patient.store_timeout_ms = patient.store_timeout_ms.max(60_000);
    let g = GraphStore::connect(&patient).await.unwrap();
    let mut last = None;
    for _ in 0..5 {
        match g.bootstrap_schema().await {
            Ok(()) => return,
            Err(e) => last = Some(e),
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    panic!("graph schema bootstrap failed: {last:?}");
}

impl Drop for TestApp {
    fn drop(&mut self) {
        if let Some(tx) = self.shutdown.take() {
            let _ = tx.send(());
        }
        if let Some(dir) = &self.settings.index_dir {
            if dir.starts_with(test_index_root()) {
                let _ = std::fs::remove_dir_all(dir);
            }
        }
        if let Some((admin, db)) = self.owned_db.take() {
            let settings = self.cleanup_graph.take().unwrap_or_else(|| self.settings.clone());
            let ns = self.ns.clone();
            // Drop runs outside async; clean up on a thread of its own.
            let _ = std::thread::spawn(move || {
                let rt = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .unwrap();
                rt.block_on(async move {
                    if let Ok(g) = AdminGraph::connect(&settings).await {
                        let _ = cleanup_graph(&g, &ns).await;
                    }
                    if let Ok(p) = sqlx::PgPool::connect(&admin).await {
                        let _ = sqlx::query(&format!("DROP DATABASE IF EXISTS \"{db}\" WITH (FORCE)"))
                            .execute(&p)
                            .await;
                    }
                });
            })
            .join();
        }
    }
}

async fn cleanup_graph(g: &AdminGraph, ns: &str) -> Result<(), mnemosyne::store::graph::GraphError> {
    let libs: Vec<String> = g
        .all_libraries()
        .await?
        .into_iter()
        .filter(|l| l.uid.starts_with(ns) || l.workspace_id.as_deref().is_some_and(|w| w.starts_with(ns)))
        .map(|l| l.uid)
        .collect();
    g.delete_libraries(&libs).await
}

/// A hand-rolled Streamable HTTP MCP client: it lets tests control every header
/// (sessions, protocol revision, Origin) and see raw statuses.
pub struct McpClient {
    http: reqwest::Client,
    pub url: String,
    pub bearer: String,
    pub session: Option<String>,
    next_id: i64,
    /// Use the stateless 2026-07-28 revision (no initialize, no session).
    pub stateless: bool,
}

/// One HTTP exchange: status, the JSON-RPC messages received (SSE or JSON).
#[derive(Debug)]
pub struct Exchange {
    pub status: StatusCode,
    pub headers: reqwest::header::HeaderMap,
    pub messages: Vec<Value>,
    pub body: String,
}

impl Exchange {
    /// The JSON-RPC response (the message with an id and a result or error).
    pub fn response(&self) -> &Value {
        self.messages
            .iter()
            .find(|m| m.get("id").is_some() && (m.get("result").is_some() || m.get("error").is_some()))
            .unwrap_or_else(|| panic!("no JSON-RPC response in {self:?}"))
    }

    pub fn notifications(&self, method: &str) -> Vec<&Value> {
        self.messages.iter().filter(|m| m["method"] == method).collect()
    }

    /// The JSON error body of a refused HTTP request.
    pub fn json(&self) -> Value {
        serde_json::from_str(&self.body).unwrap_or(Value::Null)
    }
}

pub const STATELESS: &str = "2026-07-28";

impl McpClient {
    pub fn new(http: reqwest::Client, url: String, bearer: &str) -> Self {
        McpClient {
            http,
            url,
            bearer: bearer.to_owned(),
            session: None,
            next_id: 1,
            stateless: false,
        }
    }

    pub fn stateless(mut self) -> Self {
        self.stateless = true;
        self
    }

    pub async fn post(&mut self, mut body: Value, extra: &[(&str, &str)]) -> Exchange {
        let method = body["method"].as_str().unwrap_or_default().to_owned();
        let mut req = self
            .http
            .post(&self.url)
            .header("Accept", "application/json, text/event-stream")
            .header("Content-Type", "application/json");
        if !self.bearer.is_empty() {
            req = req.header("Authorization", format!("Bearer {}", self.bearer));
        }
        if self.stateless {
            req = req
                .header("MCP-Protocol-Version", STATELESS)
                .header("Mcp-Method", &method);
            if method == "tools/call" {
                req = req.header("Mcp-Name", body["params"]["name"].as_str().unwrap_or_default());
            }
            let params = body
                .as_object_mut()
                .unwrap()
                .entry("params")
                .or_insert_with(|| json!({}));
            let meta = params
                .as_object_mut()
                .unwrap()
                .entry("_meta")
                .or_insert_with(|| json!({}));
            meta["io.modelcontextprotocol/protocolVersion"] = json!(STATELESS);
            meta["io.modelcontextprotocol/clientCapabilities"] = json!({});
        } else if let Some(s) = &self.session {
            req = req
                .header("Mcp-Session-Id", s)
                .header("MCP-Protocol-Version", "2025-11-25");
        }
        for (k, v) in extra {
            req = req.header(*k, *v);
        }
        let resp = req.json(&body).send().await.expect("request sent");
        let status = resp.status();
        let headers = resp.headers().clone();
        let text = resp.text().await.unwrap_or_default();
        let is_sse = headers
            .get("content-type")
            .and_then(|v| v.to_str().ok())
            .is_some_and(|c| c.starts_with("text/event-stream"));
        let messages = if is_sse {
            text.lines()
                .filter_map(|l| l.strip_prefix("data:"))
                .filter_map(|d| serde_json::from_str::<Value>(d.trim()).ok())
                .collect()
        } else {
            serde_json::from_str::<Value>(&text)
                .map(|v| vec![v])
                .unwrap_or_default()
        };
        Exchange {
            status,
            headers,
            messages,
            body: text,
        }
    }

    fn id(&mut self) -> i64 {
        self.next_id += 1;
        self.next_id
    }

    /// initialize + notifications/initialized; keeps the session id.
    pub async fn initialize(&mut self) -> Exchange {
        let id = self.id();
        let ex = self
            .post(
                json!({"jsonrpc": "2.0", "id": id, "method": "initialize", "params": {
                    "protocolVersion": "2025-11-25", "capabilities": {},
                    "clientInfo": {"name": "mnemosyne-tests", "version": "0"}}}),
                &[],
            )
            .await;
        if ex.status.is_success() {
            self.session = ex.headers.get("mcp-session-id").map(|v| v.to_str().unwrap().to_owned());
            let n = self
                .post(json!({"jsonrpc": "2.0", "method": "notifications/initialized"}), &[])
                .await;
            // A refused notification (e.g. 503 while a store is down in the
            // fault tests) is the handshake's answer: the caller sees it.
            if !n.status.is_success() {
                return n;
            }
        }
        ex
    }

    /// A ready client: initialized unless stateless.
    pub async fn connect(mut self) -> Self {
        if !self.stateless {
            let ex = self.initialize().await;
            assert_eq!(ex.status, StatusCode::OK, "initialize failed: {ex:?}");
        }
        self
    }

    pub async fn list_tools(&mut self) -> Exchange {
        let id = self.id();
        self.post(
            json!({"jsonrpc": "2.0", "id": id, "method": "tools/list", "params": {}}),
            &[],
        )
        .await
    }

    pub async fn call_raw(&mut self, name: &str, args: Value, progress: Option<&str>) -> Exchange {
        let id = self.id();
        let mut params = json!({"name": name, "arguments": args});
        if let Some(t) = progress {
            params["_meta"] = json!({"progressToken": t});
        }
        self.post(
            json!({"jsonrpc": "2.0", "id": id, "method": "tools/call", "params": params}),
            &[],
        )
        .await
    }

    /// Calls a tool and returns its `result` (panics on an HTTP or JSON-RPC error).
    pub async fn call(&mut self, name: &str, args: Value) -> Value {
        let ex = self.call_raw(name, args, None).await;
        assert_eq!(ex.status, StatusCode::OK, "{name}: {ex:?}");
        let r = ex.response();
        assert!(r.get("error").is_none(), "{name}: JSON-RPC error {r}");
        r["result"].clone()
    }

    /// `structuredContent` of a successful call.
    pub async fn call_ok(&mut self, name: &str, args: Value) -> Value {
        let r = self.call(name, args).await;
        assert_ne!(r["isError"], json!(true), "{name} returned an error: {r}");
        r["structuredContent"].clone()
    }

    /// Library uids `list_libraries` shows.
    pub async fn library_uids(&mut self) -> Vec<String> {
        let out = self.call_ok("list_libraries", json!({})).await;
        out["libraries"]
            .as_array()
            .unwrap()
            .iter()
            .map(|l| l["uid"].as_str().unwrap().to_owned())
            .collect()
    }
}

/// Sends a request; its status and JSON body.
pub async fn send(req: reqwest::RequestBuilder) -> (StatusCode, Value) {
    json_of(req.send().await.expect("request sent")).await
}

/// Body and status of a plain HTTP call.
pub async fn json_of(r: reqwest::Response) -> (StatusCode, Value) {
    let s = r.status();
    (s, r.json().await.unwrap_or(Value::Null))
}

/// A log writer that keeps what it is given (log-capture tests).
#[derive(Clone, Default)]
pub struct Capture(pub std::sync::Arc<std::sync::Mutex<Vec<u8>>>);

impl std::io::Write for Capture {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}
