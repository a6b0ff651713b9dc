MATCH (f:LibraryFence {uid: $fence_uid})
WHERE coalesce(f.workspace_id, '') = $workspace_id
MATCH (c:Collection {uid: $collection_uid})
MATCH (l:Library {uid: f.library_uid})
WHERE l.deleting IS NULL
SET f.writes = f.writes + 1
RETURN count(f) AS n
