//! Signing keys: create (the secret is returned once) and retire, each with its
//! audit event. The keys trigger announces both, so a retired key's JWTs are
//! refused on the next request on every replica.

use sqlx::PgPool;

use crate::store::pg::{self, keys};

pub async fn create(pool: &PgPool, actor: &str) -> Result<keys::NewKey, sqlx::Error> {
    let mut tx = pool.begin().await?;
    let key = keys::create(&mut *tx).await?;
    pg::audit(&mut tx, actor, "signing_key_created", &key.kid, serde_json::json!({})).await?;
    tx.commit().await?;
    Ok(key)
}

/// False when the key is unknown or already retired.
pub async fn retire(pool: &PgPool, actor: &str, kid: &str) -> Result<bool, sqlx::Error> {
    let mut tx = pool.begin().await?;
    let done = keys::retire(&mut *tx, kid).await?;
    if done {
        pg::audit(&mut tx, actor, "signing_key_retired", kid, serde_json::json!({})).await?;
    }
    tx.commit().await?;
    Ok(done)
}
