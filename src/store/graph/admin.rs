//! Unscoped reads for the admin console (staff only): every library with its
//! counts. Spec §3.3: admin searches use "every Library UID the database
//! contains" as their resolved libraries — `every_library_scope` builds that.

use neo4rs::query;

use super::{GraphError, GraphStore};
use crate::auth::Scope;

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

impl GraphStore {
    /// Every library, uid order, with collection, item and chunk counts.
    pub async fn library_overview(&self) -> Result<Vec<LibraryOverview>, GraphError> {
        let q = query(include_str!("../../../cypher/admin_libraries.cypher"));
        let mut out = Vec::new();
        for row in self.rows("admin_libraries.cypher", q).await? {
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

    /// Spec §3.3: the resolved libraries of an admin-initiated search are every
    /// library uid the database contains.
    // switch to ScopedGraph / AdminGraph::every_library() once it is on main
    pub async fn every_library_scope(&self) -> Result<Scope, GraphError> {
        Ok(Scope::new(self.all_libraries().await?.into_iter().map(|l| l.uid)))
    }
}
