//! The BERT encoder of MiniLM and multilingual-e5, one text at a time, on
//! gemm (f32 products) and this crate's `kernels`.
//!
//! Why not `candle_transformers::models::bert`: profiled on this machine, its
//! forward spent more than half of a 256-token chunk outside the matrix
//! products — the exact GELU calls libm's `erff` element by element, softmax
//! runs as five separate passes, the attention scale and the padding mask are
//! passes of their own, and Q, K and V are three products. Here Q, K and V are
//! one product with the scale folded into Q's weights, softmax is one pass
//! of a vectorizable `exp`, GELU uses a rational `erf` the compiler vectorizes, and each
//! text is encoded alone (no padding, so no mask). Same weights, same
//! architecture: vectors match the reference to a cosine of 0.99999
//! (`tests/fixtures/minilm_reference.json`).
//!
//! candle loads the weights; the forward pass runs on plain buffers that the
//! caller keeps from one text to the next (`Scratch`), so a text's layers
//! allocate nothing once the buffers are large enough. Through candle's ops
//! every layer allocated its outputs (megabytes for a long chunk), and with
//! `serve`'s 1 MiB mmap threshold (`memory::tune_allocator`) each of those
//! was a fresh mapping and its page faults: a third of e5's throughput.

use candle_nn::VarBuilder;

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
    attention_norm: Norm,
    up: Dense,
    down: Dense,
    output_norm: Norm,
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
    /// Wᵀ (inputs × outputs, row-major) and b.
    F32 {
        wt: Vec<f32>,
        b: Vec<f32>,
    },
    Int8(crate::kernels::int8::Matrix),
}

impl Dense {
    fn load(inputs: usize, outputs: usize, vb: VarBuilder) -> candle_core::Result<Dense> {
        let (w, b) = (vb.get((outputs, inputs), "weight")?, vb.get(outputs, "bias")?);
        Ok(Dense::F32 {
            wt: w.t()?.contiguous()?.flatten_all()?.to_vec1()?,
            b: b.to_vec1()?,
        })
    }

    /// W and b times `factor`.
    fn scaled(self, factor: f64) -> Dense {
        match self {
            Dense::F32 { mut wt, mut b } => {
                let factor = factor as f32;
                wt.iter_mut().chain(b.iter_mut()).for_each(|v| *v *= factor);
                Dense::F32 { wt, b }
            }
            Dense::Int8(m) => Dense::Int8(m.scaled(factor as f32)),
        }
    }

    /// The layers' outputs side by side, as one product.
    fn stacked(parts: Vec<Dense>) -> candle_core::Result<Dense> {
        if parts.iter().all(|p| matches!(p, Dense::F32 { .. })) {
            let mut f32s = Vec::new();
            for p in parts {
                if let Dense::F32 { wt, b } = p {
                    f32s.push((wt, b));
                }
            }
            let inputs = f32s.first().map_or(0, |(wt, b)| wt.len() / b.len().max(1));
            if f32s.iter().any(|(wt, b)| wt.len() != inputs * b.len()) {
                candle_core::bail!("cannot stack layers of different inputs");
            }
            // Row r of the stacked Wᵀ: row r of each part's Wᵀ, side by side.
            let mut wt = Vec::with_capacity(f32s.iter().map(|(w, _)| w.len()).sum());
            for r in 0..inputs {
                for (w, b) in &f32s {
                    wt.extend_from_slice(&w[r * b.len()..(r + 1) * b.len()]);
                }
            }
            let b = f32s.into_iter().flat_map(|(_, b)| b).collect();
            return Ok(Dense::F32 { wt, b });
        }
        let mut ms = Vec::new();
        for p in parts {
            let Dense::Int8(m) = p else {
                candle_core::bail!("cannot stack f32 and 4-bit layers");
            };
            ms.push(m);
        }
        Ok(Dense::Int8(
            crate::kernels::int8::Matrix::stacked(ms).map_err(|e| candle_core::Error::Msg(e.to_string()))?,
        ))
    }

    fn inputs(&self) -> usize {
        match self {
            Dense::F32 { wt, b } => wt.len() / b.len().max(1),
            Dense::Int8(m) => m.inputs(),
        }
    }

    /// `x·Wᵀ + b` into `y` (its values replaced) for `x`, rows of the
    /// layer's inputs.
    fn forward_into(
        &self,
        x: &[f32],
        s: &mut crate::kernels::int8::Activations,
        y: &mut Vec<f32>,
    ) -> candle_core::Result<()> {
        let inputs = self.inputs();
        if inputs == 0 || !x.len().is_multiple_of(inputs) {
            candle_core::bail!("dense: {} values are not rows of {inputs}", x.len());
        }
        match self {
            Dense::F32 { wt, b } => {
                let (rows, outputs) = (x.len() / inputs, b.len());
                // Sized, not cleared: the product writes every value.
                y.resize(rows * outputs, 0.0);
                // SAFETY: x is rows × inputs, Wᵀ inputs × outputs and y
                // rows × outputs, each row-major (checked and sized above).
                unsafe {
                    product(
                        rows,
                        outputs,
                        inputs,
                        (y.as_mut_ptr(), outputs as isize),
                        (x.as_ptr(), inputs as isize, 1),
                        (wt.as_ptr(), outputs as isize, 1),
                        parallelism(),
                    )
                };
                for row in y.chunks_exact_mut(outputs) {
                    row.iter_mut().zip(b).for_each(|(v, c)| *v += c);
                }
            }
            Dense::Int8(m) => m.forward_into(x, s, y),
        }
        Ok(())
    }
}

/// Where the dense layers' weights come from: the f32 tensors of the
/// `VarBuilder` (MiniLM's safetensors), or 4-bit matrices by name
/// (multilingual-e5's packed file), e.g. `encoder.layer.0.intermediate.dense`.
pub enum DenseWeights {
    F32,
    Q4(std::collections::HashMap<String, crate::kernels::int8::Matrix>),
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
    /// Rows of `hidden` values, one per token id.
    Table(Vec<f32>),
    Q4(super::q4::Q4Rows),
}

impl Words {
    /// The rows of `ids`, into `out` (its values replaced).
    fn rows_into(&self, ids: &[u32], hidden: usize, out: &mut Vec<f32>) -> candle_core::Result<()> {
        match self {
            Words::Table(t) => {
                out.clear();
                for &id in ids {
                    let row = (id as usize)
                        .checked_mul(hidden)
                        .and_then(|at| t.get(at..at.checked_add(hidden)?));
                    let Some(row) = row else {
                        candle_core::bail!("token id {id} outside the vocabulary of {}", t.len() / hidden);
                    };
                    out.extend_from_slice(row);
                }
                Ok(())
            }
            Words::Q4(q) => q.rows_into(ids, out),
        }
    }
}

pub struct Bert {
    words: Words,
    /// Position embeddings plus the token-type-0 embedding (every text here
    /// is one segment), added once at load: rows of `hidden` values.
    positions: Vec<f32>,
    embeddings_norm: Norm,
    layers: Vec<Layer>,
    heads: usize,
    hidden: usize,
}

/// The buffers of one text's forward pass, kept by the caller from one text
/// to the next (one per batch and thread: `Model::embed_each`): each grows to
/// the longest text it has seen and is then reused, so the layers allocate
/// nothing. A one-text query allocates them once, small.
#[derive(Default)]
pub struct Scratch {
    /// The hidden states (n × hidden).
    x: Vec<f32>,
    /// A dense layer's output before its residual sum (n × hidden).
    y: Vec<f32>,
    /// Q, K and V side by side (n × 3·hidden).
    qkv: Vec<f32>,
    /// The heads' contexts side by side (n × hidden).
    context: Vec<f32>,
    /// The intermediate layer (n × intermediate).
    up: Vec<f32>,
    /// One head's attention scores (n × n), and each row's sum.
    scores: Vec<f32>,
    sums: Vec<f32>,
    /// A dense layer's quantized inputs (4-bit models).
    activations: crate::kernels::int8::Activations,
}

impl Bert {
    pub fn load(vb: VarBuilder, c: &Config) -> candle_core::Result<Bert> {
        let words = vb
            .pp("embeddings")
            .pp("word_embeddings")
            .get((c.vocab_size, c.hidden_size), "weight")?
            .flatten_all()?
            .to_vec1()?;
        Bert::load_with_words(vb, c, Words::Table(words), DenseWeights::F32)
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
        if c.hidden_size == 0 || c.num_attention_heads == 0 || !c.hidden_size.is_multiple_of(c.num_attention_heads) {
            candle_core::bail!("hidden_size must be a positive multiple of num_attention_heads (both above 0)");
        }
        let e = vb.pp("embeddings");
        let positions = e
            .get((c.max_position_embeddings, c.hidden_size), "position_embeddings.weight")?
            .broadcast_add(
                &e.get((c.type_vocab_size, c.hidden_size), "token_type_embeddings.weight")?
                    .get(0)?,
            )?
            .flatten_all()?
            .to_vec1()?;
        let embeddings_norm = Norm::load(c.hidden_size, c.layer_norm_eps, e.pp("LayerNorm"))?;
        let scale = 1.0 / ((c.hidden_size / c.num_attention_heads) as f64).sqrt();
        let mut layers = Vec::with_capacity(c.num_hidden_layers);
        for i in 0..c.num_hidden_layers {
            let l = vb.pp(format!("encoder.layer.{i}"));
            let s = l.pp("attention.self");
            let (h, m) = (c.hidden_size, c.intermediate_size);
            let qkv = Dense::stacked(vec![
                dense.take(&s, "query", h, h)?.scaled(scale),
                dense.take(&s, "key", h, h)?,
                dense.take(&s, "value", h, h)?,
            ])?;
            layers.push(Layer {
                qkv,
                out: dense.take(&l, "attention.output.dense", h, h)?,
                attention_norm: Norm::load(c.hidden_size, c.layer_norm_eps, l.pp("attention.output.LayerNorm"))?,
                up: dense.take(&l, "intermediate.dense", h, m)?,
                down: dense.take(&l, "output.dense", m, h)?,
                output_norm: Norm::load(c.hidden_size, c.layer_norm_eps, l.pp("output.LayerNorm"))?,
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

    /// The mean of the last hidden states of one text's word pieces, with
    /// the caller's buffers.
    pub fn mean_pooled(&self, ids: &[u32], s: &mut Scratch) -> candle_core::Result<Vec<f32>> {
        let (n, hidden) = (ids.len(), self.hidden);
        if n == 0 {
            candle_core::bail!("no word pieces to encode");
        }
        let Some(positions) = self.positions.get(..n * hidden) else {
            candle_core::bail!(
                "{n} word pieces where the model has {} positions",
                self.positions.len() / hidden
            );
        };
        self.words.rows_into(ids, hidden, &mut s.x)?;
        self.embeddings_norm.of_sum(&mut s.x, positions)?;
        for l in &self.layers {
            l.qkv.forward_into(&s.x, &mut s.activations, &mut s.qkv)?;
            attention(&s.qkv, n, self.heads, &mut s.context, &mut s.scores, &mut s.sums)?;
            // y = LN(context·Wᵀ + b + x), then x = y.
            l.out.forward_into(&s.context, &mut s.activations, &mut s.y)?;
            l.attention_norm.of_sum(&mut s.y, &s.x)?;
            std::mem::swap(&mut s.x, &mut s.y);
            l.up.forward_into(&s.x, &mut s.activations, &mut s.up)?;
            crate::kernels::gelu(&mut s.up);
            l.down.forward_into(&s.up, &mut s.activations, &mut s.y)?;
            l.output_norm.of_sum(&mut s.y, &s.x)?;
            std::mem::swap(&mut s.x, &mut s.y);
        }
        let mut mean = vec![0f32; hidden];
        for row in s.x.chunks_exact(hidden) {
            mean.iter_mut().zip(row).for_each(|(m, v)| *m += v);
        }
        let count = n.max(1) as f32;
        mean.iter_mut().for_each(|m| *m /= count);
        Ok(mean)
    }
}

/// Threads for a product: candle's count (1 on the embedding worker's
/// threads, see `main::one_core_per_text`).
fn parallelism() -> gemm::Parallelism {
    match candle_core::utils::get_num_threads() {
        1 => gemm::Parallelism::None,
        threads => gemm::Parallelism::Rayon(threads),
    }
}

/// Self-attention of one text: from its n rows of Q (scaled by 1/√d), K and
/// V side by side (n × 3·hidden, heads of d columns each), the heads'
/// contexts side by side (n × hidden) into `context`.
///
/// One pass per head rather than candle's permute, two batched products,
/// softmax and transpose (softmax divides the context, not the scores): the
/// products read Q, K and V where they lie and write each head's context
/// into its columns (gemm takes strides), and a head's n × n scores live in
/// the caller's buffer (no copies, and no 4 MB of scores per layer
/// allocated, zeroed and freed for a 300-piece chunk).
fn attention(
    qkv: &[f32],
    n: usize,
    heads: usize,
    context: &mut Vec<f32>,
    scores: &mut Vec<f32>,
    sums: &mut Vec<f32>,
) -> candle_core::Result<()> {
    let width = qkv.len().checked_div(n).unwrap_or(0);
    if heads == 0 || width == 0 || !width.is_multiple_of(3 * heads) || width * n != qkv.len() {
        candle_core::bail!(
            "attention: {} values are not Q, K and V of {heads} heads in {n} rows",
            qkv.len()
        );
    }
    let (hidden, d) = (width / 3, width / 3 / heads);
    // Sized, not cleared: each head's product writes its columns.
    context.resize(n * hidden, 0.0);
    scores.resize(n * n, 0.0);
    sums.resize(n, 0.0);
    let parallelism = parallelism();
    let (n_i, width_i, hidden_i) = (n as isize, width as isize, hidden as isize);
    for head in 0..heads {
        // SAFETY (both products): every matrix lies inside its buffer: Q, K
        // and V of this head are n rows of d values, `width` apart, from
        // columns head·d, hidden + head·d and 2·hidden + head·d of `qkv`
        // (n × width); the scores are n × n; the context is n rows of d
        // values, `hidden` apart, from column head·d of `context`
        // (n × hidden).
        let q = qkv[head * d..].as_ptr();
        let (k, v) = (qkv[hidden + head * d..].as_ptr(), qkv[2 * hidden + head * d..].as_ptr());
        // scores = Q·Kᵀ (Kᵀ: K read with its strides swapped).
        unsafe {
            product(
                n,
                n,
                d,
                (scores.as_mut_ptr(), n_i),
                (q, width_i, 1),
                (k, 1, width_i),
                parallelism,
            )
        };
        crate::kernels::exp_rows(&mut scores[..n * n], n, sums);
        // context = exp(scores)·V, into this head's columns …
        unsafe {
            product(
                n,
                d,
                n,
                (context[head * d..].as_mut_ptr(), hidden_i),
                (scores.as_ptr(), n_i, 1),
                (v, width_i, 1),
                parallelism,
            )
        };
        // … divided by the row's sum (softmax's division, on n × d values
        // rather than n × n).
        for (row, sum) in context.chunks_exact_mut(hidden).zip(sums.iter()) {
            let inverse = 1.0 / sum;
            row[head * d..(head + 1) * d].iter_mut().for_each(|c| *c *= inverse);
        }
    }
    Ok(())
}

/// dst = lhs · rhs for an m × k `lhs` and a k × n `rhs`, each given as its
/// first element, row stride and column stride (`dst`: first element and
/// row stride, columns adjacent), through gemm on this thread or candle's
/// thread count.
///
/// # Safety
/// Every element the strides reach lies inside its buffer.
unsafe fn product(
    m: usize,
    n: usize,
    k: usize,
    dst: (*mut f32, isize),
    lhs: (*const f32, isize, isize),
    rhs: (*const f32, isize, isize),
    parallelism: gemm::Parallelism,
) {
    // SAFETY: the caller's (gemm reads and writes only what the strides reach).
    unsafe {
        gemm::gemm(
            m,
            n,
            k,
            dst.0,
            1,
            dst.1,
            false,
            lhs.0,
            lhs.2,
            lhs.1,
            rhs.0,
            rhs.2,
            rhs.1,
            0.0,
            1.0,
            false,
            false,
            false,
            parallelism,
        )
    }
}

/// A LayerNorm that takes the sum before it too (BERT adds each residual
/// connection and normalizes the sum): one pass where candle has an
/// addition and a norm whose sums are single chains of dependent additions.
struct Norm {
    weight: Vec<f32>,
    bias: Vec<f32>,
    eps: f32,
}

impl Norm {
    fn load(size: usize, eps: f64, vb: VarBuilder) -> candle_core::Result<Norm> {
        Ok(Norm {
            weight: vb.get(size, "weight")?.to_vec1()?,
            bias: vb.get(size, "bias")?.to_vec1()?,
            eps: eps as f32,
        })
    }

    /// a = LayerNorm(a + b), row by row.
    fn of_sum(&self, a: &mut [f32], b: &[f32]) -> candle_core::Result<()> {
        if a.len() != b.len() || !a.len().is_multiple_of(self.weight.len()) {
            candle_core::bail!(
                "norm: {} + {} values are not rows of {}",
                a.len(),
                b.len(),
                self.weight.len()
            );
        }
        crate::kernels::add_layer_norm(a, b, &self.weight, &self.bias, self.eps);
        Ok(())
    }
}

/// The unit vector of `v` (L2-normalized; a zero vector stays zero).
pub fn normalized(mut v: Vec<f32>) -> Vec<f32> {
    let norm = super::dot(&v, &v).sqrt().max(1e-12);
    v.iter_mut().for_each(|x| *x /= norm);
    v
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use candle_core::{DType, Device, Tensor};

    use super::*;

    /// A 2-layer BERT of random f32 weights (xorshift, fixed seed): hidden
    /// 64, 4 heads, intermediate 128, 100 word pieces, 40 positions.
    fn tiny() -> Bert {
        let c = Config {
            vocab_size: 100,
            hidden_size: 64,
            num_hidden_layers: 2,
            num_attention_heads: 4,
            intermediate_size: 128,
            max_position_embeddings: 40,
            type_vocab_size: 2,
            layer_norm_eps: 1e-12,
            hidden_act: "gelu".into(),
        };
        let mut seed = 0x9e37_79b9_7f4a_7c15u64;
        let mut random = |shape: &[usize]| {
            let n: usize = shape.iter().product();
            let v: Vec<f32> = (0..n)
                .map(|_| {
                    seed ^= seed << 13;
                    seed ^= seed >> 7;
                    seed ^= seed << 17;
                    (seed % 2001) as f32 / 1000.0 - 1.0
                })
                .collect();
            Tensor::from_vec(v, shape, &Device::Cpu).unwrap()
        };
        let (h, m) = (c.hidden_size, c.intermediate_size);
        let mut t: HashMap<String, Tensor> = HashMap::new();
        t.insert("embeddings.word_embeddings.weight".into(), random(&[c.vocab_size, h]));
        t.insert(
            "embeddings.position_embeddings.weight".into(),
            random(&[c.max_position_embeddings, h]),
        );
        t.insert("embeddings.token_type_embeddings.weight".into(), random(&[2, h]));
        let mut norms = vec!["embeddings.LayerNorm".to_string()];
        for i in 0..c.num_hidden_layers {
            let l = format!("encoder.layer.{i}");
            norms.push(format!("{l}.attention.output.LayerNorm"));
            norms.push(format!("{l}.output.LayerNorm"));
            for (name, outputs, inputs) in [
                ("attention.self.query", h, h),
                ("attention.self.key", h, h),
                ("attention.self.value", h, h),
                ("attention.output.dense", h, h),
                ("intermediate.dense", m, h),
                ("output.dense", h, m),
            ] {
                t.insert(format!("{l}.{name}.weight"), random(&[outputs, inputs]));
                t.insert(format!("{l}.{name}.bias"), random(&[outputs]));
            }
        }
        for at in norms {
            t.insert(format!("{at}.weight"), random(&[h]));
            t.insert(format!("{at}.bias"), random(&[h]));
        }
        Bert::load(VarBuilder::from_tensors(t, DType::F32, &Device::Cpu), &c).unwrap()
    }

    #[test]
    fn reused_buffers_give_what_fresh_ones_give() {
        let bert = tiny();
        let mut kept = Scratch::default();
        // Longer, shorter, longest, one piece: nothing of a previous text
        // may show through.
        for n in [7, 2, 40, 1, 33] {
            let ids: Vec<u32> = (0..n as u32).map(|i| (i * 37 + 5) % 100).collect();
            let reused = bert.mean_pooled(&ids, &mut kept).unwrap();
            let fresh = bert.mean_pooled(&ids, &mut Scratch::default()).unwrap();
            assert_eq!(reused.len(), 64);
            assert!(reused.iter().all(|v| v.is_finite()), "{n} pieces");
            assert_eq!(reused, fresh, "{n} pieces");
        }
    }

    #[test]
    fn a_text_the_model_cannot_read_is_an_error_not_a_panic() {
        let bert = tiny();
        let mut s = Scratch::default();
        assert!(bert.mean_pooled(&[], &mut s).is_err(), "no pieces");
        assert!(
            bert.mean_pooled(&[1, 100], &mut s).is_err(),
            "an id outside the vocabulary"
        );
        assert!(bert.mean_pooled(&[1, u32::MAX], &mut s).is_err(), "the largest id");
        assert!(
            bert.mean_pooled(&[1; 41], &mut s).is_err(),
            "more pieces than positions"
        );
        // The buffers still serve the next text.
        assert_eq!(
            bert.mean_pooled(&[1, 2, 3], &mut s).unwrap(),
            bert.mean_pooled(&[1, 2, 3], &mut Scratch::default()).unwrap()
        );
    }
}
