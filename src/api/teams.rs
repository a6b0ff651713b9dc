//! Team lifecycle REST (spec §7), for Daedalus's service account. Each write
//! waits (bounded) until this instance's auth caches have seen its NOTIFY, so
//! the next request anywhere sees the change.

use axum::{
    extract::{Path, State},
    http::StatusCode,
    response::{IntoResponse, Response},
    routing::{get, post, put},
    Json, Router,
};
use serde::Deserialize;
use serde_json::json;
use uuid::Uuid;

use crate::auth::basic::ServiceAccount;
use crate::error::{ApiError, ApiJson};
use crate::service::teams::{self, Registered, TeamError};
use crate::service::Propagation;
use crate::state::AppState;

pub fn routes() -> Router<AppState> {
    Router::new()
        .route("/mcp_server/api/teams", post(create))
        .route("/mcp_server/api/teams/{id}", get(detail).delete(delete))
        .route("/mcp_server/api/teams/{id}/workspaces", put(workspaces))
        .route(
            "/mcp_server/api/teams/{id}/libraries",
            get(libraries).put(set_libraries),
        )
        .route("/mcp_server/api/teams/{id}/rotate", post(rotate))
}

impl From<TeamError> for ApiError {
    fn from(e: TeamError) -> Self {
        match e {
            TeamError::BadField(f) => f.into(),
            TeamError::NotFound => ApiError::NotFound(e.to_string()),
            TeamError::Inactive => ApiError::Conflict(e.to_string()),
            TeamError::NoSigningKey | TeamError::Signing(_) => ApiError::Internal(e.to_string()),
            TeamError::Store(s) => s.into(),
        }
    }
}

fn team_id(raw: &str) -> Result<Uuid, ApiError> {
    Ok(teams::parse_id("id", raw)?)
}

/// The answer to a committed write. Its normal status (200/201/204) means
/// every live replica acknowledged it (the cross-replica fence). When that
/// could not be confirmed in time the write is still committed — and the
/// silent replicas have stopped trusting their caches — and the answer says
/// so: `202 Accepted` with the normal body's fields (a new JWT included: it is
/// shown only here) plus `"propagation": {"confirmed": false, …}` and a
/// `Mnemosyne-Propagation: unconfirmed` header. Never a 5xx, so no client
/// drops a one-time JWT as a failure.
pub(super) fn fenced(propagation: Propagation, status: StatusCode, body: Option<serde_json::Value>) -> Response {
    match propagation {
        Ok(()) => match body {
            Some(b) => (status, Json(b)).into_response(),
            None => status.into_response(),
        },
        Err(u) => {
            let mut b = body.unwrap_or_else(|| json!({}));
            b["propagation"] = json!({
                "confirmed": false,
                "replicas_unconfirmed": u.replicas,
                "status": status.as_u16(),
                "message": "The change is committed, but not every replica confirmed it in time; \
                            those replicas no longer use cached credentials.",
            });
            let mut r = (StatusCode::ACCEPTED, Json(b)).into_response();
            r.headers_mut().insert(
                http::HeaderName::from_static("mnemosyne-propagation"),
                http::HeaderValue::from_static("unconfirmed"),
            );
            r
        }
    }
}

#[derive(Deserialize)]
struct CreateBody {
    id: String,
    name: String,
}

async fn create(
    State(state): State<AppState>,
    sa: ServiceAccount,
    ApiJson(body): ApiJson<CreateBody>,
) -> Result<Response, ApiError> {
    let id = team_id(&body.id)?;
    match teams::register(&state.pg, &state.changes, &sa.username, id, &body.name).await? {
        Registered::New { team, jwt, propagation } => Ok(fenced(
            propagation,
            StatusCode::CREATED,
            Some(json!({"id": team.id, "name": team.name, "jwt": jwt})),
        )),
        Registered::Existing(t) => Ok((StatusCode::OK, Json(json!({"id": t.id, "name": t.name}))).into_response()),
    }
}

async fn detail(
    State(state): State<AppState>,
    _sa: ServiceAccount,
    Path(id): Path<String>,
) -> Result<Response, ApiError> {
    let (t, ws, libs) = teams::detail(&state.pg, team_id(&id)?).await?;
    Ok(Json(json!({
        "id": t.id, "name": t.name, "active": t.active,
        "active_jti": t.active_jti, "workspace_ids": ws, "library_uids": libs,
    }))
    .into_response())
}

async fn delete(
    State(state): State<AppState>,
    sa: ServiceAccount,
    Path(id): Path<String>,
) -> Result<Response, ApiError> {
    let propagation = teams::deactivate(&state.pg, &state.changes, &sa.username, team_id(&id)?).await?;
    Ok(fenced(propagation, StatusCode::NO_CONTENT, None))
}

#[derive(Deserialize)]
struct WorkspacesBody {
    workspace_ids: Vec<String>,
}

async fn workspaces(
    State(state): State<AppState>,
    sa: ServiceAccount,
    Path(id): Path<String>,
    ApiJson(body): ApiJson<WorkspacesBody>,
) -> Result<Response, ApiError> {
    let id = team_id(&id)?;
    let (stored, propagation) =
        teams::set_workspaces(&state.pg, &state.changes, &sa.username, id, body.workspace_ids).await?;
    Ok(fenced(
        propagation,
        StatusCode::OK,
        Some(json!({"workspace_ids": stored})),
    ))
}

#[derive(Deserialize)]
struct LibrariesBody {
    library_uids: Vec<String>,
}

/// GET `teams/{id}/libraries/`: the directly granted libraries beside the
/// workspaces, each in order (what the team's JWT resolves through).
async fn libraries(
    State(state): State<AppState>,
    _sa: ServiceAccount,
    Path(id): Path<String>,
) -> Result<Response, ApiError> {
    let (_, ws, libs) = teams::detail(&state.pg, team_id(&id)?).await?;
    Ok(Json(json!({"workspace_ids": ws, "library_uids": libs})).into_response())
}

/// PUT `teams/{id}/libraries/` (issue 53): replaces the directly granted
/// libraries, as the workspaces PUT replaces its set (idempotent, order
/// kept, duplicates dropped, unknown uids accepted).
async fn set_libraries(
    State(state): State<AppState>,
    sa: ServiceAccount,
    Path(id): Path<String>,
    ApiJson(body): ApiJson<LibrariesBody>,
) -> Result<Response, ApiError> {
    let id = team_id(&id)?;
    let (stored, propagation) =
        teams::set_libraries(&state.pg, &state.changes, &sa.username, id, body.library_uids).await?;
    Ok(fenced(
        propagation,
        StatusCode::OK,
        Some(json!({"library_uids": stored})),
    ))
}

async fn rotate(
    State(state): State<AppState>,
    sa: ServiceAccount,
    Path(id): Path<String>,
) -> Result<Response, ApiError> {
    let (jwt, propagation) = teams::rotate(&state.pg, &state.changes, &sa.username, team_id(&id)?).await?;
    Ok(fenced(propagation, StatusCode::OK, Some(json!({"jwt": jwt}))))
}
