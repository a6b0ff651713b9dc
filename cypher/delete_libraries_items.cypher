MATCH (i:Item) WHERE i.library_uid IN $libs
WITH i LIMIT $batch
DETACH DELETE i
RETURN count(*) AS n
