//! Per-library read activity (`library_activity_hourly`, issue 53): the
//! reports of the console and the CLI. The batched upserts are
//! `crate::activity`'s own (its one writer, like the usage counts).

use chrono::{DateTime, Utc};
use futures::TryStreamExt;
use sqlx::PgPool;

/// One hour of one reader's calls of one tool on one library. The reader is
/// named as the issue asks: a team by its id (and its name when it still
/// exists), a token by its id with its user's name, a per-turn caller by its
/// JWT's `sub`.
#[derive(Clone, Debug, PartialEq, Eq, sqlx::FromRow, serde::Serialize)]
pub struct ActivityRow {
    pub hour: DateTime<Utc>,
    pub library_uid: String,
    /// `token`, `team` or `per_turn`.
    pub reader_kind: String,
    /// The token's id, the team's uuid, or the per-turn `sub`.
    pub reader_id: String,
    /// A token's user, by name.
    #[sqlx(rename = "user_name")]
    pub user: Option<String>,
    /// A team's name, when it still exists.
    pub team_name: Option<String>,
    pub tool: String,
    /// A hash or the text of the search, only when the operator keeps them
    /// (`MNEMOSYNE_ACTIVITY_QUERY`).
    pub query: Option<String>,
    pub calls: i64,
    pub results: i64,
}

const SELECT: &str = "SELECT a.hour, a.library_uid::text AS library_uid, a.reader_kind::text AS reader_kind,
        CASE WHEN a.reader_kind IN ('token', 'team') THEN split_part(a.reader, ':', 2) ELSE a.reader::text END
            AS reader_id,
        u.username::text AS user_name, tm.name::text AS team_name, a.tool::text AS tool,
        NULLIF(a.query, '')::text AS query, a.calls, a.results
   FROM library_activity_hourly a
   LEFT JOIN users u ON u.id = a.user_id
   LEFT JOIN teams tm ON a.reader_kind = 'team' AND a.reader = 'team:' || tm.id::text
  WHERE a.library_uid = $1 AND a.hour >= date_trunc('hour', $2::timestamptz)";

/// The library's activity since `since` (from the start of its hour), newest
/// hour first, then most calls; at most `limit` rows.
pub async fn for_library(
    pool: &PgPool,
    library_uid: &str,
    since: DateTime<Utc>,
    limit: i64,
) -> Result<Vec<ActivityRow>, sqlx::Error> {
    sqlx::query_as(&format!(
        "{SELECT} ORDER BY a.hour DESC, a.calls DESC, a.reader_kind, a.reader, a.tool, a.query LIMIT $3"
    ))
    .bind(library_uid)
    .bind(since)
    .bind(limit)
    .fetch_all(pool)
    .await
}

/// Every row of the library's activity since `since`, oldest hour first,
/// streamed to `each` (an export of any size holds one row at a time).
pub async fn each_for_library(
    pool: &PgPool,
    library_uid: &str,
    since: DateTime<Utc>,
    mut each: impl FnMut(ActivityRow) -> std::io::Result<()>,
) -> Result<u64, sqlx::Error> {
    let sql = format!("{SELECT} ORDER BY a.hour, a.reader_kind, a.reader, a.tool, a.query");
    let mut rows = sqlx::query_as::<_, ActivityRow>(&sql)
        .bind(library_uid)
        .bind(since)
        .fetch(pool);
    let mut n = 0;
    while let Some(row) = rows.try_next().await? {
        each(row).map_err(sqlx::Error::Io)?;
        n += 1;
    }
    Ok(n)
}

/// Deletes hourly activity older than `days` days, at most `batch` rows a
/// statement and `max_batches` statements a call; how many.
pub async fn sweep(pool: &PgPool, days: u32, batch: i64, max_batches: u32) -> Result<u64, sqlx::Error> {
    super::sweep_batches(
        pool,
        "DELETE FROM library_activity_hourly WHERE ctid IN (
             SELECT ctid FROM library_activity_hourly WHERE hour < now() - make_interval(days => $1) LIMIT $2)",
        days,
        batch,
        max_batches,
    )
    .await
}
