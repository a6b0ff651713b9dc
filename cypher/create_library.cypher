CREATE (l:Library {uid: $uid, name: $name, description: $description, language: $language, created_at: $now})
RETURN l.uid AS uid
