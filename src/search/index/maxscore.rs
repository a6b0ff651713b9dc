//! Exact top-k keyword scoring with MaxScore pruning: the hits, scores and
//! ties of scoring every posting (`keyword.rs`, kept as the test oracle),
//! without scoring every posting.
//!
//! **Statistics.** The weights need each term's document frequency over the
//! search's live documents. Without a collection filter that is the term's
//! `doc_freq` less the deleted documents holding it: each segment's deleted
//! documents are listed once per searcher generation (`LibraryIndex::live`)
//! and looked up in the postings by seeking, so a segment without deletes
//! costs nothing and one with a few costs a few seeks. With a collection
//! filter the postings are counted against it (decoding them, scoring none).
//!
//! **Pruning.** Each posting list (a term in the text or in the title) has a
//! bound its BM25 part stays below (`rank::Weights::part_bound`). A chunk's
//! score is its parts' sum times its relevance (the coordination factor),
//! so a chunk found only in a set of lists scores at most the set's bounds
//! summed times the relevance of the set's words (every word matched), and
//! cannot pass the `min_relevance` floor when those words' relevance is
//! below it. The lists are ordered by bound; the longest prefix whose chunks
//! can neither beat the k-th best score so far nor pass the floor is
//! *non-essential*: only documents of the other lists are visited, and for
//! each, the non-essential lists are looked up (largest bound first) only
//! while the chunk's known parts plus the bounds left could still make it.
//! A chunk that survives is scored by `rank::Weights::score_row`, as the
//! oracle scores it, so the scores are the same bits. A chunk is left out
//! only when its bound is below the k-th score (by a relative `MARGIN` for
//! rounding), so every chunk tied with the k-th is kept and the ties are
//! broken by chunk uid as before.

use std::cmp::Reverse;
use std::collections::BinaryHeap;

use tantivy::postings::{Postings, SegmentPostings};
use tantivy::schema::IndexRecordOption;
use tantivy::{DocId, DocSet, Term, TERMINATED};

use super::keyword::{Keyword, Segment};
use super::{rank, Hit, IndexError, LibraryIndex};

/// A chunk is pruned when its bound, raised by this share, is still below
/// the k-th score: the bound is a real-number bound and the scores are
/// rounded (far less than this over at most 128 parts).
const MARGIN: f64 = 1e-9;

/// How many chunks of the lists with the largest bounds are scored first, for
/// a k-th score to prune with from the start (see `seed`).
const SEED_CHUNKS: usize = 1024;

/// One posting list of the query: term `term` in the text or the title.
struct List {
    term: usize,
    title: bool,
    /// Its term's query word (`rank::Weights::word_of`).
    word: usize,
    /// What its part of any chunk's score stays below.
    bound: f64,
    /// The live chunks it holds.
    df: f64,
}

/// The first `m` lists (in order of bound): their bounds summed, their words,
/// and those words' relevance.
struct Prefix {
    sum: f64,
    words: Vec<bool>,
    relevance: f64,
}

/// A score ordered by `total_cmp`.
#[derive(PartialEq)]
struct Ordered(f64);

impl Eq for Ordered {}

impl PartialOrd for Ordered {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for Ordered {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        self.0.total_cmp(&other.0)
    }
}

/// The best k scores so far, and every chunk scoring at least the k-th
/// (ties included: their uids decide at the end).
struct Best {
    k: usize,
    top: BinaryHeap<Reverse<Ordered>>,
    /// (score, relevance, segment, document).
    kept: Vec<(f64, f64, u32, DocId)>,
}

impl Best {
    fn new(k: usize) -> Self {
        Best {
            k,
            top: BinaryHeap::with_capacity(k + 1),
            kept: Vec::new(),
        }
    }

    /// The k-th best score so far (below every score until there are k).
    fn threshold(&self) -> f64 {
        match self.top.peek() {
            Some(Reverse(Ordered(s))) if self.top.len() >= self.k => *s,
            _ => f64::NEG_INFINITY,
        }
    }

    fn offer(&mut self, score: f64, relevance: f64, seg: u32, doc: DocId) {
        let kth = self.threshold();
        if score < kth {
            return;
        }
        if self.top.len() < self.k {
            self.top.push(Reverse(Ordered(score)));
        } else if score > kth {
            self.top.pop();
            self.top.push(Reverse(Ordered(score)));
        }
        self.kept.push((score, relevance, seg, doc));
        if self.kept.len() > 2 * self.k + 64 {
            let kth = self.threshold();
            self.kept.retain(|e| e.0 >= kth);
        }
    }
}

/// The chunk being looked at: its frequencies found so far (as the oracle's
/// rows hold them), its words, and the BM25 parts they add up to.
struct Row {
    tf: Vec<i64>,
    tt: Vec<i64>,
    hit: Vec<bool>,
    known: f64,
    /// Its length normalization.
    norm: f64,
}

impl Row {
    fn new(terms: usize, words: usize) -> Self {
        Row {
            tf: vec![0; terms],
            tt: vec![0; terms],
            hit: vec![false; words],
            known: 0.0,
            norm: 0.0,
        }
    }

    fn clear(&mut self, norm: f64) {
        self.tf.fill(0);
        self.tt.fill(0);
        self.hit.fill(false);
        self.known = 0.0;
        self.norm = norm;
    }

    /// List `l` holds the chunk `freq` times.
    fn record(&mut self, weights: &rank::Weights, l: &List, freq: u32) {
        let n = i64::from(freq);
        if l.title {
            self.tt[l.term] = n;
            self.known += weights.title_part(l.term, n as f64);
        } else {
            self.tf[l.term] = n;
            self.known += weights.text_part(l.term, n as f64, self.norm);
        }
        self.hit[l.word] = true;
    }
}

impl LibraryIndex {
    /// The best `q.k` hits of `q` (see `LibraryIndex::score`), pruned (see
    /// the module's doc); `q.skip` and `q.budget` are the oracle's and
    /// unused here.
    pub(super) fn pruned(&self, q: &Keyword<'_>) -> Result<Vec<Hit>, IndexError> {
        if q.words.is_empty() || q.k == 0 || q.groups.len() != q.words.len() {
            return Ok(Vec::new());
        }
        let searcher = self.reader.searcher();
        let live = self.live(&searcher)?;
        let segments = self.segments(&searcher, q.collection)?;
        let (df, df_title) = self.live_doc_freqs(&segments, &live.dead, q.words)?;
        // The oracle passes the chunks holding a term, which are never more
        // than the library's live chunks (`live.stats.n`, the same searcher).
        let weights = rank::Weights::new(live.stats, q.groups, &df, &df_title, 0);
        let terms = q.words.len();
        let mut lists: Vec<List> = (0..terms)
            .flat_map(|term| [false, true].map(|title| (term, title)))
            .filter(|&(term, title)| if title { df_title[term] } else { df[term] } > 0.0)
            .map(|(term, title)| List {
                term,
                title,
                word: weights.word_of(term),
                bound: weights.part_bound(term, title),
                df: if title { df_title[term] } else { df[term] },
            })
            .collect();
        lists.sort_by(|a, b| a.bound.total_cmp(&b.bound));
        let mut prefix = vec![Prefix {
            sum: 0.0,
            words: vec![false; weights.words()],
            relevance: weights.relevance(&vec![false; weights.words()]),
        }];
        for l in &lists {
            let last = &prefix[prefix.len() - 1];
            let mut words = last.words.clone();
            words[l.word] = true;
            prefix.push(Prefix {
                sum: last.sum + l.bound,
                relevance: weights.relevance(&words),
                words,
            });
        }
        let floor = q.min_relevance;
        // Chunks only in the first `m` lists can make neither the floor nor
        // the best k.
        let hopeless = |m: usize, kth: f64| {
            let p = &prefix[m];
            p.relevance < floor || p.sum * p.relevance * (1.0 + MARGIN) < kth
        };
        let seeded = self.seed(&segments, &lists, &weights, q, SEED_CHUNKS.max(4 * q.k))?;
        let kth = |best: &Best| best.threshold().max(seeded);
        let mut best = Best::new(q.k);
        let mut essential_from = 0;
        let mut row = Row::new(terms, weights.words());
        let mut row_hit = vec![false; weights.words()];
        'segments: for seg in &segments {
            let dls = seg.reader.fast_fields().u64("dl")?;
            let mut cursors = self.cursors(seg, &lists, q.words)?;
            loop {
                while essential_from < lists.len() && hopeless(essential_from + 1, kth(&best)) {
                    essential_from += 1;
                }
                if essential_from == lists.len() {
                    // No chunk of this segment or the next can enter.
                    break 'segments;
                }
                let doc = cursors[essential_from..]
                    .iter()
                    .flatten()
                    .map(|c| c.doc())
                    .min()
                    .unwrap_or(TERMINATED);
                if doc == TERMINATED {
                    break;
                }
                if !seg.live(doc) {
                    for c in cursors[essential_from..].iter_mut().flatten() {
                        if c.doc() == doc {
                            c.advance();
                        }
                    }
                    continue;
                }
                let dl = dls.first(doc).unwrap_or(0) as i64;
                let norm = weights.norm(dl);
                row.clear(norm);
                for (l, c) in lists.iter().zip(cursors.iter_mut()).skip(essential_from) {
                    if let Some(c) = c.as_mut().filter(|c| c.doc() == doc) {
                        row.record(&weights, l, c.term_freq());
                        c.advance();
                    }
                }
                // The non-essential lists, largest bound first, while the
                // chunk can still make it.
                let kth = kth(&best);
                let mut m = essential_from;
                let mut out = false;
                while m > 0 {
                    let r = weights.relevance_either(&row.hit, &prefix[m].words);
                    if r < floor || (row.known + prefix[m].sum) * r * (1.0 + MARGIN) < kth {
                        out = true;
                        break;
                    }
                    m -= 1;
                    if let Some(c) = cursors[m].as_mut() {
                        if c.doc() < doc {
                            c.seek(doc);
                        }
                        if c.doc() == doc {
                            row.record(&weights, &lists[m], c.term_freq());
                        }
                    }
                }
                if out {
                    continue;
                }
                let (score, relevance) = weights.score_row(dl, &row.tf, &row.tt, &mut row_hit);
                if relevance >= floor && score >= seeded {
                    best.offer(score, relevance, seg.ord, doc);
                }
            }
        }
        let kth = best.threshold();
        let mut hits = Vec::with_capacity(best.kept.len());
        let mut buf = String::new();
        for (score, relevance, seg, doc) in best.kept.into_iter().filter(|e| e.0 >= kth) {
            if let Some(chunk_uid) = segments[seg as usize].uid(doc, &mut buf)? {
                hits.push(Hit {
                    chunk_uid,
                    score,
                    relevance,
                });
            }
        }
        hits.sort_by(|a, b| b.score.total_cmp(&a.score).then_with(|| a.chunk_uid.cmp(&b.chunk_uid)));
        hits.truncate(q.k);
        Ok(hits)
    }

    /// A score the final k-th best is at least: the k-th best exact score of
    /// the first `chunks` live chunks of the lists with the largest bounds
    /// (the rarest words', usually; as few as hold k chunks between them, so
    /// that a common word's many low scores do not set it), each chunk
    /// scored in full once (below every score when fewer
    /// than k pass the floor). Those chunks are candidates like any other,
    /// so pruning with it from the start leaves out only chunks below the
    /// final k-th; they are scored again, and offered, in the pruned pass.
    fn seed(
        &self,
        segments: &[Segment<'_>],
        lists: &[List],
        weights: &rank::Weights,
        q: &Keyword<'_>,
        chunks: usize,
    ) -> Result<f64, IndexError> {
        let mut lead = lists.len();
        let mut held = 0.0;
        while lead > 0 && held < q.k as f64 {
            lead -= 1;
            held += lists[lead].df;
        }
        // When those lists hold most of the postings (a selective query),
        // the pruned pass visits their chunks anyway, and a seed would only
        // score them twice.
        if held * 2.0 >= lists.iter().map(|l| l.df).sum::<f64>() {
            return Ok(f64::NEG_INFINITY);
        }
        let mut top: BinaryHeap<Reverse<Ordered>> = BinaryHeap::with_capacity(q.k + 1);
        let mut row = Row::new(q.words.len(), weights.words());
        let mut row_hit = vec![false; weights.words()];
        let mut scored = 0;
        for seg in segments {
            if scored >= chunks {
                break;
            }
            let dls = seg.reader.fast_fields().u64("dl")?;
            let mut cursors = self.cursors(seg, lists, q.words)?;
            while scored < chunks {
                let doc = cursors[lead..]
                    .iter()
                    .flatten()
                    .map(|c| c.doc())
                    .min()
                    .unwrap_or(TERMINATED);
                if doc == TERMINATED {
                    break;
                }
                if seg.live(doc) {
                    let dl = dls.first(doc).unwrap_or(0) as i64;
                    row.clear(weights.norm(dl));
                    for (l, c) in lists.iter().zip(cursors.iter_mut()) {
                        if let Some(c) = c.as_mut() {
                            if c.doc() < doc {
                                c.seek(doc);
                            }
                            if c.doc() == doc {
                                row.record(weights, l, c.term_freq());
                            }
                        }
                    }
                    let (score, relevance) = weights.score_row(dl, &row.tf, &row.tt, &mut row_hit);
                    if relevance >= q.min_relevance {
                        top.push(Reverse(Ordered(score)));
                        if top.len() > q.k {
                            top.pop();
                        }
                    }
                    scored += 1;
                }
                for c in cursors[lead..].iter_mut().flatten() {
                    if c.doc() == doc {
                        c.advance();
                    }
                }
            }
        }
        Ok(match top.peek() {
            Some(Reverse(Ordered(s))) if top.len() >= q.k => *s,
            _ => f64::NEG_INFINITY,
        })
    }

    /// The postings of each of `lists` in `seg`.
    fn cursors(
        &self,
        seg: &Segment<'_>,
        lists: &[List],
        words: &[String],
    ) -> Result<Vec<Option<SegmentPostings>>, IndexError> {
        let f = self.fields;
        lists
            .iter()
            .map(|l| {
                let field = if l.title { f.title_terms } else { f.text_terms };
                let term = Term::from_field_text(field, &words[l.term]);
                Ok(seg
                    .reader
                    .inverted_index(field)?
                    .read_postings(&term, IndexRecordOption::WithFreqs)?)
            })
            .collect()
    }

    /// Each term's document frequency in the text and in the title over the
    /// live documents of `segments` (deleted ones, `dead` per segment, and
    /// with a collection filter the others, left out), as the oracle counts
    /// them while scoring.
    fn live_doc_freqs(
        &self,
        segments: &[Segment<'_>],
        dead: &[Vec<DocId>],
        words: &[String],
    ) -> Result<(Vec<f64>, Vec<f64>), IndexError> {
        let f = self.fields;
        let (mut df, mut df_title) = (vec![0.0; words.len()], vec![0.0; words.len()]);
        for (seg, dead) in segments.iter().zip(dead) {
            for (field, counts) in [(f.text_terms, &mut df), (f.title_terms, &mut df_title)] {
                let inv = seg.reader.inverted_index(field)?;
                for (w, count) in words.iter().zip(counts.iter_mut()) {
                    let Some(info) = inv.get_term_info(&Term::from_field_text(field, w))? else {
                        continue;
                    };
                    let n = if seg.in_collection.is_none() && dead.is_empty() {
                        info.doc_freq
                    } else {
                        let mut p = inv.read_postings_from_terminfo(&info, IndexRecordOption::Basic)?;
                        if seg.in_collection.is_some() {
                            let mut n = 0;
                            while p.doc() != TERMINATED {
                                n += u32::from(seg.live(p.doc()));
                                p.advance();
                            }
                            n
                        } else {
                            let mut gone = 0;
                            for &d in dead {
                                if p.doc() < d {
                                    p.seek(d);
                                }
                                if p.doc() == TERMINATED {
                                    break;
                                }
                                gone += u32::from(p.doc() == d);
                            }
                            info.doc_freq - gone
                        }
                    };
                    *count += f64::from(n);
                }
            }
        }
        Ok((df, df_title))
    }
}

#[cfg(test)]
mod tests {
    use super::super::keyword::CANDIDATE_BYTES;
    use super::super::tests::{applied, chunk, dir};
    use super::super::vectors;
    use super::*;

    /// The pruned answer is the exhaustive one to the bit (uids, scores,
    /// relevances, tie order): random libraries of several segments, with
    /// deleted and replaced items, titles, two collections and chunks copied
    /// from others (exact ties), against random queries of one to five
    /// words — common, rare, absent, repeated, stemmed two ways — with
    /// random k, floors and collection filters.
    #[test]
    fn pruned_top_k_is_the_exhaustive_answer_to_the_bit() {
        use rand::seq::SliceRandom;
        use rand::{Rng, SeedableRng};
        let mut rng = rand::rngs::StdRng::seed_from_u64(52);
        // By how many chunks hold them: two common, some middling, some rare.
        let common = ["tidal", "kelp"];
        let middling = ["reef", "quasar", "tide", "orbit"];
        let rare = ["moon", "salt", "fjord"];
        let (mut compared, mut nonempty, mut tied) = (0, 0, 0);
        for round in 0..10 {
            let path = dir();
            let idx = LibraryIndex::open_or_create(&path, vectors::CodeCache::unbounded()).unwrap();
            let mut texts: Vec<String> = Vec::new();
            for batch in 0..rng.gen_range(1..5) {
                let mut chunks = Vec::new();
                for c in 0..rng.gen_range(50..500) {
                    let text = if !texts.is_empty() && rng.gen_bool(0.1) {
                        // A copy: the same frequencies and length.
                        texts[rng.gen_range(0..texts.len())].clone()
                    } else {
                        let mut t: Vec<&str> = Vec::new();
                        for w in common {
                            if rng.gen_bool([0.95, 0.7, 0.5][round % 3]) {
                                t.extend(std::iter::repeat_n(w, rng.gen_range(1..6)));
                            }
                        }
                        for w in middling {
                            if rng.gen_bool(0.15) {
                                t.extend(std::iter::repeat_n(w, rng.gen_range(1..4)));
                            }
                        }
                        for w in rare {
                            if rng.gen_bool(0.01) {
                                t.push(w);
                            }
                        }
                        t.extend(std::iter::repeat_n("filler", rng.gen_range(0..40)));
                        t.shuffle(&mut rng);
                        if t.is_empty() {
                            t.push("filler");
                        }
                        t.join(" ")
                    };
                    texts.push(text.clone());
                    let title = match rng.gen_range(0..10) {
                        0 => common[rng.gen_range(0..2)],
                        1 => middling[rng.gen_range(0..4)],
                        2 => "tidal kelp",
                        _ => "",
                    };
                    let mut ch = chunk(
                        &format!("r{round}b{batch}c{c}"),
                        &format!("i{}", rng.gen_range(0..80)),
                        &text,
                        title,
                    );
                    ch.collection_uid = if rng.gen_bool(0.6) { "col" } else { "other" }.into();
                    chunks.push(ch);
                }
                // Items deleted, or replaced by this batch's chunks of them.
                let deleted: Vec<String> = (0..rng.gen_range(0..6))
                    .map(|_| format!("i{}", rng.gen_range(0..80)))
                    .collect();
                idx.apply(&deleted, &chunks, &applied(batch + 1)).unwrap();
            }
            let searcher = idx.reader.searcher();
            let vocab: Vec<&str> = common
                .iter()
                .chain(&middling)
                .chain(&rare)
                .copied()
                .chain(["absent"])
                .collect();
            for _ in 0..60 {
                let n = rng.gen_range(1..6);
                let mut words = Vec::new();
                let mut groups = Vec::new();
                for g in 0..n {
                    let w = if g > 0 && rng.gen_bool(0.15) {
                        // A repeated word.
                        words[rng.gen_range(0..words.len())]
                    } else if rng.gen_bool(0.5) {
                        common[rng.gen_range(0..2)]
                    } else {
                        vocab[rng.gen_range(0..vocab.len())]
                    };
                    words.push(w);
                    // Sometimes the second stem of the word before.
                    groups.push(if g > 0 && rng.gen_bool(0.2) { groups[g - 1] } else { g });
                }
                let words: Vec<String> = words.into_iter().map(str::to_owned).collect();
                let q = Keyword {
                    words: &words,
                    groups: &groups,
                    collection: [None, None, Some("col"), Some("other"), Some("none")][rng.gen_range(0..5)],
                    min_relevance: [0.0, 0.0, 0.0, 0.1, 0.3, 0.5, 0.8, 1.0][rng.gen_range(0..8)],
                    k: [1, 2, 3, 10, 10, 50, 100, 5000][rng.gen_range(0..8)],
                    skip: None,
                    budget: CANDIDATE_BYTES,
                };
                let key = |h: &[Hit]| {
                    h.iter()
                        .map(|h| (h.chunk_uid.clone(), h.score.to_bits(), h.relevance.to_bits()))
                        .collect::<Vec<_>>()
                };
                let oracle = key(&idx.ranked(&searcher, &q).unwrap().unwrap());
                let what = format!(
                    "round {round}: {words:?} {groups:?} k={} floor={} {:?}",
                    q.k, q.min_relevance, q.collection
                );
                assert_eq!(key(&idx.pruned(&q).unwrap()), oracle, "{what}");
                compared += 1;
                nonempty += usize::from(!oracle.is_empty());
                tied += usize::from(oracle.windows(2).any(|p| p[0].1 == p[1].1));
            }
            drop(searcher);
            drop(idx);
            std::fs::remove_dir_all(&path).unwrap();
        }
        // Enough answers, and enough of them with ties, for the comparison
        // to mean something.
        assert!(
            compared == 600 && nonempty > 300 && tied > 50,
            "compared {compared}, non-empty {nonempty}, with ties {tied}"
        );
    }
}
