MATCH (i:Item {uid: $uid})
WHERE i.library_uid = $library_uid
DETACH DELETE i
