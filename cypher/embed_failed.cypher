UNWIND $uids AS u
MATCH (c:Chunk {uid: u})
WHERE c.pending_lib IS NOT NULL
SET c.vec_failed = $model
REMOVE c.pending_lib
RETURN count(c) AS n
