MATCH (l:Library)
WHERE l.uid IN $uids AND l.deleting IS NULL
RETURN l.uid AS uid
