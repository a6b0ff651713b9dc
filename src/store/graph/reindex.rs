//! Re-indexing for keyword search: chunks whose `scoped` and `dl` were made by
//! an older analysis than `scoped::ANALYSIS_VERSION` (or before chunks had
//! `dl` and `analysis` at all; never a newer one's: an older binary's
//! `migrate` during a rolling upgrade leaves them) get them made again from their library's
//! language, item title and text. `mnemosyne migrate` runs it a page at a
//! time, in uid order, reading only stale chunks: a page written is no longer
//! stale, so a run that was interrupted is finished by running it again, and
//! an up-to-date graph is one count and no write.

use std::collections::HashMap;
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::Arc;

use neo4rs::{query, BoltType};

use super::ingest::{message_batches, AdminGraph};
use super::{GraphError, Step};
use crate::analysis::scoped::{scoped_text, ANALYSIS_VERSION};

/// What one page of re-indexing did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ReindexPage {
    /// Stale chunks read (fewer than the page size: this was the last page).
    pub read: usize,
    /// Chunks re-indexed (a chunk re-ingested meanwhile is left as it is).
    pub written: i64,
    /// The largest uid read: where the next page starts.
    pub last_uid: Option<String>,
}

impl AdminGraph {
    /// How many chunks an older analysis indexed.
    pub async fn stale_chunks(&self) -> Result<i64, GraphError> {
        let q = query(include_str!("../../../cypher/reindex_count.cypher")).param("analysis", ANALYSIS_VERSION);
        let rows = self.0.rows("reindex_count.cypher", q).await?;
        Ok(rows.first().map(|r| r.get("n")).transpose()?.unwrap_or(0))
    }

    /// Re-indexes up to `limit` stale chunks with uids after `after` (uid
    /// order), in one transaction. A write skips a chunk that is current by
    /// then or whose title changed (re-ingested meanwhile).
    pub async fn reindex_page(&self, after: &str, limit: usize) -> Result<ReindexPage, GraphError> {
        let q = query(include_str!("../../../cypher/reindex_page.cypher"))
            .param("after", after)
            .param("analysis", ANALYSIS_VERSION)
            .param("limit", limit as i64);
        let rows = self.0.rows("reindex_page.cypher", q).await?;
        let mut last_uid = None;
        let mut writes: Vec<(usize, BoltType)> = Vec::with_capacity(rows.len());
        let mut libraries: Vec<String> = Vec::new();
        for row in &rows {
            let Some(uid) = row.get::<Option<String>>("uid")? else {
                continue;
            };
            last_uid = Some(uid.clone());
            // A chunk deleted while this page was read (a workspace or item
            // delete racing a migrate) has no properties left: skip it.
            let (Some(library_uid), Some(text)) = (
                row.get::<Option<String>>("library_uid")?,
                row.get::<Option<String>>("text")?,
            ) else {
                continue;
            };
            let title = row.get::<Option<String>>("item_title")?.unwrap_or_default();
            let language = self.language_of(&library_uid).await?;
            if !libraries.contains(&library_uid) {
                libraries.push(library_uid.clone());
            }
            let indexed = scoped_text(&library_uid, language, &title, &text);
            let size = uid.len() + title.len() + indexed.scoped.len() + 64;
            let mut m: HashMap<String, BoltType> = HashMap::new();
            m.insert("uid".into(), uid.as_str().into());
            m.insert("item_title".into(), title.into());
            m.insert("scoped".into(), indexed.scoped.into());
            m.insert("dl".into(), indexed.dl.into());
            writes.push((size, m.into()));
        }
        if writes.is_empty() {
            // Every row may have been skipped (deleted meanwhile): the page
            // was still read in full, so it is not the last because of that.
            return Ok(ReindexPage {
                read: rows.len(),
                written: 0,
                last_uid,
            });
        }
        let batches = message_batches(writes);
        // Each write statement's count, by position: a retried transaction
        // overwrites its previous attempt's.
        let counts: Arc<Vec<AtomicI64>> = Arc::new((0..batches.len()).map(|_| AtomicI64::new(0)).collect());
        let mut steps: Vec<Step<()>> = Vec::with_capacity(batches.len());
        for (i, batch) in batches.into_iter().enumerate() {
            let counts = counts.clone();
            steps.push(Step::check(
                query(include_str!("../../../cypher/reindex_write.cypher"))
                    .param("rows", batch)
                    .param("analysis", ANALYSIS_VERSION),
                move |rows| {
                    let n: i64 = rows.first().map(|r| r.get("n")).transpose()?.unwrap_or(0);
                    counts[i].store(n, Ordering::Relaxed);
                    Ok(None)
                },
            ));
        }
        self.0.transaction("re-index chunks", false, steps).await?;
        // Their terms changed: every replica rebuilds these libraries' indexes.
        for lib in &libraries {
            self.0.record_change(lib, None).await?;
        }
        Ok(ReindexPage {
            read: rows.len(),
            written: counts.iter().map(|c| c.load(Ordering::Relaxed)).sum(),
            last_uid,
        })
    }
}
