MATCH (i:Item)
WHERE i.uid IN $items AND i.library_uid = $lib
RETURN i.uid AS uid, i.source_uri AS source_uri, i.mime_type AS mime_type, i.updated_at AS updated_at
