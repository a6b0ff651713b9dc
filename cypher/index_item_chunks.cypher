MATCH (c:Chunk)
WHERE c.item_uid IN $items AND c.library_uid = $lib
RETURN c.uid AS uid, c.item_uid AS item_uid, c.item_title AS item_title,
       c.collection_uid AS collection_uid, c.ordinal AS ordinal, c.text AS text,
       c.scoped AS scoped, coalesce(c.dl, 0) AS dl,
       CASE WHEN c.vec_model = $model THEN c.vec ELSE null END AS vec,
       CASE WHEN c.vec_model = $model AND c.vec IS NULL THEN c.vector ELSE null END AS vector
