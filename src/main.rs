use clap::Parser;
use mnemosyne::cli::{Cli, Command};
use mnemosyne::config::Settings;

#[tokio::main]
async fn main() -> std::process::ExitCode {
    Settings::load_dev_env();
    let cli = Cli::parse();
    let _telemetry = match mnemosyne::telemetry::install(cli.settings.log_format, cli.settings.otlp_endpoint.as_deref())
    {
        Ok(t) => t,
        Err(e) => {
            eprintln!("error: tracing exporter: {e:#}");
            return std::process::ExitCode::FAILURE;
        }
    };
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
