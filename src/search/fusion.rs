//! Fusing keyword and semantic candidates into one ranking (hybrid search),
//! or passing one signal through (keyword, semantic): the weights, the
//! similarity floor and why (docs/search.md).

use std::collections::HashMap;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::embed::ModelKind;
use crate::search::index::rank;

/// How `search` ranks.
#[derive(Clone, Copy, Debug, Serialize, Deserialize, JsonSchema, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
#[schemars(inline)]
pub enum Mode {
    /// Keyword and semantic candidates fused: either signal may vouch for a hit.
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
pub(crate) const CANDIDATES: usize = 100;

/// The relevance some hit must reach for hybrid search (the default mode)
/// to answer at all, unless the caller gives `min_relevance` (`Floor`; the
/// search tool's description says so), with the cross-language model
/// paired (`embed::Embedder::is_paired`, as `scripts/dev` runs it). Each
/// value is read by one rule on the committed set, for its configuration:
/// the highest, in steps of 0.05, at which at most 3 % of the answerable
/// questions come back empty (docs/search.md).
pub const DEFAULT_MIN_RELEVANCE: f64 = 0.35;

/// `DEFAULT_MIN_RELEVANCE` of a server with the embedding model alone (its
/// relevance reads lower on the same pages: 0.35 would empty 4.9 % of the
/// committed set's answerable questions).
pub const DEFAULT_MIN_RELEVANCE_ONE_MODEL: f64 = 0.3;

/// Hybrid search's threshold for a server whose embedding model is paired
/// with the cross-language model or not.
pub fn default_min_relevance(paired: bool) -> f64 {
    if paired {
        DEFAULT_MIN_RELEVANCE
    } else {
        DEFAULT_MIN_RELEVANCE_ONE_MODEL
    }
}

/// Which hits a search leaves out, by their `relevance`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Floor {
    /// Every hit below this relevance: the caller's `min_relevance` (0 keeps
    /// every candidate), and keyword and semantic search's default (0).
    Hit(f64),
    /// The whole answer when no hit reaches this relevance (the libraries
    /// most likely hold nothing on the question), and otherwise only the
    /// hits nothing supports (relevance 0): hybrid search's default. A
    /// question the libraries answer keeps its weaker relevant pages (a page
    /// in another language on the same subject, one that answers part of
    /// it), ranked after the best and shown with their relevance; cutting
    /// each hit at the threshold dropped them (docs/search.md).
    Answer(f64),
}

impl Floor {
    /// The least relevance a single hit needs to be kept whatever the
    /// others score (a floor the keyword ranking may apply early).
    pub fn per_hit(self) -> f64 {
        match self {
            Floor::Hit(min) => min,
            Floor::Answer(_) => 0.0,
        }
    }

    /// Whether a kept hit leads the answer: under `Answer`, the hits reaching
    /// the threshold come first and the weaker ones after, each group in
    /// score order. The order can put a hit the threshold vouches for below
    /// weaker ones (a partial keyword share orders nothing without a
    /// whole-query match, though it counts in the relevance), and under a
    /// `limit` out of the answer; this keeps a non-empty default answer
    /// starting with a hit at the threshold.
    pub(crate) fn leads(self, r: &Ranked) -> bool {
        matches!(self, Floor::Answer(min) if r.relevance >= min)
    }

    /// Leaves out of `ranked` what this floor drops (a NaN relevance
    /// reaches nothing).
    pub(crate) fn apply(self, ranked: &mut Vec<Ranked>) {
        match self {
            Floor::Hit(min) => ranked.retain(|r| r.relevance >= min),
            Floor::Answer(min) if ranked.iter().any(|r| r.relevance >= min) => ranked.retain(|r| r.relevance > 0.0),
            Floor::Answer(_) => ranked.clear(),
        }
    }
}

/// Weight of the relative keyword score in a hybrid score, after the
/// ordering evidence (the relevance when some chunk holds the whole query):
/// among hits of equal evidence (every chunk holding all the query's words
/// has keyword relevance 1) BM25 orders them as keyword search would.
const KEYWORD_ORDER_WEIGHT: f64 = 0.1;

/// How a model's cosine similarities read as evidence that a chunk answers
/// the query: none at or below `unrelated` (what the model gives text on
/// another subject), full at or above `answers` (what it gives the chunk that
/// answers), linear between. Models differ: MiniLM spreads similarities over
/// 0–1, multilingual-e5 packs them into 0.7–0.95.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Calibration {
    pub unrelated: f64,
    pub answers: f64,
}

impl Calibration {
    /// The calibration of a model, read the same way for each from the
    /// committed set (docs/search.md): `unrelated` is the lowest similarity
    /// of an off-topic question's best hit, `answers` the 90th percentile of
    /// a question's similarity to the page that answers it (rounded).
    pub fn of(kind: ModelKind) -> Calibration {
        match kind {
            ModelKind::MiniLm => Calibration {
                unrelated: 0.15,
                answers: 0.65,
            },
            ModelKind::E5 => Calibration {
                unrelated: 0.8,
                answers: 0.9,
            },
        }
    }

    /// 0–1: how far `similarity` stands between unrelated and answering.
    pub fn evidence(&self, similarity: f64) -> f64 {
        self.unclamped(similarity).clamp(0.0, 1.0)
    }

    /// `evidence` before it is clamped to 0–1: linear in the similarity,
    /// 1 / (answers − unrelated) per unit (`weight`).
    pub fn unclamped(&self, similarity: f64) -> f64 {
        (similarity - self.unrelated) * self.weight()
    }

    /// The slope of `unclamped`.
    pub fn weight(&self) -> f64 {
        1.0 / (self.answers - self.unrelated)
    }
}

/// The cross-language model's calibration (USE-m3, paired: `embed::Embedder::is_paired`), read
/// from the committed set as `Calibration::of` reads the others
/// (docs/search.md).
pub const CROSS: Calibration = Calibration {
    unrelated: 0.12,
    answers: 0.5,
};

/// A semantic candidate: the embedding model's similarity, and the
/// evidence the meaning gives that the chunk answers.
///
/// With the cross-language model paired (`embed::Embedder::is_paired`:
/// every stored vector holds both models') and a hybrid search, that
/// evidence is the mean of the two models' evidence (`Calibration::evidence`,
/// each on its own calibration): two measures of the same closeness of
/// meaning, one trained to meet a sentence and its translation, neither
/// trusted over the other. Otherwise it is the embedding model's alone.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct Near {
    pub(crate) similarity: f32,
    pub(crate) relevance: f64,
    /// What orders semantic candidates across libraries: the evidence before
    /// it is clamped to 0–1 (so it orders past both ends).
    pub(crate) order: f64,
    pub(crate) chunk_uid: String,
    pub(crate) library_uid: String,
}

impl Near {
    /// A candidate of the embedding model alone.
    pub(crate) fn of(calibration: Calibration, similarity: f32, chunk_uid: String, library_uid: String) -> Near {
        Near {
            similarity,
            relevance: calibration.evidence(f64::from(similarity)),
            order: calibration.unclamped(f64::from(similarity)),
            chunk_uid,
            library_uid,
        }
    }

    /// A candidate of both models: `cross` is the cross-language model's
    /// similarity.
    pub(crate) fn of_both(
        calibration: Calibration,
        similarity: f32,
        cross: f32,
        chunk_uid: String,
        library_uid: String,
    ) -> Near {
        let (s, c) = (f64::from(similarity), f64::from(cross));
        Near {
            similarity,
            relevance: (calibration.evidence(s) + CROSS.evidence(c)) / 2.0,
            order: (calibration.unclamped(s) + CROSS.unclamped(c)) / 2.0,
            chunk_uid,
            library_uid,
        }
    }
}

/// A ranked chunk before its text is read.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct Ranked {
    pub(crate) chunk_uid: String,
    pub(crate) library_uid: String,
    pub(crate) score: f64,
    pub(crate) relevance: f64,
    pub(crate) similarity: Option<f64>,
    pub(crate) found_by: Vec<Signal>,
}

/// One ranking out of the keyword candidates (scored, any order) and the
/// semantic ones (best first): keyword or semantic alone, or their fusion.
///
/// A semantic hit's relevance is the meaning's evidence (`Near`). In a hybrid
/// ranking each signal is evidence that the chunk answers, and either may
/// vouch for it: relevance = 1 − (1 − keyword evidence)(1 − evidence) (a
/// noisy-or; a signal that did not find the chunk gives 0). Keyword evidence
/// is the chunk's keyword relevance (the share of the query it holds) times
/// the largest share any candidate holds: when some chunk holds the whole
/// question that factor is 1; when none does, the question is worded
/// otherwise than the library (a paraphrase, another language) and a chunk
/// sharing some of its words counts for less beside what the meaning finds
/// (when the meaning finds nothing, no vector yet, the factor is 1).
///
/// The order follows the same noisy-or, except that without a whole-query
/// match a partial keyword share is no evidence at all: the meaning orders
/// the hits, and a chunk that only shares words with the question comes
/// after those the meaning vouches for by more than its keyword term below
/// (at most `KEYWORD_ORDER_WEIGHT` × its share). Its relevance, which the
/// threshold reads, keeps the scaled share: the threshold keeps the same
/// hits (though under a `limit` the order decides which of them fit). The
/// score is that ordering evidence plus `KEYWORD_ORDER_WEIGHT` × the keyword
/// score relative to the best keyword score of this search × the keyword
/// relevance, so a whole-query keyword match and a close paraphrase both
/// rank high, whichever signal found them, and BM25 orders the keyword
/// matches among themselves. Every term is a function of the caller's
/// libraries only.
///
/// A semantic search keeps its best `limit` (the search's limit, or more
/// for a reranker to reorder: `Engine::answer`); the others keep every
/// candidate, for the floor.
pub(crate) fn fuse(mode: Mode, mut keyword: Vec<rank::Scored>, semantic: Vec<Near>, limit: usize) -> Vec<Ranked> {
    let sem = |n: Near| Ranked {
        chunk_uid: n.chunk_uid,
        library_uid: n.library_uid,
        score: f64::from(n.similarity),
        relevance: n.relevance,
        similarity: Some(f64::from(n.similarity)),
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
            // The largest share of the query any candidate holds: 1 when some
            // chunk holds the whole question. Without semantic candidates (no
            // vector in these libraries yet) there is no meaning to yield
            // to, and a keyword share keeps its value.
            let whole = if semantic.is_empty() {
                1.0
            } else {
                keyword.iter().map(|k| k.relevance).fold(0.0, f64::max)
            };
            // Whether a keyword share orders the hits: beside a whole-query
            // match (its relevance is exactly 1: the matched words' weights
            // over their own sum, `rank::Weights`), or with no meaning to
            // order them.
            let shares_order = whole >= 1.0;
            // Per hit: the evidence that orders it (before the noisy-or with
            // the meaning's) and the keyword term of its score.
            let mut ordering: Vec<(f64, f64)> = Vec::with_capacity(keyword.len() + semantic.len());
            for k in keyword {
                let mut r = kw(k);
                let keyword_order = KEYWORD_ORDER_WEIGHT * (r.score / best) * r.relevance;
                r.relevance *= whole;
                ordering.push((if shares_order { r.relevance } else { 0.0 }, keyword_order));
                at.insert(r.chunk_uid.clone(), out.len());
                out.push(r);
            }
            for s in semantic.into_iter().take(CANDIDATES) {
                let r = sem(s);
                match at.get(&r.chunk_uid) {
                    Some(&i) => {
                        let hit = &mut out[i];
                        hit.relevance = 1.0 - (1.0 - hit.relevance) * (1.0 - r.relevance);
                        ordering[i].0 = 1.0 - (1.0 - ordering[i].0) * (1.0 - r.relevance);
                        hit.similarity = r.similarity;
                        hit.found_by.push(Signal::Semantic);
                    }
                    None => {
                        ordering.push((r.relevance, 0.0));
                        out.push(r);
                    }
                }
            }
            for (r, (evidence, keyword_order)) in out.iter_mut().zip(ordering) {
                r.score = evidence + keyword_order;
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

    const E5: Calibration = Calibration {
        unrelated: 0.8,
        answers: 0.9,
    };

    fn sem(uid: &str, similarity: f32) -> Near {
        Near::of(E5, similarity, uid.to_owned(), "lib".to_owned())
    }

    #[test]
    fn a_weak_keyword_match_outranks_an_unrelated_chunk_but_not_a_close_paraphrase() {
        let keyword = vec![kw("best", 10.0, 1.0), kw("weak", 2.0, 0.5)];
        // "noise" shares no word and is no more similar than unrelated text.
        let r = fuse(Mode::Hybrid, keyword.clone(), vec![sem("noise", 0.79)], 10);
        assert_eq!(order(&r), ["best", "weak", "noise"]);
        let noise = r.iter().find(|x| x.chunk_uid == "noise").unwrap();
        assert_eq!((noise.score, noise.relevance), (0.0, 0.0));
        // a close paraphrase (no shared word) passes the weak match.
        let r = fuse(Mode::Hybrid, keyword, vec![sem("close", 0.88)], 10);
        assert_eq!(order(&r), ["best", "close", "weak"]);
    }

    #[test]
    fn without_a_whole_query_match_a_partial_one_yields_to_the_meaning() {
        // No chunk holds the whole question (the best holds half of it): its
        // words are not the library's, and a chunk sharing one of them is
        // weaker evidence than the chunk whose meaning is close.
        let keyword = vec![kw("common", 5.0, 0.5), kw("rare", 1.0, 0.25)];
        let semantic = vec![sem("meaning", 0.84), sem("common", 0.80)];
        let r = fuse(Mode::Hybrid, keyword.clone(), semantic.clone(), 10);
        assert_eq!(order(&r)[0], "meaning");
        let rel = |uid: &str| r.iter().find(|x| x.chunk_uid == uid).unwrap().relevance;
        assert!(
            (rel("common") - 0.25).abs() < 1e-6,
            "0.5 of the query × the best share 0.5"
        );
        assert!((rel("rare") - 0.125).abs() < 1e-6);
        assert!((rel("meaning") - 0.4).abs() < 1e-6);
        // With a whole-query match in the library, the same partial match
        // keeps its full share.
        let mut with_whole = keyword;
        with_whole.push(kw("whole", 9.0, 1.0));
        let r = fuse(Mode::Hybrid, with_whole, semantic, 10);
        let common = r.iter().find(|x| x.chunk_uid == "common").unwrap();
        assert!((common.relevance - 0.5).abs() < 1e-6);
        assert_eq!(order(&r)[..2], ["whole", "common"]);
        // No semantic candidate at all (chunks not embedded yet): nothing to
        // yield to, the share stands.
        let r = fuse(Mode::Hybrid, vec![kw("common", 5.0, 0.5)], vec![], 10);
        assert!((r[0].relevance - 0.5).abs() < 1e-6);
    }

    #[test]
    fn without_a_whole_query_match_the_meaning_orders_and_the_share_stays_in_the_relevance() {
        // No chunk holds the whole question (a paraphrase, another language):
        // "shared" holds half its words and nothing of its meaning, "faint"
        // only a little of its meaning, "close" more of it than "both",
        // which also shares half the words.
        let keyword = vec![kw("shared", 5.0, 0.5), kw("both", 4.0, 0.5)];
        let semantic = vec![sem("close", 0.86), sem("both", 0.85), sem("faint", 0.82)];
        let r = fuse(Mode::Hybrid, keyword, semantic, 10);
        assert_eq!(order(&r), ["close", "both", "faint", "shared"]);
        let rel = |uid: &str| r.iter().find(|x| x.chunk_uid == uid).unwrap().relevance;
        // The relevance still counts the scaled share (0.5 × 0.5): the
        // threshold keeps a page the meaning missed.
        assert!((rel("shared") - 0.25).abs() < 1e-6);
        assert!((rel("both") - (1.0 - 0.75 * 0.5)).abs() < 1e-6);
        assert!((rel("faint") - 0.2).abs() < 1e-6);
        assert!((rel("close") - 0.6).abs() < 1e-6);
    }

    #[test]
    fn with_a_whole_query_match_or_no_meaning_the_score_is_relevance_plus_keyword_order() {
        // The order rule changes nothing here: score = relevance + 0.1 ×
        // (score ÷ best score) × keyword relevance, to the bit.
        let keyword = vec![kw("whole", 8.0, 1.0), kw("half", 4.0, 0.5), kw("third", 2.0, 1.0 / 3.0)];
        let cases = [
            vec![sem("half", 0.85), sem("meaning", 0.83), sem("whole", 0.81)],
            vec![],
        ];
        for semantic in cases {
            let r = fuse(Mode::Hybrid, keyword.clone(), semantic, 10);
            for hit in &r {
                let k = keyword.iter().find(|k| k.chunk_uid == hit.chunk_uid);
                let term = k.map_or(0.0, |k| KEYWORD_ORDER_WEIGHT * (k.score / 8.0) * k.relevance);
                assert_eq!(
                    hit.score.to_bits(),
                    (hit.relevance + term).to_bits(),
                    "{}",
                    hit.chunk_uid
                );
            }
        }
    }

    #[test]
    fn either_signal_vouches_for_a_hit_and_both_vouch_more() {
        let keyword = vec![kw("whole", 1.0, 1.0), kw("both", 4.0, 0.5), kw("words", 8.0, 0.5)];
        let r = fuse(Mode::Hybrid, keyword, vec![sem("both", 0.85), sem("meaning", 0.85)], 10);
        let rel = |uid: &str| r.iter().find(|x| x.chunk_uid == uid).unwrap().relevance;
        assert!((rel("both") - 0.75).abs() < 1e-6, "1 − 0.5 × 0.5");
        assert!((rel("words") - 0.5).abs() < 1e-6);
        assert!((rel("meaning") - 0.5).abs() < 1e-6);
        assert_eq!(order(&r)[..2], ["whole", "both"]);
        // Equal relevance: the stronger keyword match first.
        assert_eq!(order(&r)[2..], ["words", "meaning"]);
    }

    #[test]
    fn whole_query_matches_keep_their_keyword_order() {
        let keyword = vec![kw("a", 3.0, 1.0), kw("b", 9.0, 1.0), kw("c", 6.0, 1.0)];
        let r = fuse(Mode::Hybrid, keyword, vec![sem("a", 0.95), sem("c", 0.81)], 10);
        assert_eq!(order(&r), ["b", "c", "a"]);
    }

    #[test]
    fn semantic_relevance_is_the_calibrated_evidence() {
        let r = fuse(
            Mode::Semantic,
            vec![],
            vec![sem("x", 0.85), sem("y", 0.7), sem("z", 0.95)],
            10,
        );
        let rel: Vec<f64> = r.iter().map(|x| x.relevance).collect();
        assert!((rel[0] - 0.5).abs() < 1e-6 && rel[1] == 0.0 && rel[2] == 1.0, "{rel:?}");
        assert_eq!(r[0].score, f64::from(0.85f32), "semantic mode ranks by the similarity");
        let minilm = Calibration::of(ModelKind::MiniLm);
        assert_eq!(minilm.evidence(minilm.unrelated), 0.0);
        assert_eq!(minilm.evidence(minilm.answers), 1.0);
    }

    fn relevances(r: &[Ranked]) -> Vec<(&str, f64)> {
        r.iter().map(|x| (x.chunk_uid.as_str(), x.relevance)).collect()
    }

    #[test]
    fn the_default_floor_keeps_an_answered_question_whole_and_an_off_topic_one_empty() {
        // Answered: the best hit reaches the threshold, so the weaker page that
        // something supports stays (after it); a hit nothing supports goes.
        let answered = fuse(
            Mode::Hybrid,
            vec![kw("answer", 9.0, 1.0), kw("partial", 2.0, 0.2)],
            vec![sem("answer", 0.92), sem("other language", 0.82), sem("unrelated", 0.7)],
            10,
        );
        let mut kept = answered.clone();
        let floor = Floor::Answer(DEFAULT_MIN_RELEVANCE);
        floor.apply(&mut kept);
        kept.sort_by(|a, b| floor.leads(b).cmp(&floor.leads(a)).then(b.score.total_cmp(&a.score)));
        let kept = relevances(&kept);
        assert_eq!(
            kept.iter().map(|k| k.0).collect::<Vec<_>>(),
            ["answer", "partial", "other language"]
        );
        assert!(
            kept.iter().skip(1).all(|k| k.1 > 0.0 && k.1 < DEFAULT_MIN_RELEVANCE),
            "{kept:?}"
        );
        // The caller's min_relevance cuts each hit: only the answer is left.
        let mut cut = answered.clone();
        Floor::Hit(DEFAULT_MIN_RELEVANCE).apply(&mut cut);
        assert_eq!(relevances(&cut).iter().map(|k| k.0).collect::<Vec<_>>(), ["answer"]);
        // 0 keeps every candidate, the unsupported one too.
        let mut all = answered;
        Floor::Hit(0.0).apply(&mut all);
        assert_eq!(all.len(), 4);

        // Off topic: some words and some meaning, nothing reaching the threshold.
        let mut off = fuse(
            Mode::Hybrid,
            vec![kw("common word", 3.0, 0.25)],
            vec![sem("near miss", 0.82), sem("common word", 0.8)],
            10,
        );
        assert!(
            off.iter()
                .all(|r| r.relevance > 0.0 && r.relevance < DEFAULT_MIN_RELEVANCE),
            "{off:?}"
        );
        Floor::Answer(DEFAULT_MIN_RELEVANCE).apply(&mut off);
        assert!(off.is_empty());
        // Without a whole-query match the meaning orders: the partial
        // keyword match the threshold vouches for (0.7 × 0.7) scores below
        // a weaker semantic hit, and still leads the default answer.
        let partial = fuse(
            Mode::Hybrid,
            vec![kw("share", 5.0, 0.7)],
            vec![sem("meaning", 0.825), sem("share", 0.75)],
            10,
        );
        assert_eq!(order(&partial), ["meaning", "share"]);
        let (share, meaning) = (&partial[0], &partial[1]);
        assert!(
            share.relevance >= DEFAULT_MIN_RELEVANCE && meaning.relevance < DEFAULT_MIN_RELEVANCE_ONE_MODEL,
            "{partial:?}"
        );
        assert!(floor.leads(share) && !floor.leads(meaning) && !Floor::Hit(DEFAULT_MIN_RELEVANCE).leads(share));
        assert_eq!(default_min_relevance(true), DEFAULT_MIN_RELEVANCE);
        assert_eq!(default_min_relevance(false), DEFAULT_MIN_RELEVANCE_ONE_MODEL);
        // A NaN relevance reaches no threshold.
        let mut nan = vec![Ranked {
            relevance: f64::NAN,
            ..fuse(Mode::Keyword, vec![kw("x", 1.0, 1.0)], vec![], 10).remove(0)
        }];
        Floor::Answer(DEFAULT_MIN_RELEVANCE).apply(&mut nan);
        assert!(nan.is_empty());
        assert_eq!(Floor::Answer(0.3).per_hit(), 0.0);
        assert_eq!(Floor::Hit(0.4).per_hit(), 0.4);
    }

    #[test]
    fn both_models_evidence_is_their_mean_and_the_scaled_dot_product_orders_it() {
        // e5 at 0.85 (evidence 0.5), USE at 0.31 (evidence 0.5): 0.5.
        let n = Near::of_both(E5, 0.85, 0.31, "a".into(), "lib".into());
        assert!((n.relevance - 0.5).abs() < 1e-6, "{n:?}");
        assert_eq!(n.similarity, 0.85, "the similarity shown is the embedding model's");
        // One model sure, the other not at all: half the evidence.
        let n = Near::of_both(E5, 0.95, 0.05, "b".into(), "lib".into());
        assert!((n.relevance - 0.5).abs() < 1e-9, "{n:?}");
        // The order is the unclamped mean: past 1 for a chunk both vouch for
        // beyond `answers`, below 0 for one neither does.
        assert!(Near::of_both(E5, 0.97, 0.7, "c".into(), "lib".into()).order > 1.0);
        assert!(Near::of_both(E5, 0.7, 0.0, "d".into(), "lib".into()).order < 0.0);
        // What the index's dot product of the scaled query computes (up to
        // a constant): the sum of the two unclamped evidences.
        let (s, c) = (0.83f64, 0.42f64);
        let dot = s * E5.weight() + c * CROSS.weight();
        let order = Near::of_both(E5, s as f32, c as f32, "e".into(), "lib".into()).order;
        let constant = (E5.unrelated * E5.weight() + CROSS.unrelated * CROSS.weight()) / 2.0;
        assert!((dot / 2.0 - constant - order).abs() < 1e-6);
        // The embedding model alone: its evidence, ordered as its similarity.
        let one = Near::of(E5, 0.85, "f".into(), "lib".into());
        assert!((one.relevance - 0.5).abs() < 1e-6);
        assert!(Near::of(E5, 0.86, "g".into(), "lib".into()).order > one.order);
        // Hybrid reads the relevance given; semantic mode scores by similarity.
        let r = fuse(
            Mode::Hybrid,
            vec![],
            vec![Near::of_both(E5, 0.85, 0.31, "a".into(), "lib".into())],
            10,
        );
        assert!((r[0].relevance - 0.5).abs() < 1e-6);
        let r = fuse(Mode::Semantic, vec![], vec![one], 10);
        assert_eq!(r[0].score, f64::from(0.85f32));
    }
}
