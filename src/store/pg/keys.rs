//! Signing keys (`mcp_signing_keys`): 32 random bytes, stored and shown as hex.

use chrono::{DateTime, Utc};
use rand::RngCore;
use sqlx::{PgExecutor, PgPool};

#[derive(Clone, Debug, sqlx::FromRow)]
pub struct KeyInfo {
    pub kid: String,
    pub created_at: DateTime<Utc>,
    pub retired_at: Option<DateTime<Utc>>,
}

/// A new key's identity and secret: the secret is shown to the operator once.
pub struct NewKey {
    pub kid: String,
    pub secret_hex: String,
}

fn generate() -> NewKey {
    let mut secret = [0u8; 32];
    rand::rngs::OsRng.fill_bytes(&mut secret);
    let mut id = [0u8; 6];
    rand::rngs::OsRng.fill_bytes(&mut id);
    NewKey {
        kid: format!("{}-{}", Utc::now().format("%Y%m%d"), hex::encode(id)),
        secret_hex: hex::encode(secret),
    }
}

pub async fn create<'e>(ex: impl PgExecutor<'e>) -> Result<NewKey, sqlx::Error> {
    let key = generate();
    sqlx::query("INSERT INTO mcp_signing_keys (kid, secret_hex) VALUES ($1, $2)")
        .bind(&key.kid)
        .bind(&key.secret_hex)
        .execute(ex)
        .await?;
    Ok(key)
}

/// Makes sure one active key exists (DESIGN §3); returns the key it created, if
/// any. Serialised with an advisory lock so concurrent `migrate`s make one key.
pub async fn ensure_active(pool: &PgPool) -> Result<Option<NewKey>, sqlx::Error> {
    let mut tx = pool.begin().await?;
    sqlx::query("SELECT pg_advisory_xact_lock(7210001)")
        .execute(&mut *tx)
        .await?;
    let active: i64 = sqlx::query_scalar("SELECT count(*) FROM mcp_signing_keys WHERE retired_at IS NULL")
        .fetch_one(&mut *tx)
        .await?;
    if active > 0 {
        tx.commit().await?;
        return Ok(None);
    }
    let key = generate();
    sqlx::query("INSERT INTO mcp_signing_keys (kid, secret_hex) VALUES ($1, $2)")
        .bind(&key.kid)
        .bind(&key.secret_hex)
        .execute(&mut *tx)
        .await?;
    tx.commit().await?;
    Ok(Some(key))
}

/// The secret of a non-retired key.
pub async fn active_secret(pool: &PgPool, kid: &str) -> Result<Option<String>, sqlx::Error> {
    sqlx::query_scalar("SELECT secret_hex FROM mcp_signing_keys WHERE kid = $1 AND retired_at IS NULL")
        .bind(kid)
        .fetch_optional(pool)
        .await
}

/// The newest active key, which signs team JWTs.
pub async fn newest_active(pool: &PgPool) -> Result<Option<NewKey>, sqlx::Error> {
    let row: Option<(String, String)> = sqlx::query_as(
        "SELECT kid, secret_hex FROM mcp_signing_keys WHERE retired_at IS NULL
          ORDER BY created_at DESC, kid DESC LIMIT 1",
    )
    .fetch_optional(pool)
    .await?;
    Ok(row.map(|(kid, secret_hex)| NewKey { kid, secret_hex }))
}

pub async fn list(pool: &PgPool) -> Result<Vec<KeyInfo>, sqlx::Error> {
    sqlx::query_as("SELECT kid, created_at, retired_at FROM mcp_signing_keys ORDER BY created_at, kid")
        .fetch_all(pool)
        .await
}

/// Retires a key; every JWT signed with it stops validating. False if unknown
/// or already retired.
pub async fn retire<'e>(ex: impl PgExecutor<'e>, kid: &str) -> Result<bool, sqlx::Error> {
    Ok(
        sqlx::query("UPDATE mcp_signing_keys SET retired_at = now() WHERE kid = $1 AND retired_at IS NULL")
            .bind(kid)
            .execute(ex)
            .await?
            .rows_affected()
            == 1,
    )
}
