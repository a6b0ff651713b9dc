//! The audit trail: events of graph changes written right after the graph
//! commits (Postgres changes write theirs in their own transaction).

use chrono::{DateTime, Utc};
use sqlx::PgPool;

use crate::store::pg;

/// Writes the audit event of a change the graph has already committed. A
/// failure cannot undo the change, so it does not fail the caller: it is
/// logged as an error naming the event (never its secrets: there are none in
/// an event).
pub async fn after_commit(pool: &PgPool, actor: &str, action: &str, target: &str, detail: serde_json::Value) {
    let written = async {
        let mut conn = pool.acquire().await?;
        pg::audit(&mut conn, actor, action, target, detail.clone()).await
    }
    .await;
    if let Err(e) = written {
        tracing::error!(error = %e, actor, action, target, %detail,
                        "audit event NOT written for a committed change");
    }
}

/// The audit events of an ingest that changed something (an unchanged one
/// writes none): the workspace Library it created, and the item created or
/// replaced — uids and counts, never content.
pub async fn ingested(pool: &PgPool, actor: &str, out: &super::ingest::Ingested) {
    use super::ingest::Status;
    if let Some(ws) = &out.created_workspace {
        let detail = serde_json::json!({"workspace_id": ws, "by": "ingest"});
        after_commit(pool, actor, "library_created", &out.library_uid, detail).await;
    }
    let action = match out.status {
        Status::Created => "item_created",
        Status::Replaced => "item_replaced",
        Status::Unchanged => return,
    };
    let detail = serde_json::json!({"library_uid": out.library_uid, "collection_uid": out.collection_uid,
                                    "chunk_count": out.chunk_count});
    after_commit(pool, actor, action, &out.item_uid, detail).await;
}

/// A `--since` value: an RFC 3339 time, a date (`2026-11-01`, midnight UTC),
/// or an age (`30m`, `24h`, `7d`) before `now`.
pub fn parse_since(s: &str, now: DateTime<Utc>) -> Result<DateTime<Utc>, String> {
    let s = s.trim();
    if let Ok(t) = DateTime::parse_from_rfc3339(s) {
        return Ok(t.with_timezone(&Utc));
    }
    if let Ok(d) = chrono::NaiveDate::parse_from_str(s, "%Y-%m-%d") {
        return Ok(d.and_time(chrono::NaiveTime::MIN).and_utc());
    }
    let unit = s.chars().last().unwrap_or(' ');
    let n: Option<i64> = s[..s.len() - unit.len_utf8().min(s.len())].parse().ok();
    let age = match (n, unit) {
        (Some(n), 'm') if n >= 0 => chrono::Duration::try_minutes(n),
        (Some(n), 'h') if n >= 0 => chrono::Duration::try_hours(n),
        (Some(n), 'd') if n >= 0 => chrono::Duration::try_days(n),
        _ => None,
    };
    age.and_then(|a| now.checked_sub_signed(a))
        .ok_or_else(|| format!("--since {s:?}: give an RFC 3339 time, a date (2026-11-01) or an age (30m, 24h, 7d)"))
}

/// Deletes audit events older than `days` days (0: keep forever); how many.
/// Bounded per call: what is left over goes on the next sweep.
pub async fn sweep(pool: &PgPool, days: u32) -> Result<u64, sqlx::Error> {
    if days == 0 {
        return Ok(0);
    }
    pg::audit::sweep(pool, days, 10_000, 100).await
}

/// Deletes hourly usage counts older than `days` days (0: keep forever);
/// how many. Bounded per call like [`sweep`].
pub async fn sweep_usage(pool: &PgPool, days: u32) -> Result<u64, sqlx::Error> {
    if days == 0 {
        return Ok(0);
    }
    pg::usage::sweep(pool, days, 10_000, 100).await
}

/// Deletes per-library read activity older than `days` days (0: keep
/// forever); how many. It is kept as long as the audit trail it sits
/// beside. Bounded per call like [`sweep`].
pub async fn sweep_activity(pool: &PgPool, days: u32) -> Result<u64, sqlx::Error> {
    if days == 0 {
        return Ok(0);
    }
    pg::activity::sweep(pool, days, 10_000, 100).await
}

/// Sweeps expired audit events and per-library activity (`audit_days`) and
/// usage counts (`usage_days`) now and then every `every`, for ever (a
/// server task; every replica may run it, a sweep is idempotent).
pub async fn retention_loop(pool: PgPool, audit_days: u32, usage_days: u32, every: std::time::Duration) {
    if audit_days == 0 && usage_days == 0 {
        return;
    }
    let mut tick = tokio::time::interval(every);
    loop {
        tick.tick().await;
        match sweep(&pool, audit_days).await {
            Ok(0) => {}
            Ok(n) => tracing::info!(deleted = n, days = audit_days, "audit events past retention deleted"),
            Err(e) => tracing::warn!(error = %e, "audit retention sweep failed; retried on the next tick"),
        }
        match sweep_activity(&pool, audit_days).await {
            Ok(0) => {}
            Ok(n) => tracing::info!(
                deleted = n,
                days = audit_days,
                "library activity past retention deleted"
            ),
            Err(e) => tracing::warn!(error = %e, "activity retention sweep failed; retried on the next tick"),
        }
        match sweep_usage(&pool, usage_days).await {
            Ok(0) => {}
            Ok(n) => tracing::info!(deleted = n, days = usage_days, "usage counts past retention deleted"),
            Err(e) => tracing::warn!(error = %e, "usage retention sweep failed; retried on the next tick"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn since_takes_a_time_a_date_or_an_age() {
        let now = DateTime::parse_from_rfc3339("2026-11-26T12:00:00Z")
            .unwrap()
            .with_timezone(&Utc);
        let at = |s: &str| parse_since(s, now).map(|t| t.to_rfc3339());
        assert_eq!(at("2026-11-01T08:30:00+01:00").unwrap(), "2026-11-01T07:30:00+00:00");
        assert_eq!(at("2026-11-01").unwrap(), "2026-11-01T00:00:00+00:00");
        assert_eq!(at("7d").unwrap(), "2026-11-19T12:00:00+00:00");
        assert_eq!(at("24h").unwrap(), "2026-11-25T12:00:00+00:00");
        assert_eq!(at("30m").unwrap(), "2026-11-26T11:30:00+00:00");
        for bad in ["", "d", "-1d", "7w", "yesterday", "2026-13-01"] {
            assert!(at(bad).is_err(), "{bad}");
        }
    }
}
