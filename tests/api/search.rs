//! Keyword search (DESIGN §5): `migrate`'s re-index of chunks an older
//! analysis indexed.

use serde_json::{json, Value};

use mnemosyne::store::graph::scoped::{library_key, ANALYSIS_VERSION};

use crate::helpers::{McpClient, TestApp};

/// `search` results (limit 10 unless `extra` says otherwise).
async fn search(c: &mut McpClient, query: &str, extra: Value) -> Vec<Value> {
    let mut args = json!({"query": query, "limit": 10});
    for (k, v) in extra.as_object().unwrap() {
        args[k] = v.clone();
    }
    let out = c.call_ok("search", args).await;
    out["results"].as_array().unwrap().clone()
}

/// The item uids of the results, best first.
fn items_of(hits: &[Value]) -> Vec<String> {
    hits.iter()
        .map(|h| h["item_uid"].as_str().unwrap().to_owned())
        .collect()
}

// ---- migrate's re-index ----

/// A chunk's `scoped` as it was written before analysis version 2: words
/// lower-cased, non-ASCII words hex-encoded, no folding, no stemming, no
/// title terms.
fn old_scoped(library_uid: &str, text: &str) -> String {
    let key = library_key(library_uid);
    text.split(|c: char| !c.is_alphanumeric())
        .filter(|w| !w.is_empty())
        .map(|w| {
            let lower = w.to_lowercase();
            let word = if lower.bytes().all(|b| b.is_ascii_alphanumeric()) {
                lower
            } else {
                format!("x{}", hex::encode(lower.as_bytes()))
            };
            format!("{key}_{word}")
        })
        .collect::<Vec<_>>()
        .join(" ")
}

async fn graph_rows(app: &TestApp, q: neo4rs::Query) -> Vec<neo4rs::Row> {
    app.state.graph.rows("test inspection", q).await.expect("graph query")
}

/// (analysis, dl) of a chunk.
async fn chunk_index(app: &TestApp, uid: &str) -> (Option<i64>, Option<i64>) {
    let rows = graph_rows(
        app,
        neo4rs::query("MATCH (c:Chunk {uid: $uid}) RETURN c.analysis AS analysis, c.dl AS dl").param("uid", uid),
    )
    .await;
    (rows[0].get("analysis").unwrap(), rows[0].get("dl").unwrap())
}

async fn reindex(app: &TestApp) -> (i64, String) {
    let mut out = Vec::new();
    let n = mnemosyne::cli::reindex::run(&app.state.graph.admin(), &mut out)
        .await
        .expect("re-index");
    (n, String::from_utf8(out).unwrap())
}

#[tokio::test]
async fn migrate_reindexes_chunks_an_older_analysis_indexed_and_then_writes_nothing() {
    let app = TestApp::spawn().await;
    let (title, content) = ("Alpine Railways", "Trains climb to Zürich through the long tunnels.");
    // The same document ingested today, for comparison.
    let fresh = app.library("fresh").await;
    app.ingest(json!({"library_uid": fresh, "item": {"title": title}, "content": content}))
        .await;
    let rows = graph_rows(
        &app,
        neo4rs::query("MATCH (c:Chunk {library_uid: $lib}) RETURN c.text AS text, c.dl AS dl")
            .param("lib", fresh.as_str()),
    )
    .await;
    let (text, fresh_dl): (String, i64) = (rows[0].get("text").unwrap(), rows[0].get("dl").unwrap());
    // A chunk written the old way: old `scoped`, no `dl`, no `analysis`.
    let old = app.library("old").await;
    let uid = app.uid("chk_old");
    graph_rows(
        &app,
        neo4rs::query(
            "CREATE (c:Chunk {uid: $uid, library_uid: $lib, collection_uid: $col, item_uid: $item, \
             item_title: $title, ordinal: 0, text: $text, scoped: $scoped})",
        )
        .param("uid", uid.as_str())
        .param("lib", old.as_str())
        .param("col", app.uid("col_old"))
        .param("item", app.uid("item_old"))
        .param("title", title)
        .param("text", text.as_str())
        .param("scoped", old_scoped(&old, &text)),
    )
    .await;
    let token = app.opaque_token(&[old.clone()]).await;
    let mut c = app.mcp(&token).connect().await;
    let before = [
        search(&mut c, "zurich", json!({})).await,
        search(&mut c, "alpine", json!({})).await,
        search(&mut c, "tunnel", json!({})).await,
    ];
    // A word both analyses write alike finds it either way.
    assert_eq!(
        items_of(&search(&mut c, "climb", json!({})).await),
        [app.uid("item_old")]
    );
    // Another test's `migrate` may re-index it at any time; until one does,
    // the folded word, the title and the stem find nothing.
    if chunk_index(&app, &uid).await.0.is_none() {
        for hits in &before {
            assert!(hits.is_empty(), "found before the re-index: {hits:?}");
        }
    }

    let (_, printed) = reindex(&app).await;
    assert!(
        printed.ends_with("chunks re-indexed)\n") || printed == "search index up to date\n",
        "{printed}"
    );
    assert_eq!(chunk_index(&app, &uid).await, (Some(ANALYSIS_VERSION), Some(fresh_dl)));
    for q in ["zurich", "alpine", "tunnel"] {
        let hits = search(&mut c, q, json!({})).await;
        assert_eq!(hits.len(), 1, "{q}: {hits:?}");
        assert_eq!(hits[0]["chunk_uid"], uid.as_str(), "{q}");
    }
    // Ranked exactly as the same chunk ingested today: its length now counts
    // in its library's statistics (read anew here by a replica that has not
    // cached them; a running one reads them again when its cache expires).
    let replica = app.second_instance().await;
    let mut r = replica.mcp(&token).connect().await;
    let mut f = app.mcp(&app.opaque_token(&[fresh.clone()]).await).connect().await;
    let q = "zurich alpine tunnels trains";
    let (was_old, was_fresh) = (search(&mut r, q, json!({})).await, search(&mut f, q, json!({})).await);
    assert_eq!(was_old[0]["score"].as_f64(), was_fresh[0]["score"].as_f64());
    assert_eq!(was_old[0]["relevance"].as_f64(), was_fresh[0]["relevance"].as_f64());

    // Nothing is stale any more: one line, no write.
    assert_eq!(reindex(&app).await, (0, "search index up to date\n".to_owned()));
}
