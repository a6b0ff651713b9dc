//! The graph reads a search index is built and caught up from
//! (`search::index::replica`), on a narrow handle (`IndexSource`): a
//! library's chunks in pages, the chunks of some of its items now, each with
//! its item's citation fields; and the sweeps of the change rows and write
//! intents (`pg::index_changes`) every write records for the indexes.

use std::collections::HashMap;

use neo4rs::{query, Row};
use sqlx::PgPool;

use super::{GraphError, GraphStore, Pages};
use crate::analysis::scoped;
use crate::store::pg::index_changes;

/// A chunk as a search index holds it (`search::index::LibraryIndex`).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct IndexedChunk {
    pub chunk_uid: String,
    pub item_uid: String,
    pub item_title: String,
    pub collection_uid: String,
    pub ordinal: i64,
    pub text: String,
    /// The analyzed text terms, space-separated, in order.
    pub text_terms: String,
    /// The analyzed title terms, space-separated.
    pub title_terms: String,
    /// The text's length in terms.
    pub dl: i64,
    pub source_uri: Option<String>,
    pub mime_type: Option<String>,
    pub updated_at: Option<String>,
    /// The chunk's unit vector of the index's model, when it has one.
    pub vector: Option<Vec<f32>>,
}

/// The graph as the search indexes read it: whole libraries and changed
/// items, by library uid (unscoped: the index of a library holds all of it;
/// searches read it only through their scope).
#[derive(Clone)]
pub struct IndexSource(pub(super) GraphStore);

impl IndexSource {
    /// Every chunk of `lib` with its vector of `model` (when it has one),
    /// in pages of `page` (one statement, read in pages: paging by uid made
    /// ArcadeDB sort the whole library for every page).
    pub async fn library(&self, lib: &str, model: &str, page: usize) -> Result<LibraryPages, GraphError> {
        let q = query(include_str!("../../../cypher/index_library.cypher"))
            .param("lib", lib)
            .param("model", model);
        Ok(LibraryPages {
            pages: self.0.stream("index_library.cypher", q, page).await?,
            source: self.0.clone(),
            lib: lib.to_owned(),
            keys: (scoped::library_key(lib), scoped::title_key(lib)),
            sources: HashMap::new(),
        })
    }

    /// Every chunk the `items` of `lib` hold now, with their citation fields.
    pub async fn item_chunks(&self, lib: &str, model: &str, items: &[String]) -> Result<Vec<IndexedChunk>, GraphError> {
        item_chunks(&self.0, lib, model, items).await
    }
}

/// A library's chunks, page by page (`IndexSource::library`).
pub struct LibraryPages {
    pages: Pages,
    source: GraphStore,
    lib: String,
    keys: (String, String),
    /// Citation fields of the items seen lately (kept small: an item seen
    /// again is read again).
    sources: HashMap<String, Source>,
}

impl LibraryPages {
    /// The next page of chunks with their citation fields; None at the end.
    pub async fn next(&mut self) -> Result<Option<Vec<IndexedChunk>>, GraphError> {
        let Some(rows) = self.pages.next().await? else {
            return Ok(None);
        };
        let mut chunks = Vec::with_capacity(rows.len());
        for r in &rows {
            if let Some(c) = chunk_of(r, &self.keys.0, &self.keys.1)? {
                chunks.push(c);
            }
        }
        drop(rows);
        let mut missing: Vec<String> = chunks
            .iter()
            .map(|c| c.item_uid.clone())
            .filter(|i| !self.sources.contains_key(i))
            .collect();
        missing.sort();
        missing.dedup();
        self.sources
            .extend(item_sources(&self.source, &self.lib, &missing).await?);
        for c in &mut chunks {
            if let Some(s) = self.sources.get(&c.item_uid) {
                s.fill(c);
            }
        }
        if self.sources.len() > 50_000 {
            self.sources.clear();
        }
        Ok(Some(chunks))
    }
}

/// Days the change rows are kept: a replica whose index is older rebuilds it.
pub const CHANGES_KEPT_DAYS: u32 = 7;

/// Sweeps change rows older than `CHANGES_KEPT_DAYS` now and then every
/// `every` (a server task; every replica may run it, a sweep is idempotent).
pub async fn sweep_loop(pool: PgPool, every: std::time::Duration) {
    let mut tick = tokio::time::interval(every);
    loop {
        tick.tick().await;
        match index_changes::sweep(&pool, CHANGES_KEPT_DAYS).await {
            Ok(0) => {}
            Ok(n) => tracing::info!(deleted = n, "search index change rows past retention deleted"),
            Err(e) => tracing::warn!(error = %e, "search index change sweep failed; retried on the next tick"),
        }
    }
}

/// Seconds after which a write's intent is recorded by the sweep (a write
/// still running then records its change again: harmless), after which it
/// is recorded once more (a graph commit that landed late), and after which
/// it is dropped.
pub const INTENT_GRACE_SECS: f64 = 5.0;
pub const INTENT_LATE_SECS: f64 = 540.0;
pub const INTENT_KEPT_SECS: f64 = 600.0;

/// Records the changes of writes that committed in the graph but could not
/// record them (Postgres failed between the two, or the caller gave up), and
/// whose client never retried: every `every`, the intents older than
/// `INTENT_GRACE_SECS`, and once more past `INTENT_LATE_SECS`
/// (`pg::index_changes::sweep_intents`). Every replica runs it; each intent
/// is taken by one of them.
pub async fn intent_sweep_loop(pool: PgPool, every: std::time::Duration) {
    let mut tick = tokio::time::interval(every);
    loop {
        tick.tick().await;
        match index_changes::sweep_intents(&pool, INTENT_GRACE_SECS, INTENT_LATE_SECS).await {
            Ok(0) => {}
            Ok(n) => tracing::warn!(
                changes = n,
                "recorded search index changes whose writes could not record them"
            ),
            Err(e) => {
                tracing::debug!(error = %e, "search index intent sweep failed; retried on the next tick");
                continue;
            }
        }
        if let Err(e) = index_changes::expire_intents(&pool, INTENT_KEPT_SECS).await {
            tracing::debug!(error = %e, "expiring search index intents failed; retried on the next tick");
        }
    }
}

struct Source {
    source_uri: Option<String>,
    mime_type: Option<String>,
    updated_at: Option<String>,
}

impl Source {
    fn fill(&self, c: &mut IndexedChunk) {
        c.source_uri = self.source_uri.clone();
        c.mime_type = self.mime_type.clone();
        c.updated_at = self.updated_at.clone();
    }
}

/// A chunk row as the index holds it; None when it vanished while read.
fn chunk_of(r: &Row, key: &str, tkey: &str) -> Result<Option<IndexedChunk>, GraphError> {
    let (Some(uid), Some(item_uid), Some(collection_uid), Some(scoped)) = (
        r.get::<Option<String>>("uid")?,
        r.get::<Option<String>>("item_uid")?,
        r.get::<Option<String>>("collection_uid")?,
        r.get::<Option<String>>("scoped")?,
    ) else {
        return Ok(None);
    };
    let (text_terms, title_terms) = scoped::split_scoped(&scoped, key, tkey);
    Ok(Some(IndexedChunk {
        chunk_uid: uid,
        item_uid,
        item_title: r.get::<Option<String>>("item_title")?.unwrap_or_default(),
        collection_uid,
        ordinal: r.get::<Option<i64>>("ordinal")?.unwrap_or(0),
        text: r.get::<Option<String>>("text")?.unwrap_or_default(),
        text_terms,
        title_terms,
        dl: r.get::<Option<i64>>("dl")?.unwrap_or(0),
        source_uri: None,
        mime_type: None,
        updated_at: None,
        vector: super::vectors::row_vector(r)?,
    }))
}

async fn item_sources(graph: &GraphStore, lib: &str, items: &[String]) -> Result<HashMap<String, Source>, GraphError> {
    let mut out = HashMap::new();
    if items.is_empty() {
        return Ok(out);
    }
    let q = query(include_str!("../../../cypher/index_items.cypher"))
        .param("items", items.to_vec())
        .param("lib", lib);
    for r in graph.rows_from_leader("index_items.cypher", q).await? {
        let Some(uid) = r.get::<Option<String>>("uid")? else {
            continue;
        };
        out.insert(
            uid,
            Source {
                source_uri: r.get("source_uri")?,
                mime_type: r.get("mime_type")?,
                updated_at: r.get("updated_at")?,
            },
        );
    }
    Ok(out)
}

/// Every chunk the `items` of `lib` hold now, with their citation fields.
async fn item_chunks(
    graph: &GraphStore,
    lib: &str,
    model: &str,
    items: &[String],
) -> Result<Vec<IndexedChunk>, GraphError> {
    let (key, tkey) = (scoped::library_key(lib), scoped::title_key(lib));
    let mut chunks = Vec::new();
    for batch in items.chunks(500) {
        let q = query(include_str!("../../../cypher/index_item_chunks.cypher"))
            .param("items", batch.to_vec())
            .param("lib", lib)
            .param("model", model);
        for r in graph.rows_from_leader("index_item_chunks.cypher", q).await? {
            if let Some(c) = chunk_of(&r, &key, &tkey)? {
                chunks.push(c);
            }
        }
        let sources = item_sources(graph, lib, batch).await?;
        for c in &mut chunks {
            if let Some(s) = sources.get(&c.item_uid) {
                s.fill(c);
            }
        }
    }
    Ok(chunks)
}
