CALL db.index.fulltext.queryNodes($index, $lucene) YIELD node
WITH node
WHERE node.library_uid IN $libs
  AND ($collection_uid IS NULL OR node.collection_uid = $collection_uid)
RETURN node.uid AS chunk_uid, node.library_uid AS library_uid, coalesce(node.dl, 0) AS dl, node.scoped AS scoped
LIMIT $cap
