//! Chunk vectors in a library's index: each chunk's unit vector is kept
//! twice, as fast fields of its document (memory-mapped, following the
//! document through deletes and merges):
//!
//! - `vec_q`: int8 codes with one scale per vector (`4 + DIM` bytes), which
//!   every semantic search scans;
//! - `vec`: the f32 values (`4 · DIM` bytes), read only to rescore.
//!
//! A query stays f32. For a code `c` of scale `s`, every value lies within
//! `s/2` of `s·c`, so an int8 score is within `s/2 · ‖q‖₁` of the exact one:
//! candidates are rescored exactly in order of that upper bound until no
//! remaining candidate can reach the k-th exact score. The result is the
//! exact top k, each score `embed::dot` of the query and the stored f32
//! vector — what scoring every vector in memory would give, to the bit.

use tantivy::columnar::BytesColumn;
use tantivy::{DocId, SegmentReader};

use crate::embed::{self, DIM};

/// Bytes of a quantized vector: its scale (f32, little-endian), then `DIM` codes.
pub const QUANTIZED: usize = 4 + DIM;
/// Bytes of an f32 vector (little-endian).
pub const EXACT: usize = 4 * DIM;
/// Slack for the rounding of f32 sums in the int8 score.
const SLACK: f32 = 1e-4;

/// `v` as int8 codes with one scale (`QUANTIZED` bytes).
pub fn quantize(v: &[f32]) -> Vec<u8> {
    let max = v.iter().fold(0f32, |m, x| m.max(x.abs()));
    let scale = if max > 0.0 && max.is_finite() { max / 127.0 } else { 0.0 };
    let mut out = Vec::with_capacity(QUANTIZED);
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

/// `v` as little-endian f32 bytes (`EXACT` bytes).
pub fn to_bytes(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

/// Little-endian f32 bytes as values; None when the length is not `EXACT`.
pub fn from_bytes(b: &[u8]) -> Option<Vec<f32>> {
    (b.len() == EXACT).then(|| {
        b.chunks_exact(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect()
    })
}

/// The int8 score of a quantized vector for `q`, and its scale.
fn approximate(q: &[f32], code: &[u8]) -> Option<(f32, f32)> {
    if code.len() != QUANTIZED {
        return None;
    }
    let scale = f32::from_le_bytes([code[0], code[1], code[2], code[3]]);
    if !scale.is_finite() {
        return None;
    }
    const LANES: usize = 16;
    let mut acc = [0f32; LANES];
    for (x, c) in q.chunks_exact(LANES).zip(code[4..].chunks_exact(LANES)) {
        for i in 0..LANES {
            acc[i] += x[i] * f32::from(c[i] as i8);
        }
    }
    let rest = DIM - DIM % LANES;
    let mut sum: f32 = acc.iter().sum();
    for i in rest..DIM {
        sum += q[i] * f32::from(code[4 + i] as i8);
    }
    Some((sum * scale, scale))
}

/// A candidate: where it is and the most its exact score can be.
struct Candidate {
    bound: f32,
    segment: u32,
    doc: DocId,
}

/// One segment's vector columns.
pub(super) struct SegmentVectors {
    quantized: BytesColumn,
    exact: BytesColumn,
}

impl SegmentVectors {
    pub(super) fn of(seg: &SegmentReader) -> tantivy::Result<Option<Self>> {
        let ff = seg.fast_fields();
        Ok(match (ff.bytes("vec_q")?, ff.bytes("vec")?) {
            (Some(quantized), Some(exact)) => Some(SegmentVectors { quantized, exact }),
            _ => None,
        })
    }

    /// The exact vector of `doc`, if it has one.
    fn exact(&self, doc: DocId, buf: &mut Vec<u8>) -> std::io::Result<Option<Vec<f32>>> {
        let Some(ord) = self.exact.term_ords(doc).next() else {
            return Ok(None);
        };
        buf.clear();
        if !self.exact.ord_to_bytes(ord, buf)? {
            return Ok(None);
        }
        Ok(from_bytes(buf))
    }
}

/// The exact best `k` for the unit query `q` among the documents of
/// `segments` that `keep(segment, doc)` accepts: (similarity, segment, doc),
/// best first, ties by `uid(segment, doc)`.
pub(super) fn nearest(
    q: &[f32],
    k: usize,
    segments: &[Option<SegmentVectors>],
    max_docs: &[u32],
    keep: impl Fn(u32, DocId) -> bool,
    uid: impl Fn(u32, DocId) -> std::io::Result<String>,
) -> std::io::Result<Vec<(f32, String)>> {
    if k == 0 || q.len() != DIM {
        return Ok(Vec::new());
    }
    let q1: f32 = q.iter().map(|x| x.abs()).sum();
    let mut cands: Vec<Candidate> = Vec::new();
    for (s, seg) in segments.iter().enumerate() {
        let Some(seg) = seg else { continue };
        // Every distinct code scored once, in dictionary order.
        let n = seg.quantized.num_terms();
        let mut bound = vec![f32::NAN; n];
        let mut stream = seg.quantized.dictionary().stream()?;
        while stream.advance() {
            if let Some((a, scale)) = approximate(q, stream.key()) {
                bound[stream.term_ord() as usize] = a + scale * 0.5 * q1 + SLACK;
            }
        }
        for doc in 0..max_docs[s] {
            if !keep(s as u32, doc) {
                continue;
            }
            let Some(ord) = seg.quantized.term_ords(doc).next() else {
                continue;
            };
            let b = bound[ord as usize];
            if b.is_nan() {
                continue;
            }
            cands.push(Candidate {
                bound: b,
                segment: s as u32,
                doc,
            });
        }
    }
    cands.sort_unstable_by(|a, b| b.bound.total_cmp(&a.bound));
    // The best k exact scores so far, best first, ties by uid.
    let mut best: Vec<(f32, String)> = Vec::with_capacity(k + 1);
    let mut buf = Vec::with_capacity(EXACT);
    for c in cands {
        if best.len() >= k && c.bound < best[k - 1].0 {
            break;
        }
        let Some(seg) = &segments[c.segment as usize] else {
            continue;
        };
        let Some(v) = seg.exact(c.doc, &mut buf)? else {
            continue;
        };
        let score = embed::dot(q, &v);
        if score.is_nan() {
            continue;
        }
        let uid = uid(c.segment, c.doc)?;
        let at = best.partition_point(|(s, u)| s.total_cmp(&score).is_gt() || (*s == score && *u < uid));
        if at < k {
            best.insert(at, (score, uid));
            best.truncate(k);
        }
    }
    Ok(best)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_int8_score_is_within_its_bound_of_the_exact_one() {
        let v: Vec<f32> = (0..DIM).map(|i| ((i * 7919 % 1000) as f32 / 1000.0) - 0.5).collect();
        let n = v.iter().map(|x| x * x).sum::<f32>().sqrt();
        let v: Vec<f32> = v.into_iter().map(|x| x / n).collect();
        let q: Vec<f32> = (0..DIM).map(|i| ((i * 104729 % 997) as f32 / 997.0) - 0.5).collect();
        let code = quantize(&v);
        assert_eq!(code.len(), QUANTIZED);
        let (a, scale) = approximate(&q, &code).unwrap();
        let exact = embed::dot(&q, &v);
        let q1: f32 = q.iter().map(|x| x.abs()).sum();
        assert!((exact - a).abs() <= scale * 0.5 * q1 + SLACK, "{exact} {a}");
        assert_eq!(from_bytes(&to_bytes(&v)).unwrap(), v);
        assert!(from_bytes(&[0u8; 3]).is_none());
        // A zero vector quantizes to zeros and scores 0.
        let zero = quantize(&[0.0; DIM]);
        assert_eq!(approximate(&q, &zero).unwrap().0, 0.0);
    }
}
