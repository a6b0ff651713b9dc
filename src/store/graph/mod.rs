//! The Bolt graph (Libraries, Collections, Items, Chunks). Every statement is a
//! file in `cypher/`; every knowledge read takes a `&Scope`.

pub mod flavor;
pub mod ingest;
pub mod knowledge;
pub mod scoped;

use std::collections::HashMap;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use neo4rs::{query, ConfigBuilder, Graph, Query, Row};

use crate::config::{GraphFlavor, Settings};

pub use flavor::Flavor;

#[derive(Debug, thiserror::Error)]
pub enum GraphError {
    /// Connection refused, timed out, or the pool could not hand out a connection.
    #[error("graph unavailable: {0}")]
    Unavailable(String),
    /// The server answered with an error.
    #[error("graph query failed: {0}")]
    Query(String),
}

impl From<neo4rs::Error> for GraphError {
    fn from(e: neo4rs::Error) -> Self {
        match e {
            neo4rs::Error::Neo4j(n) => GraphError::Query(format!("{}: {}", n.code(), n.message())),
            neo4rs::Error::DeserializationError(d) => GraphError::Query(d.to_string()),
            other => GraphError::Unavailable(other.to_string()),
        }
    }
}

impl From<neo4rs::DeError> for GraphError {
    fn from(e: neo4rs::DeError) -> Self {
        GraphError::Query(e.to_string())
    }
}

/// The graph store: a neo4rs pool, the flavor seam, and a per-call timeout.
#[derive(Clone)]
pub struct GraphStore {
    graph: Graph,
    pub flavor: Flavor,
    timeout: Duration,
    /// Bolt exchanges running on tasks of their own (see `detached`).
    in_flight: Arc<tokio::sync::Semaphore>,
}

/// Most Bolt exchanges a replica keeps running at once, abandoned ones
/// included (a paused graph server holds them until it answers or dies).
const MAX_IN_FLIGHT: usize = 256;

impl GraphStore {
    /// Builds the pool; no connection is made until the first query, so `serve`
    /// starts while the graph is down and `/readyz` says so.
    pub async fn connect(settings: &Settings) -> Result<Self, GraphError> {
        let config = ConfigBuilder::default()
            .uri(settings.bolt_uri.as_str())
            .user(settings.bolt_user.as_str())
            .password(settings.bolt_password.expose())
            .db(settings.bolt_database.as_str())
            .max_connections(32)
            .fetch_size(500)
            .build()?;
        let graph = Graph::connect(config).await?;
        Ok(GraphStore {
            graph,
            flavor: Flavor::new(settings.graph_flavor, settings),
            timeout: settings.store_timeout(),
            in_flight: Arc::new(tokio::sync::Semaphore::new(MAX_IN_FLIGHT)),
        })
    }

    pub fn with_timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// Runs a Bolt exchange on a task of its own and waits for it at most the
    /// store timeout. A caller that gives up (timeout, a cancelled request)
    /// abandons the wait, never the exchange: neo4rs returns a connection to
    /// its pool as it is and "recycles" it with a RESET whose answer it reads
    /// as the next message, so a connection dropped mid-exchange would hand
    /// the next query the previous query's answer — measured: empty searches
    /// and wrong "not found" right after a graph pause or restart
    /// (tests/faults.rs). The task finishes the exchange (or fails on a dead
    /// connection), so every connection goes back whole.
    async fn detached<T, F, Fut>(&self, work: F) -> Result<T, GraphError>
    where
        F: FnOnce(Graph) -> Fut,
        Fut: Future<Output = Result<T, GraphError>> + Send + 'static,
        T: Send + 'static,
    {
        let permit = self
            .in_flight
            .clone()
            .try_acquire_owned()
            .map_err(|_| GraphError::Unavailable("too many graph queries in flight".into()))?;
        let fut = work(self.graph.clone());
        let task = tokio::spawn(async move {
            let out = fut.await;
            drop(permit);
            out
        });
        match tokio::time::timeout(self.timeout, task).await {
            Ok(Ok(r)) => r,
            Ok(Err(e)) => Err(GraphError::Unavailable(format!("query task failed: {e}"))),
            Err(_) => Err(GraphError::Unavailable("timed out".into())),
        }
    }

    /// Runs a read and collects its rows.
    pub async fn rows(&self, q: Query) -> Result<Vec<Row>, GraphError> {
        self.detached(|graph| async move {
            let mut stream = graph.execute(q).await?;
            let mut rows = Vec::new();
            while let Some(row) = stream.next().await? {
                rows.push(row);
            }
            Ok(rows)
        })
        .await
    }

    /// Runs statements in one explicit transaction: all or nothing.
    pub async fn write_txn(&self, queries: Vec<Query>) -> Result<(), GraphError> {
        self.write_txn_guarded(None, queries).await.map(|_| ())
    }

    /// Like `write_txn`, but first runs `guard` (returning a count `n`) inside
    /// the transaction and writes nothing when `n > 0`. Ok(false) = refused.
    pub async fn write_txn_unless(&self, guard: Query, queries: Vec<Query>) -> Result<bool, GraphError> {
        self.write_txn_guarded(Some(guard), queries).await
    }

    async fn write_txn_guarded(&self, guard: Option<Query>, queries: Vec<Query>) -> Result<bool, GraphError> {
        self.detached(|graph| async move {
            let mut txn = graph.start_txn().await?;
            if let Some(guard) = guard {
                let mut stream = txn.execute(guard).await?;
                let mut n: i64 = 0;
                while let Some(row) = stream.next(txn.handle()).await? {
                    n += row.get::<i64>("n")?;
                }
                if n > 0 {
                    let _ = txn.rollback().await;
                    return Ok(false);
                }
            }
            for q in queries {
                if let Err(e) = txn.run(q).await {
                    let _ = txn.rollback().await;
                    return Err(e.into());
                }
            }
            txn.commit().await?;
            Ok(true)
        })
        .await
    }

    pub async fn ping(&self) -> Result<(), GraphError> {
        self.rows(query(include_str!("../../../cypher/ping.cypher")))
            .await
            .map(|_| ())
    }

    /// Creates constraints, scoping indexes and the full-text index; idempotent.
    pub async fn bootstrap_schema(&self) -> Result<(), GraphError> {
        for stmt in statements(include_str!("../../../cypher/schema_constraints.cypher")) {
            self.run(query(stmt)).await?;
        }
        self.flavor.create_fulltext_index(self).await
    }

    pub(crate) async fn run(&self, q: Query) -> Result<(), GraphError> {
        self.detached(|graph| async move { Ok(graph.run(q).await?) }).await
    }

    /// Library uids of each workspace, in uid order: the team path's one graph
    /// round trip (spec §5.3).
    pub async fn libraries_for_workspaces(
        &self,
        workspace_ids: &[String],
    ) -> Result<HashMap<String, Vec<String>>, GraphError> {
        let mut out: HashMap<String, Vec<String>> = workspace_ids.iter().map(|w| (w.clone(), Vec::new())).collect();
        if workspace_ids.is_empty() {
            return Ok(out);
        }
        let rows = self
            .rows(
                query(include_str!("../../../cypher/libraries_for_workspaces.cypher"))
                    .param("workspace_ids", workspace_ids.to_vec()),
            )
            .await?;
        for row in rows {
            let ws: String = row.get("workspace_id")?;
            let uid: String = row.get("uid")?;
            out.entry(ws).or_default().push(uid);
        }
        Ok(out)
    }
}

/// Splits a file of `;`-separated statements.
pub(crate) fn statements(file: &str) -> impl Iterator<Item = &str> {
    file.split(';').map(str::trim).filter(|s| !s.is_empty())
}

impl GraphFlavor {
    pub fn is_arcadedb(self) -> bool {
        self == GraphFlavor::Arcadedb
    }
}
