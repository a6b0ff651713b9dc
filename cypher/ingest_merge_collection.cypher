MATCH (l:Library {uid: $library_uid})
MERGE (c:Collection {uid: $uid})
ON CREATE SET c.library_uid = $library_uid, c.name = $name
MERGE (c)-[:IN_LIBRARY]->(l)
RETURN c.uid AS uid
