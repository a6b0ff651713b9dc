//! The reads bearer resolution makes, one query per question.

use chrono::{DateTime, Utc};
use sqlx::types::Json;
use sqlx::PgPool;
use uuid::Uuid;

#[derive(Clone, Debug, sqlx::FromRow)]
pub struct TokenAuthRow {
    pub id: i64,
    pub active: bool,
    pub expires_at: Option<DateTime<Utc>>,
    pub allowed_libraries: Json<Vec<String>>,
    pub user_active: bool,
    /// Libraries on which the token's user is owner or manager now: a token
    /// reads only what its user could mint it for today (a demotion to
    /// reader, or a revoked membership, narrows it on the next request).
    pub member_libraries: Vec<String>,
    /// The token's tool allowlist; `None` = every tool.
    pub allowed_tools: Option<Vec<String>>,
    /// Its own request rate a minute; `None` = the configured one.
    pub rate_limit_per_minute: Option<i32>,
    pub user_id: i64,
    /// The user's ceiling (issue 32): tools every token of the user has at
    /// most (`None` = every tool) ...
    pub user_max_tools: Option<Vec<String>>,
    /// ... and the rate a minute all its tokens share (`None` = none).
    pub user_max_rate_per_minute: Option<i32>,
}

/// The opaque token with this hash, whether its user is active, the
/// libraries its user may scope a token to now (owner or manager) and the
/// user's ceiling — one round trip.
pub async fn token_by_hash(pool: &PgPool, hash: &str) -> Result<Option<TokenAuthRow>, sqlx::Error> {
    sqlx::query_as::<_, TokenAuthRow>(
        "SELECT t.id, t.active, t.expires_at, t.allowed_libraries, u.active AS user_active,
                ARRAY(SELECT DISTINCT m.library_uid::text FROM library_memberships m
                       WHERE m.user_id = t.user_id AND m.role IN ('owner', 'manager')) AS member_libraries,
                t.allowed_tools, t.rate_limit_per_minute, t.user_id,
                u.max_tools AS user_max_tools, u.max_rate_per_minute AS user_max_rate_per_minute
           FROM mcp_tokens t JOIN users u ON u.id = t.user_id
          WHERE t.token_hash = $1",
    )
    .bind(hash)
    .fetch_optional(pool)
    .await
}

#[derive(Clone, Debug, sqlx::FromRow)]
pub struct TeamAuthRow {
    pub active: bool,
    pub active_jti: Option<Uuid>,
    /// In assignment order.
    pub workspace_ids: Vec<String>,
    /// The libraries granted to the team directly (issue 53), in order; the
    /// resolver drops those the graph does not hold.
    pub library_uids: Vec<String>,
    /// The team's tool allowlist; `None` = every tool.
    pub allowed_tools: Option<Vec<String>>,
    /// Its own request rate a minute; `None` = the configured one.
    pub rate_limit_per_minute: Option<i32>,
}

/// A team with its workspace assignments and direct library grants, in one round trip.
pub async fn team_for_auth(pool: &PgPool, id: Uuid) -> Result<Option<TeamAuthRow>, sqlx::Error> {
    sqlx::query_as::<_, TeamAuthRow>(
        "SELECT t.active, t.active_jti,
                COALESCE(array_agg(a.workspace_id ORDER BY a.position, a.id)
                         FILTER (WHERE a.workspace_id IS NOT NULL), '{}') AS workspace_ids,
                ARRAY(SELECT g.library_uid::text FROM team_library_grants g
                       WHERE g.team_id = t.id ORDER BY g.position, g.id) AS library_uids,
                t.allowed_tools, t.rate_limit_per_minute
           FROM teams t LEFT JOIN team_workspace_assignments a ON a.team_id = t.id
          WHERE t.id = $1
          GROUP BY t.id",
    )
    .bind(id)
    .fetch_optional(pool)
    .await
}

/// Marks opaque tokens used (batched by the server, off the request path).
pub async fn touch_tokens(pool: &PgPool, ids: &[i64]) -> Result<(), sqlx::Error> {
    sqlx::query("UPDATE mcp_tokens SET last_used_at = now() WHERE id = ANY($1)")
        .bind(ids)
        .execute(pool)
        .await
        .map(|_| ())
}

/// Outcome of presenting a per-turn `jti`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum JtiBinding {
    /// First use: now bound to this session (or consumed, without one).
    Fresh,
    /// Already bound to this session id (None = consumed by a sessionless request).
    Bound(Option<String>),
}

/// Claims a per-turn `jti` for `session` atomically: the first caller across all
/// replicas wins; everyone else learns the existing binding.
pub async fn claim_jti(
    pool: &PgPool,
    jti: &str,
    session: Option<&str>,
    expires_at: DateTime<Utc>,
) -> Result<JtiBinding, sqlx::Error> {
    let inserted = sqlx::query(
        "INSERT INTO per_turn_jti_uses (jti, session_id, expires_at) VALUES ($1, $2, $3)
         ON CONFLICT (jti) DO NOTHING",
    )
    .bind(jti)
    .bind(session)
    .bind(expires_at)
    .execute(pool)
    .await?
    .rows_affected();
    if inserted == 1 {
        return Ok(JtiBinding::Fresh);
    }
    let bound: Option<Option<String>> = sqlx::query_scalar("SELECT session_id FROM per_turn_jti_uses WHERE jti = $1")
        .bind(jti)
        .fetch_optional(pool)
        .await?;
    // Swept between the two statements: it had expired, so it is no use anyway.
    Ok(JtiBinding::Bound(bound.flatten()))
}

/// Binds a jti consumed by `initialize` to the session the server then created.
pub async fn bind_jti_session(pool: &PgPool, jti: &str, session: &str) -> Result<(), sqlx::Error> {
    sqlx::query("UPDATE per_turn_jti_uses SET session_id = $2 WHERE jti = $1 AND session_id IS NULL")
        .bind(jti)
        .bind(session)
        .execute(pool)
        .await
        .map(|_| ())
}

/// Gives back a jti consumed by an `initialize` whose session could not be
/// bound (so the client's retry of the same turn is not a replay).
pub async fn release_jti(pool: &PgPool, jti: &str) -> Result<(), sqlx::Error> {
    sqlx::query("DELETE FROM per_turn_jti_uses WHERE jti = $1 AND session_id IS NULL")
        .bind(jti)
        .execute(pool)
        .await
        .map(|_| ())
}

/// How far a replica's clock may run behind Postgres' while it still refuses a
/// replay: a jti row is kept this long after its token's `exp` + leeway.
pub const CLOCK_SKEW_ALLOWANCE_SECS: i64 = 300;

/// Deletes jti rows that no replica could still accept (RFC 8725 §3.10: a
/// replay must stay detectable for as long as the token validates anywhere):
/// `exp` + leeway (stored in `expires_at`) + the clock-skew allowance.
pub async fn sweep_jtis(pool: &PgPool) -> Result<u64, sqlx::Error> {
    Ok(
        sqlx::query("DELETE FROM per_turn_jti_uses WHERE expires_at < now() - make_interval(secs => $1)")
            .bind(CLOCK_SKEW_ALLOWANCE_SECS as f64)
            .execute(pool)
            .await?
            .rows_affected(),
    )
}
