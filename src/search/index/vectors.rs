//! Chunk vectors in a library's index: each chunk's stored vector (the
//! model's unit vector; with the cross-language model paired, the two
//! models' unit vectors side by side: `embed::Embedder::dim` values) is kept
//! twice, as fast fields of its document (memory-mapped, following the
//! document through deletes and merges):
//!
//! - `vec_q`: int8 codes with one scale per vector (`4 + dim` bytes), which
//!   every semantic search scans;
//! - `vec`: the f32 values (`4 · dim` bytes), read only to rescore.
//!
//! A query stays f32. For a code `c` of scale `s`, every value lies within
//! `s/2` of `s·c`, so an int8 score is within `s/2 · ‖q‖₁` of the exact one:
//! candidates are rescored exactly in order of that upper bound until no
//! remaining candidate can reach the k-th exact score. The result is the
//! exact top k, each score `embed::dot` of the query and the stored f32
//! vector's first `q.len()` values (all of them, or the embedding model's
//! half of a pair's) — what scoring every vector in memory would give, to
//! the bit.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use tantivy::columnar::{BytesColumn, StrColumn};
use tantivy::index::SegmentId;
use tantivy::{DocId, SegmentReader};

use crate::embed;
#[cfg(test)]
use crate::embed::DIM;

/// Bytes of a quantized vector of `dim` values: its scale (f32,
/// little-endian), then `dim` codes. An index holds vectors of one length:
/// the model's (`embed::DIM`), or, with the cross-language model, the two
/// side by side (`indexing`).
pub fn quantized_len(dim: usize) -> usize {
    4 + dim
}
/// Slack for the rounding of f32 sums in the int8 score, per unit of the
/// query's L1 norm (`nearest`).
const SLACK: f32 = 1e-4;

/// `v` as int8 codes with one scale (`quantized_len(v.len())` bytes).
pub fn quantize(v: &[f32]) -> Vec<u8> {
    let max = v.iter().fold(0f32, |m, x| m.max(x.abs()));
    let scale = if max > 0.0 && max.is_finite() { max / 127.0 } else { 0.0 };
    let mut out = Vec::with_capacity(quantized_len(v.len()));
    out.extend_from_slice(&scale.to_le_bytes());
    for x in v {
        let c = if scale > 0.0 {
            (x / scale).round().clamp(-127.0, 127.0)
        } else {
            0.0
        };
        out.push(c as i8 as u8);
    }
    out
}

pub use crate::store::graph::vectors::{from_bytes, to_bytes};

/// The int8 score of decoded codes for `q` (`q.len()` a multiple of 16; the
/// codes past it are not read).
#[inline(always)]
fn approximate_codes(q: &[f32], codes: &[i8]) -> f32 {
    const LANES: usize = 16;
    let mut acc = [0f32; LANES];
    for (x, c) in q.chunks_exact(LANES).zip(codes.chunks_exact(LANES)) {
        for i in 0..LANES {
            acc[i] += x[i] * f32::from(c[i]);
        }
    }
    acc.iter().sum()
}

/// The int8 scores of a segment's codes (unscaled), compiled for the CPU's
/// vector instructions (pulp picks AVX2/FMA when present, at run time): each
/// document's first `q.len()` codes of its `dim`.
struct Scan<'a> {
    q: &'a [f32],
    dim: usize,
    codes: &'a [i8],
    out: &'a mut [f32],
}

impl pulp::WithSimd for Scan<'_> {
    type Output = ();

    #[inline(always)]
    fn with_simd<S: pulp::Simd>(self, _simd: S) {
        for (o, c) in self.out.iter_mut().zip(self.codes.chunks_exact(self.dim)) {
            *o = approximate_codes(self.q, c);
        }
    }
}

/// One segment's int8 codes decoded into memory, a document after another
/// (`dim` codes each), with each document's scale (NaN: no vector of that
/// length). A segment never changes, so this stays valid for as long as it
/// lives.
pub struct SegmentCodes {
    dim: usize,
    codes: Vec<i8>,
    scales: Vec<f32>,
    /// Each document's chunk uid: `uids[ends[d-1]..ends[d]]`.
    uids: String,
    ends: Vec<u32>,
}

impl SegmentCodes {
    /// Reads the segment's `vec_q` and `chunk_uid` columns once (each
    /// dictionary in order, then each document's ordinal); a vector of
    /// another length than `dim` counts as none.
    fn decode(col: &BytesColumn, uid_col: Option<&StrColumn>, max_doc: u32, dim: usize) -> std::io::Result<Self> {
        let n = col.num_terms();
        let mut by_ord = vec![0i8; n * dim];
        let mut ord_scale = vec![f32::NAN; n];
        let mut stream = col.dictionary().stream()?;
        while stream.advance() {
            let key = stream.key();
            let ord = stream.term_ord() as usize;
            if key.len() != quantized_len(dim) || ord >= n {
                continue;
            }
            let scale = f32::from_le_bytes([key[0], key[1], key[2], key[3]]);
            if !scale.is_finite() {
                continue;
            }
            ord_scale[ord] = scale;
            for (d, b) in by_ord[ord * dim..(ord + 1) * dim].iter_mut().zip(&key[4..]) {
                *d = *b as i8;
            }
        }
        let max_doc = max_doc as usize;
        let mut codes = vec![0i8; max_doc * dim];
        let mut scales = vec![f32::NAN; max_doc];
        for doc in 0..max_doc {
            let Some(ord) = col.term_ords(doc as DocId).next() else {
                continue;
            };
            let ord = ord as usize;
            if ord >= n || ord_scale[ord].is_nan() {
                continue;
            }
            scales[doc] = ord_scale[ord];
            codes[doc * dim..(doc + 1) * dim].copy_from_slice(&by_ord[ord * dim..(ord + 1) * dim]);
        }
        let mut uids = String::new();
        let mut ends = vec![0u32; max_doc];
        if let Some(uc) = uid_col {
            let mut by_ord: Vec<(u32, u32)> = Vec::with_capacity(uc.num_terms());
            let mut text = String::new();
            let mut stream = uc.dictionary().stream()?;
            while stream.advance() {
                let start = text.len() as u32;
                text.push_str(&String::from_utf8_lossy(stream.key()));
                by_ord.push((start, text.len() as u32));
            }
            for (doc, end) in ends.iter_mut().enumerate() {
                if let Some((a, b)) = uc.term_ords(doc as DocId).next().and_then(|o| by_ord.get(o as usize)) {
                    uids.push_str(&text[*a as usize..*b as usize]);
                }
                *end = uids.len() as u32;
            }
        }
        Ok(SegmentCodes {
            dim,
            codes,
            scales,
            uids,
            ends,
        })
    }

    /// The chunk uid of `doc`.
    fn uid(&self, doc: DocId) -> &str {
        let d = doc as usize;
        let start = if d == 0 { 0 } else { self.ends[d - 1] as usize };
        &self.uids[start..self.ends[d] as usize]
    }

    /// Bytes held.
    pub fn bytes(&self) -> usize {
        self.codes.len() + 4 * self.scales.len() + self.uids.len() + 4 * self.ends.len()
    }
}

/// The decoded codes of the segments searched lately, over every library
/// index of a replica, the least recently used dropped past a byte budget.
/// A segment larger than the whole budget is decoded for the search that
/// needs it and not kept. Entries of an index are dropped with it, and those
/// of segments merged away at its next semantic search.
pub struct CodeCache {
    budget: usize,
    inner: Mutex<CacheInner>,
    owners: AtomicU64,
}

#[derive(Default)]
struct CacheInner {
    entries: HashMap<SegmentId, CacheEntry>,
    bytes: usize,
    clock: u64,
}

struct CacheEntry {
    codes: Arc<SegmentCodes>,
    owner: u64,
    used: u64,
}

impl CodeCache {
    /// A cache holding at most `budget` bytes of codes.
    pub fn new(budget: usize) -> Arc<Self> {
        Arc::new(CodeCache {
            budget,
            inner: Mutex::new(CacheInner::default()),
            owners: AtomicU64::new(1),
        })
    }

    /// A cache that keeps every segment searched (tests, tools).
    pub fn unbounded() -> Arc<Self> {
        Self::new(usize::MAX)
    }

    /// Bytes held now.
    pub fn bytes(&self) -> usize {
        self.lock().bytes
    }

    /// The most bytes it keeps.
    pub fn budget(&self) -> usize {
        self.budget
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, CacheInner> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A new owner id (one per open library index).
    pub(super) fn owner(&self) -> u64 {
        self.owners.fetch_add(1, Ordering::Relaxed)
    }

    /// The codes of a segment's vectors of `dim` values, decoded now unless
    /// held.
    fn get(&self, owner: u64, seg: &SegmentVectors<'_>, dim: usize) -> std::io::Result<Arc<SegmentCodes>> {
        let (seg, col, uid_col) = (seg.reader, &seg.quantized, seg.uids.as_ref());
        let id = seg.segment_id();
        {
            let mut g = self.lock();
            g.clock += 1;
            let now = g.clock;
            if let Some(e) = g.entries.get_mut(&id).filter(|e| e.codes.dim == dim) {
                e.used = now;
                return Ok(e.codes.clone());
            }
        }
        // Decoded outside the lock: other searches go on meanwhile.
        let codes = Arc::new(SegmentCodes::decode(col, uid_col, seg.max_doc(), dim)?);
        let size = codes.bytes();
        if size > self.budget {
            return Ok(codes);
        }
        let mut g = self.lock();
        g.clock += 1;
        let now = g.clock;
        if let Some(old) = g.entries.insert(
            id,
            CacheEntry {
                codes: codes.clone(),
                owner,
                used: now,
            },
        ) {
            g.bytes -= old.codes.bytes();
        }
        g.bytes += size;
        while g.bytes > self.budget {
            let Some((&victim, _)) = g.entries.iter().min_by_key(|(_, e)| e.used) else {
                break;
            };
            if let Some(e) = g.entries.remove(&victim) {
                g.bytes -= e.codes.bytes();
            }
        }
        Ok(codes)
    }

    /// Whether the segment's codes of `dim` values are held.
    fn holds(&self, id: &SegmentId, dim: usize) -> bool {
        self.lock().entries.get(id).is_some_and(|e| e.codes.dim == dim)
    }

    /// Drops the entries of `owner` except those of `live` segments (None: all).
    pub(super) fn forget(&self, owner: u64, live: Option<&[SegmentId]>) {
        let mut g = self.lock();
        let mut freed = 0;
        g.entries.retain(|id, e| {
            let keep = e.owner != owner || live.is_some_and(|l| l.contains(id));
            if !keep {
                freed += e.codes.bytes();
            }
            keep
        });
        g.bytes -= freed;
    }
}

/// A candidate: where it is and the most its exact score can be.
struct Candidate {
    bound: f32,
    segment: u32,
    doc: DocId,
}

impl PartialEq for Candidate {
    fn eq(&self, other: &Self) -> bool {
        self.cmp(other).is_eq()
    }
}
impl Eq for Candidate {}
impl PartialOrd for Candidate {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for Candidate {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        self.bound.total_cmp(&other.bound)
    }
}

/// One segment's vector columns.
pub(super) struct SegmentVectors<'a> {
    reader: &'a SegmentReader,
    quantized: BytesColumn,
    exact: BytesColumn,
    uids: Option<StrColumn>,
}

impl<'a> SegmentVectors<'a> {
    pub(super) fn of(seg: &'a SegmentReader) -> tantivy::Result<Option<Self>> {
        let ff = seg.fast_fields();
        Ok(match (ff.bytes("vec_q")?, ff.bytes("vec")?) {
            (Some(quantized), Some(exact)) => Some(SegmentVectors {
                reader: seg,
                quantized,
                exact,
                uids: ff.str("chunk_uid")?,
            }),
            _ => None,
        })
    }

    /// The exact vector of `doc`, if it has one of `dim` values.
    fn exact(&self, doc: DocId, dim: usize, buf: &mut Vec<u8>) -> std::io::Result<Option<Vec<f32>>> {
        let Some(ord) = self.exact.term_ords(doc).next() else {
            return Ok(None);
        };
        buf.clear();
        if !self.exact.ord_to_bytes(ord, buf)? {
            return Ok(None);
        }
        Ok(from_bytes(buf, dim))
    }
}

/// The exact best `k` for the query `q` among the documents of `segments`
/// that `keep(segment, doc)` accepts and whose vectors have `dim` values,
/// scored on their first `q.len()` (all of them, or a prefix: the embedding
/// model's half of a pair's vectors, `embed::Embedder::is_paired`):
/// (`embed::dot` of q and those values, chunk uid, the whole vector), best
/// first, ties by uid. Each segment's codes (and uids) come from `cache`,
/// decoded on first use.
pub(super) fn nearest(
    q: &[f32],
    dim: usize,
    k: usize,
    segments: &[Option<SegmentVectors<'_>>],
    cache: (&CodeCache, u64),
    keep: impl Fn(u32, DocId) -> bool,
) -> std::io::Result<Vec<(f32, String, Vec<f32>)>> {
    if k == 0 || q.is_empty() || !q.len().is_multiple_of(16) || q.len() > dim || !dim.is_multiple_of(16) {
        return Ok(Vec::new());
    }
    let q1: f32 = q.iter().map(|x| x.abs()).sum();
    // The f32 sums' rounding grows with the query's scale (a hybrid query
    // of the paired models is not a unit vector).
    let slack = SLACK * q1.max(1.0);
    let arch = pulp::Arch::new();
    let mut cands: Vec<Candidate> = Vec::new();
    let mut held: Vec<Option<Arc<SegmentCodes>>> = Vec::with_capacity(segments.len());
    let mut scores = Vec::new();
    for (s, seg) in segments.iter().enumerate() {
        let Some(seg) = seg else {
            held.push(None);
            continue;
        };
        let codes = cache.0.get(cache.1, seg, dim)?;
        scores.clear();
        scores.resize(codes.scales.len(), 0f32);
        arch.dispatch(Scan {
            q,
            dim,
            codes: &codes.codes,
            out: &mut scores,
        });
        for (doc, (&scale, &a)) in codes.scales.iter().zip(&scores).enumerate() {
            let doc = doc as DocId;
            if scale.is_nan() || !keep(s as u32, doc) {
                continue;
            }
            cands.push(Candidate {
                bound: a * scale + scale * 0.5 * q1 + slack,
                segment: s as u32,
                doc,
            });
        }
        // A segment's codes stay for the uids of its hits while cached
        // (a search over more than the budget does not hold them all).
        held.push(cache.0.holds(&seg.reader.segment_id(), dim).then_some(codes));
    }
    let uid = |s: u32, doc: DocId| -> std::io::Result<String> {
        if let Some(codes) = &held[s as usize] {
            return Ok(codes.uid(doc).to_owned());
        }
        let mut buf = String::new();
        if let Some(col) = segments[s as usize].as_ref().and_then(|v| v.uids.as_ref()) {
            if let Some(ord) = col.term_ords(doc).next() {
                col.ord_to_str(ord, &mut buf)?;
            }
        }
        Ok(buf)
    };
    // Best bound first, without sorting every candidate.
    let mut heap = std::collections::BinaryHeap::from(cands);
    // The best k exact scores so far, best first, ties by uid.
    let mut best: Vec<(f32, String, Vec<f32>)> = Vec::with_capacity(k + 1);
    let mut buf = Vec::with_capacity(4 * dim);
    while let Some(c) = heap.pop() {
        if best.len() >= k && c.bound < best[k - 1].0 {
            break;
        }
        let Some(seg) = &segments[c.segment as usize] else {
            continue;
        };
        let Some(v) = seg.exact(c.doc, dim, &mut buf)? else {
            continue;
        };
        let score = embed::dot(q, &v[..q.len()]);
        if score.is_nan() || (best.len() >= k && score < best[k - 1].0) {
            continue;
        }
        let uid = uid(c.segment, c.doc)?;
        let at = best.partition_point(|(s, u, _)| s.total_cmp(&score).is_gt() || (*s == score && *u < uid));
        if at < k {
            best.insert(at, (score, uid, v));
            best.truncate(k);
        }
    }
    Ok(best)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The int8 score of a quantized vector for `q`, and its scale.
    fn approximate(q: &[f32], code: &[u8]) -> Option<(f32, f32)> {
        let scale = f32::from_le_bytes([code[0], code[1], code[2], code[3]]);
        let codes: Vec<i8> = code[4..].iter().map(|b| *b as i8).collect();
        (code.len() == quantized_len(q.len())).then(|| (approximate_codes(q, &codes) * scale, scale))
    }

    #[test]
    fn an_int8_score_is_within_its_bound_of_the_exact_one() {
        let v: Vec<f32> = (0..DIM).map(|i| ((i * 7919 % 1000) as f32 / 1000.0) - 0.5).collect();
        let n = v.iter().map(|x| x * x).sum::<f32>().sqrt();
        let v: Vec<f32> = v.into_iter().map(|x| x / n).collect();
        let q: Vec<f32> = (0..DIM).map(|i| ((i * 104729 % 997) as f32 / 997.0) - 0.5).collect();
        let code = quantize(&v);
        assert_eq!(code.len(), quantized_len(DIM));
        let (a, scale) = approximate(&q, &code).unwrap();
        let exact = embed::dot(&q, &v);
        let q1: f32 = q.iter().map(|x| x.abs()).sum();
        assert!((exact - a).abs() <= scale * 0.5 * q1 + SLACK, "{exact} {a}");
        assert_eq!(from_bytes(&to_bytes(&v), DIM).unwrap(), v);
        assert!(from_bytes(&[0u8; 3], DIM).is_none());
        // A zero vector quantizes to zeros and scores 0.
        let zero = quantize(&[0.0; DIM]);
        assert_eq!(approximate(&q, &zero).unwrap().0, 0.0);
    }
}
