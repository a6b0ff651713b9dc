//! Writes (ingest, workspace lifecycle) and operator reads that are not scoped
//! by a bearer: only the Basic-authenticated APIs and the CLI call these.

use neo4rs::query;

use super::{GraphError, GraphStore};

#[derive(Clone, Debug)]
pub struct LibraryRow {
    pub uid: String,
    pub name: String,
    pub workspace_id: Option<String>,
    pub item_count: i64,
}

impl GraphStore {
    /// Every library (operator listing).
    pub async fn all_libraries(&self) -> Result<Vec<LibraryRow>, GraphError> {
        let rows = self.rows(query(include_str!("../../../cypher/all_libraries.cypher"))).await?;
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
}
