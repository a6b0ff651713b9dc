MATCH (c:Chunk)
WHERE c.pending_lib IS NULL AND c.library_uid STARTS WITH $prefix
  AND coalesce(c.vec_model, '') <> $model AND coalesce(c.vec_failed, '') <> $model
WITH c LIMIT $n
SET c.pending_lib = c.library_uid
RETURN count(c) AS n
