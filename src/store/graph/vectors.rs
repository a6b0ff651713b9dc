//! Chunk vectors: their durable embedding state in the graph, and the
//! in-process per-library cache that semantic search scores exactly.
//!
//! **State.** Ingest creates every chunk with `pending_lib` (its library's
//! uid, indexed): it waits for a vector. The embedding worker
//! (`crate::service::embedding`) takes pending chunks library by library, and
//! stores each vector with the model's id and a per-library sequence number
//! (`Library.vectors`, bumped by every store), removing `pending_lib` — only
//! if the chunk still holds the text it embedded (an item replaced meanwhile
//! has new chunks, pending again). A chunk whose text never embeds is marked
//! `vec_failed` and left out. A different model: `backfill` marks every chunk
//! without this model's vector pending again.
//!
//! **Cache.** Semantic search scores every vector of the caller's libraries
//! and nothing else (no global ANN index: its cost and recall would follow
//! other tenants' data). Each library's vectors are held in memory and
//! refreshed when its stamp — the sum of its fences' write counters (every
//! item write touches one) and its `vectors` sequence — has moved; stamps are
//! read at most every `STAMP_TTL`. A refresh reads the library's embedded
//! chunk uids and only the vectors stored since the last one.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use neo4rs::{query, BoltType};

use super::ingest::{self, AdminGraph};
use super::{GraphError, GraphStore};
use crate::embed;
#[cfg(test)]
use crate::embed::DIM;

/// How long a library's stamp is trusted before it is read again: a vector
/// stored (or a chunk replaced) is seen by semantic search at most this late.
/// A deleted chunk is never returned (results are re-read in scope).
pub const STAMP_TTL: Duration = Duration::from_secs(1);

/// A library's change counters.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct Stamp {
    /// Sum of the library's fence write counters (item writes and deletes).
    pub writes: i64,
    /// The library's vector sequence (bumped by every store of vectors).
    pub vectors: i64,
}

/// A chunk waiting for a vector (`pending_chunks`).
#[derive(Debug)]
pub struct Pending {
    pub uid: String,
    /// Its item's title (embedded with the text: `embed::chunk_text`).
    pub title: String,
    pub text: String,
    /// The vector it holds already and the id of the model that made it:
    /// pending again after a change of model (`backfill`). A chunk's text
    /// and title never change (an item replaced gets new chunks), so that
    /// vector is still of this text.
    pub earlier: Option<(String, Vec<f32>)>,
}

/// One library's vectors, row-major (`dim` floats per chunk: the model's
/// `Embedder::dim`).
pub struct LibVectors {
    dim: usize,
    stamp: Stamp,
    /// Highest sequence number loaded.
    since: i64,
    uids: Vec<String>,
    seqs: Vec<i64>,
    collections: Vec<u32>,
    collection_names: Vec<String>,
    data: Vec<f32>,
}

impl LibVectors {
    fn empty() -> Self {
        LibVectors {
            dim: 0,
            stamp: Stamp {
                writes: -1,
                vectors: -1,
            },
            since: 0,
            uids: Vec::new(),
            seqs: Vec::new(),
            collections: Vec::new(),
            collection_names: Vec::new(),
            data: Vec::new(),
        }
    }

    /// Chunks held.
    pub fn len(&self) -> usize {
        self.uids.len()
    }

    pub fn is_empty(&self) -> bool {
        self.uids.is_empty()
    }

    /// Bytes held (vectors and uids), roughly.
    pub fn bytes(&self) -> usize {
        self.data.len() * 4 + self.uids.iter().map(|u| u.len() + 24).sum::<usize>() + self.uids.len() * 12
    }

    /// The best `k` chunks for `q`, optionally in one collection, scored on
    /// each vector's first `q.len()` values (all of them, or the embedding
    /// model's half of a pair's, `embed::Embedder::is_paired`): (`embed::dot`
    /// of q and those values, chunk uid, the whole vector), best first, ties
    /// by uid. A query longer than the vectors finds nothing.
    pub fn top(&self, q: &[f32], k: usize, collection: Option<&str>) -> Vec<(f32, String, Vec<f32>)> {
        if q.is_empty() || q.len() > self.dim {
            return Vec::new();
        }
        let only = match collection {
            Some(c) => match self.collection_names.iter().position(|n| n == c) {
                Some(i) => Some(i as u32),
                None => return Vec::new(),
            },
            None => None,
        };
        let mut scored: Vec<(f32, usize)> = Vec::with_capacity(self.uids.len());
        for (i, row) in self.data.chunks_exact(self.dim).enumerate() {
            if only.is_some_and(|c| self.collections[i] != c) {
                continue;
            }
            scored.push((embed::dot(q, &row[..q.len()]), i));
        }
        let by =
            |a: &(f32, usize), b: &(f32, usize)| b.0.total_cmp(&a.0).then_with(|| self.uids[a.1].cmp(&self.uids[b.1]));
        if scored.len() > k {
            scored.select_nth_unstable_by(k, by);
            scored.truncate(k);
        }
        scored.sort_by(by);
        scored
            .into_iter()
            .map(|(s, i)| {
                (
                    s,
                    self.uids[i].clone(),
                    self.data[i * self.dim..(i + 1) * self.dim].to_vec(),
                )
            })
            .collect()
    }
}

struct Slot {
    entry: tokio::sync::Mutex<Arc<LibVectors>>,
    /// When the stamp was last read, and what it was.
    checked: Mutex<Option<(Instant, Stamp)>>,
    used: Mutex<Instant>,
}

/// Library uid → its vectors (see the module doc).
pub struct VectorCache {
    slots: Mutex<HashMap<String, Arc<Slot>>>,
    /// Most chunks held over every library; past it the least recently
    /// searched libraries are dropped (and read again when searched).
    max_chunks: usize,
}

impl VectorCache {
    pub fn new(max_chunks: usize) -> Self {
        VectorCache {
            slots: Mutex::new(HashMap::new()),
            max_chunks,
        }
    }

    fn slot(&self, lib: &str) -> Arc<Slot> {
        let mut slots = self.slots.lock().unwrap_or_else(|e| e.into_inner());
        let s = slots
            .entry(lib.to_owned())
            .or_insert_with(|| {
                Arc::new(Slot {
                    entry: tokio::sync::Mutex::new(Arc::new(LibVectors::empty())),
                    checked: Mutex::new(None),
                    used: Mutex::new(Instant::now()),
                })
            })
            .clone();
        *s.used.lock().unwrap_or_else(|e| e.into_inner()) = Instant::now();
        s
    }

    /// Drops a library's vectors (renamed, deleted: read again if searched).
    pub fn forget(&self, lib: &str) {
        self.slots.lock().unwrap_or_else(|e| e.into_inner()).remove(lib);
    }

    /// Drops every library's vectors.
    pub fn forget_all(&self) {
        self.slots.lock().unwrap_or_else(|e| e.into_inner()).clear();
    }

    /// Chunks and bytes held.
    pub fn size(&self) -> (usize, usize) {
        let slots: Vec<Arc<Slot>> = self
            .slots
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .values()
            .cloned()
            .collect();
        let mut out = (0, 0);
        for s in slots {
            if let Ok(e) = s.entry.try_lock() {
                out.0 += e.len();
                out.1 += e.bytes();
            }
        }
        out
    }

    /// Drops the least recently searched libraries while more than
    /// `max_chunks` are held (never `keep`).
    fn evict(&self, keep: &[String]) {
        let mut slots = self.slots.lock().unwrap_or_else(|e| e.into_inner());
        let mut total: usize = 0;
        let mut by_age: Vec<(Instant, String, usize)> = Vec::new();
        for (lib, s) in slots.iter() {
            let n = s.entry.try_lock().map(|e| e.len()).unwrap_or(0);
            total += n;
            if !keep.contains(lib) {
                by_age.push((*s.used.lock().unwrap_or_else(|e| e.into_inner()), lib.clone(), n));
            }
        }
        by_age.sort();
        for (_, lib, n) in by_age {
            if total <= self.max_chunks {
                break;
            }
            slots.remove(&lib);
            total -= n;
        }
    }
}

impl GraphStore {
    /// Each library's stamp (libraries that do not exist are absent).
    async fn vector_stamps(&self, libs: &[String]) -> Result<HashMap<String, Stamp>, GraphError> {
        let q = query(include_str!("../../../cypher/vector_versions.cypher")).param("libs", libs.to_vec());
        let mut out: HashMap<String, Stamp> = HashMap::new();
        for row in self.rows_from_leader("vector_versions.cypher", q).await? {
            out.insert(
                row.get("uid")?,
                Stamp {
                    writes: 0,
                    vectors: row.get("vectors")?,
                },
            );
        }
        if out.is_empty() {
            return Ok(out);
        }
        let fences: Vec<String> = out.keys().flat_map(|l| ingest::fence_uids(l)).collect();
        let q = query(include_str!("../../../cypher/vector_stamps.cypher")).param("fences", fences);
        for row in self.rows_from_leader("vector_stamps.cypher", q).await? {
            let uid: String = row.get("uid")?;
            if let Some(s) = out.get_mut(&uid) {
                s.writes = row.get("writes")?;
            }
        }
        Ok(out)
    }

    /// The vectors of `libs` (existing ones, in the order given), current as
    /// of at most `STAMP_TTL` ago: `model`'s, of `dim` values.
    pub(crate) async fn library_vectors(
        &self,
        model: &str,
        dim: usize,
        libs: &[String],
    ) -> Result<Vec<(String, Arc<LibVectors>)>, GraphError> {
        let now = Instant::now();
        let mut stamps: HashMap<String, Stamp> = HashMap::new();
        let mut stale = Vec::new();
        for lib in libs {
            let slot = self.vectors.slot(lib);
            let checked = *slot.checked.lock().unwrap_or_else(|e| e.into_inner());
            match checked {
                Some((at, s)) if now.duration_since(at) < STAMP_TTL => {
                    stamps.insert(lib.clone(), s);
                }
                _ => stale.push(lib.clone()),
            }
        }
        if !stale.is_empty() {
            let read = self.vector_stamps(&stale).await?;
            for lib in &stale {
                let slot = self.vectors.slot(lib);
                match read.get(lib) {
                    Some(s) => {
                        *slot.checked.lock().unwrap_or_else(|e| e.into_inner()) = Some((now, *s));
                        stamps.insert(lib.clone(), *s);
                    }
                    // Gone: nothing to score, nothing kept.
                    None => {
                        self.vectors.slots.lock().unwrap_or_else(|e| e.into_inner()).remove(lib);
                    }
                }
            }
        }
        let mut out = Vec::with_capacity(libs.len());
        for lib in libs {
            let Some(stamp) = stamps.get(lib).copied() else {
                continue;
            };
            let slot = self.vectors.slot(lib);
            let mut entry = slot.entry.lock().await;
            if entry.stamp != stamp || entry.dim != dim {
                *entry = Arc::new(self.refresh(model, dim, lib, &entry, stamp).await?);
            }
            out.push((lib.clone(), entry.clone()));
        }
        self.vectors.evict(libs);
        Ok(out)
    }

    /// `old` brought up to `stamp`: the library's embedded chunks now, with
    /// the vectors stored since `old` was read.
    async fn refresh(
        &self,
        model: &str,
        dim: usize,
        lib: &str,
        old: &LibVectors,
        stamp: Stamp,
    ) -> Result<LibVectors, GraphError> {
        // Rows of another length than `old`'s: read every vector again.
        let since = if old.dim == dim { old.since } else { 0 };
        let q = query(include_str!("../../../cypher/vector_rows.cypher"))
            .param("library_uid", lib)
            .param("model", model)
            .param("since", since);
        let rows = self.rows_from_leader("vector_rows.cypher", q).await?;
        let known: HashMap<&str, usize> = old.uids.iter().enumerate().map(|(i, u)| (u.as_str(), i)).collect();
        let mut next = LibVectors {
            dim,
            stamp,
            since,
            uids: Vec::with_capacity(rows.len()),
            seqs: Vec::with_capacity(rows.len()),
            collections: Vec::with_capacity(rows.len()),
            collection_names: Vec::new(),
            data: Vec::with_capacity(rows.len() * dim),
        };
        let mut collection_ix: HashMap<String, u32> = HashMap::new();
        for row in rows {
            let uid: String = row.get("uid")?;
            let seq: i64 = row.get("seq")?;
            let vector = row_vector(&row)?;
            let start = next.data.len();
            match (vector, known.get(uid.as_str())) {
                (Some(v), _) if v.len() == dim => next.data.extend_from_slice(&v),
                (None, Some(&i)) if old.seqs[i] == seq && old.dim == dim => {
                    next.data.extend_from_slice(&old.data[i * dim..(i + 1) * dim]);
                }
                // A wrong length, or a vector we should have had: skip it
                // (the next refresh, from `since` 0, reads it whole).
                _ => {
                    next.since = -1;
                    continue;
                }
            }
            debug_assert_eq!(next.data.len(), start + dim);
            let collection: Option<String> = row.get("collection_uid")?;
            let name = collection.unwrap_or_default();
            let n = collection_ix.len() as u32;
            let c = *collection_ix.entry(name.clone()).or_insert_with(|| {
                next.collection_names.push(name);
                n
            });
            next.collections.push(c);
            next.uids.push(uid);
            next.seqs.push(seq);
        }
        next.since = if next.since < 0 {
            // Something was skipped: read every vector next time.
            next.stamp = Stamp {
                writes: -1,
                vectors: -1,
            };
            0
        } else {
            next.seqs.iter().copied().max().unwrap_or(0).max(since)
        };
        Ok(next)
    }
}

/// `v` as little-endian f32 bytes (4 per value).
pub fn to_bytes(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

/// Little-endian f32 bytes as `dim` values; None when the length is not 4 · `dim`.
pub fn from_bytes(b: &[u8], dim: usize) -> Option<Vec<f32>> {
    (b.len() == 4 * dim).then(|| {
        b.chunks_exact(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect()
    })
}

/// A vector as the graph stores it: its f32 values, little-endian, in
/// base64 (one string property, `Chunk.vec`).
pub fn encode(v: &[f32]) -> String {
    use base64::Engine;
    base64::engine::general_purpose::STANDARD.encode(to_bytes(v))
}

/// A stored vector (`encode`); None when it is not a whole number of
/// 16-value blocks (every model's length is: `Embedder::dim`).
pub fn decode(s: &str) -> Option<Vec<f32>> {
    use base64::Engine;
    let bytes = base64::engine::general_purpose::STANDARD.decode(s).ok()?;
    let dim = bytes.len() / 4;
    if dim == 0 || !dim.is_multiple_of(16) {
        return None;
    }
    from_bytes(&bytes, dim)
}

/// The vector of a row with `vec` (`encode`d) and `vector` (a list of
/// floats, as vectors were stored before `vec`) columns, if it holds one.
pub(crate) fn row_vector(row: &neo4rs::Row) -> Result<Option<Vec<f32>>, GraphError> {
    if let Some(s) = row.get::<Option<String>>("vec")? {
        return Ok(decode(&s));
    }
    let list: Option<Vec<f64>> = row.get("vector")?;
    Ok(list
        .filter(|v| v.len() == embed::DIM)
        .map(|v| v.into_iter().map(|x| x as f32).collect()))
}

/// The embedding worker's reads and writes: unscoped, like ingest, so they
/// are the admin handle's.
impl AdminGraph {
    /// Chunks waiting for a vector, per library (only uids starting with
    /// `prefix`).
    pub async fn embedding_backlog(&self, prefix: &str) -> Result<Vec<(String, i64)>, GraphError> {
        let q = query(include_str!("../../../cypher/embed_backlog.cypher")).param("prefix", prefix);
        let mut out = Vec::new();
        for row in self.0.rows("embed_backlog.cypher", q).await? {
            out.push((row.get("library_uid")?, row.get("n")?));
        }
        out.sort();
        Ok(out)
    }

    /// Up to `n` pending chunks of a library, none of `skip` (chunks in a
    /// batch being embedded).
    pub async fn pending_chunks(&self, lib: &str, n: i64, skip: &[String]) -> Result<Vec<Pending>, GraphError> {
        let q = query(include_str!("../../../cypher/embed_pending.cypher"))
            .param("library_uid", lib)
            .param("n", n)
            .param("skip", skip.to_vec());
        let mut out = Vec::new();
        for r in self.0.rows("embed_pending.cypher", q).await? {
            let model: Option<String> = r.get("model")?;
            let vec: Option<String> = r.get("vec")?;
            out.push(Pending {
                uid: r.get("uid")?,
                title: r.get("title")?,
                text: r.get("text")?,
                earlier: model.zip(vec.as_deref().and_then(decode)),
            });
        }
        Ok(out)
    }

    /// Stores vectors for chunks of `lib` that still hold the (title, text)
    /// they were made from; returns how many were stored, and their items.
    pub async fn store_vectors(
        &self,
        model: &str,
        lib: &str,
        rows: Vec<(String, String, String, Vec<f32>)>,
    ) -> Result<(i64, Vec<String>), GraphError> {
        let rows: Vec<BoltType> = rows
            .into_iter()
            .map(|(uid, title, text, v)| {
                let mut m = HashMap::<String, BoltType>::new();
                m.insert("uid".into(), uid.into());
                m.insert("title".into(), title.into());
                m.insert("text".into(), text.into());
                m.insert("vec".into(), encode(&v).into());
                m.into()
            })
            .collect();
        let q = query(include_str!("../../../cypher/embed_store.cypher"))
            .param("library_uid", lib)
            .param("model", model)
            .param("rows", rows);
        let stored = Arc::new(Mutex::new((0i64, Vec::new())));
        let seen = stored.clone();
        self.0
            .transaction::<()>(
                "embed_store.cypher",
                false,
                vec![super::Step::check(q, move |rows| {
                    let out = match rows.first() {
                        Some(r) => (r.get::<i64>("n")?, r.get::<Vec<String>>("items")?),
                        None => (0, Vec::new()),
                    };
                    *seen.lock().unwrap_or_else(|e| e.into_inner()) = out;
                    Ok(None)
                })],
            )
            .await?;
        let out = std::mem::take(&mut *stored.lock().unwrap_or_else(|e| e.into_inner()));
        Ok(out)
    }

    /// Takes chunks that cannot be embedded out of the queue.
    pub async fn embedding_failed(&self, model: &str, uids: Vec<String>) -> Result<(), GraphError> {
        let q = query(include_str!("../../../cypher/embed_failed.cypher"))
            .param("uids", uids)
            .param("model", model);
        self.0.write_txn("embed_failed.cypher", vec![q]).await
    }

    /// Marks up to `n` chunks without a vector of `model` pending; returns how
    /// many (0: none left).
    pub async fn backfill_pending(&self, model: &str, prefix: &str, n: i64) -> Result<i64, GraphError> {
        let q = query(include_str!("../../../cypher/embed_backfill.cypher"))
            .param("model", model)
            .param("prefix", prefix)
            .param("n", n);
        self.counted("embed_backfill.cypher", q).await
    }

    /// Runs one write statement in a transaction (retried on conflicts) and
    /// returns its `n` column (0 without a row).
    async fn counted(&self, what: &'static str, q: neo4rs::Query) -> Result<i64, GraphError> {
        use std::sync::atomic::{AtomicI64, Ordering};
        let count = Arc::new(AtomicI64::new(0));
        let seen = count.clone();
        self.0
            .transaction::<()>(
                what,
                false,
                vec![super::Step::check(q, move |rows| {
                    let n = rows.first().map(|r| r.get::<i64>("n")).transpose()?.unwrap_or(0);
                    seen.store(n, Ordering::Relaxed);
                    Ok(None)
                })],
            )
            .await?;
        Ok(count.load(Ordering::Relaxed))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn unit(seed: f32) -> Vec<f32> {
        let v: Vec<f32> = (0..DIM).map(|i| (i as f32 * seed).sin()).collect();
        let n = v.iter().map(|x| x * x).sum::<f32>().sqrt();
        v.into_iter().map(|x| x / n).collect()
    }

    #[test]
    fn top_is_exact_filtered_and_stable() {
        let mut lv = LibVectors::empty();
        lv.dim = DIM;
        for (i, seed) in [0.1f32, 0.2, 0.3, 0.4].iter().enumerate() {
            lv.uids.push(format!("c{i}"));
            lv.seqs.push(1);
            lv.collections.push((i % 2) as u32);
            lv.data.extend(unit(*seed));
        }
        lv.collection_names = vec!["even".into(), "odd".into()];
        let q = unit(0.3);
        let all = lv.top(&q, 10, None);
        assert_eq!(all.len(), 4);
        assert_eq!(all[0].1, "c2");
        assert_eq!(all[0].2, q, "the hit's vector");
        assert!(all.windows(2).all(|w| w[0].0 >= w[1].0));
        let two = lv.top(&q, 2, None);
        assert_eq!(two, all[..2].to_vec());
        let odd = lv.top(&q, 10, Some("odd"));
        assert!(odd.iter().all(|(_, u, _)| u == "c1" || u == "c3"));
        assert!(lv.top(&q, 10, Some("nowhere")).is_empty());
        // A query longer than the vectors finds nothing.
        let longer: Vec<f32> = q.iter().chain(&q[..16]).copied().collect();
        assert!(lv.top(&longer, 10, None).is_empty());
        // A shorter one scores each vector's first values (the embedding
        // model's half of a pair's), and returns the whole vector.
        let half = &q[..DIM / 2];
        let got = lv.top(half, 10, None);
        let mut want: Vec<(u32, String)> = (0..4)
            .map(|i| {
                let row = &lv.data[i * DIM..i * DIM + DIM / 2];
                (embed::dot(half, row).to_bits(), lv.uids[i].clone())
            })
            .collect();
        want.sort_by(|a, b| {
            f32::from_bits(b.0)
                .total_cmp(&f32::from_bits(a.0))
                .then_with(|| a.1.cmp(&b.1))
        });
        assert_eq!(
            got.iter().map(|(s, u, _)| (s.to_bits(), u.clone())).collect::<Vec<_>>(),
            want
        );
        assert!(got.iter().all(|(_, _, v)| v.len() == DIM), "whole vectors");
    }
}
