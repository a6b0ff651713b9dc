//! Library ingest and workspace lifecycle (DESIGN §6), for Daedalus's service
//! account. Creating or deleting a workspace Library is announced on the auth
//! channel, so teams see it on their next request.

use axum::{
    extract::{Path, State},
    http::StatusCode,
    response::{IntoResponse, Response},
    routing::{delete, get, post},
    Json, Router,
};
use serde::Deserialize;
use serde_json::json;
use sha2::{Digest, Sha256};
use text_splitter::{ChunkConfig, MarkdownSplitter};

use crate::auth::basic::ServiceAccount;
use crate::error::{ApiError, ApiJson};
use crate::state::AppState;
use crate::store::graph::ingest::AdminGraph;
use crate::store::graph::ingest::{derived_uid, ItemOutcome, ItemWrite};

pub fn routes() -> Router<AppState> {
    Router::new()
        .route("/library/api/ingest", post(ingest))
        .route("/library/api/ingest/", post(ingest))
        .route("/library/api/items/{uid}", delete(delete_item))
        .route("/library/api/items/{uid}/", delete(delete_item))
        .route("/library/api/workspaces/{ws}", get(workspace).delete(delete_workspace))
        .route("/library/api/workspaces/{ws}/", get(workspace).delete(delete_workspace))
        .route("/library/api/libraries", post(create_library))
        .route("/library/api/libraries/", post(create_library))
}

/// Uids we accept from callers: letters, digits, `_ - . :`, 1–64 chars.
pub fn valid_uid(s: &str) -> bool {
    !s.is_empty() && s.len() <= 64 && s.bytes().all(|b| b.is_ascii_alphanumeric() || b"_-.:".contains(&b))
}

#[doc(hidden)] // pub for fuzz/fuzz_targets/ingest_body.rs
pub fn check_len(field: &str, v: &str, min: usize, max: usize) -> Result<(), ApiError> {
    let n = v.chars().count();
    if n < min || n > max || (min > 0 && v.trim().is_empty()) {
        return Err(ApiError::bad_field(
            field,
            format!("{field} must be {min} to {max} characters"),
        ));
    }
    Ok(())
}

#[doc(hidden)] // pub for fuzz/fuzz_targets/ingest_body.rs
pub fn check_uid(field: &str, v: &str) -> Result<(), ApiError> {
    if !valid_uid(v) {
        return Err(ApiError::bad_field(
            field,
            format!("{field} must be 1-64 characters of letters, digits, _ - . :"),
        ));
    }
    Ok(())
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub struct ItemIn {
    pub uid: Option<String>,
    pub title: String,
    pub source_uri: Option<String>,
    pub mime_type: Option<String>,
}

/// `POST /library/api/ingest/` body (DESIGN §6).
#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub struct IngestBody {
    pub workspace_id: Option<String>,
    pub library_uid: Option<String>,
    pub collection: Option<String>,
    pub item: ItemIn,
    pub content: String,
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

async fn ingest(
    State(state): State<AppState>,
    sa: ServiceAccount,
    ApiJson(body): ApiJson<IngestBody>,
) -> Result<Response, ApiError> {
    let started = std::time::Instant::now();
    let out = ingest_document(&state.graph.admin(), state.settings.chunk_max_chars, body).await?;
    state.metrics.ingest_duration.observe(started.elapsed().as_secs_f64());
    if out.status != "unchanged" {
        state.metrics.ingest_chunks.inc_by(out.chunk_count.max(0) as u64);
    }
    if let Some(ws) = &out.created_workspace {
        state.changes.announce_workspace(ws).await;
    }
    tracing::info!(actor = %sa.username, item = %out.item_uid, library = %out.library_uid,
                   chunks = out.chunk_count, status = out.status, "ingested");
    let status = if out.status == "created" {
        StatusCode::CREATED
    } else {
        StatusCode::OK
    };
    Ok((
        status,
        Json(
            json!({"library_uid": out.library_uid, "collection_uid": out.collection_uid, "item_uid": out.item_uid,
                    "chunk_count": out.chunk_count, "status": out.status}),
        ),
    )
        .into_response())
}

/// What one ingest did.
#[derive(Debug, Clone)]
pub struct Ingested {
    pub library_uid: String,
    pub collection_uid: String,
    pub item_uid: String,
    pub chunk_count: i64,
    /// `created`, `replaced` or `unchanged`.
    pub status: &'static str,
    /// The workspace whose Library this call created (to announce).
    pub created_workspace: Option<String>,
}

/// The ingest itself (HTTP handler and demo loader): validate, find-or-create
/// the library and collection, then upsert the item with its chunks in one
/// graph transaction.
pub async fn ingest_document(
    graph: &AdminGraph,
    chunk_max_chars: usize,
    body: IngestBody,
) -> Result<Ingested, ApiError> {
    // Validate everything before touching a store.
    match (&body.workspace_id, &body.library_uid) {
        (Some(_), Some(_)) => {
            return Err(ApiError::bad_field(
                "library_uid",
                "give workspace_id or library_uid, not both",
            ))
        }
        (None, None) => {
            return Err(ApiError::bad_field(
                "workspace_id",
                "workspace_id or library_uid is required",
            ))
        }
        (Some(ws), None) => check_len("workspace_id", ws, 1, 64)?,
        (None, Some(l)) => check_uid("library_uid", l)?,
    }
    let collection = body.collection.clone().unwrap_or_else(|| "Files".to_owned());
    check_len("collection", &collection, 1, 200)?;
    check_len("item.title", &body.item.title, 1, 500)?;
    if let Some(u) = &body.item.uid {
        check_uid("item.uid", u)?;
    }
    if let Some(s) = &body.item.source_uri {
        check_len("item.source_uri", s, 0, 2000)?;
    }
    if let Some(m) = &body.item.mime_type {
        check_len("item.mime_type", m, 0, 200)?;
    }
    let sha = hex::encode(Sha256::digest(body.content.as_bytes()));
    let mut created_workspace = None;
    let mut chunks: Option<Vec<String>> = None;
    // A workspace delete may remove the library between resolving it and
    // writing the item (the write then finds no fence and writes nothing):
    // resolve again, which re-creates a workspace library, so the item lands
    // whole in it. A library given by uid is not re-created: 404.
    for round in 0..MAX_LIBRARY_ROUNDS {
        if round > 0 {
            // Give the racing delete time to finish.
            tokio::time::sleep(std::time::Duration::from_millis(100 << round.min(3))).await;
        }
        let library_uid = match (&body.workspace_id, &body.library_uid) {
            (Some(ws), _) => {
                let (uid, created) = graph.ensure_workspace_library(ws).await?.ok_or_else(|| {
                    ApiError::Conflict(format!("the library of workspace {ws} is taken by another library"))
                })?;
                if created {
                    created_workspace = Some(ws.clone());
                }
                uid
            }
            (_, Some(l)) => {
                if !graph.ensure_library_fenced(l).await? {
                    return Err(ApiError::NotFound(format!("library not found: {l}")));
                }
                l.clone()
            }
            _ => unreachable!("validated above"),
        };
        let Some(collection_uid) = graph.collection_in(&library_uid, &collection).await? else {
            graph.forget_library(&library_uid).await;
            continue;
        };
        let identity = body
            .item
            .source_uri
            .as_deref()
            .filter(|s| !s.is_empty())
            .unwrap_or(&body.item.title);
        let item_uid = body
            .item
            .uid
            .clone()
            .unwrap_or_else(|| derived_uid("item", &[&library_uid, &collection_uid, identity]));
        let unchanged = |chunk_count| Ingested {
            library_uid: library_uid.clone(),
            collection_uid: collection_uid.clone(),
            item_uid: item_uid.clone(),
            chunk_count,
            status: "unchanged",
            created_workspace: created_workspace.clone(),
        };
        if chunks.is_none() {
            let content = body.content.clone();
            chunks = Some(
                tokio::task::spawn_blocking(move || split(&content, chunk_max_chars))
                    .await
                    .map_err(|e| ApiError::Internal(format!("splitter: {e}")))?,
            );
        }
        let chunks = chunks.as_deref().unwrap_or_default();
        // One transaction: it reads the item first, and an unchanged
        // re-ingest (same content and metadata) stops there, writing nothing.
        let write = ItemWrite {
            uid: &item_uid,
            library_uid: &library_uid,
            workspace_id: body.workspace_id.as_deref(),
            collection_uid: &collection_uid,
            title: &body.item.title,
            source_uri: body.item.source_uri.as_deref(),
            mime_type: body.item.mime_type.as_deref(),
            content_sha256: &sha,
            chunks,
        };
        return match graph.write_item(&write).await? {
            ItemOutcome::Written { replaced } => Ok(Ingested {
                library_uid: library_uid.clone(),
                collection_uid: collection_uid.clone(),
                item_uid: item_uid.clone(),
                chunk_count: chunks.len() as i64,
                status: if replaced { "replaced" } else { "created" },
                created_workspace,
            }),
            ItemOutcome::Unchanged { chunk_count } => Ok(unchanged(chunk_count)),
            ItemOutcome::OtherLibrary => Err(other_library(&item_uid)),
            ItemOutcome::LibraryGone => {
                graph.forget_library(&library_uid).await;
                continue;
            }
        };
    }
    Err(ApiError::Conflict(
        "the library is being deleted (or was deleted while this ingest ran); nothing was written, retry the request"
            .into(),
    ))
}

/// Rounds of (resolve the library, write the item) when a delete keeps
/// removing the library in between.
const MAX_LIBRARY_ROUNDS: usize = 6;

fn other_library(item_uid: &str) -> ApiError {
    ApiError::Conflict(format!("item {item_uid} belongs to another library"))
}

async fn delete_item(
    State(state): State<AppState>,
    sa: ServiceAccount,
    Path(uid): Path<String>,
) -> Result<Response, ApiError> {
    check_uid("item_uid", &uid)?;
    if !state.graph.admin().delete_item(&uid).await? {
        return Err(ApiError::NotFound(format!("item not found: {uid}")));
    }
    tracing::info!(actor = %sa.username, item = %uid, "item deleted");
    Ok(StatusCode::NO_CONTENT.into_response())
}

async fn workspace(
    State(state): State<AppState>,
    _sa: ServiceAccount,
    Path(ws): Path<String>,
) -> Result<Response, ApiError> {
    check_len("workspace_id", &ws, 1, 64)?;
    let libs = state.graph.admin().workspace_libraries(&ws).await?;
    let Some(lib) = libs.first() else {
        return Err(ApiError::NotFound(format!("workspace has no library: {ws}")));
    };
    Ok(Json(json!({
        "workspace_id": ws,
        "library": lib,
        "library_uid": lib.uid,
        "collection_count": lib.collection_count,
        "item_count": lib.item_count,
        "chunk_count": lib.chunk_count,
    }))
    .into_response())
}

async fn delete_workspace(
    State(state): State<AppState>,
    sa: ServiceAccount,
    Path(ws): Path<String>,
) -> Result<Response, ApiError> {
    check_len("workspace_id", &ws, 1, 64)?;
    // Uids only: counting a large workspace's chunks first could outlast the timeout.
    let libs: Vec<String> = state
        .graph
        .libraries_for_workspaces(std::slice::from_ref(&ws))
        .await?
        .remove(&ws)
        .unwrap_or_default();
    state.graph.admin().delete_libraries(&libs).await?;
    if !libs.is_empty() {
        state.changes.announce_workspace(&ws).await;
    }
    tracing::info!(actor = %sa.username, workspace = %ws, libraries = libs.len(), "workspace deleted");
    Ok(StatusCode::NO_CONTENT.into_response())
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct LibraryBody {
    uid: Option<String>,
    name: String,
    description: Option<String>,
}

async fn create_library(
    State(state): State<AppState>,
    sa: ServiceAccount,
    ApiJson(body): ApiJson<LibraryBody>,
) -> Result<Response, ApiError> {
    check_len("name", &body.name, 1, 200)?;
    let description = body.description.unwrap_or_default();
    check_len("description", &description, 0, 2000)?;
    let uid = match body.uid {
        Some(u) => {
            check_uid("uid", &u)?;
            u
        }
        None => format!("lib_{}", uuid::Uuid::new_v4().simple()),
    };
    if !state
        .graph
        .admin()
        .create_library(&uid, &body.name, &description)
        .await?
    {
        return Err(ApiError::Conflict(format!("library {uid} already exists")));
    }
    tracing::info!(actor = %sa.username, library = %uid, "library created");
    Ok((
        StatusCode::CREATED,
        Json(json!({"uid": uid, "name": body.name, "description": description})),
    )
        .into_response())
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
    fn uid_rules() {
        assert!(valid_uid("lib_a-1.x:y"));
        assert!(!valid_uid(""));
        assert!(!valid_uid("has space"));
        assert!(!valid_uid(&"x".repeat(65)));
    }
}
