-- Per-credential rate limits (issue 24): MCP requests a minute for the whole
-- deployment, instead of MNEMOSYNE_RATE_LIMIT_PER_MINUTE. NULL = the
-- configured rate; 0 = no limit.
ALTER TABLE mcp_tokens ADD COLUMN rate_limit_per_minute INTEGER CHECK (rate_limit_per_minute >= 0);
ALTER TABLE teams ADD COLUMN rate_limit_per_minute INTEGER CHECK (rate_limit_per_minute >= 0);

-- The resolver reads it: announce a change like the other columns it reads
-- (the teams trigger already fires on every update).
DROP TRIGGER mcp_tokens_notify_update ON mcp_tokens;
CREATE TRIGGER mcp_tokens_notify_update AFTER UPDATE ON mcp_tokens
    FOR EACH ROW WHEN (OLD.active IS DISTINCT FROM NEW.active
                       OR OLD.allowed_libraries IS DISTINCT FROM NEW.allowed_libraries
                       OR OLD.allowed_tools IS DISTINCT FROM NEW.allowed_tools
                       OR OLD.rate_limit_per_minute IS DISTINCT FROM NEW.rate_limit_per_minute
                       OR OLD.expires_at IS DISTINCT FROM NEW.expires_at
                       OR OLD.user_id IS DISTINCT FROM NEW.user_id
                       OR OLD.token_hash IS DISTINCT FROM NEW.token_hash)
    EXECUTE FUNCTION mnemosyne_notify_auth();
