//! One library's search index: a tantivy index on local disk holding, for
//! every chunk of the library, its analyzed text and title terms (postings
//! with frequencies), its length in terms (a fast field) and what a hit
//! shows (stored fields). A derived artifact: the graph is the source of
//! truth and `store::graph::indexing` builds and catches these up from it.
//!
//! The terms are this project's analysis (`crate::analysis`: NFKC,
//! folding, Snowball per language, CJK bigrams), made once at ingest and kept
//! in the chunk's `scoped` property; here they are indexed as they are
//! (split on spaces), so a query's words — analyzed the same way — meet the
//! same terms the graph path counts.
//!
//! Ranking is not tantivy's: `score` (`maxscore`) finds the exact best k of
//! the query's postings (skipping deleted documents) without scoring the
//! chunks that cannot make them, and ranks with `rank::score`, BM25 from
//! this library's own statistics (its live chunk count and total length,
//! exact, and document frequencies counted over its live postings), the title
//! field and the coordination factor — the same function the graph path uses,
//! so a tenant's ranking is a function of its own library only. `keyword`
//! scores every posting instead: the oracle the pruned answer is tested (and
//! benchmarked) against, to the bit.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use tantivy::indexer::IndexWriterOptions;
use tantivy::schema::{
    Field, IndexRecordOption, Schema, TextFieldIndexing, TextOptions, Value, FAST, INDEXED, STORED, STRING,
};
use tantivy::tokenizer::{TextAnalyzer, WhitespaceTokenizer};
use tantivy::{DocAddress, DocId, DocSet, Index, IndexReader, IndexWriter, ReloadPolicy, TantivyDocument, Term};

pub mod freshness;
mod keyword;
mod maxscore;
pub mod rank;
pub mod replica;
pub mod vectors;

pub use crate::store::graph::indexing::IndexedChunk;

/// The tokenizer of the term fields: the terms are already analyzed.
const TERMS: &str = "terms";
/// Indexing memory of one library's writer (tantivy's minimum).
const WRITER_MEMORY: usize = 15_000_000;

#[derive(Debug, thiserror::Error)]
pub enum IndexError {
    #[error("index: {0}")]
    Tantivy(#[from] tantivy::TantivyError),
    #[error("index: {0}")]
    Io(#[from] std::io::Error),
    #[error("index: {0}")]
    Open(#[from] tantivy::directory::error::OpenDirectoryError),
    #[error("index: {0}")]
    Corrupt(String),
}

#[derive(Clone, Copy)]
struct Fields {
    chunk_uid: Field,
    item_uid: Field,
    collection_uid: Field,
    text_terms: Field,
    title_terms: Field,
    dl: Field,
    item_title: Field,
    ordinal: Field,
    text: Field,
    source_uri: Field,
    mime_type: Field,
    updated_at: Field,
    vec_q: Field,
    vec: Field,
}

fn schema() -> (Schema, Fields) {
    let mut b = Schema::builder();
    let terms = TextOptions::default().set_indexing_options(
        TextFieldIndexing::default()
            .set_tokenizer(TERMS)
            .set_index_option(IndexRecordOption::WithFreqs)
            .set_fieldnorms(false),
    );
    let f = Fields {
        chunk_uid: b.add_text_field("chunk_uid", STRING | STORED | FAST),
        item_uid: b.add_text_field("item_uid", STRING | STORED),
        collection_uid: b.add_text_field("collection_uid", STRING | STORED),
        text_terms: b.add_text_field("text_terms", terms.clone()),
        title_terms: b.add_text_field("title_terms", terms),
        dl: b.add_u64_field("dl", FAST | INDEXED),
        item_title: b.add_text_field("item_title", STORED),
        ordinal: b.add_i64_field("ordinal", STORED),
        text: b.add_text_field("text", STORED),
        source_uri: b.add_text_field("source_uri", STORED),
        mime_type: b.add_text_field("mime_type", STORED),
        updated_at: b.add_text_field("updated_at", STORED),
        vec_q: b.add_bytes_field("vec_q", FAST),
        vec: b.add_bytes_field("vec", FAST),
    };
    (b.build(), f)
}

/// A library's keyword candidate, scored.
#[derive(Clone, Debug, PartialEq)]
pub struct Hit {
    pub chunk_uid: String,
    pub score: f64,
    pub relevance: f64,
}

/// The live statistics of one searcher generation, and its deleted
/// documents (each segment's, in order, by the searcher's segment order).
#[derive(Clone)]
struct Stats {
    generation: u64,
    stats: rank::LibraryStats,
    dead: Arc<Vec<Vec<DocId>>>,
}

/// One library's index, open.
pub struct LibraryIndex {
    path: PathBuf,
    index: Index,
    reader: IndexReader,
    fields: Fields,
    writer: Mutex<Option<IndexWriter>>,
    stats: Mutex<Option<Stats>>,
    /// Where its segments' decoded vector codes are kept, and its name there.
    codes: Arc<vectors::CodeCache>,
    owner: u64,
}

impl Drop for LibraryIndex {
    fn drop(&mut self) {
        self.codes.forget(self.owner, None);
    }
}

/// What the last commit applied (its payload).
#[derive(Clone, Debug, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Applied {
    /// The library's change sequence this index reflects.
    pub seq: i64,
    /// The library it indexes.
    pub library_uid: String,
    /// The keyword analysis its terms were made with
    /// (`scoped::ANALYSIS_VERSION`): another one is rebuilt.
    #[serde(default)]
    pub analysis: i64,
    /// The Postgres database its sequence numbers come from
    /// (`index_changes::epoch`): another one is rebuilt.
    #[serde(default)]
    pub epoch: String,
    /// The embedding model whose vectors it holds ("" for none): another
    /// one is rebuilt.
    #[serde(default)]
    pub model: String,
}

impl LibraryIndex {
    /// Opens the index at `path`, creating an empty one when there is none;
    /// its segments' vector codes are kept in `codes`.
    pub fn open_or_create(path: &Path, codes: Arc<vectors::CodeCache>) -> Result<Self, IndexError> {
        std::fs::create_dir_all(path)?;
        let (schema, fields) = schema();
        let dir = tantivy::directory::MmapDirectory::open(path)?;
        let index = Index::open_or_create(dir, schema)?;
        index
            .tokenizers()
            .register(TERMS, TextAnalyzer::from(WhitespaceTokenizer::default()));
        let reader = index.reader_builder().reload_policy(ReloadPolicy::Manual).try_into()?;
        Ok(LibraryIndex {
            path: path.to_owned(),
            index,
            reader,
            fields,
            writer: Mutex::new(None),
            stats: Mutex::new(None),
            owner: codes.owner(),
            codes,
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// What the last commit applied (default: nothing, sequence 0).
    pub fn applied(&self) -> Result<Applied, IndexError> {
        match self.index.load_metas()?.payload {
            None => Ok(Applied::default()),
            Some(p) => serde_json::from_str(&p).map_err(|e| IndexError::Corrupt(format!("commit payload: {e}"))),
        }
    }

    /// Live chunks.
    pub fn num_chunks(&self) -> u64 {
        self.reader.searcher().num_docs()
    }

    /// Bytes on disk.
    pub fn disk_bytes(&self) -> u64 {
        std::fs::read_dir(&self.path)
            .map(|d| d.filter_map(|e| e.ok()?.metadata().ok()).map(|m| m.len()).sum())
            .unwrap_or(0)
    }

    fn with_writer<T>(&self, f: impl FnOnce(&mut IndexWriter) -> Result<T, IndexError>) -> Result<T, IndexError> {
        let mut guard = self.writer.lock().unwrap_or_else(|p| p.into_inner());
        if guard.is_none() {
            let options = IndexWriterOptions::builder()
                .num_worker_threads(1)
                .num_merge_threads(1)
                .memory_budget_per_thread(WRITER_MEMORY)
                .build();
            *guard = Some(self.index.writer_with_options(options)?);
        }
        let w = guard.as_mut().ok_or_else(|| IndexError::Corrupt("no writer".into()))?;
        match f(w) {
            Ok(v) => Ok(v),
            Err(e) => {
                // A failed writer is dropped (its uncommitted work with it).
                *guard = None;
                Err(e)
            }
        }
    }

    /// Replaces the chunks of `items` with `chunks` (every chunk those items
    /// hold now; an item with none is deleted) and commits with `applied`:
    /// all of it is visible to the next search, or none of it.
    pub fn apply(&self, items: &[String], chunks: &[IndexedChunk], applied: &Applied) -> Result<(), IndexError> {
        let f = self.fields;
        self.with_writer(|w| {
            for item in items {
                w.delete_term(Term::from_field_text(f.item_uid, item));
            }
            for c in chunks {
                w.add_document(self.document(c))?;
            }
            let payload = serde_json::to_string(applied).map_err(|e| IndexError::Corrupt(e.to_string()))?;
            let mut commit = w.prepare_commit()?;
            commit.set_payload(&payload);
            commit.commit()?;
            Ok(())
        })?;
        self.reader.reload()?;
        Ok(())
    }

    /// Adds chunks without committing (a build); `commit` ends it.
    pub fn add(&self, chunks: &[IndexedChunk]) -> Result<(), IndexError> {
        self.with_writer(|w| {
            for c in chunks {
                w.add_document(self.document(c))?;
            }
            Ok(())
        })
    }

    /// Commits what `add` added, with `applied`.
    pub fn commit(&self, applied: &Applied) -> Result<(), IndexError> {
        self.apply(&[], &[], applied)
    }

    /// Waits for the writer's merges and closes it (the end of a build).
    pub fn close_writer(&self) -> Result<(), IndexError> {
        let w = self.writer.lock().unwrap_or_else(|p| p.into_inner()).take();
        if let Some(w) = w {
            w.wait_merging_threads()?;
        }
        self.reader.reload()?;
        Ok(())
    }

    /// Merges every segment into one and closes the writer (benchmarks and
    /// tests; the writer's merge policy does this over time).
    pub fn merge_all(&self) -> Result<(), IndexError> {
        let ids = self.index.searchable_segment_ids()?;
        if ids.len() > 1 {
            self.with_writer(|w| {
                w.merge(&ids).wait()?;
                Ok(())
            })?;
        }
        self.close_writer()
    }

    fn document(&self, c: &IndexedChunk) -> TantivyDocument {
        let f = self.fields;
        let mut d = TantivyDocument::default();
        d.add_text(f.chunk_uid, &c.chunk_uid);
        d.add_text(f.item_uid, &c.item_uid);
        d.add_text(f.collection_uid, &c.collection_uid);
        d.add_text(f.text_terms, &c.text_terms);
        d.add_text(f.title_terms, &c.title_terms);
        d.add_u64(f.dl, c.dl.max(0) as u64);
        d.add_text(f.item_title, &c.item_title);
        d.add_i64(f.ordinal, c.ordinal);
        d.add_text(f.text, &c.text);
        for (field, v) in [
            (f.source_uri, &c.source_uri),
            (f.mime_type, &c.mime_type),
            (f.updated_at, &c.updated_at),
        ] {
            if let Some(v) = v {
                d.add_text(field, v);
            }
        }
        if let Some(v) = c
            .vector
            .as_deref()
            .filter(|v| !v.is_empty() && v.len().is_multiple_of(16))
        {
            d.add_bytes(f.vec_q, &vectors::quantize(v));
            d.add_bytes(f.vec, &vectors::to_bytes(v));
        }
        d
    }

    /// The library's live chunk count and total length, for this searcher
    /// generation (summed once per generation over the live documents).
    fn stats(&self, searcher: &tantivy::Searcher) -> Result<rank::LibraryStats, IndexError> {
        Ok(self.live(searcher)?.stats)
    }

    /// `stats`, with each segment's deleted documents (listed in the same
    /// pass, once per generation).
    fn live(&self, searcher: &tantivy::Searcher) -> Result<Stats, IndexError> {
        let generation = searcher.generation().generation_id();
        let mut cached = self.stats.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(s) = &*cached {
            if s.generation == generation {
                return Ok(s.clone());
            }
        }
        let mut n = 0i64;
        let mut tokens = 0i64;
        let mut dead = Vec::new();
        for seg in searcher.segment_readers() {
            let dl = seg.fast_fields().u64("dl")?;
            let alive = seg.alive_bitset();
            let mut gone = Vec::new();
            for doc in 0..seg.max_doc() {
                if alive.is_some_and(|a| !a.is_alive(doc)) {
                    gone.push(doc);
                    continue;
                }
                n += 1;
                tokens += dl.first(doc).unwrap_or(0) as i64;
            }
            dead.push(gone);
        }
        let live = Stats {
            generation,
            stats: rank::LibraryStats { n, tokens },
            dead: Arc::new(dead),
        };
        *cached = Some(live.clone());
        Ok(live)
    }

    /// The documents of one segment in `collection` (None: no filter).
    fn in_collection(
        &self,
        seg: &tantivy::SegmentReader,
        collection: Option<&str>,
    ) -> Result<Option<Vec<bool>>, IndexError> {
        let Some(c) = collection else { return Ok(None) };
        let f = self.fields;
        let mut keep = vec![false; seg.max_doc() as usize];
        let inv = seg.inverted_index(f.collection_uid)?;
        if let Some(mut p) = inv.read_postings(&Term::from_field_text(f.collection_uid, c), IndexRecordOption::Basic)? {
            while p.doc() != tantivy::TERMINATED {
                keep[p.doc() as usize] = true;
                p.advance();
            }
        }
        Ok(Some(keep))
    }

    /// The library's `k` chunks whose vectors (of `dim` values, the index's)
    /// score highest for `q`, optionally in one collection: (the dot product
    /// of `q` and the vector's first `q.len()` values — all of them, or the
    /// embedding model's half of a pair's —, chunk uid, the chunk's whole
    /// vector), best first, ties by chunk uid. Exact (`vectors`); chunks
    /// without a vector are left out.
    pub fn nearest(
        &self,
        q: &[f32],
        dim: usize,
        k: usize,
        collection: Option<&str>,
    ) -> Result<Vec<(f32, String, Vec<f32>)>, IndexError> {
        let searcher = self.reader.searcher();
        let readers = searcher.segment_readers();
        let live: Vec<_> = readers.iter().map(|r| r.segment_id()).collect();
        self.codes.forget(self.owner, Some(&live));
        let mut segments = Vec::with_capacity(readers.len());
        let mut keeps = Vec::with_capacity(readers.len());
        for seg in readers {
            segments.push(vectors::SegmentVectors::of(seg)?);
            keeps.push((seg.alive_bitset().cloned(), self.in_collection(seg, collection)?));
        }
        let keep = |s: u32, doc: DocId| {
            let (alive, coll) = &keeps[s as usize];
            alive.as_ref().is_none_or(|a| a.is_alive(doc)) && coll.as_ref().is_none_or(|k| k[doc as usize])
        };
        Ok(vectors::nearest(q, dim, k, &segments, (&self.codes, self.owner), keep)?)
    }

    /// Live chunks, and those of them with a vector.
    pub fn counts(&self) -> Result<(u64, u64), IndexError> {
        let searcher = self.reader.searcher();
        let mut with = 0u64;
        for seg in searcher.segment_readers() {
            let Some(col) = seg.fast_fields().bytes("vec")? else {
                continue;
            };
            let alive = seg.alive_bitset();
            for doc in 0..seg.max_doc() {
                if alive.is_none_or(|a| a.is_alive(doc)) && col.term_ords(doc).next().is_some() {
                    with += 1;
                }
            }
        }
        Ok((searcher.num_docs(), with))
    }

    /// The stored chunk `uid`, if this library holds it.
    pub fn chunk(&self, uid: &str) -> Result<Option<IndexedChunk>, IndexError> {
        let searcher = self.reader.searcher();
        // The uid's posting read directly (no query, weight or collector: a
        // hit's text is fetched this way for every search).
        let term = Term::from_field_text(self.fields.chunk_uid, uid);
        for (ord, segment) in searcher.segment_readers().iter().enumerate() {
            let Some(mut postings) = segment
                .inverted_index(self.fields.chunk_uid)?
                .read_postings(&term, IndexRecordOption::Basic)?
            else {
                continue;
            };
            let mut doc = postings.doc();
            while doc != tantivy::TERMINATED {
                if !segment.is_deleted(doc) {
                    return Ok(Some(self.read(&searcher, DocAddress::new(ord as u32, doc))?));
                }
                doc = postings.advance();
            }
        }
        Ok(None)
    }

    fn read(&self, searcher: &tantivy::Searcher, addr: DocAddress) -> Result<IndexedChunk, IndexError> {
        let f = self.fields;
        let d: TantivyDocument = searcher.doc(addr)?;
        let s = |field: Field| d.get_first(field).and_then(|v| v.as_str().map(str::to_owned));
        Ok(IndexedChunk {
            chunk_uid: s(f.chunk_uid).unwrap_or_default(),
            item_uid: s(f.item_uid).unwrap_or_default(),
            item_title: s(f.item_title).unwrap_or_default(),
            collection_uid: s(f.collection_uid).unwrap_or_default(),
            ordinal: d.get_first(f.ordinal).and_then(|v| v.as_i64()).unwrap_or(0),
            text: s(f.text).unwrap_or_default(),
            text_terms: String::new(),
            title_terms: String::new(),
            dl: 0,
            source_uri: s(f.source_uri),
            mime_type: s(f.mime_type),
            updated_at: s(f.updated_at),
            vector: None,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    pub(super) fn chunk(uid: &str, item: &str, text_terms: &str, title_terms: &str) -> IndexedChunk {
        IndexedChunk {
            chunk_uid: uid.into(),
            item_uid: item.into(),
            collection_uid: "col".into(),
            text: format!("text of {uid}"),
            dl: text_terms.split(' ').count() as i64,
            text_terms: text_terms.into(),
            title_terms: title_terms.into(),
            ..Default::default()
        }
    }

    pub(super) fn applied(seq: i64) -> Applied {
        Applied {
            seq,
            library_uid: "lib".into(),
            analysis: 1,
            epoch: "e".into(),
            model: String::new(),
        }
    }

    pub(super) fn dir() -> PathBuf {
        std::env::temp_dir().join(format!("mnemosyne-index-unit-{}", uuid::Uuid::new_v4()))
    }

    #[test]
    fn scores_match_the_graph_paths_ranking_and_deletes_replace_items() {
        let path = dir();
        let idx = LibraryIndex::open_or_create(&path, vectors::CodeCache::unbounded()).unwrap();
        let chunks = vec![
            chunk("a", "i1", "tidal kelp reef", ""),
            chunk("b", "i1", "kelp forest kelp", ""),
            chunk("c", "i2", "quasar", "tidal"),
        ];
        idx.apply(&[], &chunks, &applied(3)).unwrap();
        assert_eq!(idx.applied().unwrap().seq, 3);
        let words = vec!["tidal".to_owned(), "kelp".to_owned()];
        let hits = idx.score(&words, None, 0.0, 10).unwrap();
        // The same candidates through rank::score_library (the graph path).
        let cands: Vec<rank::Candidate> = chunks
            .iter()
            .map(|c| {
                let count = |s: &str, w: &str| s.split(' ').filter(|t| *t == w).count() as i64;
                rank::Candidate {
                    chunk_uid: c.chunk_uid.clone(),
                    library_uid: "lib".into(),
                    dl: c.dl,
                    tf: words.iter().map(|w| count(&c.text_terms, w)).collect(),
                    tf_title: words.iter().map(|w| count(&c.title_terms, w)).collect(),
                }
            })
            .collect();
        let stats = rank::LibraryStats { n: 3, tokens: 7 };
        let mut expect = rank::score_library(stats, 2, &cands);
        expect.sort_by(|a, b| b.score.total_cmp(&a.score).then_with(|| a.chunk_uid.cmp(&b.chunk_uid)));
        assert_eq!(
            hits.iter().map(|h| (h.chunk_uid.as_str(), h.score)).collect::<Vec<_>>(),
            expect
                .iter()
                .map(|h| (h.chunk_uid.as_str(), h.score))
                .collect::<Vec<_>>()
        );
        // k with ties, min_relevance, collection filter.
        assert_eq!(idx.score(&words, None, 0.0, 1).unwrap().len(), 1);
        assert!(idx.score(&words, Some("other"), 0.0, 10).unwrap().is_empty());
        // Replacing item i1 with one chunk, then deleting it.
        idx.apply(&["i1".into()], &[chunk("d", "i1", "kelp", "")], &applied(4))
            .unwrap();
        let uids: Vec<String> = idx
            .score(&words, None, 0.0, 10)
            .unwrap()
            .into_iter()
            .map(|h| h.chunk_uid)
            .collect();
        assert_eq!(uids.len(), 2);
        assert!(uids.contains(&"d".to_owned()) && uids.contains(&"c".to_owned()));
        assert_eq!(idx.chunk("d").unwrap().unwrap().text, "text of d");
        assert!(idx.chunk("a").unwrap().is_none());
        idx.apply(&["i1".into()], &[], &applied(5)).unwrap();
        assert_eq!(idx.num_chunks(), 1);
        drop(idx);
        // Reopened: the commit and its sequence survived.
        let again = LibraryIndex::open_or_create(&path, vectors::CodeCache::unbounded()).unwrap();
        assert_eq!(again.applied().unwrap().seq, 5);
        assert_eq!(again.num_chunks(), 1);
        drop(again);
        std::fs::remove_dir_all(&path).unwrap();
    }

    fn unit(seed: u64) -> Vec<f32> {
        // A deterministic pseudo-random unit vector.
        let mut x = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        let v: Vec<f32> = (0..crate::embed::DIM)
            .map(|_| {
                x = x.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
                ((x >> 40) as f32 / (1u64 << 24) as f32) - 0.5
            })
            .collect();
        let n = v.iter().map(|a| a * a).sum::<f32>().sqrt();
        v.into_iter().map(|a| a / n).collect()
    }

    /// `nearest`'s (score, uid) pairs (a query shorter than the vectors
    /// scores their first values).
    fn near(idx: &LibraryIndex, q: &[f32], k: usize, coll: Option<&str>) -> Vec<(f32, String)> {
        idx.nearest(q, crate::embed::DIM, k, coll)
            .unwrap()
            .into_iter()
            .map(|(s, u, _)| (s, u))
            .collect()
    }

    /// Every live vector scored in memory: the exact answer.
    fn brute(live: &[(String, String, Vec<f32>)], q: &[f32], k: usize, coll: Option<&str>) -> Vec<(f32, String)> {
        let mut all: Vec<(f32, String)> = live
            .iter()
            .filter(|(_, c, _)| coll.is_none_or(|x| x == c))
            .map(|(u, _, v)| (crate::embed::dot(q, &v[..q.len()]), u.clone()))
            .collect();
        all.sort_by(|a, b| b.0.total_cmp(&a.0).then_with(|| a.1.cmp(&b.1)));
        all.truncate(k);
        all
    }

    #[test]
    fn nearest_is_the_exact_top_k_across_segments_replacements_filters_and_merges() {
        let path = dir();
        let idx = LibraryIndex::open_or_create(&path, vectors::CodeCache::unbounded()).unwrap();
        let mut live: Vec<(String, String, Vec<f32>)> = Vec::new();
        // Three commits: three segments; item i3 replaced in the third.
        for (round, seq) in [(0u64, 1i64), (1, 2), (2, 3)] {
            let mut chunks = Vec::new();
            let mut replaced = Vec::new();
            for j in 0..40u64 {
                let item = match (round, j % 4) {
                    (2, 0) => {
                        replaced.push("i3".to_owned());
                        "i3".to_owned()
                    }
                    _ => format!("i{round}_{j}"),
                };
                let uid = format!("c{round}_{j:02}");
                let coll = if j % 3 == 0 { "odd" } else { "col" };
                let v = unit(round * 100 + j);
                let mut c = chunk(&uid, &item, "w", "");
                c.collection_uid = coll.into();
                c.vector = Some(v.clone());
                chunks.push(c);
            }
            replaced.dedup();
            if round == 0 {
                // Item i3 of the first round, replaced later.
                let mut c = chunk("old_i3", "i3", "w", "");
                c.vector = Some(unit(9_999));
                chunks.push(c);
            }
            if !replaced.is_empty() {
                live.retain(|(u, _, _)| u != "old_i3");
            }
            for c in &chunks {
                live.push((c.chunk_uid.clone(), c.collection_uid.clone(), c.vector.clone().unwrap()));
            }
            idx.apply(&replaced, &chunks, &applied(seq)).unwrap();
        }
        // A chunk without a vector is never a semantic hit.
        idx.apply(&[], &[chunk("novec", "iz", "w", "")], &applied(4)).unwrap();
        let check = |idx: &LibraryIndex| {
            for (s, k, coll) in [
                (7u64, 5usize, None),
                (8, 200, None),
                (9, 10, Some("odd")),
                (10, 1, Some("none")),
            ] {
                let q = unit(s);
                let got = near(idx, &q, k, coll);
                let want = brute(&live, &q, k, coll);
                assert_eq!(got, want, "seed {s} k {k} {coll:?}");
                // The first half of each vector alone (the embedding
                // model's half of a pair's vectors).
                let half = &q[..crate::embed::DIM / 2];
                assert_eq!(near(idx, half, k, coll), brute(&live, half, k, coll), "seed {s}: half");
            }
            // A query longer than the vectors finds nothing.
            let longer = [unit(11), unit(12)].concat();
            assert!(idx.nearest(&longer, crate::embed::DIM, 5, None).unwrap().is_empty());
            // The query equal to a stored vector finds it first, at its exact score.
            let q = unit(205);
            let got = idx.nearest(&q, q.len(), 3, None).unwrap();
            assert_eq!(got[0].1, "c2_05");
            assert_eq!(got[0].0, crate::embed::dot(&q, &q));
            assert_eq!(got[0].2, q, "the hit's stored vector");
        };
        check(&idx);
        assert_eq!(idx.counts().unwrap(), (live.len() as u64 + 1, live.len() as u64));
        // Merged into one segment: vectors follow their documents.
        let ids = idx.index.searchable_segment_ids().unwrap();
        idx.with_writer(|w| {
            w.merge(&ids).wait()?;
            Ok(())
        })
        .unwrap();
        idx.close_writer().unwrap();
        assert_eq!(idx.reader.searcher().segment_readers().len(), 1);
        check(&idx);
        drop(idx);
        std::fs::remove_dir_all(&path).unwrap();
    }

    #[test]
    fn vector_codes_stay_within_their_budget_and_leave_with_their_segments() {
        let path = dir();
        let cache = vectors::CodeCache::unbounded();
        let idx = LibraryIndex::open_or_create(&path, cache.clone()).unwrap();
        let mut live: Vec<(String, String, Vec<f32>)> = Vec::new();
        // Two segments of 40 chunks, in items of 2 chunks.
        for round in 0..2u64 {
            let mut chunks = Vec::new();
            for j in 0..40u64 {
                let mut c = chunk(&format!("c{round}_{j:02}"), &format!("i{round}_{}", j / 2), "w", "");
                c.vector = Some(unit(round * 1000 + j));
                live.push((c.chunk_uid.clone(), c.collection_uid.clone(), c.vector.clone().unwrap()));
                chunks.push(c);
            }
            idx.apply(&[], &chunks, &applied(round as i64 + 1)).unwrap();
        }
        let q = unit(77);
        let want = brute(&live, &q, 10, None);
        assert_eq!(near(&idx, &q, 10, None), want);
        let both = cache.bytes();
        assert!(both > 0);
        // Room for one segment's codes: the other is decoded and let go.
        let one = vectors::CodeCache::new(both * 3 / 4);
        let small = LibraryIndex::open_or_create(&path, one.clone()).unwrap();
        assert_eq!(near(&small, &q, 10, None), want);
        assert!(
            one.bytes() > 0 && one.bytes() <= both * 3 / 4,
            "{} of {both}",
            one.bytes()
        );
        // Room for none: every segment decoded for the search alone, same answer.
        let none = vectors::CodeCache::new(100);
        let tiny = LibraryIndex::open_or_create(&path, none.clone()).unwrap();
        assert_eq!(near(&tiny, &q, 10, None), want);
        assert_eq!(none.bytes(), 0);
        // The first segment's items deleted, then merged: only the live
        // segment's codes are held after the next search.
        let gone: Vec<String> = (0..20).map(|i| format!("i0_{i}")).collect();
        idx.apply(&gone, &[], &applied(3)).unwrap();
        live.retain(|(u, _, _)| !u.starts_with("c0_"));
        idx.merge_all().unwrap();
        let want = brute(&live, &q, 10, None);
        assert_eq!(near(&idx, &q, 10, None), want);
        assert_eq!(cache.bytes(), both / 2);
        // An index closed takes its codes with it.
        drop(idx);
        assert_eq!(cache.bytes(), 0);
        drop((small, tiny));
        assert_eq!(one.bytes(), 0);
        std::fs::remove_dir_all(&path).unwrap();
    }

    #[test]
    fn scoped_text_splits_into_text_and_title_terms() {
        let (t, ti) = crate::analysis::scoped::split_scoped("k1_tidal k1_kelp t1_fundy k2_x t1_bay", "k1", "t1");
        assert_eq!(t, "tidal kelp");
        assert_eq!(ti, "fundy bay");
    }
}
