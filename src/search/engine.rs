//! The front door of search: one query, from its text to the hits a caller
//! sees (`Engine::run`). It analyses the query, embeds it through the
//! embedding model (`crate::embed`), takes each library's candidates from its
//! fresh index (`index::replica`) or else from the graph (through the narrow
//! reads of `ScopedGraph`), ranks them, fuses the two signals, applies the
//! floor, reads what each hit shows and, with a reranker, reorders the best
//! of them (`rerank`). The store only reads: it knows
//! nothing of ranking, fusion or a model. The MCP `search` tool and the
//! console's search call this one entry.

use std::collections::HashMap;
use std::sync::Arc;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::fusion::{fuse, Calibration, Near, Ranked, CANDIDATES, CROSS};
pub use super::fusion::{Floor, Mode, Signal};
use super::index::replica::{blocking, blocking_unless, OpenLibrary, SearchIndex};
use super::index::{rank, IndexedChunk};
pub use super::rerank::Reranking;
use crate::analysis::{scoped, Language};
use crate::store::graph::knowledge::{KeywordRow, ScopedGraph};
use crate::store::graph::{GraphError, IndexSource};

#[derive(Clone, Debug, Serialize, Deserialize, JsonSchema, PartialEq)]
pub struct SearchHit {
    pub chunk_uid: String,
    pub item_uid: String,
    pub item_title: String,
    pub collection_uid: String,
    pub library_uid: String,
    /// The library's name.
    pub library_name: String,
    /// The item's source (what to cite), as ingested.
    pub source_uri: Option<String>,
    pub mime_type: Option<String>,
    /// When the item was last written (RFC 3339).
    pub updated_at: Option<String>,
    pub ordinal: i64,
    /// The ranking score of the search's mode: BM25 over the library's own
    /// statistics (keyword), the cosine similarity (semantic), or the
    /// relevance plus a small share of the relative keyword score (hybrid,
    /// `fusion::fuse`); on a server with a reranker, a hybrid or semantic
    /// hit it reordered holds the reranker's score instead.
    pub score: f64,
    /// 0–1: the share of the query's weight the chunk matches (keyword), the
    /// similarity read on the model's calibration (semantic), or either
    /// vouching (hybrid: 1 − (1 − keyword)(1 − semantic), keyword being the
    /// chunk's share times the largest share any hit holds, semantic the
    /// mean of both models' evidence with a cross-language model); unless
    /// `min_relevance` says otherwise, hybrid search answers nothing when no
    /// hit reaches 0.35 (0.3 with one embedding model) and otherwise leaves
    /// out hits of relevance 0.
    pub relevance: f64,
    /// Cosine similarity of the chunk to the query (the embedding model's),
    /// when semantic search ranked it.
    pub similarity: Option<f64>,
    /// Which searches found it: `keyword`, `semantic`, or both.
    pub found_by: Vec<Signal>,
    pub text: String,
}

impl super::rerank::Candidate for SearchHit {
    fn text(&self) -> String {
        crate::embed::chunk_text(&self.item_title, &self.text)
    }

    fn score(&self) -> f64 {
        self.score
    }

    fn set_score(&mut self, score: f64) {
        self.score = score;
    }
}

/// Longest search query, in characters (DESIGN §5: 1–1000), for every
/// caller that searches: the MCP `search` tool and the admin search.
pub const MAX_QUERY_CHARS: usize = 1000;

/// Most candidate chunks one search reads from the graph (over all its
/// batches of libraries): past it, document frequencies are counted over
/// this many. (Libraries served by their index hold only their best k and
/// the chunks tied with the k-th: `index::maxscore`.)
const MAX_CANDIDATES: i64 = 20_000;

/// A search request.
#[derive(Clone, Copy, Debug)]
pub struct Search<'a> {
    pub text: &'a str,
    pub limit: usize,
    pub collection_uid: Option<&'a str>,
    /// Which hits are left out by relevance (`min_relevance`, or hybrid's
    /// default: nothing when no hit reaches `fusion::default_min_relevance`).
    pub floor: Floor,
    pub mode: Mode,
}

impl<'a> Search<'a> {
    /// A keyword search for `text`, best `limit`.
    pub fn keyword(text: &'a str, limit: usize) -> Self {
        Search {
            text,
            limit,
            collection_uid: None,
            floor: Floor::Hit(0.0),
            mode: Mode::Keyword,
        }
    }

    /// The same search in another mode.
    pub fn mode(self, mode: Mode) -> Self {
        Search { mode, ..self }
    }
}

/// What a search runs with: the embedding model (when there is one) and this
/// replica's library indexes (when `MNEMOSYNE_INDEX_DIR` is set), with the
/// graph reads they are built from.
#[derive(Clone, Default)]
pub struct Engine {
    semantic: Option<Arc<crate::embed::Embedder>>,
    index: Option<(Arc<SearchIndex>, IndexSource)>,
    /// Reorders the best hybrid and semantic candidates (`rerank`).
    reranker: Option<Arc<crate::embed::rerank::Reranker>>,
}

/// A search's hits and what the reranker did to them.
#[derive(Debug)]
pub struct Answer {
    pub hits: Vec<SearchHit>,
    pub reranking: Reranking,
}

/// The fresh library indexes of a search's scope, by library uid.
type Ready = HashMap<String, Arc<OpenLibrary>>;

impl Engine {
    pub fn new(semantic: Option<Arc<crate::embed::Embedder>>, index: Option<(Arc<SearchIndex>, IndexSource)>) -> Self {
        Engine {
            semantic,
            index,
            reranker: None,
        }
    }

    /// The same engine reordering hybrid and semantic candidates with
    /// `reranker`.
    pub fn with_reranker(self, reranker: Option<Arc<crate::embed::rerank::Reranker>>) -> Self {
        Engine { reranker, ..self }
    }

    /// The reranker, if there is one.
    pub fn reranker(&self) -> Option<&Arc<crate::embed::rerank::Reranker>> {
        self.reranker.as_ref()
    }

    /// The embedding model and its worker's counters, if semantic search is on.
    pub fn semantic(&self) -> Option<&Arc<crate::embed::Embedder>> {
        self.semantic.as_ref()
    }

    /// The embedding model's id, if semantic search is on.
    pub fn embedding_model(&self) -> Option<&str> {
        self.semantic.as_ref().map(|s| s.id())
    }

    /// What is wrong with the embedding provider now (`get_health`), None
    /// when it answers or there is none.
    pub fn embedding_trouble(&self) -> Option<String> {
        self.semantic.as_ref().and_then(|s| s.trouble())
    }

    /// Whether a query may be embedded now (a remote provider's circuit is
    /// not open): hybrid search goes straight to keywords otherwise.
    pub fn embedding_available(&self) -> bool {
        self.semantic.as_ref().is_some_and(|s| s.available())
    }

    /// Hybrid when semantic search is available, else keyword.
    pub fn default_mode(&self) -> Mode {
        if self.has_semantic() {
            Mode::Hybrid
        } else {
            Mode::Keyword
        }
    }

    /// Whether semantic (and hybrid) search is available.
    pub fn has_semantic(&self) -> bool {
        self.semantic.is_some()
    }

    /// Whether the embedding model is paired with the cross-language model
    /// (`embed::Embedder::is_paired`; hybrid's threshold depends on it:
    /// `fusion::default_min_relevance`).
    pub fn is_paired(&self) -> bool {
        self.semantic.as_ref().is_some_and(|s| s.is_paired())
    }

    /// Search inside `graph`'s scope, best first (see `Mode`; hybrid's
    /// default puts the hits reaching its threshold first, `Floor::leads`);
    /// ties by the library's position in the scope, then chunk uid (stable).
    /// Every score is a function of the caller's libraries only — keyword
    /// ranking uses each library's own statistics (`rank`), semantic ranking
    /// scores every vector of the scope exactly — so what other tenants hold
    /// never moves a result. `q.floor` leaves hits out by relevance. Without
    /// a model, `Hybrid` is keyword search and `Semantic` finds nothing (the
    /// search tool refuses it first).
    ///
    /// A query that carries no content for either signal is answered with
    /// nothing in every mode, whatever `q.floor` says (docs/search.md,
    /// "Queries with nothing in them"):
    /// - one whose analysis yields no term (`analysis::has_terms`: only
    ///   punctuation, operators, symbols or spaces — `*`, `?`, `()`, `--`),
    ///   decided before any store is read: the model's vector of such a text
    ///   is near everything alike;
    /// - one the model cannot read (`embed::reads_any`: every word falls
    ///   apart into short pieces, a random identifier) none of whose terms
    ///   occurs in the searched libraries: the meaning's evidence is the
    ///   pieces' surface, and nothing else vouches for a hit. Hybrid search
    ///   knows it from its own keyword candidates (none); semantic search
    ///   asks for one keyword candidate, for such a query only. When a term
    ///   does occur (an identifier the library holds), the search runs as
    ///   any other.
    pub async fn run(&self, graph: &ScopedGraph, q: &Search<'_>) -> Result<Vec<SearchHit>, GraphError> {
        Ok(self.answer(graph, q).await?.hits)
    }

    /// `run`, saying what the reranker did: with one, a hybrid or semantic
    /// search's best `Reranker::candidates` hits (those kept by the floor)
    /// are read and go to it, and come back in its order with its scores,
    /// the rest of the best `limit` after them; if it cannot answer they
    /// keep this order (`Reranking::Kept`).
    pub async fn answer(&self, graph: &ScopedGraph, q: &Search<'_>) -> Result<Answer, GraphError> {
        let nothing = || Answer {
            hits: Vec::new(),
            reranking: Reranking::NotAsked,
        };
        if !crate::analysis::has_terms(q.text) {
            return Ok(nothing());
        }
        let mode = match (q.mode, &self.semantic) {
            (Mode::Hybrid, None) => Mode::Keyword,
            (m, _) => m,
        };
        // Whether the meaning may answer only beside a keyword candidate.
        let unread = mode != Mode::Keyword && self.semantic.as_ref().is_some_and(|s| !s.reads(q.text));
        // Libraries whose index is fresh answer from it; the others (not
        // built yet on this replica, or no index) from the graph.
        let ready = match &self.index {
            Some((ix, source)) => ix.ready(source, graph.scope().uids()).await,
            None => HashMap::new(),
        };
        // Keyword mode keeps the best `limit` passing the floor's per-hit
        // relevance; hybrid fuses the best `CANDIDATES` and filters after.
        let (k, floor) = match mode {
            Mode::Keyword => (q.limit, q.floor.per_hit()),
            _ => (CANDIDATES.max(q.limit), 0.0),
        };
        let keyword = match mode {
            Mode::Keyword | Mode::Hybrid => keyword_ranked(graph, q.text, q.collection_uid, &ready, k, floor).await?,
            Mode::Semantic => Vec::new(),
        };
        if unread {
            let held = match mode {
                Mode::Semantic => !keyword_ranked(graph, q.text, q.collection_uid, &ready, 1, 0.0)
                    .await?
                    .is_empty(),
                _ => !keyword.is_empty(),
            };
            if !held {
                return Ok(nothing());
            }
        }
        let vector = match (mode, &self.semantic) {
            (Mode::Semantic | Mode::Hybrid, Some(s)) => {
                let near = Nearest {
                    semantic: s,
                    text: q.text,
                    collection_uid: q.collection_uid,
                    k: CANDIDATES.max(q.limit),
                    cross: mode == Mode::Hybrid,
                };
                Some(self.semantic_ranked(graph, &near, &ready).await?)
            }
            _ => None,
        };
        // The reranker, and the hits it sees: its candidates, and the best
        // `limit` at least.
        let reranker = match mode {
            Mode::Hybrid | Mode::Semantic => self.reranker.as_deref(),
            Mode::Keyword => None,
        };
        let window = reranker.map_or(q.limit, |r| r.candidates().max(q.limit));
        let mut ranked = fuse(mode, keyword, vector.unwrap_or_default(), window);
        q.floor.apply(&mut ranked);
        let scope = graph.scope();
        ranked.sort_by(|a, b| {
            q.floor
                .leads(b)
                .cmp(&q.floor.leads(a))
                .then_with(|| b.score.total_cmp(&a.score))
                .then_with(|| scope.position(&a.library_uid).cmp(&scope.position(&b.library_uid)))
                .then_with(|| a.chunk_uid.cmp(&b.chunk_uid))
        });
        ranked.truncate(window);
        let mut hits = hits(graph, ranked, &ready).await?;
        let reranking = match reranker {
            Some(r) => super::rerank::rerank(r, q.text, &mut hits).await,
            None => Reranking::NotAsked,
        };
        hits.truncate(q.limit);
        Ok(Answer { hits, reranking })
    }

    /// The `k` chunks of the scope most similar to the query, best first
    /// by the meaning's evidence (`fusion::Near`). Exact: every vector of the
    /// scope's libraries is scored, and no other — a fresh library index's
    /// from the index (`ready`), another library's from the graph's vector
    /// cache, except in a scope wider than the indexes kept open (a staff
    /// search over every library), where a library not open has no semantic
    /// candidates (its keyword hits still count) rather than load every
    /// tenant's vectors. Both hold the same stored vectors and score them
    /// with the same query, so either path ranks alike.
    ///
    /// With the cross-language model paired (`embed::Embedder::is_paired`) every
    /// vector holds the two models' side by side. With `cross` (hybrid
    /// search) the query is the two query vectors, each scaled by its
    /// calibration's weight, so the dot product orders the chunks by the sum
    /// of the two evidences before clamping (`Near::of_both`); otherwise the
    /// model's query vector alone, scored on each vector's first `DIM`
    /// values (its half): the model's own similarities, to the bit.
    async fn semantic_ranked(
        &self,
        graph: &ScopedGraph,
        n: &Nearest<'_>,
        ready: &Ready,
    ) -> Result<Vec<Near>, GraphError> {
        let scope = graph.scope();
        if scope.is_empty() {
            return Ok(Vec::new());
        }
        let (semantic, k) = (n.semantic, n.k);
        let calibration = Calibration::of(semantic.kind());
        let model = semantic.id().to_owned();
        let (dim, model_dim) = (semantic.dim(), semantic.model_dim());
        // The two query vectors, embedded at once (each on a blocking
        // thread). If the cross-language model's cannot be made (a damaged
        // model), the search goes on with the embedding model's alone.
        let key = scope.cache_key();
        let cross_query = async {
            if !n.cross {
                return None;
            }
            match semantic.cross_query_vector(&key, n.text).await {
                Some(Ok(u)) => Some(u),
                Some(Err(e)) => {
                    tracing::warn!(error = %e, "cross-language model: no query vector; searching with the embedding model's alone");
                    None
                }
                _ => None,
            }
        };
        let (v, u) = tokio::join!(semantic.query_vector(&key, n.text), cross_query);
        let v = v.map_err(|e| GraphError::Embedding(e.to_string()))?;
        // Both halves of each stored vector, weighed; or the embedding
        // model's half alone (a prefix of a pair's vectors: scanned alone).
        let q: Vec<f32> = match &u {
            Some(u) => {
                let (a, b) = (calibration.weight() as f32, CROSS.weight() as f32);
                v.iter().map(|x| x * a).chain(u.iter().map(|x| x * b)).collect()
            }
            None => (*v).clone(),
        };
        // A hit's evidence, from its stored vector's halves.
        let near = {
            let (v, u) = (v.clone(), u.clone());
            move |uid: String, library: String, vector: &[f32]| {
                let (e, c) = vector.split_at(model_dim.min(vector.len()));
                let similarity = crate::embed::dot(&v, e);
                match &u {
                    Some(u) => Near::of_both(calibration, similarity, crate::embed::dot(u, c), uid, library),
                    None => Near::of(calibration, similarity, uid, library),
                }
            }
        };
        let mut out: Vec<Near> = Vec::new();
        let indexed: Vec<Arc<OpenLibrary>> = scope.uids().iter().filter_map(|u| ready.get(u).cloned()).collect();
        if !indexed.is_empty() {
            let (q, near, collection) = (q.clone(), near.clone(), n.collection_uid.map(str::to_owned));
            let found = blocking(move || {
                let mut out = Vec::new();
                for lib in indexed {
                    for (_, uid, vector) in lib.index.nearest(&q, dim, k, collection.as_deref())? {
                        out.push(near(uid, lib.uid().to_owned(), &vector));
                    }
                }
                Ok(out)
            })
            .await?;
            out.extend(found);
        }
        let wide = self
            .index
            .as_ref()
            .is_some_and(|(ix, _)| ix.is_wide(scope.uids().len()));
        let rest: Vec<String> = match wide {
            true => Vec::new(),
            false => scope
                .uids()
                .iter()
                .filter(|u| !ready.contains_key(*u))
                .cloned()
                .collect(),
        };
        for (lib, vectors) in graph.library_vectors(&model, dim, &rest).await? {
            for (_, uid, vector) in vectors.top(&q, k, n.collection_uid) {
                out.push(near(uid, lib.clone(), &vector));
            }
        }
        out.sort_by(|a, b| {
            b.order
                .total_cmp(&a.order)
                .then_with(|| scope.position(&a.library_uid).cmp(&scope.position(&b.library_uid)))
                .then_with(|| a.chunk_uid.cmp(&b.chunk_uid))
        });
        out.truncate(k);
        Ok(out)
    }
}

/// A semantic search's question (`Engine::semantic_ranked`).
struct Nearest<'a> {
    semantic: &'a crate::embed::Embedder,
    text: &'a str,
    collection_uid: Option<&'a str>,
    /// How many candidates.
    k: usize,
    /// With the cross-language model's query vector too (hybrid).
    cross: bool,
}

/// Most postings a keyword query over the scope's indexes may have to be
/// ranked where the search runs rather than on the blocking pool (~0.2 ms of
/// scoring at most: every posting scored took ~170 ns, 16.4 ms for ~96,000);
/// and most chunks whose stored fields are read there.
const INLINE_POSTINGS: u64 = 1_024;
const INLINE_CHUNKS: usize = 10;

/// The scope's keyword candidates, scored (unsorted): from each fresh
/// library index (`ready`) its best `k` with relevance ≥ `floor`, from the
/// graph every candidate of the other libraries (at most `MAX_CANDIDATES`).
async fn keyword_ranked(
    graph: &ScopedGraph,
    text: &str,
    collection_uid: Option<&str>,
    ready: &Ready,
    k: usize,
    floor: f64,
) -> Result<Vec<rank::Scored>, GraphError> {
    let languages = graph.languages().await?;
    let mut scored: Vec<rank::Scored> = Vec::new();
    let indexed: Vec<(Arc<OpenLibrary>, scoped::QueryWords)> = languages
        .iter()
        .filter_map(|(uid, language)| {
            ready
                .get(uid)
                .map(|l| (l.clone(), scoped::query_words_grouped(*language, text)))
        })
        .collect();
    if !indexed.is_empty() {
        let collection = collection_uid.map(str::to_owned);
        // A light query (few postings) is ranked where the search runs.
        let postings = indexed
            .iter()
            .map(|(lib, (words, _))| lib.index.postings(words).unwrap_or(u64::MAX))
            .fold(0u64, u64::saturating_add);
        let found = blocking_unless(postings <= INLINE_POSTINGS, move || {
            let mut out = Vec::new();
            for (lib, (words, word_of)) in indexed {
                for h in lib
                    .index
                    .score_grouped(&words, &word_of, collection.as_deref(), floor, k)?
                {
                    out.push(rank::Scored {
                        chunk_uid: h.chunk_uid,
                        library_uid: lib.uid().to_owned(),
                        score: h.score,
                        relevance: h.relevance,
                    });
                }
            }
            Ok(out)
        })
        .await?;
        scored.extend(found);
    }
    // Libraries analyzed alike share their query terms and queries.
    let mut by_language: Vec<(Language, Vec<String>)> = Vec::new();
    for (uid, language) in languages.into_iter().filter(|(uid, _)| !ready.contains_key(uid)) {
        match by_language.iter_mut().find(|(l, _)| *l == language) {
            Some((_, uids)) => uids.push(uid),
            None => by_language.push((language, vec![uid])),
        }
    }
    let mut groups = Vec::new();
    // The candidate cap holds for the whole search, over every batch.
    let mut budget = MAX_CANDIDATES;
    for (language, uids) in &by_language {
        let (words, word_of) = scoped::query_words_grouped(*language, text);
        let mut candidates = Vec::new();
        let mut counters: HashMap<String, scoped::TermCounter> = HashMap::new();
        for (batch, lucene) in scoped::scoped_queries(uids, &words) {
            if budget <= 0 {
                break;
            }
            let rows = graph.keyword_rows(lucene, batch, collection_uid, budget).await?;
            budget -= rows.len() as i64;
            for KeywordRow {
                chunk_uid,
                library_uid,
                dl,
                scoped,
            } in rows
            {
                let counter = counters
                    .entry(library_uid.clone())
                    .or_insert_with(|| scoped::TermCounter::new(&library_uid, &words));
                let (tf, tf_title) = counter.count(&scoped);
                candidates.push(rank::Candidate {
                    chunk_uid,
                    library_uid,
                    dl,
                    tf,
                    tf_title,
                });
            }
        }
        groups.push((word_of, rank::by_library(candidates)));
    }
    let found: Vec<String> = groups.iter().flat_map(|(_, g)| g.keys().cloned()).collect();
    let stats = graph.library_stats(&found).await?;
    for (word_of, libraries) in groups {
        for (lib, cs) in libraries {
            let s = stats
                .get(&lib)
                .copied()
                .unwrap_or(rank::LibraryStats { n: 0, tokens: 0 });
            scored.extend(rank::score_library_grouped(s, &word_of, &cs));
        }
    }
    Ok(scored)
}

/// The ranked chunks with their text and source, in the order given; a
/// chunk deleted or replaced since it was ranked is left out.
async fn hits(graph: &ScopedGraph, ranked: Vec<Ranked>, ready: &Ready) -> Result<Vec<SearchHit>, GraphError> {
    if ranked.is_empty() {
        return Ok(Vec::new());
    }
    // Chunks of fresh indexes are read from them, the rest from the graph.
    let from_index: Vec<(Arc<OpenLibrary>, String)> = ranked
        .iter()
        .filter_map(|r| ready.get(&r.library_uid).map(|l| (l.clone(), r.chunk_uid.clone())))
        .collect();
    let inline = from_index.len() <= INLINE_CHUNKS;
    let mut details: HashMap<String, IndexedChunk> = blocking_unless(inline, move || {
        let mut out = HashMap::new();
        for (lib, uid) in from_index {
            if let Some(c) = lib.index.chunk(&uid)? {
                out.insert(uid, c);
            }
        }
        Ok(out)
    })
    .await?;
    let from_graph: Vec<String> = ranked
        .iter()
        .filter(|r| !ready.contains_key(&r.library_uid))
        .map(|r| r.chunk_uid.clone())
        .collect();
    details.extend(graph.chunk_details(from_graph).await?);
    let mut libs: Vec<String> = ranked.iter().map(|r| r.library_uid.clone()).collect();
    libs.sort();
    libs.dedup();
    let names = graph.library_names(&libs).await?;
    let mut hits = Vec::with_capacity(ranked.len());
    for s in ranked {
        let Some(c) = details.remove(&s.chunk_uid) else {
            continue;
        };
        hits.push(SearchHit {
            chunk_uid: s.chunk_uid,
            item_uid: c.item_uid,
            item_title: c.item_title,
            collection_uid: c.collection_uid,
            library_name: names.get(&s.library_uid).cloned().unwrap_or_default(),
            library_uid: s.library_uid,
            source_uri: c.source_uri,
            mime_type: c.mime_type,
            updated_at: c.updated_at,
            ordinal: c.ordinal,
            score: s.score,
            relevance: s.relevance,
            similarity: s.similarity,
            found_by: s.found_by,
            text: c.text,
        });
    }
    Ok(hits)
}
