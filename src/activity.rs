//! Per-library read activity (issue 53): for each library, who read it
//! (the credential's kind and id, its user, or the team), with which tool,
//! how many calls and how many results or chunks the answers carried from
//! it, per hour. Counted in memory on the request path (one short lock, no
//! store round trip) and added to `library_activity_hourly` in one statement
//! per flush (`flush_every`, every `MNEMOSYNE_USAGE_FLUSH_SECS`, and once more
//! at shutdown), so 1,000 searches a second cost a handful of rows, not a
//! row each. A replica that dies loses at most one flush interval of counts;
//! everything flushed survives restarts.
//!
//! Query text is not kept by default (`QueryMode::Off`): a search's words may
//! be sensitive. `Hash` keeps a SHA-256 of it (repeats of one query can be
//! told apart, and a guessed query confirmed, by whoever may read the
//! activity); `Text` keeps the text itself, shown to the library's owners,
//! managers and staff.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use sha2::{Digest, Sha256};
use sqlx::PgPool;

/// What a search's query leaves in the activity rows.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum QueryMode {
    /// Nothing (the default).
    #[default]
    Off,
    /// The hex SHA-256 of the query text.
    Hash,
    /// The query text.
    Text,
}

impl std::fmt::Display for QueryMode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            QueryMode::Off => "off",
            QueryMode::Hash => "hash",
            QueryMode::Text => "text",
        })
    }
}

/// Longest query text kept (the `search` tool accepts 1,000 characters).
const MAX_QUERY: usize = 1000;
/// Longest reader id kept (a per-turn `sub` is the signer's string).
const MAX_READER: usize = 200;

/// Who read: the principal's kind (`token`, `team`, `per_turn`), its id
/// (`token:<id>`, `team:<uuid>`, or a per-turn JWT's `sub`) and, for a token,
/// its user's id.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Reader {
    pub kind: &'static str,
    pub id: Arc<str>,
    pub user_id: Option<i64>,
}

impl Reader {
    /// `user` is the principal's `user:<id>` (tokens only).
    pub fn new(kind: &'static str, id: &str, user: Option<&str>) -> Self {
        let id: String = id.chars().take(MAX_READER).collect();
        Reader {
            kind,
            id: id.into(),
            user_id: user.and_then(|u| u.strip_prefix("user:")).and_then(|n| n.parse().ok()),
        }
    }
}

/// One counter's identity.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct ActivityKey {
    /// The hour (UTC, seconds since the epoch at its start).
    pub hour: i64,
    pub library: Arc<str>,
    pub reader: Reader,
    /// One of the server's tools.
    pub tool: &'static str,
    /// Empty unless the operator keeps a hash or the text (`QueryMode`).
    pub query: Arc<str>,
}

/// Calls and results of one key.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Counts {
    pub calls: u64,
    pub results: u64,
}

/// The in-memory counts of one replica since its last flush.
pub struct ActivityCounter {
    enabled: bool,
    query: QueryMode,
    counts: Mutex<HashMap<ActivityKey, Counts>>,
}

impl Default for ActivityCounter {
    fn default() -> Self {
        ActivityCounter::new(true, QueryMode::Off)
    }
}

impl ActivityCounter {
    pub fn new(enabled: bool, query: QueryMode) -> Self {
        ActivityCounter {
            enabled,
            query,
            counts: Mutex::new(HashMap::new()),
        }
    }

    /// What a query leaves in the rows under the configured mode.
    fn query_key(&self, query: Option<&str>) -> Arc<str> {
        match (self.query, query) {
            (QueryMode::Off, _) | (_, None) => Arc::from(""),
            (QueryMode::Hash, Some(q)) => hex::encode(Sha256::digest(q.as_bytes())).into(),
            (QueryMode::Text, Some(q)) => q.chars().take(MAX_QUERY).collect::<String>().into(),
        }
    }

    /// Counts one successful call of `tool` by `reader`: one call against each
    /// library its answer carried content from, with how many results (or
    /// chunks, collections, items, entries) came from it.
    pub fn record(&self, reader: &Reader, tool: &'static str, query: Option<&str>, reads: &[(String, u64)]) {
        if !self.enabled || reads.is_empty() {
            return;
        }
        let hour = chrono::Utc::now().timestamp().div_euclid(3600) * 3600;
        let query = self.query_key(query);
        if let Ok(mut c) = self.counts.lock() {
            for (library, results) in reads {
                let key = ActivityKey {
                    hour,
                    library: library.as_str().into(),
                    reader: reader.clone(),
                    tool,
                    query: query.clone(),
                };
                let e = c.entry(key).or_default();
                e.calls += 1;
                e.results += results;
            }
        }
    }

    /// Takes every count so far, leaving none.
    pub fn take(&self) -> Vec<(ActivityKey, Counts)> {
        match self.counts.lock() {
            Ok(mut c) => c.drain().collect(),
            Err(_) => Vec::new(),
        }
    }

    /// Adds the counts so far to Postgres in one statement. On failure they
    /// are dropped (logged): at most one interval is lost, never a request slowed.
    pub async fn flush(&self, pool: &PgPool) {
        let rows = self.take();
        if rows.is_empty() {
            return;
        }
        if let Err(e) = add(pool, &rows).await {
            tracing::warn!(error = %e, counters = rows.len(), "library activity counts lost: could not write them");
        }
    }
}

/// Flushes `activity` every `every` until the task is aborted.
pub async fn flush_every(pool: PgPool, activity: Arc<ActivityCounter>, every: Duration) {
    let mut tick = tokio::time::interval(every.max(Duration::from_secs(1)));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    tick.tick().await;
    loop {
        tick.tick().await;
        activity.flush(&pool).await;
    }
}

/// Adds counts to their hours, in one statement.
async fn add(pool: &PgPool, rows: &[(ActivityKey, Counts)]) -> Result<(), sqlx::Error> {
    let n = rows.len();
    let (mut hour, mut library, mut kind, mut reader, mut user, mut tool, mut query, mut calls, mut results) = (
        Vec::with_capacity(n),
        Vec::with_capacity(n),
        Vec::with_capacity(n),
        Vec::with_capacity(n),
        Vec::with_capacity(n),
        Vec::with_capacity(n),
        Vec::with_capacity(n),
        Vec::with_capacity(n),
        Vec::with_capacity(n),
    );
    for (k, c) in rows {
        hour.push(k.hour as f64);
        library.push(k.library.to_string());
        kind.push(k.reader.kind);
        reader.push(k.reader.id.to_string());
        user.push(k.reader.user_id);
        tool.push(k.tool);
        query.push(k.query.to_string());
        calls.push(i64::try_from(c.calls).unwrap_or(i64::MAX));
        results.push(i64::try_from(c.results).unwrap_or(i64::MAX));
    }
    sqlx::query(
        "INSERT INTO library_activity_hourly
                (hour, library_uid, reader_kind, reader, user_id, tool, query, calls, results)
         SELECT to_timestamp(h), l, k, r, u, t, q, c, n
           FROM unnest($1::float8[], $2::text[], $3::text[], $4::text[], $5::int8[], $6::text[],
                       $7::text[], $8::int8[], $9::int8[])
                AS x(h, l, k, r, u, t, q, c, n)
         ON CONFLICT (library_uid, hour, reader_kind, reader, tool, query)
         DO UPDATE SET calls = library_activity_hourly.calls + excluded.calls,
                       results = library_activity_hourly.results + excluded.results,
                       user_id = excluded.user_id",
    )
    .bind(hour)
    .bind(library)
    .bind(kind)
    .bind(reader)
    .bind(user)
    .bind(tool)
    .bind(query)
    .bind(calls)
    .bind(results)
    .execute(pool)
    .await
    .map(|_| ())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reads(v: &[(&str, u64)]) -> Vec<(String, u64)> {
        v.iter().map(|(l, n)| (l.to_string(), *n)).collect()
    }

    /// (library, reader, user id, tool, query, calls, results).
    type Row = (String, String, Option<i64>, &'static str, String, u64, u64);

    #[test]
    fn calls_and_results_are_added_per_library_reader_and_tool() {
        let a = ActivityCounter::default();
        let tok = Reader::new("token", "token:7", Some("user:3"));
        let team = Reader::new("team", "team:x", None);
        a.record(&tok, "search", Some("q"), &reads(&[("lib_a", 3), ("lib_b", 1)]));
        a.record(&tok, "search", Some("other"), &reads(&[("lib_a", 2)]));
        a.record(&team, "get_chunk", None, &reads(&[("lib_a", 3)]));
        a.record(&team, "search", None, &[]);
        let mut got: Vec<Row> = a
            .take()
            .into_iter()
            .map(|(k, c)| {
                (
                    k.library.to_string(),
                    k.reader.id.to_string(),
                    k.reader.user_id,
                    k.tool,
                    k.query.to_string(),
                    c.calls,
                    c.results,
                )
            })
            .collect();
        got.sort();
        assert_eq!(
            got,
            [
                ("lib_a".into(), "team:x".into(), None, "get_chunk", String::new(), 1, 3),
                ("lib_a".into(), "token:7".into(), Some(3), "search", String::new(), 2, 5),
                ("lib_b".into(), "token:7".into(), Some(3), "search", String::new(), 1, 1),
            ]
        );
        assert!(a.take().is_empty());
    }

    #[test]
    fn the_query_is_kept_only_as_the_operator_chose() {
        let r = Reader::new("token", "token:1", None);
        for (mode, want) in [
            (QueryMode::Off, String::new()),
            (QueryMode::Hash, hex::encode(Sha256::digest(b"secret plans"))),
            (QueryMode::Text, "secret plans".to_owned()),
        ] {
            let a = ActivityCounter::new(true, mode);
            a.record(&r, "search", Some("secret plans"), &reads(&[("l", 1)]));
            let rows = a.take();
            assert_eq!(&*rows[0].0.query, want.as_str(), "{mode:?}");
        }
        let off = ActivityCounter::new(false, QueryMode::Text);
        off.record(&r, "search", Some("q"), &reads(&[("l", 1)]));
        assert!(off.take().is_empty(), "activity off records nothing");
    }
}
