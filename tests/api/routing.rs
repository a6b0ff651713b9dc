//! A routed graph (`neo4j://`, issue 31): reads go to a reader, writes to
//! the writer, a write refused with NotALeader runs again on the new
//! leader, and what a replica wrote its next search finds.
//!
//! No Neo4j Enterprise runs here, so the cluster is a test double of ROUTE
//! only: two Bolt listeners in front of the one real graph server of the
//! run (Neo4j or ArcadeDB), each relaying every message and every byte of
//! data to it. Only two things are the double's own: it answers ROUTE with a
//! routing table naming one listener the writer and the other the reader,
//! and the reader refuses every write (a BEGIN or RUN not in read mode) with
//! `Neo.ClientError.Cluster.NotALeader`, as a follower does. Against
//! Community's own one-member ROUTE the whole suite runs in `scripts/test`'s
//! Neo4j pass (`MNEMOSYNE_BOLT_URI=neo4j://…`).

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;

use serde_json::json;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

use crate::helpers::{McpClient, TestApp};

/// What one listener of the double saw.
#[derive(Default)]
struct Seen {
    /// Writes relayed to the graph server.
    writes: AtomicUsize,
    /// Reads relayed to the graph server.
    reads: AtomicUsize,
    /// Of those, reads carrying bookmarks (a non-empty `bookmarks` list).
    reads_after_bookmarks: AtomicUsize,
    /// Writes refused with NotALeader.
    refused: AtomicUsize,
    /// ROUTE requests answered.
    routes: AtomicUsize,
}

struct Cluster {
    writer: u16,
    seen_writer: Arc<Seen>,
    seen_reader: Arc<Seen>,
    /// While set, ROUTE names the reader the writer (a stale table).
    stale: Arc<AtomicBool>,
}

impl Cluster {
    /// The two listeners, relaying to `upstream` (host:port).
    async fn start(upstream: String) -> Cluster {
        let w = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let r = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let (writer, reader) = (w.local_addr().unwrap().port(), r.local_addr().unwrap().port());
        let c = Cluster {
            writer,
            seen_writer: Arc::default(),
            seen_reader: Arc::default(),
            stale: Arc::default(),
        };
        for (listener, follower, seen) in [(w, false, c.seen_writer.clone()), (r, true, c.seen_reader.clone())] {
            let (upstream, stale) = (upstream.clone(), c.stale.clone());
            tokio::spawn(async move {
                while let Ok((client, _)) = listener.accept().await {
                    let (upstream, seen, stale) = (upstream.clone(), seen.clone(), stale.clone());
                    tokio::spawn(async move {
                        let _ = relay(client, &upstream, follower, writer, reader, seen, stale).await;
                    });
                }
            });
        }
        c
    }
}

/// One client connection: the handshake as is, then message by message.
async fn relay(
    mut client: TcpStream,
    upstream: &str,
    follower: bool,
    writer: u16,
    reader: u16,
    seen: Arc<Seen>,
    stale: Arc<AtomicBool>,
) -> std::io::Result<()> {
    let mut server = TcpStream::connect(upstream).await?;
    let mut hello = [0u8; 20];
    client.read_exact(&mut hello).await?;
    server.write_all(&hello).await?;
    let mut version = [0u8; 4];
    server.read_exact(&mut version).await?;
    client.write_all(&version).await?;
    let (mut server_rx, server_tx) = server.into_split();
    let (mut client_rx, client_tx) = client.into_split();
    let client_tx = Arc::new(tokio::sync::Mutex::new(client_tx));
    // Server to client: bytes as they come.
    let to_client = client_tx.clone();
    tokio::spawn(async move {
        let mut buf = vec![0u8; 64 * 1024];
        loop {
            match server_rx.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => {
                    if to_client.lock().await.write_all(&buf[..n]).await.is_err() {
                        break;
                    }
                }
            }
        }
    });
    let mut server_tx = server_tx;
    // Client to server: whole messages, some answered here.
    let mut failed = false;
    loop {
        let Some(message) = read_message(&mut client_rx).await? else {
            return Ok(());
        };
        let signature = message.get(1).copied().unwrap_or(0);
        let answer = |body: Vec<u8>| {
            let client_tx = client_tx.clone();
            async move { client_tx.lock().await.write_all(&chunked(&body)).await }
        };
        if failed {
            // After a FAILURE everything up to RESET is IGNORED.
            if signature == RESET {
                failed = false;
                server_tx.write_all(&chunked(&message)).await?;
            } else {
                answer(vec![0xB0, IGNORED]).await?;
            }
            continue;
        }
        match signature {
            ROUTE => {
                seen.routes.fetch_add(1, Ordering::SeqCst);
                let (w, r) = if stale.load(Ordering::SeqCst) {
                    (reader, writer)
                } else {
                    (writer, reader)
                };
                answer(success_route(w, r)).await?;
            }
            BEGIN | RUN if !read_mode(&message) => {
                if follower {
                    seen.refused.fetch_add(1, Ordering::SeqCst);
                    // The cluster has moved on: the next table is right.
                    stale.store(false, Ordering::SeqCst);
                    failed = true;
                    answer(failure("Neo.ClientError.Cluster.NotALeader", "No write operations are allowed on this database. This is a read only database: not the leader.")).await?;
                } else {
                    seen.writes.fetch_add(1, Ordering::SeqCst);
                    server_tx.write_all(&chunked(&message)).await?;
                }
            }
            BEGIN | RUN => {
                seen.reads.fetch_add(1, Ordering::SeqCst);
                if carries_bookmarks(&message) {
                    seen.reads_after_bookmarks.fetch_add(1, Ordering::SeqCst);
                }
                server_tx.write_all(&chunked(&message)).await?;
            }
            _ => server_tx.write_all(&chunked(&message)).await?,
        }
    }
}

const RESET: u8 = 0x0F;
const RUN: u8 = 0x10;
const BEGIN: u8 = 0x11;
const ROUTE: u8 = 0x66;
const SUCCESS: u8 = 0x70;
const IGNORED: u8 = 0x7E;
const FAILURE: u8 = 0x7F;

/// One Bolt message (its chunks joined), None at the end of the stream.
/// Empty chunks between messages (NOOPs) are skipped.
async fn read_message(rx: &mut (impl AsyncReadExt + Unpin)) -> std::io::Result<Option<Vec<u8>>> {
    let mut message = Vec::new();
    loop {
        let mut size = [0u8; 2];
        if let Err(e) = rx.read_exact(&mut size).await {
            return if e.kind() == std::io::ErrorKind::UnexpectedEof {
                Ok(None)
            } else {
                Err(e)
            };
        }
        let n = u16::from_be_bytes(size) as usize;
        if n == 0 {
            if message.is_empty() {
                continue;
            }
            return Ok(Some(message));
        }
        let start = message.len();
        message.resize(start + n, 0);
        rx.read_exact(&mut message[start..]).await?;
    }
}

fn chunked(message: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(message.len() + 4);
    for part in message.chunks(u16::MAX as usize) {
        out.extend_from_slice(&(part.len() as u16).to_be_bytes());
        out.extend_from_slice(part);
    }
    out.extend_from_slice(&[0, 0]);
    out
}

/// Whether a BEGIN or RUN carries `mode: "r"` in its extra map (PackStream:
/// the tiny string "mode" and the tiny string "r").
fn read_mode(message: &[u8]) -> bool {
    const MODE_R: &[u8] = &[0x84, b'm', b'o', b'd', b'e', 0x81, b'r'];
    message.windows(MODE_R.len()).any(|w| w == MODE_R)
}

/// Whether a message's extra map holds a non-empty `bookmarks` list (the
/// tiny string "bookmarks", then a tiny list of 1–15 items).
fn carries_bookmarks(message: &[u8]) -> bool {
    const KEY: &[u8] = b"\x89bookmarks";
    message
        .windows(KEY.len() + 1)
        .any(|w| &w[..KEY.len()] == KEY && (0x91..=0x9F).contains(&w[KEY.len()]))
}

/// PackStream values, enough for the double's own answers.
enum Pack<'a> {
    Int(i64),
    Str(&'a str),
    List(Vec<Pack<'a>>),
    Map(Vec<(&'a str, Pack<'a>)>),
}

fn pack(v: &Pack<'_>, out: &mut Vec<u8>) {
    match v {
        Pack::Int(i) => {
            out.push(0xCB);
            out.extend_from_slice(&i.to_be_bytes());
        }
        Pack::Str(s) => {
            let b = s.as_bytes();
            if b.len() < 16 {
                out.push(0x80 | b.len() as u8);
            } else {
                out.push(0xD0);
                out.push(u8::try_from(b.len()).expect("short strings only"));
            }
            out.extend_from_slice(b);
        }
        Pack::List(items) => {
            out.push(
                0x90 | u8::try_from(items.len())
                    .ok()
                    .filter(|n| *n < 16)
                    .expect("small lists only"),
            );
            for i in items {
                pack(i, out);
            }
        }
        Pack::Map(entries) => {
            out.push(
                0xA0 | u8::try_from(entries.len())
                    .ok()
                    .filter(|n| *n < 16)
                    .expect("small maps only"),
            );
            for (k, v) in entries {
                pack(&Pack::Str(k), out);
                pack(v, out);
            }
        }
    }
}

fn message(signature: u8, field: Pack<'_>) -> Vec<u8> {
    let mut out = vec![0xB1, signature];
    pack(&field, &mut out);
    out
}

/// SUCCESS {rt: {ttl, db, servers}}: `w` writes, `r` reads, both route.
fn success_route(w: u16, r: u16) -> Vec<u8> {
    let (w, r) = (format!("127.0.0.1:{w}"), format!("127.0.0.1:{r}"));
    fn server<'a>(address: &'a str, role: &'static str) -> Pack<'a> {
        Pack::Map(vec![
            ("addresses", Pack::List(vec![Pack::Str(address)])),
            ("role", Pack::Str(role)),
        ])
    }
    let routers = Pack::Map(vec![
        ("addresses", Pack::List(vec![Pack::Str(&w), Pack::Str(&r)])),
        ("role", Pack::Str("ROUTE")),
    ]);
    // The database the app asks for: neo4rs files the table under it.
    let db = crate::helpers::base_settings().bolt_database;
    let table = Pack::Map(vec![
        ("ttl", Pack::Int(300)),
        ("db", Pack::Str(&db)),
        (
            "servers",
            Pack::List(vec![server(&w, "WRITE"), server(&r, "READ"), routers]),
        ),
    ]);
    message(SUCCESS, Pack::Map(vec![("rt", table)]))
}

fn failure(code: &str, text: &str) -> Vec<u8> {
    message(
        FAILURE,
        Pack::Map(vec![("code", Pack::Str(code)), ("message", Pack::Str(text))]),
    )
}

/// An app whose graph is the double's cluster, seeded with the writer;
/// with `stale`, the first routing table names the reader the writer.
async fn routed_app(stale: bool) -> (TestApp, Cluster) {
    let cluster = Cluster::start(crate::helpers::bolt_address()).await;
    cluster.stale.store(stale, Ordering::SeqCst);
    let seed = format!("neo4j://127.0.0.1:{}", cluster.writer);
    let app = TestApp::spawn_with(|s| s.bolt_uri = seed).await;
    (app, cluster)
}

async fn search_finds(app: &TestApp, lib: &str, word: &str) -> bool {
    let token = app.opaque_token(&[lib.to_owned()]).await;
    let mut c = McpClient::new(app.http.clone(), format!("{}/mcp/", app.base), &token)
        .connect()
        .await;
    let out = c.call_ok("search", json!({"query": word, "mode": "keyword"})).await;
    let found = out["results"].as_array().is_some_and(|r| !r.is_empty());
    let items = c.call_ok("list_items", json!({"library_uid": lib})).await;
    assert!(
        items["items"].as_array().is_some_and(|i| !i.is_empty()),
        "list_items (a read on the reader, after this replica's bookmark) shows nothing: {items}"
    );
    found
}

#[tokio::test]
async fn reads_go_to_the_reader_writes_to_the_writer_and_the_next_search_sees_the_write() {
    let (app, cluster) = routed_app(false).await;
    let lib = app.library("routed").await;
    app.ingest(json!({"library_uid": lib, "item": {"title": "Kelp forests"},
                      "content": "Sea otters keep urchins from turning kelp forests into barrens."}))
        .await;
    assert!(
        search_finds(&app, &lib, "otters").await,
        "the search right after the ingest missed it"
    );
    let (w, r) = (&cluster.seen_writer, &cluster.seen_reader);
    assert!(
        w.routes.load(Ordering::SeqCst) >= 1,
        "the driver never asked for a routing table"
    );
    assert!(w.writes.load(Ordering::SeqCst) >= 1, "no write reached the writer");
    assert!(r.reads.load(Ordering::SeqCst) >= 1, "no read reached the reader");
    assert_eq!(r.refused.load(Ordering::SeqCst), 0, "a write went to the reader");
    // Neo4j gives every commit a bookmark, and the replica's reads after
    // its writes carry them, so a lagging reader waits for them (ArcadeDB
    // gives none).
    if app.settings.graph_flavor == mnemosyne::config::GraphFlavor::Neo4j {
        assert!(
            r.reads_after_bookmarks.load(Ordering::SeqCst) >= 1,
            "no read after the ingest carried its bookmark"
        );
    }
}

#[tokio::test]
async fn a_write_refused_as_not_the_leader_runs_again_on_the_new_one() {
    // The app's first routing table names the reader the writer (what a
    // replica holds right after the leader moved): its first write is
    // refused with NotALeader, the driver is renewed, reads a fresh table,
    // and the write runs again on the leader.
    let (app, cluster) = routed_app(true).await;
    let lib = app.library("failover").await;
    app.ingest(json!({"library_uid": lib, "item": {"title": "Longshore drift"},
                      "content": "Waves that reach the beach at an angle move sand along the shore."}))
        .await;
    assert!(
        cluster.seen_reader.refused.load(Ordering::SeqCst) >= 1,
        "the stale writer never refused a write"
    );
    assert!(
        cluster.seen_writer.writes.load(Ordering::SeqCst) >= 1,
        "no write reached the leader"
    );
    assert!(
        search_finds(&app, &lib, "longshore").await,
        "the write retried on the leader is not found"
    );
}
