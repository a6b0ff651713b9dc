//! The admin console's own rows: server-side sessions (only the SHA-256 of the
//! cookie's id is stored) and the reads of its overview page.

use sqlx::PgPool;

/// The signed-in user of a live session.
#[derive(Clone, sqlx::FromRow)]
pub struct SessionUser {
    pub user_id: i64,
    pub username: String,
    pub is_staff: bool,
    /// The session's synchronizer CSRF token.
    pub csrf_token: String,
}

/// Never shows the CSRF token.
impl std::fmt::Debug for SessionUser {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SessionUser")
            .field("user_id", &self.user_id)
            .field("username", &self.username)
            .field("is_staff", &self.is_staff)
            .field("csrf_token", &"<redacted>")
            .finish()
    }
}

/// The shared secret called `name` (`server_secrets`): the one the first
/// replica to ask stored (`fresh` when this call is the first).
pub async fn server_secret(pool: &PgPool, name: &str, fresh: &[u8]) -> Result<Vec<u8>, sqlx::Error> {
    sqlx::query("INSERT INTO server_secrets (name, secret) VALUES ($1, $2) ON CONFLICT (name) DO NOTHING")
        .bind(name)
        .bind(fresh)
        .execute(pool)
        .await?;
    sqlx::query_scalar("SELECT secret FROM server_secrets WHERE name = $1")
        .bind(name)
        .fetch_one(pool)
        .await
}

/// Stores a new session of `user_id`; sweeps expired ones on the way.
pub async fn create_session(
    pool: &PgPool,
    id_hash: &str,
    user_id: i64,
    csrf_token: &str,
    absolute_secs: i64,
) -> Result<(), sqlx::Error> {
    let mut tx = pool.begin().await?;
    sqlx::query("DELETE FROM admin_sessions WHERE created_at < now() - make_interval(secs => $1)")
        .bind(absolute_secs as f64)
        .execute(&mut *tx)
        .await?;
    sqlx::query("INSERT INTO admin_sessions (id_hash, user_id, csrf_token) VALUES ($1, $2, $3)")
        .bind(id_hash)
        .bind(user_id)
        .bind(csrf_token)
        .execute(&mut *tx)
        .await?;
    tx.commit().await
}

/// The session's user when the session is live (within both expiries, user
/// active and not a service account); refreshes its idle clock. One statement,
/// so a disable or sign-out on any replica applies to the next request.
pub async fn touch_session(
    pool: &PgPool,
    id_hash: &str,
    idle_secs: i64,
    absolute_secs: i64,
) -> Result<Option<SessionUser>, sqlx::Error> {
    sqlx::query_as(
        "UPDATE admin_sessions s SET last_seen_at = now()
           FROM users u
          WHERE s.id_hash = $1 AND u.id = s.user_id AND u.active AND NOT u.is_service
            AND s.last_seen_at > now() - make_interval(secs => $2)
            AND s.created_at > now() - make_interval(secs => $3)
      RETURNING u.id AS user_id, u.username, u.is_staff, s.csrf_token",
    )
    .bind(id_hash)
    .bind(idle_secs as f64)
    .bind(absolute_secs as f64)
    .fetch_optional(pool)
    .await
}

/// Records the first submission of a form (`once`, its random value) in a
/// session; false when it was submitted before. A session keeps at most
/// `cap` submissions: the oldest beyond it are forgotten in the same
/// statement.
pub async fn first_submission(pool: &PgPool, session_hash: &str, once: &str, cap: i64) -> Result<bool, sqlx::Error> {
    Ok(sqlx::query(
        "WITH beyond AS (
             DELETE FROM admin_form_submissions
              WHERE session_hash = $1 AND once IN (
                    SELECT once FROM admin_form_submissions WHERE session_hash = $1
                     ORDER BY at DESC, once OFFSET $3))
         INSERT INTO admin_form_submissions (session_hash, once) VALUES ($1, $2)
         ON CONFLICT DO NOTHING",
    )
    .bind(session_hash)
    .bind(once)
    .bind((cap - 1).max(0))
    .execute(pool)
    .await?
    .rows_affected()
        == 1)
}

/// Deletes sessions past either expiry and form submissions older than
/// `form_secs` (their forms can no longer be posted); (sessions, forms).
pub async fn sweep(
    pool: &PgPool,
    idle_secs: i64,
    absolute_secs: i64,
    form_secs: i64,
) -> Result<(u64, u64), sqlx::Error> {
    let sessions = sqlx::query(
        "DELETE FROM admin_sessions
          WHERE last_seen_at < now() - make_interval(secs => $1)
             OR created_at < now() - make_interval(secs => $2)",
    )
    .bind(idle_secs as f64)
    .bind(absolute_secs as f64)
    .execute(pool)
    .await?
    .rows_affected();
    let forms = sqlx::query("DELETE FROM admin_form_submissions WHERE at < now() - make_interval(secs => $1)")
        .bind(form_secs as f64)
        .execute(pool)
        .await?
        .rows_affected();
    Ok((sessions, forms))
}

pub async fn delete_session(pool: &PgPool, id_hash: &str) -> Result<(), sqlx::Error> {
    sqlx::query("DELETE FROM admin_sessions WHERE id_hash = $1")
        .bind(id_hash)
        .execute(pool)
        .await
        .map(|_| ())
}

/// Counts for the overview page.
#[derive(Clone, Debug, Default, sqlx::FromRow)]
pub struct Counts {
    pub teams: i64,
    pub active_teams: i64,
    pub tokens: i64,
    pub active_tokens: i64,
    pub keys: i64,
    pub active_keys: i64,
    pub users: i64,
}

pub async fn counts(pool: &PgPool) -> Result<Counts, sqlx::Error> {
    sqlx::query_as(
        "SELECT (SELECT count(*) FROM teams) AS teams,
                (SELECT count(*) FROM teams WHERE active) AS active_teams,
                (SELECT count(*) FROM mcp_tokens) AS tokens,
                (SELECT count(*) FROM mcp_tokens WHERE active
                    AND (expires_at IS NULL OR expires_at > now())) AS active_tokens,
                (SELECT count(*) FROM mcp_signing_keys) AS keys,
                (SELECT count(*) FROM mcp_signing_keys WHERE retired_at IS NULL) AS active_keys,
                (SELECT count(*) FROM users) AS users",
    )
    .fetch_one(pool)
    .await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn debug_of_a_session_user_hides_the_csrf_token() {
        let u = SessionUser {
            user_id: 3,
            username: "sam".into(),
            is_staff: true,
            csrf_token: "Zm9vYmFyLWNzcmYtdG9rZW4tdGhhdC1pcy1zZWNyZXQ".into(),
        };
        let shown = format!("{u:?} {u:#?}");
        assert!(!shown.contains(&u.csrf_token), "{shown}");
        assert!(shown.contains("<redacted>") && shown.contains("sam"), "{shown}");
    }
}
