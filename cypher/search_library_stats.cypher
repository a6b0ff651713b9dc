MATCH (c:Chunk)
WHERE c.library_uid = $library_uid
RETURN count(c) AS n, sum(coalesce(c.dl, 0)) AS tokens
