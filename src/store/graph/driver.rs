//! Running statements on the Bolt driver: the driver itself (routing, its
//! renewal when a server says it is not the leader, bookmarks), how a failure
//! is classified, and the one transaction runner with its retries. Every
//! exchange runs detached, so a caller that gives up never leaves a
//! connection mid-answer (`GraphStore::detached`).

use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use neo4rs::{Graph, Query, Row};
use tracing::Instrument;

use super::{GraphError, GraphStore};

/// Rows fetched per PULL.
pub(super) const FETCH_SIZE: usize = 500;

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
    pub(super) fn new(config: neo4rs::Config, uri: &str) -> Result<Self, GraphError> {
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
pub(super) fn classify_code(code: &str, message: &str) -> ErrorClass {
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
    pub(super) fn delay(&self, attempt: u32) -> Duration {
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

/// The pages of a streamed read (`GraphStore::stream`).
pub(in crate::store) struct Pages {
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

/// Marks a detached statement's caller as gone when its wait ends (answered,
/// timed out or cancelled): a statement not started by then never starts.
struct GoneOnDrop(Arc<std::sync::atomic::AtomicBool>);

impl Drop for GoneOnDrop {
    fn drop(&mut self) {
        self.0.store(true, Ordering::Release);
    }
}

impl GraphStore {
    /// Runs a Bolt exchange on a task of its own and waits for it at most the
    /// store timeout. A caller that gives up (timeout, a cancelled request)
    /// abandons the wait, never the exchange: neo4rs returns a connection to
    /// its pool as it is and "recycles" it with a RESET whose answer it reads
    /// as the next message, so a connection dropped mid-exchange would hand
    /// the next query the previous query's answer — measured: empty searches
    /// and wrong "not found" right after a graph pause or restart
    /// (tests/faults.rs). The task finishes the exchange (or fails on a dead
    /// connection), so every connection goes back whole.
    pub(super) async fn detached<T, F, Fut>(&self, work: F) -> Result<T, GraphError>
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
    pub(in crate::store) async fn rows(&self, name: &'static str, q: Query) -> Result<Vec<Row>, GraphError> {
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
    pub(in crate::store) async fn rows_from_leader(
        &self,
        name: &'static str,
        q: Query,
    ) -> Result<Vec<Row>, GraphError> {
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
    pub(in crate::store) async fn stream(
        &self,
        name: &'static str,
        q: Query,
        page: usize,
    ) -> Result<Pages, GraphError> {
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
    pub(super) async fn observed<T>(
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

    /// Runs statements in one explicit transaction: all or nothing; retried on
    /// a transient conflict.
    pub(in crate::store) async fn write_txn(&self, what: &'static str, queries: Vec<Query>) -> Result<(), GraphError> {
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
    pub(in crate::store) async fn transaction<A: Send + 'static>(
        &self,
        what: &'static str,
        find_or_create: bool,
        steps: Vec<Step<A>>,
    ) -> Result<Txn<A>, GraphError> {
        self.observed(what, self.retrying(what, find_or_create, steps)).await
    }

    pub(super) async fn retrying<A: Send + 'static>(
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
