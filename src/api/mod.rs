//! The REST surfaces: health, team lifecycle (spec §7), library ingest (DESIGN §6).

pub mod health;
pub mod library;
pub mod oauth;
pub mod teams;
