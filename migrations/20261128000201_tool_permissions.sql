-- Tool permissions per credential (issue 24): an optional allowlist of MCP
-- tool names on opaque tokens and on teams. NULL = every tool; an empty array
-- = no tool at all. Names are checked against the server's tools when written.
ALTER TABLE mcp_tokens ADD COLUMN allowed_tools TEXT[];
ALTER TABLE teams ADD COLUMN allowed_tools TEXT[];

-- A token's allowlist is an auth change: announce it like the other columns
-- the resolver reads (the teams trigger already fires on every update).
DROP TRIGGER mcp_tokens_notify_update ON mcp_tokens;
CREATE TRIGGER mcp_tokens_notify_update AFTER UPDATE ON mcp_tokens
    FOR EACH ROW WHEN (OLD.active IS DISTINCT FROM NEW.active
                       OR OLD.allowed_libraries IS DISTINCT FROM NEW.allowed_libraries
                       OR OLD.allowed_tools IS DISTINCT FROM NEW.allowed_tools
                       OR OLD.expires_at IS DISTINCT FROM NEW.expires_at
                       OR OLD.user_id IS DISTINCT FROM NEW.user_id
                       OR OLD.token_hash IS DISTINCT FROM NEW.token_hash)
    EXECUTE FUNCTION mnemosyne_notify_auth();
