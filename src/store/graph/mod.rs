//! The Bolt graph (Libraries, Collections, Items, Chunks). Every statement is a
//! file in `cypher/`. `GraphStore` is the connection; outside `store/` it is
//! only built and turned into its handles (`into_handles`), each reaching only
//! what its holder may: knowledge reads on `ScopedGraph` (made from a
//! resolved `Principal` through `KnowledgeGraph`), ingest and admin
//! operations on `AdminGraph`, and the resolver's one unscoped read on
//! `WorkspaceLibraries`. Raw statements (`rows`, `run`, `transaction`) never
//! leave `store/`.

pub mod admin;
pub mod backlog;
mod driver;
pub mod flavor;
pub mod indexing;
pub mod ingest;
pub mod knowledge;
pub mod reindex;
pub mod vectors;

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use neo4rs::{query, ConfigBuilder, Query, Row};

use crate::config::{GraphFlavor, Settings};
use knowledge::{LibraryStats, STATS_TTL};

pub use driver::{classify, ErrorClass, RetryPolicy, Step, Txn, TxnStats};
use driver::{Driver, Pages, FETCH_SIZE};
pub use flavor::Flavor;
pub use indexing::IndexSource;

#[derive(Debug, thiserror::Error)]
pub enum GraphError {
    /// Connection refused, timed out, or the pool could not hand out a connection.
    #[error("graph unavailable: {0}")]
    Unavailable(String),
    /// A write kept conflicting with concurrent writes after every retry.
    #[error("graph write conflict persisted: {0}")]
    Conflict(String),
    /// The server answered with an error.
    #[error("graph query failed: {0}")]
    Query(String),
    /// A setting this build cannot serve (refused at startup).
    #[error("{0}")]
    Unsupported(String),
    /// The search's query could not be embedded (the provider unavailable
    /// or refusing it): hybrid search answers from keywords instead.
    #[error("the query could not be embedded: {0}")]
    Embedding(String),
}

/// The graph store: a neo4rs pool, the flavor seam, and a per-call timeout.
/// Outside `store/` it is only built and turned into its handles:
///
/// ```
/// use mnemosyne::store::graph::{GraphStore, Handles};
/// fn handles(g: GraphStore) -> Handles {
///     let _ = neo4rs::query("RETURN 1");
///     g.into_handles()
/// }
/// ```
///
/// Its raw statements stay inside `store/`:
///
/// ```compile_fail
/// use mnemosyne::store::graph::GraphStore;
/// async fn raw(g: &GraphStore) {
///     let _ = g.rows("raw", neo4rs::query("RETURN 1")).await;
/// }
/// ```
///
/// ```compile_fail
/// use mnemosyne::store::graph::GraphStore;
/// fn admin(g: &GraphStore) {
///     let _ = g.admin();
/// }
/// ```
#[derive(Clone)]
pub struct GraphStore {
    /// The driver (its pools and, for `neo4j://`, its routing table); a new
    /// one replaces it when a server says it is not the leader (`reroute`).
    driver: Arc<Driver>,
    pub flavor: Flavor,
    timeout: Duration,
    /// Bolt exchanges running on tasks of their own (see `detached`).
    in_flight: Arc<tokio::sync::Semaphore>,
    /// One per pool connection: a statement takes one before it starts.
    connections: Arc<tokio::sync::Semaphore>,
    metrics: Option<GraphMetrics>,
    retry: RetryPolicy,
    stats: Arc<TxnStats>,
    /// Libraries and collections known to exist (ingest's find-or-create
    /// skips its reads). Only a hint: every item write re-checks them inside
    /// its transaction, and forgets them when they are gone.
    pub(crate) known: moka::future::Cache<Known, String>,
    /// Library uid → its ranking statistics (chunk count, total length),
    /// read again after `STATS_TTL`.
    pub(crate) ranking: moka::future::Cache<String, LibraryStats>,
    /// Library uid → its name, for search hits (a rename shows within
    /// `STATS_TTL`).
    pub(crate) names: moka::future::Cache<String, String>,
    /// Library uid → its chunk vectors (semantic search; `vectors`).
    pub(crate) vectors: Arc<vectors::VectorCache>,
    /// Called as each item write begins (the embedding worker yields to
    /// ingest: `state` installs it).
    pub(crate) on_item_write: Option<Arc<dyn Fn() + Send + Sync>>,
    /// Where writes record their change for every replica's index
    /// (`pg::index_changes`).
    pub(crate) change_log: sqlx::PgPool,
    /// Waited for after a write recorded its change and before it is
    /// acknowledged: every replica searching from the index sequences it
    /// heard has heard this one (`state` installs the auth channel's fence).
    pub(crate) change_fence: Option<ChangeFence>,
}

/// See `GraphStore::change_fence`.
pub type ChangeFence = Arc<dyn Fn() -> futures::future::BoxFuture<'static, ()> + Send + Sync>;

/// What `GraphStore::known` holds, by key: the value is the library uid
/// (a workspace's library, a fenced library, a collection's library) or the
/// library's language code.
#[derive(Clone, Debug, Hash, PartialEq, Eq)]
pub(crate) enum Known {
    /// A workspace id → its library's uid.
    Workspace(String),
    /// A library uid known to exist with its fences → itself.
    Library(String),
    /// A library uid → its language code.
    Language(String),
    /// A collection uid → its library's uid.
    Collection(String),
}

impl Known {
    /// The library a key is about (for a workspace or a collection, its
    /// value names it).
    pub(crate) fn library(&self) -> Option<&str> {
        match self {
            Known::Library(uid) | Known::Language(uid) => Some(uid),
            Known::Workspace(_) | Known::Collection(_) => None,
        }
    }
}

/// Connections in the neo4rs pool (and statements running at once).
const CONNECTIONS: usize = 32;

/// The graph's metric handles (from `Metrics`).
#[derive(Clone)]
struct GraphMetrics {
    duration: prometheus::HistogramVec,
    errors: prometheus::IntCounterVec,
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
            .max_connections(CONNECTIONS)
            .fetch_size(FETCH_SIZE)
            .build()?;
        Ok(GraphStore {
            driver: Arc::new(Driver::new(config, &settings.bolt_uri)?),
            flavor: Flavor::new(settings.graph_flavor, settings),
            timeout: settings.store_timeout(),
            in_flight: Arc::new(tokio::sync::Semaphore::new(MAX_IN_FLIGHT)),
            connections: Arc::new(tokio::sync::Semaphore::new(CONNECTIONS)),
            metrics: None,
            retry: RetryPolicy::default(),
            stats: Arc::default(),
            known: moka::future::Cache::builder()
                .max_capacity(100_000)
                .time_to_live(Duration::from_secs(300))
                .support_invalidation_closures()
                .build(),
            ranking: moka::future::Cache::builder()
                .max_capacity(100_000)
                .time_to_live(STATS_TTL)
                .build(),
            names: moka::future::Cache::builder()
                .max_capacity(100_000)
                .time_to_live(STATS_TTL)
                .build(),
            vectors: Arc::new(vectors::VectorCache::new(settings.vector_cache_chunks)),
            on_item_write: None,
            change_log: crate::store::pg::pool(&settings.database_url, settings.store_timeout())
                .map_err(|e| GraphError::Unavailable(format!("postgres: {e}")))?,
            change_fence: None,
        })
    }

    /// Records writes' changes through this pool (the server's own) rather
    /// than one of its own.
    pub fn with_change_log(mut self, pg: sqlx::PgPool) -> Self {
        self.change_log = pg;
        self
    }

    /// Waits, after a change was recorded, for every replica that searches
    /// from the sequences it heard to have heard it.
    pub fn with_change_fence(mut self, fence: ChangeFence) -> Self {
        self.change_fence = Some(fence);
        self
    }

    async fn fenced(&self) {
        if let Some(fence) = &self.change_fence {
            fence().await;
        }
    }

    /// Records, after its graph transaction committed, that a write changed
    /// `item` of `library` (None: the whole library), so that every
    /// replica's index catches up before its next search of it. A failure is
    /// the write's failure (503: its retry records it).
    pub(super) async fn record_change(&self, library: &str, item: Option<&str>) -> Result<(), GraphError> {
        crate::store::pg::index_changes::record(&self.change_log, library, item)
            .await
            .map_err(|e| {
                GraphError::Unavailable(format!("postgres: recording the change for the search index: {e}"))
            })?;
        self.fenced().await;
        Ok(())
    }

    /// Records, before a write touches the graph, the change it is about
    /// to make (`pg::index_changes::intend`): if recording the change after
    /// the commit fails, the intent is what makes the retry, or the sweep,
    /// record it. A failure here is the write's failure, before anything
    /// was written.
    pub(super) async fn intend(
        &self,
        library: &str,
        item: Option<&str>,
        workspace: Option<&str>,
    ) -> Result<i64, GraphError> {
        crate::store::pg::index_changes::intend(&self.change_log, library, item, workspace)
            .await
            .map_err(|e| GraphError::Unavailable(format!("postgres: recording a write's intent: {e}")))
    }

    /// `record_change` for a write that began with `intend`: the change and
    /// the intent's removal in one statement. A failure leaves the intent.
    pub(super) async fn record_intended(
        &self,
        intent: i64,
        library: &str,
        item: Option<&str>,
    ) -> Result<(), GraphError> {
        crate::store::pg::index_changes::record_intended(&self.change_log, intent, library, item)
            .await
            .map_err(|e| {
                GraphError::Unavailable(format!("postgres: recording the change for the search index: {e}"))
            })?;
        self.fenced().await;
        Ok(())
    }

    /// Removes the intent of a write that changed nothing (best effort: a
    /// left-over intent only makes the sweep record a harmless change).
    pub(super) async fn forget_intent(&self, intent: i64) {
        if let Err(e) = crate::store::pg::index_changes::forget_intent(&self.change_log, intent).await {
            tracing::debug!(error = %e, "an unused write intent stays for the sweep");
        }
    }

    /// Records the changes that writes began but may not have recorded
    /// (`pg::index_changes::record_pending`): a delete's retry that finds
    /// nothing left calls it, so that what the first attempt removed from
    /// the graph is removed from every index before the retry answers.
    pub(super) async fn record_pending(
        &self,
        which: crate::store::pg::index_changes::Pending<'_>,
    ) -> Result<(), GraphError> {
        crate::store::pg::index_changes::record_pending(&self.change_log, which)
            .await
            .map_err(|e| GraphError::Unavailable(format!("postgres: recording an earlier write's change: {e}")))?;
        // Also when it recorded nothing: the first attempt may have recorded
        // and still be waiting for its fence when its retry answers.
        self.fenced().await;
        Ok(())
    }

    /// Calls `f` as each item write begins.
    pub fn on_item_write(mut self, f: Arc<dyn Fn() + Send + Sync>) -> Self {
        self.on_item_write = Some(f);
        self
    }

    /// Chunks and bytes the vector cache holds.
    pub fn vector_cache_size(&self) -> (usize, usize) {
        self.vectors.size()
    }

    pub fn with_timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// Reports to these metrics (the app's registry owns them).
    pub fn with_metrics(mut self, metrics: &crate::metrics::Metrics) -> Self {
        self.metrics = Some(GraphMetrics {
            duration: metrics.graph_query_duration.clone(),
            errors: metrics.graph_errors.clone(),
        });
        self
    }

    pub async fn ping(&self) -> Result<(), GraphError> {
        self.rows("ping.cypher", query(include_str!("../../../cypher/ping.cypher")))
            .await
            .map(|_| ())
    }

    /// Creates constraints, scoping indexes and the full-text index; idempotent.
    pub async fn bootstrap_schema(&self) -> Result<(), GraphError> {
        for stmt in statements(include_str!("../../../cypher/schema_constraints.cypher")) {
            self.run("schema_constraints.cypher", query(stmt)).await?;
        }
        self.flavor.create_fulltext_index(self).await
    }

    pub(super) async fn run(&self, name: &'static str, q: Query) -> Result<(), GraphError> {
        self.observed(
            name,
            self.detached(|graph| async move { Ok(graph.run(q).await.map(|_| ())?) }),
        )
        .await
    }

    /// Library uids of each workspace, in uid order: the team path's one graph
    /// round trip (spec §5.3). Unscoped: outside `store/` only the resolver's
    /// `WorkspaceLibraries` and `AdminGraph::workspace_library_uids` reach it.
    pub(super) async fn libraries_for_workspaces(
        &self,
        workspace_ids: &[String],
    ) -> Result<HashMap<String, Vec<String>>, GraphError> {
        let mut out: HashMap<String, Vec<String>> = workspace_ids.iter().map(|w| (w.clone(), Vec::new())).collect();
        if workspace_ids.is_empty() {
            return Ok(out);
        }
        // From the writer on a routed cluster: a library just moved out of
        // a workspace (by any replica) is never still granted by a lagging
        // reader.
        let rows = self
            .rows_from_leader(
                "libraries_for_workspaces.cypher",
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

    /// Which of `uids` the graph holds (and is not deleting), from the writer
    /// on a routed cluster like `libraries_for_workspaces`.
    pub(super) async fn existing_libraries(
        &self,
        uids: &[String],
    ) -> Result<std::collections::HashSet<String>, GraphError> {
        if uids.is_empty() {
            return Ok(Default::default());
        }
        let rows = self
            .rows_from_leader(
                "libraries_existing.cypher",
                query(include_str!("../../../cypher/libraries_existing.cypher")).param("uids", uids.to_vec()),
            )
            .await?;
        rows.into_iter()
            .map(|row| row.get::<String>("uid").map_err(GraphError::from))
            .collect()
    }
}

/// What a replica's code holds of the graph, each handle reaching only what
/// its holder may (`GraphStore::into_handles`). All three share one
/// connection pool and one set of caches, so an admin write that forgets a
/// cached fact forgets it for the knowledge reads too.
#[derive(Clone)]
pub struct Handles {
    /// Scoped views only: what the MCP tools hold.
    pub knowledge: knowledge::KnowledgeGraph,
    /// Ingest, workspace lifecycle and operator reads, unscoped: the
    /// Basic-authenticated APIs, the console, the CLI, the embedding worker.
    pub admin: ingest::AdminGraph,
    /// The resolver's one unscoped read (workspaces → libraries).
    pub workspaces: WorkspaceLibraries,
    /// What the search indexes are built and caught up from.
    pub index_source: indexing::IndexSource,
}

impl GraphStore {
    /// Turns the connection into its handles: the one way code outside
    /// `store/` gets an admin or knowledge handle.
    pub fn into_handles(self) -> Handles {
        Handles {
            knowledge: self.knowledge(),
            admin: self.admin(),
            index_source: indexing::IndexSource(self.clone()),
            workspaces: WorkspaceLibraries(self),
        }
    }
}

/// The resolver's narrow handle: workspace ids → their library uids, which
/// of a team's directly granted libraries exist, and nothing else (spec §5.3's one graph round trip of the team path).
#[derive(Clone)]
pub struct WorkspaceLibraries(GraphStore);

impl WorkspaceLibraries {
    /// Library uids of each workspace, in uid order (every asked workspace
    /// has an entry, empty when it has no library).
    pub async fn libraries_for_workspaces(
        &self,
        workspace_ids: &[String],
    ) -> Result<HashMap<String, Vec<String>>, GraphError> {
        self.0.libraries_for_workspaces(workspace_ids).await
    }

    /// Which of the library uids granted to a team directly the graph holds:
    /// the rest (unknown or deleted) resolve to nothing.
    pub async fn existing_libraries(&self, uids: &[String]) -> Result<std::collections::HashSet<String>, GraphError> {
        self.0.existing_libraries(uids).await
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

/// True when one of `fields` is null: on Neo4j a node deleted by a concurrent
/// transaction after the match reads its properties as null. Such a row is
/// left out, as if the delete had come first.
pub(super) fn vanished(row: &Row, fields: &[&str]) -> Result<bool, GraphError> {
    for f in fields {
        if row.get::<Option<neo4rs::BoltType>>(f)?.is_none() {
            return Ok(true);
        }
    }
    Ok(false)
}

#[cfg(test)]
mod vanished_tests {
    use neo4rs::{BoltList, BoltNull, BoltType, Row};

    fn row(values: Vec<(&str, BoltType)>) -> Row {
        let (names, data): (Vec<_>, Vec<_>) = values.into_iter().map(|(n, v)| (BoltType::from(n), v)).unzip();
        Row::new(BoltList::from(names), BoltList::from(data))
    }

    #[test]
    fn a_row_with_a_null_field_vanished_and_one_without_did_not() {
        let gone = row(vec![("uid", "c1".into()), ("text", BoltType::Null(BoltNull))]);
        assert!(super::vanished(&gone, &["uid", "text"]).unwrap());
        let here = row(vec![("uid", "c1".into()), ("ordinal", 0i64.into())]);
        assert!(!super::vanished(&here, &["uid", "ordinal"]).unwrap());
    }
}

#[cfg(test)]
mod driver_tests {
    use super::driver::*;
    use super::*;

    #[test]
    fn arcadedb_and_neo4j_conflicts_are_transient() {
        // What ArcadeDB 26.10 answers over Bolt to concurrent writers (provoked here).
        for (code, msg) in [
            (
                "Neo.TransientError.Transaction.DeadlockDetected",
                "Slot rebase not possible on page PageId(mnemosyne/4/11) slot 0 (concurrent change to the same record). Please retry the operation",
            ),
            (
                "Neo.TransientError.Transaction.DeadlockDetected",
                "Edge list IN head of vertex #1:12288 changed by a concurrent transaction",
            ),
            ("Neo.TransientError.Transaction.DeadlockDetected", "Edge-append rebase not possible"),
            ("Neo.TransientError.Transaction.LockAcquisitionTimeout", ""),
            ("Neo.TransientError.General.DatabaseUnavailable", ""),
            ("Neo.ClientError.Cluster.NotALeader", ""),
            ("Neo.DatabaseError.General.UnknownError", "com.arcadedb.exception.ConcurrentModificationException: x"),
            ("Neo.DatabaseError.General.UnknownError", "NeedRetryException"),
        ] {
            assert_eq!(classify_code(code, msg), ErrorClass::Transient, "{code} {msg}");
        }
        for code in [
            "Neo.TransientError.Transaction.Terminated",
            "Neo.TransientError.Transaction.LockClientStopped",
            "Neo.ClientError.Statement.SyntaxError",
            "Neo.DatabaseError.General.UnknownError",
        ] {
            assert_eq!(classify_code(code, "boom"), ErrorClass::Failed, "{code}");
        }
        assert_eq!(
            classify_code(
                "Neo.ClientError.Schema.ConstraintValidationFailed",
                "Duplicated key [x] found on index 'Library[uid]'"
            ),
            ErrorClass::Duplicate
        );
    }

    #[test]
    fn a_failed_commit_is_classified_by_its_code() {
        // neo4rs reports a FAILURE answering COMMIT as an unexpected message.
        let e = neo4rs::Error::UnexpectedMessage(
            "unexpected response for COMMIT: Failure(Failure { metadata: BoltMap { value: {BoltString { value: \"code\" }: \
             String(BoltString { value: \"Neo.ClientError.Schema.ConstraintValidationFailed\" })} } })"
                .into(),
        );
        assert_eq!(classify(&e).0, ErrorClass::Duplicate);
        let io = neo4rs::Error::IOError {
            detail: std::io::Error::from(std::io::ErrorKind::ConnectionRefused),
        };
        assert_eq!(classify(&io).0, ErrorClass::Unavailable);
        assert!(matches!(GraphError::from(io), GraphError::Unavailable(_)));
    }

    #[test]
    fn backoff_grows_with_jitter_and_is_capped() {
        let p = RetryPolicy::default();
        for attempt in 0..40 {
            let cap = p.initial.saturating_mul(1 << attempt.min(16)).min(p.max_delay);
            let d = p.delay(attempt);
            assert!(d <= cap && d >= cap / 2, "attempt {attempt}: {d:?} vs {cap:?}");
        }
    }
}
