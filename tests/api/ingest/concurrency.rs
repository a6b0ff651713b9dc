//! Concurrent ingests, delete races and graph outages (issue 10).

use super::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sixty_four_concurrent_first_ingests_into_one_new_workspace_all_succeed() {
    let app = TestApp::spawn_with(|s| s.store_timeout_ms = UNDER_LOAD_TIMEOUT_MS).await;
    warm_service_account(&app).await;
    let ws = app.uid("ws");
    let results = futures::future::join_all((0..64).map(|i| {
        post_ingest(
            &app,
            json!({"workspace_id": ws, "item": {"title": format!("Doc {i}"), "uid": app.uid(&format!("doc{i}"))},
                   "content": document("first", i, 2)}),
        )
    }))
    .await;
    for (status, body) in &results {
        assert!(status.is_success(), "{status} {body}");
    }
    let libs = app.state.admin.workspace_libraries(&ws).await.unwrap();
    assert_eq!(libs.len(), 1, "one Library per workspace");
    assert_eq!(libs[0].item_count, 64);
    assert_eq!(libs[0].collection_count, 1);
    assert!(results.iter().all(|(_, b)| b["library_uid"] == libs[0].uid.as_str()));
    let expected: i64 = results.iter().map(|(_, b)| b["chunk_count"].as_i64().unwrap()).sum();
    assert_eq!(libs[0].chunk_count, expected);
    let items = graph_count(
        &app,
        "MATCH (i:Item) WHERE i.library_uid = $lib RETURN count(i) AS n",
        &[("lib", &libs[0].uid)],
    )
    .await;
    assert_eq!(items, 64, "one Item per item uid");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_reingests_leave_each_item_with_the_chunks_of_one_request() {
    let app = TestApp::spawn_with(|s| s.store_timeout_ms = UNDER_LOAD_TIMEOUT_MS).await;
    warm_service_account(&app).await;
    let ws = app.uid("ws");
    // 64 requests over 8 item uids, every request with its own content and size.
    let requests: Vec<(String, String)> = (0..64)
        .map(|r| (app.uid(&format!("item{}", r % 8)), document("re", r, 1 + r % 4)))
        .collect();
    let results = futures::future::join_all(requests.iter().map(|(uid, content)| {
        post_ingest(
            &app,
            json!({"workspace_id": ws, "item": {"title": "Shared", "uid": uid}, "content": content}),
        )
    }))
    .await;
    for (status, body) in &results {
        assert!(status.is_success(), "{status} {body}");
    }
    let libs = app.state.admin.workspace_libraries(&ws).await.unwrap();
    assert_eq!(libs.len(), 1);
    assert_eq!(libs[0].item_count, 8);
    let max = app.settings.chunk_max_chars;
    let mut total = 0;
    for k in 0..8 {
        let uid = app.uid(&format!("item{k}"));
        let stored = chunk_texts(&app, &uid).await;
        let candidates: Vec<Vec<String>> = requests
            .iter()
            .filter(|(u, _)| *u == uid)
            .map(|(_, c)| mnemosyne::service::ingest::split(c, max))
            .collect();
        assert!(
            candidates.contains(&stored),
            "item {uid}: its {} chunks are not exactly those of one request",
            stored.len()
        );
        let item = app.state.admin.find_item(&uid).await.unwrap().unwrap();
        assert_eq!(item.chunk_count, stored.len() as i64);
        total += stored.len() as i64;
    }
    assert_eq!(libs[0].chunk_count, total, "no chunk left over from a lost request");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ingests_racing_a_workspace_delete_leave_no_orphans() {
    let app = TestApp::spawn_with(|s| s.store_timeout_ms = UNDER_LOAD_TIMEOUT_MS).await;
    warm_service_account(&app).await;
    let ws = app.uid("ws");
    let lib = mnemosyne::store::graph::ingest::derived_uid("lib", &["workspace", &ws]);
    for round in 0..3 {
        // Before the delete: "aardvark" documents.
        let before = futures::future::join_all((0..8).map(|i| {
            post_ingest(
                &app,
                json!({"workspace_id": ws, "item": {"title": format!("Before {i}"), "uid": app.uid(&format!("b{round}_{i}"))},
                       "content": format!("aardvark {}", document("before", i, 2))}),
            )
        }))
        .await;
        assert!(before.iter().all(|(s, _)| s.is_success()), "{before:?}");
        // During the delete: racing ingests, some of them re-ingesting the items above.
        let racing = futures::future::join_all((0..24).map(|i| {
            let uid = if i % 3 == 0 {
                app.uid(&format!("b{round}_{}", i % 8))
            } else {
                app.uid(&format!("r{round}_{i}"))
            };
            let body = json!({"workspace_id": ws, "item": {"title": format!("Racing {i}"), "uid": uid},
                              "content": format!("racing {}", document("racing", i, 1 + i % 3))});
            let app = &app;
            async move {
                // Round 0: all at once with the delete; then spread over it,
                // so some land before, some during and some after it.
                tokio::time::sleep(std::time::Duration::from_millis((round * 10 * i) as u64)).await;
                post_ingest(app, body).await
            }
        }));
        let delete = async {
            tokio::time::sleep(std::time::Duration::from_millis(5 * round as u64)).await;
            send(app.service(Method::DELETE, &format!("/library/api/workspaces/{ws}/"))).await
        };
        let (racing, (del_status, del_body)) = tokio::join!(racing, delete);
        assert_eq!(del_status, StatusCode::NO_CONTENT, "{del_body}");
        for (status, body) in &racing {
            assert!(
                status.is_success() || *status == StatusCode::CONFLICT,
                "a racing ingest must land or fail clearly: {status} {body}"
            );
        }
        // Invariants: nothing under a library that is gone, nothing half-written.
        let library_exists = app.state.admin.find_library(&lib).await.unwrap().is_some();
        let chunks = graph_count(
            &app,
            "MATCH (c:Chunk) WHERE c.library_uid = $lib RETURN count(c) AS n",
            &[("lib", &lib)],
        )
        .await;
        let items = graph_count(
            &app,
            "MATCH (i:Item) WHERE i.library_uid = $lib RETURN count(i) AS n",
            &[("lib", &lib)],
        )
        .await;
        if !library_exists {
            assert_eq!(
                (chunks, items),
                (0, 0),
                "round {round}: orphans under the deleted library"
            );
        }
        let rows = graph_rows(
            &app,
            "MATCH (i:Item) WHERE i.library_uid = $lib RETURN i.uid AS uid, i.chunk_count AS n",
            &[("lib", &lib)],
        )
        .await;
        for r in &rows {
            let uid: String = r.get("uid").unwrap();
            let n: i64 = r.get("n").unwrap();
            let texts = chunk_texts(&app, &uid).await;
            assert_eq!(texts.len() as i64, n, "round {round}: item {uid} is half-written");
            assert!(
                texts[0].starts_with("racing"),
                "round {round}: item {uid} survived the delete"
            );
        }
        let stray = graph_count(
            &app,
            "MATCH (c:Chunk) WHERE c.library_uid = $lib AND NOT (c)-[:OF_ITEM]->(:Item) RETURN count(c) AS n",
            &[("lib", &lib)],
        )
        .await;
        assert_eq!(stray, 0, "round {round}: chunks without their item");
        let sum: i64 = rows.iter().map(|r| r.get::<i64>("n").unwrap()).sum();
        assert_eq!(chunks, sum, "round {round}: chunks not accounted for by an item");
    }
    // After the last delete: a fresh ingest, and a team that attaches the
    // workspace sees only what was ingested after the delete.
    send(app.service(Method::DELETE, &format!("/library/api/workspaces/{ws}/"))).await;
    app.ingest(json!({"workspace_id": ws, "item": {"title": "After"}, "content": "The zebrafish glows."}))
        .await;
    let (id, jwt) = app.create_team("Racers").await;
    app.put_workspaces(id, &[ws.clone()]).await;
    let mut c = app.mcp(&jwt).connect().await;
    assert_eq!(c.library_uids().await, vec![lib.clone()]);
    let hits = c.call_ok("search", json!({"query": "zebrafish"})).await;
    assert_eq!(hits["results"].as_array().unwrap().len(), 1);
    for gone in ["aardvark", "racing"] {
        assert_eq!(
            c.call_ok("search", json!({"query": gone})).await["results"],
            json!([]),
            "{gone}: a chunk from before the delete was inherited"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_item_delete_racing_its_reingest_leaves_it_whole_or_gone() {
    let app = TestApp::spawn_with(|s| s.store_timeout_ms = UNDER_LOAD_TIMEOUT_MS).await;
    warm_service_account(&app).await;
    let ws = app.uid("ws");
    let uid = app.uid("doc");
    for round in 0..4 {
        app.ingest(
            json!({"workspace_id": ws, "item": {"title": "Doc", "uid": uid}, "content": document("old", round, 3)}),
        )
        .await;
        let reingest = post_ingest(
            &app,
            json!({"workspace_id": ws, "item": {"title": "Doc", "uid": uid}, "content": document("new", round, 2)}),
        );
        let delete = send(app.service(Method::DELETE, &format!("/library/api/items/{uid}/")));
        let ((s1, b1), (s2, b2)) = tokio::join!(reingest, delete);
        assert!(s1.is_success(), "{s1} {b1}");
        assert!(s2 == StatusCode::NO_CONTENT || s2 == StatusCode::NOT_FOUND, "{s2} {b2}");
        let texts = chunk_texts(&app, &uid).await;
        match app.state.admin.find_item(&uid).await.unwrap() {
            Some(item) => assert_eq!(item.chunk_count, texts.len() as i64),
            None => assert!(texts.is_empty(), "round {round}: chunks of a deleted item"),
        }
    }
}

/// The same race as above, many times over and straight on the graph (no
/// HTTP in between: the window between a delete's chunk and item statements
/// is narrow), with the delete started a little later each round.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn item_deletes_racing_reingests_never_leave_chunks_without_their_item() {
    use mnemosyne::store::graph::ingest::ItemWrite;
    fn write<'a>(uid: &'a str, lib: &'a str, collection: &'a str, sha: &'a str, chunks: &'a [String]) -> ItemWrite<'a> {
        ItemWrite {
            uid,
            library_uid: lib,
            workspace_id: None,
            collection_uid: collection,
            title: "Doc",
            source_uri: None,
            mime_type: None,
            content_sha256: sha,
            chunks,
        }
    }
    let app = TestApp::spawn_with(|s| s.store_timeout_ms = UNDER_LOAD_TIMEOUT_MS).await;
    let lib = app.library("race").await;
    let admin = &app.state.admin;
    let collection = admin.ensure_collection(&lib, "race").await.unwrap();
    let old: Vec<String> = (0..3).map(|i| format!("old chunk {i}")).collect();
    let new: Vec<String> = (0..2).map(|i| format!("new chunk {i}")).collect();
    for round in 0..40u64 {
        let uid = app.uid(&format!("doc{round}"));
        admin
            .write_item(&write(&uid, &lib, &collection, "old", &old))
            .await
            .unwrap();
        let replacement = write(&uid, &lib, &collection, "new", &new);
        let reingest = admin.write_item(&replacement);
        let delete = async {
            tokio::time::sleep(std::time::Duration::from_millis(round % 8)).await;
            admin.delete_item(&uid).await.unwrap()
        };
        let (written, _) = tokio::join!(reingest, delete);
        written.unwrap();
        let texts = chunk_texts(&app, &uid).await;
        match admin.find_item(&uid).await.unwrap() {
            Some(item) => assert_eq!(item.chunk_count, texts.len() as i64, "round {round}: {texts:?}"),
            None => assert!(texts.is_empty(), "round {round}: chunks of a deleted item: {texts:?}"),
        }
    }
}

/// A TCP proxy in front of the real Bolt port that can be cut: after `cut`,
/// it forwards at most `budget` more bytes from the client, then closes every
/// connection and refuses new ones.
struct CuttableProxy {
    port: u16,
    cut: std::sync::Arc<std::sync::atomic::AtomicI64>,
}

impl CuttableProxy {
    async fn start(target: String) -> CuttableProxy {
        use std::sync::atomic::{AtomicI64, Ordering};
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        // i64::MAX = not cut; otherwise the bytes still allowed through.
        let cut = std::sync::Arc::new(AtomicI64::new(i64::MAX));
        let budget = cut.clone();
        tokio::spawn(async move {
            loop {
                let Ok((client, _)) = listener.accept().await else {
                    return;
                };
                if budget.load(Ordering::SeqCst) <= 0 {
                    return; // drops the listener: connection refused from now on
                }
                let Ok(server) = tokio::net::TcpStream::connect(&target).await else {
                    continue;
                };
                let budget = budget.clone();
                tokio::spawn(async move {
                    let (mut cr, mut cw) = client.into_split();
                    let (mut sr, mut sw) = server.into_split();
                    let up = async {
                        let mut buf = vec![0u8; 16 * 1024];
                        loop {
                            let n = match cr.read(&mut buf).await {
                                Ok(0) | Err(_) => return,
                                Ok(n) => n,
                            };
                            let left = budget.fetch_sub(n as i64, Ordering::SeqCst);
                            if left <= 0 {
                                return;
                            }
                            let pass = (left as usize).min(n);
                            if sw.write_all(&buf[..pass]).await.is_err() || pass < n {
                                return;
                            }
                        }
                    };
                    let down = async {
                        let mut buf = vec![0u8; 16 * 1024];
                        loop {
                            let n = match sr.read(&mut buf).await {
                                Ok(0) | Err(_) => return,
                                Ok(n) => n,
                            };
                            if budget.load(Ordering::SeqCst) <= 0 || cw.write_all(&buf[..n]).await.is_err() {
                                return;
                            }
                        }
                    };
                    // Whichever side ends first closes both.
                    tokio::select! { _ = up => {}, _ = down => {} }
                });
            }
        });
        CuttableProxy { port, cut }
    }

    /// From now on, `bytes` more client bytes pass, then everything is cut.
    fn cut_after(&self, bytes: i64) {
        self.cut.store(bytes, std::sync::atomic::Ordering::SeqCst);
    }
}

#[tokio::test]
async fn a_graph_outage_during_ingest_is_503_with_nothing_half_written() {
    let proxy = CuttableProxy::start(crate::helpers::bolt_address()).await;
    let port = proxy.port;
    let app = TestApp::spawn_with(|s| {
        s.bolt_uri = format!("127.0.0.1:{port}");
        s.store_timeout_ms = 3_000;
    })
    .await;
    let ws = app.uid("ws");
    let uid = app.uid("big");
    let first = app
        .ingest(json!({"workspace_id": ws, "item": {"title": "Big", "uid": uid}, "content": document("v1", 0, 4)}))
        .await;
    // The replacement is ~200 kB of chunks; the graph goes away part-way
    // through sending them, inside the item's write transaction.
    proxy.cut_after(60_000);
    let (status, body) = post_ingest(
        &app,
        json!({"workspace_id": ws, "item": {"title": "Big", "uid": uid}, "content": document("v2", 0, 250)}),
    )
    .await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{body}");
    assert_eq!(body["error"], "unavailable");
    assert_eq!(body["store"], "graph");
    // Read through a store on the real port: the old version, whole.
    let real = mnemosyne::store::graph::ingest::AdminGraph::connect(&base_settings())
        .await
        .unwrap();
    let item = real.find_item(&uid).await.unwrap().expect("the item is still there");
    assert_eq!(item.chunk_count, first["chunk_count"].as_i64().unwrap());
    let texts = chunk_texts_in(&real, &uid).await;
    assert_eq!(texts.len() as i64, item.chunk_count, "half-written chunks");
    assert!(
        texts.iter().all(|t| t.contains("v10x")),
        "a chunk of the failed request was kept"
    );
    // And a new request while the graph is unreachable is a 503 too.
    let (status, _) = post_ingest(
        &app,
        json!({"workspace_id": ws, "item": {"title": "Other"}, "content": "text"}),
    )
    .await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
}

/// Hardening 3, row 2: right after every auth cache is flushed (a user
/// created elsewhere), a burst of 64 identical service-account requests is
/// verified with one argon2 hash, and every request is served.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn identical_concurrent_credentials_are_verified_once_after_a_flush() {
    let app = TestApp::spawn_with(|s| s.store_timeout_ms = UNDER_LOAD_TIMEOUT_MS).await;
    warm_service_account(&app).await;
    // A user created through the CLI's path: its NOTIFY flushes the caches.
    let before = app.state.basic.hashes();
    let generation = app.state.auth.caches.basic.generation();
    mnemosyne::store::pg::notify(&app.pg, "users:*").await.unwrap();
    let mut flushed = false;
    for _ in 0..200 {
        if app.state.auth.caches.basic.generation() > generation {
            flushed = true;
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    assert!(flushed, "the NOTIFY flushed the Basic cache");
    let ws = app.uid("ws");
    let results = futures::future::join_all((0..64).map(|i| {
        post_ingest(
            &app,
            json!({"workspace_id": ws, "item": {"title": format!("Doc {i}"), "uid": app.uid(&format!("doc{i}"))},
                   "content": document("burst", i, 1)}),
        )
    }))
    .await;
    let failed: Vec<_> = results.iter().filter(|(s, _)| !s.is_success()).collect();
    assert!(failed.is_empty(), "{} of 64 failed: {:?}", failed.len(), failed.first());
    assert_eq!(
        app.state.basic.hashes() - before,
        1,
        "one argon2 hash for 64 identical credentials"
    );
}

/// On Neo4j a read can match a node that a concurrent delete removes before
/// its properties are read: they come back null. Such a node is gone, not an
/// error (a 500 "Invalid type: unit value" before), for the ingest's item
/// lookup and for `search` and `get_chunk` alike.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_read_while_it_is_deleted_is_absent_not_an_error() {
    // The tool calls wait behind 40 deletes and 240 reads for the pool's 32
    // connections: they get the same allowance as the store (CI once saw a
    // get_chunk pass the default 10 s tool deadline there).
    let app = TestApp::spawn_with(|s| {
        s.store_timeout_ms = UNDER_LOAD_TIMEOUT_MS;
        s.tool_deadline_ms = UNDER_LOAD_TIMEOUT_MS;
    })
    .await;
    warm_service_account(&app).await;
    let ws = app.uid("ws");
    let uids: Vec<String> = (0..40).map(|i| app.uid(&format!("gone{i}"))).collect();
    for round in 0..3 {
        for (i, uid) in uids.iter().enumerate() {
            app.ingest(
                json!({"workspace_id": ws, "item": {"title": "Vanishing doc", "uid": uid},
                              "content": document("g", round * 100 + i, 2)}),
            )
            .await;
        }
        let admin = &app.state.admin;
        let lib = admin.workspace_libraries(&ws).await.unwrap()[0].uid.clone();
        let mut mcp = app.mcp(&app.opaque_token(&[lib]).await).connect().await;
        let found = mcp.call_ok("search", json!({"query": "vanishing", "limit": 50})).await;
        let chunks: Vec<String> = found["results"]
            .as_array()
            .unwrap()
            .iter()
            .map(|h| h["chunk_uid"].as_str().unwrap().to_owned())
            .collect();
        assert!(!chunks.is_empty(), "{found}");
        let deletes = futures::future::join_all(uids.iter().map(|uid| admin.delete_item(uid)));
        let reads = async {
            let mut errors = Vec::new();
            for _ in 0..6 {
                for r in futures::future::join_all(uids.iter().map(|uid| admin.find_item(uid))).await {
                    if let Err(e) = r {
                        errors.push(e.to_string());
                    }
                }
            }
            errors
        };
        let tools = async {
            let mut errors = Vec::new();
            for (n, chunk) in chunks.iter().enumerate().take(12) {
                let r = mcp.call("search", json!({"query": "vanishing", "limit": 50})).await;
                if r["isError"] == json!(true) {
                    errors.push(format!("search {n}: {r}"));
                }
                let r = mcp.call("get_chunk", json!({"chunk_uid": chunk, "context": 2})).await;
                let text = r["content"][0]["text"].as_str().unwrap_or_default();
                if r["isError"] == json!(true) && !text.contains("not found") {
                    errors.push(format!("get_chunk {n}: {r}"));
                }
            }
            errors
        };
        let (deleted, errors, tool_errors) = tokio::join!(deletes, reads, tools);
        assert!(errors.is_empty(), "round {round}: {errors:?}");
        assert!(tool_errors.is_empty(), "round {round}: {tool_errors:?}");
        assert!(deleted.iter().all(|d| d.is_ok()), "round {round}: {deleted:?}");
        for uid in &uids {
            assert!(admin.find_item(uid).await.unwrap().is_none());
        }
    }
}
