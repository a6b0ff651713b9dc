UNWIND $libs AS lib
MATCH (c:Chunk {pending_lib: lib})
RETURN count(c) AS n
