MATCH (l:Library)
WHERE l.uid IN $libs
OPTIONAL MATCH (c:Collection {library_uid: l.uid})
WITH l, count(c) AS collection_count
OPTIONAL MATCH (i:Item {library_uid: l.uid})
RETURN l.uid AS uid, l.name AS name, l.description AS description,
       collection_count, count(i) AS item_count
