//! The workflows, each with its own input, result and error types. The
//! adapters — the REST APIs (`api`), the MCP tools (`mcp`), the CLI (`cli`)
//! and the admin console — only translate to and from them.

pub mod accounts;
pub mod activity;
pub mod audit;
pub mod credential_limits;
pub mod embedding;
pub mod health;
pub mod ingest;
pub mod keys;
pub mod libraries;
pub mod memberships;
pub mod oauth;
pub mod teams;
pub mod tokens;
pub mod tool_grants;

use crate::auth::cache::Unconfirmed;
use crate::ids::InvalidId;

/// A field that does not fit, named as the caller sent it (e.g. `item.title`).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct BadField {
    pub field: String,
    pub message: String,
}

impl From<InvalidId> for BadField {
    fn from(e: InvalidId) -> Self {
        BadField {
            message: e.to_string(),
            field: e.field,
        }
    }
}

/// A bad field is a REST 400 naming it (here, not in `error`: the error
/// table sits below the workflows).
impl From<BadField> for crate::error::ApiError {
    fn from(e: BadField) -> Self {
        crate::error::ApiError::BadRequest {
            field: Some(e.field),
            message: e.message,
        }
    }
}

pub(crate) fn bad(field: &str, message: impl Into<String>) -> BadField {
    BadField {
        field: field.to_owned(),
        message: message.into(),
    }
}

/// `min..=max` characters, and not blank when `min > 0`.
pub fn check_len(field: &str, v: &str, min: usize, max: usize) -> Result<(), BadField> {
    let n = v.chars().count();
    if n < min || n > max || (min > 0 && v.trim().is_empty()) {
        return Err(bad(field, format!("{field} must be {min} to {max} characters")));
    }
    Ok(())
}

/// [`check_len`], and none of the characters `text::is_forbidden` names:
/// for strings that reach the MCP tools' text output (issue 32).
pub fn check_text(field: &str, v: &str, min: usize, max: usize) -> Result<(), BadField> {
    check_len(field, v, min, max)?;
    if crate::text::has_forbidden(v) {
        return Err(bad(
            field,
            format!("{field} must not contain control characters (line breaks, tabs, bidirectional overrides)"),
        ));
    }
    Ok(())
}

/// Whether every live replica confirmed a committed change in time (see
/// `AuthChanges::fence`). The change is committed either way.
pub type Propagation = Result<(), Unconfirmed>;
