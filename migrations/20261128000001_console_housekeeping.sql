-- Console storage is bounded (issue 19, row 7): a timer on every replica
-- deletes form submissions older than a form's lifetime and sessions past
-- their idle or absolute expiry; these indexes keep those deletes from
-- scanning the tables.
CREATE INDEX IF NOT EXISTS admin_form_submissions_at_idx ON admin_form_submissions (at);
CREATE INDEX IF NOT EXISTS admin_sessions_last_seen_idx ON admin_sessions (last_seen_at);
