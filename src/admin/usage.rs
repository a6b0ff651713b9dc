//! Usage (issue 24): the tokens, teams, per-turn callers and tools with the
//! most tool calls over the last days, from the hourly counts every replica
//! flushes (`usage_hourly`; the current interval is not in them yet).

use std::collections::HashMap;

use axum::{
    extract::{Query, State},
    response::Response,
};
use maud::{html, Markup};

use super::session::Staff;
use super::{view, AdminError};
use crate::state::AppState;
use crate::store::pg::usage::{self, CredentialUsage};

/// The period shown, and the longest one offered.
const DEFAULT_DAYS: u32 = 7;
const MAX_DAYS: u32 = 90;
/// Rows per table.
const TOP: i64 = 20;

fn credentials(title: &str, rows: &[CredentialUsage]) -> Markup {
    html! {
        h2 { (title) }
        div.table { table {
            thead { tr { th { "Credential" } th { "Name" } th.num { "Calls" } th.num { "Refused" } th.num { "Errors" } } }
            tbody {
                @for r in rows {
                    tr {
                        td { code { (r.credential) } }
                        td { (r.name.as_deref().unwrap_or("")) }
                        td.num { (r.calls) } td.num { (r.refused) } td.num { (r.errors) }
                    }
                }
                @if rows.is_empty() { tr { td colspan="5" .muted { "No calls." } } }
            }
        } }
    }
}

/// GET /admin/usage[?days=N].
pub async fn page(
    State(state): State<AppState>,
    Staff(s): Staff,
    Query(q): Query<HashMap<String, String>>,
) -> Result<Response, AdminError> {
    let days = q
        .get("days")
        .and_then(|d| d.parse::<u32>().ok())
        .filter(|d| (1..=MAX_DAYS).contains(d))
        .unwrap_or(DEFAULT_DAYS);
    let tokens = usage::top_credentials(&state.pg, "token", days, TOP).await?;
    let teams = usage::top_credentials(&state.pg, "team", days, TOP).await?;
    let per_turn = usage::top_credentials(&state.pg, "per_turn", days, TOP).await?;
    let tools = usage::by_tool(&state.pg, days).await?;
    let body = html! {
        p.muted {
            "Tool calls over the last " (days) " days, counted per hour by every replica and written every "
            (state.settings.usage_flush_secs) " s (the current interval is not here yet)."
        }
        (credentials("Top tokens", &tokens))
        (credentials("Top teams", &teams))
        (credentials("Per-turn callers", &per_turn))
        h2 { "Tools" }
        div.table { table {
            thead { tr { th { "Tool" } th.num { "Calls" } th.num { "Refused" } th.num { "Errors" } } }
            tbody {
                @for t in &tools {
                    tr { td { code { (t.tool) } } td.num { (t.calls) } td.num { (t.refused) } td.num { (t.errors) } }
                }
                @if tools.is_empty() { tr { td colspan="4" .muted { "No calls." } } }
            }
        } }
    };
    Ok(view::page(&s, "/admin/usage", "Usage", None, body))
}
