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
}
