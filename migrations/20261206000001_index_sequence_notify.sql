-- Issue 52: every bump of a library's index sequence is announced on
-- `mnemosyne_index` as `<seq>:<library_uid>`, delivered when its transaction
-- commits and in commit order with the auth channel's messages. A replica
-- whose LISTEN connection is trusted (it hears its own heartbeat) keeps the
-- sequences it heard and searches without reading them per search; a write
-- waits, before it is acknowledged, for a fence every live replica
-- acknowledges after applying what came before it (auth::cache::fence).
CREATE FUNCTION index_sequence_notify() RETURNS trigger AS $$
BEGIN
    PERFORM pg_notify('mnemosyne_index', NEW.seq::text || ':' || NEW.library_uid);
    RETURN NULL;
END;
$$ LANGUAGE plpgsql;

CREATE TRIGGER index_sequences_notify
    AFTER INSERT OR UPDATE ON index_sequences
    FOR EACH ROW EXECUTE FUNCTION index_sequence_notify();
