//! Concurrent searches per credential: a credential runs at most
//! `MNEMOSYNE_SEARCH_CONCURRENCY` searches at once on a replica; one more
//! waits in a short queue (`QUEUE_WAIT`) for a slot, then is refused with 429
//! and `Retry-After`. So one token flooding broad searches takes at most its
//! slots of the replica, and other tenants keep theirs.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// Longest a search waits for one of its credential's slots.
pub const QUEUE_WAIT: Duration = Duration::from_secs(1);

/// Per-credential search slots (per replica).
pub struct SearchSlots {
    per_credential: usize,
    slots: moka::sync::Cache<String, Arc<Semaphore>>,
}

impl SearchSlots {
    /// `per_credential` 0: no limit.
    pub fn new(per_credential: usize) -> Self {
        SearchSlots {
            per_credential,
            slots: moka::sync::Cache::builder()
                .max_capacity(100_000)
                .time_to_idle(Duration::from_secs(600))
                .build(),
        }
    }

    pub fn is_on(&self) -> bool {
        self.per_credential > 0
    }

    /// A slot for one search of `credential` (held until the answer is
    /// sent), or None when none freed within `QUEUE_WAIT`. With no limit, a
    /// slot of a semaphore of its own.
    pub async fn acquire(&self, credential: &str) -> Option<OwnedSemaphorePermit> {
        if !self.is_on() {
            return Arc::new(Semaphore::new(1)).try_acquire_owned().ok();
        }
        let sem = self
            .slots
            .get_with(credential.to_owned(), || Arc::new(Semaphore::new(self.per_credential)));
        tokio::time::timeout(QUEUE_WAIT, sem.acquire_owned()).await.ok()?.ok()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_credential_gets_its_slots_and_no_more_and_others_keep_theirs() {
        let s = SearchSlots::new(2);
        let a1 = s.acquire("a").await.unwrap();
        let _a2 = s.acquire("a").await.unwrap();
        assert!(s.acquire("a").await.is_none(), "a third waits, then is refused");
        assert!(s.acquire("b").await.is_some(), "another credential is not affected");
        drop(a1);
        assert!(s.acquire("a").await.is_some(), "a freed slot is taken");
    }
}
