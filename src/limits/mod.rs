//! Per-principal rate limits (token buckets, `governor`), kept in memory on
//! each replica. A configured rate is for the whole deployment: each replica
//! enforces it divided by the number of live replicas it knows (counted with
//! the auth heartbeat), and rebuilds its buckets when that number changes.
//!
//! Two buckets: one per principal (`team:<id>`, `token:<id>`, or the per-turn
//! `sub` — every turn of one Daedalus deployment shares it) over every MCP
//! request, and one per principal and tool over `tools/call`. A token or a
//! team may carry its own request rate (issue 24), used instead of the
//! configured one.

pub mod console;
pub mod search;

use std::collections::HashMap;
use std::num::NonZeroU32;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use governor::{clock::Clock, clock::DefaultClock, DefaultKeyedRateLimiter, Quota, RateLimiter};

/// Over a limit: how long until a request would pass.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limited {
    pub retry_after: Duration,
}

impl Limited {
    /// `Retry-After` in whole seconds (at least 1).
    pub fn retry_after_secs(&self) -> u64 {
        self.retry_after.as_secs_f64().ceil().max(1.0) as u64
    }
}

/// A keyed token bucket: `per_minute` requests a minute, a burst of ten
/// seconds' worth. `None` when the limit is off (0).
struct Bucket(Option<DefaultKeyedRateLimiter<Arc<str>>>);

/// This replica's share of a deployment-wide rate: `per_minute / replicas`,
/// rounded up (never 0 while the limit is on).
fn share(per_minute: u32, replicas: usize) -> u32 {
    let n = replicas.max(1) as u32;
    per_minute.div_ceil(n)
}

impl Bucket {
    fn new(per_minute: u32) -> Self {
        Bucket(NonZeroU32::new(per_minute).map(|rate| {
            let burst = NonZeroU32::new((per_minute / 6).max(1)).unwrap_or(rate);
            RateLimiter::dashmap(Quota::per_minute(rate).allow_burst(burst))
        }))
    }

    fn check(&self, key: &str) -> Result<(), Limited> {
        let Some(l) = &self.0 else { return Ok(()) };
        l.check_key(&Arc::from(key)).map_err(|not_until| Limited {
            retry_after: not_until.wait_time_from(DefaultClock::default().now()),
        })
    }

    fn shrink(&self) {
        if let Some(l) = &self.0 {
            l.retain_recent();
            l.shrink_to_fit();
        }
    }
}

/// The buckets for one replica count: the principal buckets by deployment
/// rate (the configured one, and each credential override in use), and the
/// tool buckets.
struct Buckets {
    replicas: usize,
    principal: HashMap<u32, Bucket>,
    tool: Bucket,
}

/// The rate limits of one replica.
pub struct RateLimits {
    principal_per_minute: u32,
    tool_per_minute: u32,
    /// Live replicas (see `AuthCaches::live_replicas`).
    replicas: Arc<AtomicUsize>,
    buckets: RwLock<Buckets>,
}

impl RateLimits {
    /// Limits of a replica that is alone (tests, the CLI).
    pub fn new(principal_per_minute: u32, tool_per_minute: u32) -> Self {
        Self::shared(principal_per_minute, tool_per_minute, Arc::new(AtomicUsize::new(1)))
    }

    /// Limits whose deployment-wide rates are divided by `replicas`.
    pub fn shared(principal_per_minute: u32, tool_per_minute: u32, replicas: Arc<AtomicUsize>) -> Self {
        let n = replicas.load(Ordering::SeqCst).max(1);
        RateLimits {
            principal_per_minute,
            tool_per_minute,
            buckets: RwLock::new(Self::build(tool_per_minute, n)),
            replicas,
        }
    }

    fn build(tool_per_minute: u32, replicas: usize) -> Buckets {
        Buckets {
            replicas,
            principal: HashMap::new(),
            tool: Bucket::new(share(tool_per_minute, replicas)),
        }
    }

    /// Whether per-tool limits are on (then the layer reads the tool name).
    pub fn per_tool(&self) -> bool {
        self.tool_per_minute > 0
    }

    /// Runs `f` over the buckets of the current replica count, rebuilding
    /// them first when it changed (the new shares start with full bursts).
    fn with<T>(&self, f: impl Fn(&Buckets) -> Option<T>, make: impl FnOnce(&mut Buckets) -> T) -> T {
        let n = self.replicas.load(Ordering::SeqCst).max(1);
        if let Ok(b) = self.buckets.read() {
            if b.replicas == n {
                if let Some(out) = f(&b) {
                    return out;
                }
            }
        }
        let mut b = self.buckets.write().unwrap_or_else(|p| p.into_inner());
        if b.replicas != n {
            *b = Self::build(self.tool_per_minute, n);
        }
        make(&mut b)
    }

    /// One MCP request of `principal`, whose credential may carry its own
    /// deployment-wide rate (`override_per_minute`; 0 = no limit).
    pub fn request(&self, principal: &str, override_per_minute: Option<u32>) -> Result<(), Limited> {
        let rate = override_per_minute.unwrap_or(self.principal_per_minute);
        if rate == 0 {
            return Ok(());
        }
        self.with(
            |b| b.principal.get(&rate).map(|bucket| bucket.check(principal)),
            |b| {
                let n = b.replicas;
                b.principal
                    .entry(rate)
                    .or_insert_with(|| Bucket::new(share(rate, n)))
                    .check(principal)
            },
        )
    }

    /// One call of `tool` by `principal`.
    pub fn tool_call(&self, principal: &str, tool: &str) -> Result<(), Limited> {
        let key = format!("{principal}\u{0}{tool}");
        self.with(|b| Some(b.tool.check(&key)), |b| b.tool.check(&key))
    }

    /// Forgets full buckets (idle principals), returning their memory, and
    /// the buckets of override rates no principal uses any more.
    pub fn shrink(&self) {
        let mut b = self.buckets.write().unwrap_or_else(|p| p.into_inner());
        b.principal.retain(|_, bucket| {
            bucket.shrink();
            bucket.0.as_ref().is_some_and(|l| !l.is_empty())
        });
        b.tool.shrink();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_principal_is_limited_after_its_burst_and_others_are_not() {
        let l = RateLimits::new(60, 0);
        // burst = 10 (ten seconds' worth of 60/min)
        for _ in 0..10 {
            assert!(l.request("token:1", None).is_ok());
        }
        let e = l.request("token:1", None).unwrap_err();
        assert!(e.retry_after_secs() >= 1);
        assert!(l.request("token:2", None).is_ok());
        assert!(!l.per_tool());
        assert!(l.tool_call("token:1", "search").is_ok());
    }

    #[test]
    fn tool_buckets_are_per_principal_and_tool() {
        let l = RateLimits::new(0, 6);
        assert!(l.tool_call("team:a", "search").is_ok());
        assert!(l.tool_call("team:a", "search").is_err());
        assert!(l.tool_call("team:a", "get_chunk").is_ok());
        assert!(l.tool_call("team:b", "search").is_ok());
        assert!(l.request("team:a", None).is_ok());
    }

    fn accepted(l: &RateLimits, key: &str, override_per_minute: Option<u32>) -> usize {
        (0..100).filter(|_| l.request(key, override_per_minute).is_ok()).count()
    }

    #[test]
    fn each_replica_takes_its_share_of_the_rate_and_follows_the_count() {
        let replicas = Arc::new(AtomicUsize::new(2));
        let l = RateLimits::shared(120, 12, replicas.clone());
        // 120/min over 2 replicas: 60/min here, a burst of 10.
        assert_eq!(accepted(&l, "token:1", None), 10);
        assert_eq!((0..10).filter(|_| l.tool_call("token:1", "search").is_ok()).count(), 1);
        // A third replica appears: rebuilt at 40/min, a burst of 6.
        replicas.store(3, Ordering::SeqCst);
        assert_eq!(accepted(&l, "token:1", None), 6);
    }

    #[test]
    fn a_credential_override_replaces_the_configured_rate() {
        let l = RateLimits::shared(120, 0, Arc::new(AtomicUsize::new(2)));
        // 600/min over 2 replicas: a burst of 50 here.
        assert_eq!(accepted(&l, "token:fast", Some(600)), 50);
        assert_eq!(accepted(&l, "token:slow", Some(12)), 1);
        assert_eq!(accepted(&l, "token:free", Some(0)), 100);
        assert_eq!(accepted(&l, "token:plain", None), 10);
        l.shrink();
        assert_eq!(accepted(&l, "token:plain", None), 0, "a shrink keeps live buckets");
    }

    #[test]
    fn a_share_is_rounded_up_and_never_zero() {
        assert_eq!(share(100, 3), 34);
        assert_eq!(share(1, 4), 1);
        assert_eq!(share(60, 0), 60);
    }
}
