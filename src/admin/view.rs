//! The console's page frame and shared bits of markup (maud escapes every
//! interpolated value).

use axum::response::{Html, IntoResponse, Response};
use chrono::{DateTime, Utc};
use maud::{html, Markup, DOCTYPE};

use super::frame::head;
use super::session::Session;

const NAV: &[(&str, &str)] = &[
    ("/admin/", "Overview"),
    ("/admin/libraries", "Libraries"),
    ("/admin/tokens", "Tokens"),
    ("/admin/teams", "Teams"),
    ("/admin/keys", "Signing keys"),
    ("/admin/users", "Users"),
    ("/admin/search", "Search"),
    ("/admin/usage", "Usage"),
    ("/admin/audit", "Audit"),
];

/// A page of a signed-in user: navigation (staff), who is signed in, sign-out.
pub fn page(s: &Session, current: &str, title: &str, notice: Option<&str>, body: Markup) -> Response {
    let m = html! {
        (DOCTYPE)
        html lang="en" {
            (head(title))
            body {
                header.top {
                    a.brand href=(if s.user.is_staff { "/admin/" } else { "/admin/me" }) { "Mnemosyne admin" }
                    nav {
                        @if s.user.is_staff {
                            @for (href, label) in NAV {
                                a href=(href) aria-current=[(*href == current).then_some("page")] { (label) }
                            }
                        }
                        a href="/admin/me" aria-current=[("/admin/me" == current).then_some("page")] { "My tokens" }
                    }
                    form.signout method="post" action="/admin/logout" {
                        (csrf(s))
                        span.who { (s.username()) }
                        button.link type="submit" { "Sign out" }
                    }
                }
                main {
                    h1 { (title) }
                    @if let Some(n) = notice {
                        p.notice role="status" { (n) }
                    }
                    (body)
                }
            }
        }
    };
    Html(m.into_string()).into_response()
}

/// A page with no session (errors, sign-in).
pub fn bare(title: &str, text: &str) -> Html<String> {
    Html(
        html! {
            (DOCTYPE)
            html lang="en" {
                (head(title))
                body {
                    main.narrow {
                        h1 { (title) }
                        p { (text) }
                        p { a href="/admin/" { "Back to the console" } }
                    }
                }
            }
        }
        .into_string(),
    )
}

/// The hidden fields every form carries: the session's CSRF token, and a
/// fresh `once` (its render time and a random value) that makes a second
/// submission of this very form (a reload of its result page) a refusal
/// instead of a repeat, and a submission after its lifetime too.
pub fn csrf(s: &Session) -> Markup {
    html! {
        input type="hidden" name="csrf" value=(s.csrf());
        input type="hidden" name="once" value=(super::session::once_value());
    }
}

/// A one-button POST form (revoke, rotate…) with hidden fields.
pub fn action(s: &Session, path: &str, fields: &[(&str, &str)], label: &str, class: &str) -> Markup {
    html! {
        form.inline method="post" action=(path) {
            (csrf(s))
            @for (k, v) in fields {
                input type="hidden" name=(k) value=(v);
            }
            button class=(class) type="submit" { (label) }
        }
    }
}

/// A field's error message under it.
pub fn field_error(errors: &FieldError, field: &str) -> Markup {
    html! {
        @if errors.field == field {
            p.error role="alert" { (errors.message) }
        }
    }
}

/// One refused field and why (empty field: none).
#[derive(Clone, Debug, Default)]
pub struct FieldError {
    pub field: String,
    pub message: String,
}

impl FieldError {
    pub fn new(field: &str, message: impl Into<String>) -> Self {
        FieldError {
            field: field.to_owned(),
            message: message.into(),
        }
    }

    pub fn none() -> Self {
        FieldError::default()
    }

    /// An error not tied to one field (shown at the top of the form).
    pub fn general(&self) -> Markup {
        html! {
            @if !self.message.is_empty() && self.field.is_empty() {
                p.error role="alert" { (self.message) }
            }
        }
    }
}

pub fn when(t: Option<DateTime<Utc>>, none: &str) -> String {
    t.map(|t| t.format("%Y-%m-%d %H:%M UTC").to_string())
        .unwrap_or_else(|| none.to_owned())
}

/// A secret shown once, in a box that reads well and selects easily.
pub fn secret(label: &str, value: &str) -> Markup {
    html! {
        div.secret {
            p.warn { (label) " — copy it now: it is not shown again." }
            pre.copy { code { (value) } }
        }
    }
}

/// Yes/no badge.
pub fn badge(on: bool, yes: &str, no: &str) -> Markup {
    html! {
        @if on { span.badge.ok { (yes) } } @else { span.badge.off { (no) } }
    }
}

/// Notices after a redirect: a fixed set of keys, never text from the URL.
pub fn notice(key: &str) -> Option<&'static str> {
    Some(match key {
        "token-revoked" => "Token revoked: it is refused from the next request on.",
        "grant-revoked" => "Grant revoked: its client's tokens are refused from the next request on.",
        "token-tools" => "Tool permissions saved: the token uses only those tools from the next request on.",
        "token-rate" => "Rate limit saved: it applies from the next request on.",
        "team-rate" => "Rate limit saved: it applies from the next request on.",
        "team-tools" => "Tool permissions saved: the team's JWT uses only those tools from the next request on.",
        "team-workspaces" => "Workspaces saved: the team's JWT resolves to them from the next request on.",
        "team-libraries" => "Libraries saved: the team's JWT resolves to them, after its workspaces' libraries, from the next request on.",
        "team-deactivated" => "Team deactivated: its JWT is refused from the next request on.",
        "key-retired" => "Signing key retired: every JWT signed with it is refused from the next request on.",
        "user-created" => "User created.",
        "user-enabled" => "User enabled.",
        "user-disabled" => "User disabled: their tokens and console sessions stop from the next request on.",
        "user-staff" => "Staff flag saved.",
        "user-ceiling" => "Ceiling saved: every token of the user follows it from its next request.",
        "user-password" => "Password set; the user's console sessions were ended.",
        "granted" => "Role granted.",
        "revoked" => "Role revoked.",
        "library-renamed" => "Library renamed.",
        "library-deleted" => "Library deleted with its content, its memberships and its place in every token's scope.",
        "unconfirmed" => {
            "The change is committed, but not every replica confirmed it in time; those replicas no longer \
             use cached credentials."
        }
        _ => return None,
    })
}

/// `?ok=<key>` (and `&unconfirmed=1`) → the notice to show.
pub fn notice_of(query: &std::collections::HashMap<String, String>) -> Option<String> {
    let mut parts: Vec<&str> = Vec::new();
    if let Some(n) = query.get("ok").and_then(|k| notice(k)) {
        parts.push(n);
    }
    if query.contains_key("unconfirmed") {
        parts.extend(notice("unconfirmed"));
    }
    (!parts.is_empty()).then(|| parts.join(" "))
}

/// `/path?ok=key` plus `&unconfirmed=1` when the fence was not confirmed.
pub fn done(path: &str, key: &str, unconfirmed: &Option<String>) -> String {
    let sep = if path.contains('?') { '&' } else { '?' };
    match unconfirmed {
        Some(_) => format!("{path}{sep}ok={key}&unconfirmed=1"),
        None => format!("{path}{sep}ok={key}"),
    }
}

/// A value as one URL query component.
pub fn urlencode(s: &str) -> String {
    form_urlencoded::byte_serialize(s.as_bytes()).collect()
}
