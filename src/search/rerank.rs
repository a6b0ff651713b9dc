//! Reranking, the last stage of a hybrid or semantic search when the
//! deployment has a reranker (`embed::rerank`): its best fused candidates,
//! with their text, go to the reranker with the query, and come back in the
//! order of its scores. Only what the search already found goes: the
//! candidates of the caller's libraries, after the floor (`Floor`) left out
//! what it drops, so nothing of another tenant's is ever sent and the
//! relevance thresholds keep meaning what they mean without one.
//!
//! A reranked hit's `score` is the reranker's; its `relevance` (and
//! `similarity`, `found_by`) stay the search's own. When the reranker does
//! not answer in time, cannot be reached, its circuit is open or its answer
//! is refused, the hits keep the fused order (the failure was counted and
//! logged by its client) and the search says so (`Reranking::Kept`).

use crate::embed::rerank::{RerankError, Reranker};

/// What reranking did to a search's hits.
#[derive(Clone, Debug)]
pub enum Reranking {
    /// Nothing was sent: no reranker, a keyword search, or no hits.
    NotAsked,
    /// The first hits are in the reranker's order, with its scores.
    Reordered,
    /// The reranker could not answer: the hits are in the search's order.
    Kept(RerankError),
}

/// A hit as reranking sees it (`engine::SearchHit`).
pub(crate) trait Candidate {
    /// The text the reranker reads (what the chunk was embedded from).
    fn text(&self) -> String;
    fn score(&self) -> f64;
    fn set_score(&mut self, score: f64);
}

/// Reorders the first `reranker.candidates()` of `hits` (best first) by the
/// reranker's score of each against `query` (ties keep their order); the
/// hits after them, if any, follow in the search's order.
pub(crate) async fn rerank<C: Candidate>(reranker: &Reranker, query: &str, hits: &mut [C]) -> Reranking {
    let n = reranker.candidates().min(hits.len());
    if n == 0 {
        return Reranking::NotAsked;
    }
    let texts: Vec<String> = hits[..n].iter().map(Candidate::text).collect();
    match reranker.scores(query, &texts).await {
        Ok(scores) => {
            for (h, s) in hits.iter_mut().zip(scores) {
                h.set_score(s);
            }
            hits[..n].sort_by(|a, b| b.score().total_cmp(&a.score()));
            Reranking::Reordered
        }
        Err(e) => Reranking::Kept(e),
    }
}
