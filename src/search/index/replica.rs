//! The per-library search indexes beside the graph (`LibraryIndex`), kept by
//! each replica: which libraries it holds, how a search finds them fresh,
//! how they catch up and how they are built.
//!
//! **Freshness.** Every write that changes what a library's search finds is
//! recorded in Postgres after its graph transaction committed and before it
//! is acknowledged (`pg::index_changes::record`: a per-library counter and a
//! change row naming the item). A search reads the counters of its libraries
//! (one primary-key read) and compares each with the sequence its index
//! applied: equal, the index answers; behind, the search first catches the
//! index up — it reads the change rows after the applied sequence, then the
//! changed items' chunks from the graph, replaces those items in the index and
//! commits with the new sequence. So a search that starts after a write was
//! acknowledged sees it, whichever replica answers.
//!
//! **Building.** A library this replica holds no index for (new replica,
//! wiped, corrupt, or its change rows pruned past what the index applied) is
//! built in the background from the graph in pages of `PAGE` chunks (bounded
//! memory), one library at a time; meanwhile its searches take the graph path
//! (`knowledge`), which ranks the same way. The counter is read before the
//! first page, so writes during the build are caught up after it.
//!
//! **Memory.** Indexes are memory-mapped; at most `max_open` libraries are
//! open at once (least recently searched closed first), so a search over
//! every library streams from disk rather than keeping every tenant. An open
//! index is closed only after `RESIDENCY` without a search: while every open
//! one was searched more recently, a library opened for a search answers it
//! and is closed after it, evicting none (so scopes that alternate over more
//! than `max_open` libraries cannot make a replica close and reopen — and
//! decode the vectors of — every tenant's index on each search).

use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use tracing::Instrument;

use prometheus::{IntCounter, IntGauge, Opts};
use sha2::{Digest, Sha256};
use sqlx::PgPool;

use super::vectors::{self, CodeCache};
use super::{Applied, LibraryIndex};
use crate::analysis::scoped;
use crate::store::graph::{GraphError, IndexSource};
use crate::store::pg::index_changes;

/// Chunks read from the graph per page of a build.
const PAGE: usize = 5_000;
/// Change rows read per page of a catch-up.
const CHANGES: i64 = 1_000;
/// How long an open index stays open after its last search, whatever else
/// is opened (see **Memory**).
const RESIDENCY: std::time::Duration = std::time::Duration::from_secs(30);

/// A library's index, open, and the lock its catch-ups take.
pub struct OpenLibrary {
    pub index: LibraryIndex,
    uid: String,
    applied: AtomicI64,
    catching_up: tokio::sync::Mutex<()>,
    last_used: AtomicU64,
    /// When it was last searched: milliseconds since its `SearchIndex` opened.
    used_at: AtomicU64,
}

impl OpenLibrary {
    pub fn uid(&self) -> &str {
        &self.uid
    }
}

struct Metrics {
    open: IntGauge,
    building: IntGauge,
    built_chunks: IntCounter,
    catch_ups: IntCounter,
    rebuilds: IntCounter,
    stale_fallbacks: IntCounter,
    evictions: IntCounter,
    passing: IntCounter,
}

impl Metrics {
    fn new() -> Self {
        let g = |n: &str, h: &str| IntGauge::with_opts(Opts::new(n, h)).expect("valid metric");
        let c = |n: &str, h: &str| IntCounter::with_opts(Opts::new(n, h)).expect("valid metric");
        Metrics {
            open: g(
                "mnemosyne_index_open_libraries",
                "Library search indexes open on this replica.",
            ),
            building: g(
                "mnemosyne_index_building_libraries",
                "Library search indexes being built from the graph on this replica.",
            ),
            built_chunks: c(
                "mnemosyne_index_built_chunks_total",
                "Chunks read from the graph into a library index being built.",
            ),
            catch_ups: c(
                "mnemosyne_index_catch_ups_total",
                "Library index catch-ups (changes applied before a search).",
            ),
            rebuilds: c(
                "mnemosyne_index_rebuilds_total",
                "Library indexes (re)built from the graph: missing, corrupt, deleted or pruned past.",
            ),
            stale_fallbacks: c(
                "mnemosyne_index_graph_fallbacks_total",
                "Library searches served by the graph path because the index was not ready.",
            ),
            evictions: c(
                "mnemosyne_index_evictions_total",
                "Library indexes closed to make room for another (idle at least the residency).",
            ),
            passing: c(
                "mnemosyne_index_passing_opens_total",
                "Library indexes opened for one search and closed after it: every open one was in use.",
            ),
        }
    }

    fn collectors(&self) -> Vec<Box<dyn prometheus::core::Collector>> {
        vec![
            Box::new(self.open.clone()),
            Box::new(self.building.clone()),
            Box::new(self.built_chunks.clone()),
            Box::new(self.catch_ups.clone()),
            Box::new(self.rebuilds.clone()),
            Box::new(self.stale_fallbacks.clone()),
            Box::new(self.evictions.clone()),
            Box::new(self.passing.clone()),
        ]
    }
}

/// The vector code cache's size and budget, read when `/metrics` is scraped.
struct CodeCacheBytes {
    cache: Arc<CodeCache>,
    held: IntGauge,
    budget: IntGauge,
}

impl CodeCacheBytes {
    fn new(cache: Arc<CodeCache>) -> Self {
        let g = |n: &str, h: &str| IntGauge::with_opts(Opts::new(n, h)).expect("valid metric");
        let budget = g(
            "mnemosyne_index_vector_cache_budget_bytes",
            "Most bytes of decoded vector codes kept on this replica (MNEMOSYNE_VECTOR_CACHE_CHUNKS).",
        );
        budget.set(i64::try_from(cache.budget()).unwrap_or(i64::MAX));
        CodeCacheBytes {
            cache,
            held: g(
                "mnemosyne_index_vector_cache_bytes",
                "Bytes of decoded vector codes kept on this replica now.",
            ),
            budget,
        }
    }
}

impl prometheus::core::Collector for CodeCacheBytes {
    fn desc(&self) -> Vec<&prometheus::core::Desc> {
        let mut d = self.held.desc();
        d.extend(self.budget.desc());
        d
    }

    fn collect(&self) -> Vec<prometheus::proto::MetricFamily> {
        self.held.set(i64::try_from(self.cache.bytes()).unwrap_or(i64::MAX));
        let mut m = self.held.collect();
        m.extend(self.budget.collect());
        m
    }
}

/// This replica's library indexes.
pub struct SearchIndex {
    root: PathBuf,
    pg: PgPool,
    max_open: usize,
    open: Mutex<HashMap<String, Arc<OpenLibrary>>>,
    building: Mutex<HashSet<String>>,
    builds: tokio::sync::Semaphore,
    clock: AtomicU64,
    /// When it opened (the origin of `OpenLibrary::used_at`).
    started: std::time::Instant,
    /// How long an open index is kept after its last search (`RESIDENCY`).
    residency: std::time::Duration,
    /// The Postgres database's identity, read once.
    epoch: tokio::sync::OnceCell<String>,
    /// Searches' freshness reads, shared while one is out.
    freshness: Arc<super::freshness::FreshnessReads>,
    /// The embedding model whose vectors the indexes hold ("": none; with
    /// the cross-language model, the pair's id: `embed::Embedder::is_paired`).
    model: String,
    /// The decoded vector codes of the indexes' segments, under one budget.
    codes: Arc<CodeCache>,
    metrics: Metrics,
    /// This server's use of the directory's lock (`lock`).
    dir: Option<DirHold>,
}

/// The file under an index directory that the serving process holds locked
/// (and in which it writes its pid and host).
const LOCK_FILE: &str = ".mnemosyne-serve.lock";

/// The index directories this process holds the lock of: how many of its
/// servers use each (they may share one: a test process, a server
/// restarted in it), and the locked file, closed (the lock released) when
/// the last of them stops.
fn locked_here() -> std::sync::MutexGuard<'static, HashMap<PathBuf, (usize, std::fs::File)>> {
    static LOCKED: std::sync::OnceLock<Mutex<HashMap<PathBuf, (usize, std::fs::File)>>> = std::sync::OnceLock::new();
    LOCKED
        .get_or_init(|| Mutex::new(HashMap::new()))
        .lock()
        .unwrap_or_else(|p| p.into_inner())
}

/// One server's use of a locked index directory (`SearchIndex::lock`).
struct DirHold(PathBuf);

impl Drop for DirHold {
    fn drop(&mut self) {
        let mut held = locked_here();
        if let Some((n, _)) = held.get_mut(&self.0) {
            *n -= 1;
            if *n == 0 {
                held.remove(&self.0);
            }
        }
    }
}

fn canonical(p: &Path) -> PathBuf {
    std::fs::canonicalize(p).unwrap_or_else(|_| p.to_owned())
}

/// The directory name of a library's index (uids may hold any character).
fn dir_name(uid: &str) -> String {
    hex::encode(&Sha256::digest(uid.as_bytes())[..16])
}

impl SearchIndex {
    /// Opens (creating it) the index directory; fails when it cannot be
    /// written, so `serve` stops at start with the reason. Semantic searches
    /// keep at most `vector_chunks` chunks' decoded int8 codes in memory
    /// (`vectors::quantized_len(dim)` bytes each, `dim` the model's vector
    /// length: `Embedder::dim`), over every library.
    pub fn open(
        root: &Path,
        pg: PgPool,
        max_open: usize,
        model: &str,
        dim: usize,
        vector_chunks: usize,
    ) -> anyhow::Result<Self> {
        let fail = |e: std::io::Error| anyhow::anyhow!("MNEMOSYNE_INDEX_DIR={}: cannot write: {e}", root.display());
        std::fs::create_dir_all(root).map_err(fail)?;
        let probe = root.join(format!(".probe-{}", uuid::Uuid::new_v4()));
        std::fs::write(&probe, b"ok").map_err(fail)?;
        std::fs::remove_file(&probe).map_err(fail)?;
        Ok(SearchIndex {
            root: root.to_owned(),
            freshness: super::freshness::FreshnessReads::new(pg.clone()),
            pg,
            max_open: max_open.max(1),
            open: Mutex::new(HashMap::new()),
            building: Mutex::new(HashSet::new()),
            builds: tokio::sync::Semaphore::new(1),
            clock: AtomicU64::new(0),
            started: std::time::Instant::now(),
            residency: RESIDENCY,
            epoch: tokio::sync::OnceCell::new(),
            model: model.to_owned(),
            codes: CodeCache::new(vector_chunks.saturating_mul(vectors::quantized_len(dim))),
            metrics: Metrics::new(),
            dir: None,
        })
    }

    /// Searches use the index sequences this replica heard announced while
    /// `trusted` holds, instead of a read each (`freshness`).
    pub fn with_known(
        mut self,
        known: Arc<crate::store::pg::index_changes::KnownSequences>,
        trusted: super::freshness::Trusted,
    ) -> Self {
        self.freshness = super::freshness::FreshnessReads::with_known(known, trusted, self.pg.clone());
        self
    }

    /// Takes the directory for this process (`serve`): two replicas given
    /// one `MNEMOSYNE_INDEX_DIR` (a shared volume) would each write and
    /// garbage-collect the other's segments, so the second one refuses to
    /// start, naming the directory and the process holding it. The lock is
    /// the operating system's (`flock`, released when the process ends,
    /// however it ends), held for the process's life once taken; servers of
    /// one process (tests, a server restarted in it) share it.
    pub fn lock(mut self) -> anyhow::Result<Self> {
        use std::io::{Read, Seek, Write};
        let root = canonical(&self.root);
        let mut held = locked_here();
        if let Some((n, _)) = held.get_mut(&root) {
            *n += 1;
            drop(held);
            self.dir = Some(DirHold(root));
            return Ok(self);
        }
        let fail =
            |e: std::io::Error| anyhow::anyhow!("MNEMOSYNE_INDEX_DIR={}: cannot write: {e}", self.root.display());
        let mut file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(root.join(LOCK_FILE))
            .map_err(fail)?;
        match file.try_lock() {
            Ok(()) => {
                let host = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap_or_default();
                file.set_len(0).map_err(fail)?;
                file.rewind().map_err(fail)?;
                writeln!(file, "pid {} host {}", std::process::id(), host.trim()).map_err(fail)?;
                held.insert(root.clone(), (1, file));
                drop(held);
                self.dir = Some(DirHold(root));
                Ok(self)
            }
            Err(std::fs::TryLockError::WouldBlock) => {
                let mut holder = String::new();
                let _ = file.read_to_string(&mut holder);
                let holder = holder.trim();
                anyhow::bail!(
                    "MNEMOSYNE_INDEX_DIR={} is in use by another mnemosyne process ({}): each replica needs an index directory of its own",
                    self.root.display(),
                    if holder.is_empty() { "unknown" } else { holder }
                )
            }
            Err(std::fs::TryLockError::Error(e)) => Err(fail(e)),
        }
    }

    /// The index's metrics, to register.
    pub fn collectors(&self) -> Vec<Box<dyn prometheus::core::Collector>> {
        let mut all = self.metrics.collectors();
        all.extend(self.freshness.collectors());
        all.push(Box::new(CodeCacheBytes::new(self.codes.clone())));
        all
    }

    pub fn root(&self) -> &Path {
        &self.root
    }

    fn path_of(&self, uid: &str) -> PathBuf {
        self.root.join(dir_name(uid))
    }

    fn touch(&self, lib: &OpenLibrary) {
        lib.last_used
            .store(self.clock.fetch_add(1, Ordering::Relaxed), Ordering::Relaxed);
        lib.used_at.store(self.now_ms(), Ordering::Relaxed);
    }

    fn now_ms(&self) -> u64 {
        self.started.elapsed().as_millis() as u64
    }

    /// The open index of `uid`, opening what is on disk; None when there is
    /// none (or it is unreadable: it is removed, to be built again).
    async fn epoch(&self) -> Result<&str, sqlx::Error> {
        self.epoch
            .get_or_try_init(|| index_changes::epoch(&self.pg))
            .await
            .map(String::as_str)
    }

    fn opened(&self, uid: &str, epoch: &str) -> Option<Arc<OpenLibrary>> {
        if let Some(l) = self.open.lock().unwrap_or_else(|p| p.into_inner()).get(uid) {
            self.touch(l);
            return Some(l.clone());
        }
        let path = self.path_of(uid);
        if !path.join("meta.json").exists() {
            return None;
        }
        let opened = LibraryIndex::open_or_create(&path, self.codes.clone()).and_then(|index| {
            let applied = index.applied()?;
            if applied.library_uid != uid
                || applied.analysis != scoped::ANALYSIS_VERSION
                || applied.epoch != epoch
                || applied.model != self.model
            {
                return Err(super::IndexError::Corrupt(format!(
                    "holds library {:?} in analysis {} of database {:?} with vectors of {:?}",
                    applied.library_uid, applied.analysis, applied.epoch, applied.model
                )));
            }
            Ok((index, applied.seq))
        });
        match opened {
            Ok((index, seq)) => Some(self.install(uid, index, seq)),
            Err(e) => {
                tracing::warn!(library = uid, error = %e, path = %path.display(), "search index unreadable: rebuilding it from the graph");
                let _ = std::fs::remove_dir_all(&path);
                None
            }
        }
    }

    /// Keeps a just-opened index open, closing the least recently searched
    /// one idle for at least the residency when `max_open` are open; when
    /// none is, the index is only lent to the search that opened it.
    fn install(&self, uid: &str, index: LibraryIndex, seq: i64) -> Arc<OpenLibrary> {
        let lib = Arc::new(OpenLibrary {
            index,
            uid: uid.to_owned(),
            applied: AtomicI64::new(seq),
            catching_up: tokio::sync::Mutex::new(()),
            last_used: AtomicU64::new(0),
            used_at: AtomicU64::new(0),
        });
        self.touch(&lib);
        let mut open = self.open.lock().unwrap_or_else(|p| p.into_inner());
        if !open.contains_key(uid) && open.len() >= self.max_open {
            let idle_since = self.now_ms().saturating_sub(self.residency.as_millis() as u64);
            let oldest = open
                .iter()
                .filter(|(_, l)| l.used_at.load(Ordering::Relaxed) <= idle_since)
                .min_by_key(|(_, l)| l.last_used.load(Ordering::Relaxed))
                .map(|(k, _)| k.clone());
            match oldest {
                Some(k) => {
                    open.remove(&k);
                    self.metrics.evictions.inc();
                }
                None => {
                    self.metrics.passing.inc();
                    return lib;
                }
            }
        }
        open.insert(uid.to_owned(), lib.clone());
        self.metrics.open.set(open.len() as i64);
        lib
    }

    fn forget(&self, uid: &str) {
        let mut open = self.open.lock().unwrap_or_else(|p| p.into_inner());
        open.remove(uid);
        self.metrics.open.set(open.len() as i64);
    }

    /// Whether a scope of `n` libraries is wider than the indexes this
    /// replica keeps open (such a search opens, builds and loads nothing).
    pub fn is_wide(&self, n: usize) -> bool {
        n > self.max_open
    }

    /// The libraries of `libs` whose index is fresh (caught up to every
    /// acknowledged write), ready to answer. The others — not built yet,
    /// being built, or when freshness cannot be checked (Postgres down) —
    /// take the graph path; a missing one starts building.
    pub async fn ready(self: &Arc<Self>, source: &IndexSource, libs: &[String]) -> HashMap<String, Arc<OpenLibrary>> {
        let mut out = HashMap::new();
        if libs.is_empty() {
            return out;
        }
        let read = async {
            let epoch = self.epoch().await.map_err(|e| e.to_string())?.to_owned();
            Ok::<_, String>((epoch, self.freshness.sequences(libs).await?))
        };
        let (epoch, seqs) = match read.await {
            Ok(read) => read,
            Err(e) => {
                tracing::warn!(error = %e, "search index: cannot check freshness; searching the graph");
                self.metrics.stale_fallbacks.inc_by(libs.len() as u64);
                return out;
            }
        };
        // A scope wider than the open libraries (a staff search over every
        // library) uses the indexes already open and nothing else: it opens
        // and builds none, so it cannot evict or load every tenant.
        let wide = self.is_wide(libs.len());
        for uid in libs {
            let target = seqs.get(uid).copied().unwrap_or(0);
            let found = match wide {
                true => self.open.lock().unwrap_or_else(|p| p.into_inner()).get(uid).cloned(),
                false => self.opened(uid, &epoch),
            };
            let Some(lib) = found else {
                if wide {
                    self.metrics.stale_fallbacks.inc();
                    continue;
                }
                self.spawn_build(source, uid);
                self.metrics.stale_fallbacks.inc();
                continue;
            };
            if lib.applied.load(Ordering::Acquire) >= target {
                out.insert(uid.clone(), lib);
                continue;
            }
            match self.catch_up(source, &lib, target).await {
                Ok(true) => {
                    out.insert(uid.clone(), lib);
                }
                Ok(false) => {
                    if let Err(e) = self.remove(uid) {
                        tracing::warn!(library = %uid, error = %e, "search index: could not remove a stale index");
                    }
                    self.spawn_build(source, uid);
                    self.metrics.stale_fallbacks.inc();
                }
                Err(e) => {
                    tracing::warn!(library = %uid, error = %e, "search index: catch-up failed; searching the graph");
                    self.metrics.stale_fallbacks.inc();
                }
            }
        }
        out
    }

    /// Applies the library's changes up to at least `target`; false when it
    /// needs a build instead (the whole library changed, or the change rows it
    /// needs were pruned).
    async fn catch_up(&self, source: &IndexSource, lib: &Arc<OpenLibrary>, target: i64) -> Result<bool, GraphError> {
        let pg = |e: sqlx::Error| GraphError::Unavailable(format!("postgres: {e}"));
        let _turn = lib.catching_up.lock().await;
        self.metrics.catch_ups.inc();
        while lib.applied.load(Ordering::Acquire) < target {
            let after = lib.applied.load(Ordering::Acquire);
            let page = index_changes::page(&self.pg, &lib.uid, after, CHANGES)
                .await
                .map_err(|e| GraphError::Unavailable(format!("postgres: {e}")))?;
            let Some(last) = page.last().map(|c| c.seq) else {
                return Ok(false); // counted but not kept: pruned
            };
            if page[0].seq != after + 1 || page.iter().any(|c| c.item_uid.is_none()) {
                return Ok(false);
            }
            let mut items: Vec<String> = page.into_iter().filter_map(|c| c.item_uid).collect();
            items.sort();
            items.dedup();
            let chunks = source.item_chunks(&lib.uid, &self.model, &items).await?;
            let applied = Applied {
                seq: last,
                library_uid: lib.uid.clone(),
                analysis: scoped::ANALYSIS_VERSION,
                epoch: self.epoch().await.map_err(pg)?.to_owned(),
                model: self.model.clone(),
            };
            let l = lib.clone();
            blocking(move || l.index.apply(&items, &chunks, &applied)).await?;
            lib.applied.store(last, Ordering::Release);
        }
        Ok(true)
    }

    /// Starts building `uid`'s index in the background, unless it is being
    /// built already.
    fn spawn_build(self: &Arc<Self>, source: &IndexSource, uid: &str) {
        if !self
            .building
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(uid.to_owned())
        {
            return;
        }
        let (ix, source, uid) = (self.clone(), source.clone(), uid.to_owned());
        // Its lines name the build and, through the span's parent, the
        // request that started it (which it may outlive).
        let span = tracing::info_span!("index_build", library = %uid);
        tokio::spawn(
            async move {
                let out = ix.build(&source, &uid).await;
                ix.building.lock().unwrap_or_else(|p| p.into_inner()).remove(&uid);
                if let Err(e) = out {
                    tracing::warn!(library = %uid, error = %e, "search index: build failed; the next search tries again");
                }
            }
            .instrument(span),
        );
    }

    /// Builds `uid`'s index from the graph, replacing what is on disk.
    pub async fn build(&self, source: &IndexSource, uid: &str) -> Result<u64, GraphError> {
        let _one = self
            .builds
            .acquire()
            .await
            .map_err(|_| GraphError::Unavailable("closing".into()))?;
        self.metrics.building.inc();
        let out = self.build_now(source, uid).await;
        self.metrics.building.dec();
        out
    }

    async fn build_now(&self, source: &IndexSource, uid: &str) -> Result<u64, GraphError> {
        let pg = |e: sqlx::Error| GraphError::Unavailable(format!("postgres: {e}"));
        let err = |e: super::IndexError| GraphError::Query(e.to_string());
        // The sequence first: whatever is written after it is caught up later.
        let seq = index_changes::sequences(&self.pg, &[uid.to_owned()])
            .await
            .map_err(pg)?
            .first()
            .map(|(_, s)| *s)
            .unwrap_or(0);
        self.metrics.rebuilds.inc();
        let path = self.path_of(uid);
        let staging = self.root.join(format!("{}.building", dir_name(uid)));
        let _ = std::fs::remove_dir_all(&staging);
        let index = Arc::new(LibraryIndex::open_or_create(&staging, self.codes.clone()).map_err(err)?);
        let mut total = 0u64;
        let mut pages = source.library(uid, &self.model, PAGE).await?;
        while let Some(chunks) = pages.next().await? {
            total += chunks.len() as u64;
            self.metrics.built_chunks.inc_by(chunks.len() as u64);
            let ix = index.clone();
            blocking(move || ix.add(&chunks)).await?;
        }
        let applied = Applied {
            seq,
            library_uid: uid.to_owned(),
            analysis: scoped::ANALYSIS_VERSION,
            epoch: self.epoch().await.map_err(pg)?.to_owned(),
            model: self.model.clone(),
        };
        let ix = index.clone();
        blocking(move || ix.commit(&applied).and_then(|_| ix.close_writer())).await?;
        drop(index);
        // Swap in: searches holding the old index keep reading its files.
        self.forget(uid);
        let _ = std::fs::remove_dir_all(&path);
        std::fs::rename(&staging, &path).map_err(|e| GraphError::Query(format!("index: {e}")))?;
        let index = LibraryIndex::open_or_create(&path, self.codes.clone()).map_err(err)?;
        self.install(uid, index, seq);
        tracing::info!(library = %uid, chunks = total, seq, "search index built");
        Ok(total)
    }

    /// Sequence applied and chunk count of every library index on disk
    /// (`mnemosyne index status`), by library uid.
    pub fn status(&self) -> Vec<IndexStatus> {
        let mut out = Vec::new();
        let Ok(dir) = std::fs::read_dir(&self.root) else {
            return out;
        };
        for e in dir.flatten() {
            let path = e.path();
            if !path.join("meta.json").exists() || path.extension().is_some() {
                continue;
            }
            if let Ok(ix) = LibraryIndex::open_or_create(&path, self.codes.clone()) {
                if let (Ok(a), Ok((chunks, vectors))) = (ix.applied(), ix.counts()) {
                    out.push(IndexStatus {
                        library_uid: a.library_uid,
                        seq: a.seq,
                        chunks,
                        vectors,
                        model: a.model,
                        disk_bytes: ix.disk_bytes(),
                    });
                }
            }
        }
        out.sort_by(|a, b| a.library_uid.cmp(&b.library_uid));
        out
    }

    /// Removes `uid`'s index from disk (`mnemosyne index rebuild`: the
    /// next search, on each replica, builds it again).
    pub fn remove(&self, uid: &str) -> std::io::Result<()> {
        self.forget(uid);
        match std::fs::remove_dir_all(self.path_of(uid)) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(e),
            _ => Ok(()),
        }
    }
}

/// One library index on disk (`mnemosyne index status`).
#[derive(Clone, Debug, serde::Serialize)]
pub struct IndexStatus {
    pub library_uid: String,
    /// The change sequence it reflects.
    pub seq: i64,
    /// Live chunks, and those of them with a vector.
    pub chunks: u64,
    pub vectors: u64,
    /// The embedding model of its vectors ("": none).
    pub model: String,
    pub disk_bytes: u64,
}

/// Runs index work (disk, CPU) off the async workers.
/// `blocking`, or at once where the search runs when the work is small
/// (`inline`): for a light search the hand-off to the blocking pool and back
/// cost more than the work (issue 52: c=1 p50 −0.08 ms, the server's CPU per
/// search −14 %).
pub(crate) async fn blocking_unless<T: Send + 'static>(
    inline: bool,
    f: impl FnOnce() -> Result<T, super::IndexError> + Send + 'static,
) -> Result<T, GraphError> {
    match inline {
        // A panic is the search's error, as the pool's `JoinError` makes it.
        true => std::panic::catch_unwind(std::panic::AssertUnwindSafe(f))
            .map_err(|_| GraphError::Query("index task: panicked".into()))?
            .map_err(|e| GraphError::Query(e.to_string())),
        false => blocking(f).await,
    }
}

pub(crate) async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> Result<T, super::IndexError> + Send + 'static,
) -> Result<T, GraphError> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| GraphError::Query(format!("index task: {e}")))?
        .map_err(|e| GraphError::Query(e.to_string()))
}

/// An item's citation fields.
#[cfg(test)]
mod tests {
    use super::*;

    fn library(ix: &SearchIndex, uid: &str) -> LibraryIndex {
        LibraryIndex::open_or_create(&ix.path_of(uid), ix.codes.clone()).unwrap()
    }

    fn open(ix: &SearchIndex) -> Vec<String> {
        let mut v: Vec<_> = ix.open.lock().unwrap().keys().cloned().collect();
        v.sort();
        v
    }

    /// Before: each search over a library not open closed the least
    /// recently searched one, so two scopes alternating over more than
    /// `max_open` libraries closed and reopened indexes on every search.
    #[tokio::test]
    async fn scopes_alternating_past_the_open_indexes_close_none_in_use() {
        let dir = std::env::temp_dir().join(format!("mnemosyne-residency-{}", uuid::Uuid::new_v4()));
        let pg = PgPool::connect_lazy("postgres://127.0.0.1:1/none").unwrap();
        let mut ix = SearchIndex::open(&dir, pg, 2, "", 384, 0).unwrap();
        ix.install("a", library(&ix, "a"), 0);
        ix.install("b", library(&ix, "b"), 0);
        // c and d, alternating: each is lent to its search; a and b stay open.
        for uid in ["c", "d", "c", "d"] {
            assert_eq!(ix.install(uid, library(&ix, uid), 0).uid(), uid);
            assert_eq!(open(&ix), ["a", "b"]);
        }
        assert_eq!((ix.metrics.evictions.get(), ix.metrics.passing.get()), (0, 4));
        // Idle past the residency, the least recently searched one makes room.
        ix.residency = std::time::Duration::ZERO;
        ix.install("c", library(&ix, "c"), 0);
        assert_eq!(open(&ix), ["b", "c"]);
        // One already open is replaced in place, closing nothing.
        ix.install("c", library(&ix, "c"), 0);
        assert_eq!(open(&ix), ["b", "c"]);
        assert_eq!((ix.metrics.evictions.get(), ix.metrics.passing.get()), (1, 4));
        let _ = std::fs::remove_dir_all(&dir);
    }
}
