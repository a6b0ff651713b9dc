MATCH (c:Chunk)
WHERE c.uid IN $uids AND c.library_uid IN $libs
RETURN c.uid AS chunk_uid, c.item_uid AS item_uid, c.item_title AS item_title,
       c.collection_uid AS collection_uid, c.library_uid AS library_uid,
       c.ordinal AS ordinal, c.text AS text
