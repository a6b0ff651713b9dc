//! Usage per credential (issue 24): tool calls counted per hour by
//! (credential, tool, library-count bucket, outcome). Counted in memory on
//! the request path (one short lock, no store round trip) and written to
//! Postgres in batches by `flush_every`, off the request path: a flush that
//! fails, or a replica that dies, loses at most one flush interval of counts.
//! Never Prometheus labels: credentials are unbounded.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use sqlx::PgPool;

/// One counter's identity: the hour (UTC, seconds since the epoch at its
/// start), who, which tool, how many libraries the credential read, and the
/// outcome (the `mcp_tool_calls_total` outcomes).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct UsageKey {
    pub hour: i64,
    /// `token:<id>`, `team:<uuid>`, or a per-turn JWT's `sub`.
    pub credential: Arc<str>,
    /// `token`, `team`, `per_turn`.
    pub kind: &'static str,
    /// One of the server's tools, or `other`.
    pub tool: &'static str,
    /// The library-count bucket (`libraries_bucket`).
    pub libraries: &'static str,
    pub outcome: &'static str,
}

/// Longest credential kept (a per-turn `sub` is the signer's string).
const MAX_CREDENTIAL: usize = 200;

/// How many libraries a credential read, in a few buckets (a count per
/// credential would be noise, the exact list is in its grant).
pub fn libraries_bucket(n: usize) -> &'static str {
    match n {
        0 => "0",
        1 => "1",
        2..=5 => "2-5",
        6..=20 => "6-20",
        21..=100 => "21-100",
        _ => "101+",
    }
}

/// The in-memory counts of one replica since its last flush.
#[derive(Default)]
pub struct UsageCounter {
    counts: Mutex<HashMap<UsageKey, u64>>,
}

impl UsageCounter {
    /// Counts one tool call (or refusal).
    pub fn record(
        &self,
        kind: &'static str,
        credential: &str,
        libraries: usize,
        tool: &'static str,
        outcome: &'static str,
    ) {
        let credential: String = credential.chars().take(MAX_CREDENTIAL).collect();
        let key = UsageKey {
            hour: chrono::Utc::now().timestamp().div_euclid(3600) * 3600,
            credential: credential.into(),
            kind,
            tool,
            libraries: libraries_bucket(libraries),
            outcome,
        };
        if let Ok(mut c) = self.counts.lock() {
            *c.entry(key).or_default() += 1;
        }
    }

    /// Takes every count so far, leaving none.
    pub fn take(&self) -> Vec<(UsageKey, u64)> {
        match self.counts.lock() {
            Ok(mut c) => c.drain().collect(),
            Err(_) => Vec::new(),
        }
    }

    /// Writes the counts so far to Postgres in one statement. On failure they
    /// are dropped (logged): at most one interval is lost, never a request slowed.
    pub async fn flush(&self, pool: &PgPool) {
        let rows = self.take();
        if rows.is_empty() {
            return;
        }
        if let Err(e) = add(pool, &rows).await {
            tracing::warn!(error = %e, counters = rows.len(), "usage counts lost: could not write them");
        }
    }
}

/// Flushes `usage` every `every` until the task is aborted.
pub async fn flush_every(pool: PgPool, usage: Arc<UsageCounter>, every: Duration) {
    let mut tick = tokio::time::interval(every.max(Duration::from_secs(1)));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    tick.tick().await;
    loop {
        tick.tick().await;
        usage.flush(&pool).await;
    }
}

/// Adds counts to their hours, in one statement.
async fn add(pool: &PgPool, rows: &[(UsageKey, u64)]) -> Result<(), sqlx::Error> {
    let mut hour = Vec::with_capacity(rows.len());
    let mut credential = Vec::with_capacity(rows.len());
    let mut kind = Vec::with_capacity(rows.len());
    let mut tool = Vec::with_capacity(rows.len());
    let mut libraries = Vec::with_capacity(rows.len());
    let mut outcome = Vec::with_capacity(rows.len());
    let mut calls = Vec::with_capacity(rows.len());
    for (k, n) in rows {
        hour.push(k.hour as f64);
        credential.push(k.credential.to_string());
        kind.push(k.kind);
        tool.push(k.tool);
        libraries.push(k.libraries);
        outcome.push(k.outcome);
        calls.push(i64::try_from(*n).unwrap_or(i64::MAX));
    }
    sqlx::query(
        "INSERT INTO usage_hourly (hour, credential, kind, tool, libraries, outcome, calls)
         SELECT to_timestamp(h), c, k, t, l, o, n
           FROM unnest($1::float8[], $2::text[], $3::text[], $4::text[], $5::text[], $6::text[], $7::int8[])
                AS u(h, c, k, t, l, o, n)
         ON CONFLICT (hour, kind, credential, tool, libraries, outcome)
         DO UPDATE SET calls = usage_hourly.calls + excluded.calls",
    )
    .bind(hour)
    .bind(credential)
    .bind(kind)
    .bind(tool)
    .bind(libraries)
    .bind(outcome)
    .bind(calls)
    .execute(pool)
    .await
    .map(|_| ())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn calls_are_counted_per_key_and_taken_once() {
        let u = UsageCounter::default();
        u.record("token", "token:1", 1, "search", "ok");
        u.record("token", "token:1", 1, "search", "ok");
        u.record("token", "token:1", 1, "search", "refused");
        u.record("team", "team:x", 7, "search", "ok");
        let mut got: Vec<(String, &str, &str, u64)> = u
            .take()
            .into_iter()
            .map(|(k, n)| (k.credential.to_string(), k.libraries, k.outcome, n))
            .collect();
        got.sort();
        assert_eq!(
            got,
            [
                ("team:x".to_owned(), "6-20", "ok", 1),
                ("token:1".to_owned(), "1", "ok", 2),
                ("token:1".to_owned(), "1", "refused", 1),
            ]
        );
        assert!(u.take().is_empty());
    }

    #[test]
    fn library_buckets() {
        let b: Vec<&str> = [0, 1, 2, 5, 6, 20, 21, 100, 101].map(libraries_bucket).to_vec();
        assert_eq!(b, ["0", "1", "2-5", "2-5", "6-20", "6-20", "21-100", "21-100", "101+"]);
    }
}
