//! Keyword ranking: BM25 computed here, per library, from that library's own
//! statistics only — its chunk count and average length (read at most
//! `STATS_TTL` ago) and document frequencies counted over its candidates
//! (every chunk of the library holding a query term) — so a tenant's ranking
//! is a function of its own libraries and never of what other tenants hold.
//!
//! Title terms are a second field (BM25 without length normalization,
//! weighted `TITLE_WEIGHT`). Each hit also gets a `relevance` in [0, 1]: the
//! share of the query's IDF weight the chunk matches (text or title). A term
//! the library does not hold at all has the largest IDF, so a question about
//! something the library does not cover scores low however common its few
//! matching words are.

/// One library's corpus statistics (as the graph or the index counts them),
/// read again past `STATS_TTL` on the graph path: a library that just grew
/// ranks with its previous counts for at most this long (its document
/// frequencies are always current).
pub use crate::store::graph::knowledge::{LibraryStats, STATS_TTL};
use std::collections::HashMap;

/// BM25 term-frequency saturation.
const K1: f64 = 1.2;
/// BM25 length normalization.
const B: f64 = 0.75;
/// Weight of a title match against a text match.
pub const TITLE_WEIGHT: f64 = 1.0;

/// A chunk holding at least one query term: its library, length, and the
/// frequency of each query term in its text and in its item's title.
#[derive(Clone, Debug)]
pub struct Candidate {
    pub chunk_uid: String,
    pub library_uid: String,
    pub dl: i64,
    pub tf: Vec<i64>,
    pub tf_title: Vec<i64>,
}

/// A ranked candidate.
#[derive(Clone, Debug, PartialEq)]
pub struct Scored {
    pub chunk_uid: String,
    pub library_uid: String,
    pub score: f64,
    pub relevance: f64,
}

fn idf(n: f64, df: f64) -> f64 {
    (1.0 + (n - df + 0.5) / (df + 0.5)).ln()
}

/// Scores the candidates of one library (all of them hold `terms` query
/// terms in `tf`/`tf_title` order). Deterministic: the same candidates and
/// statistics give the same scores, bit for bit.
pub fn score_library(stats: LibraryStats, terms: usize, candidates: &[Candidate]) -> Vec<Scored> {
    score_library_grouped(stats, &one_word_each(terms), candidates)
}

/// Each term a query word of its own.
fn one_word_each(terms: usize) -> Vec<usize> {
    (0..terms).collect()
}

/// `score_library` for terms grouped by the query word they come from
/// (`groups[i]` for term `i`; see `score_grouped`).
pub fn score_library_grouped(stats: LibraryStats, groups: &[usize], candidates: &[Candidate]) -> Vec<Scored> {
    let terms = groups.len();
    if candidates.is_empty() || terms == 0 {
        return Vec::new();
    }
    fn flat(v: &[i64], terms: usize) -> impl Iterator<Item = i64> + '_ {
        (0..terms).map(move |i| v.get(i).copied().unwrap_or(0))
    }
    let dl: Vec<i64> = candidates.iter().map(|c| c.dl).collect();
    let tf: Vec<i64> = candidates.iter().flat_map(|c| flat(&c.tf, terms)).collect();
    let tt: Vec<i64> = candidates.iter().flat_map(|c| flat(&c.tf_title, terms)).collect();
    score_grouped(stats, groups, &dl, &tf, &tt)
        .into_iter()
        .zip(candidates)
        .map(|((score, relevance), c)| Scored {
            chunk_uid: c.chunk_uid.clone(),
            library_uid: c.library_uid.clone(),
            score,
            relevance,
        })
        .collect()
}

/// (score, relevance) of each candidate of one library: candidate `j` has
/// length `dl[j]` and frequencies `tf[j * terms + i]` (text) and
/// `tf_title[j * terms + i]` (title) of query term `i`. Every candidate
/// holds a term, so they count the library's document frequencies. Used by
/// the graph path (`score_library`) and the index (`search::index`) alike.
pub fn score(stats: LibraryStats, terms: usize, dl: &[i64], tf: &[i64], tf_title: &[i64]) -> Vec<(f64, f64)> {
    score_grouped(stats, &one_word_each(terms), dl, tf, tf_title)
}

/// `score` for terms grouped by the query word they come from: `groups[i]`
/// is term `i`'s word (the terms are `groups.len()`). A word stemmed two ways
/// (the query analyzed in the library's language and in the one it looks
/// like) is one word for relevance: it weighs what its lighter form weighs
/// (the form the library holds, when one is absent) and a chunk holding
/// either form matches it. BM25 scores every term as before. With one term
/// per word this is `score`, bit for bit.
pub fn score_grouped(
    stats: LibraryStats,
    groups: &[usize],
    dl: &[i64],
    tf: &[i64],
    tf_title: &[i64],
) -> Vec<(f64, f64)> {
    let mut out = Vec::new();
    score_grouped_into(stats, groups, dl, tf, tf_title, &mut out);
    out
}

/// `score_grouped` into `out` (cleared first), so that a caller scoring
/// many queries reuses one buffer.
pub fn score_grouped_into(
    stats: LibraryStats,
    groups: &[usize],
    dl: &[i64],
    tf: &[i64],
    tf_title: &[i64],
    out: &mut Vec<(f64, f64)>,
) {
    out.clear();
    let terms = groups.len();
    let count = dl.len();
    if count == 0 || terms == 0 {
        return;
    }
    // Every candidate holds a term: they count the document frequencies.
    let mut df = vec![0f64; terms];
    let mut df_title = vec![0f64; terms];
    for j in 0..count {
        for i in 0..terms {
            df[i] += f64::from(tf[j * terms + i] > 0);
            df_title[i] += f64::from(tf_title[j * terms + i] > 0);
        }
    }
    Weights::new(stats, groups, &df, &df_title, count).score_into(dl, tf, tf_title, out);
}

/// One query's weights in one library: each term's IDF per field and each
/// query word's share of relevance, from the library's statistics and the
/// terms' document frequencies over its candidates (`candidates` chunks hold
/// a term: a library that grew since its statistics were read may have more
/// of them than chunks).
pub struct Weights {
    avgdl: f64,
    idf_text: Vec<f64>,
    idf_title: Vec<f64>,
    /// Each term's word, as an index into `word_weight`.
    word_of: Vec<usize>,
    word_weight: Vec<f64>,
    total_weight: f64,
}

impl Weights {
    /// `groups[i]` is term `i`'s query word (see `score_grouped`); `df[i]`
    /// and `df_title[i]` the candidates holding it in their text and title.
    pub fn new(stats: LibraryStats, groups: &[usize], df: &[f64], df_title: &[f64], candidates: usize) -> Weights {
        let terms = groups.len();
        let n = (stats.n.max(0) as f64).max(candidates as f64);
        let avgdl = if stats.n > 0 && stats.tokens > 0 {
            stats.tokens as f64 / stats.n as f64
        } else {
            1.0
        };
        let idf_text: Vec<f64> = df.iter().map(|d| idf(n, *d)).collect();
        let idf_title: Vec<f64> = df_title.iter().map(|d| idf(n, *d)).collect();
        // A term's weight for relevance: its IDF over the field that holds
        // it most (absent from the library: the largest IDF there is).
        let weight: Vec<f64> = (0..terms).map(|i| idf(n, df[i].max(df_title[i]))).collect();
        // The words, in order of first appearance, and each one's weight.
        let mut words: Vec<usize> = Vec::new();
        for g in groups {
            if !words.contains(g) {
                words.push(*g);
            }
        }
        let word_weight: Vec<f64> = words
            .iter()
            .map(|w| {
                (0..terms)
                    .filter(|i| groups[*i] == *w)
                    .map(|i| weight[i])
                    .fold(f64::INFINITY, f64::min)
            })
            .collect();
        let total_weight: f64 = word_weight.iter().sum();
        let word_of: Vec<usize> = groups
            .iter()
            .map(|g| words.iter().position(|w| w == g).unwrap_or(0))
            .collect();
        Weights {
            avgdl,
            idf_text,
            idf_title,
            word_of,
            word_weight,
            total_weight,
        }
    }

    /// (score, relevance) of each candidate into `out` (appended): candidate
    /// `j` has length `dl[j]` and frequencies `tf[j * terms + i]` (text) and
    /// `tf_title[j * terms + i]` (title) of term `i`.
    pub fn score_into(&self, dl: &[i64], tf: &[i64], tf_title: &[i64], out: &mut Vec<(f64, f64)>) {
        let terms = self.word_of.len();
        // One buffer of matched words, reused for every candidate.
        let mut hit = vec![false; self.word_weight.len()];
        out.reserve(dl.len());
        for (j, len) in dl.iter().enumerate() {
            let row = j * terms..(j + 1) * terms;
            out.push(self.score_row(*len, &tf[row.clone()], &tf_title[row], &mut hit));
        }
    }

    /// (score, relevance) of one candidate of length `dl` with frequencies
    /// `tf[i]` (text) and `tf_title[i]` (title) of term `i`; `hit` is a
    /// buffer of one flag per query word. Every path scores a chunk here, so
    /// the same frequencies give the same bits.
    pub fn score_row(&self, dl: i64, tf: &[i64], tf_title: &[i64], hit: &mut [bool]) -> (f64, f64) {
        let norm = self.norm(dl);
        let mut score = 0.0;
        hit.fill(false);
        for i in 0..self.word_of.len() {
            let tf = tf[i].max(0) as f64;
            let tt = tf_title[i].max(0) as f64;
            if tf > 0.0 {
                score += self.text_part(i, tf, norm);
            }
            if tt > 0.0 {
                score += self.title_part(i, tt);
            }
            if tf > 0.0 || tt > 0.0 {
                hit[self.word_of[i]] = true;
            }
        }
        let relevance = self.relevance(hit);
        // Coordination: a chunk matching more of the query's weight
        // ranks above one repeating a single rare word.
        (score * relevance, relevance)
    }

    /// The length normalization of a chunk of `dl` terms.
    pub fn norm(&self, dl: i64) -> f64 {
        K1 * (1.0 - B + B * dl.max(0) as f64 / self.avgdl)
    }

    /// Term `i`'s BM25 in the text of a chunk holding it `tf` (> 0) times,
    /// its length normalization `norm`.
    pub fn text_part(&self, i: usize, tf: f64, norm: f64) -> f64 {
        self.idf_text[i] * tf * (K1 + 1.0) / (tf + norm)
    }

    /// Term `i`'s BM25 in a title holding it `tt` (> 0) times.
    pub fn title_part(&self, i: usize, tt: f64) -> f64 {
        TITLE_WEIGHT * self.idf_title[i] * tt * (K1 + 1.0) / (tt + K1)
    }

    /// What term `i`'s BM25 in the text (or, `title`, in the title) stays
    /// strictly below whatever the chunk: it saturates at `idf · (K1 + 1)`.
    pub fn part_bound(&self, i: usize, title: bool) -> f64 {
        if title {
            TITLE_WEIGHT * self.idf_title[i] * (K1 + 1.0)
        } else {
            self.idf_text[i] * (K1 + 1.0)
        }
    }

    /// The query words (of `groups`, in order of first appearance).
    pub fn words(&self) -> usize {
        self.word_weight.len()
    }

    /// Term `i`'s query word (an index below `words`).
    pub fn word_of(&self, i: usize) -> usize {
        self.word_of[i]
    }

    /// The share of the query's weight of the words marked in `hit`.
    pub fn relevance(&self, hit: &[bool]) -> f64 {
        self.relevance_of(|w| hit[w])
    }

    /// `relevance` of the words marked in `a` or in `b`, summed in the same
    /// order: never below that of either (the weights are not negative).
    pub fn relevance_either(&self, a: &[bool], b: &[bool]) -> f64 {
        self.relevance_of(|w| a[w] || b[w])
    }

    fn relevance_of(&self, hit: impl Fn(usize) -> bool) -> f64 {
        let mut matched = 0.0;
        for (w, weight) in self.word_weight.iter().enumerate() {
            if hit(w) {
                matched += weight;
            }
        }
        if self.total_weight > 0.0 {
            matched / self.total_weight
        } else {
            0.0
        }
    }

    /// For a chunk holding no term outside the word of term `word_term`:
    /// its relevance, and a bound its score stays strictly below (each
    /// term's BM25 saturates below `idf · (K1 + 1)` in either field).
    pub fn bound_of_word(&self, word_term: usize) -> (f64, f64) {
        let w = self.word_of[word_term];
        let mut hit = vec![false; self.word_weight.len()];
        hit[w] = true;
        let relevance = self.relevance(&hit);
        let mut most = 0.0;
        for i in (0..self.word_of.len()).filter(|i| self.word_of[*i] == w) {
            most += self.idf_text[i] * (K1 + 1.0) + TITLE_WEIGHT * self.idf_title[i] * (K1 + 1.0);
        }
        (most * relevance, relevance)
    }
}

/// Groups candidates by library.
pub fn by_library(candidates: Vec<Candidate>) -> HashMap<String, Vec<Candidate>> {
    let mut out: HashMap<String, Vec<Candidate>> = HashMap::new();
    for c in candidates {
        out.entry(c.library_uid.clone()).or_default().push(c);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cand(uid: &str, dl: i64, tf: &[i64], tf_title: &[i64]) -> Candidate {
        Candidate {
            chunk_uid: uid.into(),
            library_uid: "lib".into(),
            dl,
            tf: tf.to_vec(),
            tf_title: tf_title.to_vec(),
        }
    }

    #[test]
    fn rarer_terms_weigh_more_and_short_chunks_win_ties() {
        let stats = LibraryStats { n: 100, tokens: 10_000 };
        // term 0 is rare (1 chunk), term 1 common (3 chunks).
        let cs = [
            cand("a", 100, &[1, 0], &[0, 0]),
            cand("b", 100, &[0, 1], &[0, 0]),
            cand("c", 50, &[0, 1], &[0, 0]),
            cand("d", 200, &[0, 1], &[0, 0]),
        ];
        let s = score_library(stats, 2, &cs);
        assert!(s[0].score > s[1].score, "the rare term");
        assert!(
            s[2].score > s[1].score && s[1].score > s[3].score,
            "length normalization"
        );
    }

    #[test]
    fn a_title_match_counts_and_relevance_is_the_matched_share() {
        let stats = LibraryStats { n: 10, tokens: 1000 };
        let cs = [cand("a", 100, &[0, 0], &[1, 0]), cand("b", 100, &[1, 1], &[0, 0])];
        let s = score_library(stats, 2, &cs);
        assert!(s[0].score > 0.0);
        assert!(s[0].relevance > 0.0 && s[0].relevance < 1.0);
        assert!((s[1].relevance - 1.0).abs() < 1e-12);
    }

    #[test]
    fn the_two_stems_of_one_word_count_once_for_relevance() {
        // "quokka77bfb5990bfa" analyzed in English and in the language the
        // query looks like: the library holds only the first form.
        let stats = LibraryStats { n: 2, tokens: 20 };
        let cs = [cand("a", 10, &[1, 0], &[0, 0]), cand("b", 10, &[1, 0], &[0, 0])];
        for s in score_library_grouped(stats, &[0, 0], &cs) {
            assert!((s.relevance - 1.0).abs() < 1e-12, "{s:?}");
        }
        // As two words, the absent one would weigh the most (the old count).
        for s in score_library(stats, 2, &cs) {
            assert!(s.relevance < 0.2, "{s:?}");
        }
        // A second word still counts: holding one of two words is half-ish.
        let cs = [
            cand("a", 10, &[1, 0, 0], &[0, 0, 0]),
            cand("b", 10, &[0, 0, 1], &[0, 0, 0]),
        ];
        let s = score_library_grouped(stats, &[0, 0, 1], &cs);
        assert!(s[0].relevance > 0.0 && s[0].relevance < 1.0, "{s:?}");
        // One term per word: exactly the ungrouped scores.
        let cs = [cand("a", 8, &[2, 0], &[0, 1]), cand("b", 12, &[1, 3], &[1, 0])];
        assert_eq!(score_library_grouped(stats, &[0, 1], &cs), score_library(stats, 2, &cs));
    }

    #[test]
    fn scores_depend_only_on_the_library_given() {
        let stats = LibraryStats { n: 10, tokens: 1000 };
        let cs = [cand("a", 80, &[2], &[0]), cand("b", 120, &[1], &[1])];
        assert_eq!(score_library(stats, 1, &cs), score_library(stats, 1, &cs));
    }
}
