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
