MATCH (c:Chunk)
WHERE c.pending_lib IS NOT NULL AND c.pending_lib STARTS WITH $prefix
RETURN c.pending_lib AS library_uid, count(c) AS n
