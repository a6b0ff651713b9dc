//! Users: create, enable/disable, password, staff flag — each write with its
//! audit event in one transaction. The users trigger announces the change, so
//! tokens of a disabled user stop on the next request on every replica, and
//! disabling (or a new password) ends the user's console sessions.

use sqlx::PgPool;

use super::tool_grants::ToolAllowlist;
use super::Propagation;
use crate::auth::changes::AuthChanges;
use crate::store::pg::{self, users};

/// Why a user write was refused; `field()` names the form field.
#[derive(Debug, thiserror::Error)]
pub enum AccountError {
    #[error("username must be 1-150 characters without ':' or whitespace")]
    BadUsername,
    #[error("user {0} already exists")]
    Exists(String),
    #[error("no such user: {0}")]
    NoSuchUser(String),
    #[error("password must be at least 8 characters")]
    ShortPassword,
    #[error("a staff user signs in with a password: set one")]
    StaffWithoutPassword,
    #[error("a service account cannot be staff")]
    ServiceStaff,
    #[error("hashing the password failed")]
    Hash,
    #[error("per_minute must be 1 to {}", i32::MAX)]
    BadRate,
    #[error(transparent)]
    Store(#[from] sqlx::Error),
}

impl AccountError {
    pub fn field(&self) -> &'static str {
        match self {
            AccountError::BadUsername | AccountError::Exists(_) | AccountError::NoSuchUser(_) => "username",
            AccountError::ShortPassword | AccountError::StaffWithoutPassword | AccountError::Hash => "password",
            AccountError::ServiceStaff => "staff",
            AccountError::BadRate => "per_minute",
            AccountError::Store(_) => "",
        }
    }
}

/// The username rule (`:` would break HTTP Basic).
pub fn check_username(username: &str) -> Result<(), AccountError> {
    if username.is_empty()
        || username.len() > 150
        || username.contains(':')
        || username.chars().any(|c| c.is_whitespace() || c.is_control())
    {
        return Err(AccountError::BadUsername);
    }
    Ok(())
}

/// The rules of a new user before any store call: its username, a service
/// account never staff, and staff only with a password (the console signs
/// staff in with it). The CLI asks before reading a password from stdin.
pub fn check_new_user(username: &str, service: bool, staff: bool, has_password: bool) -> Result<(), AccountError> {
    check_username(username)?;
    if staff && service {
        return Err(AccountError::ServiceStaff);
    }
    if staff && !has_password {
        return Err(AccountError::StaffWithoutPassword);
    }
    Ok(())
}

/// argon2id on a blocking thread (about 19 MiB and tens of milliseconds:
/// never on an async worker).
async fn hash(password: &str) -> Result<String, AccountError> {
    if password.chars().count() < 8 {
        return Err(AccountError::ShortPassword);
    }
    let password = password.to_owned();
    tokio::task::spawn_blocking(move || crate::auth::basic::hash_password(&password))
        .await
        .map_err(|_| AccountError::Hash)?
        .map_err(|_| AccountError::Hash)
}

/// Creates a user (a person, a service account, or staff).
pub async fn create(
    pool: &PgPool,
    actor: &str,
    username: &str,
    password: Option<&str>,
    service: bool,
    staff: bool,
) -> Result<users::User, AccountError> {
    check_new_user(username, service, staff, password.is_some())?;
    let hash = match password {
        Some(p) => Some(hash(p).await?),
        None => None,
    };
    let mut tx = pool.begin().await?;
    let user = users::create_with(&mut *tx, username, hash.as_deref(), service, staff)
        .await?
        .ok_or_else(|| AccountError::Exists(username.to_owned()))?;
    pg::audit(
        &mut tx,
        actor,
        "user_created",
        username,
        serde_json::json!({"service": service, "staff": staff}),
    )
    .await?;
    tx.commit().await?;
    Ok(user)
}

pub async fn set_active(pool: &PgPool, actor: &str, username: &str, active: bool) -> Result<(), AccountError> {
    let mut tx = pool.begin().await?;
    if !users::set_active(&mut *tx, username, active).await? {
        return Err(AccountError::NoSuchUser(username.to_owned()));
    }
    let action = if active { "user_enabled" } else { "user_disabled" };
    pg::audit(&mut tx, actor, action, username, serde_json::json!({})).await?;
    tx.commit().await?;
    Ok(())
}

pub async fn set_password(pool: &PgPool, actor: &str, username: &str, password: &str) -> Result<(), AccountError> {
    let hash = hash(password).await?;
    let mut tx = pool.begin().await?;
    if !users::set_password(&mut *tx, username, &hash).await? {
        return Err(AccountError::NoSuchUser(username.to_owned()));
    }
    pg::audit(&mut tx, actor, "user_password_set", username, serde_json::json!({})).await?;
    tx.commit().await?;
    Ok(())
}

pub async fn set_staff(pool: &PgPool, actor: &str, username: &str, staff: bool) -> Result<(), AccountError> {
    let mut tx = pool.begin().await?;
    if !users::set_staff(&mut *tx, username, staff).await? {
        return Err(match users::by_username(&mut *tx, username).await? {
            Some(_) => AccountError::ServiceStaff,
            None => AccountError::NoSuchUser(username.to_owned()),
        });
    }
    pg::audit(
        &mut tx,
        actor,
        "user_staff_set",
        username,
        serde_json::json!({"staff": staff}),
    )
    .await?;
    tx.commit().await?;
    Ok(())
}

/// Sets a user's tool ceiling (issue 32): every token of the user may use
/// at most these tools, whatever its own allowlist says (`None` = no
/// ceiling). Audited; every replica applies it from its next request.
pub async fn set_max_tools(
    pool: &PgPool,
    changes: &AuthChanges,
    actor: &str,
    username: &str,
    tools: Option<&ToolAllowlist>,
) -> Result<Propagation, AccountError> {
    let names = tools.map(ToolAllowlist::names);
    let mut tx = pool.begin().await?;
    if !users::set_max_tools(&mut *tx, username, names).await? {
        return Err(AccountError::NoSuchUser(username.to_owned()));
    }
    pg::audit(
        &mut tx,
        actor,
        "user_max_tools_set",
        username,
        serde_json::json!({"tools": names}),
    )
    .await?;
    tx.commit().await?;
    Ok(changes.fence().await)
}

/// Sets a user's rate ceiling (issue 32): the requests a minute all the
/// user's tokens share, over the whole deployment (`None` = none; a token's
/// own rate only narrows it). Audited; applied from the next request.
pub async fn set_max_rate(
    pool: &PgPool,
    changes: &AuthChanges,
    actor: &str,
    username: &str,
    per_minute: Option<u32>,
) -> Result<Propagation, AccountError> {
    let value = per_minute
        .map(|r| i32::try_from(r).ok().filter(|r| *r >= 1).ok_or(AccountError::BadRate))
        .transpose()?;
    let mut tx = pool.begin().await?;
    if !users::set_max_rate(&mut *tx, username, value).await? {
        return Err(AccountError::NoSuchUser(username.to_owned()));
    }
    pg::audit(
        &mut tx,
        actor,
        "user_max_rate_set",
        username,
        serde_json::json!({"per_minute": value}),
    )
    .await?;
    tx.commit().await?;
    Ok(changes.fence().await)
}
