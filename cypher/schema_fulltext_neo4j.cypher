CREATE FULLTEXT INDEX chunk_scoped IF NOT EXISTS FOR (c:Chunk) ON EACH [c.scoped]
