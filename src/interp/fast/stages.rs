//! The attention chain's inner stages on one row of scores: scale, mask,
//! fp16 rounding and counts, softmax; portable, AVX2 and AVX-512, with the
//! same bits.

use super::Counts;
use crate::interp::AneRule;
use crate::interp::fp16::round_f16_seen;
use crate::interp::kernels::softmax_in_place;

/// The vector path [`inner_stages`] takes: each gives the portable path's
/// bits in three passes over a row instead of seven.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Simd {
    /// The portable stages, op by op.
    None,
    /// 8 lanes: AVX2 with FMA, F16C and POPCNT (the product with V uses FMA).
    Avx2,
    /// 16 lanes: AVX-512F with AVX2, F16C and POPCNT.
    Avx512,
}

impl Simd {
    /// The widest path this CPU has, or narrower where the environment's
    /// `ANE_EXPORT_SIMD` asks (`avx2` or `none`, for a side-by-side
    /// comparison and for the tests of the narrower paths; read once).
    pub(super) fn here() -> Simd {
        static HERE: std::sync::OnceLock<Simd> = std::sync::OnceLock::new();
        *HERE.get_or_init(|| {
            let best = Simd::detected();
            match std::env::var("ANE_EXPORT_SIMD").as_deref() {
                Ok("none") => Simd::None,
                Ok("avx2") if best == Simd::Avx512 => Simd::Avx2,
                _ => best,
            }
        })
    }

    /// The widest path this CPU has.
    fn detected() -> Simd {
        #[cfg(target_arch = "x86_64")]
        {
            use std::arch::is_x86_feature_detected as has;
            let base = has!("avx2") && has!("fma") && has!("f16c") && has!("popcnt");
            if base && has!("avx512f") {
                return Simd::Avx512;
            }
            if base {
                return Simd::Avx2;
            }
        }
        Simd::None
    }

    /// Whether a vector path runs here: the chain's dead keys, equal rows
    /// and its product with V by [`super::pv`] then keep their sums.
    pub(super) fn any(self) -> bool {
        self != Simd::None
    }
}

/// The mask that [`inner_stages`] adds to one row of scores.
#[derive(Clone, Copy)]
pub(super) enum RowMask<'a> {
    /// The chain has no add.
    Absent,
    /// Zero over the row's keys (from [`MaskSpans`]), so not read: the sum
    /// is the scaled row again, with its fp16 rounding's counts taken again
    /// as the op-by-op path takes them. (A `-0` stays `-0` where the add
    /// would give `+0`; no later value differs: `exp(±0)` is 1 and
    /// `x - (±0)` is `x`.)
    Zero,
    /// The mask's values over the row's keys.
    Values(&'a [f32]),
}

/// The chain's inner stages on one query row of scores, in place:
/// `scaled = row * scale`, `masked = scaled + mask`, `probs = softmax(masked)`.
/// With `fp16 = Some(check)`, the scores and each stage's output are rounded
/// to fp16 as the op-by-op path rounds them, and (with `check`) counted
/// first into `c`. `simd` (from [`Simd::here`]) takes the AVX2 or AVX-512
/// path, which gives the same bits in three passes over the row instead of
/// seven. With fp16, `peaks` keeps each stage's largest `|x|`; with `ane`,
/// each stage's rounding is followed by its op's [`AneRule`] (the scores'
/// matmul: ceiling and flush; NaN to +0 in all) and `c` counts (infs, infs
/// the rule made), as the op-by-op path counts in ane mode.
#[allow(clippy::too_many_arguments)]
pub(super) fn inner_stages(
    row: &mut [f32],
    mask: RowMask,
    scale: f32,
    fp16: Option<bool>,
    ane: bool,
    c: &mut [Counts; 4],
    peaks: &mut [f32; 4],
    simd: Simd,
) {
    // The rule acts on rounded values only.
    let ane = ane && fp16.is_some();
    #[cfg(target_arch = "x86_64")]
    match simd {
        // SAFETY: `simd` says the CPU has the features the path needs.
        Simd::Avx512 => {
            unsafe { inner_stages_avx512(row, mask, scale, fp16, ane, c, peaks) };
            return;
        }
        // SAFETY: as above.
        Simd::Avx2 => {
            unsafe { inner_stages_avx2(row, mask, scale, fp16, ane, c, peaks) };
            return;
        }
        Simd::None => {}
    }
    let _ = simd;
    let mut stage = |s: &mut [f32], i: usize| {
        if let Some(check) = fp16 {
            let rule = AneRule::product_if(i == 0);
            let seen = round_f16_seen(s, check, ane.then_some(&rule));
            let (n, sat) = if ane {
                (seen.infs, seen.made)
            } else {
                seen.counts
            };
            c[i].0 += n;
            c[i].1 += sat;
            peaks[i] = peaks[i].max(seen.max_abs);
        }
    };
    stage(row, 0);
    row.iter_mut().for_each(|x| *x *= scale);
    stage(row, 1);
    match mask {
        RowMask::Absent => {}
        // Each value is fp16 already: the rounding keeps it, and counts.
        RowMask::Zero => stage(row, 2),
        RowMask::Values(m) => {
            row.iter_mut().zip(m).for_each(|(x, m)| *x += m);
            stage(row, 2);
        }
    }
    softmax_in_place(row);
    stage(row, 3);
}

/// The kinds of [`RowMask`], as the vector stages' constant.
#[cfg(target_arch = "x86_64")]
const ABSENT: u8 = 0;
#[cfg(target_arch = "x86_64")]
const ZERO: u8 = 1;
#[cfg(target_arch = "x86_64")]
const VALUES: u8 = 2;

/// A row's flags as the vector stages' constants, `(ROUND, COUNT, ANE,
/// MASK)`, and the mask's values (empty unless `MASK` is [`VALUES`]).
#[cfg(target_arch = "x86_64")]
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
#[cfg(target_arch = "x86_64")]
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

/// [`with_constants`]' call with the mask's kind as the last constant.
#[cfg(target_arch = "x86_64")]
macro_rules! with_mask {
    ($stages:ident, $a:expr, $kind:expr, $r:literal, $n:literal, $an:literal) => {
        match $kind {
            ABSENT => $stages::<$r, $n, $an, ABSENT>($a),
            ZERO => $stages::<$r, $n, $an, ZERO>($a),
            _ => $stages::<$r, $n, $an, VALUES>($a),
        }
    };
}

/// [`inner_stages`] in three passes of 16 lanes: the elementwise stages
/// (each rounded, and in ane mode each followed by its op's [`AneRule`])
/// and the row's maximum; the exponentials and `1 / sum`
/// ([`crate::interp::kernels::exp_shift_inv_sum`], as the op-by-op softmax
/// takes them); the normalisation. The operations and their order are the
/// op-by-op path's, so the bits are. The run's flags and the mask's kind
/// are constants of [`stages_avx512`]'s loops, chosen here once per row.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx2,f16c,popcnt")]
unsafe fn inner_stages_avx512(
    row: &mut [f32],
    mask: RowMask,
    scale: f32,
    fp16: Option<bool>,
    ane: bool,
    c: &mut [Counts; 4],
    peaks: &mut [f32; 4],
) {
    let (flags, m) = constants(mask, fp16, ane);
    let a = (row, m, scale, c, peaks);
    // SAFETY: the CPU has the features (the caller's promise).
    unsafe { with_constants!(stages_avx512, a, flags) }
}

/// A stage's [`AneRule`] on 16 fp16 values: [`rule8`] in 16 lanes.
#[cfg(target_arch = "x86_64")]
#[inline]
#[target_feature(enable = "avx512f,popcnt")]
fn rule16(x: std::arch::x86_64::__m512, scores: bool, c: &mut Counts) -> std::arch::x86_64::__m512 {
    use std::arch::x86_64::*;
    let inf = _mm512_set1_ps(f32::INFINITY);
    let a = _mm512_abs_ps(x);
    let mut x = x;
    // The lanes that may change or count: NaN, and inf or (on the
    // scores) past the ceiling; most vectors have none.
    let odd = if scores {
        // The flush's lanes are never odd ones.
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
        // ±inf with x's sign (AVX-512F's integer logic: the float forms
        // need AVX-512DQ).
        let bits = _mm512_castps_si512(x);
        let sign = _mm512_and_si512(bits, _mm512_set1_epi32(i32::MIN));
        let signed_inf = _mm512_or_si512(sign, _mm512_castps_si512(inf));
        x = _mm512_mask_mov_ps(x, over, _mm512_castsi512_ps(signed_inf));
    }
    let infs = _mm512_cmp_ps_mask::<_CMP_EQ_OQ>(_mm512_abs_ps(x), inf);
    c.0 += infs.count_ones() as usize;
    x
}

/// [`crate::interp::fp16::round8`] in 16 lanes: the value rounded to fp16,
/// counted first with `check`.
#[cfg(target_arch = "x86_64")]
#[inline]
#[target_feature(enable = "avx512f,f16c,popcnt")]
fn round16(x: std::arch::x86_64::__m512, check: bool, c: &mut Counts) -> std::arch::x86_64::__m512 {
    use std::arch::x86_64::*;
    if check {
        count16(x, c);
    }
    _mm512_cvtph_ps(_mm512_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(x))
}

/// The counts of [`round16`] alone (for values fp16 already).
#[cfg(target_arch = "x86_64")]
#[inline]
#[target_feature(enable = "avx512f,popcnt")]
fn count16(x: std::arch::x86_64::__m512, c: &mut Counts) {
    use std::arch::x86_64::*;
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

/// [`Peak8`] in 16 lanes, the NaN lanes in a mask.
#[cfg(target_arch = "x86_64")]
#[derive(Clone, Copy)]
struct Peak16 {
    lanes: std::arch::x86_64::__m512,
    nan: u16,
    tail: f32,
}

#[cfg(target_arch = "x86_64")]
impl Peak16 {
    #[inline]
    #[target_feature(enable = "avx512f")]
    fn new() -> Peak16 {
        Peak16 {
            lanes: std::arch::x86_64::_mm512_setzero_ps(),
            nan: 0,
            tail: 0.0,
        }
    }

    /// 16 values into the peak.
    #[inline]
    #[target_feature(enable = "avx512f")]
    fn add16(&mut self, x: std::arch::x86_64::__m512) {
        use std::arch::x86_64::*;
        self.nan |= _mm512_cmp_ps_mask::<_CMP_UNORD_Q>(x, x);
        self.lanes = _mm512_max_ps(_mm512_abs_ps(x), self.lanes);
    }

    /// One value into the peak.
    fn add1(&mut self, x: f32) {
        peak1(&mut self.tail, x);
    }

    /// The peak: inf where a NaN was seen.
    #[inline]
    #[target_feature(enable = "avx512f")]
    fn get(self) -> f32 {
        if self.nan != 0 {
            return f32::INFINITY;
        }
        let mut l = [0f32; 16];
        // SAFETY: `l` holds 16 values.
        unsafe { std::arch::x86_64::_mm512_storeu_ps(l.as_mut_ptr(), self.lanes) };
        l.iter().fold(self.tail, |a, &b| a.max(b))
    }
}

/// [`inner_stages_avx512`] with its flags as constants, as
/// [`stages_avx2`] in 16 lanes: the same operations on each value in the
/// same order, four registers a turn where the stages round.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx2,f16c,popcnt")]
unsafe fn stages_avx512<const ROUND: bool, const COUNT: bool, const ANE: bool, const MASK: u8>(
    (row, m, scale, c, peaks): (&mut [f32], &[f32], f32, &mut [Counts; 4], &mut [f32; 4]),
) {
    use crate::interp::round1;
    use std::arch::x86_64::*;
    debug_assert!(!(COUNT && ANE) && (ROUND || !(COUNT || ANE)));
    debug_assert!(MASK != VALUES || m.len() == row.len());
    // One stage's rounding, its rule in ane mode, and its peak. (A
    // closure has its function's target features.)
    let stage16 = |x: __m512, scores: bool, c: &mut Counts, pk: &mut Peak16| {
        let mut x = round16(x, COUNT, c);
        if ANE {
            x = rule16(x, scores, c);
        }
        pk.add16(x);
        x
    };
    let stage1 = |x: f32, scores: bool, c: &mut Counts, pk: &mut Peak16| {
        let mut x = round1(x, COUNT, c);
        if ANE {
            x = rule1(x, scores, c);
        }
        pk.add1(x);
        x
    };
    let n = row.len();
    let whole = n / 16 * 16;
    let (mut c0, mut c1, mut c2, mut c3) = (c[0], c[1], c[2], c[3]);
    let (mut pk0, mut pk1, mut pk2, mut pk3) =
        (Peak16::new(), Peak16::new(), Peak16::new(), Peak16::new());
    let sc = _mm512_set1_ps(scale);
    let mut lanes = _mm512_set1_ps(f32::NEG_INFINITY);
    let p = row.as_mut_ptr();
    // The first pass on `$n` registers from `i`, each step across them in
    // turn; the counts and peaks take every value whatever the order.
    macro_rules! pass1 {
        ($i:expr, $n:literal) => {{
            let i = $i;
            let mut x: [__m512; $n] = std::array::from_fn(|j| _mm512_loadu_ps(p.add(i + 16 * j)));
            if ROUND {
                for x in &mut x {
                    *x = stage16(*x, true, &mut c0, &mut pk0);
                }
            }
            for x in &mut x {
                *x = _mm512_mul_ps(*x, sc);
            }
            if ROUND {
                for x in &mut x {
                    *x = stage16(*x, false, &mut c1, &mut pk1);
                }
            }
            if MASK == ZERO {
                // `x` is fp16 already (and without NaN in ane mode): its
                // rounding and rule would keep it; they count.
                for x in &mut x {
                    if COUNT {
                        count16(*x, &mut c2);
                    }
                    if ANE {
                        *x = rule16(*x, false, &mut c2);
                    }
                    if ROUND {
                        pk2.add16(*x);
                    }
                }
            } else if MASK == VALUES {
                for (j, x) in x.iter_mut().enumerate() {
                    *x = _mm512_add_ps(*x, _mm512_loadu_ps(m.as_ptr().add(i + 16 * j)));
                }
                if ROUND {
                    for x in &mut x {
                        *x = stage16(*x, false, &mut c2, &mut pk2);
                    }
                }
            }
            for (j, x) in x.iter().enumerate() {
                _mm512_storeu_ps(p.add(i + 16 * j), *x);
                // Returns `lanes` when `x` is NaN, as f32::max does.
                lanes = _mm512_max_ps(*x, lanes);
            }
        }};
    }
    // Four registers a turn where the stages round; one in fp32 mode.
    let quads = if ROUND { n / 64 * 64 } else { 0 };
    for i in (0..quads).step_by(64) {
        // SAFETY: i + 64 <= n, the length of `row` and of the mask's values.
        unsafe { pass1!(i, 4) };
    }
    for i in (quads..whole).step_by(16) {
        // SAFETY: i + 16 <= n, the length of `row` and of the mask's values.
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
    let mut l = [0f32; 16];
    // SAFETY: `l` holds 16 values.
    unsafe { _mm512_storeu_ps(l.as_mut_ptr(), lanes) };
    let max = row[whole..]
        .iter()
        .chain(&l)
        .fold(f32::NEG_INFINITY, |a, &b| a.max(b));
    // The exponentials and 1 / their sum, as the op-by-op softmax takes them.
    let inv = crate::interp::kernels::exp_shift_inv_sum_avx512(row, max);
    let iv = _mm512_set1_ps(inv);
    // The normalisation, rounded, on `$n` registers from `i`.
    macro_rules! pass3 {
        ($i:expr, $n:literal) => {{
            let i = $i;
            let mut x: [__m512; $n] =
                std::array::from_fn(|j| _mm512_mul_ps(_mm512_loadu_ps(p.add(i + 16 * j)), iv));
            if ROUND {
                for x in &mut x {
                    *x = stage16(*x, false, &mut c3, &mut pk3);
                }
            }
            for (j, x) in x.iter().enumerate() {
                _mm512_storeu_ps(p.add(i + 16 * j), *x);
            }
        }};
    }
    for i in (0..quads).step_by(64) {
        // SAFETY: i + 64 <= n.
        unsafe { pass3!(i, 4) };
    }
    for i in (quads..whole).step_by(16) {
        // SAFETY: i + 16 <= n.
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
            *peak = peak.max(pk.get());
        }
    }
}

/// [`inner_stages_avx512`] in 8 lanes: the same three passes, the same
/// operations in the same order (the exponentials' sum in 16 lanes, two
/// registers, by [`crate::interp::kernels::exp_shift_inv_sum_avx2`]), so the
/// same bits, ane mode's rules included. The run's flags and the mask's
/// kind are constants of [`stages_avx2`]'s loops, chosen here once per row.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c,popcnt")]
unsafe fn inner_stages_avx2(
    row: &mut [f32],
    mask: RowMask,
    scale: f32,
    fp16: Option<bool>,
    ane: bool,
    c: &mut [Counts; 4],
    peaks: &mut [f32; 4],
) {
    let (flags, m) = constants(mask, fp16, ane);
    let a = (row, m, scale, c, peaks);
    // SAFETY: the CPU has the features (the caller's promise).
    unsafe { with_constants!(stages_avx2, a, flags) }
}

/// A stage's [`AneRule`] on 8 fp16 values, as [`AneRule::apply`] and the
/// portable path count it: NaN to +0; on the scores (the matmul's output),
/// the ceiling (a finite `|x| >= 32768` to ±inf, counted in `c.1`) and the
/// flush (fp16 subnormals to +0); then the infinities, counted in `c.0`.
#[cfg(target_arch = "x86_64")]
#[inline]
#[target_feature(enable = "avx2,popcnt")]
fn rule8(x: std::arch::x86_64::__m256, scores: bool, c: &mut Counts) -> std::arch::x86_64::__m256 {
    use std::arch::x86_64::*;
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

/// [`rule8`] on one value.
#[cfg(target_arch = "x86_64")]
fn rule1(x: f32, scores: bool, c: &mut Counts) -> f32 {
    let rule = AneRule::product_if(scores);
    let x = rule.apply(x, &mut c.1);
    c.0 += usize::from(x.is_infinite());
    x
}

/// The counts of [`crate::interp::fp16::round8`] alone (for values fp16
/// already).
#[cfg(target_arch = "x86_64")]
#[inline]
#[target_feature(enable = "avx2,popcnt")]
fn count8(x: std::arch::x86_64::__m256, c: &mut Counts) {
    use std::arch::x86_64::*;
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

/// One value of a row's tail into a stage's peak: inf for a NaN.
#[cfg(target_arch = "x86_64")]
fn peak1(peak: &mut f32, x: f32) {
    *peak = if x.is_nan() {
        f32::INFINITY
    } else {
        peak.max(x.abs())
    };
}

/// One stage's peak over a row: the largest `|x|` in 8 lanes, and the
/// lanes that held a NaN (`max` passes over it), OR-ed.
#[cfg(target_arch = "x86_64")]
#[derive(Clone, Copy)]
struct Peak8 {
    lanes: std::arch::x86_64::__m256,
    nan: std::arch::x86_64::__m256,
    tail: f32,
}

#[cfg(target_arch = "x86_64")]
impl Peak8 {
    #[inline]
    #[target_feature(enable = "avx")]
    fn new() -> Peak8 {
        use std::arch::x86_64::*;
        Peak8 {
            lanes: _mm256_setzero_ps(),
            nan: _mm256_setzero_ps(),
            tail: 0.0,
        }
    }

    /// 8 values into the peak.
    #[inline]
    #[target_feature(enable = "avx")]
    fn add8(&mut self, x: std::arch::x86_64::__m256) {
        use std::arch::x86_64::*;
        self.nan = _mm256_or_ps(self.nan, _mm256_cmp_ps::<_CMP_UNORD_Q>(x, x));
        self.lanes = _mm256_max_ps(_mm256_andnot_ps(_mm256_set1_ps(-0.0), x), self.lanes);
    }

    /// One value into the peak.
    fn add1(&mut self, x: f32) {
        peak1(&mut self.tail, x);
    }

    /// The peak: inf where a NaN was seen.
    #[inline]
    #[target_feature(enable = "avx")]
    fn get(self) -> f32 {
        use std::arch::x86_64::*;
        if _mm256_movemask_ps(self.nan) != 0 {
            return f32::INFINITY;
        }
        let mut l = [0f32; 8];
        // SAFETY: `l` holds 8 values.
        unsafe { _mm256_storeu_ps(l.as_mut_ptr(), self.lanes) };
        l.iter().fold(self.tail, |a, &b| a.max(b))
    }
}

/// [`inner_stages_avx2`] with its flags as constants: `ROUND` (fp16 or
/// ane mode), `COUNT` (the rounding counts: fp16 mode with its check),
/// `ANE` (each stage's rule after its rounding; never with `COUNT`), and
/// `MASK` ([`ABSENT`], [`ZERO`] or [`VALUES`]: then `m` holds the row's
/// mask values). Each stage's counts and peak are the loop's own locals.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c,popcnt")]
unsafe fn stages_avx2<const ROUND: bool, const COUNT: bool, const ANE: bool, const MASK: u8>(
    (row, m, scale, c, peaks): (&mut [f32], &[f32], f32, &mut [Counts; 4], &mut [f32; 4]),
) {
    use crate::interp::fp16::round8;
    use crate::interp::round1;
    use std::arch::x86_64::*;
    debug_assert!(!(COUNT && ANE) && (ROUND || !(COUNT || ANE)));
    debug_assert!(MASK != VALUES || m.len() == row.len());
    // One stage's rounding, its rule in ane mode, and its peak. (A
    // closure has its function's target features.)
    let stage8 = |x: __m256, scores: bool, c: &mut Counts, pk: &mut Peak8| {
        let mut x = round8(x, COUNT, c);
        if ANE {
            x = rule8(x, scores, c);
        }
        pk.add8(x);
        x
    };
    let stage1 = |x: f32, scores: bool, c: &mut Counts, pk: &mut Peak8| {
        let mut x = round1(x, COUNT, c);
        if ANE {
            x = rule1(x, scores, c);
        }
        pk.add1(x);
        x
    };
    let n = row.len();
    let whole = n / 8 * 8;
    let (mut c0, mut c1, mut c2, mut c3) = (c[0], c[1], c[2], c[3]);
    let (mut pk0, mut pk1, mut pk2, mut pk3) =
        (Peak8::new(), Peak8::new(), Peak8::new(), Peak8::new());
    let sc = _mm256_set1_ps(scale);
    let mut lanes = _mm256_set1_ps(f32::NEG_INFINITY);
    let p = row.as_mut_ptr();
    // The first pass on `$n` registers from `i`, each step across them in
    // turn, so that their chains are in flight together; the counts and
    // peaks take every value whatever the order.
    macro_rules! pass1 {
        ($i:expr, $n:literal) => {{
            let i = $i;
            let mut x: [__m256; $n] = std::array::from_fn(|j| _mm256_loadu_ps(p.add(i + 8 * j)));
            if ROUND {
                for x in &mut x {
                    *x = stage8(*x, true, &mut c0, &mut pk0);
                }
            }
            for x in &mut x {
                *x = _mm256_mul_ps(*x, sc);
            }
            if ROUND {
                for x in &mut x {
                    *x = stage8(*x, false, &mut c1, &mut pk1);
                }
            }
            if MASK == ZERO {
                // `x` is fp16 already (and without NaN in ane mode): its
                // rounding and rule would keep it; they count.
                for x in &mut x {
                    if COUNT {
                        count8(*x, &mut c2);
                    }
                    if ANE {
                        *x = rule8(*x, false, &mut c2);
                    }
                    if ROUND {
                        pk2.add8(*x);
                    }
                }
            } else if MASK == VALUES {
                for (j, x) in x.iter_mut().enumerate() {
                    *x = _mm256_add_ps(*x, _mm256_loadu_ps(m.as_ptr().add(i + 8 * j)));
                }
                if ROUND {
                    for x in &mut x {
                        *x = stage8(*x, false, &mut c2, &mut pk2);
                    }
                }
            }
            for (j, x) in x.iter().enumerate() {
                _mm256_storeu_ps(p.add(i + 8 * j), *x);
                lanes = _mm256_max_ps(*x, lanes);
            }
        }};
    }
    // Four registers a turn where the stages round (their chains are
    // long); one in fp32 mode, where a pass is a multiply.
    let quads = if ROUND { n / 32 * 32 } else { 0 };
    for i in (0..quads).step_by(32) {
        // SAFETY: i + 32 <= n, the length of `row` and of the mask's values.
        unsafe { pass1!(i, 4) };
    }
    for i in (quads..whole).step_by(8) {
        // SAFETY: i + 8 <= n, the length of `row` and of the mask's values.
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
    let mut l = [0f32; 8];
    // SAFETY: `l` holds 8 values.
    unsafe { _mm256_storeu_ps(l.as_mut_ptr(), lanes) };
    let max = row[whole..]
        .iter()
        .chain(&l)
        .fold(f32::NEG_INFINITY, |a, &b| a.max(b));
    let inv = crate::interp::kernels::exp_shift_inv_sum_avx2(row, max);
    let iv = _mm256_set1_ps(inv);
    // The normalisation, rounded, on `$n` registers from `i`.
    macro_rules! pass3 {
        ($i:expr, $n:literal) => {{
            let i = $i;
            let mut x: [__m256; $n] =
                std::array::from_fn(|j| _mm256_mul_ps(_mm256_loadu_ps(p.add(i + 8 * j)), iv));
            if ROUND {
                for x in &mut x {
                    *x = stage8(*x, false, &mut c3, &mut pk3);
                }
            }
            for (j, x) in x.iter().enumerate() {
                _mm256_storeu_ps(p.add(i + 8 * j), *x);
            }
        }};
    }
    for i in (0..quads).step_by(32) {
        // SAFETY: i + 32 <= n.
        unsafe { pass3!(i, 4) };
    }
    for i in (quads..whole).step_by(8) {
        // SAFETY: i + 8 <= n.
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
            *peak = peak.max(pk.get());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::interp::fast::testing::lcg;

    /// Bits, with every NaN alike (the compiler may commute a product, and
    /// with it which NaN's sign propagates).
    fn bits(v: &[f32]) -> Vec<u32> {
        v.iter()
            .map(|x| if x.is_nan() { u32::MAX } else { x.to_bits() })
            .collect()
    }

    /// The vector paths this CPU runs: AVX2 under AVX-512 too.
    pub(in crate::interp::fast) fn vector_paths() -> Vec<Simd> {
        match Simd::detected() {
            Simd::Avx512 => vec![Simd::Avx2, Simd::Avx512],
            Simd::Avx2 => vec![Simd::Avx2],
            Simd::None => vec![],
        }
    }

    /// The AVX2 and AVX-512 inner stages give the portable stages' bits,
    /// counts and peaks, in fp32, fp16 and ane modes: on plain rows with a
    /// tail, on rows with values beyond fp16's range, past ane mode's
    /// ceiling, fp16 subnormals (ane mode's flush), and on rows with an
    /// infinity or a NaN.
    #[test]
    fn inner_stages_paths_agree() {
        for len in [5usize, 8, 16, 37, 90, 300] {
            let plain: Vec<f32> = lcg(len, 11).iter().map(|v| v * 40.0).collect();
            let mask: Vec<f32> = (0..len)
                .map(|i| if i % 3 == 0 { -1e9 } else { 0.0 })
                .collect();
            let mut big = plain.clone();
            big[len / 2] = 1e6;
            big[len - 1] = -7e4;
            let mut inf = plain.clone();
            inf[len - 2] = f32::INFINITY;
            let mut nan = plain.clone();
            nan[1] = f32::NAN;
            let mut ceiling = plain.clone();
            ceiling[0] = 40000.0;
            ceiling[len - 1] = -32768.0;
            ceiling[len / 2] = 32752.0;
            let mut tiny = plain.clone();
            tiny[len / 3] = 3e-5;
            tiny[len - 1] = -1e-7;
            // Past the ceiling and NaN where the 16-lane path takes one
            // register at a time after its quads (lengths 90 and 300).
            let mut late = plain.clone();
            late[len * 7 / 8] = 40000.0;
            late[(len * 7 / 8 + 1) % len] = f32::NAN;
            for (kind, row) in [
                ("plain", &plain),
                ("big", &big),
                ("inf", &inf),
                ("nan", &nan),
                ("ceiling", &ceiling),
                ("tiny", &tiny),
                ("late", &late),
            ] {
                for (fp16, ane) in [
                    (None, false),
                    (Some(false), false),
                    (Some(true), false),
                    (Some(false), true),
                    (Some(true), true),
                ] {
                    for m in [RowMask::Absent, RowMask::Values(&mask)] {
                        let mut a = row.clone();
                        let mut ca = [(0, 0); 4];
                        let mut pa = [0.0; 4];
                        inner_stages(&mut a, m, 0.37, fp16, ane, &mut ca, &mut pa, Simd::None);
                        for simd in vector_paths() {
                            let mut b = row.clone();
                            let mut cb = [(0, 0); 4];
                            let mut pb = [0.0; 4];
                            inner_stages(&mut b, m, 0.37, fp16, ane, &mut cb, &mut pb, simd);
                            let at = format!("{kind} len {len} fp16 {fp16:?} ane {ane} {simd:?}");
                            assert_eq!(bits(&a), bits(&b), "{at}");
                            assert_eq!(ca, cb, "{at}");
                            assert_eq!(bits(&pa), bits(&pb), "{at}");
                        }
                        if ane {
                            // No NaN survives ane mode; the ceiling makes
                            // infs of the scores past it, counted as made.
                            assert!(a.iter().all(|x| !x.is_nan()), "{kind} len {len}");
                            let want = match kind {
                                "ceiling" => (2, 2),
                                "late" => (1, 1),
                                "big" => (2, 0),
                                "inf" => (1, 0),
                                _ => (0, 0),
                            };
                            assert_eq!(ca[0], want, "{kind} len {len} ane");
                            continue;
                        }
                        if fp16 == Some(true) {
                            let want = match kind {
                                "plain" | "ceiling" | "tiny" => (0, 0),
                                "big" => (0, 2),
                                // "inf", "nan", "late"
                                _ => (1, 0),
                            };
                            assert_eq!(ca[0], want, "{kind} len {len}");
                        }
                        if kind == "plain" {
                            let sum: f32 = a.iter().sum();
                            assert!((sum - 1.0).abs() < 1e-2, "{sum}");
                        }
                    }
                }
            }
        }
    }

    /// A mask of zeros not read ([`RowMask::Zero`]) gives the bits and
    /// counts of adding it, on both paths: rows with -0 scores (the add
    /// would make them +0), a row of zeros, values beyond fp16's range,
    /// infinities and NaN, masks of +0 and of -0.
    #[test]
    fn a_zero_mask_not_read_gives_the_same_bits_and_counts() {
        for len in [5usize, 16, 37, 300] {
            let mut plain: Vec<f32> = lcg(len, 5).iter().map(|v| v * 30.0).collect();
            plain[0] = -0.0;
            plain[len - 1] = -0.0;
            let zeros = vec![0f32; len];
            let mut negzeros = vec![-0f32; len];
            negzeros[len / 2] = 0.0;
            let mut big = plain.clone();
            big[len / 2] = 7e4;
            let mut odd = plain.clone();
            odd[1] = f32::NAN;
            odd[len - 2] = f32::NEG_INFINITY;
            let mut simds = vector_paths();
            simds.push(Simd::None);
            for row in [&plain, &vec![-0f32; len], &big, &odd] {
                for (fp16, ane) in [
                    (None, false),
                    (Some(false), false),
                    (Some(true), false),
                    (Some(true), true),
                ] {
                    for added in [&zeros, &negzeros] {
                        for &simd in &simds {
                            let (mut a, mut b) = (row.clone(), row.clone());
                            let (mut ca, mut cb) = ([(0, 0); 4], [(0, 0); 4]);
                            let (mut pa, mut pb) = ([0.0; 4], [0.0; 4]);
                            let added = RowMask::Values(added);
                            inner_stages(&mut a, added, 0.125, fp16, ane, &mut ca, &mut pa, simd);
                            inner_stages(
                                &mut b,
                                RowMask::Zero,
                                0.125,
                                fp16,
                                ane,
                                &mut cb,
                                &mut pb,
                                simd,
                            );
                            let at = format!("len {len} fp16 {fp16:?} ane {ane} {simd:?}");
                            assert_eq!(bits(&a), bits(&b), "{at}");
                            assert_eq!(ca, cb, "{at}");
                            assert_eq!(bits(&pa), bits(&pb), "{at}");
                            if fp16 == Some(true) && row == &big {
                                assert_eq!(cb[2], (1, 0), "{at}: 7e4 is inf after stage 1");
                            }
                        }
                    }
                }
            }
        }
    }
}
