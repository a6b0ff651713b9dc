//! Users: create, disable/enable, reset password, staff flag, and a
//! person's ceiling (the tools and rate every token of theirs has at most,
//! issue 32) — through the same service functions as the CLI (each audited;
//! disabling ends the user's tokens and console sessions, a ceiling applies
//! to their tokens, on the next request everywhere).

use std::collections::HashMap;

use axum::{
    extract::{Query, State},
    http::StatusCode,
    response::{IntoResponse, Response},
};
use maud::html;

use super::session::{Session, Staff, StaffForm};
use super::view::{self, FieldError};
use super::{actor, fence, AdminError, FormData};
use crate::service::accounts::{self, AccountError};
use crate::state::AppState;
use crate::store::pg::users;

async fn page(
    state: &AppState,
    s: &Session,
    form: &FormData,
    err: &FieldError,
    notice: Option<String>,
    status: StatusCode,
) -> Result<Response, AdminError> {
    let list = users::list(&state.pg).await?;
    let body = html! {
        div.table { table {
            thead { tr { th { "User" } th { "Kind" } th { "Active" } th { "Staff" } th { "Actions" } } }
            tbody { @for u in &list {
                @let me = u.username == s.username();
                tr {
                    td { @if u.is_service { (u.username) } @else {
                        a href={ "/admin/user?username=" (view::urlencode(&u.username)) } { (u.username) }
                    } }
                    td { @if u.is_service { "service account" } @else { "person" } }
                    td { (view::badge(u.active, "active", "disabled")) }
                    td { @if u.is_staff { "staff" } }
                    td {
                        @if !me {
                            @if u.active {
                                (view::action(s, "/admin/users/active", &[("username", &u.username), ("active", "off")], "Disable", "danger"))
                            } @else {
                                (view::action(s, "/admin/users/active", &[("username", &u.username), ("active", "on")], "Enable", "quiet"))
                            }
                            " "
                            @if !u.is_service {
                                @if u.is_staff {
                                    (view::action(s, "/admin/users/staff", &[("username", &u.username), ("staff", "off")], "Remove staff", "quiet"))
                                } @else {
                                    (view::action(s, "/admin/users/staff", &[("username", &u.username), ("staff", "on")], "Make staff", "quiet"))
                                }
                            }
                        } @else { span.muted { "you" } }
                    }
                }
            } }
        } }
        h2 { "Reset a password" }
        form.card.row method="post" action="/admin/users/password" {
            (view::csrf(s))
            label { "User"
                select name="username" { @for u in &list {
                    option value=(u.username) selected[form.get("username") == u.username && err.field == "new_password"] { (u.username) }
                } }
            }
            label { "New password (at least 8 characters)"
                input type="password" name="new_password" autocomplete="new-password" required;
            }
            button type="submit" { "Set password" }
        }
        (view::field_error(err, "new_password"))
        h2 { "New user" }
        form.card.stack method="post" action="/admin/users" {
            (view::csrf(s))
            (err.general())
            label { "Username" input type="text" name="username" value=(form.get("username")) maxlength="150" required; }
            (view::field_error(err, "username"))
            label { "Password (needed to sign in here; at least 8 characters)"
                input type="password" name="password" autocomplete="new-password";
            }
            (view::field_error(err, "password"))
            fieldset {
                label.check { input type="checkbox" name="staff" checked[form.checked("staff")]; "Staff (may use this console)" }
                label.check { input type="checkbox" name="service" checked[form.checked("service")]; "Service account (HTTP Basic for the team and library APIs)" }
            }
            (view::field_error(err, "staff"))
            button type="submit" { "Create user" }
        }
    };
    Ok((status, view::page(s, "/admin/users", "Users", notice.as_deref(), body)).into_response())
}

/// GET /admin/users.
pub async fn list(
    State(state): State<AppState>,
    Staff(s): Staff,
    Query(q): Query<HashMap<String, String>>,
) -> Result<Response, AdminError> {
    page(
        &state,
        &s,
        &FormData::default(),
        &FieldError::none(),
        view::notice_of(&q),
        StatusCode::OK,
    )
    .await
}

fn refused(e: AccountError) -> Result<FieldError, AdminError> {
    match e {
        AccountError::Store(e) => Err(e.into()),
        other => Ok(FieldError::new(other.field(), other.to_string())),
    }
}

/// POST /admin/users.
pub async fn create(State(state): State<AppState>, StaffForm(s, form): StaffForm) -> Result<Response, AdminError> {
    let password = Some(form.get("password")).filter(|p| !p.is_empty());
    match accounts::create(
        &state.pg,
        &actor(s.username()),
        form.get("username").trim(),
        password,
        form.checked("service"),
        form.checked("staff"),
    )
    .await
    {
        Ok(_) => Ok(super::see_other("/admin/users?ok=user-created")),
        Err(e) => {
            let err = refused(e)?;
            page(&state, &s, &form, &err, None, StatusCode::BAD_REQUEST).await
        }
    }
}

/// Staff cannot lock themselves out from the console.
fn not_self(s: &Session, form: &FormData) -> Result<(), AdminError> {
    if form.get("username") == s.username() {
        return Err(crate::error::ApiError::Conflict("You cannot change your own access here.".into()).into());
    }
    Ok(())
}

/// A switch field: exactly `on` or `off` (anything else is a 400 naming it,
/// never read as "off").
fn on_off(form: &FormData, field: &str) -> Result<bool, AdminError> {
    match form.get(field) {
        "on" => Ok(true),
        "off" => Ok(false),
        _ => Err(crate::error::ApiError::bad_field(field, format!("{field} must be on or off")).into()),
    }
}

/// POST /admin/users/active (active=on|off).
pub async fn set_active(State(state): State<AppState>, StaffForm(s, form): StaffForm) -> Result<Response, AdminError> {
    not_self(&s, &form)?;
    let on = on_off(&form, "active")?;
    match accounts::set_active(&state.pg, &actor(s.username()), form.get("username"), on).await {
        Ok(()) => {
            let unconfirmed = fence(&state).await;
            let key = if on { "user-enabled" } else { "user-disabled" };
            Ok(super::see_other(&view::done("/admin/users", key, &unconfirmed)))
        }
        Err(e) => {
            let err = refused(e)?;
            page(&state, &s, &form, &err, None, StatusCode::BAD_REQUEST).await
        }
    }
}

/// POST /admin/users/staff (staff=on|off).
pub async fn set_staff(State(state): State<AppState>, StaffForm(s, form): StaffForm) -> Result<Response, AdminError> {
    not_self(&s, &form)?;
    let on = on_off(&form, "staff")?;
    match accounts::set_staff(&state.pg, &actor(s.username()), form.get("username"), on).await {
        Ok(()) => Ok(super::see_other("/admin/users?ok=user-staff")),
        Err(e) => {
            let err = refused(e)?;
            page(&state, &s, &form, &err, None, StatusCode::BAD_REQUEST).await
        }
    }
}

/// POST /admin/users/password.
pub async fn set_password(
    State(state): State<AppState>,
    StaffForm(s, form): StaffForm,
) -> Result<Response, AdminError> {
    match accounts::set_password(
        &state.pg,
        &actor(s.username()),
        form.get("username"),
        form.get("new_password"),
    )
    .await
    {
        Ok(()) => {
            let unconfirmed = fence(&state).await;
            Ok(super::see_other(&view::done(
                "/admin/users",
                "user-password",
                &unconfirmed,
            )))
        }
        Err(e) => {
            let mut err = refused(e)?;
            if err.field == "password" {
                err.field = "new_password".into();
            }
            page(&state, &s, &form, &err, None, StatusCode::BAD_REQUEST).await
        }
    }
}

/// A person's ceiling page: what every token of theirs may use at most,
/// with its two forms.
async fn ceiling_page(
    state: &AppState,
    s: &Session,
    username: &str,
    err: &FieldError,
    notice: Option<String>,
    status: StatusCode,
) -> Result<Response, AdminError> {
    let (tools, rate) = users::ceiling(&state.pg, username).await?.ok_or(AdminError::NotFound)?;
    let q = view::urlencode(username);
    let body = html! {
        section.card {
            p { "Every opaque token of " b { (username) } " may use at most: " (super::tools::summary(tools.as_deref())) }
            p { "All of its tokens together: "
                @match rate { None => "no rate ceiling", Some(n) => { b { (n) } " requests a minute" } } }
            p.muted { "A token's own tool permissions and rate only narrow this; tokens minted later follow it too." }
        }
        h2 { "Tools" }
        (super::tools::form(s, &format!("/admin/user/tools?username={q}"), tools.as_deref(), err))
        h2 { "Rate" }
        form.card.stack method="post" action={ "/admin/user/rate?username=" (q) } {
            (view::csrf(s))
            label { "Requests a minute all the tokens share, over every replica (empty: no ceiling)"
                input type="number" name="per_minute" min="1" value=(rate.map(|n| n.to_string()).unwrap_or_default());
            }
            (view::field_error(err, "per_minute"))
            button type="submit" { "Save rate ceiling" }
        }
    };
    let title = format!("{username}: ceiling");
    Ok((status, view::page(s, "/admin/users", &title, notice.as_deref(), body)).into_response())
}

fn username_of(q: &HashMap<String, String>) -> &str {
    q.get("username").map(String::as_str).unwrap_or("")
}

/// GET /admin/user?username=NAME.
pub async fn ceiling(
    State(state): State<AppState>,
    Staff(s): Staff,
    Query(q): Query<HashMap<String, String>>,
) -> Result<Response, AdminError> {
    let notice = view::notice_of(&q);
    ceiling_page(&state, &s, username_of(&q), &FieldError::none(), notice, StatusCode::OK).await
}

/// After a ceiling write: back to the page, or the refusal on it.
async fn ceiling_saved(
    state: &AppState,
    s: &Session,
    username: &str,
    out: Result<crate::service::Propagation, AccountError>,
) -> Result<Response, AdminError> {
    match out {
        Ok(p) => {
            let back = format!("/admin/user?username={}", view::urlencode(username));
            Ok(super::see_other(&view::done(
                &back,
                "user-ceiling",
                &super::propagation_notice(&p),
            )))
        }
        Err(AccountError::NoSuchUser(_)) => Err(AdminError::NotFound),
        Err(e) => {
            let err = refused(e)?;
            ceiling_page(state, s, username, &err, None, StatusCode::BAD_REQUEST).await
        }
    }
}

/// POST /admin/user/tools?username=NAME (mode=every|only, tool=…).
pub async fn set_ceiling_tools(
    State(state): State<AppState>,
    Query(q): Query<HashMap<String, String>>,
    StaffForm(s, form): StaffForm,
) -> Result<Response, AdminError> {
    let username = username_of(&q);
    let list = match super::tools::parse(&form) {
        Ok(l) => l,
        Err(err) => return ceiling_page(&state, &s, username, &err, None, StatusCode::BAD_REQUEST).await,
    };
    let out = accounts::set_max_tools(&state.pg, &state.changes, &actor(s.username()), username, list.as_ref()).await;
    ceiling_saved(&state, &s, username, out).await
}

/// POST /admin/user/rate?username=NAME (per_minute, empty = none).
pub async fn set_ceiling_rate(
    State(state): State<AppState>,
    Query(q): Query<HashMap<String, String>>,
    StaffForm(s, form): StaffForm,
) -> Result<Response, AdminError> {
    let username = username_of(&q);
    let raw = form.get("per_minute").trim();
    let rate = if raw.is_empty() {
        None
    } else {
        match raw.parse::<u32>() {
            Ok(n) => Some(n),
            Err(_) => {
                let err = FieldError::new("per_minute", AccountError::BadRate.to_string());
                return ceiling_page(&state, &s, username, &err, None, StatusCode::BAD_REQUEST).await;
            }
        }
    };
    let out = accounts::set_max_rate(&state.pg, &state.changes, &actor(s.username()), username, rate).await;
    ceiling_saved(&state, &s, username, out).await
}
