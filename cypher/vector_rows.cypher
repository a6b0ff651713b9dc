MATCH (c:Chunk)
WHERE c.library_uid = $library_uid AND c.vec_model = $model AND c.vec_seq IS NOT NULL
RETURN c.uid AS uid, c.collection_uid AS collection_uid, c.vec_seq AS seq,
       CASE WHEN c.vec_seq > $since THEN c.vec ELSE null END AS vec,
       CASE WHEN c.vec_seq > $since AND c.vec IS NULL THEN c.vector ELSE null END AS vector
