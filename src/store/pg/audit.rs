//! Reading and expiring the audit trail (`audit_events`; events are written
//! by `store::pg::audit` in the transaction of the change they record).
//! Filters are built into the statement only when given, so each filtered
//! read is an index range scan (`(action, at)`, `(actor, at)`, `(surface,
//! at)` or `(at)`) that stops after `limit` rows, at any table size.

use chrono::{DateTime, Utc};
use sqlx::{PgPool, Postgres, QueryBuilder};

/// One audit event.
#[derive(Clone, Debug, sqlx::FromRow, serde::Serialize)]
pub struct AuditEvent {
    pub id: i64,
    pub at: DateTime<Utc>,
    pub actor: String,
    pub surface: String,
    pub action: String,
    pub target: Option<String>,
    pub detail: serde_json::Value,
}

/// Which events to read; `None` = any.
#[derive(Clone, Debug, Default)]
pub struct AuditFilter {
    pub since: Option<DateTime<Utc>>,
    pub action: Option<String>,
    pub actor: Option<String>,
    pub surface: Option<String>,
}

const COLUMNS: &str = "SELECT id, at, actor::text AS actor, surface, action::text AS action, \
                       target::text AS target, detail FROM audit_events WHERE TRUE";

fn filtered<'a>(f: &'a AuditFilter) -> QueryBuilder<'a, Postgres> {
    let mut q = QueryBuilder::new(COLUMNS);
    if let Some(s) = f.since {
        q.push(" AND at >= ").push_bind(s);
    }
    if let Some(a) = &f.action {
        q.push(" AND action = ").push_bind(a.as_str());
    }
    if let Some(a) = &f.actor {
        q.push(" AND actor = ").push_bind(a.as_str());
    }
    if let Some(s) = &f.surface {
        q.push(" AND surface = ").push_bind(s.as_str());
    }
    q
}

/// The newest `limit` events matching `f`, newest first.
pub async fn newest(pool: &PgPool, f: &AuditFilter, limit: i64) -> Result<Vec<AuditEvent>, sqlx::Error> {
    let mut q = filtered(f);
    q.push(" ORDER BY at DESC, id DESC LIMIT ").push_bind(limit);
    q.build_query_as().fetch_all(pool).await
}

/// Up to `limit` events matching `f` with an id above `after`, oldest first
/// (id order is commit order closely enough for an export; `at` ties too).
pub async fn page_after(
    pool: &PgPool,
    f: &AuditFilter,
    after: i64,
    limit: i64,
) -> Result<Vec<AuditEvent>, sqlx::Error> {
    let mut q = filtered(f);
    q.push(" AND id > ").push_bind(after);
    q.push(" ORDER BY id LIMIT ").push_bind(limit);
    q.build_query_as().fetch_all(pool).await
}

/// The distinct actions recorded (the console filter's choices): a skip scan
/// over the `(action, at)` index, one probe per action, not a table scan.
pub async fn actions(pool: &PgPool) -> Result<Vec<String>, sqlx::Error> {
    sqlx::query_scalar(
        "WITH RECURSIVE a(action) AS (
             (SELECT action FROM audit_events ORDER BY action LIMIT 1)
           UNION ALL
             SELECT (SELECT e.action FROM audit_events e WHERE e.action > a.action ORDER BY e.action LIMIT 1)
               FROM a WHERE a.action IS NOT NULL)
         SELECT action::text FROM a WHERE action IS NOT NULL",
    )
    .fetch_all(pool)
    .await
}

/// Deletes events older than `days` days, at most `batch` rows per
/// statement (short locks, a bounded WAL burst), at most `max_batches`
/// statements; how many rows went.
pub async fn sweep(pool: &PgPool, days: u32, batch: i64, max_batches: u32) -> Result<u64, sqlx::Error> {
    super::sweep_batches(
        pool,
        "DELETE FROM audit_events WHERE id IN (
             SELECT id FROM audit_events WHERE at < now() - make_interval(days => $1) LIMIT $2)",
        days,
        batch,
        max_batches,
    )
    .await
}

/// The newest `limit` write events of one library since `since`, newest
/// first: its own (created, renamed, deleted, memberships: the library is
/// the target) and its items' (`detail.library_uid`). One range read of
/// `audit_events_library_idx`.
pub async fn of_library(
    pool: &PgPool,
    library_uid: &str,
    since: DateTime<Utc>,
    limit: i64,
) -> Result<Vec<AuditEvent>, sqlx::Error> {
    sqlx::query_as(
        "SELECT id, at, actor::text AS actor, surface, action::text AS action,
                target::text AS target, detail FROM audit_events
          WHERE COALESCE(detail->>'library_uid', target) = $1 AND at >= $2
          ORDER BY at DESC, id DESC LIMIT $3",
    )
    .bind(library_uid)
    .bind(since)
    .bind(limit)
    .fetch_all(pool)
    .await
}
