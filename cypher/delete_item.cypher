MATCH (i:Item {uid: $uid})
DETACH DELETE i
