//! The stores: Postgres (auth rows, the search index's change sequence) and the
//! Bolt graph (knowledge, the source of truth). Storage only: search sits above
//! (`crate::search`) and reads through narrow handles (`graph::knowledge`'s
//! scoped reads, `graph::indexing::IndexSource`).

pub mod graph;
pub mod pg;
