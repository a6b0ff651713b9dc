MATCH (l:Library {uid: $uid})
WHERE l.fences IS NULL
SET l.fences = size($fences)
WITH l
UNWIND $fences AS fence_uid
MERGE (f:LibraryFence {uid: fence_uid})
ON CREATE SET f.library_uid = l.uid, f.workspace_id = l.workspace_id, f.writes = 0
RETURN count(f) AS n
