-- Issue 54: keys every replica shares, made once by the first replica that
-- needs one (INSERT … ON CONFLICT DO NOTHING, then read). `console_cookie`
-- signs the console's session cookies, so a cookie the console did not make
-- is refused without a session lookup (and a flood of made-up cookies needs
-- no per-address throttle that would refuse valid sessions from that address).
CREATE TABLE server_secrets (
    name   VARCHAR(64) PRIMARY KEY,
    secret BYTEA NOT NULL CHECK (length(secret) >= 32)
);
