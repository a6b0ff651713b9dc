//! The stores: Postgres (auth rows, the search index's change sequence), the
//! Bolt graph (knowledge, the source of truth) and, beside the graph, each
//! replica's per-library search index (derived, rebuildable from the graph).

pub mod graph;
pub mod index;
pub mod pg;
