//! `mnemosyne audit list|export`: the audit trail.

use chrono::Utc;

use super::args::{AuditCmd, AuditFilterArgs};
use super::emit;
use crate::service;
use crate::store::pg;

fn audit_filter(since: Option<&str>, f: AuditFilterArgs) -> anyhow::Result<pg::audit::AuditFilter> {
    let since = since
        .map(|s| service::audit::parse_since(s, Utc::now()))
        .transpose()
        .map_err(anyhow::Error::msg)?;
    Ok(pg::audit::AuditFilter {
        since,
        action: f.action,
        actor: f.actor,
        surface: f.surface,
    })
}

/// `audit list|export`.
pub(super) async fn run(pool: &sqlx::PgPool, c: AuditCmd, json: bool) -> anyhow::Result<()> {
    use std::io::Write;
    match c {
        AuditCmd::List { since, filter, limit } => {
            let f = audit_filter(since.as_deref(), filter)?;
            let events = pg::audit::newest(pool, &f, limit).await?;
            emit(json, serde_json::json!(events), || {
                println!(
                    "{:<20} {:<8} {:<24} {:<24} {:<40} DETAIL",
                    "AT", "SURFACE", "ACTOR", "ACTION", "TARGET"
                );
                for e in &events {
                    println!(
                        "{:<20} {:<8} {:<24} {:<24} {:<40} {}",
                        e.at.format("%Y-%m-%d %H:%M:%S"),
                        e.surface,
                        e.actor,
                        e.action,
                        e.target.as_deref().unwrap_or(""),
                        e.detail
                    );
                }
            });
        }
        AuditCmd::Export { since, filter } => {
            let f = audit_filter(Some(&since), filter)?;
            let mut out = std::io::BufWriter::new(std::io::stdout().lock());
            let (mut after, mut total) = (0i64, 0u64);
            // Pages by id: each is one index range read, however large the trail.
            loop {
                let page = pg::audit::page_after(pool, &f, after, 5_000).await?;
                for e in &page {
                    serde_json::to_writer(&mut out, e)?;
                    out.write_all(b"\n")?;
                }
                total += page.len() as u64;
                match page.last() {
                    Some(last) if page.len() == 5_000 => after = last.id,
                    _ => break,
                }
            }
            out.flush()?;
            eprintln!("{total} audit event(s) exported");
        }
    }
    Ok(())
}
