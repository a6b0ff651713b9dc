-- The console writes `admin:<username>` as the audit actor (up to 156
-- characters for a 150-character username): the actor is text. The CSRF token
-- is text too (a CHAR(64) padded the 43-character token with spaces).
ALTER TABLE audit_events ALTER COLUMN actor TYPE TEXT;
ALTER TABLE admin_sessions ALTER COLUMN csrf_token TYPE TEXT;
