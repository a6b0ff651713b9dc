//! The operator CLI (DESIGN §7): what the Django admin did, as subcommands.

use std::io::Read;

use anyhow::{bail, Context};
use chrono::{DateTime, Utc};
use clap::{Parser, Subcommand};

use crate::auth::changes::AuthChanges;
use crate::config::Settings;
use crate::service::credential_limits;
use crate::service::tokens::{self as tokens_service, Minted, TokenError};
use crate::service::tool_grants::{self, ToolAllowlist};
use crate::service::{self, accounts, memberships};
use crate::store::graph::ingest::AdminGraph;
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
    Demo(crate::cli::demo::DemoArgs),
    /// The audit trail: who changed what, through which surface.
    #[command(subcommand)]
    Audit(AuditCmd),
}

/// Filters shared by `audit list` and `audit export`.
#[derive(clap::Args, Debug)]
pub struct AuditFilterArgs {
    /// Only one action (e.g. library_deleted, token_created).
    #[arg(long)]
    action: Option<String>,
    /// Only one actor (e.g. cli, admin:alice, daedalus-service).
    #[arg(long)]
    actor: Option<String>,
    /// Only one surface: rest, mcp, console or cli.
    #[arg(long, value_parser = ["rest", "mcp", "console", "cli"])]
    surface: Option<String>,
}

#[derive(Subcommand, Debug)]
pub enum AuditCmd {
    /// The newest events, newest first.
    List {
        /// Only events since: an RFC 3339 time, a date (2026-11-01) or an age (24h, 7d).
        #[arg(long)]
        since: Option<String>,
        #[command(flatten)]
        filter: AuditFilterArgs,
        /// At most this many events.
        #[arg(long, default_value_t = 100, value_parser = clap::value_parser!(i64).range(1..=10_000))]
        limit: i64,
    },
    /// Every event since a time as JSON lines, oldest first, on standard
    /// output (`mnemosyne audit export --since 30d > audit.jsonl`).
    Export {
        /// An RFC 3339 time, a date (2026-11-01) or an age (24h, 7d).
        #[arg(long)]
        since: String,
        #[command(flatten)]
        filter: AuditFilterArgs,
    },
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
        /// May sign in to the admin console's staff pages (needs a password).
        #[arg(long, conflicts_with = "service")]
        staff: bool,
    },
    /// Mark a user as staff (admin console), or with --off not.
    SetStaff {
        username: String,
        #[arg(long)]
        off: bool,
    },
    /// Disable a user: their tokens stop working on the next request.
    Disable { username: String },
    /// Enable a disabled user.
    Enable { username: String },
    /// Set a user's password from standard input.
    SetPassword { username: String },
    /// Set the tools every token of a user may use at most (a token's own
    /// allowlist only narrows it); applies on the next request.
    SetTools {
        username: String,
        #[command(flatten)]
        tools: CeilingToolsArg,
    },
    /// Set the requests a minute all of a user's tokens share at most (over
    /// the whole deployment), or with --none no ceiling; applies on the next
    /// request.
    SetRate {
        username: String,
        /// Requests a minute (at least 1).
        #[arg(required_unless_present = "none", conflicts_with = "none",
              value_parser = clap::value_parser!(u32).range(1..=i32::MAX as i64))]
        per_minute: Option<u32>,
        /// No rate ceiling.
        #[arg(long)]
        none: bool,
    },
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
    /// Revoke a role on a library (the CLI may remove a library's last owner;
    /// the admin console refuses to).
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
        /// be owner or manager of each. None: a token that reads nothing
        /// (fail-closed, spec §14.1) until it is replaced.
        #[arg(long = "library")]
        libraries: Vec<String>,
        #[arg(long, default_value = "")]
        name: String,
        /// Expiry, RFC 3339 (e.g. 2027-01-01T00:00:00Z).
        #[arg(long)]
        expires_at: Option<DateTime<Utc>>,
        /// A tool the token may use (repeat). None: every tool.
        #[arg(long = "tool")]
        tools: Vec<String>,
    },
    /// Set which tools a token may use; applies on the next request.
    SetTools {
        id: i64,
        #[command(flatten)]
        tools: ToolsArg,
    },
    /// Give a token its own request rate, or back the configured one.
    SetRateLimit {
        id: i64,
        #[command(flatten)]
        rate: RateArg,
    },
    /// List tokens (never their hashes).
    List {
        #[arg(long)]
        user: Option<String>,
    },
    /// Revoke a token by id; it stops working on the next request.
    Revoke { id: i64 },
}

/// A user's tool ceiling on the command line: `--tool` (repeat) or `--all-tools`.
#[derive(clap::Args, Debug)]
#[group(required = true, multiple = false)]
pub struct CeilingToolsArg {
    /// A tool the user's tokens may use (repeat); the others are hidden and refused.
    #[arg(long = "tool")]
    tools: Vec<String>,
    /// No ceiling: each token's own allowlist decides.
    #[arg(long)]
    all_tools: bool,
}

/// A tool allowlist on the command line: `--tool` (repeat), `--every` or `--none`.
#[derive(clap::Args, Debug)]
#[group(required = true, multiple = false)]
pub struct ToolsArg {
    /// A tool it may use (repeat); the others are hidden and refused.
    #[arg(long = "tool")]
    tools: Vec<String>,
    /// Every tool (no allowlist).
    #[arg(long)]
    every: bool,
    /// No tool at all.
    #[arg(long)]
    none: bool,
}

impl ToolsArg {
    /// The allowlist to store (`None` = every tool), checked against the
    /// server's tools.
    fn allowlist(&self) -> anyhow::Result<Option<ToolAllowlist>> {
        if self.every {
            return Ok(None);
        }
        let names: &[String] = if self.none { &[] } else { &self.tools };
        Ok(Some(ToolAllowlist::parse("--tool", names, &crate::mcp::TOOLS)?))
    }
}

fn tools_json(tools: Option<&[String]>) -> serde_json::Value {
    serde_json::json!(tools)
}

fn tools_human(tools: Option<&[String]>) -> String {
    match tools {
        None => "every tool".into(),
        Some([]) => "no tool".into(),
        Some(t) => t.join(","),
    }
}

#[derive(Subcommand, Debug)]
pub enum TeamCmd {
    /// Set which tools a team's JWT may use; applies on the next request.
    SetTools {
        /// The team id (a UUID).
        id: String,
        #[command(flatten)]
        tools: ToolsArg,
    },
    /// Give a team's JWT its own request rate, or back the configured one.
    SetRateLimit {
        /// The team id (a UUID).
        id: String,
        #[command(flatten)]
        rate: RateArg,
    },
}

/// A credential's own rate: `--per-minute N` or `--default`.
#[derive(clap::Args, Debug)]
#[group(required = true, multiple = false)]
pub struct RateArg {
    /// MCP requests a minute over the whole deployment (every replica
    /// together); 0 = no limit.
    #[arg(long)]
    per_minute: Option<u32>,
    /// The configured rate (MNEMOSYNE_RATE_LIMIT_PER_MINUTE).
    #[arg(long)]
    default: bool,
}

fn rate_human(per_minute: Option<u32>) -> String {
    match per_minute {
        None => "the configured rate".into(),
        Some(0) => "no limit".into(),
        Some(n) => format!("{n} requests a minute"),
    }
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
    /// Rename a user-managed library (workspace libraries follow their
    /// workspace and are refused).
    Rename {
        uid: String,
        /// The new name (1 to 200 characters).
        #[arg(long)]
        name: String,
        /// A new description (kept when not given).
        #[arg(long)]
        description: Option<String>,
    },
    /// Delete a user-managed library: its content, every membership on it and
    /// its uid from every token's scope, on every replica from the next
    /// request on. Cannot be undone.
    Delete {
        uid: String,
        /// Confirm the delete (without it nothing is deleted).
        #[arg(long)]
        yes: bool,
    },
}

pub mod demo;
pub mod reindex;

/// Store timeout of `migrate`'s graph calls (at least; a longer configured one wins).
const MIGRATE_GRAPH_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(120);

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
            // Not serving a request: a large graph's pages are waited for.
            let graph = GraphStore::connect(&settings)
                .await?
                .with_timeout(settings.store_timeout().max(MIGRATE_GRAPH_TIMEOUT));
            graph
                .bootstrap_schema()
                .await
                .context("bootstrapping the graph schema")?;
            println!("graph ({}): schema ready", settings.graph_flavor);
            reindex::run(&graph.into_handles().admin, &mut std::io::stderr())
                .await
                .context("re-indexing the chunks for keyword search")?;
        }
        Command::User(c) => user(&pool, c, json).await?,
        Command::Membership(c) => membership(&pool, c, json).await?,
        Command::Token(c) => token(&pool, c, json, settings.user_max_tokens).await?,
        Command::SigningKey(c) => signing_key(&pool, c, json).await?,
        Command::Team(TeamCmd::SetRateLimit { id, rate }) => {
            let id = crate::service::teams::parse_id("id", &id)?;
            let changes = AuthChanges::new(pool.clone(), None);
            let _ = credential_limits::set_team_rate_limit(&pool, &changes, CLI_ACTOR, id, rate.per_minute).await?;
            emit(
                json,
                serde_json::json!({"id": id, "rate_limit_per_minute": rate.per_minute}),
                || println!("team {id}: {}", rate_human(rate.per_minute)),
            );
        }
        Command::Team(TeamCmd::SetTools { id, tools }) => {
            let id = crate::service::teams::parse_id("id", &id)?;
            let list = tools.allowlist()?;
            let names = list.as_ref().map(ToolAllowlist::names);
            // The CLI has no caches to fence: the NOTIFY is what applies.
            let changes = AuthChanges::new(pool.clone(), None);
            let _ = tool_grants::set_team_tools(&pool, &changes, CLI_ACTOR, id, list.as_ref()).await?;
            emit(json, serde_json::json!({"id": id, "tools": tools_json(names)}), || {
                println!("team {id} may use: {}", tools_human(names))
            });
        }
        Command::Library(LibraryCmd::List) => {
            let libs = AdminGraph::connect(&settings).await?.all_libraries().await?;
            let value = serde_json::Value::Array(
                libs.iter()
                    .map(|l| {
                        serde_json::json!({"uid": l.uid, "name": l.name, "workspace_id": l.workspace_id,
                                           "item_count": l.item_count})
                    })
                    .collect(),
            );
            emit(json, value, || {
                println!("{:<40} {:<24} {:<30} NAME", "UID", "WORKSPACE", "ITEMS");
                for l in &libs {
                    println!(
                        "{:<40} {:<24} {:<30} {}",
                        l.uid,
                        l.workspace_id.as_deref().unwrap_or_default(),
                        l.item_count,
                        l.name
                    );
                }
            });
        }
        Command::Library(c) => library_lifecycle(&settings, &pool, c, json).await?,
        Command::Audit(c) => audit(&pool, c, json).await?,
        Command::Demo(args) => demo::run(&settings, &pool, args, json).await?,
        Command::Usage { days } => usage_report(&pool, days, json).await?,
    }
    Ok(())
}

fn audit_filter(since: Option<&str>, f: AuditFilterArgs) -> anyhow::Result<pg::audit::AuditFilter> {
    let since = since
        .map(|s| service::audit::parse_since(s, Utc::now()))
        .transpose()
        .map_err(anyhow::Error::msg)?;
    Ok(pg::audit::AuditFilter {
        since,
        action: f.action,
        actor: f.actor,
        surface: f.surface,
    })
}

/// `audit list|export`.
async fn audit(pool: &sqlx::PgPool, c: AuditCmd, json: bool) -> anyhow::Result<()> {
    use std::io::Write;
    match c {
        AuditCmd::List { since, filter, limit } => {
            let f = audit_filter(since.as_deref(), filter)?;
            let events = pg::audit::newest(pool, &f, limit).await?;
            emit(json, serde_json::json!(events), || {
                println!(
                    "{:<20} {:<8} {:<24} {:<24} {:<40} DETAIL",
                    "AT", "SURFACE", "ACTOR", "ACTION", "TARGET"
                );
                for e in &events {
                    println!(
                        "{:<20} {:<8} {:<24} {:<24} {:<40} {}",
                        e.at.format("%Y-%m-%d %H:%M:%S"),
                        e.surface,
                        e.actor,
                        e.action,
                        e.target.as_deref().unwrap_or(""),
                        e.detail
                    );
                }
            });
        }
        AuditCmd::Export { since, filter } => {
            let f = audit_filter(Some(&since), filter)?;
            let mut out = std::io::BufWriter::new(std::io::stdout().lock());
            let (mut after, mut total) = (0i64, 0u64);
            // Pages by id: each is one index range read, however large the trail.
            loop {
                let page = pg::audit::page_after(pool, &f, after, 5_000).await?;
                for e in &page {
                    serde_json::to_writer(&mut out, e)?;
                    out.write_all(b"\n")?;
                }
                total += page.len() as u64;
                match page.last() {
                    Some(last) if page.len() == 5_000 => after = last.id,
                    _ => break,
                }
            }
            out.flush()?;
            eprintln!("{total} audit event(s) exported");
        }
    }
    Ok(())
}

/// `library rename|delete` (`library list` is above).
async fn library_lifecycle(settings: &Settings, pool: &sqlx::PgPool, c: LibraryCmd, json: bool) -> anyhow::Result<()> {
    use crate::service::libraries::{self, Authority};
    let graph = AdminGraph::connect(settings).await?;
    match c {
        LibraryCmd::List => unreachable!("listed above"),
        LibraryCmd::Rename { uid, name, description } => {
            let r = libraries::rename(
                &graph,
                pool,
                CLI_ACTOR,
                Authority::Operator,
                &uid,
                &name,
                description.as_deref(),
            )
            .await?;
            emit(json, serde_json::json!(r), || {
                println!("library {}: renamed from {:?} to {:?}", r.uid, r.previous_name, r.name)
            });
        }
        LibraryCmd::Delete { uid, yes } => {
            if !yes {
                bail!(
                    "deleting library {uid} removes its content and every grant on it and cannot be undone: add --yes"
                );
            }
            // The CLI has no caches to fence: the NOTIFY is what applies.
            let changes = AuthChanges::new(pool.clone(), None);
            let d = libraries::delete(&graph, pool, &changes, CLI_ACTOR, Authority::Operator, &uid).await?;
            let c = d.content.as_ref();
            let value = serde_json::json!({
                "uid": d.uid, "deleted_from_graph": c.is_some(),
                "collections": c.map(|c| c.collection_count), "items": c.map(|c| c.item_count),
                "chunks": c.map(|c| c.chunk_count), "memberships_removed": d.memberships_removed,
                "tokens_changed": d.tokens_changed,
            });
            emit(json, value, || match c {
                Some(c) => println!(
                    "library {} deleted: {} collection(s), {} item(s), {} chunk(s); {} membership(s) removed, \
                     {} token(s) no longer scope it",
                    d.uid, c.collection_count, c.item_count, c.chunk_count, d.memberships_removed, d.tokens_changed
                ),
                None => println!(
                    "library {} was not in the graph; {} membership(s) removed, {} token(s) no longer scope it",
                    d.uid, d.memberships_removed, d.tokens_changed
                ),
            });
        }
    }
    Ok(())
}

fn user_json(u: &users::User) -> serde_json::Value {
    serde_json::json!({"id": u.id, "username": u.username, "service": u.is_service, "staff": u.is_staff,
                       "active": u.active, "created_at": u.created_at})
}

async fn user(pool: &sqlx::PgPool, c: UserCmd, json: bool) -> anyhow::Result<()> {
    match c {
        UserCmd::Create {
            username,
            service,
            password_stdin,
            staff,
        } => {
            // The service's rules, before a password is read from stdin.
            match accounts::check_new_user(&username, service, staff, password_stdin) {
                Err(accounts::AccountError::StaffWithoutPassword) => {
                    bail!("a staff user signs in with a password: add --password-stdin")
                }
                other => other?,
            }
            let password = if password_stdin {
                Some(read_password_stdin()?)
            } else {
                None
            };
            let u = accounts::create(pool, CLI_ACTOR, &username, password.as_deref(), service, staff).await?;
            emit(json, user_json(&u), || {
                println!(
                    "user created: {} (id {}{}{})",
                    u.username,
                    u.id,
                    if service { ", service account" } else { "" },
                    if staff { ", staff" } else { "" }
                )
            });
        }
        UserCmd::SetTools { username, tools } => {
            let list = if tools.all_tools {
                None
            } else {
                Some(ToolAllowlist::parse("--tool", &tools.tools, &crate::mcp::TOOLS)?)
            };
            let names = list.as_ref().map(ToolAllowlist::names);
            // The CLI has no caches to fence: the NOTIFY is what applies.
            let changes = AuthChanges::new(pool.clone(), None);
            let _ = accounts::set_max_tools(pool, &changes, CLI_ACTOR, &username, list.as_ref()).await?;
            emit(
                json,
                serde_json::json!({"username": username, "max_tools": tools_json(names)}),
                || println!("{username}'s tokens may use at most: {}", tools_human(names)),
            );
        }
        UserCmd::SetRate {
            username, per_minute, ..
        } => {
            let changes = AuthChanges::new(pool.clone(), None);
            let _ = accounts::set_max_rate(pool, &changes, CLI_ACTOR, &username, per_minute).await?;
            emit(
                json,
                serde_json::json!({"username": username, "max_rate_per_minute": per_minute}),
                || match per_minute {
                    Some(n) => println!("{username}'s tokens share at most {n} requests a minute"),
                    None => println!("{username}'s tokens have no rate ceiling"),
                },
            );
        }
        UserCmd::Disable { username } => set_active(pool, &username, false, json).await?,
        UserCmd::Enable { username } => set_active(pool, &username, true, json).await?,
        UserCmd::SetStaff { username, off } => {
            accounts::set_staff(pool, CLI_ACTOR, &username, !off).await?;
            emit(json, serde_json::json!({"username": username, "staff": !off}), || {
                println!("{username}: staff {}", if off { "off" } else { "on" })
            });
        }
        UserCmd::SetPassword { username } => {
            accounts::set_password(pool, CLI_ACTOR, &username, &read_password_stdin()?).await?;
            println!("password set: {username}");
        }
        UserCmd::List => {
            let list = users::list(pool).await?;
            emit(json, list.iter().map(user_json).collect(), || {
                println!(
                    "{:<6} {:<30} {:<8} {:<6} {:<7}",
                    "ID", "USERNAME", "SERVICE", "STAFF", "ACTIVE"
                );
                for u in &list {
                    println!(
                        "{:<6} {:<30} {:<8} {:<6} {:<7}",
                        u.id, u.username, u.is_service, u.is_staff, u.active
                    );
                }
            });
        }
    }
    Ok(())
}

async fn set_active(pool: &sqlx::PgPool, username: &str, active: bool, json: bool) -> anyhow::Result<()> {
    accounts::set_active(pool, CLI_ACTOR, username, active).await?;
    emit(
        json,
        serde_json::json!({"username": username, "active": active}),
        || println!("user {}: {username}", if active { "enabled" } else { "disabled" }),
    );
    Ok(())
}

async fn membership(pool: &sqlx::PgPool, c: MembershipCmd, json: bool) -> anyhow::Result<()> {
    use memberships::Change;
    let (change, username, library_uid, role) = match c {
        MembershipCmd::Grant {
            username,
            library_uid,
            role,
        } => (Change::Grant, username, library_uid, role),
        MembershipCmd::Revoke {
            username,
            library_uid,
            role,
        } => (Change::Revoke, username, library_uid, role),
        MembershipCmd::List { user, library } => {
            let list = users::memberships(pool, user.as_deref(), library.as_deref()).await?;
            let value = list
                .iter()
                .map(|m| serde_json::json!({"username": m.username, "library_uid": m.library_uid, "role": m.role}))
                .collect();
            emit(json, value, || {
                println!("{:<30} {:<40} ROLE", "USER", "LIBRARY");
                for m in &list {
                    println!("{:<30} {:<40} {}", m.username, m.library_uid, m.role);
                }
            });
            return Ok(());
        }
    };
    let granter = memberships::Granter::Cli;
    if let Err(refusal) = memberships::apply(pool, granter, CLI_ACTOR, change, &username, &library_uid, role).await? {
        bail!("{refusal}");
    }
    let (done, human) = match change {
        Change::Grant => (
            "granted",
            format!("granted {} on {library_uid} to {username}", role.as_str()),
        ),
        Change::Revoke => (
            "revoked",
            format!("revoked {} on {library_uid} from {username}", role.as_str()),
        ),
    };
    emit(
        json,
        serde_json::json!({"username": username, "library_uid": library_uid, "role": role, done: true}),
        || println!("{human}"),
    );
    Ok(())
}

fn token_json(t: &tokens::TokenInfo) -> serde_json::Value {
    serde_json::json!({"id": t.id, "name": t.name, "user": t.username, "libraries": t.allowed_libraries.0,
                       "tools": tools_json(t.allowed_tools.as_deref()),
                       "rate_limit_per_minute": t.rate_limit_per_minute, "active": t.active, "expires_at": t.expires_at, "last_used_at": t.last_used_at,
                       "created_at": t.created_at})
}

async fn token(pool: &sqlx::PgPool, c: TokenCmd, json: bool, max_live: u32) -> anyhow::Result<()> {
    match c {
        TokenCmd::Create {
            user,
            libraries,
            name,
            expires_at,
            tools,
        } => {
            let allowlist = if tools.is_empty() {
                None
            } else {
                Some(ToolAllowlist::parse("--tool", &tools, &crate::mcp::TOOLS)?)
            };
            let names = allowlist.as_ref().map(ToolAllowlist::names);
            let Minted { id, plaintext } = tokens_service::mint_with_tools(
                pool,
                CLI_ACTOR,
                &user,
                &name,
                &libraries,
                allowlist.as_ref(),
                expires_at,
                max_live,
            )
            .await
            .map_err(|e| match e {
                TokenError::NotOwnerOrManager { .. } => {
                    anyhow::anyhow!("{e} (grant a role with `mnemosyne membership grant`)")
                }
                TokenError::ExpiryInPast => anyhow::anyhow!("--expires-at is in the past"),
                e => e.into(),
            })?;
            emit(
                json,
                serde_json::json!({"id": id, "user": user, "name": name, "libraries": libraries,
                                   "tools": tools_json(names), "expires_at": expires_at, "token": plaintext}),
                || {
                    if libraries.is_empty() {
                        eprintln!("note: a token with no library reads nothing (fail-closed)");
                    }
                    println!("token {id} created for {user}. Copy it now; it is not shown again:\n{plaintext}")
                },
            );
        }
        TokenCmd::List { user } => {
            let list = tokens::list(pool, user.as_deref()).await?;
            emit(json, list.iter().map(token_json).collect(), || {
                println!(
                    "{:<6} {:<20} {:<20} {:<7} {:<25} {:<25} {:<20} LIBRARIES",
                    "ID", "NAME", "USER", "ACTIVE", "EXPIRES", "LAST USED", "TOOLS"
                );
                for t in &list {
                    println!(
                        "{:<6} {:<20} {:<20} {:<7} {:<25} {:<25} {:<20} {}",
                        t.id,
                        t.name,
                        t.username,
                        t.active,
                        t.expires_at.map(|d| d.to_rfc3339()).unwrap_or_else(|| "never".into()),
                        t.last_used_at.map(|d| d.to_rfc3339()).unwrap_or_else(|| "never".into()),
                        tools_human(t.allowed_tools.as_deref()),
                        t.allowed_libraries.0.join(",")
                    );
                }
            });
        }
        TokenCmd::SetTools { id, tools } => {
            let list = tools.allowlist()?;
            let names = list.as_ref().map(ToolAllowlist::names);
            // The CLI has no caches to fence: the NOTIFY is what applies.
            let changes = AuthChanges::new(pool.clone(), None);
            let _ = crate::service::tokens::set_token_tools(pool, &changes, CLI_ACTOR, id, list.as_ref(), None).await?;
            emit(json, serde_json::json!({"id": id, "tools": tools_json(names)}), || {
                println!("token {id} may use: {}", tools_human(names))
            });
        }
        TokenCmd::SetRateLimit { id, rate } => {
            let changes = AuthChanges::new(pool.clone(), None);
            let _ = credential_limits::set_token_rate_limit(pool, &changes, CLI_ACTOR, id, rate.per_minute).await?;
            emit(
                json,
                serde_json::json!({"id": id, "rate_limit_per_minute": rate.per_minute}),
                || println!("token {id}: {}", rate_human(rate.per_minute)),
            );
        }
        TokenCmd::Revoke { id } => {
            // The CLI has no caches to fence: the NOTIFY is what applies.
            let _ = tokens_service::revoke_by(pool, &AuthChanges::new(pool.clone(), None), CLI_ACTOR, id, None).await?;
            emit(json, serde_json::json!({"id": id, "revoked": true}), || {
                println!("token {id} revoked")
            });
        }
    }
    Ok(())
}

/// Rows per credential kind in `mnemosyne usage`.
const USAGE_TOP: i64 = 50;

async fn usage_report(pool: &sqlx::PgPool, days: u32, json: bool) -> anyhow::Result<()> {
    use crate::store::pg::usage;
    let tokens = usage::top_credentials(pool, "token", days, USAGE_TOP).await?;
    let teams = usage::top_credentials(pool, "team", days, USAGE_TOP).await?;
    let per_turn = usage::top_credentials(pool, "per_turn", days, USAGE_TOP).await?;
    let tools = usage::by_tool(pool, days).await?;
    let value = serde_json::json!({"days": days, "tokens": tokens, "teams": teams, "per_turn": per_turn,
                                   "tools": tools});
    emit(json, value, || {
        println!("tool calls over the last {days} days");
        for (title, rows) in [("TOKENS", &tokens), ("TEAMS", &teams), ("PER-TURN", &per_turn)] {
            println!(
                "\n{title}\n{:<48} {:<24} {:>10} {:>10} {:>10}",
                "CREDENTIAL", "NAME", "CALLS", "REFUSED", "ERRORS"
            );
            for r in rows {
                println!(
                    "{:<48} {:<24} {:>10} {:>10} {:>10}",
                    r.credential,
                    r.name.as_deref().unwrap_or(""),
                    r.calls,
                    r.refused,
                    r.errors
                );
            }
        }
        println!(
            "\nTOOLS\n{:<20} {:>10} {:>10} {:>10}",
            "TOOL", "CALLS", "REFUSED", "ERRORS"
        );
        for t in &tools {
            println!("{:<20} {:>10} {:>10} {:>10}", t.tool, t.calls, t.refused, t.errors);
        }
    });
    Ok(())
}

async fn signing_key(pool: &sqlx::PgPool, c: KeyCmd, json: bool) -> anyhow::Result<()> {
    match c {
        KeyCmd::Create => {
            let k = service::keys::create(pool, CLI_ACTOR).await?;
            emit(json, serde_json::json!({"kid": k.kid, "secret": k.secret_hex}), || {
                println!(
                    "kid:    {}\nsecret: {}\n(the secret is shown once)",
                    k.kid, k.secret_hex
                )
            });
        }
        KeyCmd::List => {
            let list = keys::list(pool).await?;
            let value = list
                .iter()
                .map(|k| serde_json::json!({"kid": k.kid, "created_at": k.created_at, "retired_at": k.retired_at}))
                .collect();
            emit(json, value, || {
                println!("{:<24} {:<27} RETIRED", "KID", "CREATED");
                for k in &list {
                    println!(
                        "{:<24} {:<27} {}",
                        k.kid,
                        k.created_at.to_rfc3339(),
                        k.retired_at.map(|d| d.to_rfc3339()).unwrap_or_else(|| "-".into())
                    );
                }
            });
        }
        KeyCmd::Retire { kid } => {
            if !service::keys::retire(pool, CLI_ACTOR, &kid).await? {
                bail!("no active key with kid {kid}");
            }
            emit(json, serde_json::json!({"kid": kid, "retired": true}), || {
                println!("key {kid} retired; JWTs signed with it are refused from the next request")
            });
        }
    }
    Ok(())
}
