//! The resolver: classify the bearer, validate it, produce a `Principal`.
//! Warm paths are served from the caches; cold paths make at most one Postgres
//! and one graph round trip. Any store error is `Unavailable` (fail closed).

use std::collections::HashSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use chrono::{TimeZone, Utc};
use sha2::{Digest, Sha256};
use sqlx::PgPool;
use tracing::Instrument;
use uuid::Uuid;

use super::cache::{AuthCaches, TeamScope};
use super::failure::{AuthError, AuthFailure};
use super::jwt::{self, Verified};
use super::principal::{Principal, PrincipalKind, Scope, ToolGrant};
use crate::metrics::Metrics;
use crate::store::graph::WorkspaceLibraries;
use crate::store::pg::auth as pga;

/// What the transport tells the resolver about the request.
#[derive(Clone, Copy, Debug, Default)]
pub struct RequestContext<'a> {
    /// `Mcp-Session-Id` of a session-based request.
    pub session_id: Option<&'a str>,
    /// The credential that owns that session. Another credential is refused
    /// with `AuthError::ForeignSession` before anything is consumed.
    pub session_owner: Option<&'a str>,
}

impl RequestContext<'_> {
    fn check_owner(&self, credential: &str) -> Result<(), AuthError> {
        match self.session_owner {
            Some(owner) if owner != credential => Err(AuthError::ForeignSession),
            _ => Ok(()),
        }
    }
}

/// The staff admin search's scope (spec §3.3: an admin search's resolved
/// libraries are every Library uid, named explicitly): `uids`, in order.
pub(crate) fn every_library(uids: impl IntoIterator<Item = String>) -> Scope {
    Scope::from_resolver(uids)
}

/// A per-turn jti consumed by a request that had no session yet; if the
/// response opens one, the jti is bound to it (`Authenticator::bind_session`).
#[derive(Clone, Debug)]
pub struct PendingJti(pub String);

pub struct Authenticator {
    pg: PgPool,
    graph: WorkspaceLibraries,
    pub caches: Arc<AuthCaches>,
    metrics: Metrics,
    store_timeout: Duration,
    /// Opaque tokens used since the last flush (ids); written off the request path.
    touched: Mutex<HashSet<i64>>,
    /// Store lookups for credentials no cache knows run on these permits, so a
    /// flood of made-up credentials never takes the whole Postgres pool.
    cold: tokio::sync::Semaphore,
}

fn pg_down(_: sqlx::Error) -> AuthError {
    AuthError::Unavailable("postgres")
}

/// Hex SHA-256 of an opaque token's plaintext: what `mcp_tokens.token_hash` holds.
pub fn token_hash(plaintext: &str) -> String {
    hex::encode(Sha256::digest(plaintext.as_bytes()))
}

impl Authenticator {
    pub fn new(
        pg: PgPool,
        graph: WorkspaceLibraries,
        caches: Arc<AuthCaches>,
        metrics: Metrics,
        store_timeout: Duration,
    ) -> Self {
        Authenticator {
            pg,
            graph,
            caches,
            metrics,
            store_timeout,
            touched: Mutex::new(HashSet::new()),
            cold: tokio::sync::Semaphore::new(4),
        }
    }

    /// Sets how many cold credential lookups may run at once.
    pub fn with_cold_lookups(mut self, n: usize) -> Self {
        self.cold = tokio::sync::Semaphore::new(n.max(1));
        self
    }

    /// Resolves one request's bearer. Counts failures by reason and logs the
    /// principal kind and library count of successes (never the token).
    pub async fn authenticate(
        &self,
        bearer: &str,
        ctx: RequestContext<'_>,
    ) -> Result<(Principal, Option<PendingJti>), AuthError> {
        // A span for traces: the principal kind and library count, or the
        // refusal reason — never token material.
        let span = tracing::info_span!(
            "auth.resolve",
            principal = tracing::field::Empty,
            libraries = tracing::field::Empty,
            refused = tracing::field::Empty
        );
        let out = match tokio::time::timeout(self.store_timeout, self.resolve(bearer, ctx))
            .instrument(span.clone())
            .await
        {
            Ok(r) => r,
            Err(_) => Err(AuthError::Unavailable("postgres")),
        };
        match &out {
            Ok((p, _)) => {
                span.record("principal", p.kind.as_str());
                span.record("libraries", p.libraries.len());
            }
            Err(AuthError::Refused(f)) => {
                span.record("refused", f.reason());
            }
            Err(_) => {
                span.record("refused", "unavailable");
            }
        }
        match &out {
            Ok((p, _)) => {
                self.metrics
                    .auth_resolutions
                    .with_label_values(&[p.kind.as_str()])
                    .inc();
                tracing::info!(principal = %p.kind, libraries = p.libraries.len(), "bearer resolved");
            }
            Err(AuthError::Refused(f)) => {
                self.metrics.auth_failures.with_label_values(&[f.reason()]).inc();
                tracing::info!(reason = f.reason(), "bearer refused");
            }
            Err(AuthError::Unavailable(store)) => {
                self.metrics
                    .auth_failures
                    .with_label_values(&["store_unavailable"])
                    .inc();
                tracing::warn!(store, "bearer not resolved: store unavailable");
            }
            Err(AuthError::Missing) => {
                self.metrics.auth_failures.with_label_values(&["missing"]).inc();
            }
            Err(AuthError::ForeignSession) => {
                self.metrics.auth_failures.with_label_values(&["foreign_session"]).inc();
                tracing::info!(
                    reason = "foreign_session",
                    "bearer refused on a session it does not own"
                );
            }
        }
        out
    }

    async fn resolve(
        &self,
        bearer: &str,
        ctx: RequestContext<'_>,
    ) -> Result<(Principal, Option<PendingJti>), AuthError> {
        if bearer.is_empty() {
            return Err(AuthError::Missing);
        }
        if !jwt::looks_like_jwt(bearer) {
            let p = self.resolve_opaque(bearer).await?;
            ctx.check_owner(&p.credential)?;
            return Ok((p, None));
        }
        let kid = jwt::header_kid(bearer)?;
        let secret = self.signing_secret(&kid).await?;
        let raw = jwt::verify_signature(bearer, &secret)?;
        match jwt::check_claims(&raw, Utc::now().timestamp())? {
            Verified::PerTurn { sub, jti, exp, libs } => {
                let credential: Arc<str> = format!("jti:{jti}").into();
                // Before the jti is claimed: a foreign session consumes nothing.
                ctx.check_owner(&credential)?;
                let pending = self.check_replay(&jti, exp, ctx.session_id).await?;
                let p = Principal {
                    kind: PrincipalKind::PerTurn,
                    subject: sub,
                    credential,
                    libraries: Scope::from_resolver(libs),
                    // A per-turn JWT has no stored credential to restrict.
                    tools: ToolGrant::Every,
                    rate_limit_per_minute: None,
                    user: None,
                    user_max_rate: None,
                };
                Ok((p, pending))
            }
            Verified::Team { team_id, jti } => {
                ctx.check_owner(&format!("team:{team_id}:{jti}"))?;
                Ok((self.resolve_team(team_id, jti).await?, None))
            }
        }
    }

    async fn signing_secret(&self, kid: &str) -> Result<Arc<Vec<u8>>, AuthError> {
        let usable = self.caches.usable();
        self.caches
            .keys
            .read_through(usable, kid.to_owned(), || async {
                let hex_secret = self
                    .cold_lookup(usable, format!("kid:{kid}"), || {
                        crate::store::pg::keys::active_secret(&self.pg, kid)
                    })
                    .await?
                    .ok_or(AuthFailure::InvalidToken)?;
                Ok(Arc::new(
                    hex::decode(hex_secret.trim()).map_err(|_| AuthFailure::InvalidToken)?,
                ))
            })
            .await
    }

    /// A lookup of a credential no positive cache knows: answered from the
    /// negative cache when it was not found before, else run on the cold
    /// permits; a miss is remembered. `Ok(None)` = not found.
    async fn cold_lookup<T, F, Fut>(&self, usable: bool, negative: String, load: F) -> Result<Option<T>, AuthError>
    where
        F: FnOnce() -> Fut,
        Fut: std::future::Future<Output = Result<Option<T>, sqlx::Error>>,
    {
        self.caches
            .unknown
            .remember_absent(usable, negative, || async {
                let _slot = self
                    .cold
                    .acquire()
                    .await
                    .map_err(|_| AuthError::Unavailable("postgres"))?;
                load().await.map_err(pg_down)
            })
            .await
    }

    async fn resolve_opaque(&self, bearer: &str) -> Result<Principal, AuthError> {
        self.resolve_token_hash(token_hash(bearer), true).await
    }

    /// What an opaque token (by its stored hash) resolves to right now, exactly
    /// as on `/mcp` — the admin console's "search as". Does not mark it used.
    pub async fn resolve_stored_token(&self, hash: &str) -> Result<Principal, AuthError> {
        self.resolve_token_hash(hash.to_owned(), false).await
    }

    /// What a team's current JWT resolves to right now, exactly as on `/mcp`
    /// (the admin console's "search as"; no JWT is minted for it).
    pub async fn resolve_team_now(&self, team_id: Uuid) -> Result<Principal, AuthError> {
        let jti = pga::team_for_auth(&self.pg, team_id)
            .await
            .map_err(pg_down)?
            .and_then(|t| t.active_jti)
            .ok_or(AuthFailure::TeamNotFound)?;
        self.resolve_team(team_id, jti).await
    }

    async fn resolve_token_hash(&self, hash: String, touch: bool) -> Result<Principal, AuthError> {
        let usable = self.caches.usable();
        let row = self
            .caches
            .tokens
            .read_through(usable, hash.clone(), || async {
                self.cold_lookup(usable, format!("tok:{hash}"), || pga::token_by_hash(&self.pg, &hash))
                    .await?
                    .map(Arc::new)
                    .ok_or(AuthError::Refused(AuthFailure::TokenNotFound))
            })
            .await?;
        if !row.active || row.expires_at.is_some_and(|e| e <= Utc::now()) {
            return Err(AuthFailure::TokenNotFound.into());
        }
        if !row.user_active {
            return Err(AuthFailure::UserDisabled.into());
        }
        if touch {
            if let Ok(mut t) = self.touched.lock() {
                t.insert(row.id);
            }
        }
        let subject = format!("token:{}", row.id);
        // A token reads only where its user still holds a membership: revoking
        // the membership revokes the token's access to that library.
        let libraries = row
            .allowed_libraries
            .0
            .iter()
            .filter(|l| row.member_libraries.contains(l))
            .cloned();
        Ok(Principal {
            kind: PrincipalKind::Token,
            credential: subject.as_str().into(),
            subject,
            libraries: Scope::from_resolver(libraries),
            // The user's ceiling (issue 32): the token's own allowlist only
            // narrows it, and every token of the user shares its rate.
            tools: ToolGrant::from_stored(row.allowed_tools.as_deref())
                .within(&ToolGrant::from_stored(row.user_max_tools.as_deref())),
            rate_limit_per_minute: row.rate_limit_per_minute.map(|r| r.max(0) as u32),
            user: Some(Arc::from(format!("user:{}", row.user_id))),
            user_max_rate: row.user_max_rate_per_minute.map(|r| r.max(1) as u32),
        })
    }

    /// DESIGN §3 per-turn replay: bound to the session where first seen; single
    /// use without a session. Postgres decides, so it holds across replicas.
    async fn check_replay(&self, jti: &str, exp: i64, session: Option<&str>) -> Result<Option<PendingJti>, AuthError> {
        let key = jti.to_owned();
        if let (Some(s), Some(bound)) = (session, self.caches.jti_sessions.get(&key).await) {
            return if bound.as_str() == s {
                Ok(None)
            } else {
                Err(AuthFailure::Replay.into())
            };
        }
        let expires_at = Utc
            .timestamp_opt(exp + jwt::LEEWAY_SECS, 0)
            .single()
            .ok_or(AuthFailure::InvalidToken)?;
        match pga::claim_jti(&self.pg, jti, session, expires_at)
            .await
            .map_err(pg_down)?
        {
            pga::JtiBinding::Fresh => match session {
                Some(s) => {
                    self.caches.jti_sessions.cache_fact(key, s).await;
                    Ok(None)
                }
                None => Ok(Some(PendingJti(key))),
            },
            pga::JtiBinding::Bound(Some(b)) if Some(b.as_str()) == session => {
                self.caches.jti_sessions.cache_fact(key, &b).await;
                Ok(None)
            }
            pga::JtiBinding::Bound(_) => Err(AuthFailure::Replay.into()),
        }
    }

    /// Un-consumes a jti whose session could not be opened or bound.
    pub async fn release(&self, pending: &PendingJti) -> Result<(), AuthError> {
        pga::release_jti(&self.pg, &pending.0).await.map_err(pg_down)
    }

    /// Binds a jti consumed by a session-opening request to the new session.
    pub async fn bind_session(&self, pending: &PendingJti, session: &str) -> Result<(), AuthError> {
        pga::bind_jti_session(&self.pg, &pending.0, session)
            .await
            .map_err(pg_down)?;
        self.caches.jti_sessions.cache_fact(pending.0.clone(), session).await;
        Ok(())
    }

    async fn resolve_team(&self, team_id: Uuid, jti: Uuid) -> Result<Principal, AuthError> {
        let team = self
            .caches
            .teams
            .read_through(self.caches.usable(), team_id, || async {
                pga::team_for_auth(&self.pg, team_id)
                    .await
                    .map_err(pg_down)?
                    .map(Arc::new)
                    .ok_or(AuthError::Refused(AuthFailure::TeamNotFound))
            })
            .await?;
        if !team.active {
            return Err(AuthFailure::TeamInactive.into());
        }
        if team.active_jti != Some(jti) {
            return Err(AuthFailure::StaleJti.into());
        }
        let libraries = if team.library_uids.is_empty() {
            self.workspace_libraries(&team.workspace_ids).await?
        } else {
            self.team_scope(team_id, &team).await?
        };
        Ok(Principal {
            kind: PrincipalKind::Team,
            subject: format!("team:{team_id}"),
            credential: format!("team:{team_id}:{jti}").into(),
            libraries,
            tools: ToolGrant::from_stored(team.allowed_tools.as_deref()),
            rate_limit_per_minute: team.rate_limit_per_minute.map(|r| r.max(0) as u32),
            user: None,
            user_max_rate: None,
        })
    }

    /// The resolved list of a team granted libraries directly (issue 53,
    /// DESIGN §3): its workspaces' libraries in workspace order, then its
    /// direct grants in their order, without duplicates; a direct grant the
    /// graph does not hold (unknown or deleted) is dropped. Cached whole per
    /// team row, so a warm request costs one lookup however many it names.
    async fn team_scope(&self, team_id: Uuid, team: &Arc<pga::TeamAuthRow>) -> Result<Scope, AuthError> {
        let usable = self.caches.usable();
        let cached = self
            .caches
            .team_libraries
            .read_through_valid(
                usable,
                team_id,
                |c| Arc::ptr_eq(&c.row, team),
                || async {
                    let per_ws = self.per_workspace(&team.workspace_ids).await?;
                    let existing = self
                        .graph
                        .existing_libraries(&team.library_uids)
                        .await
                        .map_err(|_| AuthError::Unavailable("graph"))?;
                    let direct = team.library_uids.iter().filter(|u| existing.contains(*u));
                    let scope = Scope::from_resolver(per_ws.iter().flat_map(|l| l.iter()).chain(direct).cloned());
                    Ok::<_, AuthError>(TeamScope {
                        row: team.clone(),
                        scope,
                    })
                },
            )
            .await?;
        Ok(cached.scope)
    }

    /// Libraries of the workspaces, in assignment order then uid order, from the
    /// cache and one graph query for the workspaces it lacks.
    async fn workspace_libraries(&self, workspace_ids: &[String]) -> Result<Scope, AuthError> {
        let per_ws = self.per_workspace(workspace_ids).await?;
        Ok(Scope::from_resolver(per_ws.iter().flat_map(|l| l.iter().cloned())))
    }

    /// Each workspace's libraries (uid order), in `workspace_ids` order.
    async fn per_workspace(&self, workspace_ids: &[String]) -> Result<Vec<Arc<Vec<String>>>, AuthError> {
        self.caches
            .workspace_libraries
            .read_through_many(self.caches.usable(), workspace_ids, |missing| async move {
                let fetched = self
                    .graph
                    .libraries_for_workspaces(&missing)
                    .await
                    .map_err(|_| AuthError::Unavailable("graph"))?;
                Ok::<_, AuthError>(fetched.into_iter().map(|(ws, libs)| (ws, Arc::new(libs))).collect())
            })
            .await
    }

    /// Writes `last_used_at` for the tokens used since the last call.
    pub async fn flush_token_usage(&self) {
        let ids: Vec<i64> = match self.touched.lock() {
            Ok(mut t) => t.drain().collect(),
            Err(_) => return,
        };
        if !ids.is_empty() {
            if let Err(e) = pga::touch_tokens(&self.pg, &ids).await {
                tracing::warn!(error = %e, "could not record token usage");
            }
        }
    }

    /// Periodic housekeeping: token usage and expired jti rows.
    pub async fn housekeeping(self: Arc<Self>, every: Duration) {
        let mut tick = tokio::time::interval(every);
        loop {
            tick.tick().await;
            self.flush_token_usage().await;
            if let Err(e) = pga::sweep_jtis(&self.pg).await {
                tracing::debug!(error = %e, "jti sweep failed");
            }
        }
    }
}
