MATCH (i:Item {uid: $uid})
WHERE i.library_uid IS NOT NULL
RETURN i.library_uid AS library_uid, i.collection_uid AS collection_uid, i.content_sha256 AS content_sha256,
       i.chunk_count AS chunk_count, i.title AS title, i.source_uri AS source_uri, i.mime_type AS mime_type
