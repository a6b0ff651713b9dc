CREATE FULLTEXT INDEX chunk_scoped IF NOT EXISTS FOR (c:Chunk) ON EACH [c.scoped]
OPTIONS {indexConfig: {`fulltext.analyzer`: 'whitespace', `fulltext.eventually_consistent`: false}};
CALL db.awaitIndexes(300)
