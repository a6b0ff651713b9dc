//! Search, one room: how text becomes terms (`analysis`, and `scoped`, the
//! graph full-text index's per-library form of them), the per-library index
//! beside the graph (`index`: postings, per-library BM25 ranking in
//! `index::rank`, vectors in `index::vectors`), and how keyword and semantic
//! candidates are fused into one ranking with a `relevance` (`fusion`).
//!
//! Nothing here touches a store: the graph store (`store::graph`) reads and
//! writes the graph and Postgres and drives this code — it builds and catches
//! up each library's index (`store::graph::indexing`), and answers the scoped
//! search (`store::graph::knowledge`). The model that makes vectors is
//! `crate::embed`; the embedding queue that drains into the graph is
//! `service::embedding` (its statements: `store::graph::vectors`).

pub mod analysis;
pub mod fusion;
pub mod index;
pub mod scoped;
