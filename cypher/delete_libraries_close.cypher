MATCH (l:Library) WHERE l.uid IN $libs
SET l.deleting = $now
