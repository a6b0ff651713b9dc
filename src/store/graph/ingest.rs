//! Writes (ingest, workspace lifecycle) and operator reads that are not scoped
//! by a bearer: only the Basic-authenticated APIs and the CLI call these.
//! Multi-statement writes run in one explicit transaction: all or nothing.

use std::collections::HashMap;

use chrono::{SecondsFormat, Utc};
use neo4rs::{query, BoltType};
use sha2::{Digest, Sha256};

use super::{GraphError, GraphStore};

#[derive(Clone, Debug)]
pub struct LibraryRow {
    pub uid: String,
    pub name: String,
    pub workspace_id: Option<String>,
    pub item_count: i64,
}

#[derive(Clone, Debug, serde::Serialize)]
pub struct WorkspaceLibrary {
    pub uid: String,
    pub name: String,
    pub collection_count: i64,
    pub item_count: i64,
    pub chunk_count: i64,
}

#[derive(Clone, Debug)]
pub struct ExistingItem {
    pub library_uid: String,
    pub collection_uid: String,
    pub content_sha256: Option<String>,
    pub chunk_count: i64,
    pub title: String,
}

/// What to write for one item.
pub struct ItemWrite<'a> {
    pub uid: &'a str,
    pub library_uid: &'a str,
    pub collection_uid: &'a str,
    pub title: &'a str,
    pub source_uri: Option<&'a str>,
    pub mime_type: Option<&'a str>,
    pub content_sha256: &'a str,
    pub chunks: &'a [String],
}

/// `prefix_` + 24 hex chars of SHA-256 over the parts: deterministic uids, so
/// find-or-create is a MERGE and concurrent ingests converge.
pub fn derived_uid(prefix: &str, parts: &[&str]) -> String {
    let mut h = Sha256::new();
    for p in parts {
        h.update(p.as_bytes());
        h.update([0u8]);
    }
    format!("{prefix}_{}", &hex::encode(h.finalize())[..24])
}

fn now() -> String {
    Utc::now().to_rfc3339_opts(SecondsFormat::Millis, true)
}

fn opt(s: Option<&str>) -> BoltType {
    s.map(str::to_owned).into()
}

impl GraphStore {
    /// Every library (operator listing).
    pub async fn all_libraries(&self) -> Result<Vec<LibraryRow>, GraphError> {
        let rows = self
            .rows(query(include_str!("../../../cypher/all_libraries.cypher")))
            .await?;
        rows.iter()
            .map(|r| {
                Ok(LibraryRow {
                    uid: r.get("uid")?,
                    name: r.get::<Option<String>>("name")?.unwrap_or_default(),
                    workspace_id: r.get("workspace_id")?,
                    item_count: r.get("item_count")?,
                })
            })
            .collect()
    }

    /// The library's workspace id, or None if the library does not exist.
    pub async fn find_library(&self, uid: &str) -> Result<Option<Option<String>>, GraphError> {
        let rows = self
            .rows(query(include_str!("../../../cypher/ingest_find_library.cypher")).param("uid", uid))
            .await?;
        match rows.first() {
            Some(r) => Ok(Some(r.get::<Option<String>>("workspace_id")?)),
            None => Ok(None),
        }
    }

    /// Finds or creates the workspace's Library; returns (uid, created), or
    /// None when a Library with that uid exists but is not this workspace's.
    pub async fn ensure_workspace_library(&self, workspace_id: &str) -> Result<Option<(String, bool)>, GraphError> {
        let uid = derived_uid("lib", &["workspace", workspace_id]);
        let existing = self.find_library(&uid).await?;
        if let Some(ws) = &existing {
            if ws.as_deref() != Some(workspace_id) {
                return Ok(None);
            }
        }
        self.rows(
            query(include_str!("../../../cypher/ingest_merge_workspace_library.cypher"))
                .param("uid", uid.as_str())
                .param("workspace_id", workspace_id)
                .param("name", format!("Workspace {workspace_id}"))
                .param("description", format!("Files of Daedalus workspace {workspace_id}"))
                .param("now", now()),
        )
        .await?;
        Ok(Some((uid, existing.is_none())))
    }

    /// Creates a user-managed Library; false if the uid is taken.
    pub async fn create_library(&self, uid: &str, name: &str, description: &str) -> Result<bool, GraphError> {
        if self.find_library(uid).await?.is_some() {
            return Ok(false);
        }
        match self
            .rows(
                query(include_str!("../../../cypher/create_library.cypher"))
                    .param("uid", uid)
                    .param("name", name)
                    .param("description", description)
                    .param("now", now()),
            )
            .await
        {
            Ok(_) => Ok(true),
            // Lost a race on the uniqueness constraint.
            Err(GraphError::Query(m)) if m.contains("ConstraintValidationFailed") => Ok(false),
            Err(e) => Err(e),
        }
    }

    pub async fn ensure_collection(&self, library_uid: &str, name: &str) -> Result<String, GraphError> {
        let uid = derived_uid("col", &[library_uid, name]);
        self.rows(
            query(include_str!("../../../cypher/ingest_merge_collection.cypher"))
                .param("uid", uid.as_str())
                .param("library_uid", library_uid)
                .param("name", name),
        )
        .await?;
        Ok(uid)
    }

    pub async fn find_item(&self, uid: &str) -> Result<Option<ExistingItem>, GraphError> {
        let rows = self
            .rows(query(include_str!("../../../cypher/ingest_find_item.cypher")).param("uid", uid))
            .await?;
        match rows.first() {
            Some(r) => Ok(Some(ExistingItem {
                library_uid: r.get("library_uid")?,
                collection_uid: r.get("collection_uid")?,
                content_sha256: r.get("content_sha256")?,
                chunk_count: r.get::<Option<i64>>("chunk_count")?.unwrap_or(0),
                title: r.get::<Option<String>>("title")?.unwrap_or_default(),
            })),
            None => Ok(None),
        }
    }

    /// Upserts the item and replaces its chunks, in one transaction. Ok(false)
    /// when the item uid belongs to another library (checked inside the
    /// transaction, so two racing ingests cannot mix libraries).
    pub async fn write_item(&self, w: &ItemWrite<'_>) -> Result<bool, GraphError> {
        let chunks: Vec<BoltType> = w
            .chunks
            .iter()
            .enumerate()
            .map(|(i, text)| {
                let mut m: HashMap<String, BoltType> = HashMap::new();
                m.insert(
                    "uid".into(),
                    derived_uid("chk", &[w.uid, w.content_sha256, &i.to_string()]).into(),
                );
                m.insert("ordinal".into(), (i as i64).into());
                m.insert("text".into(), text.as_str().into());
                m.insert("scoped".into(), super::scoped::scoped_text(w.library_uid, text).into());
                m.into()
            })
            .collect();
        let ts = now();
        let guard = query(include_str!("../../../cypher/ingest_item_owner_guard.cypher"))
            .param("uid", w.uid)
            .param("library_uid", w.library_uid);
        self.write_txn_unless(
            guard,
            vec![
                query(include_str!("../../../cypher/ingest_delete_item_chunks.cypher")).param("item_uid", w.uid),
                query(include_str!("../../../cypher/ingest_unlink_old_collection.cypher"))
                    .param("uid", w.uid)
                    .param("collection_uid", w.collection_uid),
                query(include_str!("../../../cypher/ingest_upsert_item.cypher"))
                    .param("uid", w.uid)
                    .param("library_uid", w.library_uid)
                    .param("collection_uid", w.collection_uid)
                    .param("title", w.title)
                    .param("source_uri", opt(w.source_uri))
                    .param("mime_type", opt(w.mime_type))
                    .param("content_sha256", w.content_sha256)
                    .param("chunk_count", w.chunks.len() as i64)
                    .param("now", ts.as_str()),
                query(include_str!("../../../cypher/ingest_create_chunks.cypher"))
                    .param("item_uid", w.uid)
                    .param("library_uid", w.library_uid)
                    .param("collection_uid", w.collection_uid)
                    .param("item_title", w.title)
                    .param("chunks", chunks),
            ],
        )
        .await
    }

    /// Updates an item's descriptive fields when its content is unchanged.
    pub async fn retitle_item(
        &self,
        uid: &str,
        title: &str,
        source_uri: Option<&str>,
        mime_type: Option<&str>,
    ) -> Result<(), GraphError> {
        self.write_txn(vec![query(include_str!("../../../cypher/ingest_retitle.cypher"))
            .param("uid", uid)
            .param("title", title)
            .param("source_uri", opt(source_uri))
            .param("mime_type", opt(mime_type))
            .param("now", now())])
            .await
    }

    /// Deletes an item and its chunks; false if it did not exist.
    pub async fn delete_item(&self, uid: &str) -> Result<bool, GraphError> {
        if self.find_item(uid).await?.is_none() {
            return Ok(false);
        }
        self.write_txn(vec![
            query(include_str!("../../../cypher/ingest_delete_item_chunks.cypher")).param("item_uid", uid),
            query(include_str!("../../../cypher/delete_item.cypher")).param("uid", uid),
        ])
        .await?;
        Ok(true)
    }

    pub async fn workspace_libraries(&self, workspace_id: &str) -> Result<Vec<WorkspaceLibrary>, GraphError> {
        let rows = self
            .rows(query(include_str!("../../../cypher/workspace_libraries.cypher")).param("workspace_id", workspace_id))
            .await?;
        rows.iter()
            .map(|r| {
                Ok(WorkspaceLibrary {
                    uid: r.get("uid")?,
                    name: r.get::<Option<String>>("name")?.unwrap_or_default(),
                    collection_count: r.get("collection_count")?,
                    item_count: r.get("item_count")?,
                    chunk_count: r.get("chunk_count")?,
                })
            })
            .collect()
    }

    /// Deletes libraries and everything under them. Chunks and items go in
    /// batches (one transaction over a large library exhausts the graph
    /// server), the Library node last: an interrupted delete leaves the library
    /// in place, and running it again finishes it.
    pub async fn delete_libraries(&self, libs: &[String]) -> Result<(), GraphError> {
        if libs.is_empty() {
            return Ok(());
        }
        const BATCH: i64 = 5_000;
        let l: BoltType = libs.to_vec().into();
        for file in [
            include_str!("../../../cypher/delete_libraries_chunks.cypher"),
            include_str!("../../../cypher/delete_libraries_items.cypher"),
        ] {
            loop {
                let rows = self
                    .rows(query(file).param("libs", l.clone()).param("batch", BATCH))
                    .await?;
                let n: i64 = rows.first().map(|r| r.get("n")).transpose()?.unwrap_or(0);
                if n < BATCH {
                    break;
                }
            }
        }
        self.write_txn(vec![
            query(include_str!("../../../cypher/delete_libraries_collections.cypher")).param("libs", l.clone()),
            query(include_str!("../../../cypher/delete_libraries.cypher")).param("libs", l),
        ])
        .await
    }
}
