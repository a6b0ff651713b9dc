MATCH (c:Chunk)
WHERE c.uid IN $uids AND c.library_uid IN $libs
OPTIONAL MATCH (i:Item {uid: c.item_uid})
OPTIONAL MATCH (l:Library {uid: c.library_uid})
RETURN c.uid AS chunk_uid, c.item_uid AS item_uid, c.item_title AS item_title,
       c.collection_uid AS collection_uid, c.library_uid AS library_uid,
       c.ordinal AS ordinal, c.text AS text, l.name AS library_name,
       i.source_uri AS source_uri, i.mime_type AS mime_type, i.updated_at AS updated_at
