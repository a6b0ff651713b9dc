CALL db.index.fulltext.queryNodes($index, $lucene) YIELD node
WITH node
WHERE node.library_uid IN $libs
  AND ($collection_uid IS NULL OR node.collection_uid = $collection_uid)
WITH node, '  ' + replace(coalesce(node.scoped, ''), ' ', '  ') + '  ' AS s,
     $keys[[i IN range(0, size($libs) - 1) WHERE $libs[i] = node.library_uid][0]] AS k
RETURN node.uid AS chunk_uid, node.library_uid AS library_uid, coalesce(node.dl, 0) AS dl,
       [w IN $words | size(split(s, ' ' + k + '_' + w + ' ')) - 1] AS tf,
       [w IN $words | size(split(s, ' t' + substring(k, 1) + '_' + w + ' ')) - 1] AS tf_title
LIMIT $cap
