//! The BERT encoder of MiniLM, one text at a time, on candle's CPU kernels.
//!
//! Why not `candle_transformers::models::bert`: profiled on this machine, its
//! forward spent more than half of a 256-token chunk outside the matrix
//! products — the exact GELU calls libm's `erff` element by element, softmax
//! runs as five separate passes, the attention scale and the padding mask are
//! passes of their own, and Q, K and V are three products. Here Q, K and V are
//! one product with the scale folded into Q's weights, softmax is our own
//! op (a vectorizable `exp`), GELU uses a rational `erf` the compiler vectorizes, and each
//! text is encoded alone (no padding, so no mask). Same weights, same
//! architecture: vectors match the reference to a cosine of 0.99999
//! (`tests/fixtures/minilm_reference.json`).

use candle_core::{CpuStorage, CustomOp1, DType, Device, Layout, Module, Shape, Tensor, D};
use candle_nn::{embedding, layer_norm, Embedding, LayerNorm, VarBuilder};

/// The fields of the model's config.json this encoder reads.
#[derive(serde::Deserialize)]
pub struct Config {
    pub vocab_size: usize,
    pub hidden_size: usize,
    pub num_hidden_layers: usize,
    pub num_attention_heads: usize,
    pub intermediate_size: usize,
    pub max_position_embeddings: usize,
    pub type_vocab_size: usize,
    pub layer_norm_eps: f64,
    #[serde(default = "gelu")]
    pub hidden_act: String,
}

fn gelu() -> String {
    "gelu".into()
}

struct Layer {
    /// Q (pre-scaled by 1/√head size), K and V stacked: one product.
    qkv: Dense,
    out: Dense,
    attention_norm: LayerNorm,
    up: Dense,
    down: Dense,
    output_norm: LayerNorm,
}

/// A dense layer, `x·Wᵀ + b`.
///
/// f32 (MiniLM): Wᵀ kept contiguous (in × out) rather than viewed through W.
/// Same products, same results to the bit; but gemm reads a contiguous Wᵀ in
/// place where it copies (packs) the whole of a viewed W on every call, and
/// for a query's few tokens that copy was most of the time (a 10-token
/// product by a 384 × 1,536 matrix: 0.28 → 0.13 ms).
///
/// 4-bit (multilingual-e5): integer products (`int8`).
pub enum Dense {
    F32 { wt: Tensor, b: Tensor },
    Int8(super::int8::Matrix),
}

impl Dense {
    fn load(inputs: usize, outputs: usize, vb: VarBuilder) -> candle_core::Result<Dense> {
        let (w, b) = (vb.get((outputs, inputs), "weight")?, vb.get(outputs, "bias")?);
        Ok(Dense::F32 {
            wt: w.t()?.contiguous()?,
            b,
        })
    }

    /// W and b times `factor`.
    fn scaled(self, factor: f64) -> candle_core::Result<Dense> {
        Ok(match self {
            Dense::F32 { wt, b } => Dense::F32 {
                wt: (wt * factor)?,
                b: (b * factor)?,
            },
            Dense::Int8(m) => Dense::Int8(m.scaled(factor as f32)),
        })
    }

    /// The layers' outputs side by side, as one product.
    fn stacked(parts: Vec<Dense>) -> candle_core::Result<Dense> {
        if parts.iter().all(|p| matches!(p, Dense::F32 { .. })) {
            let (mut wts, mut bs) = (Vec::new(), Vec::new());
            for p in parts {
                if let Dense::F32 { wt, b } = p {
                    wts.push(wt);
                    bs.push(b);
                }
            }
            return Ok(Dense::F32 {
                wt: Tensor::cat(&wts, 1)?.contiguous()?,
                b: Tensor::cat(&bs, 0)?,
            });
        }
        let mut ms = Vec::new();
        for p in parts {
            let Dense::Int8(m) = p else {
                candle_core::bail!("cannot stack f32 and 4-bit layers");
            };
            ms.push(m);
        }
        Ok(Dense::Int8(
            super::int8::Matrix::stacked(ms).map_err(|e| candle_core::Error::Msg(e.to_string()))?,
        ))
    }

    fn forward(&self, x: &Tensor) -> candle_core::Result<Tensor> {
        match self {
            Dense::F32 { wt, b } => x.matmul(wt)?.broadcast_add(b),
            Dense::Int8(m) => {
                let rows = x.dim(0)?;
                let y = {
                    let x = x.contiguous()?;
                    let (storage, layout) = x.storage_and_layout();
                    let candle_core::Storage::Cpu(cpu) = &*storage else {
                        candle_core::bail!("dense: CPU tensors only");
                    };
                    m.forward(contiguous_f32("dense", cpu, layout)?)
                };
                Tensor::from_vec(y, (rows, m.outputs()), x.device())
            }
        }
    }
}

/// Where the dense layers' weights come from: the f32 tensors of the
/// `VarBuilder` (MiniLM's safetensors), or 4-bit matrices by name
/// (multilingual-e5's packed file), e.g. `encoder.layer.0.intermediate.dense`.
pub enum DenseWeights {
    F32,
    Q4(std::collections::HashMap<String, super::int8::Matrix>),
}

impl DenseWeights {
    fn take(&mut self, vb: &VarBuilder, name: &str, inputs: usize, outputs: usize) -> candle_core::Result<Dense> {
        match self {
            DenseWeights::F32 => Dense::load(inputs, outputs, vb.pp(name)),
            DenseWeights::Q4(m) => {
                let full = format!("{}.{name}", vb.prefix());
                let Some(matrix) = m.remove(&full) else {
                    candle_core::bail!("no 4-bit matrix {full}");
                };
                if (matrix.inputs(), matrix.outputs()) != (inputs, outputs) {
                    candle_core::bail!("{full} is not {outputs} × {inputs}");
                }
                Ok(Dense::Int8(matrix))
            }
        }
    }
}

/// The word-embedding table: f32 (MiniLM's safetensors) or 4-bit rows
/// widened per text (multilingual-e5's 250,037 × 384 table, `e5.rs`).
pub enum Words {
    Table(Embedding),
    Q4(super::q4::Q4Rows),
}

impl Words {
    fn rows(&self, ids: &Tensor, raw: &[u32]) -> candle_core::Result<Tensor> {
        match self {
            Words::Table(t) => t.forward(ids),
            Words::Q4(q) => q.rows(raw),
        }
    }
}

pub struct Bert {
    words: Words,
    /// Position embeddings plus the token-type-0 embedding (every text here
    /// is one segment), added once at load.
    positions: Tensor,
    embeddings_norm: LayerNorm,
    layers: Vec<Layer>,
    heads: usize,
    hidden: usize,
}

impl Bert {
    pub fn load(vb: VarBuilder, c: &Config) -> candle_core::Result<Bert> {
        let words = Words::Table(embedding(
            c.vocab_size,
            c.hidden_size,
            vb.pp("embeddings").pp("word_embeddings"),
        )?);
        Bert::load_with_words(vb, c, words, DenseWeights::F32)
    }

    /// `load` with the word embeddings and the dense layers given (the rest
    /// from `vb`).
    pub fn load_with_words(
        vb: VarBuilder,
        c: &Config,
        words: Words,
        mut dense: DenseWeights,
    ) -> candle_core::Result<Bert> {
        if c.hidden_act != "gelu" {
            candle_core::bail!(
                "unsupported activation {:?} (this encoder runs BERT's exact GELU)",
                c.hidden_act
            );
        }
        if !c.hidden_size.is_multiple_of(c.num_attention_heads) {
            candle_core::bail!("hidden_size is not a multiple of num_attention_heads");
        }
        let e = vb.pp("embeddings");
        let positions = e
            .get((c.max_position_embeddings, c.hidden_size), "position_embeddings.weight")?
            .broadcast_add(
                &e.get((c.type_vocab_size, c.hidden_size), "token_type_embeddings.weight")?
                    .get(0)?,
            )?;
        let embeddings_norm = layer_norm(c.hidden_size, c.layer_norm_eps, e.pp("LayerNorm"))?;
        let scale = 1.0 / ((c.hidden_size / c.num_attention_heads) as f64).sqrt();
        let mut layers = Vec::with_capacity(c.num_hidden_layers);
        for i in 0..c.num_hidden_layers {
            let l = vb.pp(format!("encoder.layer.{i}"));
            let s = l.pp("attention.self");
            let (h, m) = (c.hidden_size, c.intermediate_size);
            let qkv = Dense::stacked(vec![
                dense.take(&s, "query", h, h)?.scaled(scale)?,
                dense.take(&s, "key", h, h)?,
                dense.take(&s, "value", h, h)?,
            ])?;
            layers.push(Layer {
                qkv,
                out: dense.take(&l, "attention.output.dense", h, h)?,
                attention_norm: layer_norm(c.hidden_size, c.layer_norm_eps, l.pp("attention.output.LayerNorm"))?,
                up: dense.take(&l, "intermediate.dense", h, m)?,
                down: dense.take(&l, "output.dense", m, h)?,
                output_norm: layer_norm(c.hidden_size, c.layer_norm_eps, l.pp("output.LayerNorm"))?,
            });
        }
        Ok(Bert {
            words,
            positions,
            embeddings_norm,
            layers,
            heads: c.num_attention_heads,
            hidden: c.hidden_size,
        })
    }

    /// The mean of the last hidden states of one text's word pieces.
    pub fn mean_pooled(&self, ids: &[u32]) -> candle_core::Result<Tensor> {
        let n = ids.len();
        let (h, d) = (self.heads, self.hidden / self.heads);
        let raw = ids;
        let ids = Tensor::from_slice(ids, n, &Device::Cpu)?;
        let x = self.words.rows(&ids, raw)?.add(&self.positions.narrow(0, 0, n)?)?;
        let mut x = self.embeddings_norm.forward(&x)?;
        for l in &self.layers {
            // (n, 3·hidden) → (3, heads, n, d): Q, K, V per head.
            let qkv = l
                .qkv
                .forward(&x)?
                .reshape((n, 3, h, d))?
                .permute((1, 2, 0, 3))?
                .contiguous()?;
            let (q, k, v) = (qkv.get(0)?, qkv.get(1)?, qkv.get(2)?);
            let probs = q.matmul(&k.t()?)?.apply_op1_no_bwd(&Softmax)?;
            let context = probs
                .matmul(&v)?
                .transpose(0, 1)?
                .contiguous()?
                .reshape((n, self.hidden))?;
            let a = l.attention_norm.forward(&l.out.forward(&context)?.add(&x)?)?;
            let up = l.up.forward(&a)?.apply_op1_no_bwd(&Gelu)?;
            x = l.output_norm.forward(&l.down.forward(&up)?.add(&a)?)?;
        }
        x.mean(0)
    }
}

/// The f32 values of a contiguous CPU tensor (what both ops below accept).
fn contiguous_f32<'a>(op: &str, storage: &'a CpuStorage, layout: &Layout) -> candle_core::Result<&'a [f32]> {
    let CpuStorage::F32(v) = storage else {
        candle_core::bail!("{op}: f32 only");
    };
    let Some((start, end)) = layout.contiguous_offsets() else {
        candle_core::bail!("{op}: contiguous input only");
    };
    Ok(&v[start..end])
}

/// Softmax over the last dimension, with an `exp` the compiler vectorizes
/// (candle's fused softmax calls libm's `expf` per element: most of its time).
struct Softmax;

impl CustomOp1 for Softmax {
    fn name(&self) -> &'static str {
        "softmax-last-dim"
    }

    fn cpu_fwd(&self, storage: &CpuStorage, layout: &Layout) -> candle_core::Result<(CpuStorage, Shape)> {
        let v = contiguous_f32("softmax", storage, layout)?;
        let width = layout.dims().last().copied().unwrap_or(1).max(1);
        let mut out = v.to_vec();
        softmax_rows(&mut out, width);
        Ok((CpuStorage::F32(out), layout.shape().clone()))
    }
}

/// Lanes of the partial maxima and sums below (an AVX-512 register).
const LANES: usize = 16;

/// One row's softmax. The maximum and the sum are taken in `LANES` partial
/// results, so that they vectorize like the `exp` between them (a single
/// running sum is a chain of dependent additions).
#[inline(always)]
fn softmax(row: &mut [f32]) {
    let (blocks, rest) = row.as_chunks::<LANES>();
    let mut maxima = [f32::NEG_INFINITY; LANES];
    for b in blocks {
        for (m, x) in maxima.iter_mut().zip(b) {
            *m = m.max(*x);
        }
    }
    let max = rest.iter().chain(&maxima).copied().fold(f32::NEG_INFINITY, f32::max);
    for x in row.iter_mut() {
        *x = exp(*x - max);
    }
    let (blocks, rest) = row.as_chunks::<LANES>();
    let mut sums = [0f32; LANES];
    for b in blocks {
        for (s, x) in sums.iter_mut().zip(b) {
            *s += *x;
        }
    }
    let inv = 1.0 / (sums.iter().sum::<f32>() + rest.iter().sum::<f32>());
    for x in row.iter_mut() {
        *x *= inv;
    }
}

widest! {
    /// Softmax of each `width`-long row of `v`, in place.
    fn softmax_rows(v: &mut [f32], width: usize) {
        // A `for` loop, not `for_each`: the library's fold would be a
        // function of its own, compiled for the baseline.
        for row in v.chunks_exact_mut(width) {
            softmax(row);
        }
    }
}

widest! {
    /// BERT's exact GELU of each value.
    fn gelu_all(v: &[f32]) -> Vec<f32> {
        let mut out = vec![0f32; v.len()];
        for (o, &x) in out.iter_mut().zip(v) {
            *o = 0.5 * x * (1.0 + erf(x * std::f32::consts::FRAC_1_SQRT_2));
        }
        out
    }
}

/// e^x for x ≤ 0 (softmax's arguments) to about 2 ulp: x = n·ln 2 + r with
/// |r| ≤ ln 2 / 2, e^r by its degree-6 Taylor polynomial, 2^n by building the
/// float's exponent; arguments below −87 count as −87 (e⁻⁸⁷ ≈ 10⁻³⁸, nothing
/// beside the row's maximum). Plain arithmetic, so it vectorizes.
#[inline(always)]
pub fn exp(x: f32) -> f32 {
    const LN2_HI: f32 = 0.693_359_4;
    const LN2_LO: f32 = -2.121_944_4e-4;
    // Rounds to the nearest integer without a call (1.5·2²³): the sum's
    // low mantissa bits hold that integer.
    const ROUND: f32 = 12_582_912.0;
    let x = x.clamp(-87.0, 0.0);
    let t = x * std::f32::consts::LOG2_E + ROUND;
    let n = t - ROUND;
    let r = x - n * LN2_HI - n * LN2_LO;
    let mut p = 1.0 / 720.0;
    p = p * r + 1.0 / 120.0;
    p = p * r + 1.0 / 24.0;
    p = p * r + 1.0 / 6.0;
    p = p * r + 0.5;
    p = p * r + 1.0;
    p = p * r + 1.0;
    // 2ⁿ: n + 127 (1 to 127 here) shifted into the exponent field, read
    // from t's mantissa (no float-to-integer cast, which would saturate
    // element by element instead of vectorizing).
    p * f32::from_bits(t.to_bits().wrapping_add(127) << 23)
}

/// BERT's exact GELU, x·Φ(x) = x/2·(1 + erf(x/√2)), with a rational `erf`.
struct Gelu;

impl CustomOp1 for Gelu {
    fn name(&self) -> &'static str {
        "gelu-erf-rational"
    }

    fn cpu_fwd(&self, storage: &CpuStorage, layout: &Layout) -> candle_core::Result<(CpuStorage, Shape)> {
        let v = contiguous_f32("gelu", storage, layout)?;
        let out = gelu_all(v);
        Ok((CpuStorage::F32(out), layout.shape().clone()))
    }
}

/// erf(x) as an odd rational function on [-4, 4] (±1 to f32 precision
/// outside): the approximation Eigen and XLA use, |error| < 2·10⁻⁷. Plain
/// arithmetic, so a loop over it vectorizes (libm's `erff` does not).
#[inline(always)]
pub fn erf(x: f32) -> f32 {
    let x = x.clamp(-4.0, 4.0);
    let x2 = x * x;
    let mut p = x2 * -2.726_142_3e-10 + 2.770_681_4e-8;
    p = x2 * p + -2.101_024e-6;
    p = x2 * p + -5.692_506_4e-5;
    p = x2 * p + -7.349_906_3e-4;
    p = x2 * p + -2.954_600_6e-3;
    p = x2 * p + -1.609_603_3e-2;
    let mut q = x2 * -1.456_607_2e-5 + -2.133_740_6e-4;
    q = x2 * q + -1.682_827e-3;
    q = x2 * q + -7.373_329_2e-3;
    q = x2 * q + -1.426_474e-2;
    x * p / q
}

/// The unit vector of `v` (L2-normalized; a zero vector stays zero).
pub fn normalized(v: &Tensor) -> candle_core::Result<Vec<f32>> {
    let v = v.to_dtype(DType::F32)?;
    let norm = v.sqr()?.sum_keepdim(D::Minus1)?.sqrt()?.clamp(1e-12f32, f32::MAX)?;
    v.broadcast_div(&norm)?.to_vec1::<f32>()
}

#[cfg(test)]
mod tests {
    use super::{erf, exp};

    #[test]
    fn vectorizable_exp_matches_the_exact_one() {
        let mut worst = 0f64;
        for i in 0..=87_000 {
            let x = -(i as f32) / 1000.0;
            let exact = f64::from(x).exp();
            worst = worst.max((f64::from(exp(x)) - exact).abs() / exact);
        }
        assert!(worst < 1e-6, "max relative error {worst}");
        assert_eq!(exp(0.0), 1.0);
        assert_eq!(exp(-1000.0), exp(-87.0));
        assert_eq!(exp(f32::NEG_INFINITY), exp(-87.0));
    }

    #[test]
    fn rational_erf_matches_the_exact_one() {
        let mut worst = 0f64;
        for i in -6000..=6000 {
            let x = i as f32 / 1000.0;
            let exact = libm_erf(f64::from(x));
            worst = worst.max((f64::from(erf(x)) - exact).abs());
        }
        assert!(worst < 1e-6, "max |erf error| {worst}");
        assert_eq!(erf(0.0), 0.0);
        assert_eq!(erf(-1.5), -erf(1.5));
    }

    /// erf by its Taylor series (|x| ≤ 3) and continued fraction beyond:
    /// slow and exact enough in f64 to judge an f32 approximation.
    fn libm_erf(x: f64) -> f64 {
        let a = x.abs();
        let r = if a <= 3.0 {
            let (mut term, mut sum, mut n) = (a, a, 0.0);
            while term.abs() > 1e-17 {
                n += 1.0;
                term *= -a * a / n;
                sum += term / (2.0 * n + 1.0);
            }
            sum * 2.0 / std::f64::consts::PI.sqrt()
        } else {
            // erfc(a) = exp(-a²)/√π · 1/(a + 1/2/(a + 1/(a + 3/2/(a + …))))
            let mut f = a;
            for k in (1..60).rev() {
                f = a + (k as f64 / 2.0) / f;
            }
            1.0 - (-a * a).exp() / (std::f64::consts::PI.sqrt() * f)
        };
        r.copysign(x)
    }
}
