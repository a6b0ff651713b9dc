MATCH (c:Collection) WHERE c.library_uid IN $libs
DETACH DELETE c
