MATCH (l:Library {workspace_id: $workspace_id})
OPTIONAL MATCH (c:Collection {library_uid: l.uid})
WITH l, count(c) AS collection_count
OPTIONAL MATCH (i:Item {library_uid: l.uid})
WITH l, collection_count, count(i) AS item_count
OPTIONAL MATCH (ch:Chunk {library_uid: l.uid})
RETURN l.uid AS uid, l.name AS name, collection_count, item_count, count(ch) AS chunk_count
ORDER BY uid
