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
