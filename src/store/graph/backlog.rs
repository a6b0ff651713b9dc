//! The caller's own embedding backlog (`get_health`): chunks of the caller's
//! libraries still waiting for a vector. Never the deployment's figure, which
//! would tell one tenant how much the others ingest.

use neo4rs::query;

use super::knowledge::ScopedGraph;
use super::GraphError;

impl ScopedGraph {
    /// The embedding model's id, if semantic search is on.
    pub fn embedding_model(&self) -> Option<&str> {
        self.store().semantic().map(|s| s.id())
    }

    /// What is wrong with the embedding provider now (`get_health`), None
    /// when it answers or there is none.
    pub fn embedding_trouble(&self) -> Option<String> {
        self.store().semantic().and_then(|s| s.trouble())
    }

    /// Whether a query may be embedded now (a remote provider's circuit is
    /// not open): hybrid search goes straight to keywords otherwise.
    pub fn embedding_available(&self) -> bool {
        self.store().semantic().is_some_and(|s| s.available())
    }

    /// Chunks of this view's libraries waiting for a vector: one indexed
    /// lookup per library (`chunk_pending`), nothing outside the scope.
    pub async fn embedding_backlog(&self) -> Result<i64, GraphError> {
        let libs = self.scope().uids().to_vec();
        if libs.is_empty() {
            return Ok(0);
        }
        let rows = self
            .store()
            .rows(
                "health_backlog.cypher",
                query(include_str!("../../../cypher/health_backlog.cypher")).param("libs", libs),
            )
            .await?;
        Ok(rows.first().map(|r| r.get::<i64>("n")).transpose()?.unwrap_or(0))
    }
}
