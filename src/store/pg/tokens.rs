//! Opaque MCP tokens (`mcp_tokens`). Only the SHA-256 of the plaintext is stored.

use chrono::{DateTime, Utc};
use sqlx::types::Json;
use sqlx::{PgExecutor, PgPool};

#[derive(Clone, Debug, sqlx::FromRow)]
pub struct TokenInfo {
    pub id: i64,
    pub name: String,
    pub username: String,
    pub allowed_libraries: Json<Vec<String>>,
    /// The tool allowlist; `None` = every tool.
    pub allowed_tools: Option<Vec<String>>,
    /// Its own request rate a minute; `None` = the configured one.
    pub rate_limit_per_minute: Option<i32>,
    pub active: bool,
    pub expires_at: Option<DateTime<Utc>>,
    pub last_used_at: Option<DateTime<Utc>>,
    pub created_at: DateTime<Utc>,
}

pub async fn create<'e>(
    ex: impl PgExecutor<'e>,
    user_id: i64,
    name: &str,
    token_hash: &str,
    libraries: &[String],
    tools: Option<&[String]>,
    expires_at: Option<DateTime<Utc>>,
) -> Result<i64, sqlx::Error> {
    sqlx::query_scalar(
        "INSERT INTO mcp_tokens (user_id, name, token_hash, allowed_libraries, allowed_tools, expires_at)
         VALUES ($1, $2, $3, $4, $5, $6) RETURNING id",
    )
    .bind(user_id)
    .bind(name)
    .bind(token_hash)
    .bind(Json(libraries))
    .bind(tools)
    .bind(expires_at)
    .fetch_one(ex)
    .await
}

pub async fn list(pool: &PgPool, username: Option<&str>) -> Result<Vec<TokenInfo>, sqlx::Error> {
    sqlx::query_as(
        "SELECT t.id, t.name, u.username, t.allowed_libraries, t.allowed_tools, t.rate_limit_per_minute, t.active, t.expires_at,
                t.last_used_at, t.created_at
           FROM mcp_tokens t JOIN users u ON u.id = t.user_id
          WHERE ($1::text IS NULL OR u.username = $1)
          ORDER BY t.id",
    )
    .bind(username)
    .fetch_all(pool)
    .await
}

/// Deactivates a token; false when unknown or already revoked.
pub async fn revoke<'e>(ex: impl PgExecutor<'e>, id: i64) -> Result<bool, sqlx::Error> {
    revoke_owned(ex, id, None).await
}

/// Deactivates a token, only if `owner` (a username) owns it when given;
/// false when unknown, not theirs, or already revoked.
pub async fn revoke_owned<'e>(ex: impl PgExecutor<'e>, id: i64, owner: Option<&str>) -> Result<bool, sqlx::Error> {
    Ok(sqlx::query(
        "UPDATE mcp_tokens t SET active = FALSE FROM users u
          WHERE t.id = $1 AND t.active AND u.id = t.user_id AND ($2::text IS NULL OR u.username = $2)",
    )
    .bind(id)
    .bind(owner)
    .execute(ex)
    .await?
    .rows_affected()
        == 1)
}

/// Replaces an active token's tool allowlist (`None` = every tool), only if
/// `owner` (a username) owns it when given; false when unknown, not theirs,
/// or revoked. The row trigger announces the change.
pub async fn set_tools<'e>(
    ex: impl PgExecutor<'e>,
    id: i64,
    tools: Option<&[String]>,
    owner: Option<&str>,
) -> Result<bool, sqlx::Error> {
    Ok(sqlx::query(
        "UPDATE mcp_tokens t SET allowed_tools = $2 FROM users u
          WHERE t.id = $1 AND t.active AND u.id = t.user_id AND ($3::text IS NULL OR u.username = $3)",
    )
    .bind(id)
    .bind(tools)
    .bind(owner)
    .execute(ex)
    .await?
    .rows_affected()
        == 1)
}

/// Sets an active token's own request rate (`None` = the configured one);
/// false when unknown or revoked. The row trigger announces the change.
pub async fn set_rate_limit<'e>(
    ex: impl PgExecutor<'e>,
    id: i64,
    per_minute: Option<i32>,
) -> Result<bool, sqlx::Error> {
    Ok(
        sqlx::query("UPDATE mcp_tokens SET rate_limit_per_minute = $2 WHERE id = $1 AND active")
            .bind(id)
            .bind(per_minute)
            .execute(ex)
            .await?
            .rows_affected()
            == 1,
    )
}

/// One token's listing row.
pub async fn get(pool: &PgPool, id: i64) -> Result<Option<TokenInfo>, sqlx::Error> {
    sqlx::query_as(
        "SELECT t.id, t.name, u.username, t.allowed_libraries, t.allowed_tools, t.rate_limit_per_minute, t.active, t.expires_at,
                t.last_used_at, t.created_at
           FROM mcp_tokens t JOIN users u ON u.id = t.user_id WHERE t.id = $1",
    )
    .bind(id)
    .fetch_optional(pool)
    .await
}

/// The stored hash of a token (the console's "search as" resolves it with the
/// server's own resolver; the plaintext is never stored).
pub async fn hash_of(pool: &PgPool, id: i64) -> Result<Option<String>, sqlx::Error> {
    sqlx::query_scalar("SELECT token_hash FROM mcp_tokens WHERE id = $1")
        .bind(id)
        .fetch_optional(pool)
        .await
}
