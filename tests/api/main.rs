//! Integration tests against the real stores (`scripts/dev up`): one binary,
//! one fresh Postgres database and one graph uid namespace per test.

// `&[x.clone()]` reads better than `slice::from_ref(&x)` in test arrangements.
#![allow(clippy::cloned_ref_to_slice_refs)]

mod helpers;

mod admin;
mod audit;
mod auth;
mod ceilings_proxies_and_text;
mod dos;
mod foundation;
mod fuzz_seeds;
mod hardening;
mod ingest;
mod libraries;
mod library_activity;
mod mcp;
mod oauth;
mod observability;
mod pgbouncer;
mod rate_limits;
mod remote_embedding;
mod replicas;
mod rerank;
mod routing;
mod search;
mod search_index;
mod semantic;
mod sessions;
mod shutdown;
mod startup;
mod team_libraries;
mod teams;
mod tool_permissions;
mod usage;
