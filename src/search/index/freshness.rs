//! The freshness read every indexed search makes (`index_sequences`: how far
//! each of its libraries was written), shared between concurrent searches.
//!
//! A search's read must start after the search arrived, so that every write
//! acknowledged before it is seen (read-your-writes, on every replica). So a
//! search never joins a read already out: it joins the next one, which
//! starts once the read out has ended, for the libraries of every search
//! that joined it meanwhile. With nothing out, a search's read starts at
//! once (one search alone waits for nothing more than before); under load,
//! searches arriving within one read's round trip share one query instead
//! of queueing one each on the pool.
//!
//! Reads go out on a connection of their own, held between reads (one read
//! is out at a time): no pool acquire and no liveness ping before each read,
//! which was a second round trip per read. A read that fails or does not
//! answer within the pool's acquire timeout drops that connection, and one
//! that failed on a held connection (Postgres restarted meanwhile) is made
//! once more on a new one (one that timed out is not: a paused Postgres
//! would keep the searches waiting twice as long).
//!
//! Most searches make no read at all: while the replica's LISTEN
//! connection is trusted (it hears its own heartbeat), the sequences it
//! heard announced (`KnownSequences`, fed by `auth::cache::listen`) are
//! current for every write acknowledged so far, since a write is
//! acknowledged only after a fence every trusted replica answered after
//! applying what came before it; reads made while it is trusted are kept
//! there too. A library not known yet, or a listener not trusted, is read.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};

use prometheus::IntCounter;
use sqlx::{ConnectOptions, PgConnection, PgPool};
use tokio::sync::watch;
use tokio::time::timeout;

use crate::store::pg::index_changes::{self, KnownSequences};
use crate::turns::Turns;

/// Whether the sequences heard can be used right now (the auth caches'
/// `usable`: the listener connected and hearing its own heartbeat).
pub type Trusted = Arc<dyn Fn() -> bool + Send + Sync>;

/// Each library's sequence (absent: never written), or why it could not be
/// read.
pub type Sequences = Result<Arc<HashMap<String, i64>>, String>;

pub struct FreshnessReads {
    pg: PgPool,
    /// The connection reads are made on, taken out while a read is out and
    /// put back only when it answered (a read that failed or timed out
    /// leaves no connection in an unknown state behind).
    conn: Mutex<Option<PgConnection>>,
    /// The read out, and the next one: the libraries asked of it, and where
    /// its answer goes.
    turns: Turns<Next>,
    /// The sequences heard on the index channel, and when they hold.
    known: Option<(Arc<KnownSequences>, Trusted)>,
    /// Queries made, the searches that needed sequences, and those answered
    /// from the sequences heard.
    reads: IntCounter,
    asked: IntCounter,
    heard: IntCounter,
}

struct Next {
    libs: HashSet<String>,
    answer: watch::Sender<Option<Sequences>>,
}

impl FreshnessReads {
    pub fn new(pg: PgPool) -> Arc<FreshnessReads> {
        let counter = |name: &str, help: &str| IntCounter::new(name, help).expect("valid metric");
        Arc::new(FreshnessReads {
            pg,
            conn: Mutex::new(None),
            turns: Turns::default(),
            known: None,
            reads: counter(
                "mnemosyne_search_freshness_reads_total",
                "Reads of the libraries' index sequences made for searches (shared by the searches that arrived while the one before was out)",
            ),
            asked: counter(
                "mnemosyne_search_freshness_asked_total",
                "Searches that needed their libraries' index sequences",
            ),
            heard: counter(
                "mnemosyne_search_freshness_heard_total",
                "Searches whose libraries' index sequences were known from the announcements heard (no read)",
            ),
        })
    }

    /// Uses the sequences heard while `trusted` says they hold (a server's
    /// `serve`; without it every search reads).
    pub fn with_known(known: Arc<KnownSequences>, trusted: Trusted, pg: PgPool) -> Arc<FreshnessReads> {
        let mut reads = Arc::into_inner(Self::new(pg)).expect("just made");
        reads.known = Some((known, trusted));
        Arc::new(reads)
    }

    /// Its metrics, to register.
    pub fn collectors(&self) -> Vec<Box<dyn prometheus::core::Collector>> {
        vec![
            Box::new(self.reads.clone()),
            Box::new(self.asked.clone()),
            Box::new(self.heard.clone()),
        ]
    }

    /// The sequences of `libs`, read after this call began.
    pub async fn sequences(self: &Arc<Self>, libs: &[String]) -> Sequences {
        self.asked.inc();
        // Whether this read may be kept: the listener trusted before it
        // began, and nothing forgotten by the time it answered.
        let mut keep = None;
        if let Some((known, trusted)) = &self.known {
            if trusted() {
                let generation = known.generation();
                if let Some(seqs) = known.get(libs) {
                    self.heard.inc();
                    return Ok(Arc::new(seqs));
                }
                keep = Some((known, generation));
            }
        }
        let mut answer = self.turns.join(|next| match next {
            Some(next) => {
                next.libs.extend(libs.iter().cloned());
                next.answer.subscribe()
            }
            None => {
                let (tx, rx) = watch::channel(None);
                *next = Some(Next {
                    libs: libs.iter().cloned().collect(),
                    answer: tx,
                });
                // Its own task: a search that goes away (its client hung
                // up) takes no one else's answer with it.
                let me = self.clone();
                tokio::spawn(async move { me.read_next().await });
                rx
            }
        });
        let got = match answer.wait_for(Option::is_some).await {
            Ok(a) => a.clone().unwrap_or_else(|| Err("no answer".into())),
            Err(_) => Err("the freshness read ended without an answer".into()),
        };
        if let (Some((known, generation)), Ok(seqs)) = (keep, &got) {
            known.learn(generation, libs, seqs);
        }
        got
    }

    /// Waits for the read out to end, then makes the next one.
    async fn read_next(&self) {
        let Some((next, _out)) = self.turns.take().await else {
            return;
        };
        self.reads.inc();
        let libs: Vec<String> = next.libs.into_iter().collect();
        let read = self.read(&libs).await.map(|rows| Arc::new(rows.into_iter().collect()));
        next.answer.send_replace(Some(read));
    }

    /// One read on the held connection, or on a new one when none is held
    /// or the held one failed.
    async fn read(&self, libs: &[String]) -> Result<Vec<(String, i64)>, String> {
        let held = self.conn.lock().unwrap_or_else(|p| p.into_inner()).take();
        if let Some(c) = held {
            match self.read_on(c, libs).await {
                Err(Failed::Error(_)) => {} // Made once more, on a new connection.
                done => return done.map_err(Failed::into_message),
            }
        }
        let limit = self.pg.options().get_acquire_timeout();
        let c = match timeout(limit, self.pg.connect_options().connect()).await {
            Ok(Ok(c)) => c,
            Ok(Err(e)) => return Err(e.to_string()),
            Err(_) => return Err("connecting to Postgres timed out".into()),
        };
        self.read_on(c, libs).await.map_err(Failed::into_message)
    }

    /// A read on `c`, which is held again when it answered and dropped
    /// otherwise (it may be mid-query).
    async fn read_on(&self, mut c: PgConnection, libs: &[String]) -> Result<Vec<(String, i64)>, Failed> {
        let limit = self.pg.options().get_acquire_timeout();
        match timeout(limit, index_changes::sequences(&mut c, libs)).await {
            Ok(Ok(rows)) => {
                *self.conn.lock().unwrap_or_else(|p| p.into_inner()) = Some(c);
                Ok(rows)
            }
            Ok(Err(e)) => Err(Failed::Error(e.to_string())),
            Err(_) => Err(Failed::TimedOut),
        }
    }
}

/// Why a read on a connection gave no answer: a read that timed out is not
/// made again (a Postgres that does not answer would keep the searches
/// waiting twice as long).
enum Failed {
    Error(String),
    TimedOut,
}

impl Failed {
    fn into_message(self) -> String {
        match self {
            Failed::Error(e) => e,
            Failed::TimedOut => "the freshness read timed out".into(),
        }
    }
}
