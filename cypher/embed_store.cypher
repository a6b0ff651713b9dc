MATCH (l:Library {uid: $library_uid})
SET l.vectors = coalesce(l.vectors, 0) + 1
WITH l
UNWIND $rows AS r
MATCH (c:Chunk {uid: r.uid})
WHERE c.pending_lib = $library_uid AND c.text = r.text AND coalesce(c.item_title, '') = r.title
SET c.vec = r.vec, c.vec_model = $model, c.vec_seq = l.vectors
REMOVE c.pending_lib, c.vector
RETURN count(c) AS n, collect(DISTINCT c.item_uid) AS items
