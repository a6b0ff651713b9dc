//! The HTTP side of a model server this process calls: the remote
//! embedding provider (`remote`) and the reranker (`rerank`) share it, so
//! both fail alike.
//!
//! `Endpoint::post` sends one JSON request and reads its answer: never a
//! redirect (refused, not followed), at most a cap of bytes, its status told
//! apart (`Failure`): a server that cannot answer now (unreachable, timed
//! out, a TLS failure, 408, 429, 502–504) is *unavailable*, one that answers
//! wrongly (another 4xx, 500, an answer the caller refuses) *refused*.
//! `Endpoint::request` runs such a call through the circuit breaker
//! (`Breaker`), retrying an unavailable server with exponential backoff and
//! jitter (honouring `Retry-After`), counts each failure by reason, keeps
//! the last for the console and logs it once: a refusal when it happens, an
//! outage when it first happens (the circuit's trials failing alike are not
//! logged again until the server has answered).

use std::sync::Mutex;
use std::time::{Duration, Instant};

use prometheus::{IntCounter, IntCounterVec, IntGauge, Opts};

use super::Circuit as CircuitState;

/// The first retry's wait (then doubled, plus up to half again of jitter).
const BACKOFF: Duration = Duration::from_millis(250);
/// The longest wait between attempts, `Retry-After` included.
const BACKOFF_MAX: Duration = Duration::from_secs(10);
/// Unavailable answers in a row that open the circuit.
pub(crate) const BREAKER_FAILURES: u32 = 3;
const COOLDOWN: Duration = Duration::from_secs(1);
const COOLDOWN_MAX: Duration = Duration::from_secs(30);

/// Which server an endpoint is: how it is named in the log and `/metrics`,
/// and the setting that adds authorities for its certificate.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Role {
    /// In log messages (`embedding provider: unavailable`).
    pub(crate) label: &'static str,
    /// In the metrics' help (`Requests sent to the …`).
    pub(crate) noun: &'static str,
    /// The metrics' names: `mnemosyne_{metric}_requests_total`,
    /// `…_errors_total{reason}`, `…_circuit`.
    pub(crate) metric: &'static str,
    /// The setting naming extra certificate authorities (a TLS failure's
    /// message names it).
    pub(crate) ca_var: &'static str,
}

/// One failed request.
#[derive(Debug)]
pub(crate) struct Failure {
    /// The metric's label.
    pub(crate) reason: &'static str,
    /// The server's HTTP status, if it answered.
    pub(crate) status: Option<u16>,
    pub(crate) detail: String,
    /// Try again (after `retry_after`, if it said).
    pub(crate) unavailable: bool,
    pub(crate) retry_after: Option<Duration>,
}

impl Failure {
    pub(crate) fn refused(reason: &'static str, status: Option<u16>, detail: impl Into<String>) -> Failure {
        Failure {
            reason,
            status,
            detail: detail.into(),
            unavailable: false,
            retry_after: None,
        }
    }

    pub(crate) fn unavailable(reason: &'static str, status: Option<u16>, detail: impl Into<String>) -> Failure {
        Failure {
            reason,
            status,
            detail: detail.into(),
            unavailable: true,
            retry_after: None,
        }
    }

    pub(crate) fn describe(&self) -> String {
        match self.status {
            Some(s) => format!("HTTP {s}: {}", self.detail),
            None => self.detail.clone(),
        }
    }
}

/// Why a request through the breaker failed (`Endpoint::request`).
#[derive(Debug)]
pub(crate) enum Failed {
    /// The server cannot answer now (its circuit may be open).
    Unavailable(String),
    /// It answered, wrongly.
    Refused(String),
}

/// An endpoint's counters (`/metrics`).
struct EndpointMetrics {
    requests: IntCounter,
    errors: IntCounterVec,
    state: IntGauge,
}

impl EndpointMetrics {
    fn new(role: Role, metrics: &crate::metrics::Metrics) -> EndpointMetrics {
        let m = EndpointMetrics {
            requests: IntCounter::new(
                format!("mnemosyne_{}_requests_total", role.metric),
                format!("Requests sent to the {}", role.noun),
            )
            .expect("valid metric"),
            errors: IntCounterVec::new(
                Opts::new(
                    format!("mnemosyne_{}_errors_total", role.metric),
                    format!("Failed or refused requests to the {}, by reason", role.noun),
                ),
                &["reason"],
            )
            .expect("valid metric"),
            state: IntGauge::new(
                format!("mnemosyne_{}_circuit", role.metric),
                format!("The {}'s circuit: 0 closed, 1 trying one request, 2 open", role.noun),
            )
            .expect("valid metric"),
        };
        metrics.register(Box::new(m.requests.clone()));
        metrics.register(Box::new(m.errors.clone()));
        metrics.register(Box::new(m.state.clone()));
        m
    }
}

/// A model server's base URL, its HTTP client, key, breaker and counters.
pub(crate) struct Endpoint {
    role: Role,
    /// The base URL as logged (without any user:password@).
    pub(crate) shown: String,
    /// The base URL, no trailing slash.
    pub(crate) base: String,
    client: reqwest::Client,
    /// Sent as `Authorization: Bearer …`; never logged.
    api_key: Option<String>,
    breaker: Breaker,
    metrics: EndpointMetrics,
    /// The last failure or refusal, and when (the console's).
    last_error: Mutex<Option<(String, chrono::DateTime<chrono::Utc>)>>,
}

impl Endpoint {
    /// An endpoint at `base_url` (http:// or https://): https with rustls,
    /// the webpki roots and `roots`; a certificate none of them issued is
    /// refused (reqwest verifies by default; nothing here turns it off).
    /// Redirects are never followed.
    pub(crate) fn new(
        role: Role,
        base_url: &str,
        api_key: Option<String>,
        roots: &[reqwest::Certificate],
        connect_timeout: Duration,
        metrics: &crate::metrics::Metrics,
    ) -> anyhow::Result<Endpoint> {
        let base = base_url.trim_end_matches('/').to_owned();
        let shown = without_userinfo(&base);
        anyhow::ensure!(
            base.starts_with("http://") || base.starts_with("https://"),
            "the {}'s URL must be http:// or https:// (got {shown})",
            role.label
        );
        let mut builder = reqwest::Client::builder()
            .redirect(reqwest::redirect::Policy::none())
            .connect_timeout(connect_timeout.min(Duration::from_secs(5)));
        for root in roots {
            builder = builder.add_root_certificate(root.clone());
        }
        Ok(Endpoint {
            role,
            shown,
            base,
            client: builder.build()?,
            api_key,
            breaker: Breaker::new(role.label),
            metrics: EndpointMetrics::new(role, metrics),
            last_error: Mutex::new(None),
        })
    }

    /// One POST of `body` to `url`: the answer's bytes (at most `cap`) and
    /// its status, or why there is none.
    pub(crate) async fn post(
        &self,
        url: &str,
        body: &serde_json::Value,
        timeout: Duration,
        cap: usize,
    ) -> Result<(Vec<u8>, Option<u16>), Failure> {
        let mut req = self.client.post(url).timeout(timeout).json(body);
        if let Some(key) = &self.api_key {
            req = req.bearer_auth(key);
        }
        self.metrics.requests.inc();
        let mut resp = req.send().await.map_err(|e| transport(e, self.role))?;
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
                Err(e) => return Err(transport(e, self.role)),
            }
        }
        Ok((bytes, code))
    }

    /// `call`, tried up to `attempts` times while the server is unavailable
    /// (never while its circuit is open); the outcome counted, kept and
    /// logged once. `texts` is how many texts the call holds (logged).
    pub(crate) async fn request<T, F, Fut>(&self, attempts: u32, texts: usize, call: F) -> Result<T, Failed>
    where
        F: Fn() -> Fut,
        Fut: std::future::Future<Output = Result<T, Failure>>,
    {
        let label = self.role.label;
        let mut wait = BACKOFF;
        let mut attempt = 0;
        loop {
            attempt += 1;
            if let Err(last) = self.breaker.admit(&self.metrics.state) {
                return Err(Failed::Unavailable(format!(
                    "{}: circuit open (last: {last})",
                    self.shown
                )));
            }
            let f = match call().await {
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
                // The server answered: it is up.
                self.breaker.success(&self.metrics.state);
                tracing::warn!(provider = %self.shown, status = ?f.status, reason = f.reason, texts, error = %f.detail, "{label}: answer refused");
                return Err(Failed::Refused(f.describe()));
            }
            let open = self.breaker.failure(&f.describe(), &self.metrics.state);
            if attempt >= attempts || open {
                // Once per failure (a circuit's trials failing alike while
                // it stays open are not logged again).
                if self.breaker.first_report(&f.describe()) {
                    tracing::warn!(provider = %self.shown, status = ?f.status, reason = f.reason, attempts = attempt, error = %f.detail, "{label}: unavailable");
                } else {
                    tracing::debug!(provider = %self.shown, status = ?f.status, reason = f.reason, attempts = attempt, error = %f.detail, "{label}: still unavailable");
                }
                return Err(Failed::Unavailable(format!("{}: {}", self.shown, f.describe())));
            }
            tracing::debug!(provider = %self.shown, status = ?f.status, attempt, error = %f.detail, "{label}: retrying");
            let jitter = Duration::from_millis(rand::Rng::gen_range(
                &mut rand::thread_rng(),
                0..=(wait.as_millis() as u64 / 2),
            ));
            tokio::time::sleep(f.retry_after.unwrap_or(wait).min(BACKOFF_MAX) + jitter).await;
            wait = (wait * 2).min(BACKOFF_MAX);
        }
    }

    /// The last error while the circuit is not closed.
    pub(crate) fn trouble(&self) -> Option<String> {
        self.breaker.trouble()
    }

    /// Closed, open, or half-open.
    pub(crate) fn circuit(&self) -> CircuitState {
        self.breaker.state()
    }

    /// The last failure or refused answer, and when (kept after it
    /// recovers).
    pub(crate) fn last_error(&self) -> Option<(String, chrono::DateTime<chrono::Utc>)> {
        self.last_error.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }
}

/// An answer's JSON as `T`, or refused: `not_finite` when it holds NaN or
/// infinity (Python's json writes them, and they are not JSON), else
/// `not_json` (`what` names the JSON expected).
pub(crate) fn parse<T: serde::de::DeserializeOwned>(bytes: &[u8], code: Option<u16>, what: &str) -> Result<T, Failure> {
    serde_json::from_slice(bytes).map_err(|e| {
        let text = String::from_utf8_lossy(&bytes[..bytes.len().min(1 << 20)]);
        if text.contains("NaN") || text.contains("Infinity") {
            Failure::refused("not_finite", code, "the answer holds NaN or infinity")
        } else {
            Failure::refused("not_json", code, format!("the answer is not the {what} JSON ({e})"))
        }
    })
}

/// `url` without the `user:password@` of its authority.
pub(crate) fn without_userinfo(url: &str) -> String {
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

/// A failure to reach or hear the server: unavailable (a TLS failure too:
/// a certificate that cannot be verified is the operator's to fix, and the
/// work waits for it).
fn transport(e: reqwest::Error, role: Role) -> Failure {
    // Without the URL (it may hold credentials).
    let e = e.without_url();
    if let Some(tls) = tls_error(&e) {
        let detail = match tls {
            rustls::Error::InvalidCertificate(c) => format!(
                "TLS: the {}'s certificate could not be verified ({c:?}); if a private authority issued it, name that authority's certificate in {}",
                role.label, role.ca_var
            ),
            other => format!("TLS: the handshake with the {} failed ({other})", role.label),
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

/// The first 300 bytes of an error answer (the server's message).
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

/// The circuit: closed (requests go), open (none go, until the cool-down
/// ends), then one trial request whose outcome closes or reopens it.
struct Breaker {
    circuit: Mutex<Circuit>,
    /// Whose circuit (logged).
    label: &'static str,
}

#[derive(Default)]
struct Circuit {
    /// Unavailable answers in a row.
    failures: u32,
    open_until: Option<Instant>,
    cooldown: Duration,
    /// A trial request is out.
    trial: bool,
    last: String,
    /// The failure last logged (since the server last answered).
    logged: String,
}

impl Breaker {
    fn new(label: &'static str) -> Breaker {
        Breaker {
            circuit: Mutex::default(),
            label,
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Circuit> {
        self.circuit.lock().unwrap_or_else(|e| e.into_inner())
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
            tracing::info!("{}: answering again; circuit closed", self.label);
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
                tracing::warn!(failures = c.failures, last = what, "{}: circuit open", self.label);
            }
            c.trial = false;
            c.open_until = Some(Instant::now() + c.cooldown);
            gauge.set(2);
        }
        c.open_until.is_some()
    }

    /// Whether `what` is a failure not logged since the server last
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
        let (b, g) = (Breaker::new("test"), IntGauge::new("g", "g").unwrap());
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
