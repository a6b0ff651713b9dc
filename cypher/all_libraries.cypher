MATCH (l:Library)
OPTIONAL MATCH (i:Item {library_uid: l.uid})
RETURN l.uid AS uid, l.name AS name, l.workspace_id AS workspace_id, count(i) AS item_count
ORDER BY uid
