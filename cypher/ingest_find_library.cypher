MATCH (l:Library {uid: $uid})
RETURN l.uid AS uid, l.workspace_id AS workspace_id, l.fences AS fences, l.language AS language
