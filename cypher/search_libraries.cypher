MATCH (l:Library)
WHERE l.uid IN $libs
OPTIONAL MATCH (f:LibraryFence)
WHERE f.uid IN $fences AND f.library_uid = l.uid
RETURN l.uid AS uid, l.language AS language, sum(coalesce(f.writes, 0)) AS version
