MATCH (f:LibraryFence)
WHERE f.uid IN $fences
RETURN f.library_uid AS uid, sum(coalesce(f.writes, 0)) AS writes
