//! `mnemosyne demo`: loads demo data (three libraries over two workspaces and a
//! user-managed one), a service account, a team attached to one workspace, and
//! prints a credential of each kind plus ready-to-paste client configs.
//! Idempotent: re-running refreshes the credentials and leaves the data as is.

use anyhow::Context;
use chrono::Utc;
use clap::Args;
use serde_json::json;
use uuid::Uuid;

use crate::auth::changes::AuthChanges;
use crate::auth::{basic::hash_password, jwt};
use crate::config::Settings;
use crate::service::ingest::{self, Document, DocumentIn};
use crate::service::{teams, tokens};
use crate::store::graph::ingest::AdminGraph;
use crate::store::pg::{keys, users};

#[derive(Args, Debug)]
pub struct DemoArgs {
    /// Public URL the printed client snippets point at (default: MNEMOSYNE_PUBLIC_URL).
    #[arg(long)]
    pub url: Option<String>,
}

const WS_RESEARCH: &str = "demo-research";
const WS_OPS: &str = "demo-ops";
const HANDBOOK: &str = "demo_handbook";
/// Fixed so re-running the demo finds the same team.
const TEAM_ID: &str = "6f1c1d8e-2b7a-4c1e-9f3d-0d3e5a7b9c21";

const DOCS: &[(&str, &str, &str)] = &[
    (
        WS_RESEARCH,
        "Tidal energy in the Bay of Fundy",
        include_str!("../../demo/research-tidal-energy.md"),
    ),
    (
        WS_RESEARCH,
        "Kelp forests and blue carbon",
        include_str!("../../demo/research-kelp-carbon.md"),
    ),
    (
        WS_OPS,
        "Runbook: restoring the knowledge graph",
        include_str!("../../demo/ops-runbook-restore.md"),
    ),
    (WS_OPS, "On-call handbook", include_str!("../../demo/ops-oncall.md")),
];

fn random_password() -> String {
    let mut b = [0u8; 18];
    rand::RngCore::fill_bytes(&mut rand::rngs::OsRng, &mut b);
    hex::encode(b)
}

/// What a demo run made, printed once.
struct Demo {
    research: String,
    ops: String,
    console: String,
    admin_password: String,
    service_password: String,
    opaque: String,
    team_jwt: String,
    per_turn: String,
    url: String,
}

/// Loads the demo and prints its credentials once: as text, or with `json`
/// as one JSON document (for scripts).
pub async fn run(settings: &Settings, pool: &sqlx::PgPool, args: DemoArgs, json: bool) -> anyhow::Result<()> {
    let changes = AuthChanges::new(pool.clone(), None);
    let (research, ops) = load_libraries(settings, pool, &changes).await?;
    let service_password = service_account(pool).await?;
    let admin_password = staff_user(pool).await?;
    let public_url = args
        .url
        .as_deref()
        .unwrap_or(&settings.public_url)
        .trim_end_matches('/');
    let opaque = opaque_token(pool, &research).await?;
    let (team_jwt, per_turn) = team_and_turn(pool, &changes, &ops).await?;
    let demo = Demo {
        console: format!("{public_url}/admin/"),
        url: format!("{public_url}/mcp/"),
        research,
        ops,
        admin_password,
        service_password,
        opaque,
        team_jwt,
        per_turn,
    };
    if json {
        print_json(&demo);
    } else {
        print_text(&demo);
    }
    Ok(())
}

/// The two workspace libraries (by ingesting their documents) and the
/// user-managed handbook; returns the research and ops library uids.
async fn load_libraries(
    settings: &Settings,
    pool: &sqlx::PgPool,
    changes: &AuthChanges,
) -> anyhow::Result<(String, String)> {
    let graph = AdminGraph::connect(settings).await?;
    let load = |doc: DocumentIn| {
        let graph = &graph;
        async move {
            let title = doc.title.clone();
            let doc = Document::parse(doc).map_err(|e| anyhow::anyhow!("{title}: {e}"))?;
            let out = ingest::ingest(graph, changes, settings.chunk_max_chars, doc)
                .await
                .map_err(|e| anyhow::anyhow!("ingesting {title}: {e}"))?;
            crate::service::audit::ingested(pool, super::CLI_ACTOR, &out).await;
            Ok::<_, anyhow::Error>(out)
        }
    };
    let mut libs = std::collections::HashMap::new();
    for (ws, title, content) in DOCS {
        let out = load(DocumentIn {
            workspace_id: Some((*ws).to_owned()),
            title: (*title).to_owned(),
            mime_type: Some("text/markdown".into()),
            content: (*content).to_owned(),
            ..Default::default()
        })
        .await?;
        libs.insert(*ws, out.library_uid);
    }
    if graph
        .create_library(
            HANDBOOK,
            "Team handbook",
            "House style and citation rules",
            crate::analysis::Language::English,
        )
        .await?
    {
        let detail = serde_json::json!({"name": "Team handbook", "language": "en"});
        crate::service::audit::after_commit(pool, super::CLI_ACTOR, "library_created", HANDBOOK, detail).await;
    }
    load(DocumentIn {
        library_uid: Some(HANDBOOK.into()),
        collection: Some("Guides".into()),
        title: "Writing style handbook".into(),
        mime_type: Some("text/markdown".into()),
        content: include_str!("../../demo/handbook-style.md").into(),
        ..Default::default()
    })
    .await?;
    Ok((libs[WS_RESEARCH].clone(), libs[WS_OPS].clone()))
}

/// The service account; its password is refreshed on every run.
async fn service_account(pool: &sqlx::PgPool) -> anyhow::Result<String> {
    let service_password = random_password();
    let hash = hash_password(&service_password).map_err(|e| anyhow::anyhow!("{e}"))?;
    if users::create(pool, "daedalus-service", Some(&hash), true)
        .await?
        .is_none()
    {
        users::set_password(pool, "daedalus-service", &hash).await?;
    }
    Ok(service_password)
}

/// A staff user for the admin console; its password is refreshed on every run.
async fn staff_user(pool: &sqlx::PgPool) -> anyhow::Result<String> {
    let admin_password = random_password();
    match users::by_username(pool, "demo-admin").await? {
        None => {
            crate::service::accounts::create(pool, "demo", "demo-admin", Some(&admin_password), false, true).await?;
        }
        Some(_) => {
            crate::service::accounts::set_password(pool, "demo", "demo-admin", &admin_password).await?;
            crate::service::accounts::set_active(pool, "demo", "demo-admin", true).await?;
            crate::service::accounts::set_staff(pool, "demo", "demo-admin", true).await?;
        }
    }
    Ok(admin_password)
}

/// A person with an opaque token over the handbook and the research library.
async fn opaque_token(pool: &sqlx::PgPool, research: &str) -> anyhow::Result<String> {
    if users::by_username(pool, "demo-user").await?.is_none() {
        users::create(pool, "demo-user", None, false).await?;
    }
    users::grant(pool, "demo-user", HANDBOOK, users::Role::Owner).await?;
    users::grant(pool, "demo-user", research, users::Role::Manager).await?;
    Ok(tokens::mint(
        pool,
        "demo-user",
        "demo",
        &[HANDBOOK.to_owned(), research.to_owned()],
        None,
    )
    .await?
    .plaintext)
}

/// A team attached to the research workspace only, and a per-turn JWT over
/// the ops library; returns both JWTs.
async fn team_and_turn(pool: &sqlx::PgPool, changes: &AuthChanges, ops: &str) -> anyhow::Result<(String, String)> {
    let key = keys::newest_active(pool)
        .await?
        .context("no active signing key: run `mnemosyne migrate` first")?;
    let secret = hex::decode(&key.secret_hex)?;
    let team_id = Uuid::parse_str(TEAM_ID)?;
    let (team_jwt, _) = teams::ensure_active(pool, changes, "demo", team_id, "Demo research team").await?;
    let _ = teams::set_workspaces(pool, changes, "demo", team_id, vec![WS_RESEARCH.to_owned()]).await?;
    let now = Utc::now().timestamp();
    let per_turn = jwt::sign_hs256(
        &json!({"iss": "daedalus", "aud": "mnemosyne", "sub": "daedalus-chat", "iat": now, "exp": now + 600,
                "jti": Uuid::new_v4().to_string(), "ws": WS_OPS, "libs": [ops]}),
        &key.kid,
        &secret,
    )?;
    Ok((team_jwt, per_turn))
}

/// The demo as one JSON document (for scripts).
fn print_json(d: &Demo) {
    let Demo {
        research,
        ops,
        console,
        admin_password,
        service_password,
        opaque,
        team_jwt,
        per_turn,
        url,
    } = d;
    let doc = json!({
        "libraries": [
            {"uid": research, "workspace_id": WS_RESEARCH},
            {"uid": ops, "workspace_id": WS_OPS},
            {"uid": HANDBOOK, "workspace_id": null},
        ],
        "admin_console": {"url": console, "username": "demo-admin", "password": admin_password},
        "service_account": {"username": "daedalus-service", "password": service_password},
        "opaque_token": {"user": "demo-user", "libraries": [HANDBOOK, research], "token": opaque},
        "team": {"id": TEAM_ID, "workspace_ids": [WS_RESEARCH], "jwt": team_jwt},
        "per_turn_jwt": {"libraries": [ops], "jwt": per_turn},
        "mcp_url": url,
    });
    println!("{doc:#}");
}

/// The demo for a person: credentials and ready-to-paste client configs.
fn print_text(d: &Demo) {
    let Demo {
        research,
        ops,
        console,
        admin_password,
        service_password,
        opaque,
        team_jwt,
        per_turn,
        url,
    } = d;
    println!(
        r#"
== Mnemosyne demo data ==
libraries: {research} (workspace {WS_RESEARCH}), {ops} (workspace {WS_OPS}), {HANDBOOK} (user-managed)

== Credentials (shown once) ==
admin console ({console}), staff user:
  demo-admin : {admin_password}
service account (Basic, for /mcp_server/api/ and /library/api/):
  daedalus-service : {service_password}
opaque MCP token (demo-user; {HANDBOOK} + research):
  {opaque}
team JWT (team {TEAM_ID}, attached to {WS_RESEARCH}):
  {team_jwt}
per-turn JWT (legacy Daedalus path; libs=[{ops}]; valid 10 minutes, one turn):
  {per_turn}
  Daedalus mints these itself: HS256, header kid = a key from `mnemosyne signing-key create`,
  HMAC key = the hex secret decoded to 32 bytes, claims iss=daedalus, sub, iat, exp (<= iat+600),
  jti (uuid4), libs=[library uids]. In Python:
    jwt.encode({{...claims...}}, bytes.fromhex(SECRET_HEX), algorithm="HS256", headers={{"kid": KID}})

== fast-agent (Pallas) ==
# fastagent.config.yaml
mcp:
  servers:
    mnemosyne:
      transport: http
      url: {url}
      auth:
        oauth: false
# fastagent.secrets.yaml
mcp:
  servers:
    mnemosyne:
      headers:
        Authorization: "Bearer {team_jwt}"

== Generic MCP client (Streamable HTTP), e.g. Claude Desktop via mcp-remote ==
{{
  "mcpServers": {{
    "mnemosyne": {{
      "command": "npx",
      "args": ["-y", "mcp-remote", "{url}", "--header", "Authorization:Bearer {opaque}"]
    }}
  }}
}}
# clients that speak Streamable HTTP directly:
{{"type": "http", "url": "{url}", "headers": {{"Authorization": "Bearer {opaque}"}}}}

== Try it ==
curl -s {url} -H 'Authorization: Bearer {opaque}' -H 'Content-Type: application/json' \
  -H 'Accept: application/json, text/event-stream' -H 'MCP-Protocol-Version: 2026-07-28' \
  -H 'Mcp-Method: tools/call' -H 'Mcp-Name: search' \
  -d '{{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{{"name":"search","arguments":{{"query":"tidal turbines"}},"_meta":{{"io.modelcontextprotocol/protocolVersion":"2026-07-28","io.modelcontextprotocol/clientCapabilities":{{}}}}}}}}'
"#
    );
}
