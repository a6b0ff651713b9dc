//! The argument types of the command groups (`Cli` and `Command`, the top
//! level, are in `mod.rs`; each group's handler is in its own file).

use chrono::{DateTime, Utc};
use clap::Subcommand;

use crate::service::tool_grants::ToolAllowlist;
use crate::store::pg::users::Role;

/// Filters shared by `audit list` and `audit export`.
#[derive(clap::Args, Debug)]
pub struct AuditFilterArgs {
    /// Only one action (e.g. library_deleted, token_created).
    #[arg(long)]
    pub(super) action: Option<String>,
    /// Only one actor (e.g. cli, admin:alice, daedalus-service).
    #[arg(long)]
    pub(super) actor: Option<String>,
    /// Only one surface: rest, mcp, console or cli.
    #[arg(long, value_parser = ["rest", "mcp", "console", "cli"])]
    pub(super) surface: Option<String>,
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
    /// Who read a library (issue 53): per hour, each reader (a team by its
    /// id, a token by its id with its user's name, a per-turn caller by its
    /// `sub`), the tool, the calls and the results returned. Counts reach
    /// the database every MNEMOSYNE_USAGE_FLUSH_SECS. The operator sees every
    /// library's; with --as, only what that user may see (their libraries as
    /// owner or manager; staff every library's).
    Library {
        /// The library uid.
        uid: String,
        /// Since: an RFC 3339 time, a date (2026-11-01) or an age (24h, 7d).
        #[arg(long, default_value = "7d")]
        since: String,
        /// Ask as this user: refused unless they are staff or an owner or
        /// manager of the library.
        #[arg(long = "as", value_name = "USERNAME")]
        as_user: Option<String>,
        /// Every row as JSON lines, oldest first, on standard output
        /// (`… --export > activity.jsonl`).
        #[arg(long)]
        export: bool,
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
    pub tools: Vec<String>,
    /// No ceiling: each token's own allowlist decides.
    #[arg(long)]
    pub all_tools: bool,
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
    pub(super) fn allowlist(&self) -> anyhow::Result<Option<ToolAllowlist>> {
        if self.every {
            return Ok(None);
        }
        let names: &[String] = if self.none { &[] } else { &self.tools };
        Ok(Some(ToolAllowlist::parse("--tool", names, &crate::mcp::TOOLS)?))
    }
}

/// An allowlist in `--json` output (`null` = every tool).
pub(super) fn tools_json(tools: Option<&[String]>) -> serde_json::Value {
    serde_json::json!(tools)
}

/// An allowlist in the human output.
pub(super) fn tools_human(tools: Option<&[String]>) -> String {
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
    /// Replace the libraries granted to a team directly (after its
    /// workspaces' libraries, in this order); applies on the next request.
    /// No uid at all clears them.
    SetLibraries {
        /// The team id (a UUID).
        id: String,
        /// Library uids, in the order the team's JWT resolves them.
        uids: Vec<String>,
    },
    /// A team: its state, workspaces and directly granted libraries.
    Show {
        /// The team id (a UUID).
        id: String,
    },
}

/// A credential's own rate: `--per-minute N` or `--default`.
#[derive(clap::Args, Debug)]
#[group(required = true, multiple = false)]
pub struct RateArg {
    /// MCP requests a minute over the whole deployment (every replica
    /// together); 0 = no limit.
    #[arg(long)]
    pub(super) per_minute: Option<u32>,
    /// The configured rate (MNEMOSYNE_RATE_LIMIT_PER_MINUTE).
    #[arg(long)]
    default: bool,
}

/// A credential's own rate in the human output.
pub(super) fn rate_human(per_minute: Option<u32>) -> String {
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
