//! `migrate`'s search re-index: the chunks an older analysis indexed are
//! indexed again, a page at a time, with progress on standard error.

use std::io::Write;

use crate::analysis::scoped::ANALYSIS_VERSION;
use crate::store::graph::ingest::AdminGraph;

/// Chunks read and written per transaction.
pub const PAGE: usize = 500;

/// Re-indexes every stale chunk, reporting to `out` (one line per page;
/// one line, "search index up to date", when there is nothing to do).
/// Returns how many chunks were re-indexed. Resumable: run it again after an
/// interruption and it carries on with the chunks still stale.
pub async fn run(admin: &AdminGraph, out: &mut impl Write) -> anyhow::Result<i64> {
    let stale = admin.stale_chunks().await?;
    if stale == 0 {
        writeln!(out, "search index up to date")?;
        return Ok(0);
    }
    writeln!(
        out,
        "search index: {stale} chunks indexed by an older analysis, re-indexing (analysis {ANALYSIS_VERSION})"
    )?;
    let (mut after, mut written) = (String::new(), 0i64);
    loop {
        let page = admin.reindex_page(&after, PAGE).await?;
        written += page.written;
        if page.read > 0 {
            writeln!(out, "re-indexed {written} of {stale} chunks")?;
        }
        match page.last_uid {
            Some(last) if page.read >= PAGE => after = last,
            _ => break,
        }
    }
    writeln!(out, "search index up to date ({written} chunks re-indexed)")?;
    Ok(written)
}
