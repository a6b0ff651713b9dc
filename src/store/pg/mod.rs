//! Postgres: pool, migrations and the queries of each resource.

pub mod activity;
pub mod admin;
pub mod audit;
pub mod auth;
pub mod grants;
pub mod index_changes;
pub mod keys;
pub mod oauth;
pub mod sessions;
pub mod teams;
pub mod tokens;
pub mod usage;
pub mod users;

use std::time::Duration;

use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use sqlx::{ConnectOptions, PgPool};

pub static MIGRATOR: sqlx::migrate::Migrator = sqlx::migrate!("./migrations");

/// Channel every auth-relevant change is announced on (see the migration's trigger).
pub const AUTH_CHANNEL: &str = "mnemosyne_auth";

/// Channel every bump of a library's index sequence is announced on
/// (`<seq>:<library_uid>`, migration `..._index_sequence_notify.sql`).
pub const INDEX_CHANNEL: &str = "mnemosyne_index";

/// Opens a pool; connecting is lazy so `serve` starts (and `/readyz` says why it
/// is not ready) while Postgres is down.
pub fn pool(database_url: &str, acquire_timeout: Duration) -> Result<PgPool, sqlx::Error> {
    let opts: PgConnectOptions = database_url.parse::<PgConnectOptions>()?.disable_statement_logging();
    Ok(PgPoolOptions::new()
        .max_connections(16)
        .acquire_timeout(acquire_timeout)
        .connect_lazy_with(opts))
}

/// Where the connections that need a server session of their own go (the
/// LISTEN connection, the embedding leader's lock): `url` parsed, as `pool`
/// does.
pub fn session_options(url: &str) -> Result<PgConnectOptions, sqlx::Error> {
    Ok(url.parse::<PgConnectOptions>()?.disable_statement_logging())
}

/// Applies pending migrations; a no-op when all are applied.
pub async fn migrate(pool: &PgPool) -> Result<(), sqlx::migrate::MigrateError> {
    MIGRATOR.run(pool).await
}

pub async fn ping(pool: &PgPool) -> Result<(), sqlx::Error> {
    sqlx::query("SELECT 1").execute(pool).await.map(|_| ())
}

/// Writes an audit event inside the caller's transaction (never a credential).
/// Its surface follows from the actor (`surface_of`).
pub async fn audit(
    tx: &mut sqlx::PgConnection,
    actor: &str,
    action: &str,
    target: &str,
    detail: serde_json::Value,
) -> Result<(), sqlx::Error> {
    sqlx::query("INSERT INTO audit_events (actor, action, target, detail, surface) VALUES ($1, $2, $3, $4, $5)")
        .bind(actor)
        .bind(action)
        .bind(target)
        .bind(detail)
        .bind(surface_of(actor))
        .execute(tx)
        .await
        .map(|_| ())
}

/// The surface an audit actor acts through: the CLI writes `cli`, the
/// console `admin:<user>`, an MCP caller `mcp:<principal>`; anyone else is a
/// Basic-authenticated REST account (the service account).
pub fn surface_of(actor: &str) -> &'static str {
    if actor == "cli" {
        "cli"
    } else if actor.starts_with("admin:") {
        "console"
    } else if actor.starts_with("mcp:") {
        "mcp"
    } else {
        "rest"
    }
}

/// Announces a change that no trigger sees (graph-side workspace libraries).
pub async fn notify(pool: &PgPool, payload: &str) -> Result<(), sqlx::Error> {
    sqlx::query("SELECT pg_notify($1, $2)")
        .bind(AUTH_CHANNEL)
        .bind(payload)
        .execute(pool)
        .await
        .map(|_| ())
}

/// Announces changes inside the caller's transaction: delivered at commit
/// (identical payloads once), dropped on rollback.
pub async fn notify_in(tx: &mut sqlx::PgConnection, payloads: &[String]) -> Result<(), sqlx::Error> {
    if payloads.is_empty() {
        return Ok(());
    }
    sqlx::query("SELECT pg_notify($1, p) FROM unnest($2::text[]) AS n(p)")
        .bind(AUTH_CHANNEL)
        .bind(payloads)
        .execute(tx)
        .await
        .map(|_| ())
}

/// Runs `delete` (a `DELETE` of rows older than `$1` days, at most `$2` of
/// them) until it deletes fewer than `batch` rows or `max_batches` times:
/// short locks and a bounded WAL burst per statement (the retention sweeps
/// of the audit trail, usage and library activity). How many rows went.
pub(crate) async fn sweep_batches(
    pool: &PgPool,
    delete: &'static str,
    days: u32,
    batch: i64,
    max_batches: u32,
) -> Result<u64, sqlx::Error> {
    let mut total = 0;
    for _ in 0..max_batches {
        let n = sqlx::query(delete)
            .bind(days as i32)
            .bind(batch)
            .execute(pool)
            .await?
            .rows_affected();
        total += n;
        if (n as i64) < batch {
            break;
        }
    }
    Ok(total)
}

#[cfg(test)]
mod tests {
    use super::surface_of;

    #[test]
    fn an_audit_actor_names_its_surface() {
        for (actor, surface) in [
            ("cli", "cli"),
            ("admin:alice", "console"),
            ("mcp:token:12", "mcp"),
            ("daedalus-service", "rest"),
            ("clippy", "rest"),
            ("administrator", "rest"),
        ] {
            assert_eq!(surface_of(actor), surface, "{actor}");
        }
    }
}
