//! Opaque MCP tokens (spec §9.6): the staff pages (every user's tokens, add with
//! the membership-filtered library picker, revoke) and the self-service page.

use std::collections::HashMap;

use axum::{
    extract::{Query, State},
    http::StatusCode,
    response::{IntoResponse, Response},
};
use chrono::Utc;
use maud::{html, Markup};

use super::session::{Person, PersonForm, Session, Staff, StaffForm};
use super::view::{self, FieldError};
use super::{actor, AdminError};
use crate::service::tokens::{self as service, TokenError};
use crate::state::AppState;
use crate::store::pg::{tokens, users};

fn token_table(s: &Session, list: &[tokens::TokenInfo], revoke_path: &str, show_user: bool) -> Markup {
    html! {
        div.table { table {
            thead { tr {
                th { "ID" } @if show_user { th { "User" } } th { "Name" } th { "Libraries" } th { "Tools" }
                th { "Last used" } th { "Expires" } th { "Active" } th {}
            } }
            tbody {
                @for t in list {
                    @let live = t.active && t.expires_at.is_none_or(|e| e > Utc::now());
                    tr {
                        td.num { (t.id) }
                        @if show_user { td { (t.username) } }
                        td { (t.name) }
                        td {
                            @if t.allowed_libraries.0.is_empty() { span.muted { "none (reads nothing)" } }
                            @for l in &t.allowed_libraries.0 { code { (l) } " " }
                        }
                        td {
                            (super::tools::summary(t.allowed_tools.as_deref()))
                            // Staff pages only: a person's own tokens keep what staff set.
                            @if show_user && t.active { " " a href={ "/admin/tokens/" (t.id) "/tools" } { "Change" } }
                        }
                        td { (view::when(t.last_used_at, "never")) }
                        td { (view::when(t.expires_at, "never")) }
                        td { (view::badge(live, "active", if t.active { "expired" } else { "revoked" })) }
                        td { @if t.active {
                            (view::action(s, revoke_path, &[("id", &t.id.to_string())], "Revoke", "danger"))
                        } }
                    }
                }
                @if list.is_empty() { tr { td colspan="9" .muted { "No tokens." } } }
            }
        } }
    }
}

/// GET /admin/tokens.
pub async fn list(
    State(state): State<AppState>,
    Staff(s): Staff,
    Query(q): Query<HashMap<String, String>>,
) -> Result<Response, AdminError> {
    let list = tokens::list(&state.pg, None).await?;
    let grants = crate::store::pg::oauth::grants(&state.pg, None, false).await?;
    let body = html! {
        p { a href="/admin/tokens/new" { "Add a token" } }
        (token_table(&s, &list, "/admin/tokens/revoke", true))
        h2 { "Connected OAuth clients" }
        (super::oauth::grants_table(&s, &grants, "/admin/grants/revoke", true))
    };
    Ok(view::page(
        &s,
        "/admin/tokens",
        "MCP tokens",
        view::notice_of(&q).as_deref(),
        body,
    ))
}

/// The add form, step 2: the user is chosen; the picker offers only what they
/// own or manage.
fn mint_form(
    s: &Session,
    action: &str,
    user: Option<&str>,
    choices: &[(String, String)],
    form: &super::FormData,
    err: &FieldError,
) -> Markup {
    let picked = form.all("library");
    html! {
        form.card.stack method="post" action=(action) {
            (view::csrf(s))
            (err.general())
            @if let Some(u) = user {
                input type="hidden" name="user" value=(u);
                p { "User: " b { (u) } }
            }
            (view::field_error(err, "user"))
            label { "Name (what the token is for)"
                input type="text" name="name" value=(form.get("name")) maxlength="200" placeholder="Claude Desktop on my laptop";
            }
            (view::field_error(err, "name"))
            fieldset {
                legend { "Libraries it may read" }
                @if choices.is_empty() {
                    p.muted { "No library can be offered: the user is not owner or manager of any. \
                               A token without libraries reads nothing." }
                }
                @for (uid, name) in choices {
                    label.check {
                        input type="checkbox" name="library" value=(uid) checked[picked.contains(uid)];
                        span { (name) " " code { (uid) } }
                    }
                }
            }
            (view::field_error(err, "libraries"))
            label { "Expires (optional, UTC)"
                input type="datetime-local" name="expires_at" value=(form.get("expires_at"));
            }
            (view::field_error(err, "expires_at"))
            button type="submit" { "Create token" }
        }
    }
}

/// GET /admin/tokens/new[?user=…]: pick a user, then the libraries.
pub async fn new_form(
    State(state): State<AppState>,
    Staff(s): Staff,
    Query(q): Query<HashMap<String, String>>,
) -> Result<Response, AdminError> {
    let chosen = q.get("user").map(String::as_str).unwrap_or("");
    if chosen.is_empty() {
        let people: Vec<users::User> = users::list(&state.pg).await?.into_iter().filter(|u| u.active).collect();
        let body = html! {
            form.card.row method="get" action="/admin/tokens/new" {
                label { "User"
                    select name="user" required {
                        @for u in &people {
                            option value=(u.username) { (u.username) @if u.is_service { " (service account)" } }
                        }
                    }
                }
                button type="submit" { "Next: choose libraries" }
            }
        };
        return Ok(view::page(&s, "/admin/tokens", "Add a token: user", None, body));
    }
    let Some(user) = users::by_username(&state.pg, chosen).await? else {
        return Err(AdminError::NotFound);
    };
    let choices = service::picker(&state.pg, &state.admin, user.id).await?;
    let body = mint_form(
        &s,
        "/admin/tokens",
        Some(&user.username),
        &choices,
        &super::FormData::default(),
        &FieldError::none(),
    );
    Ok(view::page(&s, "/admin/tokens", "Add a token: libraries", None, body))
}

/// What minting needs from a form, or the refused field.
async fn mint(state: &AppState, by: &str, username: &str, form: &super::FormData) -> Result<(i64, String), FieldError> {
    let expires_at = service::parse_expiry(form.get("expires_at")).map_err(|b| FieldError::new(&b.field, b.message))?;
    let libraries = form.all("library");
    service::mint_by(
        &state.pg,
        &actor(by),
        username,
        form.get("name").trim(),
        &libraries,
        expires_at,
        state.settings.user_max_tokens,
    )
    .await
    .map(|m| (m.id, m.plaintext))
    .map_err(|e| match e {
        TokenError::Store(e) => {
            tracing::error!(error = %e, "admin console: minting a token");
            FieldError::new("", "The token could not be stored; retry in a moment.")
        }
        other => FieldError::new(other.field(), other.to_string()),
    })
}

fn minted(s: &Session, state: &AppState, id: i64, username: &str, plaintext: &str, back: &str) -> Markup {
    let url = format!("{}/mcp/", state.settings.public_url.trim_end_matches('/'));
    let snippet = format!(
        "{{\"type\": \"http\", \"url\": \"{url}\", \"headers\": {{\"Authorization\": \"Bearer {plaintext}\"}}}}"
    );
    let _ = s;
    html! {
        p { "Token " b { (id) } " created for " b { (username) } "." }
        (view::secret("The token", plaintext))
        h2 { "For a Streamable HTTP MCP client" }
        pre.copy { code { (snippet) } }
        p { a href=(back) { "Done" } }
    }
}

/// POST /admin/tokens: mints; the plaintext is on this response only.
pub async fn create(State(state): State<AppState>, StaffForm(s, form): StaffForm) -> Result<Response, AdminError> {
    let username = form.get("user").to_owned();
    let Some(user) = users::by_username(&state.pg, &username).await? else {
        let err = FieldError::new("user", "No such user.");
        let body = mint_form(&s, "/admin/tokens", None, &[], &form, &err);
        return Ok((
            StatusCode::BAD_REQUEST,
            view::page(&s, "/admin/tokens", "Add a token", None, body),
        )
            .into_response());
    };
    match mint(&state, s.username(), &user.username, &form).await {
        Ok((id, plaintext)) => {
            tracing::info!(token = id, user = ?user.username, by = ?s.username(), "admin console: token created");
            let body = minted(&s, &state, id, &user.username, &plaintext, "/admin/tokens");
            Ok(view::page(&s, "/admin/tokens", "Token created", None, body))
        }
        Err(err) => {
            let choices = service::picker(&state.pg, &state.admin, user.id).await?;
            let body = mint_form(&s, "/admin/tokens", Some(&user.username), &choices, &form, &err);
            Ok((
                StatusCode::BAD_REQUEST,
                view::page(&s, "/admin/tokens", "Add a token: libraries", None, body),
            )
                .into_response())
        }
    }
}

fn parse_id(form: &super::FormData) -> Result<i64, AdminError> {
    form.get("id")
        .parse()
        .map_err(|_| crate::error::ApiError::bad_field("id", "id must be a token id (a number)").into())
}

/// Revokes (only `owner`'s token, when given); the propagation notice.
async fn revoke(state: &AppState, s: &Session, id: i64, owner: Option<&str>) -> Result<Option<String>, AdminError> {
    match service::revoke_by(&state.pg, &state.changes, &actor(s.username()), id, owner).await {
        Ok(p) => Ok(super::propagation_notice(&p)),
        Err(TokenError::NotFound(_)) => Err(AdminError::NotFound),
        Err(TokenError::Store(e)) => Err(e.into()),
        Err(other) => Err(crate::error::ApiError::Internal(other.to_string()).into()),
    }
}

/// POST /admin/tokens/revoke.
pub async fn revoke_action(
    State(state): State<AppState>,
    StaffForm(s, form): StaffForm,
) -> Result<Response, AdminError> {
    let id = parse_id(&form)?;
    let unconfirmed = revoke(&state, &s, id, None).await?;
    Ok(super::see_other(&view::done(
        "/admin/tokens",
        "token-revoked",
        &unconfirmed,
    )))
}

/// GET /admin/me: the signed-in user's own tokens and a form to mint one.
pub async fn me(
    State(state): State<AppState>,
    Person(s): Person,
    Query(q): Query<HashMap<String, String>>,
) -> Result<Response, AdminError> {
    me_page(
        &state,
        &s,
        &super::FormData::default(),
        &FieldError::none(),
        view::notice_of(&q),
        StatusCode::OK,
    )
    .await
}

pub(super) async fn me_page(
    state: &AppState,
    s: &Session,
    form: &super::FormData,
    err: &FieldError,
    notice: Option<String>,
    status: StatusCode,
) -> Result<Response, AdminError> {
    let list = tokens::list(&state.pg, Some(s.username())).await?;
    let choices = service::picker(&state.pg, &state.admin, s.user.user_id).await?;
    let members = super::my_libraries::section(state, s, form, err).await?;
    let grants = crate::store::pg::oauth::grants(&state.pg, Some(s.username()), false).await?;
    let body = html! {
        (token_table(s, &list, "/admin/me/tokens/revoke", false))
        h2 { "Connected MCP clients" }
        (super::oauth::grants_table(s, &grants, "/admin/me/grants/revoke", false))
        h2 { "New token" }
        (mint_form(s, "/admin/me/tokens", None, &choices, form, err))
        (members)
    };
    Ok((status, view::page(s, "/admin/me", "My tokens", notice.as_deref(), body)).into_response())
}

/// POST /admin/me/tokens: mint one of your own.
pub async fn me_create(State(state): State<AppState>, PersonForm(s, form): PersonForm) -> Result<Response, AdminError> {
    match mint(&state, s.username(), s.username(), &form).await {
        Ok((id, plaintext)) => {
            let body = minted(&s, &state, id, s.username(), &plaintext, "/admin/me");
            Ok(view::page(&s, "/admin/me", "Token created", None, body))
        }
        Err(err) => me_page(&state, &s, &form, &err, None, StatusCode::BAD_REQUEST).await,
    }
}

/// POST /admin/me/tokens/revoke: only your own.
pub async fn me_revoke(State(state): State<AppState>, PersonForm(s, form): PersonForm) -> Result<Response, AdminError> {
    let id = parse_id(&form)?;
    let unconfirmed = revoke(&state, &s, id, Some(s.username())).await?;
    Ok(super::see_other(&view::done(
        "/admin/me",
        "token-revoked",
        &unconfirmed,
    )))
}
