//! Per-principal rate limits (token buckets, `governor`), kept in memory on
//! each replica: with N replicas behind a load balancer a principal may make
//! up to N times the configured rate.
//!
//! Two buckets: one per principal (`team:<id>`, `token:<id>`, or the per-turn
//! `sub` — every turn of one Daedalus deployment shares it) over every MCP
//! request, and one per principal and tool over `tools/call`.

use std::num::NonZeroU32;
use std::sync::Arc;
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

/// The rate limits of one replica.
pub struct RateLimits {
    principal: Bucket,
    tool: Bucket,
}

impl RateLimits {
    pub fn new(principal_per_minute: u32, tool_per_minute: u32) -> Self {
        RateLimits {
            principal: Bucket::new(principal_per_minute),
            tool: Bucket::new(tool_per_minute),
        }
    }

    /// Whether per-tool limits are on (then the layer reads the tool name).
    pub fn per_tool(&self) -> bool {
        self.tool.0.is_some()
    }

    /// One MCP request of `principal`.
    pub fn request(&self, principal: &str) -> Result<(), Limited> {
        self.principal.check(principal)
    }

    /// One call of `tool` by `principal`.
    pub fn tool_call(&self, principal: &str, tool: &str) -> Result<(), Limited> {
        self.tool.check(&format!("{principal}\u{0}{tool}"))
    }

    /// Forgets full buckets (idle principals), returning their memory.
    pub fn shrink(&self) {
        self.principal.shrink();
        self.tool.shrink();
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
            assert!(l.request("token:1").is_ok());
        }
        let e = l.request("token:1").unwrap_err();
        assert!(e.retry_after_secs() >= 1);
        assert!(l.request("token:2").is_ok());
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
        assert!(l.request("team:a").is_ok());
    }
}
