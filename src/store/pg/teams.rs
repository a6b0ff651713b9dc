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

/// A team with its workspaces and its directly granted libraries, each in order.
pub async fn get(pool: &PgPool, id: Uuid) -> Result<Option<(Team, Vec<String>, Vec<String>)>, sqlx::Error> {
    let team: Option<Team> =
        sqlx::query_as("SELECT id, name, active, active_jti, created_at, updated_at FROM teams WHERE id = $1")
            .bind(id)
            .fetch_optional(pool)
            .await?;
    let Some(team) = team else { return Ok(None) };
    let ws = granted(pool, id, Grants::Workspaces).await?;
    let libs = granted(pool, id, Grants::Libraries).await?;
    Ok(Some((team, ws, libs)))
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

/// One of a team's two ordered grant lists: its workspaces (spec §7.3) or
/// the libraries granted to it directly (issue 53). Both are replaced whole
/// the same way; each has its own table, audit action and payload field.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Grants {
    Workspaces,
    Libraries,
}

impl Grants {
    fn select(self) -> &'static str {
        match self {
            Grants::Workspaces => {
                "SELECT workspace_id FROM team_workspace_assignments WHERE team_id = $1 ORDER BY position, id"
            }
            Grants::Libraries => {
                "SELECT library_uid::text FROM team_library_grants WHERE team_id = $1 ORDER BY position, id"
            }
        }
    }

    fn delete(self) -> &'static str {
        match self {
            Grants::Workspaces => "DELETE FROM team_workspace_assignments WHERE team_id = $1",
            Grants::Libraries => "DELETE FROM team_library_grants WHERE team_id = $1",
        }
    }

    fn insert(self) -> &'static str {
        match self {
            Grants::Workspaces => {
                "INSERT INTO team_workspace_assignments (team_id, workspace_id, position)
                 SELECT $1, ws, pos::int FROM unnest($2::text[]) WITH ORDINALITY AS u(ws, pos)"
            }
            Grants::Libraries => {
                "INSERT INTO team_library_grants (team_id, library_uid, position)
                 SELECT $1, lib, pos::int FROM unnest($2::text[]) WITH ORDINALITY AS u(lib, pos)"
            }
        }
    }

    /// The audit action of a change.
    pub fn action(self) -> &'static str {
        match self {
            Grants::Workspaces => "team_workspaces_updated",
            Grants::Libraries => "team_libraries_updated",
        }
    }

    /// The field naming the list (REST bodies, audit details).
    pub fn field(self) -> &'static str {
        match self {
            Grants::Workspaces => "workspace_ids",
            Grants::Libraries => "library_uids",
        }
    }
}

/// A team's list of `kind`, in order.
pub async fn granted<'e, E: sqlx::PgExecutor<'e>>(ex: E, id: Uuid, kind: Grants) -> Result<Vec<String>, sqlx::Error> {
    sqlx::query_scalar(kind.select()).bind(id).fetch_all(ex).await
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
    replace(pool, actor, id, Grants::Workspaces, workspace_ids).await
}

/// Replaces one of a team's lists whole (a PUT of it), with its audit event
/// when it changed; the row triggers announce it. The row lock on the team
/// serialises concurrent PUTs, so the result is one submitted list whole.
/// None when the team does not exist.
pub async fn replace(
    pool: &PgPool,
    actor: &str,
    id: Uuid,
    kind: Grants,
    list: &[String],
) -> Result<Option<Vec<String>>, sqlx::Error> {
    let mut tx = pool.begin().await?;
    let exists: Option<Uuid> = sqlx::query_scalar("SELECT id FROM teams WHERE id = $1 FOR UPDATE")
        .bind(id)
        .fetch_optional(&mut *tx)
        .await?;
    if exists.is_none() {
        return Ok(None);
    }
    let current = granted(&mut *tx, id, kind).await?;
    if current != list {
        sqlx::query(kind.delete()).bind(id).execute(&mut *tx).await?;
        sqlx::query(kind.insert()).bind(id).bind(list).execute(&mut *tx).await?;
        sqlx::query("UPDATE teams SET updated_at = now() WHERE id = $1")
            .bind(id)
            .execute(&mut *tx)
            .await?;
        audit(
            &mut tx,
            actor,
            kind.action(),
            &id.to_string(),
            json!({ kind.field(): list }),
        )
        .await?;
    }
    let stored = granted(&mut *tx, id, kind).await?;
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
    /// The libraries granted to it directly, in order.
    pub library_uids: Vec<String>,
}

/// Every team, newest first, with its workspaces and direct libraries in order.
pub async fn list(pool: &PgPool) -> Result<Vec<TeamRow>, sqlx::Error> {
    sqlx::query_as(
        "SELECT t.id, t.name, t.active, t.created_at, t.updated_at,
                (SELECT max(e.at) FROM audit_events e
                  WHERE e.target = t.id::text AND e.action IN ('team_created', 'team_rotated')) AS last_rotated_at,
                COALESCE(array_agg(a.workspace_id ORDER BY a.position, a.id)
                         FILTER (WHERE a.workspace_id IS NOT NULL), '{}') AS workspace_ids,
                ARRAY(SELECT g.library_uid::text FROM team_library_grants g
                       WHERE g.team_id = t.id ORDER BY g.position, g.id) AS library_uids
           FROM teams t LEFT JOIN team_workspace_assignments a ON a.team_id = t.id
          GROUP BY t.id
          ORDER BY t.created_at DESC, t.id",
    )
    .fetch_all(pool)
    .await
}
