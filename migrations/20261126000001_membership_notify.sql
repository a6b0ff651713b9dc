-- An opaque token reads only the libraries on which its user still holds a
-- membership (resolution intersects allowed_libraries with them), so a
-- membership change is an auth change: announce it like the others.
CREATE TRIGGER library_memberships_notify AFTER INSERT OR UPDATE OR DELETE ON library_memberships
    FOR EACH ROW EXECUTE FUNCTION mnemosyne_notify_auth();

-- Unknown opaque tokens are remembered (a bounded negative cache, against
-- floods of made-up tokens), so creating a token must announce itself too.
CREATE TRIGGER mcp_tokens_notify_insert AFTER INSERT ON mcp_tokens
    FOR EACH ROW EXECUTE FUNCTION mnemosyne_notify_auth();
