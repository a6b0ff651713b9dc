-- Issue 53 (spec v2 scope): libraries granted to a team directly, beside its
-- workspaces. A team JWT resolves to its workspaces' libraries in workspace
-- order, then these in their order (DESIGN §3); an unknown or deleted
-- library resolves to nothing, as an unknown workspace does.
CREATE TABLE team_library_grants (
    id          BIGSERIAL PRIMARY KEY,
    team_id     UUID NOT NULL REFERENCES teams(id) ON DELETE CASCADE,
    library_uid VARCHAR(64) NOT NULL CHECK (length(library_uid) > 0),
    -- order of the last PUT; resolution keeps it
    position    INTEGER NOT NULL,
    created_at  TIMESTAMPTZ NOT NULL DEFAULT now(),
    UNIQUE (team_id, library_uid)
);
-- A library delete removes its grants (`remove_grants`).
CREATE INDEX team_library_grants_library_idx ON team_library_grants (library_uid);

-- The grants announce themselves per team, like the workspace assignments
-- (`team_library_grants:<team id>`), on the same channel.
CREATE OR REPLACE FUNCTION mnemosyne_notify_auth() RETURNS trigger AS $$
DECLARE
    k TEXT;
    r RECORD;
BEGIN
    IF TG_OP = 'DELETE' THEN r := OLD; ELSE r := NEW; END IF;
    IF TG_TABLE_NAME = 'teams' THEN
        k := r.id::text;
    ELSIF TG_TABLE_NAME IN ('team_workspace_assignments', 'team_library_grants') THEN
        k := r.team_id::text;
    ELSE
        k := '*';
    END IF;
    PERFORM pg_notify('mnemosyne_auth', TG_TABLE_NAME || ':' || k);
    RETURN NULL;
END;
$$ LANGUAGE plpgsql;

CREATE TRIGGER team_library_grants_notify AFTER INSERT OR UPDATE OR DELETE ON team_library_grants
    FOR EACH ROW EXECUTE FUNCTION mnemosyne_notify_auth();
