MATCH (c:Chunk)
WHERE c.uid > $after AND (c.analysis IS NULL OR c.analysis < $analysis)
RETURN c.uid AS uid, c.library_uid AS library_uid,
       coalesce(c.item_title, '') AS item_title, coalesce(c.text, '') AS text
ORDER BY uid
LIMIT $limit
