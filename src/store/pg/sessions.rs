//! Legacy MCP sessions shared by every replica (`mcp_sessions`, issue 31):
//! who owns each one, the client's `initialize` parameters, and when any
//! replica last served it. The caps per credential and per user count these
//! rows, so they hold over the whole deployment.

use std::time::Duration;

use chrono::{DateTime, Utc};
use sqlx::PgPool;

/// Payload prefix announcing that a session ended (DELETE): every replica
/// closes its copy.
pub const ENDED: &str = "mcp_session:";

/// Which per-credential cap refused a new session.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OverCap {
    Credential,
    User,
}

/// The owner of a stored session.
#[derive(Clone, Debug, sqlx::FromRow)]
pub struct Owner {
    pub credential: String,
    pub user_key: Option<String>,
}

fn secs(d: Duration) -> f64 {
    d.as_secs_f64()
}

/// Records a new session of `credential` (and `user_key`) unless either
/// already holds `cap` live sessions anywhere; returns the row's `seen_at`.
/// Advisory locks on the credential and user serialise concurrent opens by
/// the same holder on different replicas, so the cap is exact.
pub async fn open(
    pool: &PgPool,
    id: &str,
    owner: &Owner,
    cap: usize,
    expiry: Duration,
) -> Result<Result<DateTime<Utc>, OverCap>, sqlx::Error> {
    let mut tx = pool.begin().await?;
    let keys: Vec<&str> = std::iter::once(owner.credential.as_str())
        .chain(owner.user_key.as_deref())
        .collect();
    // Always in the same order (credential, then user), so two opens never
    // wait on each other's second lock.
    for key in &keys {
        sqlx::query("SELECT pg_advisory_xact_lock(31, hashtext($1))")
            .bind(key)
            .execute(&mut *tx)
            .await?;
    }
    let (by_credential, by_user): (i64, i64) = sqlx::query_as(
        "SELECT count(*) FILTER (WHERE credential = $1),
                count(*) FILTER (WHERE $2::text IS NOT NULL AND user_key = $2)
           FROM mcp_sessions
          WHERE (credential = $1 OR user_key = $2)
            AND seen_at > now() - make_interval(secs => $3)",
    )
    .bind(&owner.credential)
    .bind(&owner.user_key)
    .bind(secs(expiry))
    .fetch_one(&mut *tx)
    .await?;
    let cap = i64::try_from(cap).unwrap_or(i64::MAX);
    if by_credential >= cap {
        return Ok(Err(OverCap::Credential));
    }
    if by_user >= cap {
        return Ok(Err(OverCap::User));
    }
    let seen: DateTime<Utc> =
        sqlx::query_scalar("INSERT INTO mcp_sessions (id, credential, user_key) VALUES ($1, $2, $3) RETURNING seen_at")
            .bind(id)
            .bind(&owner.credential)
            .bind(&owner.user_key)
            .fetch_one(&mut *tx)
            .await?;
    tx.commit().await?;
    Ok(Ok(seen))
}

/// The client's `initialize` parameters, once its handshake answered.
pub async fn save_init(pool: &PgPool, id: &str, params: &serde_json::Value) -> Result<(), sqlx::Error> {
    sqlx::query("UPDATE mcp_sessions SET init_params = $2 WHERE id = $1")
        .bind(id)
        .bind(params)
        .execute(pool)
        .await
        .map(|_| ())
}

/// The owner of a live session (one primary-key read).
pub async fn owner(pool: &PgPool, id: &str, expiry: Duration) -> Result<Option<Owner>, sqlx::Error> {
    sqlx::query_as::<_, Owner>(
        "SELECT credential, user_key FROM mcp_sessions
          WHERE id = $1 AND init_params IS NOT NULL AND seen_at > now() - make_interval(secs => $2)",
    )
    .bind(id)
    .bind(secs(expiry))
    .fetch_optional(pool)
    .await
}

/// The `initialize` parameters of a live session, to rebuild it.
pub async fn init_params(pool: &PgPool, id: &str, expiry: Duration) -> Result<Option<serde_json::Value>, sqlx::Error> {
    sqlx::query_scalar(
        "SELECT init_params FROM mcp_sessions
          WHERE id = $1 AND init_params IS NOT NULL AND seen_at > now() - make_interval(secs => $2)",
    )
    .bind(id)
    .bind(secs(expiry))
    .fetch_optional(pool)
    .await
    .map(Option::flatten)
}

/// Marks the session served now; `None` when it no longer exists (ended on
/// another replica, or expired everywhere).
pub async fn touch(pool: &PgPool, id: &str) -> Result<Option<DateTime<Utc>>, sqlx::Error> {
    sqlx::query_scalar("UPDATE mcp_sessions SET seen_at = now() WHERE id = $1 RETURNING seen_at")
        .bind(id)
        .fetch_optional(pool)
        .await
}

/// Ends a session everywhere (DELETE): the row goes and every replica hears
/// it at commit.
pub async fn end(pool: &PgPool, id: &str) -> Result<(), sqlx::Error> {
    let mut tx = pool.begin().await?;
    sqlx::query("DELETE FROM mcp_sessions WHERE id = $1")
        .bind(id)
        .execute(&mut *tx)
        .await?;
    super::notify_in(&mut tx, &[format!("{ENDED}{id}")]).await?;
    tx.commit().await
}

/// A replica's copy went idle: the session ends everywhere only if no other
/// replica served it since this one last did (`seen_at` is still the value
/// this replica wrote).
pub async fn end_if_unseen_since(pool: &PgPool, id: &str, seen: DateTime<Utc>) -> Result<bool, sqlx::Error> {
    sqlx::query("DELETE FROM mcp_sessions WHERE id = $1 AND seen_at <= $2")
        .bind(id)
        .bind(seen)
        .execute(pool)
        .await
        .map(|r| r.rows_affected() > 0)
}

/// Forgets sessions no replica has served within `expiry` (any replica may
/// run it), and handshakes never completed within it.
pub async fn sweep(pool: &PgPool, expiry: Duration) -> Result<u64, sqlx::Error> {
    sqlx::query("DELETE FROM mcp_sessions WHERE seen_at < now() - make_interval(secs => $1)")
        .bind(secs(expiry))
        .execute(pool)
        .await
        .map(|r| r.rows_affected())
}
