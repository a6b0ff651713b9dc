MATCH (f:LibraryFence {uid: $fence_uid})
SET f.writes = f.writes + 1
RETURN count(f) AS n
