MATCH (l:Library)
WHERE l.workspace_id IN $workspace_ids
RETURN l.workspace_id AS workspace_id, l.uid AS uid
ORDER BY uid
