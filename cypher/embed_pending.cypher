MATCH (c:Chunk {pending_lib: $library_uid})
WHERE NOT c.uid IN $skip
RETURN c.uid AS uid, coalesce(c.item_title, '') AS title, c.text AS text,
       c.vec_model AS model, c.vec AS vec
LIMIT $n
