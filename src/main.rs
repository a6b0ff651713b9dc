use clap::Parser;
use mnemosyne::cli::{Cli, Command};
use mnemosyne::config::env_file;

#[tokio::main]
async fn main() -> std::process::ExitCode {
    release_large_blocks();
    let args: Vec<String> = std::env::args().collect();
    let env_file = match env_file::load(&args) {
        Ok(p) => p,
        Err(e) => {
            eprintln!("error: {e}");
            return std::process::ExitCode::FAILURE;
        }
    };
    let cli = Cli::parse_from(args);
    let _telemetry = match mnemosyne::telemetry::install(cli.settings.log_format, cli.settings.otlp_endpoint.as_deref())
    {
        Ok(t) => t,
        Err(e) => {
            eprintln!("error: tracing exporter: {e:#}");
            return std::process::ExitCode::FAILURE;
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
        other => mnemosyne::cli::run(cli.settings, other).await,
    };
    match result {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}

/// Large blocks (argon2's 19 MiB per verification) come straight from mmap
/// and go back to the OS when freed. glibc otherwise raises its mmap
/// threshold after the first such free and keeps later blocks in per-thread
/// arenas: measured +328 MB RSS during a flood of wrong Basic passwords
/// (benches/flood_load.rs).
fn release_large_blocks() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: mallopt only tunes the allocator (it takes glibc's own lock);
    // called once at start-up.
    unsafe {
        libc::mallopt(libc::M_MMAP_THRESHOLD, 1 << 20);
    }
}
