//! Mnemosyne: the authenticated knowledge MCP server of the Daedalus ↔ Pallas ↔
//! Mnemosyne stack. See `docs/architecture.md` for the architecture.

pub mod activity;
pub mod admin;
pub mod analysis;
pub mod api;
pub mod auth;
pub mod cli;
pub mod config;
pub mod drain;
pub mod embed;
pub mod error;
pub mod ids;
pub mod limits;
pub mod mcp;
pub mod memory;
pub mod metrics;
pub mod proxies;
pub mod search;
pub mod service;
pub mod startup;
pub mod state;
pub mod store;
pub mod telemetry;
pub mod text;
pub mod turns;
pub mod usage;

#[cfg(test)]
mod layering;
