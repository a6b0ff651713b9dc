MATCH (c:Collection {uid: $uid})
RETURN c.uid AS uid, c.library_uid AS library_uid
