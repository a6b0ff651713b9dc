-- Issue 48: the embedded OAuth 2.1 authorization server for external MCP
-- clients. Everything is here, so any replica serves any step. Codes and
-- refresh tokens are stored as the hex SHA-256 of their plaintext, like
-- `mcp_tokens.token_hash`; the plaintexts exist only in the answers.

-- Clients: registered dynamically (RFC 7591), by an operator (CLI), or
-- fetched as a Client ID Metadata Document (client_id is then its URL).
CREATE TABLE oauth_clients (
    client_id     TEXT PRIMARY KEY CHECK (length(client_id) BETWEEN 1 AND 2048),
    client_name   TEXT NOT NULL DEFAULT '',
    redirect_uris TEXT[] NOT NULL,
    source        TEXT NOT NULL CHECK (source IN ('dcr', 'cli', 'cimd')),
    -- The registration as stored (what RFC 7591 answers back).
    metadata      JSONB NOT NULL DEFAULT '{}'::jsonb,
    created_at    TIMESTAMPTZ NOT NULL DEFAULT now()
);

-- Authorization requests checked by /oauth/authorize and waiting for the
-- person's consent (the consent form names one by its random id, so the
-- approval cannot be replayed for another client, redirect or challenge).
CREATE TABLE oauth_requests (
    id_hash        CHAR(64) PRIMARY KEY,
    client_id      TEXT NOT NULL REFERENCES oauth_clients(client_id) ON DELETE CASCADE,
    redirect_uri   TEXT NOT NULL,
    code_challenge TEXT NOT NULL,
    state          TEXT,
    scope          TEXT NOT NULL DEFAULT '',
    resource       TEXT NOT NULL,
    expires_at     TIMESTAMPTZ NOT NULL
);
CREATE INDEX oauth_requests_expires_idx ON oauth_requests (expires_at);

-- What a person granted one client: the libraries and tools they picked on
-- the consent page, for a lifetime they picked. Revoking it revokes every
-- access and refresh token issued under it.
CREATE TABLE oauth_grants (
    id                BIGSERIAL PRIMARY KEY,
    client_id         TEXT NOT NULL REFERENCES oauth_clients(client_id) ON DELETE CASCADE,
    user_id           BIGINT NOT NULL REFERENCES users(id) ON DELETE CASCADE,
    allowed_libraries JSONB NOT NULL DEFAULT '[]'::jsonb
                      CHECK (jsonb_typeof(allowed_libraries) = 'array'),
    allowed_tools     TEXT[],
    active            BOOLEAN NOT NULL DEFAULT TRUE,
    expires_at        TIMESTAMPTZ NOT NULL,
    created_at        TIMESTAMPTZ NOT NULL DEFAULT now(),
    revoked_at        TIMESTAMPTZ
);
CREATE INDEX oauth_grants_user_idx ON oauth_grants (user_id);

-- Authorization codes: 60 s, single use; a second use revokes the grant.
CREATE TABLE oauth_codes (
    code_hash      CHAR(64) PRIMARY KEY,
    grant_id       BIGINT NOT NULL REFERENCES oauth_grants(id) ON DELETE CASCADE,
    redirect_uri   TEXT NOT NULL,
    code_challenge TEXT NOT NULL,
    resource       TEXT NOT NULL,
    expires_at     TIMESTAMPTZ NOT NULL,
    used_at        TIMESTAMPTZ
);
CREATE INDEX oauth_codes_grant_idx ON oauth_codes (grant_id);

-- Refresh tokens, rotated on every use; presenting a used one revokes the
-- grant (reuse detection).
CREATE TABLE oauth_refresh_tokens (
    token_hash CHAR(64) PRIMARY KEY,
    grant_id   BIGINT NOT NULL REFERENCES oauth_grants(id) ON DELETE CASCADE,
    created_at TIMESTAMPTZ NOT NULL DEFAULT now(),
    used_at    TIMESTAMPTZ
);
CREATE INDEX oauth_refresh_tokens_grant_idx ON oauth_refresh_tokens (grant_id);

-- Access tokens are opaque MCP tokens of the existing kind (same hash, same
-- resolution, same allowlist, same NOTIFY on revocation) with an expiry and
-- the grant they were issued under.
ALTER TABLE mcp_tokens ADD COLUMN oauth_grant_id BIGINT REFERENCES oauth_grants(id) ON DELETE CASCADE;
CREATE INDEX mcp_tokens_oauth_grant_idx ON mcp_tokens (oauth_grant_id) WHERE oauth_grant_id IS NOT NULL;
