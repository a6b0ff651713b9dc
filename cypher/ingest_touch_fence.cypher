MATCH (f:LibraryFence {uid: $fence_uid})
WHERE coalesce(f.workspace_id, '') = $workspace_id
MATCH (c:Collection {uid: $collection_uid})
SET f.writes = f.writes + 1
RETURN count(f) AS n
