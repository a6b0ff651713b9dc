//! Store health: one probe of both stores, read by `/readyz`, `/metrics`, the
//! MCP `get_health` tool (Pallas spec §2) and the admin console's overview.

use std::time::{Duration, Instant};

use chrono::{SecondsFormat, Utc};
use serde_json::{json, Value};
use sqlx::PgPool;

use crate::store::graph::knowledge::KnowledgeGraph;
use crate::store::graph::GraphStore;

/// Each store's state: `Ok(())` or a short reason ("unreachable", "timed
/// out"); the cause is logged, never returned. Probed concurrently.
pub async fn probe_stores(
    pg: &PgPool,
    graph: &GraphStore,
    timeout: Duration,
) -> (Result<(), String>, Result<(), String>) {
    probe(pg, &graph.knowledge(), timeout).await
}

/// Pallas spec §2: `ok`, `degraded` (slow stores) or `error` (a store down),
/// with a message when not ok, and a timestamp.
pub async fn report(pg: &PgPool, graph: &GraphStore) -> Value {
    report_of(pg, &graph.knowledge()).await
}

/// The stores as far as health needs them, a ping each: what the MCP
/// `get_health` tool holds (it reaches nothing else of the stores).
#[derive(Clone)]
pub struct Probes {
    pg: PgPool,
    graph: KnowledgeGraph,
}

impl Probes {
    pub fn new(pg: &PgPool, graph: &GraphStore) -> Self {
        Probes {
            pg: pg.clone(),
            graph: graph.knowledge(),
        }
    }

    /// Pallas spec §2: `ok`, `degraded` (slow stores) or `error` (a store
    /// down), with a message when not ok, and a timestamp.
    pub async fn report(&self) -> Value {
        report_of(&self.pg, &self.graph).await
    }
}

async fn probe(pg: &PgPool, graph: &KnowledgeGraph, timeout: Duration) -> (Result<(), String>, Result<(), String>) {
    let pg = async {
        match tokio::time::timeout(timeout, crate::store::pg::ping(pg)).await {
            Ok(Ok(())) => Ok(()),
            Ok(Err(e)) => {
                tracing::warn!(error = %short(&e.to_string()), "postgres probe failed");
                Err("unreachable".to_owned())
            }
            Err(_) => Err("timed out".to_owned()),
        }
    };
    let graph = async {
        match tokio::time::timeout(timeout, graph.ping()).await {
            Ok(Ok(())) => Ok(()),
            Ok(Err(e)) => {
                tracing::warn!(error = %short(&e.to_string()), "graph probe failed");
                Err("unreachable".to_owned())
            }
            Err(_) => Err("timed out".to_owned()),
        }
    };
    tokio::join!(pg, graph)
}

fn short(s: &str) -> String {
    s.chars().take(200).collect()
}

/// How long each store may take before the report says so.
const REPORT_PROBE_TIMEOUT: Duration = Duration::from_millis(700);
/// Slower than this (both probes together) is `degraded`.
const DEGRADED_AFTER: Duration = Duration::from_millis(300);

async fn report_of(pg: &PgPool, knowledge: &KnowledgeGraph) -> Value {
    let started = Instant::now();
    let (pg, graph) = probe(pg, knowledge, REPORT_PROBE_TIMEOUT).await;
    let elapsed = started.elapsed();
    let timestamp = Utc::now().to_rfc3339_opts(SecondsFormat::Secs, true);
    let mut down = Vec::new();
    if let Err(e) = &pg {
        down.push(format!("PostgreSQL unreachable ({e})"));
    }
    if let Err(e) = &graph {
        down.push(format!("graph store unreachable ({e})"));
    }
    let mut report = if !down.is_empty() {
        json!({"status": "error", "timestamp": timestamp, "message": down.join("; ")})
    } else if elapsed > DEGRADED_AFTER {
        json!({"status": "degraded", "timestamp": timestamp,
               "message": format!("stores slow to answer ({} ms)", elapsed.as_millis())})
    } else {
        json!({"status": "ok", "timestamp": timestamp})
    };
    // Information, never a reason for `degraded`: the search modes, and the
    // chunks still waiting for a vector (keyword-searchable already).
    report["search"] = search_info(knowledge);
    report
}

/// `{"modes": [...], "embedding_model"?, "embedding_backlog"?}`.
pub fn search_info(graph: &KnowledgeGraph) -> Value {
    match graph.semantic() {
        Some(s) => json!({
            "modes": ["hybrid", "keyword", "semantic"],
            "embedding_model": s.embedder().id(),
            "embedding_backlog": s.status().backlog.get(),
        }),
        None => json!({"modes": ["keyword"]}),
    }
}
