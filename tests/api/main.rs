//! Integration tests against the real stores (`scripts/dev up`): one binary,
//! one fresh Postgres database and one graph uid namespace per test.

mod helpers;

mod auth;
mod foundation;
mod ingest;
mod mcp;
mod teams;
