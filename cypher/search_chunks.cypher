MATCH (c:Chunk)
WHERE c.uid IN $uids AND c.library_uid IN $libs
OPTIONAL MATCH (c)-[:OF_ITEM]->(i:Item)
RETURN c.uid AS chunk_uid, c.item_uid AS item_uid, c.item_title AS item_title,
       c.collection_uid AS collection_uid, c.library_uid AS library_uid,
       c.ordinal AS ordinal, c.text AS text,
       i.source_uri AS source_uri, i.mime_type AS mime_type, i.updated_at AS updated_at
