//! Opaque MCP tokens (spec §4.1): minting under the membership rule, and
//! revocation. Used by the CLI, the demo, the admin console and the tests.

use base64::Engine;
use chrono::{DateTime, Utc};
use rand::RngCore;
use sqlx::PgPool;

use super::{check_len, BadField, Propagation};
use crate::auth::changes::AuthChanges;
use crate::auth::resolver::token_hash;
use crate::ids::LibraryUid;
use crate::store::pg::{tokens, users};

#[derive(Debug, thiserror::Error)]
pub enum TokenError {
    #[error("{0}")]
    BadField(#[from] BadField),
    #[error("no such user: {0}")]
    NoSuchUser(String),
    /// Spec §4.1: a token may only name libraries on which its user is owner
    /// or manager.
    #[error("{user} is not owner or manager of: {}", libraries.join(", "))]
    NotOwnerOrManager { user: String, libraries: Vec<String> },
    #[error("the expiry is in the past")]
    ExpiryInPast,
    #[error("no active token with id {0}")]
    NotFound(i64),
    #[error(transparent)]
    Store(#[from] sqlx::Error),
}

/// A new token: its id, and the plaintext, which exists only here (the store
/// keeps its SHA-256) — show it once, to whoever asked.
#[derive(Debug)]
pub struct Minted {
    pub id: i64,
    pub plaintext: String,
}

/// Generates an opaque token plaintext: `mnm_` + 32 random bytes, base64url.
pub fn new_token_plaintext() -> String {
    let mut b = [0u8; 32];
    rand::rngs::OsRng.fill_bytes(&mut b);
    format!("mnm_{}", base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(b))
}

/// Mints a token for `username` over `libraries` (de-duplicated, order kept;
/// none is legitimate and reads nothing — spec §14.1).
pub async fn mint(
    pg: &PgPool,
    username: &str,
    name: &str,
    libraries: &[String],
    expires_at: Option<DateTime<Utc>>,
) -> Result<Minted, TokenError> {
    check_len("name", name, 0, 200)?;
    let mut libs: Vec<String> = Vec::with_capacity(libraries.len());
    for (i, l) in libraries.iter().enumerate() {
        let l = LibraryUid::parse(&format!("libraries[{i}]"), l.as_str()).map_err(BadField::from)?;
        if !libs.iter().any(|x| x == l.as_str()) {
            libs.push(l.into_string());
        }
    }
    if expires_at.is_some_and(|e| e <= Utc::now()) {
        return Err(TokenError::ExpiryInPast);
    }
    let user = users::by_username(pg, username)
        .await?
        .ok_or_else(|| TokenError::NoSuchUser(username.to_owned()))?;
    let refused = users::unscopable_libraries(pg, user.id, &libs).await?;
    if !refused.is_empty() {
        return Err(TokenError::NotOwnerOrManager {
            user: username.to_owned(),
            libraries: refused,
        });
    }
    let plaintext = new_token_plaintext();
    let id = tokens::create(pg, user.id, name, &token_hash(&plaintext), &libs, expires_at).await?;
    Ok(Minted { id, plaintext })
}

/// Revokes an active token; every replica refuses it from its next request.
pub async fn revoke(pg: &PgPool, changes: &AuthChanges, id: i64) -> Result<Propagation, TokenError> {
    if !tokens::revoke(pg, id).await? {
        return Err(TokenError::NotFound(id));
    }
    Ok(changes.fence().await)
}
