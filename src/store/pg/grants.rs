//! Grants on libraries that no longer exist: memberships and token scopes
//! naming a deleted library uid (a workspace's uid is deterministic, so a
//! re-created workspace would otherwise inherit them).

/// Deletes every membership on `library_uids`; how many rows went.
pub async fn remove_memberships(tx: &mut sqlx::PgConnection, library_uids: &[String]) -> Result<u64, sqlx::Error> {
    if library_uids.is_empty() {
        return Ok(0);
    }
    Ok(
        sqlx::query("DELETE FROM library_memberships WHERE library_uid = ANY($1::text[])")
            .bind(library_uids)
            .execute(&mut *tx)
            .await?
            .rows_affected(),
    )
}

/// Removes `library_uids` from every token's `allowed_libraries` (active or
/// not), keeping the order of the rest; how many tokens changed.
pub async fn remove_from_tokens(tx: &mut sqlx::PgConnection, library_uids: &[String]) -> Result<u64, sqlx::Error> {
    if library_uids.is_empty() {
        return Ok(0);
    }
    Ok(sqlx::query(
        "UPDATE mcp_tokens t
            SET allowed_libraries = COALESCE(
                  (SELECT jsonb_agg(a.e ORDER BY a.pos)
                     FROM jsonb_array_elements(t.allowed_libraries) WITH ORDINALITY AS a(e, pos)
                    WHERE jsonb_typeof(a.e) <> 'string' OR NOT (a.e #>> '{}') = ANY($1::text[])),
                  '[]'::jsonb)
          WHERE t.allowed_libraries ?| $1::text[]",
    )
    .bind(library_uids)
    .execute(&mut *tx)
    .await?
    .rows_affected())
}

/// How many tokens (active or not) name `library_uid` in their scope.
pub async fn tokens_scoping(pool: &sqlx::PgPool, library_uid: &str) -> Result<i64, sqlx::Error> {
    sqlx::query_scalar("SELECT count(*) FROM mcp_tokens WHERE allowed_libraries ? $1")
        .bind(library_uid)
        .fetch_one(pool)
        .await
}

/// Removes `library_uids` from every team's direct library grants; how many
/// grants went (the row trigger announces each team).
pub async fn remove_from_teams(tx: &mut sqlx::PgConnection, library_uids: &[String]) -> Result<u64, sqlx::Error> {
    if library_uids.is_empty() {
        return Ok(0);
    }
    Ok(
        sqlx::query("DELETE FROM team_library_grants WHERE library_uid = ANY($1::text[])")
            .bind(library_uids)
            .execute(&mut *tx)
            .await?
            .rows_affected(),
    )
}
