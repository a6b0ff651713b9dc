//! The audit trail: events of graph changes written right after the graph
//! commits (Postgres changes write theirs in their own transaction).

use sqlx::PgPool;

use crate::store::pg;

/// Writes the audit event of a change the graph has already committed. A
/// failure cannot undo the change, so it does not fail the caller: it is
/// logged as an error naming the event (never its secrets: there are none in
/// an event).
pub async fn after_commit(pool: &PgPool, actor: &str, action: &str, target: &str, detail: serde_json::Value) {
    let written = async {
        let mut conn = pool.acquire().await?;
        pg::audit(&mut conn, actor, action, target, detail.clone()).await
    }
    .await;
    if let Err(e) = written {
        tracing::error!(error = %e, actor, action, target, %detail,
                        "audit event NOT written for a committed change");
    }
}
