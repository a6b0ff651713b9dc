//! Renaming and deleting a user-managed library (spec §4.1) in the console:
//! staff from the library's page, an owner from their own page. A delete is
//! a confirmation page naming what goes (content counts, memberships, token
//! scopes), then a POST; both go through `service::libraries`.

use std::collections::HashMap;

use axum::{
    extract::{Query, State},
    response::Response,
};
use maud::{html, Markup};

use super::session::{Person, PersonForm, Session, Staff, StaffForm};
use super::view::{self, urlencode};
use super::{actor, AdminError, FormData};
use crate::error::ApiError;
use crate::service::libraries::{self, Authority, LibraryError};
use crate::state::AppState;
use crate::store::graph::admin::LibraryDetail;
use crate::store::pg::{grants, users};

/// Console paths of one kind of user.
struct Paths {
    authority_is_staff: bool,
    page: &'static str,
    rename: &'static str,
    delete: &'static str,
    /// Where a delete lands.
    after_delete: &'static str,
}

const STAFF: Paths = Paths {
    authority_is_staff: true,
    page: "/admin/library/delete",
    rename: "/admin/library/rename",
    delete: "/admin/library/delete",
    after_delete: "/admin/libraries",
};

const OWNER: Paths = Paths {
    authority_is_staff: false,
    page: "/admin/me/library",
    rename: "/admin/me/library/rename",
    delete: "/admin/me/library/delete",
    after_delete: "/admin/me",
};

impl Paths {
    fn authority<'a>(&self, s: &'a Session) -> Authority<'a> {
        if self.authority_is_staff {
            Authority::Operator
        } else {
            Authority::Owner(s.username())
        }
    }
}

fn refusal(e: LibraryError) -> AdminError {
    AdminError::Api(ApiError::from(e))
}

/// The rename form and a link to the delete confirmation, for the staff
/// library page (user-managed libraries only).
pub fn staff_controls(s: &Session, lib: &LibraryDetail) -> Markup {
    if lib.workspace_id.is_some() {
        return html! { p.muted { "A workspace's library is renamed and deleted with its workspace (the workspace API)." } };
    }
    html! {
        h2 { "Rename or delete" }
        (rename_form(s, &STAFF, &lib.uid, &lib.name, &lib.description))
        p { a.danger href={ (STAFF.page) "?uid=" (urlencode(&lib.uid)) } { "Delete this library…" } }
    }
}

fn rename_form(s: &Session, paths: &Paths, uid: &str, name: &str, description: &str) -> Markup {
    html! {
        form.card.row method="post" action=(paths.rename) {
            (view::csrf(s))
            input type="hidden" name="uid" value=(uid);
            label { "Name" input type="text" name="name" required maxlength="200" value=(name); }
            label { "Description" input type="text" name="description" maxlength="2000" value=(description); }
            button type="submit" { "Rename" }
        }
    }
}

async fn confirm_page(
    state: &AppState,
    s: &Session,
    paths: &Paths,
    uid: &str,
    notice: Option<String>,
) -> Result<Response, AdminError> {
    if !paths.authority_is_staff {
        // Only an owner sees the page: the same check the delete makes.
        match users::strongest_role(&state.pg, s.username(), uid).await? {
            Some(users::Role::Owner) => {}
            Some(_) => return Err(refusal(LibraryError::NotOwner(uid.to_owned()))),
            None => return Err(AdminError::NotFound),
        }
    }
    let Some(lib) = state.admin.library_detail(uid).await? else {
        return Err(AdminError::NotFound);
    };
    if let Some(ws) = &lib.workspace_id {
        return Err(refusal(LibraryError::Workspace {
            uid: uid.to_owned(),
            workspace_id: ws.clone(),
        }));
    }
    let members = users::memberships(&state.pg, None, Some(uid)).await?.len();
    let tokens = grants::tokens_scoping(&state.pg, uid).await?;
    let body = body(s, paths, &lib, members, tokens);
    let title = format!("Library {}", if lib.name.is_empty() { uid } else { &lib.name });
    let current = if paths.authority_is_staff {
        "/admin/libraries"
    } else {
        "/admin/me"
    };
    Ok(view::page(s, current, &title, notice.as_deref(), body))
}

fn body(s: &Session, paths: &Paths, lib: &LibraryDetail, members: usize, tokens: i64) -> Markup {
    html! {
        p { "UID " code { (lib.uid) } }
        @if !paths.authority_is_staff {
            h2 { "Rename" }
            (rename_form(s, paths, &lib.uid, &lib.name, &lib.description))
        }
        h2 { "Delete this library?" }
        section.card {
            p { b { "Deleting removes " (lib.collection_count) " collection(s), " (lib.item_count) " item(s) and "
                    (lib.chunk_count) " chunk(s)" }
                ", " (members) " membership(s) on it, and the library from " (tokens) " token(s) that scope it \
                — from the next request on, on every replica. This cannot be undone." }
            @if lib.deleting { p.error { "An earlier delete did not finish; deleting again finishes it." } }
            (view::action(s, paths.delete, &[("uid", &lib.uid)], "Delete the library", "danger"))
            " " a href=(paths.after_delete) { "Cancel" }
        }
    }
}

async fn rename(state: AppState, s: Session, form: FormData, paths: &Paths) -> Result<Response, AdminError> {
    let uid = form.get("uid");
    let description = form.get("description");
    libraries::rename(
        &state.admin,
        &state.pg,
        &actor(s.username()),
        paths.authority(&s),
        uid,
        form.get("name"),
        Some(description),
    )
    .await
    .map_err(refusal)?;
    let back = if paths.authority_is_staff {
        format!("/admin/library?uid={}", urlencode(uid))
    } else {
        format!("{}?uid={}", paths.page, urlencode(uid))
    };
    Ok(super::see_other(&view::done(&back, "library-renamed", &None)))
}

async fn delete(state: AppState, s: Session, form: FormData, paths: &Paths) -> Result<Response, AdminError> {
    let out = libraries::delete(
        &state.admin,
        &state.pg,
        &state.changes,
        &actor(s.username()),
        paths.authority(&s),
        form.get("uid"),
    )
    .await
    .map_err(refusal)?;
    let unconfirmed = super::propagation_notice(&out.propagation);
    Ok(super::see_other(&view::done(
        paths.after_delete,
        "library-deleted",
        &unconfirmed,
    )))
}

fn uid_of(q: &HashMap<String, String>) -> String {
    q.get("uid").cloned().unwrap_or_default()
}

/// GET /admin/library/delete?uid=…: the staff confirmation.
pub async fn staff_confirm(
    State(state): State<AppState>,
    Staff(s): Staff,
    Query(q): Query<HashMap<String, String>>,
) -> Result<Response, AdminError> {
    confirm_page(&state, &s, &STAFF, &uid_of(&q), None).await
}

/// POST /admin/library/delete.
pub async fn staff_delete(
    State(state): State<AppState>,
    StaffForm(s, form): StaffForm,
) -> Result<Response, AdminError> {
    delete(state, s, form, &STAFF).await
}

/// POST /admin/library/rename.
pub async fn staff_rename(
    State(state): State<AppState>,
    StaffForm(s, form): StaffForm,
) -> Result<Response, AdminError> {
    rename(state, s, form, &STAFF).await
}

/// GET /admin/me/library?uid=…: an owner's rename form and delete confirmation.
pub async fn owner_page(
    State(state): State<AppState>,
    Person(s): Person,
    Query(q): Query<HashMap<String, String>>,
) -> Result<Response, AdminError> {
    confirm_page(&state, &s, &OWNER, &uid_of(&q), view::notice_of(&q)).await
}

/// POST /admin/me/library/rename.
pub async fn owner_rename(
    State(state): State<AppState>,
    PersonForm(s, form): PersonForm,
) -> Result<Response, AdminError> {
    rename(state, s, form, &OWNER).await
}

/// POST /admin/me/library/delete.
pub async fn owner_delete(
    State(state): State<AppState>,
    PersonForm(s, form): PersonForm,
) -> Result<Response, AdminError> {
    delete(state, s, form, &OWNER).await
}
