MATCH (c:Chunk)
WHERE c.library_uid = $lib AND c.uid > $after
RETURN c.uid AS uid, c.item_uid AS item_uid, c.item_title AS item_title,
       c.collection_uid AS collection_uid, c.ordinal AS ordinal, c.text AS text,
       c.scoped AS scoped, coalesce(c.dl, 0) AS dl
ORDER BY c.uid
LIMIT $limit
