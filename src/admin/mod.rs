//! The admin console (`/admin/…`, DESIGN §4): server-rendered pages for the
//! operator workflows of spec §9 — tokens with the membership-filtered library
//! picker, teams, signing keys, users, libraries and memberships, the admin
//! search (§3.3) and the audit log — plus a self-service page for non-staff
//! users. No JavaScript: every action is a plain form POST carrying the
//! session's CSRF token.
//!
//! Every write goes through the same store functions (and their audit events
//! and NOTIFY triggers) as the REST API and the CLI, then waits on the
//! cross-replica fence, so it applies on the next MCP request everywhere.

mod activity;
mod frame;
mod libraries;
mod library_lifecycle;
mod my_libraries;
mod oauth;
mod pages;
mod search;
pub mod session;
mod teams;
mod tokens;
mod tools;
mod usage;
mod users;
pub(crate) mod view;

use axum::{
    extract::{FromRequest, Request},
    http::{header, HeaderValue, StatusCode},
    middleware,
    response::{IntoResponse, Redirect, Response},
    routing::{get, post},
    Router,
};

use crate::error::ApiError;
use crate::state::AppState;

pub use session::{Person, Staff};

/// Every console route.
pub fn routes() -> Router<AppState> {
    Router::new()
        // `/admin/` too: the router trims trailing slashes before routing.
        .route("/admin", get(pages::overview))
        .route("/admin/static/admin.css", get(stylesheet))
        .route("/admin/login", get(session::login_form).post(session::login))
        .route("/admin/logout", post(session::logout))
        .route("/admin/me", get(tokens::me))
        .route("/admin/me/tokens", post(tokens::me_create))
        .route("/admin/me/tokens/revoke", post(tokens::me_revoke))
        .route("/admin/me/grants/revoke", post(oauth::me_revoke))
        .route("/admin/grants/revoke", post(oauth::staff_revoke))
        .route("/admin/oauth/consent", get(oauth::consent).post(oauth::answer))
        .route("/admin/me/grant", post(libraries::me_grant))
        .route("/admin/me/revoke", post(libraries::me_revoke))
        .route("/admin/tokens", get(tokens::list).post(tokens::create))
        .route("/admin/tokens/new", get(tokens::new_form))
        .route("/admin/tokens/revoke", post(tokens::revoke_action))
        .route(
            "/admin/tokens/{id}/tools",
            get(tools::token_form).post(tools::token_set),
        )
        .route("/admin/teams/{id}/tools", post(tools::team_set))
        .route("/admin/tokens/{id}/rate", post(tools::token_rate))
        .route("/admin/teams/{id}/rate", post(tools::team_rate))
        .route("/admin/teams", get(teams::list))
        .route("/admin/teams/{id}", get(teams::detail))
        .route("/admin/teams/{id}/workspaces", post(teams::workspaces))
        .route("/admin/teams/{id}/libraries", post(teams::libraries))
        .route("/admin/teams/{id}/rotate", post(teams::rotate))
        .route("/admin/teams/{id}/deactivate", post(teams::deactivate))
        .route("/admin/keys", get(pages::keys).post(pages::key_create))
        .route(
            "/admin/keys/retire",
            get(pages::key_retire_confirm).post(pages::key_retire),
        )
        .route("/admin/users", get(users::list).post(users::create))
        .route("/admin/users/active", post(users::set_active))
        .route("/admin/users/staff", post(users::set_staff))
        .route("/admin/users/password", post(users::set_password))
        .route("/admin/user", get(users::ceiling))
        .route("/admin/user/tools", post(users::set_ceiling_tools))
        .route("/admin/user/rate", post(users::set_ceiling_rate))
        .route("/admin/libraries", get(libraries::list))
        .route("/admin/library", get(libraries::detail))
        .route("/admin/library/grant", post(libraries::grant))
        .route("/admin/library/revoke", post(libraries::revoke))
        .route(
            "/admin/library/delete",
            get(library_lifecycle::staff_confirm).post(library_lifecycle::staff_delete),
        )
        .route("/admin/library/rename", post(library_lifecycle::staff_rename))
        .route("/admin/me/library", get(library_lifecycle::owner_page))
        .route("/admin/me/library/activity", get(activity::page))
        .route("/admin/me/library/activity.jsonl", get(activity::export))
        .route("/admin/me/library/rename", post(library_lifecycle::owner_rename))
        .route("/admin/me/library/delete", post(library_lifecycle::owner_delete))
        .route("/admin/search", get(search::search))
        .route("/admin/audit", get(pages::audit))
        .route("/admin/usage", get(usage::page))
        .layer(middleware::from_fn(security_headers))
}

async fn stylesheet() -> Response {
    (
        [
            (header::CONTENT_TYPE, "text/css; charset=utf-8"),
            (header::CACHE_CONTROL, "public, max-age=3600"),
        ],
        include_str!("admin.css"),
    )
        .into_response()
}

/// Pages show one-time secrets: never cached, never framed, no scripts at all.
async fn security_headers(req: Request, next: middleware::Next) -> Response {
    let is_css = req.uri().path() == "/admin/static/admin.css";
    let mut resp = next.run(req).await;
    let h = resp.headers_mut();
    if !is_css {
        h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    }
    // A page may widen `form-action` (the OAuth consent page: its answer
    // redirects to the client); everything else stays.
    h.entry(header::CONTENT_SECURITY_POLICY)
        .or_insert(HeaderValue::from_static(
            "default-src 'none'; style-src 'self'; img-src 'self'; form-action 'self'; \
             frame-ancestors 'none'; base-uri 'none'",
        ));
    h.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    h.insert(header::X_CONTENT_TYPE_OPTIONS, HeaderValue::from_static("nosniff"));
    h.insert(header::REFERRER_POLICY, HeaderValue::from_static("same-origin"));
    resp
}

/// A console failure, answered as an HTML page (never JSON, never a cause).
#[derive(Debug)]
pub enum AdminError {
    /// No live session: to the sign-in page.
    SignIn,
    /// Signed in, but not staff.
    NotStaff,
    /// A POST without the session's CSRF token.
    Csrf,
    /// The same rendered form posted a second time (a reload).
    AlreadySubmitted,
    /// A rendered form posted after its lifetime (`session::FORM_TTL`), or
    /// with a `once` value the console did not make.
    FormExpired,
    NotFound,
    Api(ApiError),
}

impl From<ApiError> for AdminError {
    fn from(e: ApiError) -> Self {
        AdminError::Api(e)
    }
}

impl From<sqlx::Error> for AdminError {
    fn from(e: sqlx::Error) -> Self {
        AdminError::Api(e.into())
    }
}

impl From<crate::store::graph::GraphError> for AdminError {
    fn from(e: crate::store::graph::GraphError) -> Self {
        AdminError::Api(e.into())
    }
}

impl IntoResponse for AdminError {
    fn into_response(self) -> Response {
        let (status, title, text) = match self {
            AdminError::SignIn => return Redirect::to("/admin/login").into_response(),
            AdminError::NotStaff => (
                StatusCode::FORBIDDEN,
                "Staff only",
                "This page is for staff. Your own tokens are on your page.".to_owned(),
            ),
            AdminError::Csrf => (
                StatusCode::FORBIDDEN,
                "Form refused",
                "The form did not carry this session's token (it may be from an old page or another \
                 site). Go back, reload the page and try again."
                    .to_owned(),
            ),
            AdminError::FormExpired => (
                StatusCode::CONFLICT,
                "Form expired",
                format!(
                    "This form was opened more than {} minutes ago; nothing was done. Open the page again to \
                     start over.",
                    session::FORM_TTL.as_secs() / 60
                ),
            ),
            AdminError::AlreadySubmitted => (
                StatusCode::CONFLICT,
                "Already done",
                "This form was already submitted (reloading a result page sends it again); nothing was done \
                 a second time. Open the page again to start over."
                    .to_owned(),
            ),
            AdminError::NotFound => (StatusCode::NOT_FOUND, "Not found", "There is no such page.".to_owned()),
            AdminError::Api(e) => {
                let status = e.status();
                let text = match &e {
                    ApiError::Internal(cause) => {
                        tracing::error!(?cause, "admin console: internal error");
                        "Something went wrong; the cause is in the server log.".to_owned()
                    }
                    ApiError::StoreUnavailable(store) => {
                        tracing::warn!(store, "admin console: store unavailable");
                        format!("{store} is unavailable; retry in a moment.")
                    }
                    other => other.to_string(),
                };
                let title = status.canonical_reason().unwrap_or("Error");
                let mut resp = (status, view::bare(title, &text)).into_response();
                if let ApiError::RateLimited { retry_after_secs, .. } = e {
                    resp.headers_mut()
                        .insert(header::RETRY_AFTER, HeaderValue::from(retry_after_secs));
                }
                return resp;
            }
        };
        (status, view::bare(title, &text)).into_response()
    }
}

/// An `application/x-www-form-urlencoded` body as its pairs, in order (a
/// multi-select sends its field once per choice).
#[derive(Default, Clone)]
pub struct FormData(pub Vec<(String, String)>);

/// Field names, and values except the secret ones (`csrf`, any `*password*`).
impl std::fmt::Debug for FormData {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list()
            .entries(self.0.iter().map(|(k, v)| {
                let secret = k == "csrf" || k.contains("password");
                (k, if secret { "<redacted>" } else { v.as_str() })
            }))
            .finish()
    }
}

impl FormData {
    pub fn parse(bytes: &[u8]) -> Self {
        FormData(form_urlencoded::parse(bytes).into_owned().collect())
    }

    /// The first value of `name`, or "".
    pub fn get(&self, name: &str) -> &str {
        self.0
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
            .unwrap_or("")
    }

    /// Every value of `name`, in order.
    pub fn all(&self, name: &str) -> Vec<String> {
        self.0
            .iter()
            .filter(|(k, _)| k == name)
            .map(|(_, v)| v.clone())
            .collect()
    }

    pub fn checked(&self, name: &str) -> bool {
        matches!(self.get(name), "on" | "true" | "1")
    }
}

impl<S: Send + Sync> FromRequest<S> for FormData {
    type Rejection = AdminError;

    async fn from_request(req: Request, state: &S) -> Result<Self, Self::Rejection> {
        let bytes = axum::body::Bytes::from_request(req, state)
            .await
            .map_err(|_| AdminError::Api(ApiError::PayloadTooLarge))?;
        Ok(FormData::parse(&bytes))
    }
}

/// The audit actor of a console user.
pub fn actor(username: &str) -> String {
    format!("admin:{username}")
}

/// A notice when some replica did not confirm a committed change in time (the
/// change holds either way; silent replicas no longer trust their caches).
pub fn propagation_notice(p: &crate::service::Propagation) -> Option<String> {
    p.as_ref().err().map(|u| {
        format!(
            "The change is committed, but {} replica(s) did not confirm it in time; they no longer use \
             cached credentials.",
            u.replicas
        )
    })
}

/// Waits for every replica to drop cached credentials (the REST API's fence)
/// after a committed change; the notice when some did not confirm in time.
pub async fn fence(state: &AppState) -> Option<String> {
    propagation_notice(&state.changes.fence().await)
}

/// Deletes expired console sessions and form submissions older than a
/// form's lifetime every `MNEMOSYNE_ADMIN_SWEEP_SECS` (each replica; the
/// deletes are idempotent), so console storage stays bounded however long a
/// session lives.
pub async fn housekeeping(state: AppState) {
    let mut tick = tokio::time::interval(std::time::Duration::from_secs(state.settings.admin_sweep_secs.max(1)));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        if state.pg.is_closed() {
            return;
        }
        let s = &state.settings;
        match crate::store::pg::admin::sweep(
            &state.pg,
            s.admin_session_idle_secs.max(1) as i64,
            s.admin_session_absolute_secs.max(1) as i64,
            (session::FORM_TTL + session::FORM_CLOCK_SKEW).as_secs() as i64,
        )
        .await
        {
            Ok((0, 0)) => {}
            Ok((sessions, forms)) => tracing::debug!(sessions, forms, "admin console: swept expired rows"),
            Err(e) => tracing::debug!(error = %e, "admin console: sweep failed (next tick retries)"),
        }
        state.console.shrink();
    }
}

/// Redirect after a POST (303: the browser GETs the page), with a notice key.
pub fn see_other(path: &str) -> Response {
    Redirect::to(path).into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_form_keeps_every_value_of_a_repeated_field_in_order() {
        let f = FormData::parse(b"csrf=t&library=b&name=x+y&library=a&staff=on");
        assert_eq!(f.all("library"), ["b", "a"]);
        assert_eq!(f.get("name"), "x y");
        assert_eq!(f.get("missing"), "");
        assert!(f.checked("staff") && !f.checked("service"));
    }

    #[test]
    fn debug_of_a_form_hides_passwords_and_the_csrf_token() {
        let f = FormData::parse(
            b"csrf=csrf-secret-1&username=sam&password=pw-secret-2&new_password=pw-secret-3&library=lib_a",
        );
        let shown = format!("{f:?} {f:#?}");
        for secret in ["csrf-secret-1", "pw-secret-2", "pw-secret-3"] {
            assert!(!shown.contains(secret), "{shown}");
        }
        assert!(
            shown.contains("sam") && shown.contains("lib_a") && shown.contains("<redacted>"),
            "{shown}"
        );
    }

    #[test]
    fn notices_come_from_a_fixed_set_never_from_the_url() {
        let q = |pairs: &[(&str, &str)]| {
            pairs
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect::<std::collections::HashMap<_, _>>()
        };
        assert_eq!(view::notice_of(&q(&[("ok", "<script>alert(1)</script>")])), None);
        assert!(view::notice_of(&q(&[("ok", "token-revoked")]))
            .unwrap()
            .starts_with("Token revoked"));
        assert!(view::notice_of(&q(&[("ok", "granted"), ("unconfirmed", "1")]))
            .unwrap()
            .contains("not every replica"));
    }
}
