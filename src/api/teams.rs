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
use chrono::Utc;
use serde::Deserialize;
use serde_json::json;
use uuid::Uuid;

use crate::auth::{basic::ServiceAccount, jwt};
use crate::error::{ApiError, ApiJson};
use crate::state::AppState;
use crate::store::pg::{keys, teams};

pub fn routes() -> Router<AppState> {
    Router::new()
        .route("/mcp_server/api/teams", post(create))
        .route("/mcp_server/api/teams/", post(create))
        .route("/mcp_server/api/teams/{id}", get(detail).delete(delete))
        .route("/mcp_server/api/teams/{id}/", get(detail).delete(delete))
        .route("/mcp_server/api/teams/{id}/workspaces", put(workspaces))
        .route("/mcp_server/api/teams/{id}/workspaces/", put(workspaces))
        .route("/mcp_server/api/teams/{id}/rotate", post(rotate))
        .route("/mcp_server/api/teams/{id}/rotate/", post(rotate))
}

fn parse_id(raw: &str, field: &str) -> Result<Uuid, ApiError> {
    Uuid::parse_str(raw).map_err(|_| ApiError::bad_field(field, format!("{field} must be a UUID")))
}

fn check_name(name: &str) -> Result<(), ApiError> {
    let n = name.chars().count();
    if n == 0 || name.trim().is_empty() || n > 200 {
        return Err(ApiError::bad_field("name", "name must be 1 to 200 characters"));
    }
    Ok(())
}

/// The answer to a committed write. Its normal status (200/201/204) means
/// every live replica acknowledged it (the cross-replica fence). When that
/// could not be confirmed in time the write is still committed — and the
/// silent replicas have stopped trusting their caches — and the answer says
/// so: `202 Accepted` with the normal body's fields (a new JWT included: it is
/// shown only here) plus `"propagation": {"confirmed": false, …}` and a
/// `Mnemosyne-Propagation: unconfirmed` header. Never a 5xx, so no client
/// drops a one-time JWT as a failure.
async fn fenced(state: &AppState, status: StatusCode, body: Option<serde_json::Value>) -> Response {
    match state.changes.fence().await {
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

/// Signs a team JWT with the newest active key.
async fn mint(state: &AppState, team: Uuid, jti: Uuid) -> Result<String, ApiError> {
    let key = keys::newest_active(&state.pg).await?.ok_or_else(|| {
        ApiError::Internal("no active signing key; run `mnemosyne migrate` or `signing-key create`".into())
    })?;
    let secret = hex::decode(&key.secret_hex).map_err(|_| ApiError::Internal("corrupt signing key".into()))?;
    jwt::mint_team_jwt(team, jti, &key.kid, &secret, Utc::now().timestamp())
        .map_err(|e| ApiError::Internal(format!("signing a team JWT: {e}")))
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
    let id = parse_id(&body.id, "id")?;
    check_name(&body.name)?;
    // Mint before inserting so a missing key never leaves a team without a JWT.
    let jti = Uuid::new_v4();
    let token = mint(&state, id, jti).await?;
    match teams::create(&state.pg, &sa.username, id, &body.name, jti).await? {
        teams::Created::New(t) => {
            tracing::info!(team = %id, actor = %sa.username, "team created");
            Ok(fenced(
                &state,
                StatusCode::CREATED,
                Some(json!({"id": t.id, "name": t.name, "jwt": token})),
            )
            .await)
        }
        teams::Created::Existing(t) => Ok((StatusCode::OK, Json(json!({"id": t.id, "name": t.name}))).into_response()),
    }
}

async fn detail(
    State(state): State<AppState>,
    _sa: ServiceAccount,
    Path(id): Path<String>,
) -> Result<Response, ApiError> {
    let id = parse_id(&id, "id")?;
    let (t, ws) = teams::get(&state.pg, id)
        .await?
        .ok_or_else(|| ApiError::NotFound("team not found".into()))?;
    Ok(Json(json!({
        "id": t.id, "name": t.name, "active": t.active,
        "active_jti": t.active_jti, "workspace_ids": ws,
    }))
    .into_response())
}

async fn delete(
    State(state): State<AppState>,
    sa: ServiceAccount,
    Path(id): Path<String>,
) -> Result<Response, ApiError> {
    let id = parse_id(&id, "id")?;
    if !teams::deactivate(&state.pg, &sa.username, id).await? {
        return Err(ApiError::NotFound("team not found".into()));
    }
    tracing::info!(team = %id, actor = %sa.username, "team deleted");
    Ok(fenced(&state, StatusCode::NO_CONTENT, None).await)
}

#[derive(Deserialize)]
struct WorkspacesBody {
    workspace_ids: Vec<String>,
}

/// Validates and de-duplicates (first occurrence kept) the workspace ids.
fn clean_workspace_ids(ids: Vec<String>) -> Result<Vec<String>, ApiError> {
    if ids.len() > 1000 {
        return Err(ApiError::bad_field("workspace_ids", "at most 1000 workspace ids"));
    }
    let mut seen = std::collections::HashSet::new();
    let mut out = Vec::with_capacity(ids.len());
    for (i, w) in ids.into_iter().enumerate() {
        if w.is_empty() || w.chars().count() > 64 {
            return Err(ApiError::bad_field(
                &format!("workspace_ids[{i}]"),
                "workspace ids are non-empty strings of at most 64 characters",
            ));
        }
        if seen.insert(w.clone()) {
            out.push(w);
        }
    }
    Ok(out)
}

async fn workspaces(
    State(state): State<AppState>,
    sa: ServiceAccount,
    Path(id): Path<String>,
    ApiJson(body): ApiJson<WorkspacesBody>,
) -> Result<Response, ApiError> {
    let id = parse_id(&id, "id")?;
    let ids = clean_workspace_ids(body.workspace_ids)?;
    let stored = teams::replace_workspaces(&state.pg, &sa.username, id, &ids)
        .await?
        .ok_or_else(|| ApiError::NotFound("team not found".into()))?;
    Ok(fenced(&state, StatusCode::OK, Some(json!({"workspace_ids": stored}))).await)
}

async fn rotate(
    State(state): State<AppState>,
    sa: ServiceAccount,
    Path(id): Path<String>,
) -> Result<Response, ApiError> {
    let id = parse_id(&id, "id")?;
    let jti = Uuid::new_v4();
    let token = mint(&state, id, jti).await?;
    match teams::rotate(&state.pg, &sa.username, id, jti).await? {
        teams::Rotated::Ok => {
            tracing::info!(team = %id, actor = %sa.username, "team rotated");
            Ok(fenced(&state, StatusCode::OK, Some(json!({"jwt": token}))).await)
        }
        teams::Rotated::NotFound => Err(ApiError::NotFound("team not found".into())),
        teams::Rotated::Inactive => Err(ApiError::Conflict(
            "team is inactive (deleted); register it under a new id to get a new JWT".into(),
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn workspace_ids_are_deduplicated_in_order() {
        let ids = clean_workspace_ids(vec!["b".into(), "a".into(), "b".into()]).unwrap();
        assert_eq!(ids, ["b", "a"]);
    }

    #[test]
    fn bad_workspace_id_is_named() {
        match clean_workspace_ids(vec!["ok".into(), String::new()]) {
            Err(ApiError::BadRequest { field, .. }) => assert_eq!(field.as_deref(), Some("workspace_ids[1]")),
            _ => panic!("expected 400"),
        }
    }
}
