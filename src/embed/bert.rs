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

use candle_core::{CpuStorage, CustomOp1, CustomOp2, DType, Device, Layout, Module, Shape, Tensor, D};
use candle_nn::{embedding, Embedding, VarBuilder};

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
    F32 { wt: Tensor, b: Tensor },
    Int8(mnemosyne_kernels::int8::Matrix),
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
            mnemosyne_kernels::int8::Matrix::stacked(ms).map_err(|e| candle_core::Error::Msg(e.to_string()))?,
        ))
    }

    fn forward(&self, x: &Tensor) -> candle_core::Result<Tensor> {
        match self {
            Dense::F32 { wt, b } => x.matmul(wt)?.broadcast_add(b),
            Dense::Int8(m) => {
                let (rows, inputs) = x.dims2()?;
                if inputs != m.inputs() {
                    candle_core::bail!("dense: {inputs} inputs where the layer takes {}", m.inputs());
                }
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
    Q4(std::collections::HashMap<String, mnemosyne_kernels::int8::Matrix>),
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
    embeddings_norm: Norm,
    layers: Vec<Layer>,
    heads: usize,
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
        let embeddings_norm = Norm::load(c.hidden_size, c.layer_norm_eps, e.pp("LayerNorm"))?;
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
        })
    }

    /// The mean of the last hidden states of one text's word pieces.
    pub fn mean_pooled(&self, ids: &[u32]) -> candle_core::Result<Tensor> {
        let n = ids.len();
        let h = self.heads;
        let raw = ids;
        let ids = Tensor::from_slice(ids, n, &Device::Cpu)?;
        let words = self.words.rows(&ids, raw)?;
        let mut x = self.embeddings_norm.of_sum(&words, &self.positions.narrow(0, 0, n)?)?;
        for l in &self.layers {
            let context = l.qkv.forward(&x)?.apply_op1_no_bwd(&Attention { heads: h })?;
            let a = l.attention_norm.of_sum(&l.out.forward(&context)?, &x)?;
            let up = l.up.forward(&a)?.apply_op1_no_bwd(&Gelu)?;
            x = l.output_norm.of_sum(&l.down.forward(&up)?, &a)?;
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

/// Self-attention of one text: from its rows of Q (scaled by 1/√d), K and V
/// side by side (n × 3·hidden, heads of d columns each), the heads' contexts
/// side by side (n × hidden).
///
/// One op rather than candle's permute, two batched products, softmax and
/// transpose (softmax divides the context, not the scores): the products read Q, K and V where they lie and write each
/// head's context into its columns (gemm takes strides), and a head's n × n
/// scores live in a buffer each thread keeps (no copies, and no 4 MB of
/// scores per layer allocated, zeroed and freed for a 300-piece chunk).
struct Attention {
    heads: usize,
}

thread_local! {
    /// One head's attention scores (n × n), kept between calls.
    static SCORES: std::cell::RefCell<Vec<f32>> = const { std::cell::RefCell::new(Vec::new()) };
}

impl CustomOp1 for Attention {
    fn name(&self) -> &'static str {
        "self-attention"
    }

    fn cpu_fwd(&self, storage: &CpuStorage, layout: &Layout) -> candle_core::Result<(CpuStorage, Shape)> {
        let qkv = contiguous_f32("attention", storage, layout)?;
        let (n, width) = layout.shape().dims2()?;
        if self.heads == 0 || width == 0 || !width.is_multiple_of(3 * self.heads) {
            candle_core::bail!("attention: {width} columns are not Q, K and V of {} heads", self.heads);
        }
        let (hidden, d) = (width / 3, width / 3 / self.heads);
        let mut context = vec![0f32; n * hidden];
        if n == 0 {
            return Ok((CpuStorage::F32(context), Shape::from((n, hidden))));
        }
        let parallelism = match candle_core::utils::get_num_threads() {
            1 => gemm::Parallelism::None,
            threads => gemm::Parallelism::Rayon(threads),
        };
        let (n_i, width_i, hidden_i) = (n as isize, width as isize, hidden as isize);
        // Each row's sum of exponentials, for one head.
        let mut sums = vec![0f32; n];
        // The thread's buffer, or (should this thread already be inside
        // this op, e.g. a rayon worker that took another text while gemm
        // waited) one of its own.
        SCORES.with(|kept| {
            let mut own = Vec::new();
            let mut kept = kept.try_borrow_mut();
            let scores = match kept.as_deref_mut() {
                Ok(v) => v,
                Err(_) => &mut own,
            };
            scores.resize(n * n, 0.0);
            for head in 0..self.heads {
                // SAFETY (both products): every matrix lies inside its
                // buffer: Q, K and V of this head are n rows of d values,
                // `width` apart, from columns head·d, hidden + head·d and
                // 2·hidden + head·d of `qkv` (n × width); the scores are
                // n × n; the context is n rows of d values, `hidden` apart,
                // from column head·d of `context` (n × hidden).
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
                mnemosyne_kernels::exp_rows(&mut scores[..n * n], n.max(1), &mut sums);
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
                // … divided by the row's sum (softmax's division, on n × d
                // values rather than n × n).
                for (row, sum) in context.chunks_exact_mut(hidden).zip(&sums) {
                    let inverse = 1.0 / sum;
                    row[head * d..(head + 1) * d].iter_mut().for_each(|c| *c *= inverse);
                }
            }
        });
        Ok((CpuStorage::F32(context), Shape::from((n, hidden))))
    }
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
/// connection and normalizes the sum): one op where candle has an addition
/// and a norm whose sums are single chains of dependent additions.
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

    /// LayerNorm(a + b), row by row.
    fn of_sum(&self, a: &Tensor, b: &Tensor) -> candle_core::Result<Tensor> {
        a.contiguous()?.apply_op2_no_bwd(&b.contiguous()?, self)
    }
}

impl CustomOp2 for Norm {
    fn name(&self) -> &'static str {
        "add-layer-norm"
    }

    fn cpu_fwd(
        &self,
        s1: &CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
    ) -> candle_core::Result<(CpuStorage, Shape)> {
        let (a, b) = (contiguous_f32("norm", s1, l1)?, contiguous_f32("norm", s2, l2)?);
        if l1.shape() != l2.shape() || l1.dims().last() != Some(&self.weight.len()) {
            candle_core::bail!(
                "norm: {:?} + {:?} rows are not {} wide",
                l1.dims(),
                l2.dims(),
                self.weight.len()
            );
        }
        let out = mnemosyne_kernels::add_layer_norm(a, b, &self.weight, &self.bias, self.eps);
        Ok((CpuStorage::F32(out), l1.shape().clone()))
    }
}

/// BERT's exact GELU, x·Φ(x) = x/2·(1 + erf(x/√2)), with a rational `erf`.
struct Gelu;

impl CustomOp1 for Gelu {
    fn name(&self) -> &'static str {
        "gelu-erf-rational"
    }

    fn cpu_fwd(&self, storage: &CpuStorage, layout: &Layout) -> candle_core::Result<(CpuStorage, Shape)> {
        let v = contiguous_f32("gelu", storage, layout)?;
        let out = mnemosyne_kernels::gelu(v);
        Ok((CpuStorage::F32(out), layout.shape().clone()))
    }
}

/// The unit vector of `v` (L2-normalized; a zero vector stays zero).
pub fn normalized(v: &Tensor) -> candle_core::Result<Vec<f32>> {
    let v = v.to_dtype(DType::F32)?;
    let norm = v.sqr()?.sum_keepdim(D::Minus1)?.sqrt()?.clamp(1e-12f32, f32::MAX)?;
    v.broadcast_div(&norm)?.to_vec1::<f32>()
}
