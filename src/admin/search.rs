//! The admin search (spec §3.3): one box, an optional library filter, results
//! with their evidence across every library — and "search as": the resolved
//! libraries and results of a team or token, resolved by the server's own
//! `Authenticator` exactly as on `/mcp`.

use std::collections::HashMap;

use axum::{
    extract::{Query, State},
    response::Response,
};
use maud::{html, Markup};

use super::session::Staff;
use super::view;
use super::AdminError;
use crate::auth::AuthError;
use crate::search::engine::{Search, SearchHit, MAX_QUERY_CHARS};
use crate::state::AppState;
use crate::store::graph::admin::LibraryName;
use crate::store::graph::knowledge::ScopedGraph;
use crate::store::pg::{teams, tokens};

/// Results per search.
const LIMIT: usize = 50;

/// Whose view a search takes: every library (admin), or a principal's.
enum As {
    Everything,
    Principal {
        label: String,
        /// Its view of the graph, or why `/mcp` would refuse it.
        outcome: Result<Box<ScopedGraph>, String>,
    },
}

async fn resolve_as(state: &AppState, raw: &str) -> Result<As, AdminError> {
    if raw.is_empty() {
        return Ok(As::Everything);
    }
    let refused = |e: AuthError| match e {
        AuthError::Refused(f) => Ok(format!("refused on /mcp: {} ({})", f.message(), f.reason())),
        AuthError::Unavailable(store) => Err(AdminError::Api(crate::error::ApiError::StoreUnavailable(store))),
        other => Ok(format!("refused: {other:?}")),
    };
    if let Some(id) = raw.strip_prefix("team:") {
        let id = uuid::Uuid::parse_str(id).map_err(|_| AdminError::NotFound)?;
        let label = format!("team {id}");
        let outcome = match state.auth.resolve_team_now(id).await {
            Ok(p) => Ok(Box::new(state.knowledge.scoped(&p))),
            Err(e) => Err(refused(e)?),
        };
        return Ok(As::Principal { label, outcome });
    }
    if let Some(id) = raw.strip_prefix("token:") {
        let id: i64 = id.parse().map_err(|_| AdminError::NotFound)?;
        let hash = tokens::hash_of(&state.pg, id).await?.ok_or(AdminError::NotFound)?;
        let label = format!("token {id}");
        let outcome = match state.auth.resolve_stored_token(&hash).await {
            Ok(p) => Ok(Box::new(state.knowledge.scoped(&p))),
            Err(e) => Err(refused(e)?),
        };
        return Ok(As::Principal { label, outcome });
    }
    Err(AdminError::NotFound)
}

/// What the form offers: the libraries to filter on, and the teams and
/// tokens to search as.
struct Choices {
    libs: Vec<LibraryName>,
    teams: Vec<teams::TeamRow>,
    tokens: Vec<tokens::TokenInfo>,
}

/// GET /admin/search?q=…&library=…&as=….
pub async fn search(
    State(state): State<AppState>,
    Staff(s): Staff,
    Query(q): Query<HashMap<String, String>>,
) -> Result<Response, AdminError> {
    let text = q.get("q").map(|t| t.trim()).unwrap_or("");
    let library = q.get("library").map(String::as_str).unwrap_or("");
    let as_raw = q.get("as").map(String::as_str).unwrap_or("");
    let choices = Choices {
        libs: state.admin.library_list().await?,
        teams: teams::list(&state.pg).await?,
        tokens: tokens::list(&state.pg, None).await?,
    };
    let who = resolve_as(&state, as_raw).await?;
    let view = view_of(&state, &who, &choices.libs, library);
    let too_long = text.chars().count() > MAX_QUERY_CHARS;
    let hits = match (&view, text.is_empty() || too_long) {
        (Some(v), false) => {
            let engine = &state.search;
            Some(
                engine
                    .run(v, &Search::keyword(text, LIMIT).mode(engine.default_mode()))
                    .await?,
            )
        }
        _ => None,
    };
    let body = html! {
        (form(text, too_long, library, as_raw, &choices))
        @if let As::Principal { label, outcome } = &who { (as_card(label, outcome)) }
        @if let Some(hits) = &hits { (results(hits)) }
    };
    Ok(view::page(&s, "/admin/search", "Search", None, body))
}

/// The view a search reads, narrowed to `library` when one is chosen; none
/// when `/mcp` would refuse the principal. Spec §3.3: an admin search's
/// resolved libraries are every library uid; "search as" reads exactly what
/// the principal's view reads.
fn view_of(state: &AppState, who: &As, libs: &[LibraryName], library: &str) -> Option<ScopedGraph> {
    let view = match who {
        As::Everything => Some(state.knowledge.scoped(&crate::auth::resolver::every_library(
            libs.iter().map(|l| l.uid.clone()),
        ))),
        As::Principal { outcome: Ok(view), .. } => Some(view.as_ref().clone()),
        As::Principal { outcome: Err(_), .. } => None,
    };
    view.map(|v| {
        if library.is_empty() {
            v
        } else {
            v.narrow(&[library.to_owned()])
        }
    })
}

/// The search box, the library filter and the "search as" choice.
fn form(text: &str, too_long: bool, library: &str, as_raw: &str, c: &Choices) -> Markup {
    html! {
        form.card.stack method="get" action="/admin/search" {
            label { "Search" input type="search" name="q" value=(text) maxlength=(MAX_QUERY_CHARS) placeholder="words to find"; }
            @if too_long { p.error { "The query is at most " (MAX_QUERY_CHARS) " characters." } }
            div.row {
                label { "Library"
                    select name="library" {
                        option value="" { "every library" }
                        @for l in &c.libs { option value=(l.uid) selected[library == l.uid] { (l.name) " — " (l.uid) } }
                    }
                }
                label { "Search as"
                    select name="as" {
                        option value="" { "admin (every library)" }
                        @for t in &c.teams {
                            @let v = format!("team:{}", t.id);
                            option value=(v) selected[as_raw == v] { "team " (t.name) @if !t.active { " (deactivated)" } }
                        }
                        @for t in &c.tokens {
                            @let v = format!("token:{}", t.id);
                            option value=(v) selected[as_raw == v] { "token " (t.id) " " (t.name) " (" (t.username) ")" @if !t.active { " (revoked)" } }
                        }
                    }
                }
            }
            button type="submit" { "Search" }
        }
    }
}

/// Whose view "search as" took: its resolved libraries, or why `/mcp` would
/// refuse it.
fn as_card(label: &str, outcome: &Result<Box<ScopedGraph>, String>) -> Markup {
    html! {
        section.card {
            h2 { "As " (label) }
            @match outcome {
                Ok(view) => {
                    @let sc = view.scope();
                    p { "resolved_libraries (" (sc.len()) "): "
                        @if sc.is_empty() { span.muted { "none — it sees nothing (fail-closed)" } }
                        @for l in sc.uids() { code { (l) } " " } }
                }
                Err(why) => { p.error { (why) } }
            }
        }
    }
}

/// The hits with their evidence.
fn results(hits: &[SearchHit]) -> Markup {
    html! {
        h2 { (hits.len()) " result(s)" }
        div.table { table {
            thead { tr { th { "Score" } th { "Library" } th { "Collection" } th { "Item" } th { "Chunk" } th { "Text" } } }
            tbody {
                @for h in hits {
                    tr {
                        td.num { (format!("{:.3}", h.score)) }
                        td { code { (h.library_uid) } }
                        td { code { (h.collection_uid) } }
                        td { (h.item_title) br; code { (h.item_uid) } }
                        td { code { (h.chunk_uid) } " #" (h.ordinal) }
                        td { (excerpt(&h.text)) }
                    }
                }
                @if hits.is_empty() { tr { td colspan="6" .muted { "Nothing found." } } }
            }
        } }
    }
}

fn excerpt(text: &str) -> String {
    let mut out: String = text.chars().take(300).collect();
    if text.chars().count() > 300 {
        out.push('…');
    }
    out
}
