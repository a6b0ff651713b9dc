MATCH (l:Library)
RETURN l.uid AS uid, l.name AS name
ORDER BY uid
