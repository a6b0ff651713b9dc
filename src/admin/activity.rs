//! A library's read activity (issue 53): who read it, with which tool, how
//! many calls and results, per hour — for its owners and managers, and for
//! staff (every library's); anyone else is refused. A table, and the same
//! rows as JSON lines for download.

use std::collections::HashMap;

use axum::{
    extract::{Query, State},
    http::{header, StatusCode},
    response::{IntoResponse, Response},
};
use chrono::Utc;
use maud::html;

use super::session::{Person, Session};
use super::view::{self, urlencode};
use super::AdminError;
use crate::error::ApiError;
use crate::service::activity::{self, ActivityError, Viewer};
use crate::service::audit::parse_since;
use crate::state::AppState;

fn viewer(s: &Session) -> Viewer<'_> {
    if s.user.is_staff {
        Viewer::Staff
    } else {
        Viewer::User(s.username())
    }
}

fn refused(e: ActivityError) -> AdminError {
    match e {
        ActivityError::BadField(b) => ApiError::bad_field(&b.field, b.message).into(),
        ActivityError::Refused(_) => ApiError::Forbidden(e.to_string()).into(),
        ActivityError::Store(s) => s.into(),
    }
}

/// `uid` and `since` (default `7d`) from the query.
fn params(q: &HashMap<String, String>) -> Result<(String, String, chrono::DateTime<Utc>), AdminError> {
    let uid = q.get("uid").cloned().unwrap_or_default();
    let since_raw = q.get("since").cloned().unwrap_or_else(|| "7d".to_owned());
    let since = parse_since(&since_raw, Utc::now()).map_err(|m| AdminError::from(ApiError::bad_field("since", m)))?;
    Ok((uid, since_raw, since))
}

/// GET /admin/me/library/activity?uid=…&since=7d.
pub async fn page(
    State(state): State<AppState>,
    Person(s): Person,
    Query(q): Query<HashMap<String, String>>,
) -> Result<Response, AdminError> {
    let (uid, since_raw, since) = params(&q)?;
    let rows = activity::report(&state.pg, viewer(&s), &uid, since)
        .await
        .map_err(refused)?;
    let writes = activity::write_events(&state.pg, viewer(&s), &uid, since)
        .await
        .map_err(refused)?;
    let (calls, results) = rows.iter().fold((0, 0), |(c, r), x| (c + x.calls, r + x.results));
    let export = format!(
        "/admin/me/library/activity.jsonl?uid={}&since={}",
        urlencode(&uid),
        urlencode(&since_raw)
    );
    let body = html! {
        p { "Library " code { (uid) } " — reads since " (since.format("%Y-%m-%d %H:%M UTC"))
            ": " b { (calls) } " call(s), " b { (results) } " result(s)." }
        p.muted { "Counted per hour by every replica and written every "
                  (state.settings.usage_flush_secs) " s: the latest reads may not be here yet. "
                  "Query text is not kept unless the operator chose to." }
        form.row method="get" action="/admin/me/library/activity" {
            input type="hidden" name="uid" value=(uid);
            label { "Since (24h, 7d, 2026-11-01)" input type="text" name="since" value=(since_raw); }
            button type="submit" { "Show" }
            a href=(export) { "Download as JSON lines" }
        }
        div.table { table {
            thead { tr { th { "Hour (UTC)" } th { "Reader" } th { "User / team" } th { "Tool" }
                         th.num { "Calls" } th.num { "Results" } @if rows.iter().any(|r| r.query.is_some()) { th { "Query" } } } }
            tbody {
                @for r in &rows {
                    tr {
                        td { (r.hour.format("%Y-%m-%d %H:00")) }
                        td { (r.reader_kind) " " code { (r.reader_id) } }
                        td { (r.user.as_deref().or(r.team_name.as_deref()).unwrap_or("")) }
                        td { (r.tool) }
                        td.num { (r.calls) } td.num { (r.results) }
                        @if let Some(qt) = &r.query { td { code { (qt) } } }
                    }
                }
                @if rows.is_empty() { tr { td colspan="6" .muted { "No reads in this period." } } }
            }
        } }
        h2 { "Changes" }
        p.muted { "The library's write events in the same period (the audit trail), newest first." }
        div.table { table {
            thead { tr { th { "At (UTC)" } th { "Actor" } th { "Action" } th { "Target" } th { "Detail" } } }
            tbody {
                @for e in &writes {
                    tr {
                        td { (e.at.format("%Y-%m-%d %H:%M:%S")) }
                        td { (e.actor) }
                        td { (e.action) }
                        td { code { (e.target.as_deref().unwrap_or("")) } }
                        td { code { (e.detail.to_string()) } }
                    }
                }
                @if writes.is_empty() { tr { td colspan="5" .muted { "No changes in this period." } } }
            }
        } }
    };
    Ok(view::page(
        &s,
        if s.user.is_staff {
            "/admin/libraries"
        } else {
            "/admin/me"
        },
        "Library activity",
        None,
        body,
    ))
}

/// GET /admin/me/library/activity.jsonl?uid=…&since=…: the rows as JSON lines.
pub async fn export(
    State(state): State<AppState>,
    Person(s): Person,
    Query(q): Query<HashMap<String, String>>,
) -> Result<Response, AdminError> {
    let (uid, _, since) = params(&q)?;
    let mut out = Vec::new();
    activity::export(&state.pg, viewer(&s), &uid, since, &mut out)
        .await
        .map_err(refused)?;
    let name = format!(
        "attachment; filename=\"activity-{}.jsonl\"",
        uid.replace(|c: char| !c.is_ascii_alphanumeric() && c != '_' && c != '-', "_")
    );
    Ok((
        StatusCode::OK,
        [
            (header::CONTENT_TYPE, "application/x-ndjson".to_owned()),
            (header::CONTENT_DISPOSITION, name),
        ],
        out,
    )
        .into_response())
}

/// The link to a library's activity page.
pub fn link(uid: &str) -> String {
    format!("/admin/me/library/activity?uid={}", urlencode(uid))
}
