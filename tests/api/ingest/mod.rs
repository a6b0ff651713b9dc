//! Ingest and workspace lifecycle (DESIGN §6), memberships and opaque tokens.

use reqwest::{Method, StatusCode};
use serde_json::{json, Value};

use mnemosyne::store::graph::ingest::AdminGraph;

use crate::helpers::{base_settings, send, TestApp};

mod concurrency;
mod items;
mod timeouts;
mod tokens;
mod workspaces;

/// Store timeout of the concurrency tests: they assert that conflicts are
/// retried and nothing is lost, not how fast 64 writers finish on 2 shared
/// cores (a fresh Neo4j in CI once needed more than the usual 10 s).
const UNDER_LOAD_TIMEOUT_MS: u64 = 30_000;

// ---- concurrency, no-ops, delete races and outages (issue 10) ----

/// Runs a Cypher read against the real graph (test inspection only).
async fn graph_rows(app: &TestApp, cypher: &str, params: &[(&str, &str)]) -> Vec<neo4rs::Row> {
    rows_of(&app.state.admin, cypher, params).await
}

async fn rows_of(g: &AdminGraph, cypher: &str, params: &[(&str, &str)]) -> Vec<neo4rs::Row> {
    let mut q = neo4rs::query(cypher);
    for (k, v) in params {
        q = q.param(k, *v);
    }
    g.rows_for_tests(q).await.expect("graph inspection query")
}

async fn graph_count(app: &TestApp, cypher: &str, params: &[(&str, &str)]) -> i64 {
    graph_rows(app, cypher, params).await[0].get::<i64>("n").unwrap()
}

/// Chunk texts of an item, in ordinal order.
async fn chunk_texts(app: &TestApp, item: &str) -> Vec<String> {
    chunk_texts_in(&app.state.admin, item).await
}

async fn chunk_texts_in(g: &AdminGraph, item: &str) -> Vec<String> {
    rows_of(
        g,
        "MATCH (c:Chunk {item_uid: $item}) RETURN c.text AS text, c.ordinal AS ordinal ORDER BY ordinal",
        &[("item", item)],
    )
    .await
    .iter()
    .map(|r| r.get::<String>("text").unwrap())
    .collect()
}

/// A document of `paragraphs` paragraphs of roughly 800 characters, every word
/// unique to (`tag`, `seed`) so chunks of different requests never coincide.
fn document(tag: &str, seed: usize, paragraphs: usize) -> String {
    (0..paragraphs)
        .map(|p| {
            (0..100)
                .map(|w| format!("{tag}{seed}x{p}w{w}"))
                .collect::<Vec<_>>()
                .join(" ")
        })
        .collect::<Vec<_>>()
        .join("\n\n")
}

/// One authenticated request first, so the Basic credentials are verified
/// (argon2) once and not 64 times at the same moment.
async fn warm_service_account(app: &TestApp) {
    let (status, _) = send(app.service(Method::GET, "/library/api/workspaces/warm-up-nothing/")).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
}

async fn post_ingest(app: &TestApp, body: Value) -> (StatusCode, Value) {
    send(app.service(Method::POST, "/library/api/ingest/").json(&body)).await
}
