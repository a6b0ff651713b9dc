//! Ingest (DESIGN §6): validate a document, find or create its Library and
//! Collection, split it into chunks and upsert the item with its chunks in one
//! graph transaction; a newly created workspace Library is announced to every
//! replica. Used by the library REST, the demo and the admin console.

use sha2::{Digest, Sha256};
use text_splitter::{ChunkConfig, MarkdownSplitter};

use super::{bad, check_text, BadField};
use crate::auth::changes::AuthChanges;
use crate::ids::{LibraryUid, Uid, WorkspaceId};
use crate::store::graph::ingest::{derived_uid, AdminGraph, ItemOutcome, ItemWrite};
use crate::store::graph::GraphError;

/// Where a document goes.
#[derive(Debug, Clone)]
pub enum Target {
    /// The workspace's Library, created on first use.
    Workspace(WorkspaceId),
    /// An existing Library.
    Library(LibraryUid),
}

/// A document as callers describe it (unvalidated: `Document::parse` checks it).
#[derive(Debug, Clone, Default)]
pub struct DocumentIn {
    pub workspace_id: Option<String>,
    pub library_uid: Option<String>,
    pub collection: Option<String>,
    pub item_uid: Option<String>,
    pub title: String,
    pub source_uri: Option<String>,
    pub mime_type: Option<String>,
    pub content: String,
}

/// A validated document.
#[derive(Debug, Clone)]
pub struct Document {
    pub target: Target,
    pub collection: String,
    pub item_uid: Option<Uid>,
    pub title: String,
    pub source_uri: Option<String>,
    pub mime_type: Option<String>,
    pub content: String,
}

impl Document {
    /// Checks every field, in the order a caller reads them, before any store
    /// is touched.
    pub fn parse(d: DocumentIn) -> Result<Document, BadField> {
        let target = match (d.workspace_id, d.library_uid) {
            (Some(_), Some(_)) => return Err(bad("library_uid", "give workspace_id or library_uid, not both")),
            (None, None) => return Err(bad("workspace_id", "workspace_id or library_uid is required")),
            (Some(ws), None) => Target::Workspace(WorkspaceId::parse("workspace_id", ws)?),
            (None, Some(l)) => Target::Library(LibraryUid::parse("library_uid", l)?),
        };
        let collection = d.collection.unwrap_or_else(|| "Files".to_owned());
        check_text("collection", &collection, 1, 200)?;
        check_text("item.title", &d.title, 1, 500)?;
        let item_uid = d.item_uid.map(|u| Uid::parse("item.uid", u)).transpose()?;
        if let Some(s) = &d.source_uri {
            check_text("item.source_uri", s, 0, 2000)?;
        }
        if let Some(m) = &d.mime_type {
            check_text("item.mime_type", m, 0, 200)?;
        }
        Ok(Document {
            target,
            collection,
            item_uid,
            title: d.title,
            source_uri: d.source_uri,
            mime_type: d.mime_type,
            content: d.content,
        })
    }

    fn workspace_id(&self) -> Option<&str> {
        match &self.target {
            Target::Workspace(ws) => Some(ws.as_str()),
            Target::Library(_) => None,
        }
    }
}

/// Why an ingest did not happen (nothing was written).
#[derive(Debug, thiserror::Error)]
pub enum IngestError {
    #[error("{0}")]
    BadField(#[from] BadField),
    #[error("library not found: {0}")]
    LibraryNotFound(LibraryUid),
    /// Another Library already holds the workspace's derived uid.
    #[error("the library of workspace {0} is taken by another library")]
    WorkspaceTaken(WorkspaceId),
    #[error("item {0} belongs to another library")]
    OtherLibrary(String),
    /// A delete kept removing the Library while this ingest ran.
    #[error(
        "the library is being deleted (or was deleted while this ingest ran); nothing was written, retry the request"
    )]
    LibraryDeleting,
    #[error(transparent)]
    Graph(#[from] GraphError),
    #[error("splitter: {0}")]
    Internal(String),
}

/// What an ingest did to the item.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Status {
    Created,
    Replaced,
    /// Same content and metadata: nothing written, `updated_at` kept.
    Unchanged,
}

impl Status {
    pub fn as_str(self) -> &'static str {
        match self {
            Status::Created => "created",
            Status::Replaced => "replaced",
            Status::Unchanged => "unchanged",
        }
    }
}

/// What one ingest did.
#[derive(Debug, Clone)]
pub struct Ingested {
    pub library_uid: String,
    pub collection_uid: String,
    pub item_uid: String,
    pub chunk_count: i64,
    pub status: Status,
    /// The workspace whose Library this call created (already announced).
    pub created_workspace: Option<String>,
}

/// Markdown-aware chunks of at most `max_chars` characters.
pub fn split(content: &str, max_chars: usize) -> Vec<String> {
    let max = max_chars.max(64);
    let splitter = MarkdownSplitter::new(ChunkConfig::new(max / 2..max));
    splitter
        .chunks(content)
        .map(str::to_owned)
        .filter(|c| !c.trim().is_empty())
        .collect()
}

/// Rounds of (resolve the library, write the item) when a delete keeps
/// removing the library in between.
const MAX_LIBRARY_ROUNDS: usize = 6;

/// Ingests one document; a workspace Library it creates is announced through
/// `changes` before this returns.
pub async fn ingest(
    graph: &AdminGraph,
    changes: &AuthChanges,
    chunk_max_chars: usize,
    doc: Document,
) -> Result<Ingested, IngestError> {
    let out = write(graph, chunk_max_chars, &doc).await?;
    if let Some(ws) = &out.created_workspace {
        changes.announce_workspace(ws).await;
    }
    Ok(out)
}

async fn write(graph: &AdminGraph, chunk_max_chars: usize, doc: &Document) -> Result<Ingested, IngestError> {
    let sha = hex::encode(Sha256::digest(doc.content.as_bytes()));
    let mut created_workspace = None;
    let mut chunks: Option<Vec<String>> = None;
    // A workspace delete may remove the library between resolving it and
    // writing the item (the write then finds no fence and writes nothing):
    // resolve again, which re-creates a workspace library, so the item lands
    // whole in it. A library given by uid is not re-created: not found.
    for round in 0..MAX_LIBRARY_ROUNDS {
        if round > 0 {
            // Give the racing delete time to finish.
            tokio::time::sleep(std::time::Duration::from_millis(100 << round.min(3))).await;
        }
        let library_uid = match &doc.target {
            Target::Workspace(ws) => {
                let (uid, created) = graph
                    .ensure_workspace_library(ws)
                    .await?
                    .ok_or_else(|| IngestError::WorkspaceTaken(ws.clone()))?;
                if created {
                    created_workspace = Some(ws.to_string());
                }
                uid
            }
            Target::Library(l) => {
                if !graph.ensure_library_fenced(l).await? {
                    return Err(IngestError::LibraryNotFound(l.clone()));
                }
                l.to_string()
            }
        };
        let Some(collection_uid) = graph.collection_in(&library_uid, &doc.collection).await? else {
            graph.forget_library(&library_uid).await;
            continue;
        };
        let identity = doc
            .source_uri
            .as_deref()
            .filter(|s| !s.is_empty())
            .unwrap_or(&doc.title);
        let item_uid = match &doc.item_uid {
            Some(u) => u.to_string(),
            None => derived_uid("item", &[&library_uid, &collection_uid, identity]),
        };
        if chunks.is_none() {
            let content = doc.content.clone();
            chunks = Some(
                tokio::task::spawn_blocking(move || split(&content, chunk_max_chars))
                    .await
                    .map_err(|e| IngestError::Internal(e.to_string()))?,
            );
        }
        let chunks = chunks.as_deref().unwrap_or_default();
        // One transaction: it reads the item first, and an unchanged
        // re-ingest (same content and metadata) stops there, writing nothing.
        let w = ItemWrite {
            uid: &item_uid,
            library_uid: &library_uid,
            workspace_id: doc.workspace_id(),
            collection_uid: &collection_uid,
            title: &doc.title,
            source_uri: doc.source_uri.as_deref(),
            mime_type: doc.mime_type.as_deref(),
            content_sha256: &sha,
            chunks,
        };
        let (status, chunk_count) = match graph.write_item(&w).await? {
            ItemOutcome::Written { replaced } => (
                if replaced { Status::Replaced } else { Status::Created },
                chunks.len() as i64,
            ),
            ItemOutcome::Unchanged { chunk_count } => (Status::Unchanged, chunk_count),
            ItemOutcome::OtherLibrary => return Err(IngestError::OtherLibrary(item_uid)),
            ItemOutcome::LibraryGone => {
                graph.forget_library(&library_uid).await;
                continue;
            }
        };
        return Ok(Ingested {
            library_uid,
            collection_uid,
            item_uid,
            chunk_count,
            status,
            created_workspace,
        });
    }
    Err(IngestError::LibraryDeleting)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn split_respects_max_and_keeps_text() {
        let doc = "# Title\n\n".to_owned() + &"Some sentence here. ".repeat(200);
        let chunks = split(&doc, 300);
        assert!(chunks.len() > 5);
        assert!(chunks.iter().all(|c| c.chars().count() <= 300));
        assert!(chunks[0].starts_with("# Title"));
    }

    #[test]
    fn fields_are_checked_in_order_and_named() {
        let ok = DocumentIn {
            workspace_id: Some("ws".into()),
            title: "T".into(),
            ..Default::default()
        };
        assert!(Document::parse(ok.clone()).is_ok());
        let both = DocumentIn {
            library_uid: Some("lib".into()),
            ..ok.clone()
        };
        assert_eq!(Document::parse(both).unwrap_err().field, "library_uid");
        let no_title = DocumentIn {
            title: " ".into(),
            item_uid: Some("bad uid".into()),
            ..ok.clone()
        };
        assert_eq!(Document::parse(no_title).unwrap_err().field, "item.title");
        let bad_uid = DocumentIn {
            item_uid: Some("bad uid".into()),
            ..ok
        };
        assert_eq!(Document::parse(bad_uid).unwrap_err().field, "item.uid");
    }
}
