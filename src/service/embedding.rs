//! The embedding worker: gives pending chunks their vectors, off the request
//! path. One replica works at a time (a Postgres advisory lock, freed when
//! its connection ends); the others only try for the lock, once a second on
//! one connection they keep, and read nothing from the graph. The leader
//! counts the backlog when the libraries it knows are drained or every
//! `RECOUNT`, and lowers the count by what it embeds in between (a count is a
//! scan of the pending chunks; ArcadeDB reads every chunk for it).
//!
//! Round-robin: each round takes one batch from every library with pending
//! chunks (in uid order, starting after the library served last), so one
//! tenant's bulk sync never starves another's. Its state is the graph's
//! (`store::graph::vectors`), so a restart resumes where it stopped. The
//! vectors come through `crate::embed::Embedder`; what the worker reports,
//! `embed::Status`.

use std::sync::Arc;
use std::time::{Duration, Instant};

use sqlx::PgPool;

use crate::embed::{Earlier, EmbedError, Embedded, Embedder, Status};
use crate::store::graph::ingest::AdminGraph;
use crate::store::graph::vectors::Pending;

/// How long an idle worker (or one that is not the leader) waits before it
/// looks again.
const IDLE: Duration = Duration::from_secs(1);
/// How often a leader with work recounts the backlog (to find libraries
/// that were queued since it last counted).
const RECOUNT: Duration = Duration::from_secs(10);
/// Advisory lock key of the embedding leader (per database).
const LOCK_KEY: i64 = 0x6d6e_656d_5f65_6d62; // "mnem_emb"
/// Chunks marked pending per backfill page.
const BACKFILL_PAGE: i64 = 1000;
/// Settings of the worker.
#[derive(Clone, Debug)]
pub struct WorkerConfig {
    /// Chunks a batch (a remote provider's: one request's).
    pub batch: usize,
    /// Batches embedded at once, each read while the others are out (a
    /// remote provider's requests in flight; the in-process model: 1).
    pub lanes: usize,
    /// Only libraries whose uid starts with this (tests; empty: all).
    pub prefix: String,
}

/// Runs until the task is aborted. `lock_pool`: where the leader lock's
/// connection comes from (a session of its own: never through a
/// transaction-pooling PgBouncer); `pg`: everything else.
pub async fn run(graph: AdminGraph, pg: PgPool, lock_pool: PgPool, embedder: Arc<Embedder>, config: WorkerConfig) {
    let status = embedder.status().clone();
    // A follower's one connection for its lock attempts; it becomes `lock`
    // (held while leading) when an attempt succeeds.
    let mut candidate: Option<sqlx::PgConnection> = None;
    let mut lock: Option<sqlx::PgConnection> = None;
    let mut last: Option<String> = None;
    let mut backlog = Backlog::default();
    let mut lanes = Lanes::new(config.lanes);
    loop {
        if lock.is_none() {
            // A batch out when leadership was lost ends first.
            while let Some(ended) = lanes.next().await {
                ended.settle(&mut backlog);
            }
            lock = lead(&lock_pool, &mut candidate).await;
            if lock.is_none() {
                // A follower reads nothing from the graph.
                tokio::time::sleep(IDLE).await;
                continue;
            }
            status.leader.set(1);
            tracing::info!(model = embedder.id(), "embedding worker: leading");
            backlog = Backlog::default();
            if let Err(e) = backfill(&graph, embedder.id(), &config.prefix).await {
                tracing::warn!(error = %e, "embedding worker: backfill failed");
            }
        } else if !still_held(lock.as_mut()).await {
            tracing::warn!("embedding worker: lost its lock connection");
            lock = None;
            status.leader.set(0);
            status.backlog.set(0);
            continue;
        }
        if backlog.due(Instant::now()) {
            match graph.embedding_backlog(&config.prefix).await {
                Ok(b) => backlog.counted(b, Instant::now()),
                Err(e) => {
                    tracing::warn!(error = %e, "embedding worker: backlog unreadable");
                    tokio::time::sleep(IDLE).await;
                    continue;
                }
            }
        }
        status.backlog.set(backlog.total());
        if backlog.total() == 0 {
            match lanes.next().await {
                Some(ended) => {
                    ended.settle(&mut backlog);
                }
                None => tokio::time::sleep(IDLE).await,
            }
            continue;
        }
        for lib in round(backlog.libraries(), last.as_deref()) {
            // A free lane; trouble in a batch that ended pauses the round.
            let mut trouble = false;
            while lanes.full() && !trouble {
                if let Some(ended) = lanes.next().await {
                    trouble = ended.settle(&mut backlog);
                }
            }
            status.backlog.set(backlog.total());
            if trouble {
                tokio::time::sleep(IDLE).await;
                break;
            }
            status.yield_to_ingest().await;
            match graph
                .pending_chunks(&lib, config.batch.max(1) as i64, &lanes.held(&lib))
                .await
            {
                Ok(pending) if pending.is_empty() => {
                    if lanes.holds(&lib) {
                        // Its last chunks are out: wait for a batch to end
                        // rather than read again.
                        if let Some(ended) = lanes.next().await {
                            ended.settle(&mut backlog);
                        }
                    } else {
                        backlog.embedded(&lib, 0);
                    }
                }
                Ok(pending) => {
                    let (pg, graph, embedder, status) = (pg.clone(), graph.clone(), embedder.clone(), status.clone());
                    let held = lib.clone();
                    let uids = pending.iter().map(|p| p.uid.clone()).collect();
                    lanes.start(&lib, uids, async move {
                        one_batch(&pg, &graph, &embedder, &status, &held, pending).await
                    });
                }
                Err(e) => {
                    tracing::warn!(library = %lib, error = %e, "embedding worker: pending chunks unreadable");
                    tokio::time::sleep(IDLE).await;
                }
            }
            last = Some(lib);
        }
    }
}

/// The batches out (each a task: it is embedded and stored while the next
/// is read and sent), and the chunks each holds, which a batch read
/// meanwhile leaves out, so no chunk is in two.
struct Lanes {
    width: usize,
    tasks: tokio::task::JoinSet<anyhow::Result<i64>>,
    /// Each task's library and chunks.
    out: std::collections::HashMap<tokio::task::Id, (String, Vec<String>)>,
}

/// A batch that ended: its library, and how many of its chunks left the
/// queue (or why none did).
struct Ended {
    lib: String,
    outcome: anyhow::Result<i64>,
}

impl Lanes {
    fn new(width: usize) -> Lanes {
        Lanes {
            width: width.max(1),
            tasks: tokio::task::JoinSet::new(),
            out: std::collections::HashMap::new(),
        }
    }

    fn full(&self) -> bool {
        self.tasks.len() >= self.width
    }

    /// The chunks of `lib` in a batch out.
    fn held(&self, lib: &str) -> Vec<String> {
        self.out
            .values()
            .filter(|(l, _)| l == lib)
            .flat_map(|(_, uids)| uids.iter().cloned())
            .collect()
    }

    fn holds(&self, lib: &str) -> bool {
        self.out.values().any(|(l, _)| l == lib)
    }

    fn start(
        &mut self,
        lib: &str,
        uids: Vec<String>,
        batch: impl std::future::Future<Output = anyhow::Result<i64>> + Send + 'static,
    ) {
        let id = self.tasks.spawn(batch).id();
        self.out.insert(id, (lib.to_owned(), uids));
    }

    /// The next batch to end (None: none is out); its chunks are no
    /// longer held.
    async fn next(&mut self) -> Option<Ended> {
        let (id, outcome) = match self.tasks.join_next_with_id().await? {
            Ok((id, n)) => (id, n),
            Err(e) => (
                e.id(),
                Err(anyhow::anyhow!("the batch's task ended without an answer: {e}")),
            ),
        };
        let (lib, _) = self.out.remove(&id).unwrap_or_default();
        Some(Ended { lib, outcome })
    }
}

impl Ended {
    /// Lowers the backlog by what left the queue. True when the batch met
    /// trouble (the provider unavailable, or an error): the round pauses.
    fn settle(self, backlog: &mut Backlog) -> bool {
        match self.outcome {
            Ok(n) => {
                // None stored (replaced meanwhile) is not "drained": an
                // empty read says that.
                if n > 0 {
                    backlog.embedded(&self.lib, n);
                }
                false
            }
            Err(e) => {
                if matches!(e.downcast_ref(), Some(EmbedError::Unavailable(_))) {
                    // The provider logged it; the chunks stay queued.
                    tracing::debug!(library = %self.lib, error = %e, "embedding worker: provider unavailable");
                } else {
                    tracing::warn!(library = %self.lib, error = %e, "embedding worker: batch failed");
                }
                true
            }
        }
    }
}

/// The leader's backlog per library: counted from the graph, then lowered by
/// what it embeds until the next count.
#[derive(Default, Debug)]
struct Backlog {
    libraries: Vec<(String, i64)>,
    /// When it was last counted (None: never).
    at: Option<Instant>,
}

impl Backlog {
    /// Whether to count again: never counted, every library it knows
    /// drained, or counted `RECOUNT` ago.
    fn due(&self, now: Instant) -> bool {
        match self.at {
            None => true,
            Some(at) => self.total() == 0 || now.saturating_duration_since(at) >= RECOUNT,
        }
    }

    fn counted(&mut self, libraries: Vec<(String, i64)>, now: Instant) {
        self.libraries = libraries;
        self.at = Some(now);
    }

    /// `n` chunks of `lib` left the queue; none left means it is drained.
    fn embedded(&mut self, lib: &str, n: i64) {
        if let Some((_, left)) = self.libraries.iter_mut().find(|(l, _)| l == lib) {
            *left = if n <= 0 { 0 } else { (*left - n).max(0) };
        }
    }

    fn total(&self) -> i64 {
        self.libraries.iter().map(|(_, n)| n).sum()
    }

    fn libraries(&self) -> &[(String, i64)] {
        &self.libraries
    }
}

/// This round's libraries: every library with a backlog, in uid order,
/// starting after `last`.
pub fn round(backlog: &[(String, i64)], last: Option<&str>) -> Vec<String> {
    let libs: Vec<&String> = backlog.iter().filter(|(_, n)| *n > 0).map(|(l, _)| l).collect();
    let start = match last {
        Some(l) => libs.iter().position(|x| x.as_str() > l).unwrap_or(0),
        None => 0,
    };
    libs[start..]
        .iter()
        .chain(libs[..start].iter())
        .map(|l| (*l).clone())
        .collect()
}

/// Takes the leader lock on `conn` (opened once, kept between attempts, and
/// replaced only when it fails): the connection that holds it, or None.
async fn lead(pg: &PgPool, conn: &mut Option<sqlx::PgConnection>) -> Option<sqlx::PgConnection> {
    if conn.is_none() {
        *conn = Some(pg.acquire().await.ok()?.detach());
    }
    let got = sqlx::query_scalar::<_, bool>("SELECT pg_try_advisory_lock($1)")
        .bind(LOCK_KEY)
        .fetch_one(conn.as_mut()?)
        .await;
    match got {
        Ok(true) => conn.take(),
        Ok(false) => None,
        Err(_) => {
            *conn = None;
            None
        }
    }
}

async fn still_held(conn: Option<&mut sqlx::PgConnection>) -> bool {
    match conn {
        Some(c) => sqlx::query("SELECT 1").execute(c).await.is_ok(),
        None => false,
    }
}

/// Marks chunks without this model's vector pending (a new model, or chunks
/// from before embeddings).
async fn backfill(graph: &AdminGraph, model: &str, prefix: &str) -> Result<(), crate::store::graph::GraphError> {
    let mut total = 0;
    loop {
        let n = graph.backfill_pending(model, prefix, BACKFILL_PAGE).await?;
        total += n;
        if n < BACKFILL_PAGE {
            break;
        }
    }
    if total > 0 {
        tracing::info!(
            chunks = total,
            "embedding worker: chunks without a vector of this model queued"
        );
    }
    Ok(())
}

/// Tells every replica's search index that the vectors of `items` were
/// stored (their items are read again on the next search of `lib`). The
/// vectors are committed already, so this is retried until Postgres takes it.
async fn record_vectors(pg: &PgPool, lib: &str, items: &[String]) {
    let mut wait = Duration::from_millis(100);
    loop {
        match crate::store::pg::index_changes::record_items(pg, lib, items).await {
            Ok(_) => return,
            Err(e) => {
                tracing::warn!(library = %lib, error = %e, "embedding worker: vectors stored but not yet announced to the search index; retrying");
                tokio::time::sleep(wait).await;
                wait = (wait * 2).min(Duration::from_secs(5));
            }
        }
    }
}

/// Embeds and stores one batch of a library's pending chunks; returns how
/// many left the queue.
async fn one_batch(
    pg: &PgPool,
    graph: &AdminGraph,
    embedder: &Arc<Embedder>,
    status: &Status,
    lib: &str,
    mut pending: Vec<Pending>,
) -> anyhow::Result<i64> {
    let texts: Vec<String> = pending
        .iter()
        .map(|p| crate::embed::chunk_text(&p.title, &p.text))
        .collect();
    let earlier: Vec<Option<Earlier>> = pending
        .iter_mut()
        .map(|p| p.earlier.take().map(|(model, vector)| Earlier { model, vector }))
        .collect();
    // Unavailable: nothing is marked, the chunks stay queued for later.
    let (vectors, kept) = split_embed(embedder, texts, earlier).await?;
    // Not one text embedded: a provider that refuses even its probe is
    // broken, not these texts (nothing is marked).
    if vectors.iter().all(Result::is_err) {
        embedder
            .probe()
            .await
            .map_err(|e| EmbedError::Unavailable(format!("the provider refuses even its probe ({e})")))?;
    }
    let mut rows = Vec::with_capacity(pending.len());
    let mut failed = Vec::new();
    for (p, v) in pending.into_iter().zip(vectors) {
        match v {
            Ok(v) => rows.push((p.uid, p.title, p.text, v)),
            Err(e) => {
                tracing::warn!(chunk = %p.uid, error = %e, "embedding worker: chunk not embeddable; marked failed for this model");
                failed.push(p.uid);
            }
        }
    }
    let mut done = 0;
    if !failed.is_empty() {
        status.failed.inc_by(failed.len() as u64);
        done += failed.len() as i64;
        graph.embedding_failed(embedder.id(), failed).await?;
    }
    let (stored, items) = graph.store_vectors(embedder.id(), lib, rows).await?;
    status.note_embedded(stored.max(0) as u64);
    // At most what was stored (a chunk replaced meanwhile is not).
    status.reused.inc_by((kept as u64).min(stored.max(0) as u64));
    record_vectors(pg, lib, &items).await;
    Ok(done + stored)
}

/// Each text's vector, or why the provider refused that text.
type PerText = Vec<Result<Vec<f32>, String>>;

/// The vectors of `texts` and how many kept an earlier half. A batch the
/// provider refuses is split in halves, down to the texts it refuses alone
/// (so one bad chunk cannot block a library: it alone is marked failed);
/// a provider that cannot answer now fails the whole batch
/// (`EmbedError::Unavailable`), which stays queued.
fn split_embed(
    embedder: &Embedder,
    mut texts: Vec<String>,
    mut earlier: Vec<Option<Earlier>>,
) -> futures::future::BoxFuture<'_, Result<(PerText, usize), EmbedError>> {
    Box::pin(async move {
        let n = texts.len();
        let why = match embedder.embed_passages(texts.clone(), earlier.clone()).await {
            Ok(Embedded { vectors, kept }) if vectors.len() == n => {
                return Ok((vectors.into_iter().map(Ok).collect(), kept));
            }
            Ok(e) => format!("{} vectors for {n} texts", e.vectors.len()),
            Err(e @ EmbedError::Unavailable(_)) => return Err(e),
            Err(EmbedError::Refused(why)) => why,
        };
        if n <= 1 {
            return Ok((vec![Err(why); n], 0));
        }
        let (rest, rest_earlier) = (texts.split_off(n / 2), earlier.split_off(n / 2));
        let (mut first, kept) = split_embed(embedder, texts, earlier).await?;
        let (second, more) = split_embed(embedder, rest, rest_earlier).await?;
        first.extend(second);
        Ok((first, kept + more))
    })
}

#[cfg(test)]
mod tests {
    use super::{round, Backlog, RECOUNT};
    use std::time::Duration;

    #[test]
    fn rounds_rotate_after_the_last_library() {
        let b = vec![
            ("a".to_owned(), 5),
            ("b".to_owned(), 0),
            ("c".to_owned(), 1),
            ("d".to_owned(), 9),
        ];
        assert_eq!(round(&b, None), ["a", "c", "d"]);
        assert_eq!(round(&b, Some("a")), ["c", "d", "a"]);
        assert_eq!(round(&b, Some("c")), ["d", "a", "c"]);
        assert_eq!(round(&b, Some("d")), ["a", "c", "d"]);
        assert_eq!(round(&b, Some("bb")), ["c", "d", "a"]);
    }

    #[test]
    fn the_leader_recounts_when_drained_or_after_recount_and_subtracts_between() {
        let t0 = std::time::Instant::now();
        let mut b = Backlog::default();
        assert!(b.due(t0), "never counted");
        b.counted(vec![("a".to_owned(), 5), ("b".to_owned(), 3)], t0);
        assert!(!b.due(t0));
        assert_eq!(b.total(), 8);
        b.embedded("a", 4);
        assert_eq!(b.total(), 4);
        b.embedded("b", 9);
        assert_eq!(b.libraries(), [("a".to_owned(), 1), ("b".to_owned(), 0)]);
        assert!(!b.due(t0 + RECOUNT - Duration::from_millis(1)));
        assert!(b.due(t0 + RECOUNT), "work left, but counted RECOUNT ago");
        b.embedded("zzz", 1);
        assert_eq!(b.total(), 1, "a library it does not know changes nothing");
        b.embedded("a", 0);
        assert_eq!(b.total(), 0, "a batch that found nothing: drained");
        assert!(b.due(t0), "everything it knows is drained: count again");
        b.counted(Vec::new(), t0);
        assert!(b.due(t0), "nothing pending: look again on the next tick");
    }
}
