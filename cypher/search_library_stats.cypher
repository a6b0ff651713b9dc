MATCH (c:Chunk)
WHERE c.library_uid IN $libs
RETURN c.library_uid AS uid, count(c) AS n, sum(coalesce(c.dl, 0)) AS tokens
