//! Transaction pooling (issue 31): a replica whose `MNEMOSYNE_DATABASE_URL`
//! goes through PgBouncer in transaction mode — three server connections
//! shared by every client connection, prepared statements tracked by the
//! pooler (`max_prepared_statements`, PgBouncer ≥ 1.21: `scripts/pgbouncer`
//! builds Debian's 1.24.1 source) — and whose `MNEMOSYNE_DATABASE_LISTEN_URL`
//! goes straight to the database (the LISTEN connection and the embedding
//! leader's lock need a session of their own). Migrations run on the direct
//! URL (their lock is session-level). The whole surface a client touches
//! works, concurrently: team REST, ingest, MCP sessions, search, revocation.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use reqwest::StatusCode;
use serde_json::json;

use crate::helpers::{free_port, TestApp};

/// A PgBouncer of this test's own, stopped when dropped.
struct Bouncer {
    child: Child,
    dir: PathBuf,
    port: u16,
}

impl Drop for Bouncer {
    fn drop(&mut self) {
        // The child may be `runuser`, whose SIGKILL leaves its pgbouncer
        // running (two were left after a fresh-clone run): stop pgbouncer
        // itself by its pidfile first, then the child.
        if let Some(pid) = std::fs::read_to_string(self.dir.join("pgbouncer.pid"))
            .ok()
            .and_then(|p| p.trim().parse::<i32>().ok())
        {
            unsafe { libc::kill(pid, libc::SIGTERM) };
            for _ in 0..50 {
                if unsafe { libc::kill(pid, 0) } != 0 {
                    break;
                }
                std::thread::sleep(Duration::from_millis(20));
            }
            unsafe { libc::kill(pid, libc::SIGKILL) };
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

impl Bouncer {
    /// Transaction pooling in front of the Postgres server of `direct`.
    async fn start(direct: &str) -> Bouncer {
        let root = Path::new(env!("CARGO_MANIFEST_DIR"));
        let out = Command::new(root.join("scripts/pgbouncer"))
            .output()
            .expect("run scripts/pgbouncer");
        assert!(
            out.status.success(),
            "scripts/pgbouncer: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let bin = String::from_utf8_lossy(&out.stdout).trim().to_owned();
        let (_, server) = direct.split_once('@').expect("user@host in the database URL");
        let (hostport, _) = server.split_once('/').unwrap();
        let (host, pg_port) = hostport.rsplit_once(':').unwrap_or((hostport, "5432"));
        let dir = std::env::temp_dir().join(format!("mnemosyne-pgbouncer-{}", uuid::Uuid::new_v4().simple()));
        std::fs::create_dir_all(&dir).unwrap();
        let port = free_port();
        std::fs::write(dir.join("users.txt"), "\"postgres\" \"\"\n").unwrap();
        std::fs::write(
            dir.join("pgbouncer.ini"),
            format!(
                "[databases]\n* = host={host} port={pg_port}\n\n[pgbouncer]\n\
                 listen_addr = 127.0.0.1\nlisten_port = {port}\nunix_socket_dir =\n\
                 auth_type = trust\nauth_file = {users}\nadmin_users = postgres\n\
                 pool_mode = transaction\nmax_prepared_statements = 200\n\
                 default_pool_size = 3\nmax_client_conn = 500\n\
                 ignore_startup_parameters = extra_float_digits\n\
                 logfile = {log}\npidfile = {pid}\n",
                users = dir.join("users.txt").display(),
                log = dir.join("pgbouncer.log").display(),
                pid = dir.join("pgbouncer.pid").display(),
            ),
        )
        .unwrap();
        // PgBouncer refuses to run as root: as `postgres` then (whom
        // `scripts/dev up` created with Debian's postgresql), from a copy in
        // this directory (the checkout may not be readable by that user).
        let bin = {
            let copy = dir.join("pgbouncer");
            std::fs::copy(&bin, &copy).expect("copy the pgbouncer binary");
            copy
        };
        let mut cmd = if unsafe { libc::geteuid() } == 0 {
            let _ = Command::new("chown").args(["-R", "postgres"]).arg(&dir).status();
            let mut c = Command::new("runuser");
            c.args(["-u", "postgres", "--"]).arg(&bin);
            c
        } else {
            Command::new(&bin)
        };
        let child = cmd
            .arg(dir.join("pgbouncer.ini"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start pgbouncer");
        let b = Bouncer { child, dir, port };
        // Bounded: 10 s for it to listen.
        for _ in 0..100 {
            if std::net::TcpStream::connect(("127.0.0.1", port)).is_ok() {
                return b;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        panic!(
            "pgbouncer did not listen: {}",
            std::fs::read_to_string(b.dir.join("pgbouncer.log")).unwrap_or_default()
        );
    }

    /// `direct`'s database, through this pooler.
    fn url(&self, direct: &str) -> String {
        let (_, db) = direct.rsplit_once('/').unwrap();
        format!("postgres://postgres@127.0.0.1:{}/{db}", self.port)
    }

    /// Transactions the pooler ran for `db` (its admin console's SHOW STATS,
    /// read with psql: the console speaks only the simple protocol).
    fn transactions(&self, db: &str) -> i64 {
        let out = Command::new("psql")
            .args(["-h", "127.0.0.1", "-p", &self.port.to_string(), "-U", "postgres"])
            .args(["-A", "-F", "|", "-c", "SHOW STATS", "pgbouncer"])
            .output()
            .expect("psql (scripts/dev up installs postgresql)");
        let text = String::from_utf8_lossy(&out.stdout);
        let mut lines = text.lines();
        let header: Vec<&str> = lines.next().unwrap_or_default().split('|').collect();
        let col = header
            .iter()
            .position(|c| *c == "total_xact_count")
            .unwrap_or_else(|| panic!("SHOW STATS: {text}"));
        lines
            .map(|l| l.split('|').collect::<Vec<_>>())
            .find(|f| f.first() == Some(&db))
            .and_then(|f| f.get(col)?.parse().ok())
            .unwrap_or_else(|| panic!("no SHOW STATS row for {db}: {text}"))
    }
}

#[tokio::test]
async fn a_replica_behind_transaction_pooling_serves_everything() {
    // Migrated on the direct URL (as `mnemosyne migrate` must be).
    let first = TestApp::spawn().await;
    let direct = first.settings.database_url.clone();
    let bouncer = Bouncer::start(&direct).await;
    let mut settings = first.settings.clone();
    settings.database_url = bouncer.url(&direct);
    settings.database_listen_url = Some(direct.clone());
    // Caches on: revocation reaches them through the direct LISTEN connection.
    let app = first.replica_with(settings).await;

    // Team REST and ingest.
    let (team, jwt) = app.create_team("Pooled").await;
    let ws = app.uid("ws_pooled");
    app.put_workspaces(team, &[ws.clone()]).await;
    app.ingest(json!({"workspace_id": ws, "item": {"title": "Pools"},
                      "content": "# Pools\n\nA bouncer multiplexes the zebrapool connections."}))
        .await;
    // Eight clients at once, each with a session of its own, over three
    // server connections: every statement lands on whichever is free.
    let mut clients = Vec::new();
    for _ in 0..8 {
        let (app_url, http, jwt) = (app.url("/mcp/"), app.http.clone(), jwt.clone());
        clients.push(tokio::spawn(async move {
            let mut c = crate::helpers::McpClient::new(http, app_url, &jwt).connect().await;
            let mut found = 0;
            for _ in 0..10 {
                let out = c.call_ok("search", json!({"query": "zebrapool"})).await;
                found += usize::from(out["results"].as_array().is_some_and(|r| !r.is_empty()));
                assert_eq!(c.list_tools().await.status, StatusCode::OK);
            }
            found
        }));
    }
    for c in clients {
        assert_eq!(c.await.unwrap(), 10, "every search finds the ingested page");
    }
    // An opaque token, used, revoked: refused on its next request.
    let token = app.opaque_token(&[]).await;
    let mut c = app.mcp(&token).connect().await;
    assert_eq!(c.list_tools().await.status, StatusCode::OK);
    sqlx::query("UPDATE mcp_tokens SET active = FALSE")
        .execute(&first.pg)
        .await
        .unwrap();
    let mut status = StatusCode::OK;
    for _ in 0..50 {
        status = c.list_tools().await.status;
        if status == StatusCode::UNAUTHORIZED {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(
        status,
        StatusCode::UNAUTHORIZED,
        "revocation through the pooled replica"
    );
    // The traffic did go through the pooler.
    let db = direct.rsplit_once('/').unwrap().1;
    let xacts = bouncer.transactions(db);
    println!("PgBouncer (transaction mode, 3 server connections) ran {xacts} transactions for the replica");
    assert!(xacts > 100, "PgBouncer ran {xacts} transactions for {db}");
}
