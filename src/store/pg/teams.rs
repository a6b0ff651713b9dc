//! Teams and their workspace assignments (spec §4.1, §7). Every write is one
//! transaction with its audit event; the table triggers announce it.

use chrono::{DateTime, Utc};
use serde_json::json;
use sqlx::PgPool;
use uuid::Uuid;

use super::audit;

#[derive(Clone, Debug, sqlx::FromRow)]
pub struct Team {
    pub id: Uuid,
    pub name: String,
    pub active: bool,
    pub active_jti: Option<Uuid>,
    pub created_at: DateTime<Utc>,
    pub updated_at: DateTime<Utc>,
}

pub enum Created {
    /// A new team holding `jti` as its active jti.
    New(Team),
    /// The id existed: spec §7.1's idempotent answer (no JWT).
    Existing(Team),
}

pub async fn create(pool: &PgPool, actor: &str, id: Uuid, name: &str, jti: Uuid) -> Result<Created, sqlx::Error> {
    let mut tx = pool.begin().await?;
    let new: Option<Team> = sqlx::query_as(
        "INSERT INTO teams (id, name, active_jti) VALUES ($1, $2, $3)
         ON CONFLICT (id) DO NOTHING
         RETURNING id, name, active, active_jti, created_at, updated_at",
    )
    .bind(id)
    .bind(name)
    .bind(jti)
    .fetch_optional(&mut *tx)
    .await?;
    let out = match new {
        Some(team) => {
            audit(&mut tx, actor, "team_created", &id.to_string(), json!({"name": name})).await?;
            Created::New(team)
        }
        None => Created::Existing(
            sqlx::query_as("SELECT id, name, active, active_jti, created_at, updated_at FROM teams WHERE id = $1")
                .bind(id)
                .fetch_one(&mut *tx)
                .await?,
        ),
    };
    tx.commit().await?;
    Ok(out)
}

pub async fn get(pool: &PgPool, id: Uuid) -> Result<Option<(Team, Vec<String>)>, sqlx::Error> {
    let team: Option<Team> =
        sqlx::query_as("SELECT id, name, active, active_jti, created_at, updated_at FROM teams WHERE id = $1")
            .bind(id)
            .fetch_optional(pool)
            .await?;
    let Some(team) = team else { return Ok(None) };
    let ws = assigned_workspaces(pool, id).await?;
    Ok(Some((team, ws)))
}

async fn assigned_workspaces<'e, E: sqlx::PgExecutor<'e>>(ex: E, id: Uuid) -> Result<Vec<String>, sqlx::Error> {
    sqlx::query_scalar("SELECT workspace_id FROM team_workspace_assignments WHERE team_id = $1 ORDER BY position, id")
        .bind(id)
        .fetch_all(ex)
        .await
}

/// Soft delete (spec §7.2). False when the team does not exist.
pub async fn deactivate(pool: &PgPool, actor: &str, id: Uuid) -> Result<bool, sqlx::Error> {
    let mut tx = pool.begin().await?;
    let n = sqlx::query("UPDATE teams SET active = FALSE, updated_at = now() WHERE id = $1")
        .bind(id)
        .execute(&mut *tx)
        .await?
        .rows_affected();
    if n == 1 {
        audit(&mut tx, actor, "team_deleted", &id.to_string(), json!({})).await?;
    }
    tx.commit().await?;
    Ok(n == 1)
}

pub enum Rotated {
    Ok,
    NotFound,
    Inactive,
}

/// Replaces the active jti (spec §7.4): the previous JWT stops validating.
pub async fn rotate(pool: &PgPool, actor: &str, id: Uuid, jti: Uuid) -> Result<Rotated, sqlx::Error> {
    let mut tx = pool.begin().await?;
    let active: Option<bool> = sqlx::query_scalar("SELECT active FROM teams WHERE id = $1 FOR UPDATE")
        .bind(id)
        .fetch_optional(&mut *tx)
        .await?;
    let out = match active {
        None => Rotated::NotFound,
        Some(false) => Rotated::Inactive,
        Some(true) => {
            sqlx::query("UPDATE teams SET active_jti = $2, updated_at = now() WHERE id = $1")
                .bind(id)
                .bind(jti)
                .execute(&mut *tx)
                .await?;
            audit(&mut tx, actor, "team_rotated", &id.to_string(), json!({})).await?;
            Rotated::Ok
        }
    };
    tx.commit().await?;
    Ok(out)
}

/// Replaces the assignment set (spec §7.3), never a union. The row lock on the
/// team serialises concurrent PUTs, so the result is one submitted set whole.
/// None when the team does not exist.
pub async fn replace_workspaces(
    pool: &PgPool,
    actor: &str,
    id: Uuid,
    workspace_ids: &[String],
) -> Result<Option<Vec<String>>, sqlx::Error> {
    let mut tx = pool.begin().await?;
    let exists: Option<Uuid> = sqlx::query_scalar("SELECT id FROM teams WHERE id = $1 FOR UPDATE")
        .bind(id)
        .fetch_optional(&mut *tx)
        .await?;
    if exists.is_none() {
        return Ok(None);
    }
    let current = assigned_workspaces(&mut *tx, id).await?;
    if current != workspace_ids {
        sqlx::query("DELETE FROM team_workspace_assignments WHERE team_id = $1")
            .bind(id)
            .execute(&mut *tx)
            .await?;
        sqlx::query(
            "INSERT INTO team_workspace_assignments (team_id, workspace_id, position)
             SELECT $1, ws, pos::int FROM unnest($2::text[]) WITH ORDINALITY AS u(ws, pos)",
        )
        .bind(id)
        .bind(workspace_ids)
        .execute(&mut *tx)
        .await?;
        sqlx::query("UPDATE teams SET updated_at = now() WHERE id = $1")
            .bind(id)
            .execute(&mut *tx)
            .await?;
        audit(
            &mut tx,
            actor,
            "team_workspaces_updated",
            &id.to_string(),
            json!({"workspace_ids": workspace_ids}),
        )
        .await?;
    }
    let stored = assigned_workspaces(&mut *tx, id).await?;
    tx.commit().await?;
    Ok(Some(stored))
}

/// Replaces a team's tool allowlist (`None` = every tool) with its audit
/// event; the row trigger announces it. False when the team does not exist.
pub async fn set_tools(pool: &PgPool, actor: &str, id: Uuid, tools: Option<&[String]>) -> Result<bool, sqlx::Error> {
    set_audited(
        pool,
        "UPDATE teams SET allowed_tools = $2, updated_at = now() WHERE id = $1",
        id,
        tools,
        actor,
        "team_tools_set",
        json!({"tools": tools}),
    )
    .await
}

/// Sets a team's own request rate (`None` = the configured one) with its
/// audit event. False when the team does not exist.
pub async fn set_rate_limit(
    pool: &PgPool,
    actor: &str,
    id: Uuid,
    per_minute: Option<i32>,
) -> Result<bool, sqlx::Error> {
    set_audited(
        pool,
        "UPDATE teams SET rate_limit_per_minute = $2, updated_at = now() WHERE id = $1",
        id,
        per_minute,
        actor,
        "team_rate_limit_set",
        json!({"per_minute": per_minute}),
    )
    .await
}

/// One team column set (`update`: `$1` the id, `$2` the value) and, when the
/// team exists, its audit event in the same transaction. False when the team does not exist.
async fn set_audited<'v, T>(
    pool: &PgPool,
    update: &'static str,
    id: Uuid,
    value: T,
    actor: &str,
    action: &str,
    detail: serde_json::Value,
) -> Result<bool, sqlx::Error>
where
    T: 'v + sqlx::Encode<'v, sqlx::Postgres> + sqlx::Type<sqlx::Postgres> + Send,
{
    let mut tx = pool.begin().await?;
    let n = sqlx::query(update)
        .bind(id)
        .bind(value)
        .execute(&mut *tx)
        .await?
        .rows_affected();
    if n == 1 {
        audit(&mut tx, actor, action, &id.to_string(), detail).await?;
    }
    tx.commit().await?;
    Ok(n == 1)
}

/// A team's tool allowlist: `None` when the team does not exist,
/// `Some(None)` when it may use every tool.
pub async fn tools_of(pool: &PgPool, id: Uuid) -> Result<Option<Option<Vec<String>>>, sqlx::Error> {
    sqlx::query_scalar("SELECT allowed_tools FROM teams WHERE id = $1")
        .bind(id)
        .fetch_optional(pool)
        .await
}

/// A team's own request rate: `None` when the team does not exist,
/// `Some(None)` when it has the configured one.
pub async fn rate_limit_of(pool: &PgPool, id: Uuid) -> Result<Option<Option<i32>>, sqlx::Error> {
    sqlx::query_scalar("SELECT rate_limit_per_minute FROM teams WHERE id = $1")
        .bind(id)
        .fetch_optional(pool)
        .await
}

/// Re-activates a deleted team under a new active jti (the demo re-running
/// after its team was deleted). False when the team does not exist.
pub async fn reactivate(pool: &PgPool, actor: &str, id: Uuid, jti: Uuid) -> Result<bool, sqlx::Error> {
    let mut tx = pool.begin().await?;
    let n = sqlx::query("UPDATE teams SET active = TRUE, active_jti = $2, updated_at = now() WHERE id = $1")
        .bind(id)
        .bind(jti)
        .execute(&mut *tx)
        .await?
        .rows_affected();
    if n == 1 {
        audit(&mut tx, actor, "team_reactivated", &id.to_string(), json!({})).await?;
    }
    tx.commit().await?;
    Ok(n == 1)
}

/// A team with its workspaces, for listings.
#[derive(Clone, Debug, sqlx::FromRow)]
pub struct TeamRow {
    pub id: Uuid,
    pub name: String,
    pub active: bool,
    pub created_at: DateTime<Utc>,
    pub updated_at: DateTime<Utc>,
    /// When the active JWT was minted (creation or the last rotation).
    pub last_rotated_at: Option<DateTime<Utc>>,
    pub workspace_ids: Vec<String>,
}

/// Every team, newest first, with its workspaces in assignment order.
pub async fn list(pool: &PgPool) -> Result<Vec<TeamRow>, sqlx::Error> {
    sqlx::query_as(
        "SELECT t.id, t.name, t.active, t.created_at, t.updated_at,
                (SELECT max(e.at) FROM audit_events e
                  WHERE e.target = t.id::text AND e.action IN ('team_created', 'team_rotated')) AS last_rotated_at,
                COALESCE(array_agg(a.workspace_id ORDER BY a.position, a.id)
                         FILTER (WHERE a.workspace_id IS NOT NULL), '{}') AS workspace_ids
           FROM teams t LEFT JOIN team_workspace_assignments a ON a.team_id = t.id
          GROUP BY t.id
          ORDER BY t.created_at DESC, t.id",
    )
    .fetch_all(pool)
    .await
}
