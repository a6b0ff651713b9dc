//! Store health: one probe of both stores, read by `/readyz`, `/metrics`, the
//! MCP `get_health` tool (Pallas spec §2) and the admin console's overview.

use std::time::{Duration, Instant};

use std::sync::Arc;

use chrono::{SecondsFormat, Utc};
use serde_json::{json, Value};
use sqlx::PgPool;

use crate::store::graph::knowledge::{KnowledgeGraph, ScopedGraph};

/// The one probe timeout: how long each store may take before health says
/// so (`get_health` must answer within about a second, spec §2).
pub const PROBE_TIMEOUT: Duration = Duration::from_millis(700);
/// Slower than this (both probes together) is `degraded`.
const DEGRADED_AFTER: Duration = Duration::from_millis(300);

/// The one health verdict (Pallas spec §2), read by `/readyz`, `get_health`,
/// the console's overview and `/metrics`. Either store down is `error`: this
/// server cannot answer a request without both (Postgres resolves every
/// bearer, the graph holds every answer), which is the spec's "cannot
/// process requests"; stores that answer slowly are `degraded`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verdict {
    Ok,
    Degraded,
    Error,
}

impl Verdict {
    /// From each store's state and how long the probe took.
    pub fn of(postgres: &Result<(), String>, graph: &Result<(), String>, elapsed: Duration) -> Self {
        if postgres.is_err() || graph.is_err() {
            Verdict::Error
        } else if elapsed > DEGRADED_AFTER {
            Verdict::Degraded
        } else {
            Verdict::Ok
        }
    }

    /// The spec's word: `ok`, `degraded`, `error`.
    pub fn as_str(self) -> &'static str {
        match self {
            Verdict::Ok => "ok",
            Verdict::Degraded => "degraded",
            Verdict::Error => "error",
        }
    }
}

/// One probe of both stores: each store's state, `Ok(())` or a short reason
/// ("unreachable", "timed out"; the cause is logged, never returned), and
/// how long the two probes (run concurrently) took.
#[derive(Clone, Debug)]
pub struct Health {
    pub postgres: Result<(), String>,
    pub graph: Result<(), String>,
    pub elapsed: Duration,
}

impl Health {
    pub fn verdict(&self) -> Verdict {
        Verdict::of(&self.postgres, &self.graph, self.elapsed)
    }

    /// The spec's `message`: what is down, or how slow; None when `ok`.
    pub fn message(&self) -> Option<String> {
        let mut down = Vec::new();
        if let Err(e) = &self.postgres {
            down.push(format!("PostgreSQL unreachable ({e})"));
        }
        if let Err(e) = &self.graph {
            down.push(format!("graph store unreachable ({e})"));
        }
        match self.verdict() {
            Verdict::Error => Some(down.join("; ")),
            Verdict::Degraded => Some(format!("stores slow to answer ({} ms)", self.elapsed.as_millis())),
            Verdict::Ok => None,
        }
    }
}

/// Probes both stores (`PROBE_TIMEOUT` each, concurrently).
pub async fn check(pg: &PgPool, graph: &KnowledgeGraph) -> Health {
    probe(pg, graph).await
}

/// The stores as far as health needs them, a ping each: what the MCP
/// `get_health` tool holds (it reaches nothing else of the stores).
#[derive(Clone)]
pub struct Probes {
    pg: PgPool,
    graph: KnowledgeGraph,
    /// The embedding model, if semantic search is on.
    embedder: Option<Arc<crate::embed::Embedder>>,
    /// The reranker, if there is one.
    reranker: Option<Arc<crate::embed::rerank::Reranker>>,
}

impl Probes {
    pub fn new(
        pg: &PgPool,
        graph: &KnowledgeGraph,
        embedder: Option<&Arc<crate::embed::Embedder>>,
        reranker: Option<&Arc<crate::embed::rerank::Reranker>>,
    ) -> Self {
        Probes {
            pg: pg.clone(),
            graph: graph.clone(),
            embedder: embedder.cloned(),
            reranker: reranker.cloned(),
        }
    }

    /// Pallas spec §2: `ok`, `degraded` (slow stores) or `error` (a store
    /// down), with a message when not ok, and a timestamp. `caller` is the
    /// caller's view: the backlog shown is its libraries' only.
    pub async fn report(&self, caller: &ScopedGraph) -> Value {
        let (health, search) = tokio::join!(
            probe(&self.pg, &self.graph),
            search_info(self.embedder.as_deref().map(|e| e.id()), caller)
        );
        let timestamp = Utc::now().to_rfc3339_opts(SecondsFormat::Secs, true);
        let mut report = json!({"status": health.verdict().as_str(), "timestamp": timestamp});
        let mut message: Vec<String> = health.message().into_iter().collect();
        // A remote embedding provider or reranker that does not answer: the
        // server still serves (keyword search, ingest; search in its own
        // order), so `degraded`, naming it.
        let troubles = [
            self.embedder.as_ref().and_then(|e| e.trouble()),
            self.reranker.as_ref().and_then(|r| r.trouble()),
        ];
        for trouble in troubles.into_iter().flatten() {
            if health.verdict() == Verdict::Ok {
                report["status"] = Verdict::Degraded.as_str().into();
            }
            message.push(trouble);
        }
        if !message.is_empty() {
            report["message"] = message.join("; ").into();
        }
        // Information, never a reason for `degraded`: the search modes, and
        // the chunks still waiting for a vector (keyword-searchable already).
        report["search"] = search;
        report
    }
}

async fn probe(pg: &PgPool, graph: &KnowledgeGraph) -> Health {
    let timeout = PROBE_TIMEOUT;
    let started = Instant::now();
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
    let (postgres, graph) = tokio::join!(pg, graph);
    Health {
        postgres,
        graph,
        elapsed: started.elapsed(),
    }
}

fn short(s: &str) -> String {
    s.chars().take(200).collect()
}

/// `{"modes": [...], "embedding_model"?, "embedding_backlog"?}`: the backlog
/// is the chunks of the caller's libraries waiting for a vector (never the
/// deployment's: other tenants' ingest volume is theirs), left out when it
/// cannot be counted within the probe timeout.
pub async fn search_info(model: Option<&str>, caller: &ScopedGraph) -> Value {
    let Some(model) = model else {
        return json!({"modes": ["keyword"]});
    };
    let mut info = json!({
        "modes": ["hybrid", "keyword", "semantic"],
        "embedding_model": model,
    });
    match tokio::time::timeout(PROBE_TIMEOUT, caller.embedding_backlog()).await {
        Ok(Ok(n)) => info["embedding_backlog"] = n.into(),
        Ok(Err(e)) => tracing::warn!(error = %short(&e.to_string()), "embedding backlog unreadable"),
        Err(_) => tracing::warn!("embedding backlog: timed out"),
    }
    info
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_verdict_for_each_state_of_the_two_stores() {
        let ok = || Ok(());
        let down = || Err("unreachable".to_owned());
        let slow = || Err("timed out".to_owned());
        let fast = Duration::from_millis(5);
        let late = DEGRADED_AFTER + Duration::from_millis(1);
        #[rustfmt::skip]
        let table = [
            // postgres, graph, elapsed → verdict
            (ok(),   ok(),   fast, Verdict::Ok),
            (ok(),   ok(),   late, Verdict::Degraded),
            (down(), ok(),   fast, Verdict::Error),
            (ok(),   down(), fast, Verdict::Error),
            (down(), down(), fast, Verdict::Error),
            (slow(), ok(),   late, Verdict::Error),
            (ok(),   slow(), late, Verdict::Error),
        ];
        for (pg, graph, elapsed, want) in table {
            assert_eq!(Verdict::of(&pg, &graph, elapsed), want, "{pg:?} {graph:?} {elapsed:?}");
        }
        let h = Health {
            postgres: ok(),
            graph: down(),
            elapsed: fast,
        };
        assert_eq!(h.message().as_deref(), Some("graph store unreachable (unreachable)"));
        let h = Health {
            postgres: slow(),
            graph: down(),
            elapsed: late,
        };
        assert_eq!(
            h.message().as_deref(),
            Some("PostgreSQL unreachable (timed out); graph store unreachable (unreachable)")
        );
        let h = Health {
            postgres: ok(),
            graph: ok(),
            elapsed: Duration::from_millis(450),
        };
        assert_eq!(h.message().as_deref(), Some("stores slow to answer (450 ms)"));
        assert_eq!(
            Health {
                postgres: ok(),
                graph: ok(),
                elapsed: fast
            }
            .message(),
            None
        );
        assert_eq!(
            [Verdict::Ok, Verdict::Degraded, Verdict::Error].map(Verdict::as_str),
            ["ok", "degraded", "error"]
        );
    }
}
