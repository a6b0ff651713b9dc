MATCH (l:Library {uid: $uid})
WHERE l.workspace_id IS NULL AND l.deleting IS NULL
SET l.name = $name, l.description = $description
RETURN l.uid AS uid
