CREATE CONSTRAINT library_uid IF NOT EXISTS FOR (n:Library) REQUIRE n.uid IS UNIQUE;
CREATE CONSTRAINT collection_uid IF NOT EXISTS FOR (n:Collection) REQUIRE n.uid IS UNIQUE;
CREATE CONSTRAINT item_uid IF NOT EXISTS FOR (n:Item) REQUIRE n.uid IS UNIQUE;
CREATE CONSTRAINT chunk_uid IF NOT EXISTS FOR (n:Chunk) REQUIRE n.uid IS UNIQUE;
CREATE CONSTRAINT library_fence_uid IF NOT EXISTS FOR (n:LibraryFence) REQUIRE n.uid IS UNIQUE;
CREATE INDEX library_workspace IF NOT EXISTS FOR (n:Library) ON (n.workspace_id);
CREATE INDEX collection_library IF NOT EXISTS FOR (n:Collection) ON (n.library_uid);
CREATE INDEX item_library IF NOT EXISTS FOR (n:Item) ON (n.library_uid);
CREATE INDEX item_collection IF NOT EXISTS FOR (n:Item) ON (n.collection_uid);
CREATE INDEX chunk_library IF NOT EXISTS FOR (n:Chunk) ON (n.library_uid);
CREATE INDEX chunk_item IF NOT EXISTS FOR (n:Chunk) ON (n.item_uid);
CREATE INDEX chunk_pending IF NOT EXISTS FOR (n:Chunk) ON (n.pending_lib)
