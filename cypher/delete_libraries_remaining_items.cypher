MATCH (i:Item) WHERE i.library_uid IN $libs
DETACH DELETE i
