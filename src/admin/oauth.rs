//! The OAuth consent page (issue 48) and the grants on the token pages.
//!
//! `/oauth/authorize` checks a client's request and sends the browser here,
//! where the console's session cookie is. The person signs in (the console's
//! own sign-in, throttles and session), then sees the client's name and
//! redirect host (and, for a Client ID Metadata Document, the host serving
//! the document), the libraries they may grant (the token form's picker:
//! those they own or manage, each with its own checkbox) and the tools
//! within their ceiling — nothing checked: the page grants nothing until the
//! person picks — and a lifetime. The form carries the session's
//! CSRF token and names the pending request, which holds the client, the
//! redirect and the PKCE challenge: an answer cannot be replayed for another
//! client. Like every console page it cannot be framed.

use std::collections::HashMap;

use axum::{
    extract::{Query, State},
    http::{header, HeaderValue, StatusCode},
    response::{IntoResponse, Redirect, Response},
};
use maud::{html, Markup};

use super::session::{Person, PersonForm, Session, CONSENT_NEXT};
use super::{view, AdminError};
use crate::service::oauth::{self as service, Consent, Issuer};
use crate::state::AppState;
use crate::store::pg::oauth as store;

fn gone() -> Response {
    (
        StatusCode::BAD_REQUEST,
        view::bare(
            "Request expired",
            "This sign-in request is unknown, has expired or was already answered. Start again from your MCP client.",
        ),
    )
        .into_response()
}

fn off() -> Response {
    (
        StatusCode::NOT_FOUND,
        view::bare("Not found", "There is no authorization server here."),
    )
        .into_response()
}

/// The origin a redirect goes to, as a CSP source (`form-action` governs
/// the redirect that follows the consent form's POST).
fn csp_source(redirect_uri: &str) -> Option<String> {
    let u = reqwest::Url::parse(redirect_uri).ok()?;
    match u.host_str() {
        Some(_) if matches!(u.scheme(), "http" | "https") => Some(u.origin().ascii_serialization()),
        _ => Some(format!("{}:", u.scheme())),
    }
    .filter(|s| s.bytes().all(|b| b.is_ascii_graphic() && b != b';' && b != b','))
}

/// GET /admin/oauth/consent?request=…
pub async fn consent(
    State(state): State<AppState>,
    person: Result<Person, AdminError>,
    Query(q): Query<HashMap<String, String>>,
) -> Result<Response, AdminError> {
    if state.settings.oauth_issuer().is_none() {
        return Ok(off());
    }
    let id = q.get("request").map(String::as_str).unwrap_or("");
    let Some(view) = service::pending(&state.pg, id).await.map_err(oauth_store)? else {
        return Ok(gone());
    };
    let s = match person {
        Ok(Person(s)) => s,
        Err(AdminError::SignIn) => {
            let next = format!("{CONSENT_NEXT}{id}");
            return Ok(Redirect::to(&format!("/admin/login?next={}", view::urlencode(&next))).into_response());
        }
        Err(e) => return Err(e),
    };
    let libraries = crate::service::tokens::picker(&state.pg, &state.admin, s.user.user_id).await?;
    let tools = service::tool_ceiling(&state.pg, s.user.user_id, &crate::mcp::TOOLS).await?;
    let body = consent_form(&s, id, &view, &libraries, &tools);
    let mut resp = view::page(&s, "/admin/me", "Connect an MCP client", None, body);
    let extra = csp_source(&view.request.redirect_uri).unwrap_or_default();
    if let Ok(v) = HeaderValue::from_str(&format!(
        "default-src 'none'; style-src 'self'; img-src 'self'; form-action 'self' {extra}; \
         frame-ancestors 'none'; base-uri 'none'"
    )) {
        resp.headers_mut().insert(header::CONTENT_SECURITY_POLICY, v);
    }
    Ok(resp)
}

fn consent_form(
    s: &Session,
    id: &str,
    view: &service::ConsentView,
    libraries: &[(String, String)],
    tools: &[String],
) -> Markup {
    let client = &view.client;
    let redirect_host = reqwest::Url::parse(&view.request.redirect_uri)
        .ok()
        .and_then(|u| u.host_str().map(str::to_owned))
        .unwrap_or_else(|| view.request.redirect_uri.clone());
    let name = if client.client_name.is_empty() {
        "An unnamed client"
    } else {
        &client.client_name
    };
    // A metadata-document client is described by whoever serves its URL:
    // the person sees that site, and whether the redirect goes elsewhere.
    let document = (client.source == "cimd")
        .then(|| reqwest::Url::parse(&client.client_id).ok())
        .flatten();
    let document_host = document.as_ref().map(|u| match u.port() {
        Some(p) => format!("{}:{p}", u.host_str().unwrap_or("")),
        None => u.host_str().unwrap_or("").to_owned(),
    });
    let elsewhere = document
        .as_ref()
        .is_some_and(|u| u.host_str() != Some(redirect_host.as_str()));
    html! {
        section.card.stack {
            p { b { (name) } " asks to read your Mnemosyne libraries." }
            p.muted { "It will be sent back to " b { code { (redirect_host) } } "." }
            @if let Some(host) = &document_host {
                p.muted { "It describes itself (its name, where it may be sent back) in a document served by "
                          b { code { (host) } } " (" code { (client.client_id) } "). "
                          "Only that site vouches for the name." }
                @if elsewhere {
                    p { "Its redirect goes to another host than the one describing it: allow only if you started this sign-in." }
                }
            } @else {
                p.muted { "Client " code { (client.client_id) } " ("
                          (if client.source == "cli" { "added by an operator" } else { "registered itself" }) ")." }
            }
            p.muted { "Nothing is granted until you pick it. Grant only what it needs; you can revoke it any time on "
                      a href="/admin/me" { "My tokens" } "." }
        }
        form.card.stack method="post" action="/admin/oauth/consent" {
            (view::csrf(s))
            input type="hidden" name="request" value=(id);
            fieldset {
                legend { "Libraries it may read" }
                @if libraries.is_empty() {
                    p.muted { "You are not owner or manager of any library: a grant reads nothing." }
                }
                @for (uid, lib) in libraries {
                    label.check {
                        input type="checkbox" name="library" value=(uid);
                        span { (lib) " " code { (uid) } }
                    }
                }
            }
            fieldset {
                legend { "Tools it may call" }
                p.muted { "None ticked: it can call no tool." }
                @for t in tools {
                    label.check {
                        input type="checkbox" name="tool" value=(t);
                        span { code { (t) } }
                    }
                }
            }
            label { "For"
                select name="lifetime" {
                    @for d in service::LIFETIME_DAYS {
                        option value=(d) selected[d == service::DEFAULT_LIFETIME_DAYS] {
                            (d) @if d == 1 { " day" } @else { " days" }
                        }
                    }
                }
            }
            p.muted { "Access tokens last an hour and are renewed while the grant lives." }
            div.row {
                button type="submit" name="decision" value="approve" { "Allow" }
                button.danger type="submit" name="decision" value="deny" { "Deny" }
            }
        }
    }
}

fn oauth_store(e: service::OAuthError) -> AdminError {
    match e {
        service::OAuthError::Store(e) => e.into(),
        other => AdminError::Api(crate::error::ApiError::BadRequest {
            field: None,
            message: other.to_string(),
        }),
    }
}

/// POST /admin/oauth/consent: the person's answer (CSRF-checked, once).
pub async fn answer(State(state): State<AppState>, PersonForm(s, form): PersonForm) -> Result<Response, AdminError> {
    if state.settings.oauth_issuer().is_none() {
        return Ok(off());
    }
    let issuer = Issuer::new(&state.settings.public_url);
    let libraries = form.all("library");
    let tools = form.all("tool");
    let consent = Consent {
        approve: form.get("decision") == "approve",
        libraries: &libraries,
        tools: &tools,
        lifetime_days: form.get("lifetime").parse().unwrap_or(service::DEFAULT_LIFETIME_DAYS),
        known_tools: &crate::mcp::TOOLS,
    };
    let answered = service::answer(
        &state.pg,
        &issuer,
        form.get("request"),
        s.user.user_id,
        s.username(),
        &consent,
    )
    .await
    .map_err(oauth_store)?;
    let Some((to, outcome)) = answered else {
        return Ok(gone());
    };
    let label = match &outcome {
        Ok(_) => "ok",
        Err(e) => e.code(),
    };
    state.metrics.oauth_flows.with_label_values(&["consent", label]).inc();
    match outcome {
        Ok(grant) => tracing::info!(user = ?s.username(), grant, "oauth: grant made"),
        Err(e) => tracing::info!(user = ?s.username(), error = e.code(), "oauth: consent refused"),
    }
    Ok(Redirect::to(&to).into_response())
}

/// The grants table of the token pages (client, libraries, tools, last use)
/// with a revoke button per live grant.
pub fn grants_table(s: &Session, list: &[store::Grant], revoke_path: &str, show_user: bool) -> Markup {
    let now = chrono::Utc::now();
    html! {
        div.table { table {
            thead { tr {
                th { "Grant" } @if show_user { th { "User" } } th { "Client" } th { "Libraries" } th { "Tools" }
                th { "Last used" } th { "Expires" } th { "Active" } th {}
            } }
            tbody {
                @for g in list {
                    @let live = g.active && g.expires_at > now;
                    tr {
                        td.num { (g.id) }
                        @if show_user { td { (g.username) } }
                        td { (if g.client_name.is_empty() { "(unnamed)" } else { &g.client_name }) " " code { (g.client_id) } }
                        td {
                            @if g.allowed_libraries.0.is_empty() { span.muted { "none (reads nothing)" } }
                            @for l in &g.allowed_libraries.0 { code { (l) } " " }
                        }
                        td { (super::tools::summary(g.allowed_tools.as_deref())) }
                        td { (view::when(g.last_used_at, "never")) }
                        td { (view::when(Some(g.expires_at), "never")) }
                        td { (view::badge(live, "active", if g.active { "expired" } else { "revoked" })) }
                        td { @if live {
                            (view::action(s, revoke_path, &[("id", &g.id.to_string())], "Revoke", "danger"))
                        } }
                    }
                }
                @if list.is_empty() { tr { td colspan="9" .muted { "No connected clients." } } }
            }
        } }
    }
}

/// POST /admin/me/grants/revoke: revoke one of your own grants.
pub async fn me_revoke(State(state): State<AppState>, PersonForm(s, form): PersonForm) -> Result<Response, AdminError> {
    revoke(&state, &s, &form, Some(s.username()), "/admin/me").await
}

/// POST /admin/grants/revoke: staff revoke anyone's grant.
pub async fn staff_revoke(
    State(state): State<AppState>,
    super::session::StaffForm(s, form): super::session::StaffForm,
) -> Result<Response, AdminError> {
    revoke(&state, &s, &form, None, "/admin/tokens").await
}

async fn revoke(
    state: &AppState,
    s: &Session,
    form: &super::FormData,
    owner: Option<&str>,
    back: &str,
) -> Result<Response, AdminError> {
    let Ok(id) = form.get("id").parse::<i64>() else {
        return Err(AdminError::NotFound);
    };
    match service::revoke_grant(&state.pg, &state.changes, &super::actor(s.username()), id, owner)
        .await
        .map_err(oauth_store)?
    {
        Some(p) => Ok(super::see_other(&view::done(
            back,
            "grant-revoked",
            &super::propagation_notice(&p),
        ))),
        None => Err(AdminError::NotFound),
    }
}
