MERGE (i:Item {uid: $uid})
SET i.library_uid = $library_uid, i.collection_uid = $collection_uid, i.title = $title,
    i.source_uri = $source_uri, i.mime_type = $mime_type, i.content_sha256 = $content_sha256,
    i.chunk_count = $chunk_count, i.updated_at = $now
WITH i
MATCH (old:Chunk {item_uid: $uid})
DETACH DELETE old
