-- Issue 23: every audit event says through which surface the change came
-- (rest, mcp, console, cli), and the console's audit page stays fast when
-- filtered by actor or surface at a million rows (the action filter has
-- audit_events_action_idx). Older rows get the surface their actor implies,
-- the rule `store::pg::surface_of` applies to new ones.
ALTER TABLE audit_events ADD COLUMN surface TEXT;
UPDATE audit_events SET surface = CASE
    WHEN actor = 'cli' THEN 'cli'
    WHEN actor LIKE 'admin:%' THEN 'console'
    WHEN actor LIKE 'mcp:%' THEN 'mcp'
    ELSE 'rest' END;
ALTER TABLE audit_events ALTER COLUMN surface SET NOT NULL;
CREATE INDEX audit_events_actor_idx ON audit_events (actor, at);
CREATE INDEX audit_events_surface_idx ON audit_events (surface, at);
