UNWIND $rows AS r
MATCH (c:Chunk {uid: r.uid})
WHERE (c.analysis IS NULL OR c.analysis < $analysis) AND coalesce(c.item_title, '') = r.item_title
SET c.scoped = r.scoped, c.dl = r.dl, c.analysis = $analysis
RETURN count(c) AS n
