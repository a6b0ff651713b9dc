//! Overview, signing keys and the audit log.

use std::collections::HashMap;

use axum::{
    extract::{Query, State},
    response::Response,
};
use maud::html;

use super::session::{Staff, StaffForm};
use super::view;
use super::{actor, fence, AdminError};
use crate::state::AppState;
use crate::store::pg::{admin as store, keys};

/// GET /admin/: store health (the `get_health` probe) and counts.
pub async fn overview(State(state): State<AppState>, Staff(s): Staff) -> Result<Response, AdminError> {
    let health = crate::service::health::check(&state.pg, &state.knowledge).await;
    let (pg, graph) = (&health.postgres, &health.graph);
    let counts = store::counts(&state.pg).await.unwrap_or_default();
    let libraries = match graph {
        Ok(()) => state.admin.library_count().await.ok(),
        Err(_) => None,
    };
    // The one verdict (`get_health`'s): either store down is `error`.
    let status = health.verdict().as_str();
    let body = html! {
        section.card {
            h2 { "Store health: " (view::badge(status == "ok", status, status)) }
            p { "PostgreSQL: " @match pg { Ok(()) => { "ok" } Err(e) => { span.error { (e) } } } }
            p { "Graph (" (state.settings.graph_flavor) "): " @match graph { Ok(()) => { "ok" } Err(e) => { span.error { (e) } } } }
        }
        (embedding(&state))
        div.grid {
            a.stat href="/admin/libraries" { b { (libraries.map(|n| n.to_string()).unwrap_or_else(|| "?".into())) } "libraries" }
            a.stat href="/admin/teams" { b { (counts.active_teams) } "active teams (" (counts.teams) " in all)" }
            a.stat href="/admin/tokens" { b { (counts.active_tokens) } "active tokens (" (counts.tokens) " in all)" }
            a.stat href="/admin/keys" { b { (counts.active_keys) } "active signing keys (" (counts.keys) " in all)" }
            a.stat href="/admin/users" { b { (counts.users) } "users" }
        }
        p.muted { "MCP endpoint: " code { (state.settings.public_url.trim_end_matches('/')) "/mcp/" } }
    };
    Ok(view::page(&s, "/admin/", "Overview", None, body))
}

/// The overview's embedding card: the model, this replica's backlog and
/// rate (the leader's: a follower embeds nothing), and a remote provider's
/// circuit and last error — the operator's view (`get_health` names the
/// provider by its role only).
fn embedding(state: &AppState) -> maud::Markup {
    let Some(e) = state.search.semantic() else {
        return html! {
            section.card {
                h2 { "Embedding: " (view::badge(false, "on", "off")) }
                p.muted { "No embedding model (MNEMOSYNE_EMBED_MODEL, MNEMOSYNE_EMBED_URL): search is keyword-only." }
            }
        };
    };
    let status = e.status();
    let leading = status.leader.get() == 1;
    let recent = status.recent();
    let window = crate::embed::RATE_WINDOW.as_secs();
    let provider = e.provider_state();
    let up = provider
        .as_ref()
        .is_none_or(|p| p.circuit == crate::embed::Circuit::Closed);
    html! {
        section.card {
            h2 { "Embedding: " (view::badge(up, "ok", "degraded")) }
            p { "Model: " code { (e.id()) } }
            @match &provider {
                None => p { "Provider: in-process" }
                Some(p) => {
                    p { "Provider: " code { (p.address) } ", circuit " b { (p.circuit.as_str()) } }
                    p { "Last error: " @match &p.last_error {
                        None => { "none" }
                        Some((what, at)) => { span.error { (what) } " (" (view::when(Some(*at), "")) ")" }
                    } }
                }
            }
            @if leading {
                p { b { (status.backlog.get()) } " chunks waiting for a vector; "
                    b { (recent) } " embedded in the last " (window) " s ("
                    (format!("{:.1}", recent as f64 / window as f64)) " chunks/s)" }
            } @else {
                p.muted { "Another replica runs the embedding worker: its console shows the backlog and rate." }
            }
        }
    }
}

/// GET /admin/keys: never a secret.
pub async fn keys(
    State(state): State<AppState>,
    Staff(s): Staff,
    Query(q): Query<HashMap<String, String>>,
) -> Result<Response, AdminError> {
    let list = keys::list(&state.pg).await?;
    let body = html! {
        p.muted { "Keys sign team JWTs (the newest active one) and Daedalus' per-turn JWTs (any active one, by kid)." }
        div.table { table {
            thead { tr { th { "kid" } th { "Created" } th { "Retired" } th {} } }
            tbody {
                @for k in &list {
                    tr {
                        td { code { (k.kid) } }
                        td { (view::when(Some(k.created_at), "")) }
                        td { (view::when(k.retired_at, "—")) }
                        td { @if k.retired_at.is_none() {
                            a href={ "/admin/keys/retire?kid=" (view::urlencode(&k.kid)) } { "Retire…" }
                        } }
                    }
                }
            }
        } }
        h2 { "New key" }
        p { "The secret (64 hex characters) is shown once; Daedalus configures the kid and the secret." }
        (view::action(&s, "/admin/keys", &[], "Create a signing key", ""))
    };
    Ok(view::page(
        &s,
        "/admin/keys",
        "Signing keys",
        view::notice_of(&q).as_deref(),
        body,
    ))
}

/// POST /admin/keys: the secret is on this response only.
pub async fn key_create(State(state): State<AppState>, StaffForm(s, _): StaffForm) -> Result<Response, AdminError> {
    let k = crate::service::keys::create(&state.pg, &actor(s.username())).await?;
    let unconfirmed = fence(&state).await;
    let body = html! {
        p { "kid: " code { (k.kid) } }
        (view::secret("The secret", &k.secret_hex))
        p { a href="/admin/keys" { "Done" } }
    };
    Ok(view::page(
        &s,
        "/admin/keys",
        "Signing key created",
        unconfirmed.as_deref(),
        body,
    ))
}

/// GET /admin/keys/retire?kid=…: the confirmation.
pub async fn key_retire_confirm(
    State(state): State<AppState>,
    Staff(s): Staff,
    Query(q): Query<HashMap<String, String>>,
) -> Result<Response, AdminError> {
    let kid = q.get("kid").cloned().unwrap_or_default();
    let list = keys::list(&state.pg).await?;
    if !list.iter().any(|k| k.kid == kid && k.retired_at.is_none()) {
        return Err(AdminError::NotFound);
    }
    let last = list.iter().filter(|k| k.retired_at.is_none()).count() == 1;
    let body = html! {
        section.card {
            p { b { "Every JWT signed with " code { (kid) } " stops working" } " from the next request on, on every replica: \
                 team JWTs it signed (their teams need a rotation to get a new one) and Daedalus' per-turn JWTs \
                 signed with it. This cannot be undone." }
            @if last {
                p.error { "This is the last active key: team JWTs cannot be minted or rotated until a new key is created." }
            }
            (view::action(&s, "/admin/keys/retire", &[("kid", &kid)], "Retire the key", "danger"))
            " " a href="/admin/keys" { "Cancel" }
        }
    };
    Ok(view::page(&s, "/admin/keys", "Retire a signing key?", None, body))
}

/// POST /admin/keys/retire.
pub async fn key_retire(State(state): State<AppState>, StaffForm(s, form): StaffForm) -> Result<Response, AdminError> {
    if !crate::service::keys::retire(&state.pg, &actor(s.username()), form.get("kid")).await? {
        return Err(AdminError::NotFound);
    }
    let unconfirmed = fence(&state).await;
    Ok(super::see_other(&view::done(
        "/admin/keys",
        "key-retired",
        &unconfirmed,
    )))
}

/// GET /admin/audit?action=…&actor=…: newest first.
pub async fn audit(
    State(state): State<AppState>,
    Staff(s): Staff,
    Query(q): Query<HashMap<String, String>>,
) -> Result<Response, AdminError> {
    let action = q.get("action").map(String::as_str).filter(|a| !a.is_empty());
    let by = q.get("actor").map(|a| a.trim()).filter(|a| !a.is_empty());
    let surface = q.get("surface").map(String::as_str).filter(|a| !a.is_empty());
    let filter = crate::store::pg::audit::AuditFilter {
        since: None,
        action: action.map(str::to_owned),
        actor: by.map(str::to_owned),
        surface: surface.map(str::to_owned),
    };
    let events = crate::store::pg::audit::newest(&state.pg, &filter, 500).await?;
    let actions = crate::store::pg::audit::actions(&state.pg).await?;
    let body = html! {
        form.card.row method="get" action="/admin/audit" {
            label { "Action" select name="action" {
                option value="" { "any" }
                @for a in &actions { option value=(a) selected[action == Some(a.as_str())] { (a) } }
            } }
            label { "Actor" input type="text" name="actor" value=(by.unwrap_or("")) placeholder="e.g. admin:alice, cli, daedalus-service"; }
            label { "Surface" select name="surface" {
                option value="" { "any" }
                @for a in ["rest", "mcp", "console", "cli"] { option value=(a) selected[surface == Some(a)] { (a) } }
            } }
            button type="submit" { "Filter" }
        }
        div.table { table {
            thead { tr { th { "When" } th { "Actor" } th { "Surface" } th { "Action" } th { "Target" } th { "Detail" } } }
            tbody {
                @for e in &events {
                    tr {
                        td { (view::when(Some(e.at), "")) }
                        td { (e.actor) }
                        td { (e.surface) }
                        td { (e.action) }
                        td { code { (e.target.as_deref().unwrap_or("")) } }
                        td { code { (e.detail.to_string()) } }
                    }
                }
                @if events.is_empty() { tr { td colspan="6" .muted { "No events." } } }
            }
        } }
    };
    Ok(view::page(&s, "/admin/audit", "Audit", None, body))
}
