//! The admin console's operator read (staff only): every library with its
//! counts. (Its searches use `AdminGraph::every_library`, spec §3.3.)

use neo4rs::query;

use super::ingest::AdminGraph;
use super::GraphError;

/// A library with its workspace and counts.
#[derive(Clone, Debug, PartialEq)]
pub struct LibraryOverview {
    pub uid: String,
    pub name: String,
    pub description: String,
    pub workspace_id: Option<String>,
    pub collection_count: i64,
    pub item_count: i64,
    pub chunk_count: i64,
}

impl AdminGraph {
    /// Every library, uid order, with collection, item and chunk counts.
    pub async fn library_overview(&self) -> Result<Vec<LibraryOverview>, GraphError> {
        let q = query(include_str!("../../../cypher/admin_libraries.cypher"));
        let mut out = Vec::new();
        for row in self.0.rows("admin_libraries.cypher", q).await? {
            out.push(LibraryOverview {
                uid: row.get("uid")?,
                name: row.get::<Option<String>>("name")?.unwrap_or_default(),
                description: row.get::<Option<String>>("description")?.unwrap_or_default(),
                workspace_id: row.get("workspace_id")?,
                collection_count: row.get("collection_count")?,
                item_count: row.get("item_count")?,
                chunk_count: row.get("chunk_count")?,
            });
        }
        Ok(out)
    }
}

/// One library as its owner sees it before renaming or deleting it.
#[derive(Clone, Debug, PartialEq)]
pub struct LibraryDetail {
    pub uid: String,
    pub name: String,
    pub description: String,
    pub workspace_id: Option<String>,
    /// A delete started and did not finish (running it again finishes it).
    pub deleting: bool,
    pub collection_count: i64,
    pub item_count: i64,
    /// From the items' recorded chunk counts (no scan of the chunks).
    pub chunk_count: i64,
}

impl AdminGraph {
    /// One library with its counts; None if it does not exist.
    pub async fn library_detail(&self, uid: &str) -> Result<Option<LibraryDetail>, GraphError> {
        let q = query(include_str!("../../../cypher/library_detail.cypher")).param("uid", uid);
        let rows = self.0.rows("library_detail.cypher", q).await?;
        let Some(row) = rows.first() else { return Ok(None) };
        Ok(Some(LibraryDetail {
            uid: row.get("uid")?,
            name: row.get::<Option<String>>("name")?.unwrap_or_default(),
            description: row.get::<Option<String>>("description")?.unwrap_or_default(),
            workspace_id: row.get("workspace_id")?,
            deleting: row.get::<Option<String>>("deleting")?.is_some(),
            collection_count: row.get("collection_count")?,
            item_count: row.get("item_count")?,
            chunk_count: row.get::<Option<i64>>("chunk_count")?.unwrap_or(0),
        }))
    }

    /// Sets a user-managed library's name and description; false when there
    /// is no such library, it is a workspace's, or it is being deleted.
    pub async fn rename_library(&self, uid: &str, name: &str, description: &str) -> Result<bool, GraphError> {
        let found = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let seen = found.clone();
        self.0
            .transaction::<()>(
                "rename library",
                false,
                vec![super::Step::check(
                    query(include_str!("../../../cypher/rename_library.cypher"))
                        .param("uid", uid)
                        .param("name", name)
                        .param("description", description),
                    move |rows| {
                        seen.store(!rows.is_empty(), std::sync::atomic::Ordering::Relaxed);
                        Ok(None)
                    },
                )],
            )
            .await?;
        Ok(found.load(std::sync::atomic::Ordering::Relaxed))
    }
}
