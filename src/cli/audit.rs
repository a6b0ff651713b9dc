//! `mnemosyne audit list|export|library`: the audit trail and who read a library.

use chrono::Utc;

use super::args::{AuditCmd, AuditFilterArgs};
use super::emit;
use crate::service;
use crate::service::activity::{self, Viewer};
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
        AuditCmd::Library {
            uid,
            since,
            as_user,
            export,
        } => library_activity(pool, &uid, &since, as_user.as_deref(), export, json).await?,
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

/// `audit library UID`: the library's read activity (a table, `--json`, or
/// JSON lines with `--export`), refused as the console refuses `--as` a
/// user who is neither staff nor an owner or manager.
async fn library_activity(
    pool: &sqlx::PgPool,
    uid: &str,
    since: &str,
    as_user: Option<&str>,
    export: bool,
    json: bool,
) -> anyhow::Result<()> {
    use std::io::Write;
    let since = service::audit::parse_since(since, Utc::now()).map_err(anyhow::Error::msg)?;
    let viewer = match as_user {
        None => Viewer::Staff,
        Some(name) => match pg::users::by_username(pool, name).await? {
            Some(u) if u.is_staff => Viewer::Staff,
            Some(_) => Viewer::User(name),
            None => anyhow::bail!("no such user: {name}"),
        },
    };
    if export {
        let mut out = std::io::BufWriter::new(std::io::stdout().lock());
        let n = activity::export(pool, viewer, uid, since, &mut out).await?;
        out.flush()?;
        eprintln!("{n} activity row(s) exported");
        return Ok(());
    }
    let rows = activity::report(pool, viewer, uid, since).await?;
    emit(json, serde_json::json!(rows), || {
        println!(
            "{:<17} {:<9} {:<38} {:<20} {:<17} {:>8} {:>8}",
            "HOUR", "KIND", "READER", "USER", "TOOL", "CALLS", "RESULTS"
        );
        for r in &rows {
            println!(
                "{:<17} {:<9} {:<38} {:<20} {:<17} {:>8} {:>8}",
                r.hour.format("%Y-%m-%d %H:00"),
                r.reader_kind,
                r.reader_id,
                r.user.as_deref().or(r.team_name.as_deref()).unwrap_or("—"),
                r.tool,
                r.calls,
                r.results
            );
        }
        if rows.is_empty() {
            println!("(no reads since {})", since.format("%Y-%m-%d %H:%M UTC"));
        }
    });
    Ok(())
}
