//! Knowledge reads. They are methods of `ScopedGraph`, a view of the graph that
//! can only be made from a resolved `Principal` (or, for staff, every library:
//! `AdminGraph::every_library`): there is no way to read a Library,
//! Collection, Item or Chunk outside its scope, and anything outside it is
//! reported exactly like something that does not exist.

use std::collections::HashMap;

use neo4rs::{query, BoltType, Query, Row};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::analysis::Language;
use super::{ingest, rank, scoped, GraphError, GraphStore};
use crate::auth::{Principal, Scope};

#[derive(Clone, Debug, Serialize, Deserialize, JsonSchema, PartialEq)]
pub struct SearchHit {
    pub chunk_uid: String,
    pub item_uid: String,
    pub item_title: String,
    pub collection_uid: String,
    pub library_uid: String,
    pub ordinal: i64,
    /// BM25 over the library's own statistics (text and title).
    pub score: f64,
    /// Share of the query's weight this chunk matches, 0–1: below about 0.5
    /// the library most likely holds nothing relevant (see `min_relevance`).
    pub relevance: f64,
    pub text: String,
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

/// Most candidate chunks one search query reads (per batch of libraries):
/// past it, a library's document frequencies are counted over this many.
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
#[derive(Clone)]
pub struct KnowledgeGraph(GraphStore);

impl GraphStore {
    /// What `principal` may read (its resolved libraries).
    pub fn scoped(&self, principal: &Principal) -> ScopedGraph {
        ScopedGraph::new(self.clone(), principal.libraries.clone())
    }

    /// A handle that can only make scoped views.
    pub fn knowledge(&self) -> KnowledgeGraph {
        KnowledgeGraph(self.clone())
    }
}

impl KnowledgeGraph {
    /// What `principal` may read (its resolved libraries).
    pub fn scoped(&self, principal: &Principal) -> ScopedGraph {
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
}

impl ScopedGraph {
    pub(super) fn new(store: GraphStore, scope: Scope) -> Self {
        ScopedGraph { store, scope }
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

    /// Keyword search inside the scope, best first; ties by the library's
    /// position in the scope, then chunk uid (stable). Each library's hits
    /// are ranked with its own statistics only (`rank`), so what other
    /// tenants hold never moves them. Hits below `min_relevance` are left out.
    pub async fn search(
        &self,
        text: &str,
        limit: usize,
        collection_uid: Option<&str>,
        min_relevance: f64,
    ) -> Result<Vec<SearchHit>, GraphError> {
        // Libraries analyzed alike share their query terms and queries.
        let mut by_language: Vec<(Language, Vec<String>)> = Vec::new();
        for (uid, language) in self.languages().await? {
            match by_language.iter_mut().find(|(l, _)| *l == language) {
                Some((_, uids)) => uids.push(uid),
                None => by_language.push((language, vec![uid])),
            }
        }
        let mut groups = Vec::new();
        for (language, uids) in &by_language {
            let words = scoped::query_words(*language, text);
            let mut candidates = Vec::new();
            for (batch, lucene) in scoped::scoped_queries(uids, &words) {
                let keys: Vec<String> = batch.iter().map(|l| scoped::library_key(l)).collect();
                let q = query(include_str!("../../../cypher/search.cypher"))
                    .param("index", self.store.flavor.fulltext_index())
                    .param("lucene", lucene)
                    .param("libs", libs_param(batch))
                    .param("keys", keys)
                    .param("words", words.clone())
                    .param("collection_uid", opt(collection_uid))
                    .param("cap", MAX_CANDIDATES);
                for row in self.store.rows("search.cypher", q).await? {
                    candidates.push(rank::Candidate {
                        chunk_uid: row.get("chunk_uid")?,
                        library_uid: row.get("library_uid")?,
                        dl: row.get("dl")?,
                        tf: row.get("tf")?,
                        tf_title: row.get("tf_title")?,
                    });
                }
            }
            groups.push((words.len(), rank::by_library(candidates)));
        }
        let found: Vec<String> = groups.iter().flat_map(|(_, g)| g.keys().cloned()).collect();
        let stats = self.ranking_stats(&found).await?;
        let mut scored: Vec<rank::Scored> = Vec::new();
        for (terms, libraries) in groups {
            for (lib, cs) in libraries {
                let s = stats
                    .get(&lib)
                    .copied()
                    .unwrap_or(rank::LibraryStats { n: 0, tokens: 0 });
                scored.extend(rank::score_library(s, terms, &cs));
            }
        }
        scored.retain(|s| s.relevance >= min_relevance);
        scored.sort_by(|a, b| {
            b.score
                .total_cmp(&a.score)
                .then_with(|| {
                    self.scope
                        .position(&a.library_uid)
                        .cmp(&self.scope.position(&b.library_uid))
                })
                .then_with(|| a.chunk_uid.cmp(&b.chunk_uid))
        });
        scored.truncate(limit);
        if scored.is_empty() {
            return Ok(Vec::new());
        }
        let uids: Vec<String> = scored.iter().map(|s| s.chunk_uid.clone()).collect();
        let q = query(include_str!("../../../cypher/search_chunks.cypher"))
            .param("uids", uids)
            .param("libs", libs_param(self.scope.uids()));
        let mut details: HashMap<String, Row> = HashMap::new();
        for row in self.store.rows("search_chunks.cypher", q).await? {
            details.insert(row.get("chunk_uid")?, row);
        }
        let mut hits = Vec::with_capacity(scored.len());
        for s in scored {
            // A chunk replaced between the two reads is left out.
            let Some(row) = details.get(&s.chunk_uid) else { continue };
            hits.push(SearchHit {
                chunk_uid: s.chunk_uid,
                item_uid: row.get("item_uid")?,
                item_title: row.get::<Option<String>>("item_title")?.unwrap_or_default(),
                collection_uid: row.get("collection_uid")?,
                library_uid: s.library_uid,
                ordinal: row.get("ordinal")?,
                score: s.score,
                relevance: s.relevance,
                text: row.get("text")?,
            });
        }
        Ok(hits)
    }

    /// The scope's existing libraries, in scope order, with the language
    /// their text is analyzed in (cached: it never changes).
    async fn languages(&self) -> Result<Vec<(String, Language)>, GraphError> {
        let uids = self.scope.uids();
        let mut known = Vec::with_capacity(uids.len());
        let mut missing = Vec::new();
        for uid in uids {
            match self.store.known.get(&format!("lang:{uid}")).await {
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
                    .insert(format!("lang:{uid}"), language.code().to_owned())
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
        if self.scope.is_empty() {
            return Ok(false);
        }
        let q = query(include_str!("../../../cypher/scoped_collection.cypher"))
            .param("uid", uid)
            .param("libs", libs_param(self.scope.uids()));
        Ok(!self.store.rows("scoped_collection.cypher", q).await?.is_empty())
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
