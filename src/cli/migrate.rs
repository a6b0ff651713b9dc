//! `mnemosyne migrate`: Postgres migrations, the first signing key, the
//! graph schema and the keyword re-index.

use anyhow::Context;

use super::reindex;
use crate::config::Settings;
use crate::store::graph::GraphStore;
use crate::store::pg::{self, keys};

/// Store timeout of `migrate`'s graph calls (at least; a longer configured one wins).
const MIGRATE_GRAPH_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(120);

/// `migrate`: safe to run again; an interrupted run is finished by running it again.
pub(super) async fn run(settings: &Settings, pool: &sqlx::PgPool) -> anyhow::Result<()> {
    pg::migrate(pool).await.context("applying Postgres migrations")?;
    println!("postgres: migrations applied");
    // The first key is made silently: migrate's output ends up in
    // deployment logs, so it never carries a secret.
    if let Some(k) = keys::ensure_active(pool).await? {
        println!(
            "signing key created: kid={} (its secret is never printed; for Daedalus' per-turn JWTs \
             run `mnemosyne signing-key create`, which prints a new key's secret once)",
            k.kid
        );
    }
    // Not serving a request: a large graph's pages are waited for.
    let graph = GraphStore::connect(settings)
        .await?
        .with_timeout(settings.store_timeout().max(MIGRATE_GRAPH_TIMEOUT));
    graph
        .bootstrap_schema()
        .await
        .context("bootstrapping the graph schema")?;
    println!("graph ({}): schema ready", settings.graph_flavor);
    reindex::run(&graph.into_handles().admin, &mut std::io::stderr())
        .await
        .context("re-indexing the chunks for keyword search")?;
    Ok(())
}
