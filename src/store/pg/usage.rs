//! Usage per credential (`usage_hourly`, issue 24): batched upserts of the
//! in-memory counts, and the reports of the console and the CLI.

use sqlx::PgPool;

use crate::usage::UsageKey;

/// Adds counts to their hours, in one statement.
pub async fn add(pool: &PgPool, rows: &[(UsageKey, u64)]) -> Result<(), sqlx::Error> {
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
