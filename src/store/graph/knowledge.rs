//! Knowledge reads. They are methods of `ScopedGraph`, a view of the graph that
//! can only be made from a resolved `Principal` (or, for staff, every library:
//! `AdminGraph::every_library`): there is no way to read a Library,
//! Collection, Item or Chunk outside its scope, and anything outside it is
//! reported exactly like something that does not exist.

use neo4rs::{query, BoltType, Query};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::{ingest, scoped, GraphError, GraphStore};
use crate::auth::{Principal, Scope};

#[derive(Clone, Debug, Serialize, Deserialize, JsonSchema, PartialEq)]
pub struct SearchHit {
    pub chunk_uid: String,
    pub item_uid: String,
    pub item_title: String,
    pub collection_uid: String,
    pub library_uid: String,
    pub ordinal: i64,
    pub score: f64,
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

    /// Full-text search inside the scope, best first; ties by the library's
    /// position in the scope, then chunk uid (stable).
    pub async fn search(
        &self,
        text: &str,
        limit: usize,
        collection_uid: Option<&str>,
    ) -> Result<Vec<SearchHit>, GraphError> {
        let words = scoped::query_words(text);
        // A few extra rows so ties at the cut are broken by scope order.
        let fetch = (limit + 10) as i64;
        let mut hits = Vec::new();
        for (batch, lucene) in scoped::scoped_queries(self.scope.uids(), &words) {
            let q = query(include_str!("../../../cypher/search.cypher"))
                .param("index", self.store.flavor.fulltext_index())
                .param("lucene", lucene)
                .param("libs", libs_param(batch))
                .param("collection_uid", opt(collection_uid))
                .param("limit", fetch);
            for row in self.store.rows("search.cypher", q).await? {
                hits.push(row.to::<SearchHit>()?);
            }
        }
        hits.sort_by(|a, b| {
            b.score
                .total_cmp(&a.score)
                .then_with(|| {
                    self.scope
                        .position(&a.library_uid)
                        .cmp(&self.scope.position(&b.library_uid))
                })
                .then_with(|| a.chunk_uid.cmp(&b.chunk_uid))
        });
        hits.truncate(limit);
        Ok(hits)
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
