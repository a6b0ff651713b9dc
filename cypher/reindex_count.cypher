MATCH (c:Chunk)
WHERE c.analysis IS NULL OR c.analysis < $analysis
RETURN count(c) AS n
