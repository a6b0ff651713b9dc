MERGE (l:Library {uid: $uid})
ON CREATE SET l.workspace_id = $workspace_id, l.name = $name, l.description = $description,
              l.created_at = $now
RETURN l.uid AS uid, l.workspace_id AS workspace_id, l.created_at AS created_at
