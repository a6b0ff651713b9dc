MATCH (l:Library)
WHERE l.uid IN $libs
RETURN l.uid AS uid, coalesce(l.vectors, 0) AS vectors
