//! What the embedding worker (`service::embedding`) reports — metrics,
//! `get_health`, the console — and how it yields to this replica's ingest.

use std::sync::Arc;
use std::time::Duration;

use prometheus::{IntCounter, IntGauge};

/// Ingest goes first: the worker holds its next batch while an item was
/// written on this replica less than `QUIET` ago, but never longer than
/// `YIELD_MAX` per batch, so a constant stream of ingests slows the drain
/// (about one batch per `YIELD_MAX`) without stopping it.
const QUIET: Duration = Duration::from_millis(250);
const YIELD_MAX: Duration = Duration::from_secs(2);
const YIELD_POLL: Duration = Duration::from_millis(50);
/// The console's embedding rate is over this long.
pub const RATE_WINDOW: Duration = Duration::from_secs(60);
/// Batches the rate keeps at most (a fast provider stores many a second).
const RATE_SAMPLES: usize = 4096;

/// Whether the worker keeps holding its batch: ingest was seen `since` ago
/// and it has held for `held`.
fn holds(since: Duration, held: Duration) -> bool {
    since < QUIET && held < YIELD_MAX
}

/// What the worker reports (metrics, `get_health`, the console).
pub struct Status {
    /// Chunks waiting for a vector (as last counted).
    pub backlog: IntGauge,
    /// Chunks given a vector by this replica.
    pub embedded: IntCounter,
    /// Chunks given a vector that kept half of the one they held (after a
    /// change of model: `Provider::embed_passages`), counted once stored (at
    /// most a batch's `embedded`).
    pub reused: IntCounter,
    /// Chunks that could not be embedded (left out of semantic search).
    pub failed: IntCounter,
    /// 1 while this replica is the one embedding.
    pub leader: IntGauge,
    /// When this replica stored how many vectors, over the last `RATE_WINDOW`
    /// (the console's rate).
    recent: std::sync::Mutex<std::collections::VecDeque<(std::time::Instant, u64)>>,
    /// When this replica last wrote an item (ms since `epoch`; 0: never).
    ingest_seen: std::sync::atomic::AtomicU64,
    epoch: std::time::Instant,
}

impl Status {
    pub fn new(metrics: &crate::metrics::Metrics) -> Arc<Status> {
        let s = Status {
            backlog: IntGauge::new(
                "mnemosyne_embedding_backlog",
                "Chunks waiting for a vector (keyword-searchable already)",
            )
            .expect("valid metric"),
            embedded: IntCounter::new(
                "mnemosyne_embedded_chunks_total",
                "Chunks given a vector by this replica's embedding worker",
            )
            .expect("valid metric"),
            reused: IntCounter::new(
                "mnemosyne_embedding_reused_total",
                "Chunks re-embedded after a change of model that kept the half of their vector a model of both made",
            )
            .expect("valid metric"),
            failed: IntCounter::new(
                "mnemosyne_embedding_failures_total",
                "Chunks whose text could not be embedded (left out of semantic search)",
            )
            .expect("valid metric"),
            leader: IntGauge::new(
                "mnemosyne_embedding_leader",
                "1 while this replica runs the embedding worker",
            )
            .expect("valid metric"),
            recent: std::sync::Mutex::new(std::collections::VecDeque::new()),
            ingest_seen: std::sync::atomic::AtomicU64::new(0),
            epoch: std::time::Instant::now(),
        };
        for c in [
            Box::new(s.backlog.clone()) as Box<dyn prometheus::core::Collector>,
            Box::new(s.embedded.clone()),
            Box::new(s.reused.clone()),
            Box::new(s.failed.clone()),
            Box::new(s.leader.clone()),
        ] {
            metrics.register(c);
        }
        Arc::new(s)
    }

    /// `n` chunks were given their vector (counted, and in the rate).
    pub(crate) fn note_embedded(&self, n: u64) {
        self.embedded.inc_by(n);
        let now = std::time::Instant::now();
        let mut r = self.recent.lock().unwrap_or_else(|e| e.into_inner());
        while r
            .front()
            .is_some_and(|(at, _)| now.duration_since(*at) > RATE_WINDOW || r.len() >= RATE_SAMPLES)
        {
            r.pop_front();
        }
        r.push_back((now, n));
    }

    /// Chunks embedded by this replica over the last `RATE_WINDOW`.
    pub fn recent(&self) -> u64 {
        let now = std::time::Instant::now();
        let r = self.recent.lock().unwrap_or_else(|e| e.into_inner());
        r.iter()
            .filter(|(at, _)| now.duration_since(*at) <= RATE_WINDOW)
            .map(|(_, n)| n)
            .sum()
    }

    /// An item is being written on this replica (the worker yields to it).
    pub fn note_ingest(&self) {
        let ms = self.epoch.elapsed().as_millis() as u64;
        self.ingest_seen.store(ms.max(1), std::sync::atomic::Ordering::Relaxed);
    }

    /// How long ago this replica last wrote an item (None: never).
    fn since_ingest(&self) -> Option<Duration> {
        match self.ingest_seen.load(std::sync::atomic::Ordering::Relaxed) {
            0 => None,
            ms => Some(self.epoch.elapsed().saturating_sub(Duration::from_millis(ms))),
        }
    }

    /// Waits while ingest is busy on this replica (see `QUIET`, `YIELD_MAX`).
    pub(crate) async fn yield_to_ingest(&self) {
        let start = std::time::Instant::now();
        while let Some(since) = self.since_ingest() {
            if !holds(since, start.elapsed()) {
                break;
            }
            tokio::time::sleep(YIELD_POLL).await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::holds;
    use std::time::Duration;

    #[test]
    fn the_worker_holds_only_while_ingest_is_recent_and_never_past_the_limit() {
        let ms = Duration::from_millis;
        assert!(holds(ms(0), ms(0)));
        assert!(holds(ms(249), ms(1_999)));
        assert!(!holds(ms(250), ms(0)), "ingest quiet for QUIET: go");
        assert!(!holds(ms(0), ms(2_000)), "held YIELD_MAX: go anyway");
    }
}
