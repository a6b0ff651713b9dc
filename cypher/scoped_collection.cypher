MATCH (c:Collection {uid: $uid})
WHERE c.library_uid IN $libs
RETURN c.uid AS uid, c.library_uid AS library_uid
