//! The attention chain's inner stages in AVX2 and AVX-512 lanes: one body,
//! [`stages`], over a [`Width`]'s steps, compiled inside each width's target
//! features ([`stages_avx2`], [`stages_avx512`]) with the run's flags and
//! the mask's kind as constants of its loops. The operations on each value
//! and their order are the portable path's, so the bits are.

use super::{RowMask, Simd};
use crate::interp::AneRule;
use crate::interp::fast::Counts;
use crate::interp::round1;
use std::arch::x86_64::*;

/// [`super::inner_stages`] in three passes of `simd`'s lanes (16 or 8):
/// the elementwise stages (each rounded, and in ane mode each followed by
/// its op's [`AneRule`]) and the row's maximum; the exponentials and
/// `1 / sum` ([`crate::interp::kernels::exp_shift_inv_sum`], as the
/// op-by-op softmax takes them: on AVX2 in 16 lanes, two registers); the
/// normalisation.
///
/// # Safety
/// The CPU has `simd`'s features ([`Simd::here`]); `simd` is not
/// [`Simd::None`].
#[allow(clippy::too_many_arguments)]
pub(super) unsafe fn inner_stages(
    row: &mut [f32],
    mask: RowMask,
    scale: f32,
    fp16: Option<bool>,
    ane: bool,
    c: &mut [Counts; 4],
    peaks: &mut [f32; 4],
    simd: Simd,
) {
    let (flags, m) = constants(mask, fp16, ane);
    let a = (row, m, scale, c, peaks);
    // SAFETY: the CPU has the features (the caller's promise).
    unsafe {
        match simd {
            Simd::Avx512 => with_constants!(stages_avx512, a, flags),
            Simd::Avx2 => with_constants!(stages_avx2, a, flags),
            Simd::None => unreachable!("the portable stages are the caller's"),
        }
    }
}

/// The kinds of [`RowMask`], as the stages' constant.
const ABSENT: u8 = 0;
const ZERO: u8 = 1;
const VALUES: u8 = 2;

/// A row's flags as the stages' constants, `(ROUND, COUNT, ANE, MASK)`,
/// and the mask's values (empty unless `MASK` is [`VALUES`]).
fn constants<'a>(
    mask: RowMask<'a>,
    fp16: Option<bool>,
    ane: bool,
) -> ((bool, bool, bool, u8), &'a [f32]) {
    let (check, round) = (fp16.unwrap_or(false), fp16.is_some());
    // In ane mode the rounding counts nothing: the rule counts after it.
    let ane = ane && round;
    let count = check && !ane;
    let (kind, m): (u8, &[f32]) = match mask {
        RowMask::Absent => (ABSENT, &[]),
        RowMask::Zero => (ZERO, &[]),
        RowMask::Values(m) => (VALUES, m),
    };
    ((round, count, ane, kind), m)
}

/// `$stages::<ROUND, COUNT, ANE, MASK>($a)` with the constants that
/// [`constants`] gave at run time.
macro_rules! with_constants {
    ($stages:ident, $a:expr, $flags:expr) => {{
        let (round, count, ane, kind) = $flags;
        match (round, count, ane) {
            (false, _, _) => with_mask!($stages, $a, kind, false, false, false),
            (true, true, _) => with_mask!($stages, $a, kind, true, true, false),
            (true, false, false) => with_mask!($stages, $a, kind, true, false, false),
            (true, false, true) => with_mask!($stages, $a, kind, true, false, true),
        }
    }};
}
use with_constants;

/// [`with_constants`]' call with the mask's kind as the last constant.
macro_rules! with_mask {
    ($stages:ident, $a:expr, $kind:expr, $r:literal, $n:literal, $an:literal) => {
        match $kind {
            ABSENT => $stages::<$r, $n, $an, ABSENT>($a),
            ZERO => $stages::<$r, $n, $an, ZERO>($a),
            _ => $stages::<$r, $n, $an, VALUES>($a),
        }
    };
}
use with_mask;

/// The arguments of [`stages`]: the row, the mask's values, the scale, each
/// stage's counts and peak.
type Args<'a> = (
    &'a mut [f32],
    &'a [f32],
    f32,
    &'a mut [Counts; 4],
    &'a mut [f32; 4],
);

/// [`stages`] in 8 lanes.
///
/// # Safety
/// The CPU has AVX2, FMA, F16C and POPCNT.
#[target_feature(enable = "avx2,fma,f16c,popcnt")]
unsafe fn stages_avx2<const ROUND: bool, const COUNT: bool, const ANE: bool, const MASK: u8>(
    a: Args,
) {
    // SAFETY: the features [`W8`]'s steps need are this function's.
    unsafe { stages::<W8, ROUND, COUNT, ANE, MASK>(a) }
}

/// [`stages`] in 16 lanes.
///
/// # Safety
/// The CPU has AVX-512F, AVX2, F16C and POPCNT.
#[target_feature(enable = "avx512f,avx2,f16c,popcnt")]
unsafe fn stages_avx512<const ROUND: bool, const COUNT: bool, const ANE: bool, const MASK: u8>(
    a: Args,
) {
    // SAFETY: the features [`W16`]'s steps need are this function's.
    unsafe { stages::<W16, ROUND, COUNT, ANE, MASK>(a) }
}

/// One vector width's steps for [`stages`]. Each is an `unsafe` function
/// with its width's target features, which [`stages`] (inlined into
/// [`stages_avx2`] or [`stages_avx512`]) runs inside.
trait Width {
    /// A register of [`Width::N`] values.
    type V: Copy;
    /// One stage's peak over a row: the largest `|x|` in lanes, the lanes
    /// that held a NaN (`max` passes over it), and the tail's largest.
    type Peak: Copy;
    /// Lanes in a register.
    const N: usize;
    unsafe fn load(p: *const f32) -> Self::V;
    unsafe fn store(p: *mut f32, x: Self::V);
    unsafe fn splat(x: f32) -> Self::V;
    unsafe fn mul(a: Self::V, b: Self::V) -> Self::V;
    unsafe fn add(a: Self::V, b: Self::V) -> Self::V;
    /// `max(x, acc)` in each lane: `acc` where `x` is NaN, as `f32::max`.
    unsafe fn max(x: Self::V, acc: Self::V) -> Self::V;
    /// `init` and the lanes folded by `f32::max`, in lane order.
    unsafe fn fold_max(init: f32, x: Self::V) -> f32;
    /// The values rounded to fp16 (as f32), counted first with `check`
    /// (non-finite into `c.0`, finite beyond 65504 into `c.1`).
    unsafe fn round(x: Self::V, check: bool, c: &mut Counts) -> Self::V;
    /// The counts of [`Width::round`] alone (for values fp16 already).
    unsafe fn count(x: Self::V, c: &mut Counts);
    /// A stage's [`AneRule`] on fp16 values, as [`AneRule::apply`] and the
    /// portable path count it: NaN to +0; on the scores (the matmul's
    /// output), the ceiling (a finite `|x| >= 32768` to ±inf, counted in
    /// `c.1`) and the flush (fp16 subnormals to +0); then the infinities,
    /// counted in `c.0`.
    unsafe fn rule(x: Self::V, scores: bool, c: &mut Counts) -> Self::V;
    unsafe fn peak() -> Self::Peak;
    /// A register's values into the peak.
    unsafe fn peak_add(pk: &mut Self::Peak, x: Self::V);
    /// One value of the row's tail into the peak.
    fn peak_add1(pk: &mut Self::Peak, x: f32);
    /// The peak: inf where a NaN was seen.
    unsafe fn peak_get(pk: Self::Peak) -> f32;
    /// The exponentials in place and `1 / sum`, as the op-by-op softmax
    /// takes them ([`crate::interp::kernels::exp_shift_inv_sum`]).
    unsafe fn exp_shift_inv_sum(row: &mut [f32], max: f32) -> f32;
}

/// One value of a row's tail into a stage's peak: inf for a NaN.
fn peak1(peak: &mut f32, x: f32) {
    *peak = if x.is_nan() {
        f32::INFINITY
    } else {
        peak.max(x.abs())
    };
}

/// [`Width::rule`] on one value.
fn rule1(x: f32, scores: bool, c: &mut Counts) -> f32 {
    let rule = AneRule::product_if(scores);
    let x = rule.apply(x, &mut c.1);
    c.0 += usize::from(x.is_infinite());
    x
}

/// A width's plain steps by its intrinsics: the register `$v` of `$n`
/// lanes, its unaligned load and store, broadcast, multiply, add and max,
/// under `$f`'s target features; and [`Width::fold_max`] through memory.
macro_rules! lane_steps {
    ($f:literal, $v:ty, $n:literal, $load:ident, $store:ident, $set1:ident,
     $mul:ident, $add:ident, $max:ident) => {
        type V = $v;
        const N: usize = $n;

        #[inline]
        #[target_feature(enable = $f)]
        unsafe fn load(p: *const f32) -> $v {
            // SAFETY: the caller's `N` values at `p`.
            unsafe { $load(p) }
        }

        #[inline]
        #[target_feature(enable = $f)]
        unsafe fn store(p: *mut f32, x: $v) {
            // SAFETY: the caller's `N` values at `p`.
            unsafe { $store(p, x) }
        }

        #[inline]
        #[target_feature(enable = $f)]
        unsafe fn splat(x: f32) -> $v {
            $set1(x)
        }

        #[inline]
        #[target_feature(enable = $f)]
        unsafe fn mul(a: $v, b: $v) -> $v {
            $mul(a, b)
        }

        #[inline]
        #[target_feature(enable = $f)]
        unsafe fn add(a: $v, b: $v) -> $v {
            $add(a, b)
        }

        #[inline]
        #[target_feature(enable = $f)]
        unsafe fn max(x: $v, acc: $v) -> $v {
            $max(x, acc)
        }

        #[inline]
        #[target_feature(enable = $f)]
        unsafe fn fold_max(init: f32, x: $v) -> f32 {
            let mut l = [0f32; $n];
            // SAFETY: `l` holds `N` values.
            unsafe { $store(l.as_mut_ptr(), x) };
            l.iter().fold(init, |a, &b| a.max(b))
        }
    };
}

/// 8 lanes: AVX2 (with F16C and POPCNT).
struct W8;

impl Width for W8 {
    /// The NaN lanes OR-ed in a register.
    type Peak = (__m256, __m256, f32);

    lane_steps!(
        "avx",
        __m256,
        8,
        _mm256_loadu_ps,
        _mm256_storeu_ps,
        _mm256_set1_ps,
        _mm256_mul_ps,
        _mm256_add_ps,
        _mm256_max_ps
    );

    #[inline]
    #[target_feature(enable = "avx,f16c,popcnt")]
    unsafe fn round(x: __m256, check: bool, c: &mut Counts) -> __m256 {
        crate::interp::fp16::round8(x, check, c)
    }

    #[inline]
    #[target_feature(enable = "avx,popcnt")]
    unsafe fn count(x: __m256, c: &mut Counts) {
        let a = _mm256_andnot_ps(_mm256_set1_ps(-0.0), x);
        let odd = _mm256_movemask_ps(_mm256_cmp_ps::<_CMP_NLE_UQ>(a, _mm256_set1_ps(65504.0)));
        if odd != 0 {
            let inf = _mm256_movemask_ps(_mm256_cmp_ps::<_CMP_EQ_OQ>(
                a,
                _mm256_set1_ps(f32::INFINITY),
            ));
            let nan = _mm256_movemask_ps(_mm256_cmp_ps::<_CMP_UNORD_Q>(x, x));
            c.0 += (nan | inf).count_ones() as usize;
            c.1 += (odd & !nan & !inf).count_ones() as usize;
        }
    }

    #[inline]
    #[target_feature(enable = "avx,popcnt")]
    unsafe fn rule(x: __m256, scores: bool, c: &mut Counts) -> __m256 {
        let sign = _mm256_set1_ps(-0.0);
        let inf = _mm256_set1_ps(f32::INFINITY);
        let a = _mm256_andnot_ps(sign, x);
        let mut x = x;
        // The lanes that may change or count: NaN, and inf or (on the
        // scores) past the ceiling; most vectors have none.
        let odd = if scores {
            // The flush's lanes are never odd ones.
            let tiny = _mm256_and_ps(
                _mm256_cmp_ps::<_CMP_LT_OQ>(a, _mm256_set1_ps(6.103_515_6e-5)),
                _mm256_cmp_ps::<_CMP_GT_OQ>(a, _mm256_setzero_ps()),
            );
            x = _mm256_andnot_ps(tiny, x);
            _mm256_movemask_ps(_mm256_cmp_ps::<_CMP_NLT_UQ>(a, _mm256_set1_ps(32768.0)))
        } else {
            _mm256_movemask_ps(_mm256_cmp_ps::<_CMP_NLT_UQ>(a, inf))
        };
        if odd == 0 {
            return x;
        }
        x = _mm256_andnot_ps(_mm256_cmp_ps::<_CMP_UNORD_Q>(x, x), x);
        if scores {
            let a = _mm256_andnot_ps(sign, x);
            let over = _mm256_and_ps(
                _mm256_cmp_ps::<_CMP_GE_OQ>(a, _mm256_set1_ps(32768.0)),
                _mm256_cmp_ps::<_CMP_LT_OQ>(a, inf),
            );
            let made = _mm256_movemask_ps(over);
            c.1 += made.count_ones() as usize;
            x = _mm256_blendv_ps(x, _mm256_or_ps(_mm256_and_ps(x, sign), inf), over);
        }
        let infs = _mm256_movemask_ps(_mm256_cmp_ps::<_CMP_EQ_OQ>(_mm256_andnot_ps(sign, x), inf));
        c.0 += infs.count_ones() as usize;
        x
    }

    #[inline]
    #[target_feature(enable = "avx")]
    unsafe fn peak() -> Self::Peak {
        (_mm256_setzero_ps(), _mm256_setzero_ps(), 0.0)
    }

    #[inline]
    #[target_feature(enable = "avx")]
    unsafe fn peak_add(pk: &mut Self::Peak, x: __m256) {
        pk.1 = _mm256_or_ps(pk.1, _mm256_cmp_ps::<_CMP_UNORD_Q>(x, x));
        pk.0 = _mm256_max_ps(_mm256_andnot_ps(_mm256_set1_ps(-0.0), x), pk.0);
    }

    fn peak_add1(pk: &mut Self::Peak, x: f32) {
        peak1(&mut pk.2, x);
    }

    #[inline]
    #[target_feature(enable = "avx")]
    unsafe fn peak_get(pk: Self::Peak) -> f32 {
        if _mm256_movemask_ps(pk.1) != 0 {
            return f32::INFINITY;
        }
        // SAFETY: as this function's.
        unsafe { Self::fold_max(pk.2, pk.0) }
    }

    #[inline]
    #[target_feature(enable = "avx2")]
    unsafe fn exp_shift_inv_sum(row: &mut [f32], max: f32) -> f32 {
        crate::interp::kernels::exp_shift_inv_sum_avx2(row, max)
    }
}

/// 16 lanes: AVX-512F (with F16C and POPCNT). The float logic of
/// AVX-512DQ is not assumed: the sign and infinity bits are set by
/// AVX-512F's integer logic.
struct W16;

impl Width for W16 {
    /// The NaN lanes in a mask.
    type Peak = (__m512, u16, f32);

    lane_steps!(
        "avx512f",
        __m512,
        16,
        _mm512_loadu_ps,
        _mm512_storeu_ps,
        _mm512_set1_ps,
        _mm512_mul_ps,
        _mm512_add_ps,
        _mm512_max_ps
    );

    #[inline]
    #[target_feature(enable = "avx512f,f16c,popcnt")]
    unsafe fn round(x: __m512, check: bool, c: &mut Counts) -> __m512 {
        if check {
            // SAFETY: as this function's.
            unsafe { Self::count(x, c) };
        }
        _mm512_cvtph_ps(_mm512_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(x))
    }

    #[inline]
    #[target_feature(enable = "avx512f,popcnt")]
    unsafe fn count(x: __m512, c: &mut Counts) {
        let a = _mm512_abs_ps(x);
        // One compare finds any value that is NaN or beyond 65504.
        let odd = _mm512_cmp_ps_mask::<_CMP_NLE_UQ>(a, _mm512_set1_ps(65504.0));
        if odd != 0 {
            let inf = _mm512_cmp_ps_mask::<_CMP_EQ_OQ>(a, _mm512_set1_ps(f32::INFINITY));
            let nan = _mm512_cmp_ps_mask::<_CMP_UNORD_Q>(x, x);
            c.0 += (nan | inf).count_ones() as usize;
            c.1 += (odd & !nan & !inf).count_ones() as usize;
        }
    }

    #[inline]
    #[target_feature(enable = "avx512f,popcnt")]
    unsafe fn rule(x: __m512, scores: bool, c: &mut Counts) -> __m512 {
        let inf = _mm512_set1_ps(f32::INFINITY);
        let a = _mm512_abs_ps(x);
        let mut x = x;
        let odd = if scores {
            let tiny = _mm512_cmp_ps_mask::<_CMP_LT_OQ>(a, _mm512_set1_ps(6.103_515_6e-5))
                & _mm512_cmp_ps_mask::<_CMP_GT_OQ>(a, _mm512_setzero_ps());
            x = _mm512_maskz_mov_ps(!tiny, x);
            _mm512_cmp_ps_mask::<_CMP_NLT_UQ>(a, _mm512_set1_ps(32768.0))
        } else {
            _mm512_cmp_ps_mask::<_CMP_NLT_UQ>(a, inf)
        };
        if odd == 0 {
            return x;
        }
        x = _mm512_maskz_mov_ps(!_mm512_cmp_ps_mask::<_CMP_UNORD_Q>(x, x), x);
        if scores {
            let a = _mm512_abs_ps(x);
            let over = _mm512_cmp_ps_mask::<_CMP_GE_OQ>(a, _mm512_set1_ps(32768.0))
                & _mm512_cmp_ps_mask::<_CMP_LT_OQ>(a, inf);
            c.1 += over.count_ones() as usize;
            let sign = _mm512_and_si512(_mm512_castps_si512(x), _mm512_set1_epi32(i32::MIN));
            let signed_inf = _mm512_or_si512(sign, _mm512_castps_si512(inf));
            x = _mm512_mask_mov_ps(x, over, _mm512_castsi512_ps(signed_inf));
        }
        let infs = _mm512_cmp_ps_mask::<_CMP_EQ_OQ>(_mm512_abs_ps(x), inf);
        c.0 += infs.count_ones() as usize;
        x
    }

    #[inline]
    #[target_feature(enable = "avx512f")]
    unsafe fn peak() -> Self::Peak {
        (_mm512_setzero_ps(), 0, 0.0)
    }

    #[inline]
    #[target_feature(enable = "avx512f")]
    unsafe fn peak_add(pk: &mut Self::Peak, x: __m512) {
        pk.1 |= _mm512_cmp_ps_mask::<_CMP_UNORD_Q>(x, x);
        pk.0 = _mm512_max_ps(_mm512_abs_ps(x), pk.0);
    }

    fn peak_add1(pk: &mut Self::Peak, x: f32) {
        peak1(&mut pk.2, x);
    }

    #[inline]
    #[target_feature(enable = "avx512f")]
    unsafe fn peak_get(pk: Self::Peak) -> f32 {
        if pk.1 != 0 {
            return f32::INFINITY;
        }
        // SAFETY: as this function's.
        unsafe { Self::fold_max(pk.2, pk.0) }
    }

    #[inline]
    #[target_feature(enable = "avx512f")]
    unsafe fn exp_shift_inv_sum(row: &mut [f32], max: f32) -> f32 {
        crate::interp::kernels::exp_shift_inv_sum_avx512(row, max)
    }
}

/// The stages of one row with the run's flags as constants: `ROUND` (fp16
/// or ane mode), `COUNT` (the rounding counts: fp16 mode with its check),
/// `ANE` (each stage's rule after its rounding; never with `COUNT`), and
/// `MASK` ([`ABSENT`], [`ZERO`] or [`VALUES`]: then `m` holds the row's
/// mask values). Each stage's counts and peak are the loop's own locals.
/// The first and last passes take four registers a turn where the stages
/// round (their chains are long; one in fp32 mode, where a pass is a
/// multiply), each step across the four in turn so that their chains are
/// in flight together; the counts and peaks take every value whatever the
/// order.
///
/// # Safety
/// Runs inlined into [`stages_avx2`] or [`stages_avx512`], whose target
/// features `W`'s steps need.
#[inline(always)]
unsafe fn stages<
    W: Width,
    const ROUND: bool,
    const COUNT: bool,
    const ANE: bool,
    const MASK: u8,
>(
    (row, m, scale, c, peaks): Args,
) {
    debug_assert!(!(COUNT && ANE) && (ROUND || !(COUNT || ANE)));
    debug_assert!(MASK != VALUES || m.len() == row.len());
    // One stage's rounding, its rule in ane mode, and its peak.
    let stage = |x: W::V, scores: bool, c: &mut Counts, pk: &mut W::Peak| {
        // SAFETY: the function's features (its caller's promise).
        unsafe {
            let mut x = W::round(x, COUNT, c);
            if ANE {
                x = W::rule(x, scores, c);
            }
            W::peak_add(pk, x);
            x
        }
    };
    let stage1 = |x: f32, scores: bool, c: &mut Counts, pk: &mut W::Peak| {
        let mut x = round1(x, COUNT, c);
        if ANE {
            x = rule1(x, scores, c);
        }
        W::peak_add1(pk, x);
        x
    };
    let n = row.len();
    let whole = n / W::N * W::N;
    let (mut c0, mut c1, mut c2, mut c3) = (c[0], c[1], c[2], c[3]);
    // SAFETY (every block of this function): the features, as above, and
    // loads and stores of whole registers inside `row` and the mask's
    // values, which have its length: each from `i + W::N * j`, where the
    // loops' bounds keep it and the register's end within `whole`.
    let (mut pk0, mut pk1, mut pk2, mut pk3) =
        unsafe { (W::peak(), W::peak(), W::peak(), W::peak()) };
    let sc = unsafe { W::splat(scale) };
    let mut lanes = unsafe { W::splat(f32::NEG_INFINITY) };
    let p = row.as_mut_ptr();
    // The first pass on `$n` registers from `i`.
    macro_rules! pass1 {
        ($i:expr, $n:literal) => {{
            let i = $i;
            let mut x: [W::V; $n] = std::array::from_fn(|j| W::load(p.add(i + W::N * j)));
            if ROUND {
                for x in &mut x {
                    *x = stage(*x, true, &mut c0, &mut pk0);
                }
            }
            for x in &mut x {
                *x = W::mul(*x, sc);
            }
            if ROUND {
                for x in &mut x {
                    *x = stage(*x, false, &mut c1, &mut pk1);
                }
            }
            if MASK == ZERO {
                // `x` is fp16 already (and without NaN in ane mode): its
                // rounding and rule would keep it; they count.
                for x in &mut x {
                    if COUNT {
                        W::count(*x, &mut c2);
                    }
                    if ANE {
                        *x = W::rule(*x, false, &mut c2);
                    }
                    if ROUND {
                        W::peak_add(&mut pk2, *x);
                    }
                }
            } else if MASK == VALUES {
                for (j, x) in x.iter_mut().enumerate() {
                    *x = W::add(*x, W::load(m.as_ptr().add(i + W::N * j)));
                }
                if ROUND {
                    for x in &mut x {
                        *x = stage(*x, false, &mut c2, &mut pk2);
                    }
                }
            }
            for (j, x) in x.iter().enumerate() {
                W::store(p.add(i + W::N * j), *x);
                // Returns `lanes` when `x` is NaN, as f32::max does.
                lanes = W::max(*x, lanes);
            }
        }};
    }
    let quads = if ROUND {
        n / (4 * W::N) * (4 * W::N)
    } else {
        0
    };
    for i in (0..quads).step_by(4 * W::N) {
        unsafe { pass1!(i, 4) };
    }
    for i in (quads..whole).step_by(W::N) {
        unsafe { pass1!(i, 1) };
    }
    for i in whole..n {
        let mut x = row[i];
        if ROUND {
            x = stage1(x, true, &mut c0, &mut pk0);
        }
        x *= scale;
        if ROUND {
            x = stage1(x, false, &mut c1, &mut pk1);
        }
        if MASK == VALUES {
            x += m[i];
        }
        if MASK != ABSENT && ROUND {
            x = stage1(x, false, &mut c2, &mut pk2);
        }
        row[i] = x;
    }
    let tail = row[whole..]
        .iter()
        .fold(f32::NEG_INFINITY, |a, &b| a.max(b));
    let max = unsafe { W::fold_max(tail, lanes) };
    let inv = unsafe { W::exp_shift_inv_sum(row, max) };
    let iv = unsafe { W::splat(inv) };
    let p = row.as_mut_ptr();
    // The normalisation, rounded, on `$n` registers from `i`.
    macro_rules! pass3 {
        ($i:expr, $n:literal) => {{
            let i = $i;
            let mut x: [W::V; $n] =
                std::array::from_fn(|j| W::mul(W::load(p.add(i + W::N * j)), iv));
            if ROUND {
                for x in &mut x {
                    *x = stage(*x, false, &mut c3, &mut pk3);
                }
            }
            for (j, x) in x.iter().enumerate() {
                W::store(p.add(i + W::N * j), *x);
            }
        }};
    }
    for i in (0..quads).step_by(4 * W::N) {
        unsafe { pass3!(i, 4) };
    }
    for i in (quads..whole).step_by(W::N) {
        unsafe { pass3!(i, 1) };
    }
    for x in &mut row[whole..] {
        *x *= inv;
        if ROUND {
            *x = stage1(*x, false, &mut c3, &mut pk3);
        }
    }
    *c = [c0, c1, c2, c3];
    if ROUND {
        for (peak, pk) in peaks.iter_mut().zip([pk0, pk1, pk2, pk3]) {
            *peak = peak.max(unsafe { W::peak_get(pk) });
        }
    }
}
