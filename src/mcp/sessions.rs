//! Legacy MCP sessions, each owned by the exact credential that opened it.
//!
//! rmcp's `LocalSessionManager` keeps the sessions; this wrapper adds what it
//! lacks: the owner of each session (a per-turn JWT's `jti`, a team JWT's team
//! and `jti`, an opaque token's id — never a shared subject such as
//! `daedalus-chat`), caps on how many sessions a credential, the user whose
//! tokens they are (the same cap over all the user's tokens, issue 32) and
//! the whole replica may hold, and the guarantee that the owner lives exactly as long as
//! the session: it is written when rmcp creates the session and removed when
//! rmcp closes it (DELETE, idle timeout, or the worker ending), so a session
//! whose owner is unknown does not exist.
//!
//! The owner reaches `create_session` (which rmcp calls with no request at
//! hand) through a task-local set by the auth layer around the request; a
//! session created outside such a scope is refused (fail closed).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::Stream;
use rmcp::{
    model::{ClientJsonRpcMessage, ServerJsonRpcMessage},
    transport::streamable_http_server::session::{
        local::{LocalSessionManager, LocalSessionManagerError, SessionConfig},
        ServerSseMessage, SessionId, SessionManager,
    },
};

/// Session limits (`MNEMOSYNE_SESSION_*`).
#[derive(Clone, Copy, Debug)]
pub struct SessionLimits {
    /// Open sessions one credential may hold, and all of one user's tokens
    /// together.
    pub per_credential: usize,
    /// Open sessions on this replica.
    pub global: usize,
    /// A session with no message for this long is closed.
    pub idle: Duration,
}

impl SessionLimits {
    /// The configured limits of legacy MCP sessions.
    pub fn from_settings(settings: &crate::config::Settings) -> Self {
        SessionLimits {
            per_credential: settings.sessions_per_credential,
            global: settings.sessions_max,
            idle: Duration::from_secs(settings.session_idle_secs.max(1)),
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
        })
    }

    /// Set when this request would have opened a session over a cap.
    pub fn refusal(&self) -> Option<Refusal> {
        self.refused.lock().ok().and_then(|r| *r)
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
}

#[derive(Default)]
struct Owners {
    by_session: HashMap<SessionId, Holder>,
    /// Places held per credential and per user (`user:<id>`; no credential
    /// is named so): open sessions and reservations in flight.
    per_credential: HashMap<Arc<str>, usize>,
    /// Places held in all (the global cap's count).
    held: usize,
}

impl Owners {
    fn count(&self, key: &Arc<str>) -> usize {
        self.per_credential.get(key).copied().unwrap_or(0)
    }

    /// Takes a place for `holder` under every cap.
    fn reserve(&mut self, holder: &Holder, limits: &SessionLimits) -> Result<(), Refusal> {
        if self.held >= limits.global {
            return Err(Refusal::GlobalCap);
        }
        if self.count(&holder.credential) >= limits.per_credential {
            return Err(Refusal::CredentialCap);
        }
        if holder
            .user
            .as_ref()
            .is_some_and(|u| self.count(u) >= limits.per_credential)
        {
            return Err(Refusal::UserCap);
        }
        for key in std::iter::once(&holder.credential).chain(&holder.user) {
            *self.per_credential.entry(key.clone()).or_insert(0) += 1;
        }
        self.held += 1;
        Ok(())
    }

    /// Gives a place of `holder` back.
    fn release(&mut self, holder: &Holder) {
        if !self.per_credential.contains_key(&holder.credential) {
            return;
        }
        for key in std::iter::once(&holder.credential).chain(&holder.user) {
            if let Some(n) = self.per_credential.get_mut(key) {
                *n -= 1;
                if *n == 0 {
                    self.per_credential.remove(key);
                }
            }
        }
        self.held -= 1;
    }

    fn remove(&mut self, id: &SessionId) {
        if let Some(holder) = self.by_session.remove(id) {
            self.release(&holder);
        }
        // Give the memory of a burst of sessions back once it is over.
        if self.by_session.capacity() > 64 && self.by_session.len() < self.by_session.capacity() / 4 {
            self.by_session.shrink_to_fit();
            self.per_credential.shrink_to_fit();
            release_free_memory();
        }
    }
}

/// Hands the allocator's free pages back to the OS. Each rmcp session costs
/// ~55 KB spread over several small blocks; glibc keeps such memory in its
/// arenas after the sessions close (measured: +1.1 GB after 20,000 sessions
/// expired, benches/session_memory.rs) unless asked to trim.
fn release_free_memory() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        // Off the async workers: trimming walks every arena.
        std::thread::spawn(|| {
            // SAFETY: malloc_trim only releases free memory; it has no
            // preconditions and may be called from any thread.
            unsafe {
                libc::malloc_trim(0);
            }
        });
    }
}

/// rmcp's local session manager plus owners and caps.
pub struct OwnedSessions {
    inner: LocalSessionManager,
    owners: Mutex<Owners>,
    limits: SessionLimits,
}

impl OwnedSessions {
    pub fn new(limits: SessionLimits) -> Self {
        let mut inner = LocalSessionManager::default();
        let mut config = SessionConfig::default();
        config.keep_alive = Some(limits.idle);
        // A session that never completes its handshake is as idle as any.
        config.init_timeout = Some(limits.idle.min(SessionConfig::DEFAULT_INIT_TIMEOUT));
        inner.session_config = config;
        OwnedSessions {
            inner,
            owners: Mutex::new(Owners::default()),
            limits,
        }
    }

    /// The credential that owns `id`, if the session exists.
    pub fn owner(&self, id: &str) -> Option<Arc<str>> {
        let owners = self.owners.lock().ok()?;
        owners.by_session.get(id).map(|h| h.credential.clone())
    }

    /// Open sessions on this replica.
    pub fn open(&self) -> usize {
        self.owners.lock().map(|o| o.by_session.len()).unwrap_or(0)
    }

    /// Reserves a place for a new session of `holder`, or says which cap
    /// refuses it.
    fn reserve(&self, holder: &Holder) -> Result<(), Refusal> {
        match self.owners.lock() {
            Ok(mut owners) => owners.reserve(holder, &self.limits),
            Err(_) => Err(Refusal::GlobalCap),
        }
    }

    fn release(&self, holder: &Holder) {
        if let Ok(mut owners) = self.owners.lock() {
            owners.release(holder);
        }
    }
}

/// A place reserved under the caps; released on drop unless the session was
/// registered.
struct Reservation<'a> {
    sessions: &'a OwnedSessions,
    holder: Holder,
    kept: bool,
}

impl Drop for Reservation<'_> {
    fn drop(&mut self) {
        if !self.kept {
            self.sessions.release(&self.holder);
        }
    }
}

impl SessionManager for OwnedSessions {
    type Error = SessionsError;
    type Transport = <LocalSessionManager as SessionManager>::Transport;

    async fn create_session(&self) -> Result<(SessionId, Self::Transport), Self::Error> {
        let opener = OPENER.try_with(Arc::clone).map_err(|_| SessionsError::NoOwner)?;
        if let Err(refusal) = self.reserve(&opener.holder) {
            if let Ok(mut r) = opener.refused.lock() {
                *r = Some(refusal);
            }
            return Err(SessionsError::Refused(refusal));
        }
        // Given back on every path that does not register the session —
        // including this future being dropped (a client gone mid-initialize).
        let mut reservation = Reservation {
            sessions: self,
            holder: opener.holder.clone(),
            kept: false,
        };
        let (id, transport) = self.inner.create_session().await?;
        match self.owners.lock() {
            Ok(mut owners) => {
                owners.by_session.insert(id.clone(), opener.holder.clone());
            }
            Err(_) => return Err(SessionsError::NoOwner),
        }
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

    async fn close_session(&self, id: &SessionId) -> Result<(), Self::Error> {
        if let Ok(mut owners) = self.owners.lock() {
            owners.remove(id);
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
}

#[cfg(test)]
mod tests {
    use super::*;

    fn holder(credential: &str, user: Option<&str>) -> Holder {
        Holder {
            credential: credential.into(),
            user: user.map(Into::into),
        }
    }

    #[test]
    fn a_users_tokens_share_the_per_credential_cap() {
        let limits = SessionLimits {
            per_credential: 2,
            global: 10,
            idle: Duration::from_secs(60),
        };
        let mut o = Owners::default();
        let (a, b) = (holder("token:1", Some("user:7")), holder("token:2", Some("user:7")));
        assert_eq!(o.reserve(&a, &limits), Ok(()));
        assert_eq!(o.reserve(&b, &limits), Ok(()));
        assert_eq!(o.reserve(&a, &limits), Err(Refusal::UserCap));
        assert_eq!(o.reserve(&holder("token:3", Some("user:8")), &limits), Ok(()));
        assert_eq!(o.reserve(&holder("team:x:j", None), &limits), Ok(()));
        o.release(&b);
        assert_eq!(o.reserve(&a, &limits), Ok(()));
        assert_eq!(o.reserve(&a, &limits), Err(Refusal::CredentialCap));
        for h in [&a, &a, &holder("token:3", Some("user:8")), &holder("team:x:j", None)] {
            o.release(h);
        }
        assert_eq!((o.held, o.per_credential.len()), (0, 0), "every place given back");
    }
}
