-- Admin console (DESIGN §4 `/admin/…`): staff users sign in with a password;
-- their sessions live here so sign-out and disabling a user end them at once,
-- on every replica. Only the SHA-256 of the session id is stored.

ALTER TABLE users ADD COLUMN is_staff BOOLEAN NOT NULL DEFAULT FALSE;

CREATE TABLE admin_sessions (
    id_hash      CHAR(64) PRIMARY KEY,
    user_id      BIGINT NOT NULL REFERENCES users(id) ON DELETE CASCADE,
    -- synchronizer CSRF token of this session (a random value, not a credential
    -- to anything else)
    csrf_token   CHAR(64) NOT NULL,
    created_at   TIMESTAMPTZ NOT NULL DEFAULT now(),
    last_seen_at TIMESTAMPTZ NOT NULL DEFAULT now()
);
CREATE INDEX admin_sessions_user_idx ON admin_sessions (user_id);
CREATE INDEX audit_events_action_idx ON audit_events (action, at);
