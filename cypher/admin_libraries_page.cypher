MATCH (l:Library)
WHERE l.uid > $after
WITH l ORDER BY l.uid LIMIT $limit
OPTIONAL MATCH (c:Collection {library_uid: l.uid})
WITH l, count(c) AS collection_count
OPTIONAL MATCH (i:Item {library_uid: l.uid})
RETURN l.uid AS uid, l.name AS name, l.description AS description, l.workspace_id AS workspace_id,
       l.deleting AS deleting, collection_count, count(i) AS item_count,
       sum(coalesce(i.chunk_count, 0)) AS chunk_count
ORDER BY uid
