MATCH (l:Library)
RETURN count(l) AS n
