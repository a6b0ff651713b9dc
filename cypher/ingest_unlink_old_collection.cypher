MATCH (i:Item {uid: $uid})-[r:IN_COLLECTION]->(old:Collection)
WHERE old.uid <> $collection_uid
DELETE r
