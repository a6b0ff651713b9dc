//! The admin console's rate limits (here, below `state`, which holds them,
//! and `admin`, which checks them): every request of a signed-in user counts
//! against that user's bucket and its session's (the session's checked
//! before the session is looked up and touched), and every sign-in POST
//! against its client address's (checked before the form is read). A session
//! cookie the console did not make never reaches a lookup (its MAC:
//! `admin::session`), so made-up cookies need no per-address throttle, and a
//! valid session is never refused for what others at its address send. The same token buckets as
//! the MCP surface (`super`), so a configured rate is for the whole
//! deployment, divided among the live replicas.

use std::sync::atomic::AtomicUsize;
use std::sync::Arc;

use super::RateLimits;
use crate::error::ApiError;

/// The console's buckets on one replica.
pub struct ConsoleLimits {
    users: RateLimits,
    sessions: RateLimits,
    sign_in: RateLimits,
}

impl ConsoleLimits {
    /// `per_user` console requests and `sign_in_per_address` sign-ins a
    /// minute (0 = no limit), shared among `replicas`.
    pub fn new(per_user: u32, sign_in_per_address: u32, replicas: Arc<AtomicUsize>) -> Self {
        ConsoleLimits {
            users: RateLimits::shared(per_user, 0, replicas.clone()),
            sessions: RateLimits::shared(per_user, 0, replicas.clone()),
            sign_in: RateLimits::shared(sign_in_per_address, 0, replicas),
        }
    }

    /// Before a (console-made) session cookie is looked up and its session
    /// touched: the session id's own bucket (the per-user rate), so one
    /// replayed cookie cannot make a read per request either.
    pub fn before_lookup(&self, session_hash: &str) -> Result<(), ApiError> {
        self.sessions
            .request(&format!("session:{session_hash}"), None)
            .map_err(limited)
    }

    /// One request of a signed-in user.
    pub fn user(&self, user_id: i64) -> Result<(), ApiError> {
        self.users.request(&format!("user:{user_id}"), None).map_err(limited)
    }

    /// One sign-in attempt from `address`; `Err` holds the seconds to wait.
    pub fn sign_in(&self, address: &str) -> Result<(), u64> {
        self.sign_in
            .request(&format!("ip:{address}"), None)
            .map_err(|l| l.retry_after_secs())
    }

    /// Forgets idle users', sessions' and addresses' full buckets.
    pub fn shrink(&self) {
        self.users.shrink();
        self.sessions.shrink();
        self.sign_in.shrink();
    }
}

fn limited(l: super::Limited) -> ApiError {
    let secs = l.retry_after_secs();
    ApiError::RateLimited {
        retry_after_secs: secs,
        message: format!("Too many console requests. Try again in {secs} s."),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn users_and_addresses_have_their_own_buckets() {
        let l = ConsoleLimits::new(12, 6, Arc::new(AtomicUsize::new(1)));
        // Bursts: 2 requests per user, 1 sign-in per address.
        assert!(l.user(1).is_ok() && l.user(1).is_ok());
        match l.user(1) {
            Err(ApiError::RateLimited { retry_after_secs, .. }) => assert!(retry_after_secs >= 1),
            other => panic!("{other:?}"),
        }
        assert!(l.user(2).is_ok());
        assert!(l.sign_in("10.0.0.1").is_ok());
        assert!(l.sign_in("10.0.0.1").unwrap_err() >= 1);
        assert!(l.sign_in("10.0.0.2").is_ok());
        let off = ConsoleLimits::new(0, 0, Arc::new(AtomicUsize::new(1)));
        assert!((0..100).all(|_| off.user(1).is_ok() && off.sign_in("a").is_ok()));
    }
}
