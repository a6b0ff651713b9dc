//! Concurrent searches per credential: a credential runs at most
//! `MNEMOSYNE_SEARCH_CONCURRENCY` searches at once on a replica; one more
//! waits in a short queue (`QUEUE_WAIT`) for a slot, then is refused with 429
//! and `Retry-After`. So one token flooding broad searches takes at most its
//! slots of the replica, and other tenants keep theirs.
//!
//! Shared, a replica's cores go to callers, not to searches: while another
//! credential has searched on this replica within `CONTENDED_FOR`, a
//! credential runs one search at a time (its others wait their turn up to
//! `QUEUE_WAIT`, then run on their own slots: never a refusal).
//! Alone, it runs its full count. Measured (`search_load`, 2 cores): with a
//! flooding token at 4 searches at once, another tenant's p50 went 1.44 →
//! 6.34 ms; at 2, 1.35 → 3.54 ms; at 1, 1.70 → 2.95 ms — while one token
//! alone at c=32 answers 475 req/s with 4 and 191 req/s with 1.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// Longest a search waits for one of its credential's slots.
pub const QUEUE_WAIT: Duration = Duration::from_secs(1);

/// How long after another credential's search a credential runs one search
/// at a time.
pub const CONTENDED_FOR: Duration = Duration::from_secs(1);

/// Per-credential and per-user search slots (per replica).
pub struct SearchSlots {
    per_credential: usize,
    /// Searches all of one user's tokens may run at once (issue 54: a user
    /// may hold many tokens; they share this). 0: no user-wide limit.
    per_user: usize,
    slots: moka::sync::Cache<String, Arc<Lanes>>,
    /// The two credentials that searched last, each with when: enough to
    /// tell whether anyone else searched within `CONTENDED_FOR`.
    recent: Mutex<[Option<(String, Instant)>; 2]>,
}

/// One credential's slots: its full count, and the one it runs on while
/// contended.
struct Lanes {
    all: Arc<Semaphore>,
    contended: Arc<Semaphore>,
}

/// A search's slot, held until its work ended and its answer was sent
/// (`mcp::guard::Caller`).
pub struct SearchSlot {
    _user: Option<OwnedSemaphorePermit>,
    _own: OwnedSemaphorePermit,
    _contended: Option<OwnedSemaphorePermit>,
}

impl SearchSlots {
    /// `per_credential` 0: no limit (and then no user-wide one either).
    pub fn new(per_credential: usize) -> Self {
        Self::with_user_limit(per_credential, 0)
    }

    /// Slots per credential and, over all of one user's tokens, per user.
    pub fn with_user_limit(per_credential: usize, per_user: usize) -> Self {
        SearchSlots {
            per_credential,
            per_user,
            slots: moka::sync::Cache::builder()
                .max_capacity(100_000)
                .time_to_idle(Duration::from_secs(600))
                .build(),
            recent: Mutex::new([None, None]),
        }
    }

    /// Records that `credential` searches now; whether another credential
    /// searched within `CONTENDED_FOR`.
    fn contended(&self, credential: &str, now: Instant) -> bool {
        let mut r = self.recent.lock().unwrap_or_else(|p| p.into_inner());
        match &mut r[0] {
            // The usual case under load: the same caller again, no allocation.
            Some((c, t)) if c == credential => *t = now,
            _ => {
                r[1] = r[0].take();
                r[0] = Some((credential.to_owned(), now));
            }
        }
        r[1].as_ref()
            .is_some_and(|(_, t)| now.duration_since(*t) < CONTENDED_FOR)
    }

    pub fn is_on(&self) -> bool {
        self.per_credential > 0
    }

    /// A slot for one search of `credential`, of `user`'s tokens if it is
    /// a token (held until its work ended and its answer was sent), or None
    /// when none freed within `QUEUE_WAIT`. With no limit, a slot of a
    /// semaphore of its own. A user's tokens share the user's slots, and
    /// while contended they run one search at a time between them, as one
    /// credential does.
    pub async fn acquire(&self, credential: &str, user: Option<&str>) -> Option<SearchSlot> {
        if !self.is_on() {
            return Some(SearchSlot {
                _user: None,
                _own: Arc::new(Semaphore::new(1)).try_acquire_owned().ok()?,
                _contended: None,
            });
        }
        let lanes = |key: String, n: usize| {
            self.slots.get_with(key, || {
                Arc::new(Lanes {
                    all: Arc::new(Semaphore::new(n)),
                    contended: Arc::new(Semaphore::new(1)),
                })
            })
        };
        let deadline = tokio::time::Instant::now() + QUEUE_WAIT;
        let user_lanes = match user {
            Some(u) if self.per_user > 0 => Some(lanes(format!("user\u{0}{u}"), self.per_user)),
            _ => None,
        };
        let user_slot = match &user_lanes {
            Some(l) => Some(
                tokio::time::timeout_at(deadline, l.all.clone().acquire_owned())
                    .await
                    .ok()?
                    .ok()?,
            ),
            None => None,
        };
        let own_lanes = lanes(credential.to_owned(), self.per_credential);
        let own = tokio::time::timeout_at(deadline, own_lanes.all.clone().acquire_owned())
            .await
            .ok()?
            .ok()?;
        // Contended, it waits its turn on the one lane, but never longer than
        // the queue's deadline: past it, the search runs on its own slot (a
        // preference, never a refusal the credential's count would not give —
        // searches that hang on a store outage must not turn into 429s).
        let (caller, one_lane) = match (&user_lanes, user) {
            (Some(l), Some(u)) => (format!("user\u{0}{u}"), l.contended.clone()),
            _ => (credential.to_owned(), own_lanes.contended.clone()),
        };
        let contended = match self.contended(&caller, Instant::now()) {
            true => tokio::time::timeout_at(deadline, one_lane.acquire_owned())
                .await
                .ok()
                .and_then(Result::ok),
            false => None,
        };
        Some(SearchSlot {
            _user: user_slot,
            _own: own,
            _contended: contended,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_credential_gets_its_slots_and_no_more_and_others_keep_theirs() {
        let s = SearchSlots::new(2);
        let a1 = s.acquire("a", None).await.unwrap();
        let _a2 = s.acquire("a", None).await.unwrap();
        assert!(s.acquire("a", None).await.is_none(), "a third waits, then is refused");
        assert!(
            s.acquire("b", None).await.is_some(),
            "another credential is not affected"
        );
        drop(a1);
        // "b" just searched: "a" now runs one at a time, and holds one.
        assert!(s.acquire("a", None).await.is_some(), "a freed slot is taken");
    }

    #[tokio::test]
    async fn while_another_credential_searches_a_credential_runs_one_search_at_a_time() {
        let s = SearchSlots::new(4);
        let alone: Vec<_> = futures::future::join_all((0..4).map(|_| s.acquire("flood", None))).await;
        assert!(
            alone.iter().all(Option::is_some),
            "alone, a credential runs its full count"
        );
        drop(alone);
        let _other = s.acquire("other", None).await.unwrap();
        let one = s.acquire("flood", None).await.unwrap();
        let s = Arc::new(s);
        let second = tokio::spawn({
            let s = s.clone();
            async move { s.acquire("flood", None).await.is_some() }
        });
        for _ in 0..100 {
            tokio::task::yield_now().await;
        }
        assert!(
            !second.is_finished(),
            "a second waits while another credential searches"
        );
        drop(one);
        assert!(second.await.unwrap(), "and runs once the first is done");
        // A lane held past the queue's deadline: the search runs on its own slot.
        let held = s.acquire("flood", None).await.unwrap();
        assert!(held._contended.is_some());
        let late = s.acquire("flood", None).await.unwrap();
        assert!(late._contended.is_none(), "not refused: its own slot, after the wait");
        drop((held, late));
        // Once the other credential has been quiet for CONTENDED_FOR, the full count again.
        assert!(!s.contended("flood", Instant::now() + CONTENDED_FOR));
        assert!(
            s.contended("other", Instant::now()),
            "and the other one, after the flood's searches"
        );
    }

    #[tokio::test]
    async fn a_users_tokens_share_the_users_slots() {
        let s = SearchSlots::with_user_limit(2, 3);
        let held: Vec<_> = futures::future::join_all(["t1", "t2", "t3"].map(|t| s.acquire(t, Some("alice")))).await;
        assert!(held.iter().all(Option::is_some), "three tokens, one slot each");
        assert!(
            s.acquire("t4", Some("alice")).await.is_none(),
            "a fourth token of the same user waits, then is refused"
        );
        assert!(
            s.acquire("t5", Some("bob")).await.is_some(),
            "another user is not affected"
        );
        assert!(s.acquire("team:x", None).await.is_some(), "nor a team");
        drop(held);
        assert!(
            s.acquire("t4", Some("alice")).await.is_some(),
            "freed, the user's slots are taken again"
        );
    }
}
