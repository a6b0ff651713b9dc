//! The embedded authorization server's rows (issue 48): clients, pending
//! authorization requests, grants, codes and refresh tokens. Codes, request
//! ids and refresh tokens are stored as hex SHA-256 only.

use chrono::{DateTime, Utc};
use sqlx::types::Json;
use sqlx::{PgConnection, PgExecutor, PgPool};

#[derive(Clone, Debug, sqlx::FromRow)]
pub struct Client {
    pub client_id: String,
    pub client_name: String,
    pub redirect_uris: Vec<String>,
    pub source: String,
    pub metadata: Json<serde_json::Value>,
    pub created_at: DateTime<Utc>,
}

pub async fn insert_client<'e>(
    ex: impl PgExecutor<'e>,
    client_id: &str,
    client_name: &str,
    redirect_uris: &[String],
    source: &str,
    metadata: &serde_json::Value,
) -> Result<(), sqlx::Error> {
    sqlx::query(
        "INSERT INTO oauth_clients (client_id, client_name, redirect_uris, source, metadata)
         VALUES ($1, $2, $3, $4, $5)",
    )
    .bind(client_id)
    .bind(client_name)
    .bind(redirect_uris)
    .bind(source)
    .bind(Json(metadata))
    .execute(ex)
    .await
    .map(|_| ())
}

/// Keeps (or refreshes) the client a Client ID Metadata Document describes
/// (its URL is its id). None when that id belongs to a client registered
/// another way (never overwritten).
pub async fn upsert_document_client<'e>(
    ex: impl PgExecutor<'e>,
    client_id: &str,
    client_name: &str,
    redirect_uris: &[String],
    metadata: &serde_json::Value,
) -> Result<Option<Client>, sqlx::Error> {
    sqlx::query_as(
        "INSERT INTO oauth_clients (client_id, client_name, redirect_uris, source, metadata)
         VALUES ($1, $2, $3, 'cimd', $4)
         ON CONFLICT (client_id) DO UPDATE
            SET client_name = EXCLUDED.client_name, redirect_uris = EXCLUDED.redirect_uris,
                metadata = EXCLUDED.metadata
          WHERE oauth_clients.source = 'cimd'
         RETURNING client_id, client_name, redirect_uris, source, metadata, created_at",
    )
    .bind(client_id)
    .bind(client_name)
    .bind(redirect_uris)
    .bind(Json(metadata))
    .fetch_optional(ex)
    .await
}

pub async fn client<'e>(ex: impl PgExecutor<'e>, client_id: &str) -> Result<Option<Client>, sqlx::Error> {
    sqlx::query_as(
        "SELECT client_id, client_name, redirect_uris, source, metadata, created_at
           FROM oauth_clients WHERE client_id = $1",
    )
    .bind(client_id)
    .fetch_optional(ex)
    .await
}

pub async fn clients(pool: &PgPool) -> Result<Vec<Client>, sqlx::Error> {
    sqlx::query_as(
        "SELECT client_id, client_name, redirect_uris, source, metadata, created_at
           FROM oauth_clients ORDER BY created_at, client_id",
    )
    .fetch_all(pool)
    .await
}

/// Deletes a client; its grants, codes and refresh tokens go with it, and
/// its access tokens (cascading, each announced by the row trigger).
pub async fn delete_client<'e>(ex: impl PgExecutor<'e>, client_id: &str) -> Result<bool, sqlx::Error> {
    Ok(sqlx::query("DELETE FROM oauth_clients WHERE client_id = $1")
        .bind(client_id)
        .execute(ex)
        .await?
        .rows_affected()
        == 1)
}

/// A checked authorization request waiting for consent.
#[derive(Clone, Debug, sqlx::FromRow)]
pub struct PendingRequest {
    pub client_id: String,
    pub redirect_uri: String,
    pub code_challenge: String,
    pub state: Option<String>,
    pub scope: String,
    pub resource: String,
    pub expires_at: DateTime<Utc>,
}

pub async fn insert_request<'e>(ex: impl PgExecutor<'e>, id_hash: &str, r: &PendingRequest) -> Result<(), sqlx::Error> {
    sqlx::query(
        "INSERT INTO oauth_requests (id_hash, client_id, redirect_uri, code_challenge, state, scope, resource, expires_at)
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8)",
    )
    .bind(id_hash)
    .bind(&r.client_id)
    .bind(&r.redirect_uri)
    .bind(&r.code_challenge)
    .bind(&r.state)
    .bind(&r.scope)
    .bind(&r.resource)
    .bind(r.expires_at)
    .execute(ex)
    .await
    .map(|_| ())
}

/// A live pending request (not expired), without consuming it.
pub async fn request<'e>(ex: impl PgExecutor<'e>, id_hash: &str) -> Result<Option<PendingRequest>, sqlx::Error> {
    sqlx::query_as(
        "SELECT client_id, redirect_uri, code_challenge, state, scope, resource, expires_at
           FROM oauth_requests WHERE id_hash = $1 AND expires_at > now()",
    )
    .bind(id_hash)
    .fetch_optional(ex)
    .await
}

/// Consumes a live pending request: only one consent answer per request.
pub async fn take_request<'e>(ex: impl PgExecutor<'e>, id_hash: &str) -> Result<Option<PendingRequest>, sqlx::Error> {
    sqlx::query_as(
        "DELETE FROM oauth_requests WHERE id_hash = $1 AND expires_at > now()
         RETURNING client_id, redirect_uri, code_challenge, state, scope, resource, expires_at",
    )
    .bind(id_hash)
    .fetch_optional(ex)
    .await
}

#[derive(Clone, Debug, sqlx::FromRow)]
pub struct Grant {
    pub id: i64,
    pub client_id: String,
    pub client_name: String,
    pub user_id: i64,
    pub username: String,
    pub allowed_libraries: Json<Vec<String>>,
    pub allowed_tools: Option<Vec<String>>,
    pub active: bool,
    pub expires_at: DateTime<Utc>,
    pub created_at: DateTime<Utc>,
    /// The latest use of any access token issued under it.
    pub last_used_at: Option<DateTime<Utc>>,
}

const GRANT_COLUMNS: &str = "g.id, g.client_id, c.client_name, g.user_id, u.username, g.allowed_libraries,
        g.allowed_tools, g.active, g.expires_at, g.created_at,
        (SELECT max(t.last_used_at) FROM mcp_tokens t WHERE t.oauth_grant_id = g.id) AS last_used_at
   FROM oauth_grants g JOIN oauth_clients c ON c.client_id = g.client_id JOIN users u ON u.id = g.user_id";

pub async fn insert_grant(
    conn: &mut PgConnection,
    client_id: &str,
    user_id: i64,
    libraries: &[String],
    tools: Option<&[String]>,
    expires_at: DateTime<Utc>,
) -> Result<i64, sqlx::Error> {
    sqlx::query_scalar(
        "INSERT INTO oauth_grants (client_id, user_id, allowed_libraries, allowed_tools, expires_at)
         VALUES ($1, $2, $3, $4, $5) RETURNING id",
    )
    .bind(client_id)
    .bind(user_id)
    .bind(Json(libraries))
    .bind(tools)
    .bind(expires_at)
    .fetch_one(conn)
    .await
}

pub async fn grant<'e>(ex: impl PgExecutor<'e>, id: i64) -> Result<Option<Grant>, sqlx::Error> {
    sqlx::query_as(&format!("SELECT {GRANT_COLUMNS} WHERE g.id = $1"))
        .bind(id)
        .fetch_optional(ex)
        .await
}

/// Grants, newest first; only `username`'s when given, only live ones
/// (active, unexpired) unless `all`.
pub async fn grants(pool: &PgPool, username: Option<&str>, all: bool) -> Result<Vec<Grant>, sqlx::Error> {
    sqlx::query_as(&format!(
        "SELECT {GRANT_COLUMNS}
          WHERE ($1::text IS NULL OR u.username = $1) AND ($2 OR (g.active AND g.expires_at > now()))
          ORDER BY g.id DESC"
    ))
    .bind(username)
    .bind(all)
    .fetch_all(pool)
    .await
}

/// Revokes a grant and every token issued under it (the access tokens'
/// trigger tells every replica); only `owner`'s when given. False when
/// unknown, not theirs or already revoked.
pub async fn revoke_grant(conn: &mut PgConnection, id: i64, owner: Option<&str>) -> Result<bool, sqlx::Error> {
    let hit = sqlx::query(
        "UPDATE oauth_grants g SET active = FALSE, revoked_at = now() FROM users u
          WHERE g.id = $1 AND g.active AND u.id = g.user_id AND ($2::text IS NULL OR u.username = $2)",
    )
    .bind(id)
    .bind(owner)
    .execute(&mut *conn)
    .await?
    .rows_affected()
        == 1;
    if hit {
        revoke_grant_tokens(conn, id).await?;
    }
    Ok(hit)
}

/// Deactivates every access token and spends every refresh token of a grant.
async fn revoke_grant_tokens(conn: &mut PgConnection, id: i64) -> Result<(), sqlx::Error> {
    sqlx::query("UPDATE mcp_tokens SET active = FALSE WHERE oauth_grant_id = $1 AND active")
        .bind(id)
        .execute(&mut *conn)
        .await?;
    sqlx::query("UPDATE oauth_refresh_tokens SET used_at = now() WHERE grant_id = $1 AND used_at IS NULL")
        .bind(id)
        .execute(&mut *conn)
        .await?;
    sqlx::query("UPDATE oauth_codes SET used_at = now() WHERE grant_id = $1 AND used_at IS NULL")
        .bind(id)
        .execute(&mut *conn)
        .await?;
    Ok(())
}

#[derive(Clone, Debug, sqlx::FromRow)]
pub struct Code {
    pub grant_id: i64,
    pub client_id: String,
    pub redirect_uri: String,
    pub code_challenge: String,
    pub resource: String,
    pub expires_at: DateTime<Utc>,
    pub used_at: Option<DateTime<Utc>>,
    pub grant_active: bool,
}

/// Locks the grant of the code or refresh token whose hash is `hash`
/// (`table`'s row), before the row itself: the order `revoke_grant` takes
/// them in (the grant's UPDATE, then its tokens), so an exchange or a
/// refresh and a revocation of its grant serialize — one sees the other's
/// result — and never deadlock. None: no such row.
async fn lock_grant_of(conn: &mut PgConnection, table: Table, hash: &str) -> Result<Option<i64>, sqlx::Error> {
    let q = match table {
        Table::Codes => "SELECT grant_id FROM oauth_codes WHERE code_hash = $1",
        Table::Refresh => "SELECT grant_id FROM oauth_refresh_tokens WHERE token_hash = $1",
    };
    let Some(grant): Option<i64> = sqlx::query_scalar(q).bind(hash).fetch_optional(&mut *conn).await? else {
        return Ok(None);
    };
    sqlx::query("SELECT 1 FROM oauth_grants WHERE id = $1 FOR UPDATE")
        .bind(grant)
        .execute(&mut *conn)
        .await?;
    Ok(Some(grant))
}

#[derive(Clone, Copy)]
enum Table {
    Codes,
    Refresh,
}

pub async fn insert_code(
    conn: &mut PgConnection,
    code_hash: &str,
    grant_id: i64,
    redirect_uri: &str,
    code_challenge: &str,
    resource: &str,
    expires_at: DateTime<Utc>,
) -> Result<(), sqlx::Error> {
    sqlx::query(
        "INSERT INTO oauth_codes (code_hash, grant_id, redirect_uri, code_challenge, resource, expires_at)
         VALUES ($1, $2, $3, $4, $5, $6)",
    )
    .bind(code_hash)
    .bind(grant_id)
    .bind(redirect_uri)
    .bind(code_challenge)
    .bind(resource)
    .bind(expires_at)
    .execute(conn)
    .await
    .map(|_| ())
}

/// A code, locked for the exchange (concurrent exchanges of one code queue
/// here: exactly one sees it unused).
pub async fn lock_code(conn: &mut PgConnection, code_hash: &str) -> Result<Option<Code>, sqlx::Error> {
    if lock_grant_of(&mut *conn, Table::Codes, code_hash).await?.is_none() {
        return Ok(None);
    }
    sqlx::query_as(
        "SELECT c.grant_id, g.client_id, c.redirect_uri, c.code_challenge, c.resource, c.expires_at, c.used_at,
                g.active AS grant_active
           FROM oauth_codes c JOIN oauth_grants g ON g.id = c.grant_id
          WHERE c.code_hash = $1 FOR UPDATE OF c",
    )
    .bind(code_hash)
    .fetch_optional(conn)
    .await
}

pub async fn spend_code(conn: &mut PgConnection, code_hash: &str) -> Result<(), sqlx::Error> {
    sqlx::query("UPDATE oauth_codes SET used_at = now() WHERE code_hash = $1")
        .bind(code_hash)
        .execute(conn)
        .await
        .map(|_| ())
}

/// Revokes a grant whatever its state (reuse detection): its tokens too.
pub async fn revoke_grant_for_reuse(conn: &mut PgConnection, id: i64) -> Result<(), sqlx::Error> {
    sqlx::query("UPDATE oauth_grants SET active = FALSE, revoked_at = COALESCE(revoked_at, now()) WHERE id = $1")
        .bind(id)
        .execute(&mut *conn)
        .await?;
    revoke_grant_tokens(conn, id).await
}

#[derive(Clone, Debug, sqlx::FromRow)]
pub struct Refresh {
    pub grant_id: i64,
    pub client_id: String,
    pub used_at: Option<DateTime<Utc>>,
    pub grant_active: bool,
    pub grant_expires_at: DateTime<Utc>,
}

pub async fn insert_refresh(conn: &mut PgConnection, token_hash: &str, grant_id: i64) -> Result<(), sqlx::Error> {
    sqlx::query("INSERT INTO oauth_refresh_tokens (token_hash, grant_id) VALUES ($1, $2)")
        .bind(token_hash)
        .bind(grant_id)
        .execute(conn)
        .await
        .map(|_| ())
}

/// A refresh token with its grant's state, locked for rotation.
pub async fn lock_refresh(conn: &mut PgConnection, token_hash: &str) -> Result<Option<Refresh>, sqlx::Error> {
    if lock_grant_of(&mut *conn, Table::Refresh, token_hash).await?.is_none() {
        return Ok(None);
    }
    sqlx::query_as(
        "SELECT r.grant_id, g.client_id, r.used_at, g.active AS grant_active, g.expires_at AS grant_expires_at
           FROM oauth_refresh_tokens r JOIN oauth_grants g ON g.id = r.grant_id
          WHERE r.token_hash = $1 FOR UPDATE OF r",
    )
    .bind(token_hash)
    .fetch_optional(conn)
    .await
}

pub async fn spend_refresh(conn: &mut PgConnection, token_hash: &str) -> Result<(), sqlx::Error> {
    sqlx::query("UPDATE oauth_refresh_tokens SET used_at = now() WHERE token_hash = $1")
        .bind(token_hash)
        .execute(conn)
        .await
        .map(|_| ())
}

/// Deactivates a grant's live access tokens (a refresh replaces them).
pub async fn retire_access_tokens(conn: &mut PgConnection, grant_id: i64) -> Result<(), sqlx::Error> {
    sqlx::query("UPDATE mcp_tokens SET active = FALSE WHERE oauth_grant_id = $1 AND active")
        .bind(grant_id)
        .execute(conn)
        .await
        .map(|_| ())
}

/// An access token to issue under a grant (`insert_access_token`).
pub struct AccessToken<'a> {
    pub user_id: i64,
    pub name: &'a str,
    pub token_hash: &'a str,
    pub libraries: &'a [String],
    pub tools: Option<&'a [String]>,
    pub expires_at: DateTime<Utc>,
    pub grant_id: i64,
}

/// An access token issued under a grant: an `mcp_tokens` row like any other,
/// with its expiry and the grant.
pub async fn insert_access_token(conn: &mut PgConnection, t: &AccessToken<'_>) -> Result<i64, sqlx::Error> {
    let AccessToken {
        user_id,
        name,
        token_hash,
        libraries,
        tools,
        expires_at,
        grant_id,
    } = *t;
    sqlx::query_scalar(
        "INSERT INTO mcp_tokens (user_id, name, token_hash, allowed_libraries, allowed_tools, expires_at, oauth_grant_id)
         VALUES ($1, $2, $3, $4, $5, $6, $7) RETURNING id",
    )
    .bind(user_id)
    .bind(name)
    .bind(token_hash)
    .bind(Json(libraries))
    .bind(tools)
    .bind(expires_at)
    .bind(grant_id)
    .fetch_one(conn)
    .await
}

/// The grant and client of an access token (by hash), when it was issued
/// by the authorization server.
pub async fn access_token_grant(
    conn: &mut PgConnection,
    token_hash: &str,
) -> Result<Option<(i64, i64, String)>, sqlx::Error> {
    sqlx::query_as(
        "SELECT t.id, g.id, g.client_id FROM mcp_tokens t JOIN oauth_grants g ON g.id = t.oauth_grant_id
          WHERE t.token_hash = $1",
    )
    .bind(token_hash)
    .fetch_optional(conn)
    .await
}

pub async fn deactivate_token(conn: &mut PgConnection, id: i64) -> Result<(), sqlx::Error> {
    sqlx::query("UPDATE mcp_tokens SET active = FALSE WHERE id = $1 AND active")
        .bind(id)
        .execute(conn)
        .await
        .map(|_| ())
}

/// Forgets expired pending requests, and codes and refresh tokens past use.
pub async fn sweep(pool: &PgPool) -> Result<u64, sqlx::Error> {
    let mut n = sqlx::query("DELETE FROM oauth_requests WHERE expires_at < now()")
        .execute(pool)
        .await?
        .rows_affected();
    n += sqlx::query("DELETE FROM oauth_codes WHERE expires_at < now() - interval '1 day'")
        .execute(pool)
        .await?
        .rows_affected();
    Ok(n)
}
