//! Per-credential rate limits (issue 24): a token or a team may carry its own
//! deployment-wide request rate a minute instead of the configured one (0 =
//! no limit). Audited, and applied on every replica's next request like any
//! auth change (row triggers, then the fence).

use sqlx::PgPool;
use uuid::Uuid;

use super::teams::TeamError;
use super::tokens::TokenError;
use super::{bad, BadField, Propagation};
use crate::auth::changes::AuthChanges;
use crate::store::pg::{self, teams, tokens};

/// The largest rate a credential may be given (a Postgres `integer`).
pub const MAX_PER_MINUTE: u32 = i32::MAX as u32;

fn stored(field: &str, per_minute: Option<u32>) -> Result<Option<i32>, BadField> {
    per_minute
        .map(|r| i32::try_from(r).map_err(|_| bad(field, format!("{field} must be at most {MAX_PER_MINUTE}"))))
        .transpose()
}

/// Sets an active token's rate (`None` = the configured one).
pub async fn set_token_rate_limit(
    pg: &PgPool,
    changes: &AuthChanges,
    actor: &str,
    id: i64,
    per_minute: Option<u32>,
) -> Result<Propagation, TokenError> {
    let value = stored("per_minute", per_minute)?;
    let mut tx = pg.begin().await?;
    if !tokens::set_rate_limit(&mut *tx, id, value).await? {
        return Err(TokenError::NotFound(id));
    }
    pg::audit(
        &mut tx,
        actor,
        "token_rate_limit_set",
        &id.to_string(),
        serde_json::json!({"per_minute": value}),
    )
    .await?;
    tx.commit().await?;
    Ok(changes.fence().await)
}

/// Sets a team's rate (`None` = the configured one).
pub async fn set_team_rate_limit(
    pg: &PgPool,
    changes: &AuthChanges,
    actor: &str,
    id: Uuid,
    per_minute: Option<u32>,
) -> Result<Propagation, TeamError> {
    let value = stored("per_minute", per_minute)?;
    if !teams::set_rate_limit(pg, actor, id, value).await? {
        return Err(TeamError::NotFound);
    }
    Ok(changes.fence().await)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_rate_beyond_an_integer_is_refused_naming_the_field() {
        assert_eq!(stored("per_minute", Some(600)).unwrap(), Some(600));
        assert_eq!(stored("per_minute", None).unwrap(), None);
        assert_eq!(stored("per_minute", Some(u32::MAX)).unwrap_err().field, "per_minute");
    }
}
