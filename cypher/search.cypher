CALL db.index.fulltext.queryNodes($index, $lucene) YIELD node, score
WHERE node.library_uid IN $libs
  AND ($collection_uid IS NULL OR node.collection_uid = $collection_uid)
RETURN node.uid AS chunk_uid, node.item_uid AS item_uid, node.item_title AS item_title,
       node.collection_uid AS collection_uid, node.library_uid AS library_uid,
       node.ordinal AS ordinal, score, node.text AS text
ORDER BY score DESC
LIMIT $limit
