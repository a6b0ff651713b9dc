use std::path::PathBuf;
use std::process::ExitCode;

use clap::Parser;
use mnemosyne::cli::{Cli, Command};
use mnemosyne::config::env_file;

/// Everything that writes the process environment (`RAYON_NUM_THREADS`, the
/// settings file) runs here, before the runtime starts its threads:
/// `set_var` is only sound while no other thread reads the environment
/// (it is `unsafe` from Rust 2024 on).
fn main() -> ExitCode {
    mnemosyne::memory::tune_allocator();
    one_core_per_text();
    let args: Vec<String> = std::env::args().collect();
    let env_file = match env_file::load(&args) {
        Ok(p) => p,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::FAILURE;
        }
    };
    let cli = Cli::parse_from(args);
    // What `#[tokio::main]` builds.
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("Failed building the Runtime");
    runtime.block_on(run(cli, env_file))
}

/// Logging, then the command: `serve`, or one of the operator commands.
async fn run(cli: Cli, env_file: Option<PathBuf>) -> ExitCode {
    let _telemetry = match mnemosyne::telemetry::install(cli.settings.log_format, cli.settings.otlp_endpoint.as_deref())
    {
        Ok(t) => t,
        Err(e) => {
            eprintln!("error: tracing exporter: {e:#}");
            return ExitCode::FAILURE;
        }
    };
    if let Some(p) = env_file {
        tracing::info!(file = %p.display(), "settings file loaded (variables already set win)");
    }
    let result = match cli.command {
        Command::Serve => match mnemosyne::startup::Application::build(cli.settings).await {
            Ok(app) => app.run().await,
            Err(e) => Err(e),
        },
        other => mnemosyne::cli::run_with(cli.settings, other, cli.json).await,
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

/// The embedding model runs each text on one core and texts side by side
/// (the in-process runtime, model/: `Encoder::embed`): candle's own splitting
/// of one 256-token text over two cores gained ~0 here
/// (model/benches/embed_throughput.rs: 10.1 chunks/s
/// on 2 threads per text, 21 chunks/s with one thread per text, two texts at
/// once; a query 14 → 10 ms). candle reads its thread count from
/// `RAYON_NUM_THREADS`; an operator's own value wins.
fn one_core_per_text() {
    if std::env::var_os("RAYON_NUM_THREADS").is_none() {
        // Before the runtime (or any other thread) exists: see `main`.
        std::env::set_var("RAYON_NUM_THREADS", "1");
    }
}
