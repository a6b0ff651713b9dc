//! Users (people and service accounts) and their library memberships.

use chrono::{DateTime, Utc};
use sqlx::{PgExecutor, PgPool};

#[derive(Clone, sqlx::FromRow)]
pub struct User {
    pub id: i64,
    pub username: String,
    pub password_hash: Option<String>,
    pub is_service: bool,
    pub active: bool,
    /// May sign in to the admin console's staff pages.
    pub is_staff: bool,
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
            .field("is_staff", &self.is_staff)
            .field("created_at", &self.created_at)
            .finish()
    }
}

const USER_COLS: &str = "id, username, password_hash, is_service, active, is_staff, created_at";

/// Creates a user; `Ok(None)` when the name is taken.
pub async fn create<'e>(
    ex: impl PgExecutor<'e>,
    username: &str,
    password_hash: Option<&str>,
    is_service: bool,
) -> Result<Option<User>, sqlx::Error> {
    create_with(ex, username, password_hash, is_service, false).await
}

/// Creates a user, staff or not; `Ok(None)` when the name is taken.
pub async fn create_with<'e>(
    ex: impl PgExecutor<'e>,
    username: &str,
    password_hash: Option<&str>,
    is_service: bool,
    is_staff: bool,
) -> Result<Option<User>, sqlx::Error> {
    sqlx::query_as(&format!(
        "INSERT INTO users (username, password_hash, is_service, is_staff) VALUES ($1, $2, $3, $4)
         ON CONFLICT (username) DO NOTHING RETURNING {USER_COLS}"
    ))
    .bind(username)
    .bind(password_hash)
    .bind(is_service)
    .bind(is_staff)
    .fetch_optional(ex)
    .await
}

pub async fn by_username<'e>(ex: impl PgExecutor<'e>, username: &str) -> Result<Option<User>, sqlx::Error> {
    sqlx::query_as(&format!("SELECT {USER_COLS} FROM users WHERE username = $1"))
        .bind(username)
        .fetch_optional(ex)
        .await
}

pub async fn list(pool: &PgPool) -> Result<Vec<User>, sqlx::Error> {
    sqlx::query_as(&format!("SELECT {USER_COLS} FROM users ORDER BY username"))
        .fetch_all(pool)
        .await
}

/// Sets `active`; false when no such user. Disabling also ends the user's
/// console sessions (their tokens stop through the auth NOTIFY).
pub async fn set_active<'e>(ex: impl PgExecutor<'e>, username: &str, active: bool) -> Result<bool, sqlx::Error> {
    sqlx::query_scalar(
        "WITH u AS (UPDATE users SET active = $2 WHERE username = $1 RETURNING id),
              s AS (DELETE FROM admin_sessions WHERE NOT $2 AND user_id IN (SELECT id FROM u))
         SELECT EXISTS (SELECT 1 FROM u)",
    )
    .bind(username)
    .bind(active)
    .fetch_one(ex)
    .await
}

/// Sets the password hash and ends the user's console sessions; false when no
/// such user.
pub async fn set_password<'e>(ex: impl PgExecutor<'e>, username: &str, hash: &str) -> Result<bool, sqlx::Error> {
    sqlx::query_scalar(
        "WITH u AS (UPDATE users SET password_hash = $2 WHERE username = $1 RETURNING id),
              s AS (DELETE FROM admin_sessions WHERE user_id IN (SELECT id FROM u))
         SELECT EXISTS (SELECT 1 FROM u)",
    )
    .bind(username)
    .bind(hash)
    .fetch_one(ex)
    .await
}

/// Sets the staff flag; false when no such user or a service account (which
/// never signs in to the console).
pub async fn set_staff<'e>(ex: impl PgExecutor<'e>, username: &str, staff: bool) -> Result<bool, sqlx::Error> {
    Ok(
        sqlx::query("UPDATE users SET is_staff = $2 WHERE username = $1 AND NOT is_service")
            .bind(username)
            .bind(staff)
            .execute(ex)
            .await?
            .rows_affected()
            == 1,
    )
}

/// Sets a user's tool ceiling (`None` = every tool; issue 32); false when
/// no such user.
pub async fn set_max_tools<'e>(
    ex: impl PgExecutor<'e>,
    username: &str,
    tools: Option<&[String]>,
) -> Result<bool, sqlx::Error> {
    let done = sqlx::query("UPDATE users SET max_tools = $2 WHERE username = $1")
        .bind(username)
        .bind(tools)
        .execute(ex)
        .await?;
    Ok(done.rows_affected() == 1)
}

/// Sets a user's rate ceiling a minute (`None` = none); false when no such
/// user.
pub async fn set_max_rate<'e>(
    ex: impl PgExecutor<'e>,
    username: &str,
    per_minute: Option<i32>,
) -> Result<bool, sqlx::Error> {
    let done = sqlx::query("UPDATE users SET max_rate_per_minute = $2 WHERE username = $1")
        .bind(username)
        .bind(per_minute)
        .execute(ex)
        .await?;
    Ok(done.rows_affected() == 1)
}

/// A user's ceiling: (tools, rate a minute); `None` when no such user.
#[allow(clippy::type_complexity)]
pub async fn ceiling(pool: &PgPool, username: &str) -> Result<Option<(Option<Vec<String>>, Option<i32>)>, sqlx::Error> {
    sqlx::query_as("SELECT max_tools, max_rate_per_minute FROM users WHERE username = $1")
        .bind(username)
        .fetch_optional(pool)
        .await
}

/// Locks a user's row for the rest of the transaction (mints of one user
/// then count its live tokens one at a time) and returns how many live
/// tokens it holds: active and not expired.
pub async fn lock_and_count_live_tokens(conn: &mut sqlx::PgConnection, user_id: i64) -> Result<i64, sqlx::Error> {
    sqlx::query("SELECT 1 FROM users WHERE id = $1 FOR UPDATE")
        .bind(user_id)
        .execute(&mut *conn)
        .await?;
    sqlx::query_scalar(
        "SELECT count(*) FROM mcp_tokens
          WHERE user_id = $1 AND active AND (expires_at IS NULL OR expires_at > now())
            AND oauth_grant_id IS NULL",
    )
    .bind(user_id)
    .fetch_one(&mut *conn)
    .await
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    Owner,
    Manager,
    Reader,
}

impl Role {
    pub const ALL: [Role; 3] = [Role::Owner, Role::Manager, Role::Reader];

    pub fn parse(s: &str) -> Option<Role> {
        Role::ALL.into_iter().find(|r| r.as_str() == s)
    }

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
pub async fn grant<'e>(
    ex: impl PgExecutor<'e>,
    username: &str,
    library_uid: &str,
    role: Role,
) -> Result<bool, sqlx::Error> {
    sqlx::query_scalar(
        "WITH u AS (SELECT id FROM users WHERE username = $1),
              i AS (INSERT INTO library_memberships (user_id, library_uid, role)
                    SELECT id, $2, $3 FROM u
                    ON CONFLICT (user_id, library_uid, role) DO NOTHING)
         SELECT EXISTS (SELECT 1 FROM u)",
    )
    .bind(username)
    .bind(library_uid)
    .bind(role.as_str())
    .fetch_one(ex)
    .await
}

/// Revokes a role; false when there was nothing to revoke.
pub async fn revoke<'e>(
    ex: impl PgExecutor<'e>,
    username: &str,
    library_uid: &str,
    role: Role,
) -> Result<bool, sqlx::Error> {
    Ok(sqlx::query(
        "DELETE FROM library_memberships m USING users u
          WHERE m.user_id = u.id AND u.username = $1 AND m.library_uid = $2 AND m.role = $3",
    )
    .bind(username)
    .bind(library_uid)
    .bind(role.as_str())
    .execute(ex)
    .await?
    .rows_affected()
        == 1)
}

/// Locks the library's membership rows and counts its owners (spec §4.1: a
/// library keeps at least one owner); call inside the transaction that revokes.
pub async fn lock_owner_count(tx: &mut sqlx::PgConnection, library_uid: &str) -> Result<i64, sqlx::Error> {
    // Serialise membership changes of one library (two concurrent revokes of
    // its last two owners must not both pass the check).
    sqlx::query("SELECT pg_advisory_xact_lock(7210002, hashtext($1))")
        .bind(library_uid)
        .execute(&mut *tx)
        .await?;
    sqlx::query_scalar("SELECT count(*) FROM library_memberships WHERE library_uid = $1 AND role = 'owner'")
        .bind(library_uid)
        .fetch_one(&mut *tx)
        .await
}

/// The strongest role the user holds on the library (owner > manager > reader).
pub async fn strongest_role<'e>(
    ex: impl PgExecutor<'e>,
    username: &str,
    library_uid: &str,
) -> Result<Option<Role>, sqlx::Error> {
    let roles: Vec<String> = sqlx::query_scalar(
        "SELECT m.role::text FROM library_memberships m JOIN users u ON u.id = m.user_id
          WHERE u.username = $1 AND m.library_uid = $2",
    )
    .bind(username)
    .bind(library_uid)
    .fetch_all(ex)
    .await?;
    Ok(Role::ALL.into_iter().find(|r| roles.iter().any(|x| x == r.as_str())))
}

/// Libraries on which the user is owner or manager: what they may scope into
/// a token (spec §4.1, the console's library picker).
pub async fn scopable_libraries(pool: &PgPool, user_id: i64) -> Result<Vec<String>, sqlx::Error> {
    sqlx::query_scalar(
        "SELECT DISTINCT library_uid::text FROM library_memberships
          WHERE user_id = $1 AND role IN ('owner', 'manager') ORDER BY 1",
    )
    .bind(user_id)
    .fetch_all(pool)
    .await
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

/// How many memberships each of `library_uids` has (absent: none).
pub async fn membership_counts(
    pool: &PgPool,
    library_uids: &[String],
) -> Result<std::collections::HashMap<String, i64>, sqlx::Error> {
    let rows: Vec<(String, i64)> = sqlx::query_as(
        "SELECT library_uid::text, count(*) FROM library_memberships
          WHERE library_uid = ANY($1) GROUP BY library_uid",
    )
    .bind(library_uids)
    .fetch_all(pool)
    .await?;
    Ok(rows.into_iter().collect())
}

/// Of `library_uids`, those the user may NOT scope into a token (spec §4.1: only
/// owner or manager may), in the given order.
pub async fn unscopable_libraries<'e>(
    ex: impl PgExecutor<'e>,
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
    .fetch_all(ex)
    .await
}
