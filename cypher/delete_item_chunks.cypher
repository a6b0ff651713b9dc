MATCH (c:Chunk {item_uid: $item_uid})
WHERE c.library_uid = $library_uid
DETACH DELETE c
