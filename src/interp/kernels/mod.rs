//! The interpreter's own numeric kernels: `exp`, softmax over a row (and
//! its exponentials-and-sum step, which the fused attention chain calls
//! once it knows a row's maximum), gelu's tanh approximation, the logistic
//! function (MIL's `sigmoid`), SiLU and a transpose.
//!
//! They share no code with the fp32 tower's kernels on purpose: the gates
//! compare that tower with the interpreter, so a bug the two sides shared
//! would cancel out. The formulations differ accordingly:
//!
//! - `exp(x) = 2^n e^r` with `n` the nearest integer to `x log2(e)` (an
//!   explicit round-to-nearest-even), `r = x - n ln 2` by the fdlibm split
//!   of `ln 2` (a 15-bit head, so `n * head` is exact), `e^r` by its Taylor
//!   series to degree 7 in Horner form (the truncation error is below
//!   `r^8/8! e^r < 8e-9` relative for `|r| <= ln 2 / 2`), and `2^n` applied
//!   by adding `n` to the exponent field of `e^r`: within 1.25 ulp of the
//!   exact value (1.22 at worst over every f32). Below [`EXP_LO`] the
//!   result is exactly 0, and it is never subnormal: a subnormal operand or
//!   result costs x86 cores a microcode assist of about a hundred cycles,
//!   and the fused attention chain skips the keys whose probabilities are
//!   exactly 0 (masked keys, -1e4 and below). Above [`EXP_HI`] it is
//!   `+inf`; NaN stays NaN.
//! - gelu's tanh approximation as a logistic function:
//!   `0.5 x (1 + tanh(u)) = x / (1 + e^(-2u))`, with
//!   `u = sqrt(2/pi)(x + 0.044715 x^3)`.
//! - exact gelu, `0.5 x (1 + erf(x / sqrt 2))`, by a polynomial for
//!   `erf(z) / z` where `|z| < 1` and `e^(-z^2)` times a polynomial in
//!   `1/|z|` for `erfc(|z|)` beyond, so that `1 + erf(z)` never cancels
//!   (see [`gelu_erf1`]).
//! - the logistic function as `1 / (1 + e^(-x))`, SiLU as `x / (1 + e^(-x))`.
//! - softmax keeps its sum in 16 lanes (element `i` in lane `i % 16`),
//!   reduced pairwise (`lane i + lane i+8`, then `+4`, `+2`, `+1`), and
//!   normalises by multiplying with `1 / sum`.
//!
//! exp, softmax, both gelus, the logistic function and SiLU each have a portable version and, on x86-64, AVX2
//! and AVX-512F ones chosen at run time ([`Isa::best`]). The three perform
//! the same f32 operations in the same order (no fused multiply-add; the
//! same lanes and reduction tree; tails through masked loads, not a scalar
//! loop), so they give the same bits: the fused attention chain (AVX-512 or AVX2)
//! and the op-by-op softmax agree bit for bit on every machine.

use rayon::prelude::*;

/// A raw pointer that rayon tasks may share; every user writes disjoint
/// ranges, and all tasks finish before the buffer is read.
#[derive(Clone, Copy)]
pub struct SendPtr(pub *mut f32);
// SAFETY: only used to write disjoint regions of one buffer from parallel
// tasks that all finish before the buffer is read.
unsafe impl Send for SendPtr {}
unsafe impl Sync for SendPtr {}

impl SendPtr {
    /// The pointer (a method, so closures capture the whole `SendPtr`).
    pub fn get(self) -> *mut f32 {
        self.0
    }
}

/// An instruction set a kernel runs with.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
pub enum Isa {
    Portable,
    /// x86-64 with AVX2 (8 lanes).
    Avx2,
    /// x86-64 with AVX-512F (16 lanes).
    Avx512,
}

impl Isa {
    /// The widest instruction set this CPU has (AVX2 at most where
    /// `ANE_EXPORT_CPU=avx2` asks: [`crate::blas::avx512`]).
    pub fn best() -> Isa {
        #[cfg(target_arch = "x86_64")]
        {
            if crate::blas::avx512() {
                return Isa::Avx512;
            }
            if std::arch::is_x86_feature_detected!("avx2") {
                return Isa::Avx2;
            }
        }
        Isa::Portable
    }

    /// Whether this CPU can run the kernels of `self`.
    pub fn runs_here(self) -> bool {
        match self {
            Isa::Portable => true,
            #[cfg(target_arch = "x86_64")]
            Isa::Avx2 => std::arch::is_x86_feature_detected!("avx2"),
            #[cfg(target_arch = "x86_64")]
            Isa::Avx512 => std::arch::is_x86_feature_detected!("avx512f"),
            #[cfg(not(target_arch = "x86_64"))]
            _ => false,
        }
    }
}

/// Below this, `exp` is exactly 0. `e^-87.3 = 1.22e-38` is still a normal
/// f32 (the smallest is `1.18e-38 = e^-87.34`), so no result is subnormal.
pub const EXP_LO: f32 = -87.3;
/// The largest f32 below `128 ln 2` (`0x42b17217`): `e^x` is finite up to
/// here (3.40280e38) and beyond f32's range from the next f32 on.
pub const EXP_HI: f32 = 88.722_83;
const LOG2E: f32 = std::f32::consts::LOG2_E;
/// `ln 2 = LN2_HEAD + LN2_TAIL` (fdlibm's split): the head has 15
/// significant bits, so `n * LN2_HEAD` is exact for `|n| <= 256`.
const LN2_HEAD: f32 = 0.693_145_75; // 0x3f317200
const LN2_TAIL: f32 = 1.428_606_8e-6; // 0x35bfbe8e
/// Horner coefficients of `e^r = 1 + r(1 + r(1/2! + r(1/3! + ... + r/7!)))`,
/// innermost first.
const TAYLOR: [f32; 8] = [
    1.0 / 5040.0,
    1.0 / 720.0,
    1.0 / 120.0,
    1.0 / 24.0,
    1.0 / 6.0,
    1.0 / 2.0,
    1.0,
    1.0,
];

/// `e^x` in f32, within 1.25 ulp of the exact value on `[EXP_LO, EXP_HI]`
/// (1.22 at worst over every f32 there; see the module notes); 0 below,
/// `+inf` above, NaN for NaN.
#[inline(always)]
pub fn exp(x: f32) -> f32 {
    // NaN passes through clamp (f32::max would drop it).
    let xc = x.clamp(EXP_LO, EXP_HI);
    let n = (xc * LOG2E).round_ties_even();
    let r = (xc - n * LN2_HEAD) - n * LN2_TAIL;
    let mut p = TAYLOR[0];
    for &k in &TAYLOR[1..] {
        p = p * r + k;
    }
    // 2^n by the exponent field: e^r lies in [0.70, 1.42] and n in
    // [-126, 128], so the exponent stays in [1, 254] (NaN: `as` gives 0).
    let e = f32::from_bits(p.to_bits().wrapping_add(((n as i32) << 23) as u32));
    if x < EXP_LO {
        0.0
    } else if x > EXP_HI {
        f32::INFINITY
    } else {
        e
    }
}

/// The sum of 16 lane sums, pairwise: `lane i + lane i+8`, then `+4`, `+2`, `+1`.
#[inline(always)]
fn sum16(lanes: &[f32; 16]) -> f32 {
    let mut a = *lanes;
    for w in [8, 4, 2, 1] {
        for i in 0..w {
            a[i] += a[i + w];
        }
    }
    a[0]
}

/// The maximum of a row as `f32::max` folds it: NaN is passed over
/// (an all-NaN or empty row gives `-inf`).
fn row_max(isa: Isa, row: &[f32]) -> f32 {
    assert!(isa.runs_here(), "{isa:?} kernels on a CPU without them");
    match isa {
        // SAFETY: the CPU has AVX-512F (asserted just above).
        #[cfg(target_arch = "x86_64")]
        Isa::Avx512 => unsafe { x86::row_max_avx512(row) },
        // SAFETY: the CPU has AVX2 (asserted just above).
        #[cfg(target_arch = "x86_64")]
        Isa::Avx2 => unsafe { x86::row_max_avx2(row) },
        _ => row.iter().fold(f32::NEG_INFINITY, |a, &b| a.max(b)),
    }
}

/// The softmax numerator in place, `row[i] = exp(row[i] - max)`; returns
/// `1 / sum(row)`, the sum taken in 16 lanes (see the module notes).
fn exp_shift_inv_sum(isa: Isa, row: &mut [f32], max: f32) -> f32 {
    assert!(isa.runs_here(), "{isa:?} kernels on a CPU without them");
    match isa {
        // SAFETY: the CPU has AVX-512F (asserted just above).
        #[cfg(target_arch = "x86_64")]
        Isa::Avx512 => unsafe { x86::exp_shift_inv_sum_avx512(row, max) },
        // SAFETY: the CPU has AVX2 (asserted just above).
        #[cfg(target_arch = "x86_64")]
        Isa::Avx2 => unsafe { x86::exp_shift_inv_sum_avx2(row, max) },
        _ => {
            let mut lanes = [0f32; 16];
            for (i, v) in row.iter_mut().enumerate() {
                *v = exp(*v - max);
                lanes[i % 16] += *v;
            }
            1.0 / sum16(&lanes)
        }
    }
}

/// Softmax of one row in place: `exp(x - max) * (1 / sum)`, with
/// [`row_max`] and [`exp_shift_inv_sum`] (so the bits are those of the
/// fused chain, which calls the latter with its own maximum).
pub fn softmax_in_place(row: &mut [f32]) {
    softmax_with(Isa::best(), row)
}

fn softmax_with(isa: Isa, row: &mut [f32]) {
    let max = row_max(isa, row);
    let inv = exp_shift_inv_sum(isa, row, max);
    match isa {
        // SAFETY: the CPU has AVX-512F (asserted by row_max above).
        #[cfg(target_arch = "x86_64")]
        Isa::Avx512 => unsafe { x86::scale_avx512(row, inv) },
        // SAFETY: the CPU has AVX2 (asserted by row_max above).
        #[cfg(target_arch = "x86_64")]
        Isa::Avx2 => unsafe { x86::scale_avx2(row, inv) },
        _ => row.iter_mut().for_each(|v| *v *= inv),
    }
}

/// `-2 sqrt(2/pi)` and `-2 sqrt(2/pi) 0.044715`: `-2u = x (GELU_A + GELU_B x^2)`.
const SQRT_2_OVER_PI: f64 = std::f64::consts::FRAC_2_SQRT_PI * std::f64::consts::FRAC_1_SQRT_2;
const GELU_A: f32 = (-2.0 * SQRT_2_OVER_PI) as f32;
const GELU_B: f32 = (-2.0 * SQRT_2_OVER_PI * 0.044715) as f32;

/// gelu's tanh approximation, `0.5 x (1 + tanh(u)) = x / (1 + e^(-2u))`.
#[inline(always)]
pub fn gelu_tanh1(x: f32) -> f32 {
    let z = x * (GELU_A + GELU_B * (x * x));
    x / (1.0 + exp(z))
}

/// [`gelu_tanh1`] of every value, over all cores.
pub fn gelu_tanh(x: &[f32]) -> Vec<f32> {
    elementwise(x, gelu_tanh_with)
}

/// The logistic function, `1 / (1 + e^(-x))`, with [`exp`].
#[inline(always)]
pub fn sigmoid1(x: f32) -> f32 {
    1.0 / (1.0 + exp(-x))
}

/// [`sigmoid1`] of every value, over all cores.
pub fn sigmoid(x: &[f32]) -> Vec<f32> {
    elementwise(x, sigmoid_with)
}

/// SiLU, `x / (1 + e^(-x))`, with [`exp`].
#[inline(always)]
pub fn silu1(x: f32) -> f32 {
    x / (1.0 + exp(-x))
}

/// [`silu1`] of every value, over all cores.
pub fn silu(x: &[f32]) -> Vec<f32> {
    elementwise(x, silu_with)
}

/// `erf(z) / z` for `|z| < 1` as a polynomial in `z^2`, lowest degree first
/// (least squares on Chebyshev nodes of `[0, 1]`: within 1.4e-9 of it).
/// The first is the fit's, one f32 below `2 / sqrt(pi)`'s nearest.
#[allow(clippy::approx_constant)]
const ERF_NEAR: [f32; 7] = [
    1.128_379_1,
    -0.376_126_26,
    0.112_835_97,
    -0.026_854_329,
    0.005_189_312_6,
    -0.000_801_885_9,
    7.8825e-5,
];
/// `erfc(a) e^(a^2)` for `1 <= a <= 10` as a polynomial in
/// `t = (1/a - ERFC_MID) ERFC_SCALE` (`1/a` over `[0.1, 1]` mapped to
/// `[-1, 1]`), lowest degree first (least squares on Chebyshev nodes:
/// within 1.6e-8 of it).
const ERFC_FAR: [f32; 12] = [
    0.276_294_38,
    0.183_975_35,
    -0.036_700_048,
    0.003_073_540_7,
    0.001_844_211_6,
    -0.001_281_121_2,
    0.000_472_268_03,
    -9.114_471e-5,
    -3.143_723_7e-5,
    4.311_880_5e-5,
    -1.709_279_8e-5,
    1.537_648_2e-6,
];
const ERFC_MID: f32 = 0.55;
const ERFC_SCALE: f32 = (1.0 / 0.45) as f32;
/// Beyond this `a`, `e^(-a^2)` is 0 (the exponential's [`EXP_LO`]):
/// `a` is clamped to it there, so that an infinite `a` gives 0, not NaN.
const ERFC_A_MAX: f32 = 16.0;
/// The mask that keeps a float's top 12 significant bits: the square of
/// such a value is exact in f32.
const HEAD_12: u32 = 0xffff_f000;

/// Exact gelu, `0.5 x (1 + erf(x / sqrt 2))`, as `0.5 x s` with
/// `s = 1 + erf(z)`, `z = x / sqrt 2`, `a = |z|`:
///
/// - `a < 1`: `s = 1 + z P(z^2)` ([`ERF_NEAR`]);
/// - `a >= 1`: `erfc(a) = e^(-a^2) Q(1/a)` ([`ERFC_FAR`]), and `s` is
///   `2 - erfc(a)` for `z > 0`, `erfc(a)` for `z < 0`: no `1 + erf(z)`
///   cancelling where `erf(z)` nears -1. `e^(-a^2)` is
///   `e^(-h^2) e^(-l (a + h))` with `a = h + l` and `h` the top 12 bits of
///   `a`, so that `h^2` is exact (the square of `a` alone would carry its
///   rounding, times `a^2`, into the result).
///
/// Both branches are computed and one is taken, as the vector paths do.
/// Within 16 ulp of the exact function of the f32 `z` over `|x| <= 14`
/// where the result is above 1e-30 (`gelu_erf_matches_f64`, 10.2 at worst
/// on its points); what `z`'s own rounding adds grows with `z^2`, as it
/// does for any f32 evaluation of the formula.
#[inline(always)]
pub fn gelu_erf1(x: f32) -> f32 {
    let z = x * std::f32::consts::FRAC_1_SQRT_2;
    let a = z.abs();
    let w = z * z;
    let mut p = ERF_NEAR[ERF_NEAR.len() - 1];
    for &k in ERF_NEAR[..ERF_NEAR.len() - 1].iter().rev() {
        p = p * w + k;
    }
    let near = 1.0 + z * p;
    let t = (1.0 / a - ERFC_MID) * ERFC_SCALE;
    let mut q = ERFC_FAR[ERFC_FAR.len() - 1];
    for &k in ERFC_FAR[..ERFC_FAR.len() - 1].iter().rev() {
        q = q * t + k;
    }
    // f32::min gives 16 for NaN, as the vector paths' min does.
    let ac = a.min(ERFC_A_MAX);
    let h = f32::from_bits(ac.to_bits() & HEAD_12);
    let l = ac - h;
    let erfc = exp(-(h * h)) * exp(-(l * (ac + h))) * q;
    let far = if z > 0.0 { 2.0 - erfc } else { erfc };
    let s = if a < 1.0 { near } else { far };
    (0.5 * x) * s
}

/// [`gelu_erf1`] of every value, over all cores.
pub fn gelu_erf(x: &[f32]) -> Vec<f32> {
    elementwise(x, gelu_erf_with)
}

/// `out[i] = f(x[i])` by `path(isa, out, x)` over chunks, on all cores.
fn elementwise(x: &[f32], path: fn(Isa, &mut [f32], &[f32])) -> Vec<f32> {
    const CHUNK: usize = 1 << 14;
    let isa = Isa::best();
    let mut out = vec![0f32; x.len()];
    out.par_chunks_mut(CHUNK)
        .zip(x.par_chunks(CHUNK))
        .for_each(|(o, i)| path(isa, o, i));
    out
}

/// `fn $name(isa, out, x)`: `out[i] = $one(x[i])` on the path of `isa`,
/// the vector ones `x86::$avx512` and `x86::$avx2`.
macro_rules! elementwise_path {
    ($name:ident, $one:ident, $avx512:ident, $avx2:ident) => {
        fn $name(isa: Isa, out: &mut [f32], x: &[f32]) {
            assert!(isa.runs_here(), "{isa:?} kernels on a CPU without them");
            assert_eq!(out.len(), x.len());
            match isa {
                // SAFETY: the CPU has AVX-512F (asserted just above).
                #[cfg(target_arch = "x86_64")]
                Isa::Avx512 => unsafe { x86::$avx512(out, x) },
                // SAFETY: the CPU has AVX2 (asserted just above).
                #[cfg(target_arch = "x86_64")]
                Isa::Avx2 => unsafe { x86::$avx2(out, x) },
                _ => out.iter_mut().zip(x).for_each(|(o, &x)| *o = $one(x)),
            }
        }
    };
}

elementwise_path!(gelu_tanh_with, gelu_tanh1, gelu_tanh_avx512, gelu_tanh_avx2);
elementwise_path!(gelu_erf_with, gelu_erf1, gelu_erf_avx512, gelu_erf_avx2);
elementwise_path!(sigmoid_with, sigmoid1, sigmoid_avx512, sigmoid_avx2);
elementwise_path!(silu_with, silu1, silu_avx512, silu_avx2);

/// The row-major `[cols, rows]` transpose of a row-major `[rows, cols]`
/// matrix, over all cores: each task fills a band of output rows, in
/// blocks of 8 x 8, so that every read and every write runs over 8
/// contiguous values and a block's source rows stay in L1.
pub fn transpose(src: &[f32], rows: usize, cols: usize) -> Vec<f32> {
    const BAND: usize = 64;
    const B: usize = 8;
    assert_eq!(
        src.len(),
        rows * cols,
        "matrix buffer does not match its shape"
    );
    let mut out = vec![0f32; rows * cols];
    if rows == 0 || cols == 0 {
        return out;
    }
    out.par_chunks_mut(BAND * rows)
        .enumerate()
        .for_each(|(band, dst)| {
            let (c0, nc) = (band * BAND, dst.len() / rows);
            for r0 in (0..rows).step_by(B) {
                let r1 = (r0 + B).min(rows);
                for j0 in (0..nc).step_by(B) {
                    for j in j0..(j0 + B).min(nc) {
                        let o = &mut dst[j * rows + r0..j * rows + r1];
                        for (r, o) in (r0..r1).zip(o) {
                            *o = src[r * cols + c0 + j];
                        }
                    }
                }
            }
        });
    out
}

/// [`exp_shift_inv_sum`] for callers compiled with AVX-512F (the fused
/// chain's stages), without the dispatch.
#[cfg(target_arch = "x86_64")]
pub use x86::{exp_shift_inv_sum_avx2, exp_shift_inv_sum_avx512};

/// The x86-64 paths: the portable operations, 8 or 16 lanes at a time.
#[cfg(target_arch = "x86_64")]
mod x86;

#[cfg(test)]
mod tests {
    use super::*;

    /// 2^-24: half an ulp of 1, f32's unit roundoff.
    const EPS: f64 = 1.0 / 16_777_216.0;

    /// The paths this CPU runs, portable first.
    fn paths() -> Vec<Isa> {
        [Isa::Portable, Isa::Avx2, Isa::Avx512]
            .into_iter()
            .filter(|i| i.runs_here())
            .collect()
    }

    /// Uniform values in [-1, 1).
    fn lcg(n: usize, seed: u64) -> Vec<f32> {
        let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
        (0..n)
            .map(|_| {
                s = s
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                ((s >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
            })
            .collect()
    }

    /// Panics at the first value whose bits differ (every NaN alike).
    fn same_bits(a: &[f32], b: &[f32], what: &str) {
        assert_eq!(a.len(), b.len(), "{what}: lengths");
        let key = |x: f32| if x.is_nan() { u32::MAX } else { x.to_bits() };
        if let Some(i) = (0..a.len()).find(|&i| key(a[i]) != key(b[i])) {
            panic!("{what}: [{i}] {:e} vs {:e}", a[i], b[i]);
        }
    }

    /// The size of one ulp of f32 at the (positive, normal) value `w`:
    /// `2^(floor(log2 w) - 23)`, the exponent read from f64's bits.
    fn ulp(w: f64) -> f64 {
        let e = ((w.to_bits() >> 52) & 0x7ff) as i64 - 1023;
        f64::from_bits(((e - 23 + 1023) as u64) << 52)
    }

    /// `exp` through every path (the vector ones on a slice).
    fn exp_paths(xs: &[f32]) -> Vec<(Isa, Vec<f32>)> {
        #[cfg_attr(not(target_arch = "x86_64"), allow(unused_mut))]
        let mut out = vec![(
            Isa::Portable,
            xs.iter().map(|&x| exp(x)).collect::<Vec<_>>(),
        )];
        #[cfg(target_arch = "x86_64")]
        for (isa, wide) in [(Isa::Avx2, false), (Isa::Avx512, true)] {
            if isa.runs_here() {
                let mut v = xs.to_vec();
                x86::exp_slice(wide, &mut v);
                out.push((isa, v));
            }
        }
        out
    }

    /// The dispatch takes the widest path the CPU has, and every narrower
    /// one runs here too.
    #[test]
    fn the_widest_path_runs() {
        let best = Isa::best();
        #[cfg(target_arch = "x86_64")]
        {
            let want = if crate::blas::avx512() {
                Isa::Avx512
            } else if is_x86_feature_detected!("avx2") {
                Isa::Avx2
            } else {
                Isa::Portable
            };
            assert_eq!(best, want);
        }
        assert!(best.runs_here() && Isa::Portable.runs_here());
        eprintln!(
            "kernel paths on this CPU: {:?} (dispatch: {best:?})",
            paths()
        );
    }

    /// `exp` is within 1.25 ulp of f64's `exp` on every 97th f32 of
    /// [EXP_LO, EXP_HI] (about 23 million values; 1.18 at worst here, 1.22
    /// in the exhaustive sweep below), every path giving the
    /// portable bits; no result there is subnormal; below EXP_LO it is
    /// exactly +0, above EXP_HI +inf, NaN stays NaN.
    #[test]
    fn exp_is_within_one_ulp() {
        let neg = (0x8000_0000u32..=EXP_LO.to_bits()).step_by(97);
        let pos = (0u32..=EXP_HI.to_bits()).step_by(97);
        let xs: Vec<f32> = neg
            .chain(pos)
            .map(f32::from_bits)
            .chain([
                EXP_LO, EXP_HI, 0.0, -0.0, 1.0, -1.0, 0.5, -0.3465736, 0.3465736,
            ])
            .collect();
        let runs = exp_paths(&xs);
        let mut worst = (0f64, 0f32);
        for (i, (&x, &got)) in xs.iter().zip(&runs[0].1).enumerate() {
            let want = f64::from(x).exp();
            assert!(
                got >= f32::MIN_POSITIVE && got.is_finite(),
                "exp({x:e}) = {got:e}"
            );
            let err = (f64::from(got) - want).abs() / ulp(want);
            if err > worst.0 {
                worst = (err, x);
            }
            for (isa, v) in &runs[1..] {
                assert_eq!(v[i].to_bits(), got.to_bits(), "{isa:?} exp({x:e})");
            }
        }
        eprintln!(
            "exp: {} values, worst {:.3} ulp at {:e}",
            xs.len(),
            worst.0,
            worst.1
        );
        assert!(worst.0 <= 1.25, "exp: {} ulp at {:e}", worst.0, worst.1);
        // The edges and the special values, on every path.
        let below = f32::from_bits(EXP_LO.to_bits() + 1);
        let above = f32::from_bits(EXP_HI.to_bits() + 1);
        let special = [
            0.0,
            -0.0,
            below,
            -1e4,
            -3e4,
            -1e30,
            f32::NEG_INFINITY,
            above,
            1e30,
            f32::INFINITY,
            f32::NAN,
        ];
        for (isa, v) in exp_paths(&special) {
            let at = format!("{isa:?}");
            assert_eq!(v[0].to_bits(), 1f32.to_bits(), "{at}");
            assert_eq!(v[1].to_bits(), 1f32.to_bits(), "{at}");
            for &z in &v[2..7] {
                assert_eq!(z.to_bits(), 0, "{at}: below EXP_LO gives +0");
            }
            assert!(v[7..10].iter().all(|&y| y == f32::INFINITY), "{at}");
            assert!(v[10].is_nan(), "{at}");
        }
        assert!(f64::from(below).exp() < f64::from(f32::MIN_POSITIVE) * 1.04);
        assert!(f64::from(above).exp() > f64::from(f32::MAX));
        assert!(exp(EXP_HI) > 3.4027e38);
    }

    /// [`exp_is_within_one_ulp`] on every f32 of [EXP_LO, EXP_HI] (2.2
    /// billion values, 16 s to a minute on two cores; run with `--ignored`):
    /// 1.221 ulp at worst (at 59.265224), 1.212 on [EXP_LO, 0] (at -71.045616).
    #[test]
    #[ignore = "exhaustive over 2.2 billion f32 values, 16 s to a minute on two cores; run with --ignored"]
    fn exp_exhaustive() {
        let ranges = [(0x8000_0000u32, EXP_LO.to_bits()), (0u32, EXP_HI.to_bits())];
        for (a, b) in ranges {
            let (worst, at) = (a..=b)
                .into_par_iter()
                .map(|b| {
                    let x = f32::from_bits(b);
                    let want = f64::from(x).exp();
                    ((f64::from(exp(x)) - want).abs() / ulp(want), x)
                })
                .reduce(|| (0.0, 0.0), |a, b| if b.0 > a.0 { b } else { a });
            let (lo, hi) = (f32::from_bits(a), f32::from_bits(b));
            eprintln!("exp on [{lo:e}, {hi:e}]: worst {worst:.4} ulp at {at:e}");
            assert!(worst <= 1.25);
        }
    }

    /// Rows of the sizes attention uses, with tails around 16, of several
    /// kinds: (name, values).
    fn rows() -> Vec<(String, Vec<f32>)> {
        let mut out = Vec::new();
        for (k, len) in [4093usize, 4096, 4099, 17, 16, 15, 1]
            .into_iter()
            .enumerate()
        {
            let u = lcg(len, 100 + k as u64);
            let plain: Vec<f32> = u.iter().map(|v| v * 8.0).collect();
            // Padding: every third key and the last 40% masked with -1e4
            // (key 0 stays, so a row always has an unmasked key).
            let masked: Vec<f32> = plain
                .iter()
                .enumerate()
                .map(|(i, &v)| {
                    if i > 0 && (i % 3 == 2 || i >= len * 3 / 5) {
                        v - 1e4
                    } else {
                        v
                    }
                })
                .collect();
            // Large values close together (x - max exact), and spread wide
            // (most keys underflow to 0, some land near -87).
            let large: Vec<f32> = u.iter().map(|v| 2e4 + v * 100.0).collect();
            let wide: Vec<f32> = u.iter().map(|v| v * 3e4).collect();
            let small: Vec<f32> = u.iter().map(|v| v * 1e-3).collect();
            let ties = vec![-3.25f32; len];
            for (name, v) in [
                ("plain", plain),
                ("masked", masked),
                ("large", large),
                ("wide", wide),
                ("small", small),
                ("ties", ties),
            ] {
                out.push((format!("{name} len {len}"), v));
            }
        }
        out
    }

    /// Softmax against f64 (std's `exp`) on every path, and the paths give
    /// the same bits. Tolerance per probability `p` of a value `x`, with
    /// the row maximum `m` and the f64 probability `w`: keys with
    /// `x - m < EXP_LO` (in f32) get exactly 0; the others
    /// `|p - w| <= (8 + |x - m| + sqrt(n / 16)) 2^-24 w + 2^-149` for a row
    /// of `n`: `|x - m| 2^-24` for the rounding of `x - m` in f32; 8
    /// half-ulps for exp (2.5), the reciprocal and the product;
    /// `sqrt(n / 16)` for the sum's rounding, which grows like a random walk
    /// over the n / 16 terms of a lane (16 at n = 4096; the worst-case
    /// bound, n / 16, is never approached); 2^-149 for a subnormal product.
    /// The worst seen here is 3.6 beyond `|x - m|`.
    #[test]
    fn softmax_matches_f64() {
        let mut worst = 0f64;
        for (name, row) in rows() {
            let m = row.iter().fold(f32::NEG_INFINITY, |a, &b| a.max(b));
            let e: Vec<f64> = row
                .iter()
                .map(|&x| (f64::from(x) - f64::from(m)).exp())
                .collect();
            let s: f64 = e.iter().sum();
            let lane_terms = (row.len() as f64 / 16.0).sqrt();
            let mut first: Option<Vec<f32>> = None;
            for isa in paths() {
                let mut p = row.clone();
                softmax_with(isa, &mut p);
                let at = format!("{name} {isa:?}");
                for (i, (&p, &w)) in p.iter().zip(&e).enumerate() {
                    let w = w / s;
                    let d = row[i] - m;
                    if d < EXP_LO {
                        assert_eq!(p.to_bits(), 0, "{at} [{i}]: {p:e} (want {w:e})");
                        assert!(w < 1.3e-38, "{at} [{i}]");
                        continue;
                    }
                    let err = (f64::from(p) - w).abs();
                    let tol = (8.0 + f64::from(d.abs()) + lane_terms) * EPS * w + 2f64.powi(-149);
                    assert!(err <= tol, "{at} [{i}] x {:e}: {p:e} vs {w:e}", row[i]);
                    if w > 1e-30 {
                        worst = worst.max((err / w - f64::from(d.abs()) * EPS) / EPS);
                    }
                }
                let sum: f64 = p.iter().map(|&v| f64::from(v)).sum();
                assert!((sum - 1.0).abs() < 1e-5, "{at}: sums to {sum}");
                match &first {
                    None => first = Some(p),
                    Some(f) => same_bits(f, &p, &format!("{at} differs from portable")),
                }
            }
            let mut p = row.clone();
            softmax_in_place(&mut p);
            same_bits(first.as_ref().unwrap(), &p, &format!("{name}: dispatch"));
        }
        eprintln!("softmax: worst relative error beyond |x - m| 2^-24: {worst:.2} x 2^-24");
    }

    /// The fused chain's step alone, against f64: each `exp(x - max)` within
    /// 1.25 ulp of f64's `exp` of the f32 difference (0 below EXP_LO, never
    /// subnormal), and `1 / sum` within `(4 + sqrt(n / 16)) 2^-24` (as in
    /// [`softmax_matches_f64`]; 2.4 at worst here) of f64's reciprocal of
    /// the f64 sum of those values; the same bits on every path, and
    /// softmax is this step times the reciprocal.
    #[test]
    fn exp_shift_inv_sum_matches_f64() {
        let mut worst = 0f64;
        for (name, row) in rows() {
            let m = row.iter().fold(f32::NEG_INFINITY, |a, &b| a.max(b));
            let mut first: Option<(Vec<f32>, f32)> = None;
            for isa in paths() {
                assert_eq!(row_max(isa, &row).to_bits(), m.to_bits(), "{name} {isa:?}");
                let mut e = row.clone();
                let inv = exp_shift_inv_sum(isa, &mut e, m);
                let at = format!("{name} {isa:?}");
                let mut sum = 0f64;
                for (i, &got) in e.iter().enumerate() {
                    let d = row[i] - m;
                    if d < EXP_LO {
                        assert_eq!(got.to_bits(), 0, "{at} [{i}]");
                        continue;
                    }
                    assert!(got >= f32::MIN_POSITIVE, "{at} [{i}]: {got:e}");
                    let want = f64::from(d).exp();
                    let err = (f64::from(got) - want).abs() / ulp(want);
                    assert!(err <= 1.25, "{at} [{i}]: {err} ulp");
                    sum += f64::from(got);
                }
                let rel = (f64::from(inv) * sum - 1.0).abs();
                worst = worst.max(rel / EPS);
                let tol = (4.0 + (row.len() as f64 / 16.0).sqrt()) * EPS;
                assert!(rel <= tol, "{at}: 1/sum off by {rel:e}");
                let mut p = row.clone();
                softmax_with(isa, &mut p);
                let scaled: Vec<f32> = e.iter().map(|&v| v * inv).collect();
                same_bits(&p, &scaled, &at);
                match &first {
                    None => first = Some((e, inv)),
                    Some((f, finv)) => {
                        same_bits(f, &e, &format!("{at} differs from portable"));
                        assert_eq!(finv.to_bits(), inv.to_bits(), "{at}");
                    }
                }
            }
        }
        eprintln!("1 / sum: worst relative error {worst:.2} x 2^-24");
    }

    /// Rows holding NaN or infinities: every path gives the portable bits;
    /// NaN is passed over by the maximum and spreads through the sum, a
    /// -inf key gets 0.
    #[test]
    fn softmax_special_values_agree() {
        let base = lcg(37, 9);
        let mut cases = Vec::new();
        for (i, v) in [
            (3, f32::NAN),
            (36, f32::NAN),
            (5, f32::NEG_INFINITY),
            (20, f32::INFINITY),
        ] {
            let mut r = base.clone();
            r[i] = v;
            cases.push(r);
        }
        cases.push(vec![f32::NEG_INFINITY; 19]);
        cases.push(vec![0.0, -0.0, -0.0, 0.0, -1.0]);
        for row in &cases {
            let mut want = row.clone();
            softmax_with(Isa::Portable, &mut want);
            for isa in paths() {
                let mut p = row.clone();
                softmax_with(isa, &mut p);
                same_bits(&want, &p, &format!("{isa:?} {row:?}"));
            }
        }
        let mut ninf = base.clone();
        ninf[5] = f32::NEG_INFINITY;
        softmax_in_place(&mut ninf);
        assert_eq!(ninf[5].to_bits(), 0);
        let mut nan = base.clone();
        nan[3] = f32::NAN;
        softmax_in_place(&mut nan);
        assert!(nan.iter().all(|v| v.is_nan()));
    }

    /// gelu's tanh approximation against f64, on every path, over
    /// [-12, 12] in steps of 1/1024 and 4099 random values (through the
    /// parallel entry and each path). The f64 value is
    /// `0.5 x (1 + tanh(u))`, `u = sqrt(2/pi)(x + 0.044715 x^3)`; where
    /// `u < -3` it is taken as `x e^(2u) / (1 + e^(2u))`, the same value
    /// without `1 + tanh(u)` cancelling in f64. Tolerance: relative
    /// `4 (1 + |2u|) 2^-24` (f32 computes `2u` to within a few roundings,
    /// and `e^(2u)` inherits that times `|2u|`; 2.7 instead of 4 at worst
    /// here), plus 1e-36 absolute (the result underflows near x = -10).
    #[test]
    fn gelu_tanh_matches_f64() {
        let f64_gelu = |x: f32| -> (f64, f64) {
            let x = f64::from(x);
            let u = (2.0 / std::f64::consts::PI).sqrt() * (x + 0.044715 * x * x * x);
            let w = if u >= -3.0 {
                0.5 * x * (1.0 + u.tanh())
            } else {
                let e = (2.0 * u).exp();
                x * e / (1.0 + e)
            };
            (w, u)
        };
        // The two f64 forms agree where both are well conditioned.
        for i in 0..=3000 {
            let u = -3.0 * f64::from(i) / 3000.0;
            let (a, b) = (
                1.0 + u.tanh(),
                2.0 * (2.0 * u).exp() / (1.0 + (2.0 * u).exp()),
            );
            assert!((a - b).abs() <= 1e-13 * b, "{u}");
        }
        let mut xs: Vec<f32> = (-12 * 1024..=12 * 1024)
            .map(|i| i as f32 / 1024.0)
            .collect();
        xs.extend(lcg(4099, 77).iter().map(|v| v * 12.0));
        let mut worst = 0f64;
        let check = |what: &str, x: &[f32], y: &[f32], worst: &mut f64| {
            for (&x, &got) in x.iter().zip(y) {
                let (want, u) = f64_gelu(x);
                let err = (f64::from(got) - want).abs();
                let tol = 4.0 * (1.0 + (2.0 * u).abs()) * EPS * want.abs() + 1e-36;
                assert!(err <= tol, "{what} gelu({x:e}) = {got:e}, f64 {want:e}");
                if want.abs() > 1e-30 {
                    *worst = worst.max(err / want.abs() / EPS / (1.0 + (2.0 * u).abs()));
                }
            }
        };
        let mut first: Option<Vec<f32>> = None;
        for isa in paths() {
            let mut y = vec![0f32; xs.len()];
            gelu_tanh_with(isa, &mut y, &xs);
            check(&format!("{isa:?}"), &xs, &y, &mut worst);
            // The tail of 4099 values on its own (a masked tail of 3).
            let tail = &xs[xs.len() - 4099..];
            let mut yt = vec![0f32; tail.len()];
            gelu_tanh_with(isa, &mut yt, tail);
            same_bits(&yt, &y[xs.len() - 4099..], &format!("{isa:?} tail"));
            match &first {
                None => first = Some(y),
                Some(f) => same_bits(f, &y, &format!("{isa:?} differs from portable")),
            }
        }
        let par = gelu_tanh(&xs);
        same_bits(first.as_ref().unwrap(), &par, "parallel entry");
        eprintln!("gelu tanh: worst {worst:.2} x 2^-24 x (1 + |2u|) relative");
        // Far out: x itself, -0, and IEEE's infinities and NaN.
        let special = [
            0.0f32,
            1e4,
            -1e4,
            3e12,
            -3e12,
            f32::INFINITY,
            f32::NEG_INFINITY,
            f32::NAN,
        ];
        for isa in paths() {
            let mut y = [0f32; 8];
            gelu_tanh_with(isa, &mut y, &special);
            assert_eq!(y[0].to_bits(), 0, "{isa:?}");
            assert_eq!((y[1], y[3]), (1e4, 3e12), "{isa:?}");
            assert!(y[2] == 0.0 && y[4] == 0.0, "{isa:?}: {y:?}");
            assert_eq!(y[5], f32::INFINITY, "{isa:?}");
            assert!(y[6].is_nan() && y[7].is_nan(), "{isa:?}");
        }
    }

    /// Exact gelu against f64 on every path, over [-14, 14] in steps of
    /// 1/1024 and 4099 random values (through the parallel entry and each
    /// path, the paths' bits equal), with the special values. Against the
    /// exact function of the f32 `z = x / sqrt 2` the paths compute (f64's
    /// `erfc` of it): within 16 ulp relative where the result is above
    /// 1e-30 (13 at worst when written; the old `1 + erff(z)` lost every
    /// bit below x = -4). Against the exact function of `x` itself the
    /// error adds `z`'s own rounding, which `erfc` amplifies by `2 z^2`:
    /// within `(16 + 3 z^2)` ulp.
    #[test]
    fn gelu_erf_matches_f64() {
        use candle_core::cpu::erf::erfc_f64;
        let exact_of_z = |x: f32| {
            let z = f64::from(x * std::f32::consts::FRAC_1_SQRT_2);
            0.5 * f64::from(x) * erfc_f64(-z)
        };
        let mut xs: Vec<f32> = (-14 * 1024..=14 * 1024)
            .map(|i| i as f32 / 1024.0)
            .collect();
        xs.extend(lcg(4099, 79).iter().map(|v| v * 14.0));
        let mut worst = 0f64;
        let mut first: Option<Vec<f32>> = None;
        for isa in paths() {
            let mut y = vec![0f32; xs.len()];
            gelu_erf_with(isa, &mut y, &xs);
            for (&x, &got) in xs.iter().zip(&y) {
                let want = exact_of_z(x);
                let err = (f64::from(got) - want).abs();
                if want.abs() > 1e-30 {
                    let ulps = err / want.abs() / EPS;
                    assert!(ulps <= 16.0, "{isa:?} gelu({x:e}) = {got:e}, f64 {want:e}");
                    worst = worst.max(ulps);
                } else {
                    assert!(err <= 1e-30, "{isa:?} gelu({x:e}) = {got:e}, f64 {want:e}");
                }
                // Against x itself: z's rounding, amplified.
                let z = f64::from(x) * std::f64::consts::FRAC_1_SQRT_2;
                let exact = 0.5 * f64::from(x) * erfc_f64(-z);
                if exact.abs() > 1e-30 {
                    // z is within 1.25 x 2^-24 of x / sqrt 2 (the constant's
                    // error and the product's rounding); erfc turns that into
                    // about 2 z^2 times as much.
                    let tol = (16.0 + 3.0 * z * z) * EPS * exact.abs();
                    assert!(
                        (f64::from(got) - exact).abs() <= tol,
                        "{isa:?} gelu({x:e}) = {got:e}, f64 {exact:e}, {} ulp, z^2 {}",
                        (f64::from(got) - exact).abs() / exact.abs() / EPS,
                        z * z
                    );
                }
            }
            let tail = &xs[xs.len() - 4099..];
            let mut yt = vec![0f32; tail.len()];
            gelu_erf_with(isa, &mut yt, tail);
            same_bits(&yt, &y[xs.len() - 4099..], &format!("{isa:?} tail"));
            match &first {
                None => first = Some(y),
                Some(f) => same_bits(f, &y, &format!("{isa:?} differs from portable")),
            }
        }
        same_bits(first.as_ref().unwrap(), &gelu_erf(&xs), "parallel entry");
        eprintln!("gelu erf: worst {worst:.2} x 2^-24 relative");
        let special = [
            0.0f32,
            -0.0,
            1e4,
            -1e4,
            3e12,
            -3e12,
            f32::INFINITY,
            f32::NEG_INFINITY,
            f32::NAN,
        ];
        for isa in paths() {
            let mut y = [0f32; 9];
            gelu_erf_with(isa, &mut y, &special);
            assert_eq!(
                (y[0].to_bits(), y[1].to_bits()),
                (0, (-0f32).to_bits()),
                "{isa:?}"
            );
            assert_eq!((y[2], y[4], y[6]), (1e4, 3e12, f32::INFINITY), "{isa:?}");
            assert!(y[3] == 0.0 && y[5] == 0.0, "{isa:?}: {y:?}");
            // -inf times 1 + erf(-inf) = 0, as 0.5 x (1 + erf(z)) gives.
            assert!(y[7].is_nan() && y[8].is_nan(), "{isa:?}: {y:?}");
        }
    }

    /// The logistic function and SiLU against f64, on every path, over [-100, 100]
    /// in steps of 1/256 and 4099 random values (through the parallel entry
    /// and each path), with the special values. Tolerance: relative
    /// `5 2^-24`: `e^(-x)` is within 1.25 ulp (at most `2.5 2^-24`
    /// relative; negating x is exact), which `1 + e^(-x)` passes on damped
    /// by `e^(-x) / (1 + e^(-x)) < 1`, and the sum and the division add half
    /// an ulp each; below about -87.3 the result is exactly 0 (`e^(-x)` is
    /// `+inf`), which f64 puts below 1e-37.
    #[test]
    fn sigmoid_and_silu_match_f64() {
        let mut xs: Vec<f32> = (-100 * 256..=100 * 256).map(|i| i as f32 / 256.0).collect();
        xs.extend(lcg(4099, 78).iter().map(|v| v * 30.0));
        let mut worst = 0f64;
        let check = |what: &str, x: &[f32], y: &[f32], worst: &mut f64| {
            for (&x, &got) in x.iter().zip(y) {
                let want = 1.0 / (1.0 + (-f64::from(x)).exp());
                if x < -87.0 {
                    assert!(
                        got == 0.0 || (f64::from(got) - want).abs() <= 1e-37,
                        "{what} {x}"
                    );
                    continue;
                }
                let err = (f64::from(got) - want).abs() / want / EPS;
                assert!(err <= 5.0, "{what} sigmoid({x:e}) = {got:e}, f64 {want:e}");
                *worst = worst.max(err);
            }
        };
        let mut first: Option<Vec<f32>> = None;
        for isa in paths() {
            let mut y = vec![0f32; xs.len()];
            sigmoid_with(isa, &mut y, &xs);
            check(&format!("{isa:?}"), &xs, &y, &mut worst);
            let tail = &xs[xs.len() - 4099..];
            let mut yt = vec![0f32; tail.len()];
            sigmoid_with(isa, &mut yt, tail);
            same_bits(&yt, &y[xs.len() - 4099..], &format!("{isa:?} tail"));
            match &first {
                None => first = Some(y),
                Some(f) => same_bits(f, &y, &format!("{isa:?} differs from portable")),
            }
        }
        same_bits(first.as_ref().unwrap(), &sigmoid(&xs), "parallel entry");
        eprintln!("sigmoid: worst {worst:.2} x 2^-24 relative");
        let special = [
            0.0f32,
            -0.0,
            200.0,
            -200.0,
            f32::INFINITY,
            f32::NEG_INFINITY,
            f32::NAN,
        ];
        for isa in paths() {
            let mut y = [0f32; 7];
            sigmoid_with(isa, &mut y, &special);
            assert_eq!(&y[..6], &[0.5, 0.5, 1.0, 0.0, 1.0, 0.0], "{isa:?}");
            assert!(y[6].is_nan(), "{isa:?}");
        }
        // SiLU is x times the same quotient: `x / (1 + e^(-x))` is one
        // rounding from `x sigmoid(x)`'s exact value, checked the same way
        // (the division's rounding in place of the multiplication's).
        let mut first: Option<Vec<f32>> = None;
        for isa in paths() {
            let mut y = vec![0f32; xs.len()];
            silu_with(isa, &mut y, &xs);
            for (&x, &got) in xs.iter().zip(&y) {
                let want = f64::from(x) / (1.0 + (-f64::from(x)).exp());
                if x < -87.0 || x == 0.0 {
                    assert!(
                        got == 0.0 || (f64::from(got) - want).abs() <= 1e-35,
                        "{isa:?} {x}"
                    );
                    continue;
                }
                let err = (f64::from(got) - want).abs() / want.abs() / EPS;
                assert!(err <= 5.0, "{isa:?} silu({x:e}) = {got:e}, f64 {want:e}");
            }
            match &first {
                None => first = Some(y),
                Some(f) => same_bits(f, &y, &format!("silu {isa:?} differs from portable")),
            }
        }
        same_bits(first.as_ref().unwrap(), &silu(&xs), "silu parallel entry");
        for isa in paths() {
            let mut y = [0f32; 7];
            silu_with(isa, &mut y, &special);
            assert_eq!(&y[..3], &[0.0, -0.0, 200.0], "{isa:?}");
            assert!(
                y[3] == 0.0 && y[5].is_nan() && y[6].is_nan(),
                "{isa:?}: {y:?}"
            );
            assert_eq!(y[4], f32::INFINITY, "{isa:?}");
        }
    }

    /// The transpose puts `src[r, c]` at `out[c, r]`, on shapes with and
    /// without whole blocks, and on empty ones.
    #[test]
    fn transpose_by_index() {
        for (rows, cols) in [
            (64, 4096),
            (4096, 64),
            (70, 131),
            (33, 33),
            (1, 5),
            (5, 1),
            (1, 1),
            (0, 7),
            (7, 0),
        ] {
            let src: Vec<f32> = (0..rows * cols).map(|i| i as f32).collect();
            let out = transpose(&src, rows, cols);
            assert_eq!(out.len(), rows * cols);
            for r in 0..rows {
                for c in 0..cols {
                    assert_eq!(
                        out[c * rows + r].to_bits(),
                        src[r * cols + c].to_bits(),
                        "[{rows}, {cols}] at ({r}, {c})"
                    );
                }
            }
        }
    }
}
