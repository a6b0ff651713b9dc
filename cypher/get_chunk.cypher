MATCH (c:Chunk {uid: $uid})
WHERE c.library_uid IN $libs
MATCH (n:Chunk {item_uid: c.item_uid})
WHERE n.library_uid = c.library_uid
  AND n.ordinal >= c.ordinal - $context AND n.ordinal <= c.ordinal + $context
RETURN n.uid AS uid, n.text AS text, n.ordinal AS ordinal, n.item_uid AS item_uid,
       n.item_title AS item_title, n.collection_uid AS collection_uid, n.library_uid AS library_uid
ORDER BY ordinal
