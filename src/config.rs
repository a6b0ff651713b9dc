//! Typed settings, read once from `MNEMOSYNE_*` environment variables (DESIGN §8).
//!
//! Every field has a default that points at the services `scripts/dev` starts, so
//! `mnemosyne serve` works with no settings after `scripts/dev up`. The dev script
//! writes its generated values (graph password, ports) to `.dev/env`, which the
//! binary loads first when it exists (explicit environment variables win).

use std::fmt;
use std::net::SocketAddr;
use std::time::Duration;

use clap::{Args, ValueEnum};

/// Which Bolt server is behind the graph store; the only place the two differ is
/// the full-text index (see `store::graph::flavor`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum GraphFlavor {
    Arcadedb,
    Neo4j,
}

impl fmt::Display for GraphFlavor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            GraphFlavor::Arcadedb => "arcadedb",
            GraphFlavor::Neo4j => "neo4j",
        })
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum LogFormat {
    /// Human-readable lines (default).
    Text,
    /// One JSON object per line.
    Json,
}

/// A string that never prints (passwords).
#[derive(Clone, Default)]
pub struct Secret(pub String);

impl Secret {
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Secret(****)")
    }
}

impl std::str::FromStr for Secret {
    type Err = std::convert::Infallible;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Ok(Secret(s.to_owned()))
    }
}

/// Everything the server, `migrate` and the operator CLI need.
#[derive(Args, Clone, Debug)]
pub struct Settings {
    /// PostgreSQL URL.
    #[arg(
        long,
        env = "MNEMOSYNE_DATABASE_URL",
        default_value = "postgres://postgres@127.0.0.1:5432/mnemosyne",
        global = true
    )]
    pub database_url: String,

    /// Bolt URI of the graph server.
    #[arg(long, env = "MNEMOSYNE_BOLT_URI", default_value = "127.0.0.1:7687", global = true)]
    pub bolt_uri: String,

    #[arg(long, env = "MNEMOSYNE_BOLT_USER", default_value = "root", global = true)]
    pub bolt_user: String,

    #[arg(
        long,
        env = "MNEMOSYNE_BOLT_PASSWORD",
        default_value = "",
        hide_env_values = true,
        global = true
    )]
    pub bolt_password: Secret,

    /// Graph database name (ArcadeDB database / Neo4j database).
    #[arg(long, env = "MNEMOSYNE_BOLT_DATABASE", default_value = "mnemosyne", global = true)]
    pub bolt_database: String,

    /// Graph server flavor.
    #[arg(long, env = "MNEMOSYNE_GRAPH_FLAVOR", value_enum, default_value_t = GraphFlavor::Arcadedb, global = true)]
    pub graph_flavor: GraphFlavor,

    /// ArcadeDB HTTP API base URL, used only by `migrate` to create the full-text
    /// index (ArcadeDB creates those only through its SQL).
    #[arg(
        long,
        env = "MNEMOSYNE_ARCADEDB_HTTP_URL",
        default_value = "http://127.0.0.1:2480",
        global = true
    )]
    pub arcadedb_http_url: String,

    /// Address the HTTP server listens on.
    #[arg(long, env = "MNEMOSYNE_LISTEN", default_value = "127.0.0.1:8000", global = true)]
    pub listen: SocketAddr,

    /// Public base URL clients use (allowed Host / Origin, registry entry).
    #[arg(
        long,
        env = "MNEMOSYNE_PUBLIC_URL",
        default_value = "http://127.0.0.1:8000",
        global = true
    )]
    pub public_url: String,

    #[arg(long, env = "MNEMOSYNE_LOG_FORMAT", value_enum, default_value_t = LogFormat::Text, global = true)]
    pub log_format: LogFormat,

    /// Upper bound, in seconds, on how long an auth cache entry may serve a change
    /// made behind the server's back (NOTIFY covers every change the server or CLI
    /// makes). 0 disables the caches.
    #[arg(
        long,
        env = "MNEMOSYNE_CACHE_MAX_STALENESS_SECS",
        default_value_t = 30,
        global = true
    )]
    pub cache_max_staleness_secs: u64,

    /// Largest request body accepted, in bytes.
    #[arg(long, env = "MNEMOSYNE_BODY_LIMIT_BYTES", default_value_t = 4 * 1024 * 1024, global = true)]
    pub body_limit_bytes: usize,

    /// Timeout for one store call made while serving a request, in milliseconds.
    #[arg(long, env = "MNEMOSYNE_STORE_TIMEOUT_MS", default_value_t = 5000, global = true)]
    pub store_timeout_ms: u64,

    /// Authorization server for external OAuth clients (RFC 9728 metadata is
    /// served only when this is set).
    #[arg(long, env = "MNEMOSYNE_AUTHORIZATION_SERVER", global = true)]
    pub authorization_server: Option<String>,

    /// Chunk size (characters) of the ingest splitter.
    #[arg(long, env = "MNEMOSYNE_CHUNK_MAX_CHARS", default_value_t = 1200, global = true)]
    pub chunk_max_chars: usize,
}

impl Settings {
    pub fn cache_max_staleness(&self) -> Duration {
        Duration::from_secs(self.cache_max_staleness_secs)
    }

    pub fn store_timeout(&self) -> Duration {
        Duration::from_millis(self.store_timeout_ms)
    }

    /// Loads `.dev/env` (written by `scripts/dev`) into the environment without
    /// overriding variables that are already set.
    pub fn load_dev_env() {
        let _ = dotenvy::from_path(".dev/env");
    }
}

#[derive(clap::Parser)]
struct EnvOnly {
    #[command(flatten)]
    settings: Settings,
}

impl Settings {
    /// Settings from the environment (and `.dev/env`) alone, with defaults —
    /// what `serve` would use with no flags. Used by tests and benchmarks.
    pub fn from_env() -> Result<Self, clap::Error> {
        Self::load_dev_env();
        use clap::Parser;
        EnvOnly::try_parse_from(["mnemosyne"]).map(|e| e.settings)
    }
}
