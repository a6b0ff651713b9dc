//! Tracing setup: human-readable lines in a terminal, JSON when configured.

use tracing_subscriber::{fmt, EnvFilter};

use crate::config::LogFormat;

/// Installs the global subscriber once; later calls are no-ops (tests call it often).
pub fn init(format: LogFormat) {
    let filter = EnvFilter::try_from_env("MNEMOSYNE_LOG")
        .unwrap_or_else(|_| EnvFilter::new("info,sqlx=warn,neo4rs=warn,rmcp=warn"));
    let builder = fmt().with_env_filter(filter).with_writer(std::io::stderr);
    let _ = match format {
        LogFormat::Json => builder.json().flatten_event(true).try_init(),
        LogFormat::Text => builder.try_init(),
    };
}
