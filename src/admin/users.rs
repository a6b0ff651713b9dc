//! Users: create, disable/enable, reset password, staff flag — through the
//! same service functions as the CLI (each audited; disabling ends the user's
//! tokens and console sessions on the next request everywhere).

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
                    td { (u.username) }
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
