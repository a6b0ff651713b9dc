//! The one seam where Neo4j 5 and ArcadeDB differ: the full-text index.
//! ArcadeDB creates full-text indexes only through its SQL (HTTP API) and names
//! them `Type[props]`; Neo4j uses Cypher `CREATE FULLTEXT INDEX` and a name.

use serde_json::json;

use super::{statements, GraphError, GraphStore};
use crate::config::{GraphFlavor, Secret, Settings};

#[derive(Clone, Debug)]
pub struct Flavor {
    pub kind: GraphFlavor,
    http_url: String,
    database: String,
    user: String,
    password: Secret,
}

impl Flavor {
    pub fn new(kind: GraphFlavor, s: &Settings) -> Self {
        Flavor {
            kind,
            http_url: s.arcadedb_http_url.trim_end_matches('/').to_owned(),
            database: s.bolt_database.clone(),
            user: s.bolt_user.clone(),
            password: s.bolt_password.clone(),
        }
    }

    /// Name to pass to `db.index.fulltext.queryNodes`.
    pub fn fulltext_index(&self) -> &'static str {
        match self.kind {
            GraphFlavor::Arcadedb => "Chunk[scoped]",
            GraphFlavor::Neo4j => "chunk_scoped",
        }
    }

    pub(super) async fn create_fulltext_index(&self, store: &GraphStore) -> Result<(), GraphError> {
        match self.kind {
            GraphFlavor::Neo4j => {
                // The keyed `scoped` words are made by `scoped::words` and need no
                // analysis: the whitespace analyzer keeps each one a single term, as
                // ArcadeDB's does. The index is kept in step with each commit (not
                // eventually consistent), and migrate waits until it is online.
                for stmt in statements(include_str!("../../../cypher/schema_fulltext_neo4j.cypher")) {
                    store.run("schema_fulltext_neo4j.cypher", neo4rs::query(stmt)).await?;
                }
                Ok(())
            }
            GraphFlavor::Arcadedb => {
                let client = reqwest::Client::new();
                let url = format!("{}/api/v1/command/{}", self.http_url, self.database);
                for stmt in statements(include_str!("../../../cypher/schema_fulltext_arcadedb.sql")) {
                    let resp = client
                        .post(&url)
                        .basic_auth(&self.user, Some(self.password.expose()))
                        .json(&json!({"language": "sql", "command": stmt}))
                        .send()
                        .await
                        .map_err(|e| GraphError::Unavailable(format!("ArcadeDB HTTP API: {e}")))?;
                    if !resp.status().is_success() {
                        let status = resp.status();
                        let body = resp.text().await.unwrap_or_default();
                        return Err(GraphError::Query(format!("{stmt}: {status} {body}")));
                    }
                }
                Ok(())
            }
        }
    }
}

/// Whether a failed write transaction may simply be run again: for the
/// transaction runner's conflict retries. `GraphError::Query` carries the
/// server's status code first (`"<code>: <message>"`).
///
/// - Neo4j: `Neo.TransientError.*` (deadlocks, lock timeouts, outdated
///   reads), except a transaction that was terminated or whose lock client
///   stopped — the official drivers do not retry those either.
/// - ArcadeDB: its Bolt plugin reports a lost optimistic-concurrency race
///   (two transactions changing the same record) with the same Neo4j code,
///   `Neo.TransientError.Transaction.DeadlockDetected` ("Slot rebase not
///   possible … Please retry the operation", checked on 26.10.2); the engine's
///   `ConcurrentModificationException` / `NeedRetryException` names are
///   matched too in case another path reports them under a generic code.
///
/// Unavailability (connection refused, pool, timeouts) is not a conflict and
/// is left to the caller.
pub fn is_transient(err: &GraphError) -> bool {
    let GraphError::Query(msg) = err else {
        return false;
    };
    let code = msg.split(':').next().unwrap_or_default().trim();
    if let Some(kind) = code.strip_prefix("Neo.TransientError.") {
        return !matches!(kind, "Transaction.Terminated" | "Transaction.LockClientStopped");
    }
    msg.contains("ConcurrentModificationException") || msg.contains("NeedRetryException")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn debug_of_a_flavor_shows_no_password() {
        use clap::Parser;
        #[derive(clap::Parser)]
        struct Args {
            #[command(flatten)]
            settings: Settings,
        }
        let s = Args::try_parse_from([
            "mnemosyne",
            "--bolt-password=hunter2-bolt",
            "--bolt-uri=neo4j://neo:hunter2-uri@graph:7687",
        ])
        .unwrap()
        .settings;
        let flavor = format!("{:?}", Flavor::new(s.graph_flavor, &s));
        assert!(!flavor.contains("hunter2"), "{flavor}");
    }

    fn q(s: &str) -> GraphError {
        GraphError::Query(s.to_owned())
    }

    #[test]
    fn neo4j_transient_errors_are_retried_except_terminations() {
        assert!(is_transient(&q(
            "Neo.TransientError.Transaction.DeadlockDetected: ForsetiClient[1] can't acquire ExclusiveLock"
        )));
        assert!(is_transient(&q(
            "Neo.TransientError.Transaction.LockAcquisitionTimeout: x"
        )));
        assert!(!is_transient(&q("Neo.TransientError.Transaction.Terminated: x")));
        assert!(!is_transient(&q("Neo.ClientError.Transaction.Terminated: x")));
        assert!(!is_transient(&q(
            "Neo.ClientError.Schema.ConstraintValidationFailed: Node(1) already exists"
        )));
        assert!(!is_transient(&GraphError::Unavailable("timed out".into())));
    }

    #[test]
    fn arcadedb_concurrent_modification_is_retried() {
        assert!(is_transient(&q(
            "Neo.TransientError.Transaction.DeadlockDetected: Slot rebase not possible on page \
             PageId(mnemosyne/1/0) slot 1 (concurrent change to the same record). Please retry the operation"
        )));
        assert!(is_transient(&q(
            "Neo.DatabaseError.General.UnknownError: com.arcadedb.exception.ConcurrentModificationException: \
             Concurrent modification on page PageId(Chunk_0/1) in file 'Chunk_0.1.65536.v0.bucket'"
        )));
        assert!(!is_transient(&q("Neo.ClientError.Statement.SyntaxError: x")));
    }
}
