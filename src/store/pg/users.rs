//! Users (people and service accounts) and their library memberships.

use chrono::{DateTime, Utc};
use sqlx::PgPool;

#[derive(Clone, sqlx::FromRow)]
pub struct User {
    pub id: i64,
    pub username: String,
    pub password_hash: Option<String>,
    pub is_service: bool,
    pub active: bool,
    pub created_at: DateTime<Utc>,
}

/// Never shows the password hash.
impl std::fmt::Debug for User {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("User")
            .field("id", &self.id)
            .field("username", &self.username)
            .field("password_hash", &self.password_hash.as_ref().map(|_| "****"))
            .field("is_service", &self.is_service)
            .field("active", &self.active)
            .field("created_at", &self.created_at)
            .finish()
    }
}

const USER_COLS: &str = "id, username, password_hash, is_service, active, created_at";

/// Creates a user; `Ok(None)` when the name is taken.
pub async fn create(
    pool: &PgPool,
    username: &str,
    password_hash: Option<&str>,
    is_service: bool,
) -> Result<Option<User>, sqlx::Error> {
    sqlx::query_as(&format!(
        "INSERT INTO users (username, password_hash, is_service) VALUES ($1, $2, $3)
         ON CONFLICT (username) DO NOTHING RETURNING {USER_COLS}"
    ))
    .bind(username)
    .bind(password_hash)
    .bind(is_service)
    .fetch_optional(pool)
    .await
}

pub async fn by_username(pool: &PgPool, username: &str) -> Result<Option<User>, sqlx::Error> {
    sqlx::query_as(&format!("SELECT {USER_COLS} FROM users WHERE username = $1"))
        .bind(username)
        .fetch_optional(pool)
        .await
}

pub async fn list(pool: &PgPool) -> Result<Vec<User>, sqlx::Error> {
    sqlx::query_as(&format!("SELECT {USER_COLS} FROM users ORDER BY username"))
        .fetch_all(pool)
        .await
}

/// Sets `active`; false when no such user.
pub async fn set_active(pool: &PgPool, username: &str, active: bool) -> Result<bool, sqlx::Error> {
    Ok(sqlx::query("UPDATE users SET active = $2 WHERE username = $1")
        .bind(username)
        .bind(active)
        .execute(pool)
        .await?
        .rows_affected()
        == 1)
}

pub async fn set_password(pool: &PgPool, username: &str, hash: &str) -> Result<bool, sqlx::Error> {
    Ok(sqlx::query("UPDATE users SET password_hash = $2 WHERE username = $1")
        .bind(username)
        .bind(hash)
        .execute(pool)
        .await?
        .rows_affected()
        == 1)
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    Owner,
    Manager,
    Reader,
}

impl Role {
    pub fn as_str(self) -> &'static str {
        match self {
            Role::Owner => "owner",
            Role::Manager => "manager",
            Role::Reader => "reader",
        }
    }
}

#[derive(Clone, Debug, sqlx::FromRow)]
pub struct Membership {
    pub username: String,
    pub library_uid: String,
    pub role: String,
    pub created_at: DateTime<Utc>,
}

/// Grants a role; idempotent. False when no such user.
pub async fn grant(pool: &PgPool, username: &str, library_uid: &str, role: Role) -> Result<bool, sqlx::Error> {
    let n = sqlx::query(
        "INSERT INTO library_memberships (user_id, library_uid, role)
         SELECT id, $2, $3 FROM users WHERE username = $1
         ON CONFLICT (user_id, library_uid, role) DO NOTHING",
    )
    .bind(username)
    .bind(library_uid)
    .bind(role.as_str())
    .execute(pool)
    .await?
    .rows_affected();
    if n == 1 {
        return Ok(true);
    }
    Ok(by_username(pool, username).await?.is_some())
}

/// Revokes a role; false when there was nothing to revoke.
pub async fn revoke(pool: &PgPool, username: &str, library_uid: &str, role: Role) -> Result<bool, sqlx::Error> {
    Ok(sqlx::query(
        "DELETE FROM library_memberships m USING users u
          WHERE m.user_id = u.id AND u.username = $1 AND m.library_uid = $2 AND m.role = $3",
    )
    .bind(username)
    .bind(library_uid)
    .bind(role.as_str())
    .execute(pool)
    .await?
    .rows_affected()
        == 1)
}

pub async fn memberships(
    pool: &PgPool,
    username: Option<&str>,
    library_uid: Option<&str>,
) -> Result<Vec<Membership>, sqlx::Error> {
    sqlx::query_as(
        "SELECT u.username, m.library_uid, m.role, m.created_at
           FROM library_memberships m JOIN users u ON u.id = m.user_id
          WHERE ($1::text IS NULL OR u.username = $1) AND ($2::text IS NULL OR m.library_uid = $2)
          ORDER BY m.library_uid, u.username, m.role",
    )
    .bind(username)
    .bind(library_uid)
    .fetch_all(pool)
    .await
}

/// Of `library_uids`, those the user may NOT scope into a token (spec §4.1: only
/// owner or manager may), in the given order.
pub async fn unscopable_libraries(
    pool: &PgPool,
    user_id: i64,
    library_uids: &[String],
) -> Result<Vec<String>, sqlx::Error> {
    sqlx::query_scalar(
        "SELECT lib FROM unnest($2::text[]) WITH ORDINALITY AS l(lib, pos)
          WHERE NOT EXISTS (SELECT 1 FROM library_memberships m
                             WHERE m.user_id = $1 AND m.library_uid = l.lib
                               AND m.role IN ('owner', 'manager'))
          ORDER BY pos",
    )
    .bind(user_id)
    .bind(library_uids)
    .fetch_all(pool)
    .await
}
