MATCH (i:Item {uid: $uid})
SET i.title = $title, i.source_uri = $source_uri, i.mime_type = $mime_type, i.updated_at = $now
WITH i
MATCH (c:Chunk {item_uid: $uid})
SET c.item_title = $title
