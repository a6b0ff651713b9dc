//! `mnemosyne library list|rename|delete`.

use anyhow::bail;

use super::args::LibraryCmd;
use super::{emit, CLI_ACTOR};
use crate::auth::changes::AuthChanges;
use crate::config::Settings;
use crate::store::graph::ingest::AdminGraph;

/// `library list|rename|delete`.
pub(super) async fn run(settings: &Settings, pool: &sqlx::PgPool, c: LibraryCmd, json: bool) -> anyhow::Result<()> {
    use crate::service::libraries::{self, Authority};
    let graph = AdminGraph::connect(settings).await?;
    match c {
        LibraryCmd::List => list(&graph, json).await?,
        LibraryCmd::Rename { uid, name, description } => {
            let r = libraries::rename(
                &graph,
                pool,
                CLI_ACTOR,
                Authority::Operator,
                &uid,
                &name,
                description.as_deref(),
            )
            .await?;
            emit(json, serde_json::json!(r), || {
                println!("library {}: renamed from {:?} to {:?}", r.uid, r.previous_name, r.name)
            });
        }
        LibraryCmd::Delete { uid, yes } => {
            if !yes {
                bail!(
                    "deleting library {uid} removes its content and every grant on it and cannot be undone: add --yes"
                );
            }
            // The CLI has no caches to fence: the NOTIFY is what applies.
            let changes = AuthChanges::new(pool.clone(), None);
            let d = libraries::delete(&graph, pool, &changes, CLI_ACTOR, Authority::Operator, &uid).await?;
            let c = d.content.as_ref();
            let value = serde_json::json!({
                "uid": d.uid, "deleted_from_graph": c.is_some(),
                "collections": c.map(|c| c.collection_count), "items": c.map(|c| c.item_count),
                "chunks": c.map(|c| c.chunk_count), "memberships_removed": d.memberships_removed,
                "tokens_changed": d.tokens_changed,
            });
            emit(json, value, || match c {
                Some(c) => println!(
                    "library {} deleted: {} collection(s), {} item(s), {} chunk(s); {} membership(s) removed, \
                     {} token(s) no longer scope it",
                    d.uid, c.collection_count, c.item_count, c.chunk_count, d.memberships_removed, d.tokens_changed
                ),
                None => println!(
                    "library {} was not in the graph; {} membership(s) removed, {} token(s) no longer scope it",
                    d.uid, d.memberships_removed, d.tokens_changed
                ),
            });
        }
    }
    Ok(())
}

/// `library list`: every library in the graph.
async fn list(graph: &AdminGraph, json: bool) -> anyhow::Result<()> {
    let libs = graph.all_libraries().await?;
    let value = serde_json::Value::Array(
        libs.iter()
            .map(|l| {
                serde_json::json!({"uid": l.uid, "name": l.name, "workspace_id": l.workspace_id,
                                   "item_count": l.item_count})
            })
            .collect(),
    );
    emit(json, value, || {
        println!("{:<40} {:<24} {:<30} NAME", "UID", "WORKSPACE", "ITEMS");
        for l in &libs {
            println!(
                "{:<40} {:<24} {:<30} {}",
                l.uid,
                l.workspace_id.as_deref().unwrap_or_default(),
                l.item_count,
                l.name
            );
        }
    });
    Ok(())
}
