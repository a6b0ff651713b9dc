//! Knowledge reads. They are methods of `ScopedGraph`, a view of the graph that
//! can only be made from a resolved `Principal` (or, for staff, every library:
//! `auth::resolver::every_library`): there is no way to read a Library,
//! Collection, Item or Chunk outside its scope, and anything outside it is
//! reported exactly like something that does not exist.

use std::collections::HashMap;

use neo4rs::{query, BoltType, Query, Row};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use std::sync::Arc;
use std::time::Duration;

use super::indexing::IndexedChunk;
use super::vectors::LibVectors;
use super::{ingest, vanished, GraphError, GraphStore, Known};
use crate::analysis::Language;
use crate::ids::Scope;

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

/// A library's chunk count and total length in terms (what BM25 normalizes
/// by), as `ScopedGraph::library_stats` reads them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LibraryStats {
    /// Chunks in the library.
    pub n: i64,
    /// Sum of the chunks' lengths in terms.
    pub tokens: i64,
}

/// How long a library's statistics and name are cached (a write or a
/// rename shows in a search at most this late).
pub const STATS_TTL: Duration = Duration::from_secs(2);

/// A keyword candidate as the graph's full-text index finds it
/// (`ScopedGraph::keyword_rows`).
pub struct KeywordRow {
    pub chunk_uid: String,
    pub library_uid: String,
    /// Its text's length in terms.
    pub dl: i64,
    /// Its `scoped` terms (`analysis::scoped::scoped_text`).
    pub scoped: String,
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
}

impl ScopedGraph {
    pub(super) fn new(store: GraphStore, scope: Scope) -> Self {
        ScopedGraph { store, scope }
    }

    pub(super) fn store(&self) -> &GraphStore {
        &self.store
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

    /// One full-text query of the graph's index (`lucene`, as
    /// `analysis::scoped::scoped_queries` writes it) over `libs` (those
    /// inside the scope), optionally one collection: at most `cap` rows.
    pub async fn keyword_rows(
        &self,
        lucene: String,
        libs: &[String],
        collection_uid: Option<&str>,
        cap: i64,
    ) -> Result<Vec<KeywordRow>, GraphError> {
        let libs: Vec<String> = libs.iter().filter(|l| self.scope.contains(l)).cloned().collect();
        if libs.is_empty() || cap <= 0 {
            return Ok(Vec::new());
        }
        let q = query(include_str!("../../../cypher/search.cypher"))
            .param("index", self.store.flavor.fulltext_index())
            .param("lucene", lucene)
            .param("libs", libs_param(&libs))
            .param("collection_uid", opt(collection_uid))
            .param("cap", cap);
        let mut out = Vec::new();
        for row in self.store.rows("search.cypher", q).await? {
            if vanished(&row, &["chunk_uid", "library_uid"])? {
                continue;
            }
            let Some(scoped) = row.get::<Option<String>>("scoped")? else {
                continue; // deleted while read (see `vanished`)
            };
            out.push(KeywordRow {
                chunk_uid: row.get("chunk_uid")?,
                library_uid: row.get("library_uid")?,
                dl: row.get("dl")?,
                scoped,
            });
        }
        Ok(out)
    }

    /// The stored vectors of `model` (`dim` values each) of `libs` (those
    /// inside the scope), from this replica's vector cache (`vectors`).
    pub async fn library_vectors(
        &self,
        model: &str,
        dim: usize,
        libs: &[String],
    ) -> Result<Vec<(String, Arc<LibVectors>)>, GraphError> {
        let libs: Vec<String> = libs.iter().filter(|l| self.scope.contains(l)).cloned().collect();
        self.store.library_vectors(model, dim, &libs).await
    }

    /// The chunks `uids` of the scope as the graph holds them, with their
    /// items' citation fields (read through the scope's libraries only).
    pub async fn chunk_details(&self, uids: Vec<String>) -> Result<HashMap<String, IndexedChunk>, GraphError> {
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

    /// The names of `libs` (those inside the scope), as read at most
    /// `STATS_TTL` ago.
    pub async fn library_names(&self, libs: &[String]) -> Result<HashMap<String, String>, GraphError> {
        let mut names = HashMap::with_capacity(libs.len());
        let mut missing = Vec::new();
        for lib in libs.iter().filter(|l| self.scope.contains(l)) {
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
    pub async fn languages(&self) -> Result<Vec<(String, Language)>, GraphError> {
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

    /// Chunk count and total length of each library in `libs` (those inside
    /// the scope), as read at most `STATS_TTL` ago (one query for those not
    /// cached).
    pub async fn library_stats(&self, libs: &[String]) -> Result<HashMap<String, LibraryStats>, GraphError> {
        let mut out = HashMap::with_capacity(libs.len());
        let mut missing = Vec::new();
        for lib in libs.iter().filter(|l| self.scope.contains(l)) {
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
            let stats = LibraryStats {
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
