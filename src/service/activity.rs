//! Who may read a library's activity (issue 53): its owners and managers,
//! and staff (every library's); nobody else sees any. The console and the
//! CLI ask here, so both refuse the same way.

use chrono::{DateTime, Utc};
use sqlx::PgPool;

use crate::ids::LibraryUid;
use crate::store::pg::activity::{self, ActivityRow};
use crate::store::pg::users::{self, Role};

/// Who is asking.
#[derive(Clone, Copy, Debug)]
pub enum Viewer<'a> {
    /// Console staff, and the CLI's operator (who holds the database).
    Staff,
    /// A signed-in person (the console) or `--as USER` (the CLI).
    User(&'a str),
}

#[derive(Debug, thiserror::Error)]
pub enum ActivityError {
    #[error(transparent)]
    BadField(#[from] super::BadField),
    /// Neither staff nor an owner or manager of the library.
    #[error("only the library's owners and managers (and staff) may see who read library {0}")]
    Refused(String),
    #[error(transparent)]
    Store(#[from] sqlx::Error),
}

/// Most rows a report shows (an export has no limit).
pub const REPORT_ROWS: i64 = 5_000;

/// Refuses `viewer` unless staff or an owner or manager of `uid`; the
/// checked uid.
pub async fn authorize(pg: &PgPool, viewer: Viewer<'_>, uid: &str) -> Result<String, ActivityError> {
    let uid = LibraryUid::parse("library_uid", uid)
        .map_err(super::BadField::from)?
        .into_string();
    if let Viewer::User(name) = viewer {
        match users::strongest_role(pg, name, &uid).await? {
            Some(Role::Owner | Role::Manager) => {}
            _ => return Err(ActivityError::Refused(uid)),
        }
    }
    Ok(uid)
}

/// The library's read activity since `since`, newest hour first.
pub async fn report(
    pg: &PgPool,
    viewer: Viewer<'_>,
    uid: &str,
    since: DateTime<Utc>,
) -> Result<Vec<ActivityRow>, ActivityError> {
    let uid = authorize(pg, viewer, uid).await?;
    Ok(activity::for_library(pg, &uid, since, REPORT_ROWS).await?)
}

/// Most write events the activity page shows beside the reads.
pub const WRITE_EVENTS: i64 = 100;

/// The library's write events since `since` (newest first), for those who
/// may see its reads.
pub async fn write_events(
    pg: &PgPool,
    viewer: Viewer<'_>,
    uid: &str,
    since: DateTime<Utc>,
) -> Result<Vec<crate::store::pg::audit::AuditEvent>, ActivityError> {
    let uid = authorize(pg, viewer, uid).await?;
    Ok(crate::store::pg::audit::of_library(pg, &uid, since, WRITE_EVENTS).await?)
}

/// Writes the library's activity since `since` as JSON lines (one row a
/// line, oldest first) to `out`; how many rows.
pub async fn export(
    pg: &PgPool,
    viewer: Viewer<'_>,
    uid: &str,
    since: DateTime<Utc>,
    out: &mut impl std::io::Write,
) -> Result<u64, ActivityError> {
    let uid = authorize(pg, viewer, uid).await?;
    Ok(activity::each_for_library(pg, &uid, since, |row| {
        serde_json::to_writer(&mut *out, &row)?;
        out.write_all(b"\n")
    })
    .await?)
}
