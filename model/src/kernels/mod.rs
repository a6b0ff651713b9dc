//! The numeric kernels of Mnemosyne's in-process embedding models: the
//! integer products of a 4-bit model's dense layers (`int8`), softmax's
//! exponentials and GELU with an `exp` and an `erf` that vectorize, each
//! compiled for the widest vector unit the CPU has.
//!
//! The workspace's test profile optimizes this crate (the tests embed with
//! these kernels; unoptimized, intrinsics are calls): see the root
//! Cargo.toml's `profile.dev.package.mnemosyne-model`.

/// Defines `fn $name` whose body is compiled for the widest vector unit the
/// CPU has: AVX-512, else AVX2 with FMA (checked at run time), else the
/// baseline. The crate is built for baseline x86-64, whose loops run 4 lanes
/// wide; the body and what it inlines (`exp`, `erf`) are compiled again
/// inside each version.
macro_rules! widest {
    ($(#[$m:meta])* $vis:vis fn $name:ident($($a:ident: $t:ty),*) $(-> $r:ty)? $body:block) => {
        $(#[$m])*
        $vis fn $name($($a: $t),*) $(-> $r)? {
            #[inline(always)]
            fn body($($a: $t),*) $(-> $r)? $body
            #[cfg(target_arch = "x86_64")]
            {
                #[target_feature(enable = "avx512f")]
                fn avx512($($a: $t),*) $(-> $r)? {
                    body($($a),*)
                }
                #[target_feature(enable = "avx2,fma")]
                fn avx2($($a: $t),*) $(-> $r)? {
                    body($($a),*)
                }
                if std::arch::is_x86_feature_detected!("avx512f") {
                    // SAFETY: the CPU has AVX-512F (checked on the line above).
                    return unsafe { avx512($($a),*) };
                }
                if std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("fma") {
                    // SAFETY: the CPU has AVX2 and FMA (checked on the line above).
                    return unsafe { avx2($($a),*) };
                }
            }
            body($($a),*)
        }
    };
}

pub mod int8;

widest! {
    /// Softmax of each `width`-long row of `v` but for its division: each
    /// value becomes e^(value − the row's maximum), in place, and `sums`
    /// gets each row's sum. The caller divides where it is cheaper
    /// (attention: the n × d context rather than the n × n scores).
    pub fn exp_rows(v: &mut [f32], width: usize, sums: &mut [f32]) {
        // A `for` loop, not `for_each`: the library's fold would be a
        // function of its own, compiled for the baseline.
        for (row, sum) in v.chunks_exact_mut(width).zip(sums.iter_mut()) {
            *sum = exp_row(row);
        }
    }
}

widest! {
    /// BERT's exact GELU of each value, x·Φ(x) = x/2·(1 + erf(x/√2)), in
    /// place.
    pub fn gelu(v: &mut [f32]) {
        // A loop, not `for_each`: the closure would be a function of its
        // own, compiled for the baseline.
        for x in v.iter_mut() {
            *x = 0.5 * *x * (1.0 + erf(*x * std::f32::consts::FRAC_1_SQRT_2));
        }
    }
}

widest! {
    /// LayerNorm of `a + b` (a residual connection and the norm after it),
    /// into `a`, row by row, rows as long as `weight`: each row less its
    /// mean, over √(its variance + eps), times `weight`, plus `bias`. Mean
    /// and variance in two passes and `LANES` partial sums (candle's own
    /// takes Σx and Σx² in single chains of dependent additions, 3 % of an
    /// e5 chunk). Values past the shorter of `a` and `b` are left alone.
    pub fn add_layer_norm(a: &mut [f32], b: &[f32], weight: &[f32], bias: &[f32], eps: f32) {
        let n = a.len().min(b.len());
        let (a, width) = (&mut a[..n], weight.len().max(1));
        for (x, y) in a.iter_mut().zip(b) {
            *x += y;
        }
        layer_norm_rows(a, width, weight, bias, eps);
    }
}

widest! {
    /// LayerNorm of `a` in place, row by row, rows as long as `weight` (as
    /// `add_layer_norm`, with no residual to add first).
    pub fn layer_norm(a: &mut [f32], weight: &[f32], bias: &[f32], eps: f32) {
        layer_norm_rows(a, weight.len().max(1), weight, bias, eps);
    }
}

/// Each row of `width` values of `a`: less its mean, over √(its variance +
/// eps), times `weight`, plus `bias`.
#[inline(always)]
fn layer_norm_rows(a: &mut [f32], width: usize, weight: &[f32], bias: &[f32], eps: f32) {
    for row in a.chunks_exact_mut(width) {
        let mean = lane_sum(row, |x| x) / width as f32;
        let variance = lane_sum(row, |x| (x - mean) * (x - mean)) / width as f32;
        let inverse = 1.0 / (variance + eps).sqrt();
        for ((x, w), c) in row.iter_mut().zip(weight).zip(bias) {
            *x = (*x - mean) * inverse * w + c;
        }
    }
}

/// Σ f(x) over a row in `LANES` partial sums (they vectorize; one running
/// sum is a chain of dependent additions).
#[inline(always)]
fn lane_sum(row: &[f32], f: impl Fn(f32) -> f32) -> f32 {
    let (blocks, rest) = row.as_chunks::<LANES>();
    let mut sums = [0f32; LANES];
    for b in blocks {
        for (s, x) in sums.iter_mut().zip(b) {
            *s += f(*x);
        }
    }
    sums.iter().sum::<f32>() + rest.iter().map(|x| f(*x)).sum::<f32>()
}

/// Lanes of the partial maxima and sums below (an AVX-512 register).
const LANES: usize = 16;

/// One row of `exp_rows`: e^(x − max) in place, and their sum. The maximum
/// and the sum are taken in `LANES` partial results, so that they vectorize
/// like the `exp` (a single running sum is a chain of dependent additions);
/// the sum is taken as each value is written (one pass, not two).
#[inline(always)]
fn exp_row(row: &mut [f32]) -> f32 {
    let (blocks, rest) = row.as_chunks::<LANES>();
    let mut maxima = [f32::NEG_INFINITY; LANES];
    for b in blocks {
        for (m, x) in maxima.iter_mut().zip(b) {
            *m = m.max(*x);
        }
    }
    let max = rest.iter().chain(&maxima).copied().fold(f32::NEG_INFINITY, f32::max);
    let (blocks, rest) = row.as_chunks_mut::<LANES>();
    let mut sums = [0f32; LANES];
    for b in blocks {
        for (s, x) in sums.iter_mut().zip(b) {
            *x = exp(*x - max);
            *s += *x;
        }
    }
    let mut tail = 0f32;
    for x in rest {
        *x = exp(*x - max);
        tail += *x;
    }
    sums.iter().sum::<f32>() + tail
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

#[cfg(test)]
mod tests {
    use super::{add_layer_norm, erf, exp, exp_rows, gelu, layer_norm};

    #[test]
    fn layer_norm_of_a_sum_matches_the_plain_formula() {
        // Rows of 40 (two blocks of lanes and a tail), far from 0 (a mean of
        // ~1,000 tests the two passes).
        let width = 40;
        let a: Vec<f32> = (0..3 * width)
            .map(|i| 1000.0 + ((i * 7919 % 211) as f32) / 13.0)
            .collect();
        let b: Vec<f32> = (0..3 * width)
            .map(|i| ((i * 104_729 % 97) as f32 - 48.0) / 5.0)
            .collect();
        let weight: Vec<f32> = (0..width).map(|i| 0.5 + i as f32 / 40.0).collect();
        let bias: Vec<f32> = (0..width).map(|i| i as f32 / 100.0 - 0.2).collect();
        let mut got = a.clone();
        add_layer_norm(&mut got, &b, &weight, &bias, 1e-12);
        // The norm alone, of the sum added beforehand: the same bits.
        let mut sum: Vec<f32> = a.iter().zip(&b).map(|(x, y)| x + y).collect();
        layer_norm(&mut sum, &weight, &bias, 1e-12);
        assert_eq!(sum, got);
        for r in 0..3 {
            let row: Vec<f64> = (0..width)
                .map(|t| f64::from(a[r * width + t]) + f64::from(b[r * width + t]))
                .collect();
            let mean = row.iter().sum::<f64>() / width as f64;
            let var = row.iter().map(|x| (x - mean) * (x - mean)).sum::<f64>() / width as f64;
            for t in 0..width {
                let want = (row[t] - mean) / (var + 1e-12).sqrt() * f64::from(weight[t]) + f64::from(bias[t]);
                let diff = (f64::from(got[r * width + t]) - want).abs();
                assert!(diff < 1e-4, "row {r}, value {t}: {} against {want}", got[r * width + t]);
            }
        }
    }

    #[test]
    fn gelu_in_place_is_x_times_phi_of_x() {
        // 37 values: two blocks of 16 lanes and a tail.
        let x: Vec<f32> = (0..37).map(|i| (i as f32 - 18.0) / 3.0).collect();
        let mut v = x.clone();
        gelu(&mut v);
        for (got, x) in v.iter().zip(&x) {
            let want = 0.5 * f64::from(*x) * (1.0 + libm_erf(f64::from(*x) / 2f64.sqrt()));
            assert!((f64::from(*got) - want).abs() < 1e-5, "gelu({x}) = {got}, not {want}");
        }
    }

    #[test]
    fn exp_rows_divided_by_their_sums_are_the_softmax() {
        // Rows of 37: two blocks of 16 lanes and a tail of 5.
        let width = 37;
        let mut v: Vec<f32> = (0..3 * width).map(|i| ((i * 7919 % 101) as f32 - 50.0) / 7.0).collect();
        v[width + 3] = 90.0; // one value far above the rest of its row
        let original = v.clone();
        let mut sums = [0f32; 3];
        exp_rows(&mut v, width, &mut sums);
        for (r, row) in original.chunks_exact(width).enumerate() {
            let max = row.iter().copied().fold(f64::NEG_INFINITY, |m, x| m.max(f64::from(x)));
            let total: f64 = row.iter().map(|&x| (f64::from(x) - max).exp()).sum();
            for (t, &x) in row.iter().enumerate() {
                let want = (f64::from(x) - max).exp() / total;
                let got = f64::from(v[r * width + t]) / f64::from(sums[r]);
                assert!((got - want).abs() < 1e-6, "row {r}, value {t}: {got} against {want}");
            }
        }
        assert_eq!(v[width + 3], 1.0, "the maximum's exponential is 1");
    }

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
