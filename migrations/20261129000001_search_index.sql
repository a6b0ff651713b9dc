-- The per-library search index's change sequence (issue 30). Every write that
-- changes what a library's search finds (an item written or deleted, the
-- library deleted) is recorded here after its graph transaction committed and
-- before the write is acknowledged: a per-library counter bumped under its
-- row lock (so a library's sequence numbers commit in order) and one change
-- row per bump. Each replica's index compares the counter with the sequence
-- it applied (one primary-key read per search) and catches up by reading the
-- change rows after it, then the changed items from the graph.
CREATE TABLE index_sequences (
    library_uid VARCHAR(200) PRIMARY KEY,
    seq         BIGINT NOT NULL CHECK (seq > 0)
);

CREATE TABLE index_changes (
    library_uid VARCHAR(200) NOT NULL,
    seq         BIGINT NOT NULL,
    -- NULL: the whole library changed (deleted): rebuild it from the graph.
    item_uid    VARCHAR(200),
    at          TIMESTAMPTZ NOT NULL DEFAULT now(),
    PRIMARY KEY (library_uid, seq)
);
CREATE INDEX index_changes_at_idx ON index_changes (at);

-- This database's identity: an index built against another database (a
-- restored or re-created one, another deployment's) is rebuilt, never
-- trusted for its sequence numbers.
CREATE TABLE index_epoch (
    id  UUID PRIMARY KEY DEFAULT gen_random_uuid(),
    one BOOLEAN NOT NULL DEFAULT true UNIQUE CHECK (one)
);
INSERT INTO index_epoch DEFAULT VALUES;
