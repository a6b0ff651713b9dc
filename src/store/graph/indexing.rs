//! The per-library search index beside the graph (`search::index`), kept by
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
//! every library streams from disk rather than keeping every tenant.

use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use tracing::Instrument;

use neo4rs::{query, Row};
use prometheus::{IntCounter, IntGauge, Opts};
use sha2::{Digest, Sha256};
use sqlx::PgPool;

use super::{GraphError, GraphStore};
use crate::search::index::vectors::{self, CodeCache};
use crate::search::index::{Applied, IndexedChunk, LibraryIndex};
use crate::search::scoped;
use crate::store::pg::index_changes;

/// Chunks read from the graph per page of a build.
const PAGE: usize = 5_000;
/// Change rows read per page of a catch-up.
const CHANGES: i64 = 1_000;

/// A library's index, open, and the lock its catch-ups take.
pub struct OpenLibrary {
    pub index: LibraryIndex,
    uid: String,
    applied: AtomicI64,
    catching_up: tokio::sync::Mutex<()>,
    last_used: AtomicU64,
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
    /// The Postgres database's identity, read once.
    epoch: tokio::sync::OnceCell<String>,
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
            pg,
            max_open: max_open.max(1),
            open: Mutex::new(HashMap::new()),
            building: Mutex::new(HashSet::new()),
            builds: tokio::sync::Semaphore::new(1),
            clock: AtomicU64::new(0),
            epoch: tokio::sync::OnceCell::new(),
            model: model.to_owned(),
            codes: CodeCache::new(vector_chunks.saturating_mul(vectors::quantized_len(dim))),
            metrics: Metrics::new(),
            dir: None,
        })
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
                return Err(crate::search::index::IndexError::Corrupt(format!(
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

    fn install(&self, uid: &str, index: LibraryIndex, seq: i64) -> Arc<OpenLibrary> {
        let lib = Arc::new(OpenLibrary {
            index,
            uid: uid.to_owned(),
            applied: AtomicI64::new(seq),
            catching_up: tokio::sync::Mutex::new(()),
            last_used: AtomicU64::new(0),
        });
        self.touch(&lib);
        let mut open = self.open.lock().unwrap_or_else(|p| p.into_inner());
        open.insert(uid.to_owned(), lib.clone());
        while open.len() > self.max_open {
            let Some(oldest) = open
                .iter()
                .filter(|(k, _)| k.as_str() != uid)
                .min_by_key(|(_, l)| l.last_used.load(Ordering::Relaxed))
                .map(|(k, _)| k.clone())
            else {
                break;
            };
            open.remove(&oldest);
        }
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
    pub async fn ready(&self, graph: &GraphStore, libs: &[String]) -> HashMap<String, Arc<OpenLibrary>> {
        let mut out = HashMap::new();
        if libs.is_empty() {
            return out;
        }
        let read = async {
            let epoch = self.epoch().await?.to_owned();
            Ok::<_, sqlx::Error>((epoch, index_changes::sequences(&self.pg, libs).await?))
        };
        let (epoch, seqs): (String, HashMap<String, i64>) = match read.await {
            Ok((epoch, s)) => (epoch, s.into_iter().collect()),
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
                self.spawn_build(graph, uid);
                self.metrics.stale_fallbacks.inc();
                continue;
            };
            if lib.applied.load(Ordering::Acquire) >= target {
                out.insert(uid.clone(), lib);
                continue;
            }
            match self.catch_up(graph, &lib, target).await {
                Ok(true) => {
                    out.insert(uid.clone(), lib);
                }
                Ok(false) => {
                    if let Err(e) = self.remove(uid) {
                        tracing::warn!(library = %uid, error = %e, "search index: could not remove a stale index");
                    }
                    self.spawn_build(graph, uid);
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
    async fn catch_up(&self, graph: &GraphStore, lib: &Arc<OpenLibrary>, target: i64) -> Result<bool, GraphError> {
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
            let chunks = item_chunks(graph, &lib.uid, &self.model, &items).await?;
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
    fn spawn_build(&self, graph: &GraphStore, uid: &str) {
        if !self
            .building
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(uid.to_owned())
        {
            return;
        }
        let (graph, uid) = (graph.clone(), uid.to_owned());
        // Its lines name the build and, through the span's parent, the
        // request that started it (which it may outlive).
        let span = tracing::info_span!("index_build", library = %uid);
        tokio::spawn(
            async move {
                let Some(ix) = graph.index.clone() else { return };
                let out = ix.build(&graph, &uid).await;
                ix.building.lock().unwrap_or_else(|p| p.into_inner()).remove(&uid);
                if let Err(e) = out {
                    tracing::warn!(library = %uid, error = %e, "search index: build failed; the next search tries again");
                }
            }
            .instrument(span),
        );
    }

    /// Builds `uid`'s index from the graph, replacing what is on disk.
    pub async fn build(&self, graph: &GraphStore, uid: &str) -> Result<u64, GraphError> {
        let _one = self
            .builds
            .acquire()
            .await
            .map_err(|_| GraphError::Unavailable("closing".into()))?;
        self.metrics.building.inc();
        let out = self.build_now(graph, uid).await;
        self.metrics.building.dec();
        out
    }

    async fn build_now(&self, graph: &GraphStore, uid: &str) -> Result<u64, GraphError> {
        let pg = |e: sqlx::Error| GraphError::Unavailable(format!("postgres: {e}"));
        let err = |e: crate::search::index::IndexError| GraphError::Query(e.to_string());
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
        let (key, tkey) = (scoped::library_key(uid), scoped::title_key(uid));
        let mut total = 0u64;
        let mut sources: HashMap<String, Source> = HashMap::new();
        // One statement, read in pages (paging by uid made ArcadeDB sort the
        // whole library for every page).
        let q = query(include_str!("../../../cypher/index_library.cypher"))
            .param("lib", uid)
            .param("model", self.model.as_str());
        let mut pages = graph.stream("index_library.cypher", q, PAGE).await?;
        while let Some(rows) = pages.next().await? {
            let mut chunks = Vec::with_capacity(rows.len());
            for r in &rows {
                if let Some(c) = chunk_of(r, &key, &tkey)? {
                    chunks.push(c);
                }
            }
            drop(rows);
            let missing: Vec<String> = {
                let mut m: Vec<String> = chunks
                    .iter()
                    .map(|c| c.item_uid.clone())
                    .filter(|i| !sources.contains_key(i))
                    .collect();
                m.sort();
                m.dedup();
                m
            };
            sources.extend(item_sources(graph, uid, &missing).await?);
            for c in &mut chunks {
                if let Some(s) = sources.get(&c.item_uid) {
                    s.fill(c);
                }
            }
            // Keep the map small (an item seen again is read again).
            if sources.len() > 50_000 {
                sources.clear();
            }
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

/// Days the change rows are kept: a replica whose index is older rebuilds it.
pub const CHANGES_KEPT_DAYS: u32 = 7;

/// Sweeps change rows older than `CHANGES_KEPT_DAYS` now and then every
/// `every` (a server task; every replica may run it, a sweep is idempotent).
pub async fn sweep_loop(pool: PgPool, every: std::time::Duration) {
    let mut tick = tokio::time::interval(every);
    loop {
        tick.tick().await;
        match index_changes::sweep(&pool, CHANGES_KEPT_DAYS).await {
            Ok(0) => {}
            Ok(n) => tracing::info!(deleted = n, "search index change rows past retention deleted"),
            Err(e) => tracing::warn!(error = %e, "search index change sweep failed; retried on the next tick"),
        }
    }
}

/// Seconds after which a write's intent is recorded by the sweep (a write
/// still running then records its change again: harmless), after which it
/// is recorded once more (a graph commit that landed late), and after which
/// it is dropped.
pub const INTENT_GRACE_SECS: f64 = 5.0;
pub const INTENT_LATE_SECS: f64 = 540.0;
pub const INTENT_KEPT_SECS: f64 = 600.0;

/// Records the changes of writes that committed in the graph but could not
/// record them (Postgres failed between the two, or the caller gave up), and
/// whose client never retried: every `every`, the intents older than
/// `INTENT_GRACE_SECS`, and once more past `INTENT_LATE_SECS`
/// (`pg::index_changes::sweep_intents`). Every replica runs it; each intent
/// is taken by one of them.
pub async fn intent_sweep_loop(pool: PgPool, every: std::time::Duration) {
    let mut tick = tokio::time::interval(every);
    loop {
        tick.tick().await;
        match index_changes::sweep_intents(&pool, INTENT_GRACE_SECS, INTENT_LATE_SECS).await {
            Ok(0) => {}
            Ok(n) => tracing::warn!(
                changes = n,
                "recorded search index changes whose writes could not record them"
            ),
            Err(e) => {
                tracing::debug!(error = %e, "search index intent sweep failed; retried on the next tick");
                continue;
            }
        }
        if let Err(e) = index_changes::expire_intents(&pool, INTENT_KEPT_SECS).await {
            tracing::debug!(error = %e, "expiring search index intents failed; retried on the next tick");
        }
    }
}

/// Runs index work (disk, CPU) off the async workers.
async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> Result<T, crate::search::index::IndexError> + Send + 'static,
) -> Result<T, GraphError> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| GraphError::Query(format!("index task: {e}")))?
        .map_err(|e| GraphError::Query(e.to_string()))
}

/// An item's citation fields.
struct Source {
    source_uri: Option<String>,
    mime_type: Option<String>,
    updated_at: Option<String>,
}

impl Source {
    fn fill(&self, c: &mut IndexedChunk) {
        c.source_uri = self.source_uri.clone();
        c.mime_type = self.mime_type.clone();
        c.updated_at = self.updated_at.clone();
    }
}

/// A chunk row as the index holds it; None when it vanished while read.
fn chunk_of(r: &Row, key: &str, tkey: &str) -> Result<Option<IndexedChunk>, GraphError> {
    let (Some(uid), Some(item_uid), Some(collection_uid), Some(scoped)) = (
        r.get::<Option<String>>("uid")?,
        r.get::<Option<String>>("item_uid")?,
        r.get::<Option<String>>("collection_uid")?,
        r.get::<Option<String>>("scoped")?,
    ) else {
        return Ok(None);
    };
    let (text_terms, title_terms) = crate::search::index::split_scoped(&scoped, key, tkey);
    Ok(Some(IndexedChunk {
        chunk_uid: uid,
        item_uid,
        item_title: r.get::<Option<String>>("item_title")?.unwrap_or_default(),
        collection_uid,
        ordinal: r.get::<Option<i64>>("ordinal")?.unwrap_or(0),
        text: r.get::<Option<String>>("text")?.unwrap_or_default(),
        text_terms,
        title_terms,
        dl: r.get::<Option<i64>>("dl")?.unwrap_or(0),
        source_uri: None,
        mime_type: None,
        updated_at: None,
        vector: super::vectors::row_vector(r)?,
    }))
}

async fn item_sources(graph: &GraphStore, lib: &str, items: &[String]) -> Result<HashMap<String, Source>, GraphError> {
    let mut out = HashMap::new();
    if items.is_empty() {
        return Ok(out);
    }
    let q = query(include_str!("../../../cypher/index_items.cypher"))
        .param("items", items.to_vec())
        .param("lib", lib);
    for r in graph.rows_from_leader("index_items.cypher", q).await? {
        let Some(uid) = r.get::<Option<String>>("uid")? else {
            continue;
        };
        out.insert(
            uid,
            Source {
                source_uri: r.get("source_uri")?,
                mime_type: r.get("mime_type")?,
                updated_at: r.get("updated_at")?,
            },
        );
    }
    Ok(out)
}

/// Every chunk the `items` of `lib` hold now, with their citation fields.
async fn item_chunks(
    graph: &GraphStore,
    lib: &str,
    model: &str,
    items: &[String],
) -> Result<Vec<IndexedChunk>, GraphError> {
    let (key, tkey) = (scoped::library_key(lib), scoped::title_key(lib));
    let mut chunks = Vec::new();
    for batch in items.chunks(500) {
        let q = query(include_str!("../../../cypher/index_item_chunks.cypher"))
            .param("items", batch.to_vec())
            .param("lib", lib)
            .param("model", model);
        for r in graph.rows_from_leader("index_item_chunks.cypher", q).await? {
            if let Some(c) = chunk_of(&r, &key, &tkey)? {
                chunks.push(c);
            }
        }
        let sources = item_sources(graph, lib, batch).await?;
        for c in &mut chunks {
            if let Some(s) = sources.get(&c.item_uid) {
                s.fill(c);
            }
        }
    }
    Ok(chunks)
}
