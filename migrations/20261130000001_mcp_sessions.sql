-- Legacy MCP sessions, shared by every replica (issue 31): a request may land
-- on any replica behind a plain load balancer, and the replica that does not
-- hold the session rebuilds it from this row, bound to the same credential.
-- `credential` is the owner's credential key (a token id, a team and its jti,
-- a per-turn jti: never a bearer), `user_key` the user whose tokens share the
-- per-user cap. `init_params` is the client's `initialize` parameters (the
-- negotiated revision among them), written once the handshake answered.
-- `seen_at` is refreshed by the replicas serving the session (at most every
-- quarter of the idle timeout); a row not seen for longer than the idle
-- timeout plus that period is expired everywhere.
CREATE TABLE IF NOT EXISTS mcp_sessions (
    id text PRIMARY KEY,
    credential text NOT NULL,
    user_key text,
    init_params jsonb,
    created_at timestamptz NOT NULL DEFAULT now(),
    seen_at timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX IF NOT EXISTS mcp_sessions_credential ON mcp_sessions (credential);
CREATE INDEX IF NOT EXISTS mcp_sessions_user_key ON mcp_sessions (user_key) WHERE user_key IS NOT NULL;
CREATE INDEX IF NOT EXISTS mcp_sessions_seen_at ON mcp_sessions (seen_at);
