-- Writes whose index record must not be lost (issue 54). Before a write or a
-- delete touches the graph, it records here what it is about to change (the
-- library, and the item or NULL for the whole library); after its graph
-- transaction committed, one statement records its change in index_changes
-- and removes its intent. When that statement fails (Postgres restarted
-- between the two, a timeout), the intent stays: the client's retry of the
-- delete (which then finds nothing in the graph) records it at once, and
-- every replica's sweep records whatever intents are older than a few
-- seconds until they expire. Recording a change that did not happen is
-- harmless (indexes re-read the item from the graph); losing one left a
-- deleted item searchable on every replica.
CREATE TABLE index_intents (
    id          BIGSERIAL PRIMARY KEY,
    library_uid VARCHAR(200) NOT NULL,
    -- NULL: the whole library (a library delete).
    item_uid    VARCHAR(200),
    at          TIMESTAMPTZ NOT NULL DEFAULT now()
);
CREATE INDEX index_intents_at_idx ON index_intents (at);
CREATE INDEX index_intents_item_idx ON index_intents (item_uid) WHERE item_uid IS NOT NULL;
CREATE INDEX index_intents_library_idx ON index_intents (library_uid) WHERE item_uid IS NULL;
