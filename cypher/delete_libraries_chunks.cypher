MATCH (c:Chunk) WHERE c.library_uid IN $libs
WITH c LIMIT $batch
DETACH DELETE c
RETURN count(*) AS n
