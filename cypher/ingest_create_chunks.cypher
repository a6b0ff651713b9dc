MATCH (i:Item {uid: $item_uid})
UNWIND $chunks AS ch
CREATE (c:Chunk {uid: ch.uid, library_uid: $library_uid, collection_uid: $collection_uid,
                 item_uid: $item_uid, item_title: $item_title, ordinal: ch.ordinal, text: ch.text, scoped: ch.scoped,
                 dl: ch.dl, analysis: $analysis, pending_lib: $library_uid})
CREATE (c)-[:OF_ITEM]->(i)
