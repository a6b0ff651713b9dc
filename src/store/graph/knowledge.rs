//! Knowledge reads. They are methods of `ScopedGraph`, a view of the graph that
//! can only be made from a resolved `Principal` (or, for staff, every library:
//! `auth::resolver::every_library`): there is no way to read a Library,
//! Collection, Item or Chunk outside its scope, and anything outside it is
//! reported exactly like something that does not exist.

use std::collections::HashMap;

use neo4rs::{query, BoltType, Query, Row};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::search::analysis::Language;
use std::sync::Arc;

use super::indexing::OpenLibrary;
use super::{ingest, vanished, GraphError, GraphStore, Known};
use crate::ids::Scope;
use crate::search::fusion::{fuse, Calibration, Near, Ranked, CANDIDATES, CROSS};
pub use crate::search::fusion::{Floor, Mode, Signal};
use crate::search::index::rank;
use crate::search::index::IndexedChunk;
use crate::search::scoped;

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
    /// `fusion::fuse`).
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

/// Longest search query, in characters (DESIGN §5: 1–1000), for every
/// caller that searches: the MCP `search` tool and the admin search.
pub const MAX_QUERY_CHARS: usize = 1000;

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

#[derive(Clone, Debug, Serialize, Deserialize, JsonSchema, PartialEq)]
pub struct ChunkView {
    pub uid: String,
    pub text: String,
    pub ordinal: i64,
    pub item_uid: String,
    pub item_title: String,
    pub collection_uid: String,
    pub library_uid: String,
}

/// What to cite for a chunk: its library's name and its item's source.
#[derive(Clone, Debug, Serialize, Deserialize, JsonSchema, PartialEq, Default)]
pub struct Citation {
    pub library_name: String,
    pub source_uri: Option<String>,
    pub mime_type: Option<String>,
    /// When the item was last written (RFC 3339).
    pub updated_at: Option<String>,
}

// The MCP `list_libraries` wire shape, kept apart from the admin projection
// (`admin::LibraryDetail`): its schema is published (the tool-schema fixture),
// and a scoped reader sees no workspace, no delete mark, no chunk count. (A
// `//` comment: a doc comment would enter the published schema.)
#[derive(Clone, Debug, Serialize, Deserialize, JsonSchema, PartialEq)]
pub struct LibraryView {
    pub uid: String,
    pub name: String,
    pub description: String,
    pub collection_count: i64,
    pub item_count: i64,
}

#[derive(Clone, Debug, Serialize, Deserialize, JsonSchema, PartialEq)]
pub struct CollectionView {
    pub uid: String,
    pub name: String,
    pub library_uid: String,
    pub item_count: i64,
}

#[derive(Clone, Debug, Serialize, Deserialize, JsonSchema, PartialEq)]
pub struct ItemView {
    pub uid: String,
    pub title: String,
    pub source_uri: Option<String>,
    pub mime_type: Option<String>,
    pub chunk_count: i64,
    pub updated_at: Option<String>,
    pub collection_uid: String,
    pub library_uid: String,
}

/// Most candidate chunks one search reads from the graph (over all its
/// batches of libraries): past it, document frequencies are counted over
/// this many. (Libraries served by their index have no such cap.)
const MAX_CANDIDATES: i64 = 20_000;

fn libs_param(libs: &[String]) -> BoltType {
    libs.to_vec().into()
}

fn opt(s: Option<&str>) -> BoltType {
    s.map(str::to_owned).into()
}

/// The graph as one caller may read it: its libraries, in its order.
#[derive(Clone)]
pub struct ScopedGraph {
    store: GraphStore,
    scope: Scope,
}

/// The knowledge side of the graph: it makes scoped views and nothing else
/// (what the MCP tools hold; ingest and admin work goes through `AdminGraph`).
///
/// ```
/// use mnemosyne::store::graph::knowledge::{KnowledgeGraph, ScopedGraph};
/// fn nothing(k: &KnowledgeGraph) -> ScopedGraph {
///     k.nothing()
/// }
/// ```
///
/// It leads to no admin handle and no unscoped store (the MCP layer holds
/// only this; `src/layering.rs` also checks `mcp/` never names them):
///
/// ```compile_fail
/// use mnemosyne::store::graph::knowledge::KnowledgeGraph;
/// fn admin(k: &KnowledgeGraph) {
///     let _ = k.admin();
/// }
/// ```
///
/// ```compile_fail
/// use mnemosyne::store::graph::knowledge::KnowledgeGraph;
/// fn unscoped(k: &KnowledgeGraph) {
///     let _ = &k.0;
/// }
/// ```
#[derive(Clone)]
pub struct KnowledgeGraph(GraphStore);

impl GraphStore {
    /// What `principal` may read (its resolved libraries: a `Principal` or
    /// its `Scope`).
    pub(super) fn scoped(&self, principal: &impl AsRef<Scope>) -> ScopedGraph {
        ScopedGraph::new(self.clone(), principal.as_ref().clone())
    }

    /// A handle that can only make scoped views (outside `store/`:
    /// `into_handles`).
    pub(super) fn knowledge(&self) -> KnowledgeGraph {
        KnowledgeGraph(self.clone())
    }
}

impl KnowledgeGraph {
    /// What `principal` may read (its resolved libraries).
    pub fn scoped(&self, principal: &impl AsRef<Scope>) -> ScopedGraph {
        self.0.scoped(principal)
    }

    /// A view of nothing (no principal: fail closed).
    pub fn nothing(&self) -> ScopedGraph {
        ScopedGraph::new(self.0.clone(), Scope::default())
    }

    /// Whether the graph answers (health).
    pub async fn ping(&self) -> Result<(), GraphError> {
        self.0.ping().await
    }

    /// The embedding model and its worker's counters, if semantic search is on.
    pub fn semantic(&self) -> Option<&std::sync::Arc<crate::embed::Embedder>> {
        self.0.semantic()
    }
}

impl ScopedGraph {
    pub(super) fn new(store: GraphStore, scope: Scope) -> Self {
        ScopedGraph { store, scope }
    }

    pub(super) fn store(&self) -> &GraphStore {
        &self.store
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
        self.store.semantic.is_some()
    }

    /// Whether the embedding model is paired with the cross-language model
    /// (`embed::Embedder::is_paired`; hybrid's threshold depends on it:
    /// `fusion::default_min_relevance`).
    pub fn is_paired(&self) -> bool {
        self.store.semantic.as_ref().is_some_and(|s| s.is_paired())
    }

    /// The libraries this view reads, in the caller's order.
    pub fn scope(&self) -> &Scope {
        &self.scope
    }

    /// The same view narrowed to the libraries `only` names (never widened).
    pub fn narrow(&self, only: &[String]) -> ScopedGraph {
        ScopedGraph::new(self.store.clone(), self.scope.narrow(only))
    }

    /// This view narrowed to one library, or None when that library is outside
    /// the scope or does not exist (indistinguishable).
    pub async fn library(&self, uid: &str) -> Result<Option<ScopedGraph>, GraphError> {
        // Scope first (no store call for a foreign uid), then one indexed
        // existence lookup — not list_libraries, which counts every item.
        if !self.scope.contains(uid) {
            return Ok(None);
        }
        Ok(ingest::library_state(&self.store, uid)
            .await?
            .map(|_| self.narrow(&[uid.to_owned()])))
    }

    /// Search inside the scope, best first (see `Mode`; hybrid's default
    /// puts the hits reaching its threshold first, `Floor::leads`); ties by the
    /// library's position in the scope, then chunk uid (stable). Every score
    /// is a function of the caller's libraries only — keyword ranking uses
    /// each library's own statistics (`rank`), semantic ranking scores every
    /// vector of the scope exactly (`vectors`) — so what other tenants hold
    /// never moves a result. `q.floor` leaves hits out by relevance. Without
    /// a model, `Hybrid` is keyword search and `Semantic` finds nothing (the
    /// search tool refuses it first).
    pub async fn search(&self, q: &Search<'_>) -> Result<Vec<SearchHit>, GraphError> {
        let semantic = self.store.semantic.clone();
        let mode = match (q.mode, &semantic) {
            (Mode::Hybrid, None) => Mode::Keyword,
            (m, _) => m,
        };
        // Libraries whose index is fresh answer from it; the others (not
        // built yet on this replica, or no index) from the graph.
        let ready = match &self.store.index {
            Some(ix) => ix.ready(&self.store, self.scope.uids()).await,
            None => HashMap::new(),
        };
        // Keyword mode keeps the best `limit` passing the floor's per-hit
        // relevance; hybrid fuses the best `CANDIDATES` and filters after.
        let (k, floor) = match mode {
            Mode::Keyword => (q.limit, q.floor.per_hit()),
            _ => (CANDIDATES.max(q.limit), 0.0),
        };
        let keyword = match mode {
            Mode::Keyword | Mode::Hybrid => self.keyword_ranked(q.text, q.collection_uid, &ready, k, floor).await?,
            Mode::Semantic => Vec::new(),
        };
        let vector = match (mode, &semantic) {
            (Mode::Semantic | Mode::Hybrid, Some(s)) => Some(
                self.semantic_ranked(
                    s,
                    q.text,
                    q.collection_uid,
                    &ready,
                    CANDIDATES.max(q.limit),
                    mode == Mode::Hybrid,
                )
                .await?,
            ),
            _ => None,
        };
        let mut ranked = fuse(mode, keyword, vector.unwrap_or_default(), q.limit);
        q.floor.apply(&mut ranked);
        ranked.sort_by(|a, b| {
            q.floor
                .leads(b)
                .cmp(&q.floor.leads(a))
                .then_with(|| b.score.total_cmp(&a.score))
                .then_with(|| {
                    self.scope
                        .position(&a.library_uid)
                        .cmp(&self.scope.position(&b.library_uid))
                })
                .then_with(|| a.chunk_uid.cmp(&b.chunk_uid))
        });
        ranked.truncate(q.limit);
        self.hits(ranked, &ready).await
    }

    /// The scope's keyword candidates, scored (unsorted): from each fresh
    /// library index (`ready`) its best `k` with relevance ≥ `floor`, from
    /// the graph every candidate of the other libraries.
    async fn keyword_ranked(
        &self,
        text: &str,
        collection_uid: Option<&str>,
        ready: &HashMap<String, Arc<OpenLibrary>>,
        k: usize,
        floor: f64,
    ) -> Result<Vec<rank::Scored>, GraphError> {
        let languages = self.languages().await?;
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
            let found = tokio::task::spawn_blocking(move || {
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
                Ok::<_, crate::search::index::IndexError>(out)
            })
            .await
            .map_err(|e| GraphError::Query(format!("index task: {e}")))?
            .map_err(|e| GraphError::Query(e.to_string()))?;
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
                let q = query(include_str!("../../../cypher/search.cypher"))
                    .param("index", self.store.flavor.fulltext_index())
                    .param("lucene", lucene)
                    .param("libs", libs_param(batch))
                    .param("collection_uid", opt(collection_uid))
                    .param("cap", budget);
                let rows = self.store.rows("search.cypher", q).await?;
                budget -= rows.len() as i64;
                for row in rows {
                    if vanished(&row, &["chunk_uid", "library_uid"])? {
                        continue;
                    }
                    let Some(text) = row.get::<Option<String>>("scoped")? else {
                        continue; // deleted while read (see `vanished`)
                    };
                    let library_uid: String = row.get("library_uid")?;
                    let counter = counters
                        .entry(library_uid.clone())
                        .or_insert_with(|| scoped::TermCounter::new(&library_uid, &words));
                    let (tf, tf_title) = counter.count(&text);
                    candidates.push(rank::Candidate {
                        chunk_uid: row.get("chunk_uid")?,
                        library_uid,
                        dl: row.get("dl")?,
                        tf,
                        tf_title,
                    });
                }
            }
            groups.push((word_of, rank::by_library(candidates)));
        }
        let found: Vec<String> = groups.iter().flat_map(|(_, g)| g.keys().cloned()).collect();
        let stats = self.ranking_stats(&found).await?;
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

    /// The `k` chunks of the scope most similar to the query, best first
    /// by the meaning's evidence (`fusion::Near`). Exact: every vector of the
    /// scope's libraries is scored, and no other — a fresh library index's
    /// from the index (`ready`), another library's from the vector cache,
    /// except in a scope wider than the indexes kept open (a staff search
    /// over every library), where a library not open has no semantic
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
        semantic: &crate::embed::Embedder,
        text: &str,
        collection_uid: Option<&str>,
        ready: &HashMap<String, Arc<OpenLibrary>>,
        k: usize,
        cross: bool,
    ) -> Result<Vec<Near>, GraphError> {
        if self.scope.is_empty() {
            return Ok(Vec::new());
        }
        let calibration = Calibration::of(semantic.kind());
        let model = semantic.id().to_owned();
        let (dim, model_dim) = (semantic.dim(), semantic.model_dim());
        // The two query vectors, embedded at once (each on a blocking
        // thread). If the cross-language model's cannot be made (a damaged
        // model), the search goes on with the embedding model's alone.
        let key = self.scope.cache_key();
        let cross_query = async {
            if !cross {
                return None;
            }
            match semantic.cross_query_vector(&key, text).await {
                Some(Ok(u)) => Some(u),
                Some(Err(e)) => {
                    tracing::warn!(error = %e, "cross-language model: no query vector; searching with the embedding model's alone");
                    None
                }
                _ => None,
            }
        };
        let (v, u) = tokio::join!(semantic.query_vector(&key, text), cross_query);
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
        let indexed: Vec<Arc<OpenLibrary>> = self.scope.uids().iter().filter_map(|u| ready.get(u).cloned()).collect();
        if !indexed.is_empty() {
            let (q, near, collection) = (q.clone(), near.clone(), collection_uid.map(str::to_owned));
            let found = tokio::task::spawn_blocking(move || {
                let mut out = Vec::new();
                for lib in indexed {
                    for (_, uid, vector) in lib.index.nearest(&q, dim, k, collection.as_deref())? {
                        out.push(near(uid, lib.uid().to_owned(), &vector));
                    }
                }
                Ok::<_, crate::search::index::IndexError>(out)
            })
            .await
            .map_err(|e| GraphError::Query(format!("index task: {e}")))?
            .map_err(|e| GraphError::Query(e.to_string()))?;
            out.extend(found);
        }
        let wide = self
            .store
            .index
            .as_ref()
            .is_some_and(|ix| ix.is_wide(self.scope.uids().len()));
        let rest: Vec<String> = match wide {
            true => Vec::new(),
            false => self
                .scope
                .uids()
                .iter()
                .filter(|u| !ready.contains_key(*u))
                .cloned()
                .collect(),
        };
        for (lib, vectors) in self.store.library_vectors(&model, dim, &rest).await? {
            for (_, uid, vector) in vectors.top(&q, k, collection_uid) {
                out.push(near(uid, lib.clone(), &vector));
            }
        }
        out.sort_by(|a, b| {
            b.order
                .total_cmp(&a.order)
                .then_with(|| {
                    self.scope
                        .position(&a.library_uid)
                        .cmp(&self.scope.position(&b.library_uid))
                })
                .then_with(|| a.chunk_uid.cmp(&b.chunk_uid))
        });
        out.truncate(k);
        Ok(out)
    }

    /// The ranked chunks with their text and source, in the order given; a
    /// chunk deleted or replaced since it was ranked is left out.
    async fn hits(
        &self,
        ranked: Vec<Ranked>,
        ready: &HashMap<String, Arc<OpenLibrary>>,
    ) -> Result<Vec<SearchHit>, GraphError> {
        if ranked.is_empty() {
            return Ok(Vec::new());
        }
        // Chunks of fresh indexes are read from them, the rest from the graph.
        let from_index: Vec<(Arc<OpenLibrary>, String)> = ranked
            .iter()
            .filter_map(|r| ready.get(&r.library_uid).map(|l| (l.clone(), r.chunk_uid.clone())))
            .collect();
        let mut details: HashMap<String, IndexedChunk> = tokio::task::spawn_blocking(move || {
            let mut out = HashMap::new();
            for (lib, uid) in from_index {
                if let Some(c) = lib.index.chunk(&uid)? {
                    out.insert(uid, c);
                }
            }
            Ok::<_, crate::search::index::IndexError>(out)
        })
        .await
        .map_err(|e| GraphError::Query(format!("index task: {e}")))?
        .map_err(|e| GraphError::Query(e.to_string()))?;
        let from_graph: Vec<String> = ranked
            .iter()
            .filter(|r| !ready.contains_key(&r.library_uid))
            .map(|r| r.chunk_uid.clone())
            .collect();
        details.extend(self.graph_details(from_graph).await?);
        let mut libs: Vec<String> = ranked.iter().map(|r| r.library_uid.clone()).collect();
        libs.sort();
        libs.dedup();
        let names = self.library_names(&libs).await?;
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

    /// The chunks `uids` of the scope as the graph holds them, with their
    /// items' citation fields (read through the scope's libraries only).
    async fn graph_details(&self, uids: Vec<String>) -> Result<HashMap<String, IndexedChunk>, GraphError> {
        let mut details: HashMap<String, IndexedChunk> = HashMap::new();
        if uids.is_empty() {
            return Ok(details);
        }
        let q = query(include_str!("../../../cypher/search_chunks.cypher"))
            .param("uids", uids)
            .param("libs", libs_param(self.scope.uids()));
        for row in self.store.rows("search_chunks.cypher", q).await? {
            if vanished(&row, &["chunk_uid", "item_uid", "collection_uid", "ordinal", "text"])? {
                continue;
            }
            let c = IndexedChunk {
                chunk_uid: row.get("chunk_uid")?,
                item_uid: row.get("item_uid")?,
                item_title: row.get::<Option<String>>("item_title")?.unwrap_or_default(),
                collection_uid: row.get("collection_uid")?,
                ordinal: row.get("ordinal")?,
                text: row.get("text")?,
                ..Default::default()
            };
            details.insert(c.chunk_uid.clone(), c);
        }
        // The items' citation fields: one indexed lookup by uid (a join from
        // each chunk cost ArcadeDB ~10 ms a search).
        let mut items: Vec<String> = details.values().map(|c| c.item_uid.clone()).collect();
        items.sort();
        items.dedup();
        let q = query(include_str!("../../../cypher/search_items.cypher"))
            .param("items", items)
            .param("libs", libs_param(self.scope.uids()));
        let mut sources: HashMap<String, Row> = HashMap::new();
        for row in self.store.rows("search_items.cypher", q).await? {
            sources.insert(row.get("uid")?, row);
        }
        for c in details.values_mut() {
            if let Some(r) = sources.get(&c.item_uid) {
                c.source_uri = r.get("source_uri")?;
                c.mime_type = r.get("mime_type")?;
                c.updated_at = r.get("updated_at")?;
            }
        }
        Ok(details)
    }

    /// The names of `libs`, as read at most `NAMES_TTL` ago.
    async fn library_names(&self, libs: &[String]) -> Result<HashMap<String, String>, GraphError> {
        let mut names = HashMap::with_capacity(libs.len());
        let mut missing = Vec::new();
        for lib in libs {
            match self.store.names.get(lib).await {
                Some(n) => {
                    names.insert(lib.clone(), n);
                }
                None => missing.push(lib.clone()),
            }
        }
        if missing.is_empty() {
            return Ok(names);
        }
        let q = query(include_str!("../../../cypher/search_library_names.cypher")).param("libs", missing);
        for row in self.store.rows("search_library_names.cypher", q).await? {
            let (uid, name): (String, String) =
                (row.get("uid")?, row.get::<Option<String>>("name")?.unwrap_or_default());
            self.store.names.insert(uid.clone(), name.clone()).await;
            names.insert(uid, name);
        }
        Ok(names)
    }

    /// The scope's existing libraries, in scope order, with the language
    /// their text is analyzed in (cached: it never changes).
    async fn languages(&self) -> Result<Vec<(String, Language)>, GraphError> {
        let uids = self.scope.uids();
        let mut known = Vec::with_capacity(uids.len());
        let mut missing = Vec::new();
        for uid in uids {
            match self.store.known.get(&Known::Language(uid.clone())).await {
                Some(code) => known.push(Some(Language::of_stored(Some(&code)))),
                None => {
                    known.push(None);
                    missing.push(uid.clone());
                }
            }
        }
        if !missing.is_empty() {
            let q = query(include_str!("../../../cypher/search_libraries.cypher")).param("libs", libs_param(&missing));
            let mut read: HashMap<String, Language> = HashMap::new();
            for row in self.store.rows("search_libraries.cypher", q).await? {
                let language = Language::of_stored(row.get::<Option<String>>("language")?.as_deref());
                let uid: String = row.get("uid")?;
                self.store
                    .known
                    .insert(Known::Language(uid.clone()), language.code().to_owned())
                    .await;
                read.insert(uid, language);
            }
            for (slot, uid) in known.iter_mut().zip(uids) {
                if slot.is_none() {
                    *slot = read.get(uid).copied();
                }
            }
        }
        Ok(uids
            .iter()
            .zip(known)
            .filter_map(|(uid, l)| l.map(|l| (uid.clone(), l)))
            .collect())
    }

    /// Chunk count and total length of each library in `libs`, as read at
    /// most `rank::STATS_TTL` ago (one query for those not cached).
    async fn ranking_stats(&self, libs: &[String]) -> Result<HashMap<String, rank::LibraryStats>, GraphError> {
        let mut out = HashMap::with_capacity(libs.len());
        let mut missing = Vec::new();
        for lib in libs {
            match self.store.ranking.get(lib).await {
                Some(s) => {
                    out.insert(lib.clone(), s);
                }
                None => missing.push(lib.clone()),
            }
        }
        if missing.is_empty() {
            return Ok(out);
        }
        let q = query(include_str!("../../../cypher/search_library_stats.cypher")).param("libs", libs_param(&missing));
        for row in self.store.rows("search_library_stats.cypher", q).await? {
            let stats = rank::LibraryStats {
                n: row.get("n")?,
                tokens: row.get("tokens")?,
            };
            let uid: String = row.get("uid")?;
            self.store.ranking.insert(uid.clone(), stats).await;
            out.insert(uid, stats);
        }
        Ok(out)
    }

    /// The citation of a chunk of `item_uid` in `library_uid` (a library
    /// inside the scope: it is the chunk's own).
    pub async fn citation(&self, item_uid: &str, library_uid: &str) -> Result<Citation, GraphError> {
        if !self.scope.contains(library_uid) {
            return Ok(Citation::default());
        }
        let q = query(include_str!("../../../cypher/search_items.cypher"))
            .param("items", vec![item_uid.to_owned()])
            .param("libs", vec![library_uid.to_owned()]);
        let mut out = Citation::default();
        if let Some(r) = self.store.rows("search_items.cypher", q).await?.first() {
            out.source_uri = r.get("source_uri")?;
            out.mime_type = r.get("mime_type")?;
            out.updated_at = r.get("updated_at")?;
        }
        let q = query(include_str!("../../../cypher/search_library_names.cypher"))
            .param("libs", vec![library_uid.to_owned()]);
        if let Some(r) = self.store.rows("search_library_names.cypher", q).await?.first() {
            out.library_name = r.get::<Option<String>>("name")?.unwrap_or_default();
        }
        Ok(out)
    }

    /// A chunk and up to `context` neighbours each side, or None if absent or
    /// outside the scope.
    pub async fn get_chunk(&self, uid: &str, context: i64) -> Result<Option<(ChunkView, Vec<ChunkView>)>, GraphError> {
        if self.scope.is_empty() {
            return Ok(None);
        }
        let q = query(include_str!("../../../cypher/get_chunk.cypher"))
            .param("uid", uid)
            .param("libs", libs_param(self.scope.uids()))
            .param("context", context);
        let mut focal = None;
        let mut neighbors = Vec::new();
        for row in self.store.rows("get_chunk.cypher", q).await? {
            if vanished(
                &row,
                &["uid", "text", "ordinal", "item_uid", "collection_uid", "library_uid"],
            )? {
                continue;
            }
            let c = row.to::<ChunkView>()?;
            if c.uid == uid {
                focal = Some(c);
            } else {
                neighbors.push(c);
            }
        }
        Ok(focal.map(|f| (f, neighbors)))
    }

    /// The scope's libraries that exist, in scope order, with counts.
    pub async fn list_libraries(&self) -> Result<Vec<LibraryView>, GraphError> {
        if self.scope.is_empty() {
            return Ok(Vec::new());
        }
        let q =
            query(include_str!("../../../cypher/list_libraries.cypher")).param("libs", libs_param(self.scope.uids()));
        let mut libs = Vec::new();
        for row in self.store.rows("list_libraries.cypher", q).await? {
            libs.push(LibraryView {
                uid: row.get("uid")?,
                name: row.get::<Option<String>>("name")?.unwrap_or_default(),
                description: row.get::<Option<String>>("description")?.unwrap_or_default(),
                collection_count: row.get("collection_count")?,
                item_count: row.get("item_count")?,
            });
        }
        libs.sort_by_key(|l| self.scope.position(&l.uid));
        Ok(libs)
    }

    /// One page of collections (uid order) after `after`.
    pub async fn list_collections(&self, after: &str, limit: usize) -> Result<Vec<CollectionView>, GraphError> {
        if self.scope.is_empty() {
            return Ok(Vec::new());
        }
        let q = query(include_str!("../../../cypher/list_collections.cypher"))
            .param("libs", libs_param(self.scope.uids()))
            .param("after", after)
            .param("limit", limit as i64);
        self.store
            .rows("list_collections.cypher", q)
            .await?
            .iter()
            .map(|r| Ok(r.to::<CollectionView>()?))
            .collect()
    }

    /// Whether the collection exists inside the scope.
    pub async fn has_collection(&self, uid: &str) -> Result<bool, GraphError> {
        Ok(self.collection_library(uid).await?.is_some())
    }

    /// The library of a collection inside the scope (None: absent or outside it).
    pub async fn collection_library(&self, uid: &str) -> Result<Option<String>, GraphError> {
        if self.scope.is_empty() {
            return Ok(None);
        }
        let q = query(include_str!("../../../cypher/scoped_collection.cypher"))
            .param("uid", uid)
            .param("libs", libs_param(self.scope.uids()));
        match self.store.rows("scoped_collection.cypher", q).await?.first() {
            Some(row) => Ok(Some(row.get("library_uid")?)),
            None => Ok(None),
        }
    }

    /// One page of items (uid order) after `after`, optionally in one collection.
    pub async fn list_items(
        &self,
        collection_uid: Option<&str>,
        after: &str,
        limit: usize,
    ) -> Result<Vec<ItemView>, GraphError> {
        if self.scope.is_empty() {
            return Ok(Vec::new());
        }
        let q: Query = query(include_str!("../../../cypher/list_items.cypher"))
            .param("libs", libs_param(self.scope.uids()))
            .param("collection_uid", opt(collection_uid))
            .param("after", after)
            .param("limit", limit as i64);
        self.store
            .rows("list_items.cypher", q)
            .await?
            .iter()
            .map(|r| Ok(r.to::<ItemView>()?))
            .collect()
    }
}
