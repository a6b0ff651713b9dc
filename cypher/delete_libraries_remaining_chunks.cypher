MATCH (c:Chunk) WHERE c.library_uid IN $libs
DETACH DELETE c
