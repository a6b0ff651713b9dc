MATCH (c:Chunk {item_uid: $item_uid})
DETACH DELETE c
