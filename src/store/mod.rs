//! The stores: Postgres (auth rows, the search index's change sequence) and the
//! Bolt graph (knowledge, the source of truth). The per-library search index
//! beside the graph is `crate::search::index`, built and caught up from the
//! graph by `graph::indexing`.

pub mod graph;
pub mod pg;
