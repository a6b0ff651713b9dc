-- Mnemosyne relational store (DESIGN §2). Library uids refer to graph nodes, so
-- they are plain strings here (spec §4.1: no M2M is possible across stores).

CREATE TABLE users (
    id            BIGSERIAL PRIMARY KEY,
    username      VARCHAR(150) NOT NULL UNIQUE CHECK (length(username) > 0),
    -- argon2 PHC string; NULL = cannot log in with a password
    password_hash TEXT,
    is_service    BOOLEAN NOT NULL DEFAULT FALSE,
    active        BOOLEAN NOT NULL DEFAULT TRUE,
    created_at    TIMESTAMPTZ NOT NULL DEFAULT now()
);

CREATE TABLE mcp_tokens (
    id                BIGSERIAL PRIMARY KEY,
    user_id           BIGINT NOT NULL REFERENCES users(id) ON DELETE CASCADE,
    name              VARCHAR(200) NOT NULL DEFAULT '',
    -- hex SHA-256 of the plaintext; the plaintext is never stored
    token_hash        CHAR(64) NOT NULL UNIQUE,
    allowed_libraries JSONB NOT NULL DEFAULT '[]'::jsonb
                      CHECK (jsonb_typeof(allowed_libraries) = 'array'),
    active            BOOLEAN NOT NULL DEFAULT TRUE,
    expires_at        TIMESTAMPTZ,
    last_used_at      TIMESTAMPTZ,
    created_at        TIMESTAMPTZ NOT NULL DEFAULT now()
);
CREATE INDEX mcp_tokens_user_idx ON mcp_tokens (user_id);

CREATE TABLE mcp_signing_keys (
    kid        VARCHAR(64) PRIMARY KEY,
    secret_hex CHAR(64) NOT NULL,
    created_at TIMESTAMPTZ NOT NULL DEFAULT now(),
    retired_at TIMESTAMPTZ
);

CREATE TABLE teams (
    id         UUID PRIMARY KEY,
    name       VARCHAR(200) NOT NULL CHECK (length(name) > 0),
    active     BOOLEAN NOT NULL DEFAULT TRUE,
    active_jti UUID,
    created_at TIMESTAMPTZ NOT NULL DEFAULT now(),
    updated_at TIMESTAMPTZ NOT NULL DEFAULT now()
);

CREATE TABLE team_workspace_assignments (
    id           BIGSERIAL PRIMARY KEY,
    team_id      UUID NOT NULL REFERENCES teams(id) ON DELETE CASCADE,
    workspace_id VARCHAR(64) NOT NULL CHECK (length(workspace_id) > 0),
    -- order of the last PUT; resolution keeps it (DESIGN §3)
    position     INTEGER NOT NULL,
    created_at   TIMESTAMPTZ NOT NULL DEFAULT now(),
    UNIQUE (team_id, workspace_id)
);

CREATE TABLE library_memberships (
    id          BIGSERIAL PRIMARY KEY,
    user_id     BIGINT NOT NULL REFERENCES users(id) ON DELETE CASCADE,
    library_uid VARCHAR(64) NOT NULL,
    role        VARCHAR(16) NOT NULL CHECK (role IN ('owner', 'manager', 'reader')),
    created_at  TIMESTAMPTZ NOT NULL DEFAULT now(),
    UNIQUE (user_id, library_uid, role)
);
CREATE INDEX library_memberships_library_idx ON library_memberships (library_uid);

-- Per-turn JWT replay protection (DESIGN §3): a jti is bound to the MCP session
-- where it was first seen; session_id NULL = consumed by a sessionless request.
CREATE TABLE per_turn_jti_uses (
    jti         VARCHAR(255) PRIMARY KEY,
    session_id  VARCHAR(255),
    first_seen  TIMESTAMPTZ NOT NULL DEFAULT now(),
    expires_at  TIMESTAMPTZ NOT NULL
);
CREATE INDEX per_turn_jti_uses_expires_idx ON per_turn_jti_uses (expires_at);

CREATE TABLE audit_events (
    id         BIGSERIAL PRIMARY KEY,
    at         TIMESTAMPTZ NOT NULL DEFAULT now(),
    actor      VARCHAR(150) NOT NULL,
    action     VARCHAR(64) NOT NULL,
    target     VARCHAR(255),
    detail     JSONB NOT NULL DEFAULT '{}'::jsonb
);
CREATE INDEX audit_events_at_idx ON audit_events (at);

-- Every change to an auth-relevant row is announced on `mnemosyne_auth`, whoever
-- made it (REST, CLI, or SQL by hand), so every replica drops the cached entry
-- before its next request. Payload: '<table>:<key>' (never a secret).
CREATE FUNCTION mnemosyne_notify_auth() RETURNS trigger AS $$
DECLARE
    k TEXT;
    r RECORD;
BEGIN
    IF TG_OP = 'DELETE' THEN r := OLD; ELSE r := NEW; END IF;
    IF TG_TABLE_NAME = 'teams' THEN
        k := r.id::text;
    ELSIF TG_TABLE_NAME = 'team_workspace_assignments' THEN
        k := r.team_id::text;
    ELSE
        k := '*';
    END IF;
    PERFORM pg_notify('mnemosyne_auth', TG_TABLE_NAME || ':' || k);
    RETURN NULL;
END;
$$ LANGUAGE plpgsql;

CREATE TRIGGER teams_notify AFTER INSERT OR UPDATE OR DELETE ON teams
    FOR EACH ROW EXECUTE FUNCTION mnemosyne_notify_auth();
CREATE TRIGGER team_workspace_assignments_notify AFTER INSERT OR UPDATE OR DELETE ON team_workspace_assignments
    FOR EACH ROW EXECUTE FUNCTION mnemosyne_notify_auth();
-- last_used_at bookkeeping is not an auth change: it must not empty the caches.
CREATE TRIGGER mcp_tokens_notify_update AFTER UPDATE ON mcp_tokens
    FOR EACH ROW WHEN (OLD.active IS DISTINCT FROM NEW.active
                       OR OLD.allowed_libraries IS DISTINCT FROM NEW.allowed_libraries
                       OR OLD.expires_at IS DISTINCT FROM NEW.expires_at
                       OR OLD.user_id IS DISTINCT FROM NEW.user_id
                       OR OLD.token_hash IS DISTINCT FROM NEW.token_hash)
    EXECUTE FUNCTION mnemosyne_notify_auth();
CREATE TRIGGER mcp_tokens_notify_delete AFTER DELETE ON mcp_tokens
    FOR EACH ROW EXECUTE FUNCTION mnemosyne_notify_auth();
CREATE TRIGGER users_notify AFTER UPDATE OR DELETE ON users
    FOR EACH ROW EXECUTE FUNCTION mnemosyne_notify_auth();
CREATE TRIGGER mcp_signing_keys_notify AFTER INSERT OR UPDATE OR DELETE ON mcp_signing_keys
    FOR EACH ROW EXECUTE FUNCTION mnemosyne_notify_auth();
