//! Teams (spec §7, §9): list, detail, workspaces, rotate (the JWT shown once
//! with its `fastagent.secrets.yaml` snippet), deactivate — through the REST
//! API's own store functions, JWT minting and cross-replica fence.

use std::collections::HashMap;

use axum::{
    extract::{Path, Query, State},
    http::StatusCode,
    response::{IntoResponse, Response},
};
use maud::html;
use uuid::Uuid;

use super::session::{Session, Staff, StaffForm};
use super::view::{self, FieldError};
use super::{actor, propagation_notice, AdminError};
use crate::error::ApiError;
use crate::service::teams::{self as service, TeamError};
use crate::state::AppState;
use crate::store::pg::teams;

fn parse_id(raw: &str) -> Result<Uuid, AdminError> {
    service::parse_id("id", raw).map_err(|_| AdminError::NotFound)
}

/// The REST API's mapping, as a page.
fn refused(e: TeamError) -> AdminError {
    match e {
        TeamError::NotFound => AdminError::NotFound,
        TeamError::Inactive => {
            ApiError::Conflict("The team is deactivated; register it under a new id to get a new JWT.".into()).into()
        }
        other => ApiError::from(other).into(),
    }
}

/// GET /admin/teams.
pub async fn list(
    State(state): State<AppState>,
    Staff(s): Staff,
    Query(q): Query<HashMap<String, String>>,
) -> Result<Response, AdminError> {
    let list = teams::list(&state.pg).await?;
    let body = html! {
        p.muted { "Teams are registered by Daedalus (spec §7). Each team's JWT resolves to the libraries of its workspaces, then the libraries granted to it directly." }
        div.table { table {
            thead { tr { th { "Name" } th { "ID" } th { "Active" } th { "Workspaces" } th { "Libraries" } th { "Last rotation" } } }
            tbody {
                @for t in &list {
                    tr {
                        td { a href={ "/admin/teams/" (t.id) } { (t.name) } }
                        td { code { (t.id) } }
                        td { (view::badge(t.active, "active", "deactivated")) }
                        td { @for w in &t.workspace_ids { code { (w) } " " } }
                        td { @for l in &t.library_uids { code { (l) } " " } }
                        td { (view::when(t.last_rotated_at, "—")) }
                    }
                }
                @if list.is_empty() { tr { td colspan="6" .muted { "No teams yet." } } }
            }
        } }
    };
    Ok(view::page(
        &s,
        "/admin/teams",
        "Teams",
        view::notice_of(&q).as_deref(),
        body,
    ))
}

/// What a refused form submitted, shown again in its textarea.
#[derive(Clone, Copy)]
enum Submitted<'a> {
    None,
    Workspaces(&'a str),
    Libraries(&'a str),
}

async fn detail_page(
    state: &AppState,
    s: &Session,
    id: Uuid,
    submitted: Submitted<'_>,
    err: &FieldError,
    notice: Option<String>,
    status: StatusCode,
) -> Result<Response, AdminError> {
    let (t, ws, libs) = service::detail(&state.pg, id).await.map_err(refused)?;
    let none = FieldError::none();
    let (ws_err, lib_err) = match submitted {
        Submitted::Libraries(_) => (&none, err),
        _ => (err, &none),
    };
    let text = match submitted {
        Submitted::Workspaces(raw) => raw.to_owned(),
        _ => ws.join("\n"),
    };
    let libs_text = match submitted {
        Submitted::Libraries(raw) => raw.to_owned(),
        _ => libs.join("\n"),
    };
    let base = format!("/admin/teams/{id}");
    let tools = super::tools::team_section(state, s, id).await?;
    let body = html! {
        section.card {
            p { "ID " code { (t.id) } }
            p { (view::badge(t.active, "active", "deactivated")) " · created " (view::when(Some(t.created_at), ""))
                " · updated " (view::when(Some(t.updated_at), "")) }
            p { "Active jti (diagnostics, not a credential): " code { (t.active_jti.map(|j| j.to_string()).unwrap_or_default()) } }
        }
        h2 { "Workspaces" }
        form.card.stack method="post" action={ (base) "/workspaces" } {
            (view::csrf(s))
            (ws_err.general())
            label { "Workspace ids, one per line (replaces the whole set)"
                textarea name="workspace_ids" { (text) }
            }
            (view::field_error(ws_err, "workspace_ids"))
            button type="submit" { "Save workspaces" }
        }
        h2 { "Libraries" }
        p.muted { "Libraries granted to the team directly, after its workspaces' libraries, in this order. "
                  "A uid the graph does not hold (yet) resolves to nothing." }
        form.card.stack method="post" action={ (base) "/libraries" } {
            (view::csrf(s))
            (lib_err.general())
            label { "Library uids, one per line (replaces the whole list)"
                textarea name="library_uids" { (libs_text) }
            }
            (view::field_error(lib_err, "library_uids"))
            button type="submit" { "Save libraries" }
        }
        (tools)
        @if t.active {
            h2 { "Rotate" }
            p { "A new JWT replaces the current one, which is refused from the next request on. The new one is shown once." }
            (view::action(s, &format!("{base}/rotate"), &[], "Rotate the team JWT", ""))
            h2 { "Deactivate" }
            p { "The team's JWT is refused from the next request on (spec §7.2). To serve it again, register it under a new id." }
            (view::action(s, &format!("{base}/deactivate"), &[], "Deactivate the team", "danger"))
        }
    };
    Ok((
        status,
        view::page(s, "/admin/teams", &format!("Team {}", t.name), notice.as_deref(), body),
    )
        .into_response())
}

/// GET /admin/teams/{id}.
pub async fn detail(
    State(state): State<AppState>,
    Staff(s): Staff,
    Path(id): Path<String>,
    Query(q): Query<HashMap<String, String>>,
) -> Result<Response, AdminError> {
    let id = parse_id(&id)?;
    detail_page(
        &state,
        &s,
        id,
        Submitted::None,
        &FieldError::none(),
        view::notice_of(&q),
        StatusCode::OK,
    )
    .await
}

/// POST /admin/teams/{id}/workspaces: replace the set (spec §7.3).
pub async fn workspaces(
    State(state): State<AppState>,
    Path(id): Path<String>,
    StaffForm(s, form): StaffForm,
) -> Result<Response, AdminError> {
    replace_list(&state, &s, &id, &form, List::Workspaces).await
}

/// POST /admin/teams/{id}/libraries: replace the directly granted libraries
/// (issue 53), through the REST API's validation, audit and fence.
pub async fn libraries(
    State(state): State<AppState>,
    Path(id): Path<String>,
    StaffForm(s, form): StaffForm,
) -> Result<Response, AdminError> {
    replace_list(&state, &s, &id, &form, List::Libraries).await
}

/// Which of a team's lists a form replaces.
#[derive(Clone, Copy)]
enum List {
    Workspaces,
    Libraries,
}

/// Replaces one of the team's lists with the form's field (one entry a
/// line or comma-separated) through the REST API's service: a bad entry is
/// the form's one field again, with the REST API's message (it names the
/// offending line as `workspace_ids[i]` / `library_uids[i]`, from 0).
async fn replace_list(
    state: &AppState,
    s: &Session,
    id: &str,
    form: &super::FormData,
    list: List,
) -> Result<Response, AdminError> {
    let id = parse_id(id)?;
    let (field, anchor) = match list {
        List::Workspaces => ("workspace_ids", "team-workspaces"),
        List::Libraries => ("library_uids", "team-libraries"),
    };
    let raw = form.get(field);
    let entries: Vec<String> = raw
        .split(['\n', ','])
        .map(str::trim)
        .filter(|w| !w.is_empty())
        .map(str::to_owned)
        .collect();
    let (pg, changes, actor) = (&state.pg, &state.changes, actor(s.username()));
    let set = match list {
        List::Workspaces => service::set_workspaces(pg, changes, &actor, id, entries).await,
        List::Libraries => service::set_libraries(pg, changes, &actor, id, entries).await,
    };
    let unconfirmed = match set {
        Ok((_, p)) => propagation_notice(&p),
        Err(TeamError::BadField(b)) => {
            let err = FieldError::new(field, format!("{}: {}", b.field, b.message));
            let submitted = match list {
                List::Workspaces => Submitted::Workspaces(raw),
                List::Libraries => Submitted::Libraries(raw),
            };
            return detail_page(state, s, id, submitted, &err, None, StatusCode::BAD_REQUEST).await;
        }
        Err(e) => return Err(refused(e)),
    };
    Ok(super::see_other(&view::done(
        &format!("/admin/teams/{id}"),
        anchor,
        &unconfirmed,
    )))
}

/// POST /admin/teams/{id}/rotate: the new JWT is on this response only.
pub async fn rotate(
    State(state): State<AppState>,
    Path(id): Path<String>,
    StaffForm(s, _): StaffForm,
) -> Result<Response, AdminError> {
    let id = parse_id(&id)?;
    let (token, p) = service::rotate(&state.pg, &state.changes, &actor(s.username()), id)
        .await
        .map_err(refused)?;
    let unconfirmed = propagation_notice(&p);
    let url = format!("{}/mcp/", state.settings.public_url.trim_end_matches('/'));
    let yaml = format!(
        "mcp:\n  servers:\n    mnemosyne:\n      transport: http\n      url: {url}\n      headers:\n        \
         Authorization: Bearer {token}\n"
    );
    let body = html! {
        p { "The previous JWT is refused from the next request on." }
        (view::secret("The team JWT", &token))
        h2 { "fastagent.secrets.yaml" }
        p.muted { "On the Pallas deployment (spec §9.1, §9.4); in fastagent.config.yaml keep " code { "auth: {oauth: false}" } " for this server." }
        pre.copy { code { (yaml) } }
        p { a href={ "/admin/teams/" (id) } { "Done" } }
    };
    Ok(view::page(
        &s,
        "/admin/teams",
        "Team JWT rotated",
        unconfirmed.as_deref(),
        body,
    ))
}

/// POST /admin/teams/{id}/deactivate (spec §7.2's soft delete).
pub async fn deactivate(
    State(state): State<AppState>,
    Path(id): Path<String>,
    StaffForm(s, _): StaffForm,
) -> Result<Response, AdminError> {
    let id = parse_id(&id)?;
    let p = service::deactivate(&state.pg, &state.changes, &actor(s.username()), id)
        .await
        .map_err(refused)?;
    let unconfirmed = propagation_notice(&p);
    Ok(super::see_other(&view::done(
        &format!("/admin/teams/{id}"),
        "team-deactivated",
        &unconfirmed,
    )))
}
