//! The reranker: a cross-encoder behind a `/rerank` endpoint, which reads a
//! query and each candidate passage together and scores how well the
//! passage answers it. Two request shapes:
//! - `cohere` (the default; Cohere, Jina, vLLM, Infinity): `POST
//!   {base}/rerank` with `{"model", "query", "documents": [texts], "top_n",
//!   "return_documents": false}`, answered `{"results": [{"index",
//!   "relevance_score"}]}`;
//! - `tei` (text-embeddings-inference): `{"query", "texts": [texts],
//!   "truncate": true}`, answered `[{"index", "score"}]`.
//!
//! Either answer shape is read whichever was asked for.
//!
//! **An answer is refused** unless it is JSON, at most `answer_cap` bytes,
//! not a redirect, with exactly one finite score for each text, by index.
//! Its failures are the remote embedding provider's (`client`): told apart,
//! counted (`mnemosyne_rerank_errors_total{reason}`), logged once, and a
//! circuit breaker stops calling a reranker that does not answer
//! (`mnemosyne_rerank_circuit`; `get_health` says `degraded`, naming it).
//! A search never waits on it past its timeout and is never retried: the
//! caller keeps its own order (`search::rerank`).

use std::time::Duration;

use serde::Deserialize;
use serde_json::json;

use super::client::{without_userinfo, Endpoint, Failed, Failure, Role};

/// The request shape a reranker takes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum RerankApi {
    /// `{"model", "query", "documents", "top_n"}` → `{"results": [{"index",
    /// "relevance_score"}]}`: Cohere, Jina, vLLM, Infinity.
    Cohere,
    /// `{"query", "texts"}` → `[{"index", "score"}]`:
    /// text-embeddings-inference.
    Tei,
}

/// Where and how to rerank.
#[derive(Clone)]
pub struct RerankConfig {
    /// The base URL; requests go to `{base}/rerank`.
    pub base_url: String,
    /// The request's `model` (the cohere shape; omitted when None).
    pub model: Option<String>,
    /// Sent as `Authorization: Bearer …`; never logged.
    pub api_key: Option<String>,
    /// Certificate authorities an https:// reranker's certificate may come
    /// from besides the webpki roots (`MNEMOSYNE_RERANK_CA_FILE`).
    pub roots: Vec<reqwest::Certificate>,
    pub api: RerankApi,
    /// How many of a search's best candidates it reorders.
    pub candidates: usize,
    /// How long a search waits for its answer.
    pub timeout: Duration,
}

impl std::fmt::Debug for RerankConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RerankConfig")
            .field("base_url", &without_userinfo(&self.base_url))
            .field("model", &self.model)
            .field("api_key", &self.api_key.as_ref().map(|_| "****"))
            .field("roots", &self.roots.len())
            .field("api", &self.api)
            .field("candidates", &self.candidates)
            .field("timeout", &self.timeout)
            .finish()
    }
}

/// The most candidates one search sends (`MNEMOSYNE_RERANK_CANDIDATES`).
pub const MAX_CANDIDATES: usize = 100;

/// Who the endpoint is, in the log and `/metrics`.
const ROLE: Role = Role {
    label: "reranker",
    noun: "reranker",
    metric: "rerank",
    ca_var: "MNEMOSYNE_RERANK_CA_FILE",
};

/// Why a search's candidates were not reranked.
#[derive(Debug, Clone, thiserror::Error)]
pub enum RerankError {
    /// It did not answer in time, cannot be reached, or its circuit is open.
    #[error("reranker unavailable: {0}")]
    Unavailable(String),
    /// It answered wrongly.
    #[error("reranker answer refused: {0}")]
    Refused(String),
}

/// The reranker's endpoint.
pub struct Reranker {
    url: String,
    config: RerankConfig,
    endpoint: Endpoint,
}

/// Either answer shape (extra fields ignored).
#[derive(Deserialize)]
#[serde(untagged)]
enum Answer {
    Results { results: Vec<Scored> },
    Bare(Vec<Scored>),
}

#[derive(Deserialize)]
struct Scored {
    index: usize,
    #[serde(alias = "score")]
    relevance_score: f64,
}

impl Reranker {
    /// The reranker at `config.base_url` (nothing is sent until a search
    /// asks: one that does not answer yet costs searches nothing but its
    /// timeout, then its circuit opens).
    pub fn new(config: RerankConfig, metrics: &crate::metrics::Metrics) -> anyhow::Result<Reranker> {
        anyhow::ensure!(
            (1..=MAX_CANDIDATES).contains(&config.candidates),
            "the reranker's candidates must be 1 to {MAX_CANDIDATES} (got {})",
            config.candidates
        );
        let endpoint = Endpoint::new(
            ROLE,
            &config.base_url,
            config.api_key.clone(),
            &config.roots,
            config.timeout,
            metrics,
        )?;
        Ok(Reranker {
            url: format!("{}/rerank", endpoint.base),
            config,
            endpoint,
        })
    }

    /// How many of a search's best candidates it reorders.
    pub fn candidates(&self) -> usize {
        self.config.candidates
    }

    /// Bytes an answer for `texts` may have: 64 KiB, 256 a score, and twice
    /// the texts (a server that echoes them although asked not to).
    fn answer_cap(texts: &[String]) -> usize {
        64 * 1024 + texts.len() * 256 + 2 * texts.iter().map(String::len).sum::<usize>()
    }

    /// The request's body in the configured shape.
    fn body(&self, query: &str, texts: &[String]) -> serde_json::Value {
        match self.config.api {
            RerankApi::Cohere => {
                let mut body = json!({
                    "query": query,
                    "documents": texts,
                    "top_n": texts.len(),
                    "return_documents": false,
                });
                if let Some(m) = &self.config.model {
                    body["model"] = json!(m);
                }
                body
            }
            RerankApi::Tei => json!({"query": query, "texts": texts, "truncate": true}),
        }
    }

    /// One score per text, in the texts' order (higher: a better answer to
    /// `query`): one attempt, within the timeout.
    pub async fn scores(&self, query: &str, texts: &[String]) -> Result<Vec<f64>, RerankError> {
        if texts.is_empty() {
            return Ok(Vec::new());
        }
        let body = &self.body(query, texts);
        let (endpoint, url, timeout) = (&self.endpoint, self.url.as_str(), self.config.timeout);
        let cap = Self::answer_cap(texts);
        let call = move || async move {
            let (bytes, code) = endpoint.post(url, body, timeout, cap).await?;
            read_scores(&bytes, texts.len(), code)
        };
        self.endpoint.request(1, texts.len(), call).await.map_err(|e| match e {
            Failed::Unavailable(m) => RerankError::Unavailable(m),
            Failed::Refused(m) => RerankError::Refused(m),
        })
    }

    /// Said to every caller of `get_health` while its circuit is open:
    /// names the reranker by its role, not its address or last error.
    pub fn trouble(&self) -> Option<String> {
        self.endpoint.trouble().map(|_| {
            "the reranker is unavailable (its circuit is open): hybrid and semantic search keep their own order, not reranked".to_owned()
        })
    }
}

/// The scores of an answer for `n` texts, in their order.
fn read_scores(bytes: &[u8], n: usize, code: Option<u16>) -> Result<Vec<f64>, Failure> {
    let scored = match super::client::parse::<Answer>(bytes, code, "rerank")? {
        Answer::Results { results } => results,
        Answer::Bare(v) => v,
    };
    if scored.len() != n {
        return Err(Failure::refused(
            "wrong_count",
            code,
            format!("{} scores for {n} texts", scored.len()),
        ));
    }
    let mut out: Vec<Option<f64>> = vec![None; n];
    for s in scored {
        if !s.relevance_score.is_finite() {
            return Err(Failure::refused("not_finite", code, "a score is not finite"));
        }
        match out.get_mut(s.index) {
            Some(slot @ None) => *slot = Some(s.relevance_score),
            _ => {
                return Err(Failure::refused(
                    "wrong_index",
                    code,
                    format!("index {} twice or out of range", s.index),
                ))
            }
        }
    }
    Ok(out.into_iter().flatten().collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn both_answer_shapes_are_read_by_index_and_bad_ones_refused() {
        let cohere =
            br#"{"id": "x", "results": [{"index": 1, "relevance_score": 0.9}, {"index": 0, "relevance_score": 0.1}]}"#;
        assert_eq!(read_scores(cohere, 2, Some(200)).unwrap(), vec![0.1, 0.9]);
        let tei = br#"[{"index": 0, "score": 0.5}, {"index": 1, "score": -2.0}]"#;
        assert_eq!(read_scores(tei, 2, Some(200)).unwrap(), vec![0.5, -2.0]);
        let reason = |b: &[u8], n| read_scores(b, n, None).unwrap_err().reason;
        assert_eq!(reason(tei, 3), "wrong_count");
        assert_eq!(
            reason(br#"[{"index": 2, "score": 1}, {"index": 0, "score": 1}]"#, 2),
            "wrong_index"
        );
        assert_eq!(
            reason(br#"[{"index": 0, "score": 1}, {"index": 0, "score": 1}]"#, 2),
            "wrong_index"
        );
        assert_eq!(reason(br#"[{"index": 0, "score": NaN}]"#, 1), "not_finite");
        assert_eq!(reason(b"<html>", 1), "not_json");
        assert_eq!(reason(br#"{"results": [{"index": 0}]}"#, 1), "not_json");
    }
}
