//! `mnemosyne index status|rebuild`: this replica's per-library search
//! indexes (MNEMOSYNE_INDEX_DIR) and asking every replica to rebuild one
//! library's, or all of them, from the graph.

use std::collections::HashMap;

use sqlx::PgPool;

use crate::config::Settings;
use crate::search::index::replica::SearchIndex;
use crate::store::graph::ingest::AdminGraph;
use crate::store::pg::index_changes;

#[derive(clap::Subcommand, Debug)]
pub enum IndexCmd {
    /// The library indexes in MNEMOSYNE_INDEX_DIR: chunks, disk, and whether
    /// each is caught up with the change sequence (a search catches it up).
    Status,
    /// Every replica rebuilds the library's index (all libraries' without
    /// --library) from the graph on its next search of it; searches take the
    /// graph path meanwhile.
    Rebuild {
        /// Only this library.
        #[arg(long)]
        library: Option<String>,
    },
}

pub async fn run(settings: &Settings, pool: &PgPool, cmd: IndexCmd, json: bool) -> anyhow::Result<()> {
    match cmd {
        IndexCmd::Status => status(settings, pool, json).await,
        IndexCmd::Rebuild { library } => {
            let libraries = match library {
                Some(l) => vec![l],
                None => AdminGraph::connect(settings)
                    .await?
                    .library_list()
                    .await?
                    .into_iter()
                    .map(|l| l.uid)
                    .collect(),
            };
            for l in &libraries {
                index_changes::record(pool, l, None).await?;
            }
            super::emit(json, serde_json::json!({"rebuild": libraries}), || {
                println!(
                    "{} librar{} to rebuild: every replica rebuilds on its next search of each",
                    libraries.len(),
                    if libraries.len() == 1 { "y" } else { "ies" }
                )
            });
            Ok(())
        }
    }
}

async fn status(settings: &Settings, pool: &PgPool, json: bool) -> anyhow::Result<()> {
    let Some(dir) = &settings.index_dir else {
        anyhow::bail!("MNEMOSYNE_INDEX_DIR is not set: this replica searches the graph");
    };
    let index = SearchIndex::open(dir, pool.clone(), 1, "", crate::embed::DIM, 0)?;
    let local = index.status();
    let uids: Vec<String> = local.iter().map(|s| s.library_uid.clone()).collect();
    let current: HashMap<String, i64> = index_changes::sequences(pool, &uids).await?.into_iter().collect();
    let rows: Vec<serde_json::Value> = local
        .iter()
        .map(|s| {
            let at = current.get(&s.library_uid).copied().unwrap_or(0);
            serde_json::json!({"library_uid": s.library_uid, "chunks": s.chunks, "vectors": s.vectors,
                               "model": s.model, "disk_bytes": s.disk_bytes,
                               "applied_seq": s.seq, "current_seq": at, "behind": (at - s.seq).max(0)})
        })
        .collect();
    super::emit(json, serde_json::json!({"index_dir": dir, "libraries": rows}), || {
        println!("{} ({} libraries)", dir.display(), rows.len());
        for r in &rows {
            println!(
                "{}  {} chunks ({} with a vector)  {:.1} MB  {}",
                r["library_uid"].as_str().unwrap_or_default(),
                r["chunks"],
                r["vectors"],
                r["disk_bytes"].as_f64().unwrap_or(0.0) / 1e6,
                match r["behind"].as_i64().unwrap_or(0) {
                    0 => "caught up".to_owned(),
                    n => format!("{n} changes behind (caught up on its next search)"),
                }
            );
        }
    });
    Ok(())
}
