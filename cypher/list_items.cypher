MATCH (i:Item)
WHERE i.library_uid IN $libs
  AND ($collection_uid IS NULL OR i.collection_uid = $collection_uid)
  AND i.uid > $after
RETURN i.uid AS uid, i.title AS title, i.source_uri AS source_uri, i.mime_type AS mime_type,
       i.chunk_count AS chunk_count, i.updated_at AS updated_at, i.collection_uid AS collection_uid,
       i.library_uid AS library_uid
ORDER BY uid
LIMIT $limit
