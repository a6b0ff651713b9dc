//! HTTP Basic for the service APIs (`/mcp_server/api/…`, `/library/api/…`):
//! a handler that takes `ServiceAccount` cannot run unless the caller is an
//! active service user with the right password.

use std::sync::{Arc, LazyLock};

use argon2::password_hash::{rand_core::OsRng, PasswordHash, PasswordHasher, PasswordVerifier, SaltString};
use argon2::Argon2;
use axum::extract::FromRequestParts;
use axum::http::{header, request::Parts};
use base64::Engine;
use sha2::{Digest, Sha256};

use crate::error::ApiError;
use crate::startup::AppState;
use crate::store::pg::users;

/// The authenticated service account of a request.
#[derive(Clone, Debug)]
pub struct ServiceAccount {
    pub username: String,
}

/// argon2id PHC string of a password.
pub fn hash_password(password: &str) -> Result<String, argon2::password_hash::Error> {
    let salt = SaltString::generate(&mut OsRng);
    Ok(Argon2::default().hash_password(password.as_bytes(), &salt)?.to_string())
}

/// A real hash to verify against when the username does not exist, so a
/// wrong username costs the same as a wrong password.
static DUMMY_HASH: LazyLock<String> = LazyLock::new(|| hash_password("mnemosyne-timing-equaliser").unwrap_or_default());

/// At most one argon2 verification per core at a time: a flood of wrong
/// credentials queues here (bounded) instead of exhausting memory and CPU.
static VERIFY_SLOTS: LazyLock<tokio::sync::Semaphore> =
    LazyLock::new(|| tokio::sync::Semaphore::new(std::thread::available_parallelism().map(|n| n.get()).unwrap_or(2)));

/// How long a request waits for a verification slot before a 503.
const VERIFY_QUEUE_WAIT: std::time::Duration = std::time::Duration::from_secs(2);

fn verify(password: &str, phc: &str) -> bool {
    PasswordHash::new(phc)
        .map(|h| Argon2::default().verify_password(password.as_bytes(), &h).is_ok())
        .unwrap_or(false)
}

fn parse_basic(parts: &Parts) -> Option<(String, String)> {
    let value = parts.headers.get(header::AUTHORIZATION)?.to_str().ok()?;
    let (scheme, b64) = value.split_once(' ')?;
    if !scheme.eq_ignore_ascii_case("basic") {
        return None;
    }
    let decoded = base64::engine::general_purpose::STANDARD.decode(b64.trim()).ok()?;
    let text = String::from_utf8(decoded).ok()?;
    let (u, p) = text.split_once(':')?;
    Some((u.to_owned(), p.to_owned()))
}

impl FromRequestParts<AppState> for ServiceAccount {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &AppState) -> Result<Self, Self::Rejection> {
        let (username, password) = parse_basic(parts).ok_or(ApiError::BasicUnauthorized)?;
        let caches = &state.auth.caches;
        let key = hex::encode(Sha256::digest(format!("{username}\0{password}").as_bytes()));
        let use_cache = caches.usable();
        if use_cache {
            if let Some(u) = caches.basic.get(&key).await {
                return Ok(ServiceAccount {
                    username: u.to_string(),
                });
            }
        }
        let generation = caches.basic.generation();
        let user = users::by_username(&state.pg, &username).await?;
        let phc = user
            .as_ref()
            .and_then(|u| u.password_hash.clone())
            .unwrap_or_else(|| DUMMY_HASH.clone());
        let _slot = tokio::time::timeout(VERIFY_QUEUE_WAIT, VERIFY_SLOTS.acquire())
            .await
            .map_err(|_| ApiError::StoreUnavailable("password verifier"))?
            .map_err(|_| ApiError::StoreUnavailable("password verifier"))?;
        let ok = tokio::task::spawn_blocking(move || verify(&password, &phc))
            .await
            .unwrap_or(false);
        let user = match user {
            Some(u) if ok && u.active && u.password_hash.is_some() => u,
            _ => return Err(ApiError::BasicUnauthorized),
        };
        if !user.is_service {
            return Err(ApiError::Forbidden("this account is not a service account".into()));
        }
        if use_cache {
            caches
                .basic
                .insert_if_current(generation, key, Arc::new(user.username.clone()))
                .await;
        }
        Ok(ServiceAccount {
            username: user.username,
        })
    }
}
