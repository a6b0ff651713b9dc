-- Issue 53 part 2: per-library read activity, per hour, by reader and tool,
-- added to in batches by every replica (like usage_hourly). Query text is
-- not kept unless the operator asks (MNEMOSYNE_ACTIVITY_QUERY): `query` is
-- then a SHA-256 hex or the text, else ''.
CREATE TABLE library_activity_hourly (
    hour        TIMESTAMPTZ NOT NULL,
    library_uid VARCHAR(64) NOT NULL,
    -- token, team, per_turn
    reader_kind VARCHAR(16) NOT NULL,
    -- token:<id>, team:<uuid>, or a per-turn JWT's sub (never a secret)
    reader      VARCHAR(200) NOT NULL,
    -- a token's user (no foreign key: a removed user's reads stay on record)
    user_id     BIGINT,
    tool        VARCHAR(64) NOT NULL,
    query       VARCHAR(1000) NOT NULL DEFAULT '',
    calls       BIGINT NOT NULL CHECK (calls >= 0),
    results     BIGINT NOT NULL CHECK (results >= 0),
    PRIMARY KEY (library_uid, hour, reader_kind, reader, tool, query)
);
-- Retention sweeps by age.
CREATE INDEX library_activity_hourly_hour_idx ON library_activity_hourly (hour);

-- A library's write events, shown beside its read activity: its own events
-- (created, renamed, deleted, memberships) name it as the target, its items'
-- events in `detail.library_uid`. One index range read per library page.
CREATE INDEX audit_events_library_idx ON audit_events ((COALESCE(detail->>'library_uid', target)), at);
