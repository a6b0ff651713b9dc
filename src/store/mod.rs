//! The two stores: Postgres (auth rows) and the Bolt graph (knowledge).

pub mod graph;
pub mod pg;
