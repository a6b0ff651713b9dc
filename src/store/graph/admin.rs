//! The admin console's operator reads (staff only): libraries a page at a
//! time with their counts, and names without counts. (Its searches read
//! every library through a scope the auth layer makes, spec §3.3:
//! `auth::resolver::every_library`.)

use std::collections::HashMap;

use neo4rs::query;

use super::ingest::AdminGraph;
use super::GraphError;

/// A library's uid and name: what is read when nothing may be counted (a
/// picker, a filter's choices). Not a `LibraryDetail` with zero counts, so
/// no reader mistakes "not counted" for "empty".
#[derive(Clone, Debug, PartialEq)]
pub struct LibraryName {
    pub uid: String,
    pub name: String,
}

/// Most libraries one page of the console's library list shows.
pub const MAX_PAGE: usize = 200;

impl AdminGraph {
    /// One page of libraries in uid order, those after `after`, with their
    /// collection and item counts and the items' recorded chunk counts (no
    /// scan of the chunks); true when more follow. Only the page's libraries
    /// are counted.
    pub async fn library_page(&self, after: &str, limit: usize) -> Result<(Vec<LibraryDetail>, bool), GraphError> {
        let limit = limit.clamp(1, MAX_PAGE);
        let q = query(include_str!("../../../cypher/admin_libraries_page.cypher"))
            .param("after", after)
            .param("limit", limit as i64 + 1);
        let mut out = Vec::new();
        for row in self.0.rows("admin_libraries_page.cypher", q).await? {
            out.extend(LibraryDetail::from_row(&row)?);
        }
        let more = out.len() > limit;
        out.truncate(limit);
        Ok((out, more))
    }

    /// The names of these libraries (those that exist): what a picker shows,
    /// read without counting anything.
    pub async fn library_names(&self, uids: &[String]) -> Result<HashMap<String, String>, GraphError> {
        if uids.is_empty() {
            return Ok(HashMap::new());
        }
        let q = query(include_str!("../../../cypher/library_names.cypher")).param("uids", uids.to_vec());
        let mut out = HashMap::new();
        for row in self.0.rows("library_names.cypher", q).await? {
            out.insert(row.get("uid")?, row.get::<Option<String>>("name")?.unwrap_or_default());
        }
        Ok(out)
    }

    /// Every library's uid and name, uid order, without counts (a filter's
    /// choices, the admin search's scope).
    pub async fn library_list(&self) -> Result<Vec<LibraryName>, GraphError> {
        let q = query(include_str!("../../../cypher/library_list.cypher"));
        let mut out = Vec::new();
        for row in self.0.rows("library_list.cypher", q).await? {
            out.push(LibraryName {
                uid: row.get("uid")?,
                name: row.get::<Option<String>>("name")?.unwrap_or_default(),
            });
        }
        Ok(out)
    }

    /// How many libraries there are.
    pub async fn library_count(&self) -> Result<i64, GraphError> {
        let q = query(include_str!("../../../cypher/library_count.cypher"));
        let rows = self.0.rows("library_count.cypher", q).await?;
        Ok(rows.first().map(|r| r.get::<i64>("n")).transpose()?.unwrap_or(0))
    }
}

/// A library with its workspace and counts: the one projection of a Library
/// for the admin handle (the console's list and page, the CLI's list, a
/// rename or delete), read from every statement that returns these columns
/// (`from_row`). The wire shapes stay their own types, because they are
/// published: `knowledge::LibraryView` (the MCP `list_libraries` schema) and
/// `ingest::WorkspaceLibrary` (the workspace API's `library`, whose chunk
/// count is counted over the chunks, not recorded).
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

impl LibraryDetail {
    /// From a row with the columns `uid`, `name`, `description`,
    /// `workspace_id`, `deleting`, `collection_count`, `item_count` and
    /// `chunk_count` (the items' recorded counts).
    /// None for a library deleted while the rows were read (Neo4j then
    /// gives its properties as null).
    pub(super) fn from_row(row: &neo4rs::Row) -> Result<Option<Self>, GraphError> {
        let Some(uid) = row.get::<Option<String>>("uid")? else {
            return Ok(None);
        };
        Ok(Some(LibraryDetail {
            uid,
            name: row.get::<Option<String>>("name")?.unwrap_or_default(),
            description: row.get::<Option<String>>("description")?.unwrap_or_default(),
            workspace_id: row.get("workspace_id")?,
            deleting: row.get::<Option<String>>("deleting")?.is_some(),
            collection_count: row.get("collection_count")?,
            item_count: row.get("item_count")?,
            chunk_count: row.get::<Option<i64>>("chunk_count")?.unwrap_or(0),
        }))
    }
}

impl AdminGraph {
    /// Every library with its counts, uid order (operator listing).
    pub async fn all_libraries(&self) -> Result<Vec<LibraryDetail>, GraphError> {
        let rows = self
            .0
            .rows(
                "all_libraries.cypher",
                query(include_str!("../../../cypher/all_libraries.cypher")),
            )
            .await?;
        rows.iter()
            .filter_map(|r| LibraryDetail::from_row(r).transpose())
            .collect()
    }

    /// One library with its counts; None if it does not exist.
    pub async fn library_detail(&self, uid: &str) -> Result<Option<LibraryDetail>, GraphError> {
        let q = query(include_str!("../../../cypher/library_detail.cypher")).param("uid", uid);
        let rows = self.0.rows("library_detail.cypher", q).await?;
        Ok(rows.first().map(LibraryDetail::from_row).transpose()?.flatten())
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

impl AdminGraph {
    /// Forgets everything this replica cached about a library that was
    /// renamed or deleted (on any replica: see `forget_changed_libraries`),
    /// so it is read afresh — a library later created with the same uid too
    /// (its language, its collections, its ranking statistics). A cache of
    /// library names belongs here as well.
    pub async fn forget_changed(&self, uid: &str) {
        self.forget_library(uid).await;
        self.0.ranking.invalidate(uid).await;
        self.0.vectors.forget(uid);
    }
}

/// Applies `library:<uid>` announcements (a library renamed or deleted, on
/// any replica) to this replica's graph caches, for as long as the channel
/// lasts.
pub async fn forget_changed_libraries(admin: AdminGraph, mut rx: tokio::sync::broadcast::Receiver<String>) {
    use tokio::sync::broadcast::error::RecvError;
    loop {
        match rx.recv().await {
            Ok(p) => {
                if let Some(uid) = p.strip_prefix("library:") {
                    admin.forget_changed(uid).await;
                }
            }
            // Missed some: forget every library's cached facts (they are re-read).
            Err(RecvError::Lagged(_)) => {
                admin.0.known.invalidate_all();
                admin.0.ranking.invalidate_all();
                admin.0.vectors.forget_all();
            }
            Err(RecvError::Closed) => return,
        }
    }
}
