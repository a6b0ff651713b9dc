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
pub mod flavor;
pub mod indexing;
pub mod ingest;
pub mod knowledge;
pub mod reindex;
pub mod vectors;

use std::collections::HashMap;
use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use neo4rs::{query, ConfigBuilder, Graph, Query, Row};
use tracing::Instrument;

use crate::config::{GraphFlavor, Settings};
use crate::search::index::rank;

pub use flavor::Flavor;

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

/// Rows fetched per PULL.
const FETCH_SIZE: usize = 500;

/// The Bolt driver. For `neo4j://` (and `neo4j+s://`) it routes: it asks the
/// cluster for its routing table (ROUTE), sends writes to the writer and
/// reads to the readers, round robin. neo4rs keeps a routing table until its
/// TTL runs out, also after the writer it names says it is no longer the
/// leader, so such a refusal (`NotALeader`, a read-only database) replaces
/// the driver by a new one, whose first statement reads a fresh table
/// (`reroute`); the transaction runs again. `bolt://` is one server.
pub(crate) struct Driver {
    config: neo4rs::Config,
    /// Whether the URI asks for routing (`neo4j://…`): only then does a
    /// refusal renew the driver.
    routed: bool,
    /// The driver and its generation (how many times it was renewed).
    graph: std::sync::RwLock<(u64, Graph)>,
    /// The bookmarks of the last transactions this replica committed (a
    /// few: commits finish out of order). A read carries them, and its
    /// server waits until it has applied them, so this replica reads what it
    /// wrote.
    bookmarks: std::sync::Mutex<std::collections::VecDeque<String>>,
}

/// How many of the latest commits' bookmarks a read carries.
const BOOKMARKS: usize = 4;

impl Driver {
    fn new(config: neo4rs::Config, uri: &str) -> Result<Self, GraphError> {
        let scheme = uri.split_once("://").map(|(s, _)| s.to_ascii_lowercase());
        Ok(Driver {
            graph: std::sync::RwLock::new((0, Graph::connect(config.clone())?)),
            routed: scheme.is_some_and(|s| s.starts_with("neo4j")),
            config,
            bookmarks: std::sync::Mutex::new(std::collections::VecDeque::new()),
        })
    }

    /// The current driver and its generation.
    fn current(&self) -> (u64, Graph) {
        self.graph.read().unwrap_or_else(|e| e.into_inner()).clone()
    }

    fn graph(&self) -> Graph {
        self.current().1
    }

    /// The bookmarks a read carries (none before this replica's first
    /// commit, and never from servers that give none, such as ArcadeDB).
    fn bookmarks(&self) -> Vec<String> {
        self.bookmarks
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .cloned()
            .collect()
    }

    fn committed(&self, bookmark: Option<String>) {
        let Some(b) = bookmark else { return };
        let mut q = self.bookmarks.lock().unwrap_or_else(|e| e.into_inner());
        if !q.contains(&b) {
            if q.len() == BOOKMARKS {
                q.pop_front();
            }
            q.push_back(b);
        }
    }

    /// A server refused a statement of generation `seen` as not the leader:
    /// a new driver (new pools, a routing table read afresh from the seed
    /// address on first use), unless another refusal renewed it already.
    /// Statements running on the old one finish on their connections.
    fn reroute(&self, seen: u64) {
        if !self.routed {
            return;
        }
        let mut current = self.graph.write().unwrap_or_else(|e| e.into_inner());
        if current.0 != seen {
            return;
        }
        match Graph::connect(self.config.clone()) {
            Ok(g) => *current = (seen + 1, g),
            Err(e) => tracing::warn!(error = %e, "could not renew the graph driver"),
        }
    }

    /// Renews the driver of generation `seen` when a failure's words say
    /// its server is not the leader.
    fn notice(&self, seen: u64, failure: &str) {
        if not_the_leader(failure) {
            self.reroute(seen);
        }
    }
}

/// A streamed read's rows: inside an explicit transaction, or of one
/// statement.
enum Rows {
    InTxn(neo4rs::RowStream),
    Detached(Box<neo4rs::DetachedRowStream>),
}

/// Whether a failure says that the server is not (or no longer) the one
/// that takes writes.
fn not_the_leader(cause: &str) -> bool {
    cause.contains("Neo.ClientError.Cluster.NotALeader")
        || cause.contains("Neo.ClientError.General.ForbiddenOnReadOnlyDatabase")
}

/// How a failed graph call is handled; `classify` is the one place that decides.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorClass {
    /// A write-write conflict, deadlock or leader switch: the transaction may
    /// simply run again (ArcadeDB reports its concurrent-modification errors
    /// over Bolt as `Neo.TransientError.Transaction.DeadlockDetected`; Neo4j
    /// uses the `Neo.TransientError.*` class).
    Transient,
    /// A uniqueness constraint refused a create. Retried only by find-or-create
    /// work (MERGE), whose next attempt finds the racing winner's node:
    /// ArcadeDB lets two concurrent MERGEs both try to create the node.
    Duplicate,
    /// No usable connection: refused, reset, timed out, pool exhausted → 503.
    Unavailable,
    /// Anything else (a bad statement, a type error): not retried.
    Failed,
}

/// Codes Neo4j files under TransientError that are not worth retrying
/// (the official drivers treat them as client errors).
const NOT_RETRYABLE: &[&str] = &[
    "Neo.TransientError.Transaction.Terminated",
    "Neo.TransientError.Transaction.LockClientStopped",
];

/// Codes outside the TransientError class that mean "run it again".
const RETRYABLE: &[&str] = &[
    "Neo.ClientError.Cluster.NotALeader",
    "Neo.ClientError.General.ForbiddenOnReadOnlyDatabase",
    // Neo4j: a node this transaction matched was deleted by one that committed
    // first (workspace delete vs ingest); the next attempt no longer matches it.
    "Neo.ClientError.Statement.EntityNotFound",
];

/// ArcadeDB's own words for a concurrent modification, in case one arrives
/// under a generic code.
const ARCADEDB_CONFLICT: &[&str] = &[
    "ConcurrentModificationException",
    "NeedRetryException",
    "Please retry the operation",
    "changed by a concurrent transaction",
    "concurrent change to the same record",
];

/// Classifies a code/message pair from the server.
fn classify_code(code: &str, message: &str) -> ErrorClass {
    if RETRYABLE.contains(&code)
        || (code.starts_with("Neo.TransientError.") && !NOT_RETRYABLE.contains(&code))
        || ARCADEDB_CONFLICT.iter().any(|m| message.contains(m))
    {
        ErrorClass::Transient
    } else if code == "Neo.ClientError.Schema.ConstraintValidationFailed" {
        ErrorClass::Duplicate
    } else {
        ErrorClass::Failed
    }
}

/// The class of a neo4rs error and a cause fit for logs (server codes and
/// messages, I/O errors; never credentials, which neo4rs errors do not carry).
pub fn classify(e: &neo4rs::Error) -> (ErrorClass, String) {
    match e {
        neo4rs::Error::Neo4j(n) => (
            classify_code(n.code(), n.message()),
            format!("{}: {}", n.code(), n.message()),
        ),
        // neo4rs reports a FAILURE answering BEGIN or COMMIT as an unexpected
        // message with the failure's metadata in its text.
        neo4rs::Error::UnexpectedMessage(text) if text.contains("Failure") => {
            let code = text
                .find("Neo.")
                .map(|i| {
                    text[i..]
                        .split(|c: char| !(c.is_ascii_alphanumeric() || c == '.'))
                        .next()
                        .unwrap_or("")
                })
                .unwrap_or("");
            (classify_code(code, text), text.clone())
        }
        neo4rs::Error::IOError { .. }
        | neo4rs::Error::ConnectionError
        | neo4rs::Error::UnexpectedMessage(_)
        | neo4rs::Error::UnsupportedVersion(..)
        | neo4rs::Error::ConnectionClosed(_)
        | neo4rs::Error::IncompleteBoltExchange
        | neo4rs::Error::ServerUnavailableError(_)
        | neo4rs::Error::ConnectionTimedOut
        | neo4rs::Error::RoutingTableError(_)
        | neo4rs::Error::RoutingTableRefreshFailed(_)
        | neo4rs::Error::RequestIgnoredError
        | neo4rs::Error::Ignored(_)
        | neo4rs::Error::ProtocolMismatch(_)
        | neo4rs::Error::AuthenticationError(_)
        | neo4rs::Error::InvalidDnsName(_)
        | neo4rs::Error::UnknownMessage(_) => (ErrorClass::Unavailable, e.to_string()),
        other => (ErrorClass::Failed, other.to_string()),
    }
}

impl From<neo4rs::Error> for GraphError {
    fn from(e: neo4rs::Error) -> Self {
        match classify(&e) {
            (ErrorClass::Unavailable, cause) => GraphError::Unavailable(cause),
            (ErrorClass::Transient, cause) => GraphError::Conflict(cause),
            (_, cause) => GraphError::Query(cause),
        }
    }
}

impl From<neo4rs::DeError> for GraphError {
    fn from(e: neo4rs::DeError) -> Self {
        GraphError::Query(e.to_string())
    }
}

/// Retry policy of the transaction runner, shaped like the official drivers'
/// managed transactions: exponential backoff with equal jitter, bounded in
/// total time (and attempts).
#[derive(Debug, Clone, Copy)]
pub struct RetryPolicy {
    pub initial: Duration,
    pub max_delay: Duration,
    pub max_attempts: u32,
    pub budget: Duration,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        RetryPolicy {
            initial: Duration::from_millis(5),
            max_delay: Duration::from_millis(400),
            max_attempts: 30,
            budget: Duration::from_secs(15),
        }
    }
}

impl RetryPolicy {
    fn delay(&self, attempt: u32) -> Duration {
        let cap = self.initial.saturating_mul(1u32 << attempt.min(16)).min(self.max_delay);
        // Equal jitter: uniformly in [cap/2, cap].
        let ms = cap.as_micros() as u64;
        Duration::from_micros(rand::random::<u64>() % (ms / 2 + 1) + ms / 2)
    }
}

/// Counters of the transaction runner (conflict rate, for tests and benches).
#[derive(Debug, Default)]
pub struct TxnStats {
    pub transactions: AtomicU64,
    pub retries: AtomicU64,
    pub gave_up: AtomicU64,
}

/// One step of a transaction: a statement and, optionally, a check of its rows
/// that may stop the transaction (rolled back) with a value.
pub struct Step<A> {
    query: Query,
    check: Option<Check<A>>,
}

type Check<A> = Arc<dyn Fn(&[Row]) -> Result<Option<A>, GraphError> + Send + Sync>;

impl<A> Step<A> {
    pub fn run(query: Query) -> Self {
        Step { query, check: None }
    }

    pub fn check(
        query: Query,
        check: impl Fn(&[Row]) -> Result<Option<A>, GraphError> + Send + Sync + 'static,
    ) -> Self {
        Step {
            query,
            check: Some(Arc::new(check)),
        }
    }
}

impl<A> Clone for Step<A> {
    fn clone(&self) -> Self {
        Step {
            query: self.query.clone(),
            check: self.check.clone(),
        }
    }
}

/// How a transaction ended.
#[derive(Debug, PartialEq, Eq)]
pub enum Txn<A> {
    Committed,
    /// A check stopped it; nothing was written.
    Stopped(A),
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
    /// read again after `rank::STATS_TTL`.
    pub(crate) ranking: moka::future::Cache<String, rank::LibraryStats>,
    /// Library uid → its name, for search hits (a rename shows within
    /// `rank::STATS_TTL`).
    pub(crate) names: moka::future::Cache<String, String>,
    /// Library uid → its chunk vectors (semantic search; `vectors`).
    pub(crate) vectors: Arc<vectors::VectorCache>,
    /// The embedding model, when one is installed (else keyword search only).
    pub(crate) semantic: Option<Arc<crate::embed::Embedder>>,
    /// This replica's per-library search indexes (`indexing`), when
    /// `MNEMOSYNE_INDEX_DIR` is set; else every search reads the graph.
    pub(crate) index: Option<Arc<indexing::SearchIndex>>,
    /// Where writes record their change for every replica's index
    /// (`pg::index_changes`).
    pub(crate) change_log: sqlx::PgPool,
}

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

/// Marks a detached statement's caller as gone when its wait ends (answered,
/// timed out or cancelled): a statement not started by then never starts.
/// The pages of a streamed read (`GraphStore::stream`).
pub(super) struct Pages {
    rx: tokio::sync::mpsc::Receiver<Result<Vec<Row>, GraphError>>,
    timeout: Duration,
}

impl Pages {
    /// The next page; None at the end (never for a statement that stopped
    /// before its last row: that is an error).
    pub(super) async fn next(&mut self) -> Result<Option<Vec<Row>>, GraphError> {
        match tokio::time::timeout(self.timeout, self.rx.recv()).await {
            Ok(Some(Ok(page))) if page.is_empty() => Ok(None),
            Ok(Some(page)) => page.map(Some),
            Ok(None) => Err(GraphError::Unavailable(
                "the statement stopped before its last row".into(),
            )),
            Err(_) => Err(GraphError::Unavailable(format!(
                "no page within {} ms",
                self.timeout.as_millis()
            ))),
        }
    }
}

struct GoneOnDrop(Arc<std::sync::atomic::AtomicBool>);

impl Drop for GoneOnDrop {
    fn drop(&mut self) {
        self.0.store(true, Ordering::Release);
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
                .time_to_live(rank::STATS_TTL)
                .build(),
            names: moka::future::Cache::builder()
                .max_capacity(100_000)
                .time_to_live(rank::STATS_TTL)
                .build(),
            vectors: Arc::new(vectors::VectorCache::new(settings.vector_cache_chunks)),
            semantic: None,
            index: None,
            change_log: crate::store::pg::pool(&settings.database_url, settings.store_timeout())
                .map_err(|e| GraphError::Unavailable(format!("postgres: {e}")))?,
        })
    }

    /// Records writes' changes through this pool (the server's own) rather
    /// than one of its own.
    pub fn with_change_log(mut self, pg: sqlx::PgPool) -> Self {
        self.change_log = pg;
        self
    }

    /// Records, after its graph transaction committed, that a write changed
    /// `item` of `library` (None: the whole library), so that every
    /// replica's index catches up before its next search of it. A failure is
    /// the write's failure (503: its retry records it).
    pub(super) async fn record_change(&self, library: &str, item: Option<&str>) -> Result<(), GraphError> {
        crate::store::pg::index_changes::record(&self.change_log, library, item)
            .await
            .map(|_| ())
            .map_err(|e| GraphError::Unavailable(format!("postgres: recording the change for the search index: {e}")))
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
            .map(|_| ())
            .map_err(|e| GraphError::Unavailable(format!("postgres: recording the change for the search index: {e}")))
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
            .map(|_| ())
            .map_err(|e| GraphError::Unavailable(format!("postgres: recording an earlier write's change: {e}")))
    }

    /// Searches through this replica's per-library indexes.
    pub fn with_index(mut self, index: Arc<indexing::SearchIndex>) -> Self {
        self.index = Some(index);
        self
    }

    /// Semantic search with this model (see `crate::embed`).
    pub fn with_embedder(mut self, embedder: Arc<crate::embed::Embedder>) -> Self {
        self.semantic = Some(embedder);
        self
    }

    /// The embedding model and its worker's counters, if any.
    pub fn semantic(&self) -> Option<&Arc<crate::embed::Embedder>> {
        self.semantic.as_ref()
    }

    /// Chunks and bytes the vector cache holds.
    pub fn vector_cache_size(&self) -> (usize, usize) {
        self.vectors.size()
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
        let fut = work(self.driver.graph());
        // A statement starts only while its caller still waits: the task
        // takes one of the pool's connections (`connections`, as many as the
        // pool holds, so neo4rs never queues) and then checks that the caller
        // has not given up meanwhile.
        let gone = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let (seen, connections) = (gone.clone(), self.connections.clone());
        let task = tokio::spawn(async move {
            let _slot = connections
                .acquire_owned()
                .await
                .map_err(|_| GraphError::Unavailable("closing".into()))?;
            if seen.load(Ordering::Acquire) {
                return Err(GraphError::Unavailable(
                    "the caller gave up before the statement started".into(),
                ));
            }
            let out = fut.await;
            drop(permit);
            out
        });
        let _gone = GoneOnDrop(gone);
        match tokio::time::timeout(self.timeout, task).await {
            Ok(Ok(r)) => r,
            Ok(Err(e)) => Err(GraphError::Unavailable(format!("query task failed: {e}"))),
            Err(_) => Err(GraphError::Unavailable(format!(
                "no answer within {} ms",
                self.timeout.as_millis()
            ))),
        }
    }

    /// Runs a read (`name`: its Cypher file, for metrics and traces) and
    /// collects its rows.
    ///
    /// On a routed cluster (`neo4j://`) it goes to a reader, after the last
    /// write this replica committed (its bookmark): what this replica wrote,
    /// its reads see.
    pub(super) async fn rows(&self, name: &'static str, q: Query) -> Result<Vec<Row>, GraphError> {
        // neo4rs hands its bookmarks to ROUTE only: they go on the RUN here.
        let bookmarks = self.driver.bookmarks();
        let q = if bookmarks.is_empty() {
            q
        } else {
            q.extra("bookmarks", bookmarks)
        };
        self.observed(
            name,
            self.detached(|graph| async move {
                let mut stream = graph.execute_read(q).await?;
                let mut rows = Vec::new();
                while let Some(row) = stream.next().await? {
                    rows.push(row);
                }
                Ok(rows)
            }),
        )
        .await
    }

    /// Runs a read on the writer of a routed cluster (elsewhere as `rows`):
    /// for what the search index reads after a change another replica wrote
    /// and recorded in Postgres, and the auth path's workspace libraries. The
    /// leader holds every acknowledged write; a reader may not yet, and this
    /// replica has no bookmark of that write. An explicit transaction: neo4rs
    /// retries a single statement refused with NotALeader for up to a minute
    /// against the same stale table, a transaction it leaves to us (a
    /// refusal renews the driver; the caller's next call uses the new one).
    pub(super) async fn rows_from_leader(&self, name: &'static str, q: Query) -> Result<Vec<Row>, GraphError> {
        let (seen, _) = self.driver.current();
        let routed = self.driver.routed;
        let result = self
            .observed(
                name,
                self.detached(move |graph| async move {
                    let mut rows = Vec::new();
                    if !routed {
                        let mut stream = graph.execute(q).await?;
                        while let Some(row) = stream.next().await? {
                            rows.push(row);
                        }
                        return Ok(rows);
                    }
                    let mut txn = graph.start_txn().await?;
                    let mut stream = txn.execute(q).await?;
                    while let Some(row) = stream.next(txn.handle()).await? {
                        rows.push(row);
                    }
                    txn.commit().await?;
                    Ok(rows)
                }),
            )
            .await;
        if let Err(e) = &result {
            self.driver.notice(seen, &e.to_string());
        }
        result
    }

    /// Runs a read whose answer may be larger than memory should hold (an
    /// index build reading a whole library; on a routed cluster from the
    /// writer, see `rows_from_leader`) and hands its rows over in pages
    /// of `page`, through a channel that holds one page: at most two pages
    /// are in memory on this side. Each page must come within the store
    /// timeout (the whole statement may take longer). The exchange is always
    /// read to its end, even when the receiver gave up, so the connection
    /// goes back whole (see `detached`).
    pub(super) async fn stream(&self, name: &'static str, q: Query, page: usize) -> Result<Pages, GraphError> {
        let permit = self
            .in_flight
            .clone()
            .try_acquire_owned()
            .map_err(|_| GraphError::Unavailable("too many graph queries in flight".into()))?;
        let (connections, driver) = (self.connections.clone(), self.driver.clone());
        let (seen, graph) = driver.current();
        let (tx, rx) = tokio::sync::mpsc::channel::<Result<Vec<Row>, GraphError>>(1);
        tokio::spawn(
            async move {
                let _permit = permit;
                let Ok(_slot) = connections.acquire_owned().await else {
                    let _ = tx.send(Err(GraphError::Unavailable("closing".into()))).await;
                    return;
                };
                if tx.is_closed() {
                    return;
                }
                // A refusal as not the leader renews the driver (see
                // `rows_from_leader`).
                let failed = |e: neo4rs::Error| -> GraphError {
                    let e = GraphError::from(e);
                    driver.notice(seen, &e.to_string());
                    e
                };
                // On a routed cluster an explicit transaction (never
                // retried inside neo4rs), on the writer; else one statement.
                let mut txn = None;
                if driver.routed {
                    match graph.start_txn().await {
                        Ok(t) => txn = Some(t),
                        Err(e) => {
                            let _ = tx.send(Err(failed(e))).await;
                            return;
                        }
                    }
                }
                let started = match &mut txn {
                    Some(t) => t.execute(q).await.map(Rows::InTxn),
                    None => graph.execute(q).await.map(|r| Rows::Detached(Box::new(r))),
                };
                let mut rows = match started {
                    Ok(r) => r,
                    Err(e) => {
                        let _ = tx.send(Err(failed(e))).await;
                        return;
                    }
                };
                let mut buf = Vec::with_capacity(page);
                let mut open = true;
                loop {
                    let next = match (&mut rows, &mut txn) {
                        (Rows::InTxn(r), Some(t)) => r.next(t.handle()).await,
                        (Rows::Detached(r), _) => r.next().await,
                        (Rows::InTxn(_), None) => Ok(None),
                    };
                    match next {
                        Ok(Some(row)) if open => {
                            buf.push(row);
                            if buf.len() >= page {
                                let full = std::mem::replace(&mut buf, Vec::with_capacity(page));
                                open = tx.send(Ok(full)).await.is_ok();
                            }
                        }
                        Ok(Some(_)) => {} // drained: nobody reads it
                        Ok(None) => {
                            if let Some(t) = txn {
                                let _ = t.commit().await;
                            }
                            // The last rows, then an empty page: the end.
                            if open && (buf.is_empty() || tx.send(Ok(buf)).await.is_ok()) {
                                let _ = tx.send(Ok(Vec::new())).await;
                            }
                            return;
                        }
                        Err(e) => {
                            let e = failed(e);
                            if open {
                                let _ = tx.send(Err(e)).await;
                            }
                            return;
                        }
                    }
                }
            }
            .instrument(tracing::info_span!("graph.stream", query = name)),
        );
        Ok(Pages {
            rx,
            timeout: self.timeout,
        })
    }

    /// Times `work` into `graph_query_duration_seconds{query=name}` inside a
    /// `graph.query` span, and counts its failure by kind. Never the query text.
    async fn observed<T>(
        &self,
        name: &'static str,
        work: impl Future<Output = Result<T, GraphError>>,
    ) -> Result<T, GraphError> {
        let started = Instant::now();
        let out = work.instrument(tracing::info_span!("graph.query", query = name)).await;
        if let Some(m) = &self.metrics {
            m.duration
                .with_label_values(&[name])
                .observe(started.elapsed().as_secs_f64());
            if let Err(e) = &out {
                let kind = match e {
                    GraphError::Unavailable(cause) => {
                        tracing::warn!(query = name, %cause, "graph unavailable");
                        "unavailable"
                    }
                    _ => "query",
                };
                m.errors.with_label_values(&[kind]).inc();
            }
        }
        out
    }

    /// Reports to these metrics (the app's registry owns them).
    pub fn with_metrics(mut self, metrics: &crate::metrics::Metrics) -> Self {
        self.metrics = Some(GraphMetrics {
            duration: metrics.graph_query_duration.clone(),
            errors: metrics.graph_errors.clone(),
        });
        self
    }

    /// Runs statements in one explicit transaction: all or nothing; retried on
    /// a transient conflict.
    pub(super) async fn write_txn(&self, what: &'static str, queries: Vec<Query>) -> Result<(), GraphError> {
        self.transaction::<()>(what, false, queries.into_iter().map(Step::run).collect())
            .await
            .map(|_| ())
    }

    /// The runner counters (transactions, retries, gave up).
    pub fn txn_stats(&self) -> (u64, u64, u64) {
        (
            self.stats.transactions.load(Ordering::Relaxed),
            self.stats.retries.load(Ordering::Relaxed),
            self.stats.gave_up.load(Ordering::Relaxed),
        )
    }

    /// The one graph transaction runner. Runs `steps` in one explicit
    /// transaction (all or nothing); a check may stop it (rolled back). A
    /// transaction that fails on a transient conflict — and, when
    /// `find_or_create`, on a uniqueness race — runs again from the start after
    /// a jittered exponential backoff, within the policy's attempts and total
    /// time. Each attempt has the store timeout; running out of it, or losing
    /// the connection, is `Unavailable` and not retried.
    pub(super) async fn transaction<A: Send + 'static>(
        &self,
        what: &'static str,
        find_or_create: bool,
        steps: Vec<Step<A>>,
    ) -> Result<Txn<A>, GraphError> {
        self.observed(what, self.retrying(what, find_or_create, steps)).await
    }

    async fn retrying<A: Send + 'static>(
        &self,
        what: &'static str,
        find_or_create: bool,
        steps: Vec<Step<A>>,
    ) -> Result<Txn<A>, GraphError> {
        let started = Instant::now();
        self.stats.transactions.fetch_add(1, Ordering::Relaxed);
        let mut attempt: u32 = 0;
        loop {
            // Each attempt runs detached: a timeout abandons the wait, not the
            // exchange (see `detached`).
            let steps = steps.clone();
            let (seen, _) = self.driver.current();
            let err = match self
                .detached(|graph| async move { Ok(attempt_on(graph, steps).await) })
                .await
            {
                Ok(Ok((done, bookmark))) => {
                    self.driver.committed(bookmark);
                    return Ok(done);
                }
                Ok(Err(Attempt::Check(e))) => return Err(e),
                Ok(Err(Attempt::Graph(e))) => e,
                Err(GraphError::Unavailable(cause)) => return Err(GraphError::Unavailable(format!("{what}: {cause}"))),
                Err(e) => return Err(e),
            };
            let (class, cause) = classify(&err);
            self.driver.notice(seen, &cause);
            let retryable = class == ErrorClass::Transient || (find_or_create && class == ErrorClass::Duplicate);
            attempt += 1;
            if retryable {
                let delay = self.retry.delay(attempt - 1);
                if attempt < self.retry.max_attempts && started.elapsed() + delay < self.retry.budget {
                    self.stats.retries.fetch_add(1, Ordering::Relaxed);
                    if let Some(m) = &self.metrics {
                        m.errors.with_label_values(&["conflict_retried"]).inc();
                    }
                    tracing::debug!(what, attempt, %cause, "graph write conflict, retrying");
                    tokio::time::sleep(delay).await;
                    continue;
                }
                self.stats.gave_up.fetch_add(1, Ordering::Relaxed);
                tracing::warn!(what, attempts = attempt, %cause, "graph write conflict persisted after retries");
                return Err(GraphError::Conflict(format!("{what}: {cause}")));
            }
            return Err(match class {
                ErrorClass::Unavailable => GraphError::Unavailable(format!("{what}: {cause}")),
                _ => GraphError::Query(format!("{what}: {cause}")),
            });
        }
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
}

impl GraphStore {
    /// Turns the connection into its handles: the one way code outside
    /// `store/` gets an admin or knowledge handle.
    pub fn into_handles(self) -> Handles {
        Handles {
            knowledge: self.knowledge(),
            admin: self.admin(),
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

/// One attempt of a transaction on a connection of `graph`'s pool.
/// A commit gives its bookmark (None from servers without bookmarks).
async fn attempt_on<A: Send + 'static>(graph: Graph, steps: Vec<Step<A>>) -> Result<(Txn<A>, Option<String>), Attempt> {
    // On an error the transaction is dropped: its connection goes back to
    // the pool, which resets it (rolling the transaction back) before reuse.
    let mut txn = graph.start_txn().await?;
    for step in &steps {
        match &step.check {
            None => {
                txn.run(step.query.clone()).await?;
            }
            Some(check) => {
                let mut stream = txn.execute(step.query.clone()).await?;
                let mut rows = Vec::new();
                while let Some(row) = stream.next(txn.handle()).await? {
                    rows.push(row);
                }
                if let Some(stop) = check(&rows).map_err(Attempt::Check)? {
                    let _ = txn.rollback().await;
                    return Ok((Txn::Stopped(stop), None));
                }
            }
        }
    }
    let bookmark = txn.commit().await?;
    Ok((Txn::Committed, bookmark))
}

/// Why an attempt failed: the graph said no (classified and maybe retried),
/// or a check could not read its rows (never retried).
enum Attempt {
    Graph(neo4rs::Error),
    Check(GraphError),
}

impl From<neo4rs::Error> for Attempt {
    fn from(e: neo4rs::Error) -> Self {
        Attempt::Graph(e)
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
mod tests {
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
