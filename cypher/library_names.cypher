MATCH (l:Library)
WHERE l.uid IN $uids
RETURN l.uid AS uid, l.name AS name
