//! Legacy MCP sessions, each owned by the exact credential that opened it,
//! shared by every replica (issue 31).
//!
//! rmcp's `LocalSessionManager` keeps this replica's copies; this wrapper adds
//! what it lacks: the owner of each session (a per-turn JWT's `jti`, a team
//! JWT's team and `jti`, an opaque token's id — never a shared subject such as
//! `daedalus-chat`), caps on how many sessions a credential and the user
//! whose tokens they are (the same cap over all the user's tokens, issue 32)
//! may hold over the whole deployment, and how many copies this replica may
//! hold.
//!
//! Every session is a row of `mcp_sessions` (owner, the client's `initialize`
//! parameters, when it was last served). A request that lands on a replica
//! without a copy is checked against the row's owner by the guard, then rmcp
//! rebuilds the session here from the row (`SessionStore`, `restore_session`)
//! by replaying the handshake — bound to the same credential, never another.
//! DELETE removes the row and announces it: every replica closes its copy.
//! A copy idle for `idle` closes; the session ends everywhere only if no
//! other replica served it since.
//!
//! The owner reaches `create_session` and `restore_session` (which rmcp calls
//! with no request at hand) through a task-local set by the auth layer around
//! the request; a session created outside such a scope is refused (fail
//! closed).

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};
use futures::Stream;
use rmcp::{
    model::{ClientJsonRpcMessage, ServerJsonRpcMessage},
    transport::streamable_http_server::session::{
        local::{LocalSessionManager, LocalSessionManagerError, SessionConfig},
        store::{SessionState, SessionStore, SessionStoreError},
        RestoreOutcome, ServerSseMessage, SessionId, SessionManager,
    },
};
use sqlx::PgPool;

use crate::store::pg::sessions as store;

/// Session limits (`MNEMOSYNE_SESSION_*`).
#[derive(Clone, Copy, Debug)]
pub struct SessionLimits {
    /// Open sessions one credential may hold, and all of one user's tokens
    /// together, over the whole deployment.
    pub per_credential: usize,
    /// Open sessions on this replica.
    pub global: usize,
    /// A session with no message for this long is closed.
    pub idle: Duration,
    /// Longest wait for the shared session table on a request's path (the
    /// store timeout): past it the request gets a 503, not a hang.
    pub store_timeout: Duration,
}

impl SessionLimits {
    /// How often a replica serving a session says so in the shared table:
    /// a quarter of the idle timeout, at most a minute.
    pub fn touch_every(&self) -> Duration {
        (self.idle / 4).min(Duration::from_secs(60))
    }

    /// A row no replica has marked served for this long is expired
    /// everywhere: the idle timeout plus the marking period (a session served
    /// just after its last mark is not cut short).
    pub fn expiry(&self) -> Duration {
        self.idle + self.touch_every()
    }
}

impl SessionLimits {
    /// The configured limits of legacy MCP sessions.
    pub fn from_settings(settings: &crate::config::Settings) -> Self {
        SessionLimits {
            per_credential: settings.sessions_per_credential,
            global: settings.sessions_max,
            idle: Duration::from_secs(settings.session_idle_secs.max(1)),
            store_timeout: settings.store_timeout(),
        }
    }
}

/// Why a session was not opened.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Refusal {
    /// The credential holds `per_credential` sessions already.
    CredentialCap,
    /// The user's tokens hold `per_credential` sessions already.
    UserCap,
    /// The replica holds `global` sessions already.
    GlobalCap,
}

/// What the auth layer hands `create_session` for one request.
pub struct Opener {
    holder: Holder,
    refused: Mutex<Option<Refusal>>,
    /// Set when the shared session table could not be reached.
    unavailable: AtomicBool,
}

/// A query of the shared table within `limit`; past it, the pool's timeout
/// error (the request answers 503).
async fn bounded<T>(
    limit: Duration,
    query: impl std::future::Future<Output = Result<T, sqlx::Error>>,
) -> Result<T, sqlx::Error> {
    tokio::time::timeout(limit, query)
        .await
        .unwrap_or(Err(sqlx::Error::PoolTimedOut))
}

/// Who a session counts against: its credential (its owner), and for an
/// opaque token the user (`user:<id>`).
#[derive(Clone, Debug)]
struct Holder {
    credential: Arc<str>,
    user: Option<Arc<str>>,
}

impl Opener {
    /// The opener of a session owned by `credential`, counted against `user`
    /// too when given.
    pub fn new(credential: Arc<str>, user: Option<Arc<str>>) -> Arc<Self> {
        Arc::new(Opener {
            holder: Holder { credential, user },
            refused: Mutex::new(None),
            unavailable: AtomicBool::new(false),
        })
    }

    /// Set when this request would have opened a session over a cap.
    pub fn refusal(&self) -> Option<Refusal> {
        self.refused.lock().ok().and_then(|r| *r)
    }

    /// Whether opening or rebuilding a session failed on Postgres (the
    /// guard answers 503 rather than rmcp's 500).
    pub fn store_unavailable(&self) -> bool {
        self.unavailable.load(Ordering::SeqCst)
    }

    fn mark_unavailable(&self) {
        self.unavailable.store(true, Ordering::SeqCst);
    }
}

tokio::task_local! {
    /// The credential of the request being served (set by the auth layer).
    pub static OPENER: Arc<Opener>;
}

#[derive(Debug, thiserror::Error)]
pub enum SessionsError {
    #[error(transparent)]
    Local(#[from] LocalSessionManagerError),
    #[error("session refused: {0:?}")]
    Refused(Refusal),
    #[error("session opened outside an authenticated request")]
    NoOwner,
    #[error("the shared session table: {0}")]
    Store(#[from] sqlx::Error),
}

/// A session this replica holds: its owner, and the `seen_at` this replica
/// last wrote for it (and when).
struct Held {
    holder: Holder,
    seen: Option<DateTime<Utc>>,
    touched: Instant,
}

#[derive(Default)]
struct Local {
    by_session: HashMap<SessionId, Held>,
    /// Places held on this replica (the global cap's count): sessions held
    /// and reservations in flight.
    held: usize,
}

impl Local {
    /// Takes a place on this replica.
    fn reserve(&mut self, limits: &SessionLimits) -> Result<(), Refusal> {
        if self.held >= limits.global {
            return Err(Refusal::GlobalCap);
        }
        self.held += 1;
        Ok(())
    }

    fn release(&mut self) {
        self.held = self.held.saturating_sub(1);
    }

    fn remove(&mut self, id: &SessionId) -> Option<Held> {
        let held = self.by_session.remove(id);
        if held.is_some() {
            self.release();
        }
        // Give the memory of a burst of sessions back once it is over.
        if self.by_session.capacity() > 64 && self.by_session.len() < self.by_session.capacity() / 4 {
            self.by_session.shrink_to_fit();
            release_free_memory();
        }
        held
    }
}

/// Hands the allocator's free pages back to the OS, off the async workers
/// (`memory::release_free_memory`). Each rmcp session costs ~55 KB spread
/// over several small blocks; glibc keeps such memory in its arenas after
/// the sessions close (measured: +1.1 GB after 20,000 sessions expired,
/// benches/session_memory.rs) unless asked to trim.
fn release_free_memory() {
    // Off the async workers: trimming walks every arena.
    std::thread::spawn(crate::memory::release_free_memory);
}

/// rmcp's local session manager plus owners, caps and the shared table.
pub struct OwnedSessions {
    inner: LocalSessionManager,
    local: Mutex<Local>,
    limits: SessionLimits,
    pg: PgPool,
    /// Set when the replica shuts down: its copies end, the sessions do not.
    draining: AtomicBool,
}

impl OwnedSessions {
    pub fn new(limits: SessionLimits, pg: PgPool) -> Self {
        let mut inner = LocalSessionManager::default();
        let mut config = SessionConfig::default();
        config.keep_alive = Some(limits.idle);
        // A session that never completes its handshake is as idle as any.
        config.init_timeout = Some(limits.idle.min(SessionConfig::DEFAULT_INIT_TIMEOUT));
        inner.session_config = config;
        OwnedSessions {
            inner,
            local: Mutex::new(Local::default()),
            limits,
            pg,
            draining: AtomicBool::new(false),
        }
    }

    /// The credential that owns `id`, if this replica holds the session.
    pub fn owner(&self, id: &str) -> Option<Arc<str>> {
        let local = self.local.lock().ok()?;
        local.by_session.get(id).map(|h| h.holder.credential.clone())
    }

    /// The owner of a session another replica opened (`None`: no such live
    /// session anywhere).
    pub async fn stored_owner(&self, id: &str) -> Result<Option<store::Owner>, sqlx::Error> {
        bounded(
            self.limits.store_timeout,
            store::owner(&self.pg, id, self.limits.expiry()),
        )
        .await
    }

    /// Open sessions on this replica.
    pub fn open(&self) -> usize {
        self.local.lock().map(|o| o.by_session.len()).unwrap_or(0)
    }

    /// Whether this replica holds as many sessions as it may.
    pub fn at_global_cap(&self) -> bool {
        self.local.lock().map_or(true, |l| l.held >= self.limits.global)
    }

    /// From now on, copies this replica closes (its shutdown ends every
    /// session worker) stay open for the other replicas.
    pub fn drain(&self) {
        self.draining.store(true, Ordering::SeqCst);
    }

    /// Marks a session this replica holds as served, in the shared table at
    /// most every `touch_every`; `false` when it ended elsewhere meanwhile
    /// (then this copy is closed too).
    pub async fn touch(&self, id: &str) -> Result<bool, sqlx::Error> {
        let due = match self.local.lock() {
            Ok(l) => l
                .by_session
                .get(id)
                .is_none_or(|h| h.touched.elapsed() >= self.limits.touch_every()),
            Err(_) => true,
        };
        if !due {
            return Ok(true);
        }
        let id: SessionId = id.to_owned().into();
        match bounded(self.limits.store_timeout, store::touch(&self.pg, &id)).await? {
            Some(seen) => {
                if let Ok(mut l) = self.local.lock() {
                    if let Some(h) = l.by_session.get_mut(&id) {
                        h.seen = Some(seen);
                        h.touched = Instant::now();
                    }
                }
                Ok(true)
            }
            None => {
                let _ = self.close_session(&id).await;
                Ok(false)
            }
        }
    }

    /// Closes the copies of sessions ended on other replicas (DELETE), as
    /// the auth channel announces them.
    pub async fn follow(self: Arc<Self>, mut rx: tokio::sync::broadcast::Receiver<String>) {
        use tokio::sync::broadcast::error::RecvError;
        loop {
            match rx.recv().await {
                Ok(p) => {
                    if let Some(id) = p.strip_prefix(store::ENDED) {
                        let id: SessionId = id.to_owned().into();
                        if self.owner(&id).is_some() {
                            let _ = self.close_session(&id).await;
                        }
                    }
                }
                // Missed some: check every copy at its next request.
                Err(RecvError::Lagged(_)) => self.touch_all_next(),
                Err(RecvError::Closed) => return,
            }
        }
    }

    /// Makes every copy's next request check the shared table.
    fn touch_all_next(&self) {
        if let Ok(mut l) = self.local.lock() {
            let long_ago = Instant::now()
                .checked_sub(self.limits.touch_every())
                .unwrap_or_else(Instant::now);
            for h in l.by_session.values_mut() {
                h.touched = long_ago;
            }
        }
    }

    /// Forgets expired sessions everywhere, every `every` (any replica).
    pub async fn sweep_every(self: Arc<Self>, every: Duration) {
        let mut tick = tokio::time::interval(every);
        loop {
            tick.tick().await;
            if let Err(e) = store::sweep(&self.pg, self.limits.expiry()).await {
                tracing::debug!(error = %e, "MCP session sweep failed");
            }
        }
    }

    /// The shared table as rmcp's session store.
    pub fn store(&self) -> Arc<dyn SessionStore> {
        Arc::new(SharedStore {
            pg: self.pg.clone(),
            expiry: self.limits.expiry(),
            timeout: self.limits.store_timeout,
        })
    }

    /// Reserves a place on this replica, or says the global cap refuses it.
    fn reserve(&self) -> Result<(), Refusal> {
        match self.local.lock() {
            Ok(mut local) => local.reserve(&self.limits),
            Err(_) => Err(Refusal::GlobalCap),
        }
    }

    fn release(&self) {
        if let Ok(mut local) = self.local.lock() {
            local.release();
        }
    }

    fn hold(&self, id: SessionId, holder: Holder, seen: DateTime<Utc>) -> Result<(), SessionsError> {
        match self.local.lock() {
            Ok(mut l) => {
                l.by_session.insert(
                    id,
                    Held {
                        holder,
                        seen: Some(seen),
                        touched: Instant::now(),
                    },
                );
                Ok(())
            }
            Err(_) => Err(SessionsError::NoOwner),
        }
    }
}

/// A place reserved under the global cap; released on drop unless the
/// session was registered.
struct Reservation<'a> {
    sessions: &'a OwnedSessions,
    kept: bool,
}

impl Drop for Reservation<'_> {
    fn drop(&mut self) {
        if !self.kept {
            self.sessions.release();
        }
    }
}

/// `mcp_sessions` as rmcp's `SessionStore`: what a replica needs to rebuild a
/// session it does not hold.
struct SharedStore {
    pg: PgPool,
    expiry: Duration,
    timeout: Duration,
}

/// Most bytes of a client's `initialize` parameters kept in its session's
/// row (issue 54: a body of up to the 4 MiB limit was kept whole; 64
/// sessions a user made 256 MiB).
pub const INIT_KEPT_BYTES: usize = 16 * 1024;

/// What rebuilding a session on another replica needs of its `initialize`
/// parameters, within `INIT_KEPT_BYTES`: small parameters as they are; of
/// larger ones the protocol version, the standard capabilities (no
/// `experimental` entries, no `_meta`) and the client's name, version and
/// title (each cut to 256 characters); if that is still too large, no
/// capabilities. This server reads none of what is dropped.
pub fn kept_init(mut v: serde_json::Value) -> serde_json::Value {
    let size = |v: &serde_json::Value| serde_json::to_vec(v).map_or(usize::MAX, |b| b.len());
    if size(&v) <= INIT_KEPT_BYTES {
        return v;
    }
    let Some(o) = v.as_object_mut() else {
        return serde_json::Value::Null;
    };
    o.retain(|k, _| matches!(k.as_str(), "protocolVersion" | "capabilities" | "clientInfo"));
    if let Some(c) = o.get_mut("capabilities").and_then(|c| c.as_object_mut()) {
        c.remove("experimental");
    }
    if let Some(info) = o.get_mut("clientInfo").and_then(|c| c.as_object_mut()) {
        info.retain(|k, _| matches!(k.as_str(), "name" | "version" | "title"));
        for (_, f) in info.iter_mut() {
            if let Some(s) = f.as_str() {
                *f = serde_json::Value::String(s.chars().take(256).collect());
            }
        }
    }
    if let Some(p) = o.get_mut("protocolVersion") {
        if p.as_str().is_none_or(|s| s.len() > 64) {
            *p = serde_json::Value::String("2025-06-18".into());
        }
    }
    if size(&v) > INIT_KEPT_BYTES {
        v["capabilities"] = serde_json::json!({});
    }
    v
}

#[async_trait::async_trait]
impl SessionStore for SharedStore {
    async fn load(&self, session_id: &str) -> Result<Option<SessionState>, SessionStoreError> {
        match bounded(self.timeout, store::init_params(&self.pg, session_id, self.expiry)).await? {
            Some(v) => Ok(Some(SessionState::new(serde_json::from_value(v)?))),
            None => Ok(None),
        }
    }

    async fn store(&self, session_id: &str, state: &SessionState) -> Result<(), SessionStoreError> {
        let params = kept_init(serde_json::to_value(&state.initialize_params)?);
        Ok(bounded(self.timeout, store::save_init(&self.pg, session_id, &params)).await?)
    }

    /// DELETE: the session ends on every replica.
    async fn delete(&self, session_id: &str) -> Result<(), SessionStoreError> {
        Ok(bounded(self.timeout, store::end(&self.pg, session_id)).await?)
    }
}

impl SessionManager for OwnedSessions {
    type Error = SessionsError;
    type Transport = <LocalSessionManager as SessionManager>::Transport;

    async fn create_session(&self) -> Result<(SessionId, Self::Transport), Self::Error> {
        let opener = OPENER.try_with(Arc::clone).map_err(|_| SessionsError::NoOwner)?;
        let refuse = |refusal| {
            if let Ok(mut r) = opener.refused.lock() {
                *r = Some(refusal);
            }
            SessionsError::Refused(refusal)
        };
        self.reserve().map_err(refuse)?;
        // Given back on every path that does not register the session —
        // including this future being dropped (a client gone mid-initialize).
        let mut reservation = Reservation {
            sessions: self,
            kept: false,
        };
        let (id, transport) = self.inner.create_session().await?;
        let owner = store::Owner {
            credential: opener.holder.credential.to_string(),
            user_key: opener.holder.user.as_deref().map(str::to_owned),
        };
        let opened = bounded(
            self.limits.store_timeout,
            store::open(&self.pg, &id, &owner, self.limits.per_credential, self.limits.expiry()),
        )
        .await;
        let seen = match opened {
            Ok(Ok(seen)) => seen,
            Ok(Err(over)) => {
                let _ = self.inner.close_session(&id).await;
                return Err(refuse(match over {
                    store::OverCap::Credential => Refusal::CredentialCap,
                    store::OverCap::User => Refusal::UserCap,
                }));
            }
            Err(e) => {
                let _ = self.inner.close_session(&id).await;
                opener.mark_unavailable();
                return Err(SessionsError::Store(e));
            }
        };
        self.hold(id.clone(), opener.holder.clone(), seen)?;
        reservation.kept = true;
        Ok((id, transport))
    }

    async fn initialize_session(
        &self,
        id: &SessionId,
        message: ClientJsonRpcMessage,
    ) -> Result<ServerJsonRpcMessage, Self::Error> {
        Ok(self.inner.initialize_session(id, message).await?)
    }

    async fn has_session(&self, id: &SessionId) -> Result<bool, Self::Error> {
        Ok(self.owner(id).is_some() && self.inner.has_session(id).await?)
    }

    /// Closes this replica's copy. A copy closed for being idle ends the
    /// session everywhere only if no other replica served it since; a
    /// replica shutting down leaves its sessions to the others.
    async fn close_session(&self, id: &SessionId) -> Result<(), Self::Error> {
        let held = self.local.lock().ok().and_then(|mut l| l.remove(id));
        if let Some(seen) = held.and_then(|h| h.seen) {
            if !self.draining.load(Ordering::SeqCst) {
                if let Err(e) = store::end_if_unseen_since(&self.pg, id, seen).await {
                    tracing::debug!(error = %e, "could not end an idle MCP session in the shared table");
                }
            }
        }
        Ok(self.inner.close_session(id).await?)
    }

    async fn create_stream(
        &self,
        id: &SessionId,
        message: ClientJsonRpcMessage,
    ) -> Result<impl Stream<Item = ServerSseMessage> + Send + Sync + 'static, Self::Error> {
        Ok(self.inner.create_stream(id, message).await?)
    }

    async fn accept_message(&self, id: &SessionId, message: ClientJsonRpcMessage) -> Result<(), Self::Error> {
        Ok(self.inner.accept_message(id, message).await?)
    }

    async fn create_standalone_stream(
        &self,
        id: &SessionId,
    ) -> Result<impl Stream<Item = ServerSseMessage> + Send + Sync + 'static, Self::Error> {
        Ok(self.inner.create_standalone_stream(id).await?)
    }

    async fn resume(
        &self,
        id: &SessionId,
        last_event_id: String,
    ) -> Result<impl Stream<Item = ServerSseMessage> + Send + Sync + 'static, Self::Error> {
        Ok(self.inner.resume(id, last_event_id).await?)
    }

    /// Rebuilds, on this replica, a session another replica opened: rmcp
    /// calls it when the shared store has the session, inside the request
    /// whose bearer the guard has matched with the session's owner (the
    /// opener it set names that owner).
    async fn restore_session(&self, id: SessionId) -> Result<RestoreOutcome<Self::Transport>, Self::Error> {
        let opener = OPENER.try_with(Arc::clone).map_err(|_| SessionsError::NoOwner)?;
        self.reserve().map_err(SessionsError::Refused)?;
        let mut reservation = Reservation {
            sessions: self,
            kept: false,
        };
        // Served now, and still there (not ended meanwhile).
        let seen = match bounded(self.limits.store_timeout, store::touch(&self.pg, &id)).await {
            Ok(Some(seen)) => seen,
            Ok(None) => return Ok(RestoreOutcome::NotSupported),
            Err(e) => {
                opener.mark_unavailable();
                return Err(SessionsError::Store(e));
            }
        };
        match self.inner.restore_session(id.clone()).await? {
            RestoreOutcome::Restored(transport) => {
                self.hold(id, opener.holder.clone(), seen)?;
                reservation.kept = true;
                Ok(RestoreOutcome::Restored(transport))
            }
            other => Ok(other),
        }
    }
}
#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_global_cap_counts_places_on_this_replica() {
        let limits = SessionLimits {
            per_credential: 2,
            global: 2,
            idle: Duration::from_secs(60),
            store_timeout: Duration::from_secs(5),
        };
        let mut l = Local::default();
        assert_eq!(l.reserve(&limits), Ok(()));
        assert_eq!(l.reserve(&limits), Ok(()));
        assert_eq!(l.reserve(&limits), Err(Refusal::GlobalCap));
        l.release();
        assert_eq!(l.reserve(&limits), Ok(()));
        l.release();
        l.release();
        l.release();
        assert_eq!(l.held, 0, "never below zero");
    }

    #[test]
    fn a_session_expires_everywhere_after_idle_plus_one_marking_period() {
        let at = |idle| SessionLimits {
            per_credential: 1,
            global: 1,
            idle: Duration::from_secs(idle),
            store_timeout: Duration::from_secs(5),
        };
        assert_eq!(at(300).touch_every(), Duration::from_secs(60));
        assert_eq!(at(300).expiry(), Duration::from_secs(360));
        assert_eq!(at(8).touch_every(), Duration::from_secs(2));
        assert_eq!(at(8).expiry(), Duration::from_secs(10));
    }
}
