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

use super::teams::fenced;
use crate::auth::basic::ServiceAccount;
use crate::error::{ApiError, ApiJson};
use crate::ids::{LibraryUid, Uid, WorkspaceId};
use crate::service::audit;
use crate::service::ingest::{self, Document, DocumentIn, IngestError, Status};
use crate::service::libraries::{self, Authority, LibraryError, NewLibrary};
use crate::service::BadField;
use crate::state::AppState;

/// Every route of the library API but ingest (see [`ingest_routes`]).
pub fn routes() -> Router<AppState> {
    Router::new()
        .route("/library/api/items/{uid}", delete(delete_item))
        .route("/library/api/workspaces/{ws}", get(workspace).delete(delete_workspace))
        .route("/library/api/libraries", post(create_library))
        .route(
            "/library/api/libraries/{uid}",
            get(library_detail).patch(rename_library).delete(delete_library),
        )
}

/// `POST /library/api/ingest`, a router of its own so the application can
/// give it its own whole-request deadline: one cut off answers the
/// retry-safe 503 (`ApiError::IngestUnavailable`).
pub fn ingest_routes() -> Router<AppState> {
    Router::new().route("/library/api/ingest", post(ingest))
}

fn bad(e: impl Into<BadField>) -> ApiError {
    e.into().into()
}

impl From<IngestError> for ApiError {
    fn from(e: IngestError) -> Self {
        match e {
            IngestError::BadField(f) => bad(f),
            IngestError::LibraryNotFound(_) => ApiError::NotFound(e.to_string()),
            IngestError::WorkspaceTaken(_) | IngestError::OtherLibrary(_) | IngestError::LibraryDeleting => {
                ApiError::Conflict(e.to_string())
            }
            IngestError::Graph(g) => g.into(),
            IngestError::Internal(m) => ApiError::Internal(m),
        }
    }
}

#[derive(Deserialize, Default, Clone)]
#[serde(deny_unknown_fields)]
pub struct ItemIn {
    pub uid: Option<String>,
    pub title: String,
    pub source_uri: Option<String>,
    pub mime_type: Option<String>,
}

/// `POST /library/api/ingest/` body (DESIGN §6).
#[derive(Deserialize, Default, Clone)]
#[serde(deny_unknown_fields)]
pub struct IngestBody {
    pub workspace_id: Option<String>,
    pub library_uid: Option<String>,
    pub collection: Option<String>,
    pub item: ItemIn,
    pub content: String,
}

impl From<IngestBody> for DocumentIn {
    fn from(b: IngestBody) -> Self {
        DocumentIn {
            workspace_id: b.workspace_id,
            library_uid: b.library_uid,
            collection: b.collection,
            item_uid: b.item.uid,
            title: b.item.title,
            source_uri: b.item.source_uri,
            mime_type: b.item.mime_type,
            content: b.content,
        }
    }
}

async fn ingest(
    State(state): State<AppState>,
    sa: ServiceAccount,
    ApiJson(body): ApiJson<IngestBody>,
) -> Result<Response, ApiError> {
    let started = std::time::Instant::now();
    let doc = Document::parse(body.into()).map_err(bad)?;
    let out = match ingest::ingest(&state.admin, &state.changes, state.settings.chunk_max_chars, doc).await {
        Ok(out) => out,
        Err(IngestError::Graph(crate::store::graph::GraphError::Unavailable(cause))) => {
            tracing::warn!(store = "graph", ?cause, "ingest: graph unavailable (retry-safe 503)");
            return Err(ApiError::IngestUnavailable);
        }
        Err(e) => return Err(e.into()),
    };
    state.metrics.ingest_duration.observe(started.elapsed().as_secs_f64());
    if out.status != Status::Unchanged {
        state.metrics.ingest_chunks.inc_by(out.chunk_count.max(0) as u64);
    }
    tracing::info!(actor = ?sa.username, item = ?out.item_uid, library = ?out.library_uid,
                   chunks = out.chunk_count, status = out.status.as_str(), "ingested");
    audit::ingested(&state.pg, &sa.username, &out).await;
    let status = if out.status == Status::Created {
        StatusCode::CREATED
    } else {
        StatusCode::OK
    };
    Ok((
        status,
        Json(
            json!({"library_uid": out.library_uid, "collection_uid": out.collection_uid, "item_uid": out.item_uid,
                    "chunk_count": out.chunk_count, "status": out.status.as_str()}),
        ),
    )
        .into_response())
}

async fn delete_item(
    State(state): State<AppState>,
    sa: ServiceAccount,
    Path(uid): Path<String>,
) -> Result<Response, ApiError> {
    let uid = Uid::parse("item_uid", uid).map_err(bad)?;
    if !state.admin.delete_item(&uid).await? {
        return Err(ApiError::NotFound(format!("item not found: {uid}")));
    }
    tracing::info!(actor = ?sa.username, item = ?uid.as_str(), "item deleted");
    audit::after_commit(&state.pg, &sa.username, "item_deleted", uid.as_str(), json!({})).await;
    Ok(StatusCode::NO_CONTENT.into_response())
}

async fn workspace(
    State(state): State<AppState>,
    _sa: ServiceAccount,
    Path(ws): Path<String>,
) -> Result<Response, ApiError> {
    let ws = WorkspaceId::parse("workspace_id", ws).map_err(bad)?;
    let libs = state.admin.workspace_libraries(&ws).await?;
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
    let ws = WorkspaceId::parse("workspace_id", ws).map_err(bad)?;
    let out = libraries::delete_workspace(&state.admin, &state.pg, &state.changes, &sa.username, &ws)
        .await
        .map_err(|e| match e {
            libraries::DeleteError::Graph(g) => ApiError::from(g),
            // Logged by the service; the DELETE is safe to retry.
            libraries::DeleteError::Grants(_) => ApiError::StoreUnavailable("postgres"),
        })?;
    tracing::info!(actor = ?sa.username, workspace = ?ws.as_str(), libraries = out.deleted.len(),
                   memberships_removed = out.memberships_removed, tokens_changed = out.tokens_changed,
                   "workspace deleted");
    Ok(fenced(out.propagation, StatusCode::NO_CONTENT, None))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct LibraryBody {
    uid: Option<String>,
    name: String,
    description: Option<String>,
    /// ISO 639-1 code of the language its text is analyzed in (default `en`).
    language: Option<String>,
}

async fn create_library(
    State(state): State<AppState>,
    sa: ServiceAccount,
    ApiJson(body): ApiJson<LibraryBody>,
) -> Result<Response, ApiError> {
    let new = NewLibrary {
        uid: body.uid,
        name: body.name,
        description: body.description,
        language: body.language,
    };
    let out = libraries::create(&state.admin, &state.pg, &sa.username, new).await?;
    Ok((
        StatusCode::CREATED,
        Json(
            json!({"uid": out.uid, "name": out.name, "description": out.description, "language": out.language.code()}),
        ),
    )
        .into_response())
}

impl From<LibraryError> for ApiError {
    fn from(e: LibraryError) -> Self {
        match e {
            LibraryError::BadField(f) => bad(f),
            LibraryError::NotFound(_) => ApiError::NotFound(e.to_string()),
            LibraryError::NotOwner(_) => ApiError::Forbidden(e.to_string()),
            LibraryError::Workspace { .. } | LibraryError::Deleting(_) | LibraryError::Exists(_) => {
                ApiError::Conflict(e.to_string())
            }
            LibraryError::Graph(g) => g.into(),
            LibraryError::Postgres(p) => p.into(),
            // Logged by the service; the DELETE is safe to retry.
            LibraryError::Grants(_) => ApiError::StoreUnavailable("postgres"),
        }
    }
}

/// `GET /library/api/libraries/{uid}/`: the library and its counts.
async fn library_detail(
    State(state): State<AppState>,
    _sa: ServiceAccount,
    Path(uid): Path<String>,
) -> Result<Response, ApiError> {
    let uid = LibraryUid::parse("uid", uid).map_err(bad)?;
    let Some(l) = state.admin.library_detail(uid.as_str()).await? else {
        return Err(ApiError::NotFound(format!("library not found: {uid}")));
    };
    Ok(Json(json!({
        "uid": l.uid, "name": l.name, "description": l.description, "workspace_id": l.workspace_id,
        "collection_count": l.collection_count, "item_count": l.item_count, "chunk_count": l.chunk_count,
    }))
    .into_response())
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RenameBody {
    name: String,
    description: Option<String>,
}

/// `PATCH /library/api/libraries/{uid}/` `{name, description?}`: renames a
/// user-managed library (409 for a workspace's).
async fn rename_library(
    State(state): State<AppState>,
    sa: ServiceAccount,
    Path(uid): Path<String>,
    ApiJson(body): ApiJson<RenameBody>,
) -> Result<Response, ApiError> {
    let out = libraries::rename(
        &state.admin,
        &state.pg,
        &sa.username,
        Authority::Operator,
        &uid,
        &body.name,
        body.description.as_deref(),
    )
    .await?;
    tracing::info!(actor = ?sa.username, library = ?out.uid, "library renamed");
    Ok(Json(json!({"uid": out.uid, "name": out.name, "description": out.description})).into_response())
}

/// `DELETE /library/api/libraries/{uid}/`: a user-managed library, its
/// content and every grant on it (409 for a workspace's); 204, or 202 when
/// not every replica confirmed in time.
async fn delete_library(
    State(state): State<AppState>,
    sa: ServiceAccount,
    Path(uid): Path<String>,
) -> Result<Response, ApiError> {
    let out = libraries::delete(
        &state.admin,
        &state.pg,
        &state.changes,
        &sa.username,
        Authority::Operator,
        &uid,
    )
    .await?;
    tracing::info!(actor = ?sa.username, library = ?out.uid, memberships_removed = out.memberships_removed,
                   tokens_changed = out.tokens_changed, "library deleted");
    Ok(fenced(out.propagation, StatusCode::NO_CONTENT, None))
}
