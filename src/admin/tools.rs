//! Tool permissions and rate limits per credential (issue 24) in the
//! console: the tool allowlist and the own request rate of an opaque token
//! (its own page) and of a team (a section of its page). Writes go through
//! `service::tool_grants` and `service::credential_limits` (audited, then
//! fenced), so they apply on the next MCP request on every replica.

use axum::{
    extract::{Path, State},
    http::StatusCode,
    response::{IntoResponse, Response},
};
use maud::{html, Markup};

use super::session::{Session, Staff, StaffForm};
use super::view::{self, FieldError};
use super::{actor, propagation_notice, AdminError, FormData};
use crate::error::ApiError;
use crate::service::credential_limits;
use crate::service::teams::TeamError;
use crate::service::tokens::TokenError;
use crate::service::tool_grants::{self, ToolAllowlist};
use crate::state::AppState;
use crate::store::pg::{teams, tokens};

/// How an allowlist reads in a table.
pub(super) fn summary(tools: Option<&[String]>) -> Markup {
    html! {
        @match tools {
            None => span.muted { "every tool" },
            Some([]) => span.muted { "no tool" },
            Some(names) => @for n in names { code { (n) } " " },
        }
    }
}

/// The form: every tool, or only the ticked ones (none ticked = no tool).
pub(super) fn form(s: &Session, action: &str, current: Option<&[String]>, err: &FieldError) -> Markup {
    let only = current.is_some();
    let ticked = |t: &str| current.is_some_and(|c| c.iter().any(|n| n == t));
    html! {
        form.card.stack method="post" action=(action) {
            (view::csrf(s))
            (err.general())
            label.check { input type="radio" name="mode" value="every" checked[!only]; span { "Every tool" } }
            label.check { input type="radio" name="mode" value="only" checked[only]; span { "Only these tools:" } }
            fieldset {
                legend { "Tools" }
                @for t in crate::mcp::TOOLS {
                    label.check {
                        input type="checkbox" name="tool" value=(t) checked[ticked(t)];
                        code { (t) }
                    }
                }
            }
            (view::field_error(err, "tool"))
            p.muted { "Other tools are left out of its tools/list and refused when called, from the next request on." }
            button type="submit" { "Save tool permissions" }
        }
    }
}

/// The rate form: the configured rate, or the credential's own.
pub(super) fn rate_form(s: &Session, action: &str, current: Option<i32>, err: &FieldError) -> Markup {
    html! {
        form.card.stack method="post" action=(action) {
            (view::csrf(s))
            p { "Requests a minute, over every replica together: "
                @match current { None => "the configured rate", Some(0) => "no limit", Some(n) => b { (n) } } }
            label { "Its own rate (empty: the configured one; 0: no limit)"
                input type="number" name="per_minute" min="0" value=(current.map(|n| n.to_string()).unwrap_or_default());
            }
            (view::field_error(err, "per_minute"))
            button type="submit" { "Save rate limit" }
        }
    }
}

/// The rate a form asks for (`None` = the configured one).
fn parse_rate(form: &FormData) -> Result<Option<u32>, FieldError> {
    let raw = form.get("per_minute").trim();
    if raw.is_empty() {
        return Ok(None);
    }
    raw.parse::<u32>()
        .ok()
        .filter(|n| *n <= crate::service::credential_limits::MAX_PER_MINUTE)
        .map(Some)
        .ok_or_else(|| {
            FieldError::new(
                "per_minute",
                "A whole number of requests a minute (0: no limit), or empty.",
            )
        })
}

/// The allowlist a form asks for (`None` = every tool).
pub(super) fn parse(form: &FormData) -> Result<Option<ToolAllowlist>, FieldError> {
    match form.get("mode") {
        "every" => Ok(None),
        "only" => ToolAllowlist::parse("tool", &form.all("tool"), &crate::mcp::TOOLS)
            .map(Some)
            .map_err(|b| FieldError::new("tool", b.message)),
        _ => Err(FieldError::new("tool", "Choose every tool or only the ticked ones.")),
    }
}

fn token_id(raw: &str) -> Result<i64, AdminError> {
    raw.parse().map_err(|_| AdminError::NotFound)
}

async fn token_page(
    state: &AppState,
    s: &Session,
    id: i64,
    err: &FieldError,
    status: StatusCode,
) -> Result<Response, AdminError> {
    let t = tokens::get(&state.pg, id)
        .await?
        .filter(|t| t.active)
        .ok_or(AdminError::NotFound)?;
    let body = html! {
        section.card {
            p { "Token " b { (t.id) } " of " b { (t.username) } @if !t.name.is_empty() { " (" (t.name) ")" } }
            p { "May use: " (summary(t.allowed_tools.as_deref())) }
        }
        (form(s, &format!("/admin/tokens/{id}/tools"), t.allowed_tools.as_deref(), err))
        h2 { "Rate limit" }
        (rate_form(s, &format!("/admin/tokens/{id}/rate"), t.rate_limit_per_minute, err))
    };
    Ok((
        status,
        view::page(s, "/admin/tokens", &format!("Token {id}: tools"), None, body),
    )
        .into_response())
}

/// GET /admin/tokens/{id}/tools.
pub async fn token_form(
    State(state): State<AppState>,
    Staff(s): Staff,
    Path(id): Path<String>,
) -> Result<Response, AdminError> {
    token_page(&state, &s, token_id(&id)?, &FieldError::none(), StatusCode::OK).await
}

/// POST /admin/tokens/{id}/tools.
pub async fn token_set(
    State(state): State<AppState>,
    Path(id): Path<String>,
    StaffForm(s, form): StaffForm,
) -> Result<Response, AdminError> {
    let id = token_id(&id)?;
    let list = match parse(&form) {
        Ok(l) => l,
        Err(err) => return token_page(&state, &s, id, &err, StatusCode::BAD_REQUEST).await,
    };
    let p = crate::service::tokens::set_token_tools(
        &state.pg,
        &state.changes,
        &actor(s.username()),
        id,
        list.as_ref(),
        None,
    )
    .await
    .map_err(token_error)?;
    tracing::info!(token = id, by = ?s.username(), "admin console: token tool permissions set");
    Ok(super::see_other(&view::done(
        "/admin/tokens",
        "token-tools",
        &propagation_notice(&p),
    )))
}

/// A token write's failure as the console shows it.
fn token_error(e: TokenError) -> AdminError {
    match e {
        TokenError::NotFound(_) => AdminError::NotFound,
        TokenError::Store(e) => e.into(),
        other => ApiError::Internal(other.to_string()).into(),
    }
}

/// The team page's section: its allowlist and rate, with their forms.
pub(super) async fn team_section(state: &AppState, s: &Session, id: uuid::Uuid) -> Result<Markup, AdminError> {
    let current = teams::tools_of(&state.pg, id).await?.ok_or(AdminError::NotFound)?;
    let rate = teams::rate_limit_of(&state.pg, id).await?.ok_or(AdminError::NotFound)?;
    Ok(html! {
        h2 { "Tools" }
        p { "The team's JWT may use: " (summary(current.as_deref())) }
        (form(s, &format!("/admin/teams/{id}/tools"), current.as_deref(), &FieldError::none()))
        h2 { "Rate limit" }
        (rate_form(s, &format!("/admin/teams/{id}/rate"), rate, &FieldError::none()))
    })
}

/// POST /admin/tokens/{id}/rate.
pub async fn token_rate(
    State(state): State<AppState>,
    Path(id): Path<String>,
    StaffForm(s, form): StaffForm,
) -> Result<Response, AdminError> {
    let id = token_id(&id)?;
    let rate = match parse_rate(&form) {
        Ok(r) => r,
        Err(err) => return token_page(&state, &s, id, &err, StatusCode::BAD_REQUEST).await,
    };
    let p = credential_limits::set_token_rate_limit(&state.pg, &state.changes, &actor(s.username()), id, rate)
        .await
        .map_err(token_error)?;
    Ok(super::see_other(&view::done(
        "/admin/tokens",
        "token-rate",
        &propagation_notice(&p),
    )))
}

/// POST /admin/teams/{id}/rate.
pub async fn team_rate(
    State(state): State<AppState>,
    Path(id): Path<String>,
    StaffForm(s, form): StaffForm,
) -> Result<Response, AdminError> {
    let id = team_id(&id)?;
    let rate = parse_rate(&form).map_err(|e| AdminError::Api(ApiError::bad_field("per_minute", e.message)))?;
    let p = credential_limits::set_team_rate_limit(&state.pg, &state.changes, &actor(s.username()), id, rate).await;
    team_done(id, "team-rate", p)
}

/// POST /admin/teams/{id}/tools.
pub async fn team_set(
    State(state): State<AppState>,
    Path(id): Path<String>,
    StaffForm(s, form): StaffForm,
) -> Result<Response, AdminError> {
    let id = team_id(&id)?;
    let list = parse(&form).map_err(|e| AdminError::Api(ApiError::bad_field("tool", e.message)))?;
    let p = tool_grants::set_team_tools(&state.pg, &state.changes, &actor(s.username()), id, list.as_ref()).await;
    team_done(id, "team-tools", p)
}

/// A team id in a console path: anything else is no page.
fn team_id(raw: &str) -> Result<uuid::Uuid, AdminError> {
    crate::service::teams::parse_id("id", raw).map_err(|_| AdminError::NotFound)
}

/// After a team write: back to its page with the `done` notice `what`, or
/// the failure as the console shows it.
fn team_done(
    id: uuid::Uuid,
    what: &str,
    written: Result<crate::service::Propagation, TeamError>,
) -> Result<Response, AdminError> {
    let p = written.map_err(|e| match e {
        TeamError::NotFound => AdminError::NotFound,
        other => ApiError::from(other).into(),
    })?;
    Ok(super::see_other(&view::done(
        &format!("/admin/teams/{id}"),
        what,
        &propagation_notice(&p),
    )))
}
