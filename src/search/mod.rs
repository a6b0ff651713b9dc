//! Search, one room, above the stores: a query from its text to the hits a
//! caller sees (`engine::Engine::run`, the one front door), the per-library
//! index beside the graph (`index`: postings and keyword scoring within a
//! memory bound, per-library BM25 ranking in `index::rank`, vectors in
//! `index::vectors`, and this replica's set of them, built and caught up
//! from the graph, in `index::replica`), and how keyword and semantic
//! candidates are fused into one ranking with a `relevance` (`fusion`), and
//! the best of them reordered by a reranker when the deployment has one
//! (`rerank`).
//!
//! It reads the stores through narrow handles: a caller's `ScopedGraph`
//! (languages, full-text candidates, statistics, stored vectors, chunk
//! details — nothing outside the scope), `IndexSource` (what the indexes are
//! built from) and Postgres' change counters (`pg::index_changes`). The
//! stores know nothing of ranking, fusion or a model. How text becomes terms
//! is `crate::analysis` (below the store: ingest writes the same terms);
//! the model that makes vectors is `crate::embed`.

pub mod engine;
pub mod fusion;
pub mod index;
pub mod rerank;
