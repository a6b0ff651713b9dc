//! Usage per credential (`usage_hourly`, issue 24): the reports of the console
//! and the CLI. The batched upserts are `crate::usage`'s own (its one writer,
//! so the counter below the stores needs no store module).

use sqlx::PgPool;

/// One credential's calls over the period.
#[derive(Clone, Debug, sqlx::FromRow, serde::Serialize)]
pub struct CredentialUsage {
    pub credential: String,
    pub kind: String,
    /// The token's or team's name, when it still exists.
    pub name: Option<String>,
    pub calls: i64,
    pub refused: i64,
    pub errors: i64,
}

/// One tool's calls over the period.
#[derive(Clone, Debug, sqlx::FromRow, serde::Serialize)]
pub struct ToolUsage {
    pub tool: String,
    pub calls: i64,
    pub refused: i64,
    pub errors: i64,
}

/// The credentials of `kind` with the most calls in the last `days` days.
pub async fn top_credentials(
    pool: &PgPool,
    kind: &str,
    days: u32,
    limit: i64,
) -> Result<Vec<CredentialUsage>, sqlx::Error> {
    sqlx::query_as(
        "SELECT u.credential, u.kind,
                COALESCE(tk.name, tm.name) AS name,
                sum(u.calls)::int8 AS calls,
                COALESCE(sum(u.calls) FILTER (WHERE u.outcome = 'refused'), 0)::int8 AS refused,
                COALESCE(sum(u.calls) FILTER (WHERE u.outcome IN ('tool_error', 'protocol_error')), 0)::int8 AS errors
           FROM usage_hourly u
           LEFT JOIN mcp_tokens tk ON u.kind = 'token' AND u.credential = 'token:' || tk.id
           LEFT JOIN teams tm ON u.kind = 'team' AND u.credential = 'team:' || tm.id::text
          WHERE u.kind = $1 AND u.hour >= date_trunc('hour', now()) - make_interval(days => $2)
          GROUP BY u.credential, u.kind, tk.name, tm.name
          ORDER BY calls DESC, u.credential
          LIMIT $3",
    )
    .bind(kind)
    .bind(days as i32)
    .bind(limit)
    .fetch_all(pool)
    .await
}

/// Every tool's calls in the last `days` days, most used first.
pub async fn by_tool(pool: &PgPool, days: u32) -> Result<Vec<ToolUsage>, sqlx::Error> {
    sqlx::query_as(
        "SELECT tool, sum(calls)::int8 AS calls,
                COALESCE(sum(calls) FILTER (WHERE outcome = 'refused'), 0)::int8 AS refused,
                COALESCE(sum(calls) FILTER (WHERE outcome IN ('tool_error', 'protocol_error')), 0)::int8 AS errors
           FROM usage_hourly
          WHERE hour >= date_trunc('hour', now()) - make_interval(days => $1)
          GROUP BY tool
          ORDER BY calls DESC, tool",
    )
    .bind(days as i32)
    .fetch_all(pool)
    .await
}

/// Deletes hourly counts older than `days` days, at most `batch` rows a
/// statement and `max_batches` statements a call; how many.
pub async fn sweep(pool: &PgPool, days: u32, batch: i64, max_batches: u32) -> Result<u64, sqlx::Error> {
    super::sweep_batches(
        pool,
        "DELETE FROM usage_hourly WHERE ctid IN (
             SELECT ctid FROM usage_hourly WHERE hour < now() - make_interval(days => $1) LIMIT $2)",
        days,
        batch,
        max_batches,
    )
    .await
}
