//! The operator CLI (DESIGN §7): what the Django admin did, as subcommands.

use std::io::Read;

use anyhow::{anyhow, bail, Context};
use chrono::{DateTime, Utc};
use clap::{Parser, Subcommand};

use crate::auth::basic::hash_password;
use crate::config::Settings;
use crate::service::tokens::{self as tokens_service, Minted, TokenError};
use crate::store::graph::GraphStore;
use crate::store::pg::{self, keys, tokens, users, users::Role};

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
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Subcommand, Debug)]
pub enum Command {
    /// Run the HTTP server (MCP, team REST, ingest API, health, metrics).
    Serve,
    /// Apply Postgres migrations, bootstrap the graph schema and make sure an
    /// active signing key exists. Safe to run again.
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
    /// Libraries in the graph.
    #[command(subcommand)]
    Library(LibraryCmd),
    /// Load demo data and print credentials and client snippets.
    Demo(crate::cli::demo::DemoArgs),
}

#[derive(Subcommand, Debug)]
pub enum UserCmd {
    /// Create a user (a person, or with --service the Daedalus service account).
    Create {
        username: String,
        /// A service account may call the team and library REST APIs.
        #[arg(long)]
        service: bool,
        /// Read the password from standard input (one line).
        #[arg(long)]
        password_stdin: bool,
    },
    /// Disable a user: their tokens stop working on the next request.
    Disable { username: String },
    /// Enable a disabled user.
    Enable { username: String },
    /// Set a user's password from standard input.
    SetPassword { username: String },
    /// List users.
    List,
}

#[derive(Subcommand, Debug)]
pub enum MembershipCmd {
    /// Grant a role on a library.
    Grant {
        username: String,
        library_uid: String,
        #[arg(value_enum)]
        role: Role,
    },
    /// Revoke a role on a library.
    Revoke {
        username: String,
        library_uid: String,
        #[arg(value_enum)]
        role: Role,
    },
    /// List memberships.
    List {
        #[arg(long)]
        user: Option<String>,
        #[arg(long)]
        library: Option<String>,
    },
}

#[derive(Subcommand, Debug)]
pub enum TokenCmd {
    /// Mint an opaque token; the plaintext is printed once.
    Create {
        #[arg(long)]
        user: String,
        /// A library the token may read (repeat; order is kept). The user must
        /// be owner or manager of each.
        #[arg(long = "library", required = true)]
        libraries: Vec<String>,
        #[arg(long, default_value = "")]
        name: String,
        /// Expiry, RFC 3339 (e.g. 2027-01-01T00:00:00Z).
        #[arg(long)]
        expires_at: Option<DateTime<Utc>>,
    },
    /// List tokens (never their hashes).
    List {
        #[arg(long)]
        user: Option<String>,
    },
    /// Revoke a token by id; it stops working on the next request.
    Revoke { id: i64 },
}

#[derive(Subcommand, Debug)]
pub enum KeyCmd {
    /// Create a key; prints its kid and secret once (Daedalus configures both).
    Create,
    /// List keys (never secrets).
    List,
    /// Retire a key: every JWT signed with it stops validating.
    Retire { kid: String },
}

#[derive(Subcommand, Debug)]
pub enum LibraryCmd {
    /// List every library in the graph.
    List,
}

pub mod demo;

fn read_password_stdin() -> anyhow::Result<String> {
    let mut s = String::new();
    std::io::stdin()
        .read_to_string(&mut s)
        .context("reading password from stdin")?;
    let p = s.lines().next().unwrap_or("").to_owned();
    if p.len() < 8 {
        bail!("password must be at least 8 characters");
    }
    Ok(p)
}

/// Runs a CLI command other than `serve`.
pub async fn run(settings: Settings, command: Command) -> anyhow::Result<()> {
    let pool = pg::pool(&settings.database_url, settings.store_timeout())?;
    match command {
        Command::Serve => unreachable!("serve is handled by main"),
        Command::Migrate => {
            pg::migrate(&pool).await.context("applying Postgres migrations")?;
            println!("postgres: migrations applied");
            // The first key is made silently: migrate's output ends up in
            // deployment logs, so it never carries a secret.
            if let Some(k) = keys::ensure_active(&pool).await? {
                println!(
                    "signing key created: kid={} (its secret is never printed; for Daedalus' per-turn JWTs \
                     run `mnemosyne signing-key create`, which prints a new key's secret once)",
                    k.kid
                );
            }
            let graph = GraphStore::connect(&settings).await?;
            graph
                .bootstrap_schema()
                .await
                .context("bootstrapping the graph schema")?;
            println!("graph ({}): schema ready", settings.graph_flavor);
        }
        Command::User(c) => user(&pool, c).await?,
        Command::Membership(c) => membership(&pool, c).await?,
        Command::Token(c) => token(&pool, c).await?,
        Command::SigningKey(c) => signing_key(&pool, c).await?,
        Command::Library(LibraryCmd::List) => {
            let graph = GraphStore::connect(&settings).await?;
            let libs = graph.admin().all_libraries().await?;
            println!("{:<40} {:<24} {:<30} NAME", "UID", "WORKSPACE", "ITEMS");
            for l in libs {
                println!(
                    "{:<40} {:<24} {:<30} {}",
                    l.uid,
                    l.workspace_id.unwrap_or_default(),
                    l.item_count,
                    l.name
                );
            }
        }
        Command::Demo(args) => demo::run(&settings, &pool, args).await?,
    }
    Ok(())
}

async fn user(pool: &sqlx::PgPool, c: UserCmd) -> anyhow::Result<()> {
    match c {
        UserCmd::Create {
            username,
            service,
            password_stdin,
        } => {
            if username.is_empty() || username.len() > 150 || username.contains(':') {
                bail!("username must be 1-150 characters without ':'");
            }
            let hash = if password_stdin {
                Some(hash_password(&read_password_stdin()?).map_err(|e| anyhow!("hashing password: {e}"))?)
            } else {
                None
            };
            match users::create(pool, &username, hash.as_deref(), service).await? {
                Some(u) => println!(
                    "user created: {} (id {}{})",
                    u.username,
                    u.id,
                    if service { ", service account" } else { "" }
                ),
                None => bail!("user {username} already exists"),
            }
        }
        UserCmd::Disable { username } => {
            if !users::set_active(pool, &username, false).await? {
                bail!("no such user: {username}");
            }
            println!("user disabled: {username}");
        }
        UserCmd::Enable { username } => {
            if !users::set_active(pool, &username, true).await? {
                bail!("no such user: {username}");
            }
            println!("user enabled: {username}");
        }
        UserCmd::SetPassword { username } => {
            let hash = hash_password(&read_password_stdin()?).map_err(|e| anyhow!("hashing password: {e}"))?;
            if !users::set_password(pool, &username, &hash).await? {
                bail!("no such user: {username}");
            }
            println!("password set: {username}");
        }
        UserCmd::List => {
            println!("{:<6} {:<30} {:<8} {:<7}", "ID", "USERNAME", "SERVICE", "ACTIVE");
            for u in users::list(pool).await? {
                println!("{:<6} {:<30} {:<8} {:<7}", u.id, u.username, u.is_service, u.active);
            }
        }
    }
    Ok(())
}

async fn membership(pool: &sqlx::PgPool, c: MembershipCmd) -> anyhow::Result<()> {
    match c {
        MembershipCmd::Grant {
            username,
            library_uid,
            role,
        } => {
            if !users::grant(pool, &username, &library_uid, role).await? {
                bail!("no such user: {username}");
            }
            println!("granted {} on {library_uid} to {username}", role.as_str());
        }
        MembershipCmd::Revoke {
            username,
            library_uid,
            role,
        } => {
            if !users::revoke(pool, &username, &library_uid, role).await? {
                bail!("{username} has no {} role on {library_uid}", role.as_str());
            }
            println!("revoked {} on {library_uid} from {username}", role.as_str());
        }
        MembershipCmd::List { user, library } => {
            println!("{:<30} {:<40} ROLE", "USER", "LIBRARY");
            for m in users::memberships(pool, user.as_deref(), library.as_deref()).await? {
                println!("{:<30} {:<40} {}", m.username, m.library_uid, m.role);
            }
        }
    }
    Ok(())
}

async fn token(pool: &sqlx::PgPool, c: TokenCmd) -> anyhow::Result<()> {
    match c {
        TokenCmd::Create {
            user,
            libraries,
            name,
            expires_at,
        } => {
            let Minted { id, plaintext } = tokens_service::mint(pool, &user, &name, &libraries, expires_at)
                .await
                .map_err(|e| match e {
                    TokenError::NotOwnerOrManager { .. } => {
                        anyhow!("{e} (grant a role with `mnemosyne membership grant`)")
                    }
                    TokenError::ExpiryInPast => anyhow!("--expires-at is in the past"),
                    e => e.into(),
                })?;
            println!("token {id} created for {user}. Copy it now; it is not shown again:\n{plaintext}");
        }
        TokenCmd::List { user } => {
            println!(
                "{:<6} {:<20} {:<20} {:<7} {:<25} {:<25} LIBRARIES",
                "ID", "NAME", "USER", "ACTIVE", "EXPIRES", "LAST USED"
            );
            for t in tokens::list(pool, user.as_deref()).await? {
                println!(
                    "{:<6} {:<20} {:<20} {:<7} {:<25} {:<25} {}",
                    t.id,
                    t.name,
                    t.username,
                    t.active,
                    t.expires_at.map(|d| d.to_rfc3339()).unwrap_or_else(|| "never".into()),
                    t.last_used_at.map(|d| d.to_rfc3339()).unwrap_or_else(|| "never".into()),
                    t.allowed_libraries.0.join(",")
                );
            }
        }
        TokenCmd::Revoke { id } => {
            if !tokens::revoke(pool, id).await? {
                bail!("no active token with id {id}");
            }
            println!("token {id} revoked");
        }
    }
    Ok(())
}

async fn signing_key(pool: &sqlx::PgPool, c: KeyCmd) -> anyhow::Result<()> {
    match c {
        KeyCmd::Create => {
            let k = keys::create(pool).await?;
            println!(
                "kid:    {}\nsecret: {}\n(the secret is shown once)",
                k.kid, k.secret_hex
            );
        }
        KeyCmd::List => {
            println!("{:<24} {:<27} RETIRED", "KID", "CREATED");
            for k in keys::list(pool).await? {
                println!(
                    "{:<24} {:<27} {}",
                    k.kid,
                    k.created_at.to_rfc3339(),
                    k.retired_at.map(|d| d.to_rfc3339()).unwrap_or_else(|| "-".into())
                );
            }
        }
        KeyCmd::Retire { kid } => {
            if !keys::retire(pool, &kid).await? {
                bail!("no active key with kid {kid}");
            }
            println!("key {kid} retired; JWTs signed with it are refused from the next request");
        }
    }
    Ok(())
}
