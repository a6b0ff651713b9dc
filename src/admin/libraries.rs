//! Libraries: every library with its workspace and counts, its memberships,
//! grant and revoke (spec §4.1 rules in `service::memberships`).

use std::collections::HashMap;

use axum::{
    extract::{Query, State},
    http::StatusCode,
    response::{IntoResponse, Response},
};
use maud::html;

use super::session::{PersonForm, Session, Staff, StaffForm};
use super::view::{self, urlencode, FieldError};
use super::{actor, fence, AdminError, FormData};
use crate::service::memberships::{self, Change, Granter};
use crate::state::AppState;
use crate::store::pg::users::{self, Role};

/// Libraries per page of the list (`?limit=` chooses up to
/// `admin::MAX_PAGE`).
const PAGE: usize = 50;

/// GET /admin/libraries?after=<uid>&limit=<n>: one page in uid order; only
/// that page's libraries are counted.
pub async fn list(
    State(state): State<AppState>,
    Staff(s): Staff,
    Query(q): Query<HashMap<String, String>>,
) -> Result<Response, AdminError> {
    let after = q.get("after").map(String::as_str).unwrap_or("");
    let limit = q
        .get("limit")
        .and_then(|l| l.parse::<usize>().ok())
        .unwrap_or(PAGE)
        .clamp(1, crate::store::graph::admin::MAX_PAGE);
    let (libs, more) = state.admin.library_page(after, limit).await?;
    let uids: Vec<String> = libs.iter().map(|l| l.uid.clone()).collect();
    let count = users::membership_counts(&state.pg, &uids).await?;
    let next = more
        .then(|| libs.last())
        .flatten()
        .map(|l| format!("/admin/libraries?after={}&limit={limit}", urlencode(&l.uid)));
    let body = html! {
        div.table { table {
            thead { tr { th { "Library" } th { "UID" } th { "Workspace" } th { "Collections" } th { "Items" } th { "Chunks" } th { "Members" } } }
            tbody {
                @for l in &libs {
                    tr {
                        td { a href={ "/admin/library?uid=" (urlencode(&l.uid)) } { @if l.name.is_empty() { "(unnamed)" } @else { (l.name) } } }
                        td { code { (l.uid) } }
                        td { @if let Some(w) = &l.workspace_id { code { (w) } } @else { span.muted { "user-managed" } } }
                        td.num { (l.collection_count) }
                        td.num { (l.item_count) }
                        td.num { (l.chunk_count) }
                        td.num { (count.get(l.uid.as_str()).copied().unwrap_or(0)) }
                    }
                }
                @if libs.is_empty() && after.is_empty() { tr { td colspan="7" .muted { "No libraries yet: ingest creates them." } } }
                @if libs.is_empty() && !after.is_empty() { tr { td colspan="7" .muted { "No more libraries." } } }
            }
        } }
        nav.row {
            @if !after.is_empty() { a href={ "/admin/libraries?limit=" (limit) } { "First page" } }
            @if let Some(n) = &next { a rel="next" href=(n) { "Next page" } }
        }
    };
    Ok(view::page(&s, "/admin/libraries", "Libraries", None, body))
}

async fn detail_page(
    state: &AppState,
    s: &Session,
    uid: &str,
    form: &FormData,
    err: &FieldError,
    notice: Option<String>,
    status: StatusCode,
) -> Result<Response, AdminError> {
    let lib = state.admin.library_detail(uid).await?;
    let members = users::memberships(&state.pg, None, Some(uid)).await?;
    if lib.is_none() && members.is_empty() {
        return Err(AdminError::NotFound);
    }
    let people: Vec<users::User> = users::list(&state.pg).await?;
    let body = html! {
        section.card {
            p { "UID " code { (uid) } " · " a href=(super::activity::link(uid)) { "Who read it" } }
            @if let Some(l) = &lib {
                p { "Workspace: " @if let Some(w) = &l.workspace_id { code { (w) } } @else { "user-managed" }
                    " · " (l.collection_count) " collections · " (l.item_count) " items · " (l.chunk_count) " chunks" }
                @if !l.description.is_empty() { p.muted { (l.description) } }
            } @else {
                p.error { "Not in the graph (memberships remain)." }
            }
        }
        @if let Some(l) = &lib { (super::library_lifecycle::staff_controls(s, l)) }
        h2 { "Memberships" }
        p.muted { "Owners may grant any role, managers may grant reader; a library keeps at least one owner. \
                   A user can scope a library into their tokens when they are owner or manager." }
        (view::field_error(err, "role"))
        div.table { table {
            thead { tr { th { "User" } th { "Role" } th { "Since" } th {} } }
            tbody {
                @for m in &members {
                    tr {
                        td { (m.username) }
                        td { (m.role) }
                        td { (view::when(Some(m.created_at), "")) }
                        td { (view::action(s, "/admin/library/revoke", &[("library_uid", uid), ("username", &m.username), ("role", &m.role)], "Revoke", "danger")) }
                    }
                }
                @if members.is_empty() { tr { td colspan="4" .muted { "No members." } } }
            }
        } }
        h2 { "Grant a role" }
        form.card.row method="post" action="/admin/library/grant" {
            (view::csrf(s))
            input type="hidden" name="library_uid" value=(uid);
            label { "User" select name="username" {
                @for u in people.iter().filter(|u| u.active && !u.is_service) {
                    option value=(u.username) selected[form.get("username") == u.username] { (u.username) }
                }
            } }
            label { "Role" select name="role" {
                @for r in Role::ALL { option value=(r.as_str()) selected[form.get("role") == r.as_str()] { (r.as_str()) } }
            } }
            button type="submit" { "Grant" }
        }
        (view::field_error(err, "username"))
    };
    let title = lib
        .as_ref()
        .map(|l| format!("Library {}", if l.name.is_empty() { uid } else { &l.name }))
        .unwrap_or_else(|| format!("Library {uid}"));
    Ok((
        status,
        view::page(s, "/admin/libraries", &title, notice.as_deref(), body),
    )
        .into_response())
}

/// GET /admin/library?uid=….
pub async fn detail(
    State(state): State<AppState>,
    Staff(s): Staff,
    Query(q): Query<HashMap<String, String>>,
) -> Result<Response, AdminError> {
    let uid = q.get("uid").cloned().unwrap_or_default();
    detail_page(
        &state,
        &s,
        &uid,
        &FormData::default(),
        &FieldError::none(),
        view::notice_of(&q),
        StatusCode::OK,
    )
    .await
}

fn notice_key(change: Change) -> &'static str {
    match change {
        Change::Grant => "granted",
        Change::Revoke => "revoked",
    }
}

async fn change(state: AppState, s: Session, form: FormData, change: Change) -> Result<Response, AdminError> {
    let uid = form.get("library_uid").to_owned();
    let Some(role) = Role::parse(form.get("role")) else {
        let err = FieldError::new("role", "Role: owner, manager or reader.");
        return detail_page(&state, &s, &uid, &form, &err, None, StatusCode::BAD_REQUEST).await;
    };
    let by = actor(s.username());
    let username = form.get("username");
    let outcome = memberships::apply(&state.pg, Granter::Staff, &by, change, username, &uid, role).await?;
    match outcome {
        Ok(()) => {
            let unconfirmed = fence(&state).await;
            let path = format!("/admin/library?uid={}", urlencode(&uid));
            Ok(super::see_other(&view::done(&path, notice_key(change), &unconfirmed)))
        }
        Err(r) => {
            let err = FieldError::new(r.field(), r.to_string());
            detail_page(&state, &s, &uid, &form, &err, None, StatusCode::BAD_REQUEST).await
        }
    }
}

/// POST /admin/library/grant.
pub async fn grant(State(state): State<AppState>, StaffForm(s, form): StaffForm) -> Result<Response, AdminError> {
    change(state, s, form, Change::Grant).await
}

/// POST /admin/library/revoke.
pub async fn revoke(State(state): State<AppState>, StaffForm(s, form): StaffForm) -> Result<Response, AdminError> {
    change(state, s, form, Change::Revoke).await
}

async fn member_change(state: AppState, s: Session, form: FormData, change: Change) -> Result<Response, AdminError> {
    let uid = form.get("library_uid").to_owned();
    let refused = |field: &str, msg: String| FieldError::new(&format!("member_{field}"), msg);
    let outcome = match Role::parse(form.get("role")) {
        None => Err(refused("role", "Role: owner, manager or reader.".into())),
        Some(role) => {
            let by = actor(s.username());
            let who = Granter::Member(s.username());
            let username = form.get("username").trim();
            memberships::apply(&state.pg, who, &by, change, username, &uid, role)
                .await?
                .map_err(|e| refused(e.field(), e.to_string()))
        }
    };
    match outcome {
        Ok(()) => {
            let unconfirmed = fence(&state).await;
            Ok(super::see_other(&view::done(
                "/admin/me",
                notice_key(change),
                &unconfirmed,
            )))
        }
        Err(err) => super::tokens::me_page(&state, &s, &form, &err, None, StatusCode::BAD_REQUEST).await,
    }
}

/// POST /admin/me/grant: a member grants what their role allows.
pub async fn me_grant(State(state): State<AppState>, PersonForm(s, form): PersonForm) -> Result<Response, AdminError> {
    member_change(state, s, form, Change::Grant).await
}

/// POST /admin/me/revoke: a member revokes what their role allows.
pub async fn me_revoke(State(state): State<AppState>, PersonForm(s, form): PersonForm) -> Result<Response, AdminError> {
    member_change(state, s, form, Change::Revoke).await
}
