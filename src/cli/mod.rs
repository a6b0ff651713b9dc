//! The operator CLI (DESIGN §7): what the Django admin did, as subcommands.
//! `Cli` and `Command` are the top level and `run_with` dispatches each
//! command group to its own file (its argument types are in `args.rs`), as
//! the console's pages are split in `admin/`.

use clap::{Parser, Subcommand};

use crate::config::Settings;
use crate::store::pg;

pub mod args;
mod audit;
pub mod demo;
pub mod index;
mod library;
mod membership;
mod migrate;
pub mod oauth;
pub mod reindex;
mod signing_key;
mod team;
mod token;
mod usage;
mod user;

pub use args::{AuditCmd, KeyCmd, LibraryCmd, MembershipCmd, TeamCmd, TokenCmd, UserCmd};

#[derive(Parser, Debug)]
#[command(
    name = "mnemosyne",
    version,
    about = "Mnemosyne: authenticated knowledge MCP server",
    propagate_version = true
)]
pub struct Cli {
    /// Load settings from this file first (KEY=value lines; variables already
    /// set win). Without it, only a development build loads its checkout's
    /// `.dev/env`.
    #[arg(long, global = true, value_name = "PATH")]
    pub env_file: Option<std::path::PathBuf>,
    #[command(flatten)]
    pub settings: Settings,
    /// Print data as JSON (one document) instead of the human format.
    #[arg(long, global = true)]
    pub json: bool,
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Subcommand, Debug)]
pub enum Command {
    /// Run the HTTP server (MCP, team REST, ingest API, health, metrics).
    Serve,
    /// Apply Postgres migrations, bootstrap the graph schema, re-index the
    /// chunks an older keyword analysis indexed (progress on standard error)
    /// and make sure an active signing key exists. Safe to run again, and an
    /// interrupted run is finished by running it again.
    Migrate,
    /// Users and service accounts.
    #[command(subcommand)]
    User(UserCmd),
    /// Library memberships (owner / manager / reader).
    #[command(subcommand)]
    Membership(MembershipCmd),
    /// Opaque MCP tokens for third-party clients.
    #[command(subcommand)]
    Token(TokenCmd),
    /// JWT signing keys.
    #[command(subcommand)]
    SigningKey(KeyCmd),
    /// Teams (created by Daedalus through the team REST API).
    #[command(subcommand)]
    Team(TeamCmd),
    /// Libraries in the graph.
    #[command(subcommand)]
    Library(LibraryCmd),
    /// Tool calls per token, team, per-turn caller and tool (the counts every
    /// replica writes each MNEMOSYNE_USAGE_FLUSH_SECS).
    Usage {
        /// Over the last this many days.
        #[arg(long, default_value_t = 7, value_parser = clap::value_parser!(u32).range(1..=366))]
        days: u32,
    },
    /// Load demo data and print credentials and client snippets.
    Demo(demo::DemoArgs),
    /// The audit trail: who changed what, through which surface.
    #[command(subcommand)]
    Audit(AuditCmd),
    /// The per-library search indexes beside the graph.
    #[command(subcommand)]
    Index(index::IndexCmd),
    /// The embedded OAuth authorization server: clients and grants.
    #[command(subcommand)]
    Oauth(oauth::OAuthCmd),
}

/// Prints `value` as JSON when `--json` was given, else `human()`.
fn emit(json: bool, value: serde_json::Value, human: impl FnOnce()) {
    if json {
        println!("{value:#}");
    } else {
        human();
    }
}

/// The actor of audit events written by the CLI.
const CLI_ACTOR: &str = "cli";

/// Runs a CLI command other than `serve` (human output).
pub async fn run(settings: Settings, command: Command) -> anyhow::Result<()> {
    run_with(settings, command, false).await
}

/// Runs a CLI command other than `serve`; `json` selects `--json` output.
pub async fn run_with(settings: Settings, command: Command, json: bool) -> anyhow::Result<()> {
    let pool = pg::pool(&settings.database_url, settings.store_timeout())?;
    match command {
        Command::Serve => unreachable!("serve is handled by main"),
        Command::Migrate => migrate::run(&settings, &pool).await?,
        Command::User(c) => user::run(&pool, c, json).await?,
        Command::Membership(c) => membership::run(&pool, c, json).await?,
        Command::Token(c) => token::run(&pool, c, json, settings.user_max_tokens).await?,
        Command::SigningKey(c) => signing_key::run(&pool, c, json).await?,
        Command::Team(c) => team::run(&pool, c, json).await?,
        Command::Library(c) => library::run(&settings, &pool, c, json).await?,
        Command::Audit(c) => audit::run(&pool, c, json).await?,
        Command::Index(c) => index::run(&settings, &pool, c, json).await?,
        Command::Demo(args) => demo::run(&settings, &pool, args, json).await?,
        Command::Usage { days } => usage::run(&pool, days, json).await?,
        Command::Oauth(c) => oauth::run(&settings, &pool, c, json).await?,
    }
    Ok(())
}
