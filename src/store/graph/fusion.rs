//! Fusing keyword and semantic candidates into one ranking (hybrid search),
//! or passing one signal through (keyword, semantic): the weights, the
//! similarity floor and why (docs/search.md).

use std::collections::HashMap;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::store::index::rank;

/// How `search` ranks.
#[derive(Clone, Copy, Debug, Serialize, Deserialize, JsonSchema, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
#[schemars(inline)]
pub enum Mode {
    /// Keyword and semantic candidates fused (a weighted sum of their scores).
    Hybrid,
    /// Words (stemmed, folded), BM25 per library.
    Keyword,
    /// Meaning: cosine similarity of sentence vectors.
    Semantic,
}

/// A search that found a hit.
#[derive(Clone, Copy, Debug, Serialize, Deserialize, JsonSchema, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
#[schemars(inline)]
pub enum Signal {
    Keyword,
    Semantic,
}

/// Candidates each signal contributes to a hybrid ranking (and the semantic
/// candidates of a semantic search, at least).
pub(super) const CANDIDATES: usize = 100;
/// Weight of the keyword signal in a hybrid score (the semantic one weighs
/// the rest). Chosen on the committed labelled set against reciprocal rank
/// fusion (docs/search.md): RRF lost the exact bucket to semantic noise
/// (nDCG@10 0.904 vs keyword's 0.969) and paraphrases to keyword noise
/// (0.762 vs semantic's 0.923); this convex combination keeps every bucket
/// at or above keyword search.
const KEYWORD_WEIGHT: f64 = 0.4;

/// Cosine similarity at or below which a chunk is taken as unrelated to the
/// query in a hybrid score: MiniLM gives unrelated texts 0.0–0.3, and those
/// small similarities let a chunk that shares no word with the query push a
/// keyword match down (committed set, docs/search.md: floor 0 → 0.3 moved the
/// title bucket 0.997 → 1.000, overall 0.923 → 0.922, paraphrase 0.862 →
/// 0.860, every bucket at or above keyword search). Semantic mode ranks by
/// the raw similarity.
const SIMILARITY_FLOOR: f64 = 0.3;

/// A similarity's share of the semantic weight: 0 at the floor, 1 at 1.
fn above_floor(similarity: f64) -> f64 {
    ((similarity - SIMILARITY_FLOOR) / (1.0 - SIMILARITY_FLOOR)).max(0.0)
}

/// A ranked chunk before its text is read.
#[derive(Clone, Debug, PartialEq)]
pub(super) struct Ranked {
    pub(super) chunk_uid: String,
    pub(super) library_uid: String,
    pub(super) score: f64,
    pub(super) relevance: f64,
    pub(super) similarity: Option<f64>,
    pub(super) found_by: Vec<Signal>,
}

/// One ranking out of the keyword candidates (scored, any order) and the
/// semantic ones (best first): keyword or semantic alone, or their fusion
/// (each signal's best `CANDIDATES`): `KEYWORD_WEIGHT` × the keyword score
/// relative to the best keyword score of this search × its relevance, plus
/// the rest × the cosine similarity above `SIMILARITY_FLOOR`. Every term is a function of the
/// caller's libraries only.
pub(super) fn fuse(
    mode: Mode,
    mut keyword: Vec<rank::Scored>,
    semantic: Vec<(f32, String, String)>,
    limit: usize,
) -> Vec<Ranked> {
    let sem = |(sim, uid, lib): (f32, String, String)| Ranked {
        chunk_uid: uid,
        library_uid: lib,
        score: f64::from(sim),
        relevance: f64::from(sim).clamp(0.0, 1.0),
        similarity: Some(f64::from(sim)),
        found_by: vec![Signal::Semantic],
    };
    let kw = |k: rank::Scored| Ranked {
        chunk_uid: k.chunk_uid,
        library_uid: k.library_uid,
        score: k.score,
        relevance: k.relevance,
        similarity: None,
        found_by: vec![Signal::Keyword],
    };
    match mode {
        Mode::Keyword => keyword.into_iter().map(kw).collect(),
        Mode::Semantic => semantic.into_iter().take(limit.max(1)).map(sem).collect(),
        Mode::Hybrid => {
            keyword.sort_by(|a, b| b.score.total_cmp(&a.score).then_with(|| a.chunk_uid.cmp(&b.chunk_uid)));
            keyword.truncate(CANDIDATES);
            let best = keyword.first().map(|k| k.score).filter(|s| *s > 0.0).unwrap_or(1.0);
            let mut out: Vec<Ranked> = Vec::with_capacity(keyword.len() + semantic.len());
            let mut at: HashMap<String, usize> = HashMap::new();
            for k in keyword {
                let mut r = kw(k);
                r.score = KEYWORD_WEIGHT * (r.score / best) * r.relevance;
                at.insert(r.chunk_uid.clone(), out.len());
                out.push(r);
            }
            for s in semantic.into_iter().take(CANDIDATES) {
                let r = sem(s);
                let part = (1.0 - KEYWORD_WEIGHT) * above_floor(r.similarity.unwrap_or(0.0));
                match at.get(&r.chunk_uid) {
                    Some(&i) => {
                        let hit = &mut out[i];
                        hit.score += part;
                        hit.relevance = hit.relevance.max(r.relevance);
                        hit.similarity = r.similarity;
                        hit.found_by.push(Signal::Semantic);
                    }
                    None => out.push(Ranked { score: part, ..r }),
                }
            }
            out
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn kw(uid: &str, score: f64, relevance: f64) -> rank::Scored {
        rank::Scored {
            chunk_uid: uid.into(),
            library_uid: "lib".into(),
            score,
            relevance,
        }
    }

    fn order(r: &[Ranked]) -> Vec<&str> {
        let mut r: Vec<&Ranked> = r.iter().collect();
        r.sort_by(|a, b| b.score.total_cmp(&a.score));
        r.iter().map(|x| x.chunk_uid.as_str()).collect()
    }

    #[test]
    fn a_weak_keyword_match_outranks_an_unrelated_chunk_but_not_a_close_paraphrase() {
        let keyword = vec![kw("best", 10.0, 1.0), kw("weak", 2.0, 0.5)];
        // "noise" shares no word and is barely similar: it adds nothing.
        let noise = vec![(0.29f32, "noise".to_owned(), "lib".to_owned())];
        let r = fuse(Mode::Hybrid, keyword.clone(), noise, 10);
        assert_eq!(order(&r), ["best", "weak", "noise"]);
        assert_eq!(r.iter().find(|x| x.chunk_uid == "noise").unwrap().score, 0.0);
        // a close paraphrase (no shared word) passes the weak match.
        let close = vec![(0.6f32, "close".to_owned(), "lib".to_owned())];
        let r = fuse(Mode::Hybrid, keyword, close, 10);
        assert_eq!(order(&r), ["best", "close", "weak"]);
    }
}
