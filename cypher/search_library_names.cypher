MATCH (l:Library)
WHERE l.uid IN $libs
RETURN l.uid AS uid, l.name AS name
