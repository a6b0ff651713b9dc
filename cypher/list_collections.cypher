MATCH (c:Collection)
WHERE c.library_uid IN $libs AND c.uid > $after
WITH c ORDER BY c.uid LIMIT $limit
OPTIONAL MATCH (i:Item {collection_uid: c.uid})
RETURN c.uid AS uid, c.name AS name, c.library_uid AS library_uid, count(i) AS item_count
ORDER BY uid
