CREATE (l:Library {uid: $uid, name: $name, description: $description, created_at: $now})
RETURN l.uid AS uid
