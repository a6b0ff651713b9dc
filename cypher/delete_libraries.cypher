MATCH (l:Library) WHERE l.uid IN $libs
DETACH DELETE l
