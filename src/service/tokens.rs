//! Opaque MCP tokens (spec §4.1): minting under the membership rule, and
//! revocation. Used by the CLI, the demo, the admin console and the tests.

use base64::Engine;
use std::collections::HashMap;

use chrono::{DateTime, NaiveDate, NaiveDateTime, Utc};
use rand::RngCore;
use sqlx::PgPool;

use super::tool_grants::{stored, ToolAllowlist};
use super::{check_len, BadField, Propagation};
use crate::auth::changes::AuthChanges;
use crate::auth::resolver::token_hash;
use crate::ids::LibraryUid;
use crate::store::graph::ingest::AdminGraph;
use crate::store::pg::{self, tokens, users};

/// The most libraries one token may name (a form or a command line with
/// more is refused before any work, naming `libraries`).
pub const MAX_TOKEN_LIBRARIES: usize = 1_000;

#[derive(Debug, thiserror::Error)]
pub enum TokenError {
    #[error("{0}")]
    BadField(#[from] BadField),
    #[error("no such user: {0}")]
    NoSuchUser(String),
    /// Spec §4.1: a token may only name libraries on which its user is owner
    /// or manager.
    #[error("{user} is not owner or manager of: {}", libraries.join(", "))]
    NotOwnerOrManager { user: String, libraries: Vec<String> },
    #[error("the expiry is in the past")]
    ExpiryInPast,
    #[error("no active token with id {0}")]
    NotFound(i64),
    /// The user holds the most live tokens a user may (issue 32).
    #[error(
        "{user} already holds {cap} live tokens, the most a user may (MNEMOSYNE_USER_MAX_TOKENS): revoke one first"
    )]
    TooMany { user: String, cap: u32 },
    #[error(transparent)]
    Store(#[from] sqlx::Error),
}

impl TokenError {
    /// The form field a refusal is about ("" when none).
    pub fn field(&self) -> &str {
        match self {
            TokenError::BadField(b) if b.field.starts_with("libraries") => "libraries",
            TokenError::BadField(b) => &b.field,
            TokenError::NoSuchUser(_) => "user",
            TokenError::NotOwnerOrManager { .. } => "libraries",
            TokenError::ExpiryInPast => "expires_at",
            TokenError::NotFound(_) => "id",
            TokenError::TooMany { .. } => "name",
            TokenError::Store(_) => "",
        }
    }
}

/// A new token: its id, and the plaintext, which exists only here (the store
/// keeps its SHA-256) — show it once, to whoever asked.
pub struct Minted {
    pub id: i64,
    pub plaintext: String,
}

/// Never shows the plaintext.
impl std::fmt::Debug for Minted {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Minted")
            .field("id", &self.id)
            .field("plaintext", &"<redacted>")
            .finish()
    }
}

/// Generates an opaque token plaintext: `mnm_` + 32 random bytes, base64url.
pub fn new_token_plaintext() -> String {
    let mut b = [0u8; 32];
    rand::rngs::OsRng.fill_bytes(&mut b);
    format!("mnm_{}", base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(b))
}

/// The audit actor of `mint` and `revoke` (the CLI, tests, benchmarks).
const CLI_ACTOR: &str = "cli";

/// The most live (active, unexpired) tokens one user may hold by default
/// (`MNEMOSYNE_USER_MAX_TOKENS`): every token adds sessions and, without a
/// ceiling, rate.
pub const DEFAULT_MAX_LIVE_TOKENS: u32 = 25;

/// `mint_by` as the CLI, under the default cap of live tokens.
pub async fn mint(
    pg: &PgPool,
    username: &str,
    name: &str,
    libraries: &[String],
    expires_at: Option<DateTime<Utc>>,
) -> Result<Minted, TokenError> {
    mint_by(
        pg,
        CLI_ACTOR,
        username,
        name,
        libraries,
        expires_at,
        DEFAULT_MAX_LIVE_TOKENS,
    )
    .await
}

/// Mints a token for `username` over `libraries` (de-duplicated, order kept;
/// none is legitimate and reads nothing — spec §14.1) on behalf of `actor`:
/// the membership check, the cap of `max_live` live tokens per user, the
/// row and its audit event in one transaction.
pub async fn mint_by(
    pg: &PgPool,
    actor: &str,
    username: &str,
    name: &str,
    libraries: &[String],
    expires_at: Option<DateTime<Utc>>,
    max_live: u32,
) -> Result<Minted, TokenError> {
    let token = NewToken {
        username,
        name,
        libraries,
        tools: None,
        expires_at,
    };
    mint_with_tools(pg, actor, &token, max_live).await
}

/// A token to mint (`mint_with_tools`).
pub struct NewToken<'a> {
    pub username: &'a str,
    pub name: &'a str,
    pub libraries: &'a [String],
    /// The tool allowlist (`None` = every tool; issue 24).
    pub tools: Option<&'a ToolAllowlist>,
    pub expires_at: Option<DateTime<Utc>>,
}

/// `mint_by`, with a tool allowlist (`None` = every tool; issue 24).
pub async fn mint_with_tools(
    pg: &PgPool,
    actor: &str,
    token: &NewToken<'_>,
    max_live: u32,
) -> Result<Minted, TokenError> {
    let NewToken {
        username,
        name,
        libraries,
        tools,
        expires_at,
    } = *token;
    check_len("name", name, 0, 200)?;
    if libraries.len() > MAX_TOKEN_LIBRARIES {
        return Err(super::bad(
            "libraries",
            format!("at most {MAX_TOKEN_LIBRARIES} libraries per token"),
        )
        .into());
    }
    let mut libs: Vec<String> = Vec::with_capacity(libraries.len());
    let mut seen = std::collections::HashSet::with_capacity(libraries.len());
    for (i, l) in libraries.iter().enumerate() {
        let l = LibraryUid::parse(&format!("libraries[{i}]"), l.as_str()).map_err(BadField::from)?;
        if seen.insert(l.as_str().to_owned()) {
            libs.push(l.into_string());
        }
    }
    if expires_at.is_some_and(|e| e <= Utc::now()) {
        return Err(TokenError::ExpiryInPast);
    }
    let mut tx = pg.begin().await?;
    let user = users::by_username(&mut *tx, username)
        .await?
        .ok_or_else(|| TokenError::NoSuchUser(username.to_owned()))?;
    // Counted under the user's row lock: concurrent mints cannot both pass.
    if users::lock_and_count_live_tokens(&mut tx, user.id).await? >= i64::from(max_live) {
        return Err(TokenError::TooMany {
            user: username.to_owned(),
            cap: max_live,
        });
    }
    let refused = users::unscopable_libraries(&mut *tx, user.id, &libs).await?;
    if !refused.is_empty() {
        return Err(TokenError::NotOwnerOrManager {
            user: username.to_owned(),
            libraries: refused,
        });
    }
    let plaintext = new_token_plaintext();
    let tools = tools.map(ToolAllowlist::names);
    let id = tokens::create(
        &mut *tx,
        user.id,
        name,
        &token_hash(&plaintext),
        &libs,
        tools,
        expires_at,
    )
    .await?;
    pg::audit(
        &mut tx,
        actor,
        "token_created",
        &id.to_string(),
        serde_json::json!({"user": username, "name": name, "libraries": libs, "tools": tools,
                           "expires_at": expires_at}),
    )
    .await?;
    tx.commit().await?;
    Ok(Minted { id, plaintext })
}

/// `revoke_by` as the CLI, any owner.
pub async fn revoke(pg: &PgPool, changes: &AuthChanges, id: i64) -> Result<Propagation, TokenError> {
    revoke_by(pg, changes, CLI_ACTOR, id, None).await
}

/// Revokes an active token (only one of `owner`'s, when given) with its audit
/// event; every replica refuses it from its next request.
pub async fn revoke_by(
    pg: &PgPool,
    changes: &AuthChanges,
    actor: &str,
    id: i64,
    owner: Option<&str>,
) -> Result<Propagation, TokenError> {
    let mut tx = pg.begin().await?;
    if !tokens::revoke_owned(&mut *tx, id, owner).await? {
        return Err(TokenError::NotFound(id));
    }
    pg::audit(&mut tx, actor, "token_revoked", &id.to_string(), serde_json::json!({})).await?;
    tx.commit().await?;
    Ok(changes.fence().await)
}

/// Sets an active token's allowlist (`None` = every tool; only one of
/// `owner`'s tokens when given) with its audit event; every replica applies
/// it from its next request.
pub async fn set_token_tools(
    pg: &PgPool,
    changes: &AuthChanges,
    actor: &str,
    id: i64,
    tools: Option<&ToolAllowlist>,
    owner: Option<&str>,
) -> Result<Propagation, TokenError> {
    let mut tx = pg.begin().await?;
    if !tokens::set_tools(&mut *tx, id, stored(tools), owner).await? {
        return Err(TokenError::NotFound(id));
    }
    pg::audit(
        &mut tx,
        actor,
        "token_tools_set",
        &id.to_string(),
        serde_json::json!({"tools": stored(tools)}),
    )
    .await?;
    tx.commit().await?;
    Ok(changes.fence().await)
}

/// The token form's library picker (admin console): the choices for `user_id`: libraries where the user is owner or
/// manager (spec §4.1), with their names when the graph has them.
pub async fn picker(pg: &PgPool, admin: &AdminGraph, user_id: i64) -> Result<Vec<(String, String)>, sqlx::Error> {
    let uids = users::scopable_libraries(pg, user_id).await?;
    // Names are a convenience: the picker still works while the graph is down.
    // Only the picker's own libraries are read, and nothing is counted.
    let names: Option<HashMap<String, String>> = match admin.library_names(&uids).await {
        Ok(names) => Some(names),
        Err(e) => {
            tracing::warn!(error = ?e.to_string(), "admin console: library names unavailable");
            None
        }
    };
    Ok(uids
        .into_iter()
        .map(|u| {
            let name = match &names {
                Some(n) => n.get(&u).cloned().unwrap_or_else(|| "(not in the graph yet)".into()),
                None => "(graph unavailable)".into(),
            };
            (u, name)
        })
        .collect())
}

/// `2027-01-31`, `2027-01-31T12:00` (a `datetime-local` field) or RFC 3339,
/// read as UTC; empty = no expiry.
pub fn parse_expiry(raw: &str) -> Result<Option<DateTime<Utc>>, BadField> {
    let raw = raw.trim();
    if raw.is_empty() {
        return Ok(None);
    }
    if let Ok(t) = DateTime::parse_from_rfc3339(raw) {
        return Ok(Some(t.with_timezone(&Utc)));
    }
    for f in ["%Y-%m-%dT%H:%M", "%Y-%m-%dT%H:%M:%S", "%Y-%m-%d %H:%M"] {
        if let Ok(t) = NaiveDateTime::parse_from_str(raw, f) {
            return Ok(Some(t.and_utc()));
        }
    }
    if let Ok(d) = NaiveDate::parse_from_str(raw, "%Y-%m-%d") {
        return Ok(d.and_hms_opt(0, 0, 0).map(|t| t.and_utc()));
    }
    Err(super::bad(
        "expires_at",
        "Expiry: a date (2027-01-31), a date and time in UTC (2027-01-31T12:00) or RFC 3339.",
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn debug_of_a_minted_token_hides_the_plaintext() {
        let m = Minted {
            id: 7,
            plaintext: new_token_plaintext(),
        };
        let shown = format!("{m:?} {m:#?}");
        assert!(!shown.contains(&m.plaintext), "{shown}");
        assert!(!shown.contains("mnm_"), "{shown}");
        assert!(shown.contains("<redacted>") && shown.contains('7'), "{shown}");
    }

    #[test]
    fn expiry_forms() {
        assert_eq!(parse_expiry("").unwrap(), None);
        let want = "2027-01-31T12:00:00Z".parse::<DateTime<Utc>>().unwrap();
        assert_eq!(parse_expiry("2027-01-31T12:00").unwrap(), Some(want));
        assert_eq!(parse_expiry("2027-01-31T12:00:00Z").unwrap(), Some(want));
        assert_eq!(parse_expiry("2027-01-31T13:00:00+01:00").unwrap(), Some(want));
        assert!(parse_expiry("2027-01-31").unwrap().is_some());
        assert_eq!(parse_expiry("tomorrow").unwrap_err().field, "expires_at");
    }
}
