//! The interpreter's fp16 emulation: rounding f32 values to the nearest fp16
//! (ties to even) as the Neural Engine stores activations, in place where
//! the tensor is not shared, counting values that overflow fp16's range.

use candle_core::{DType as CDType, Device, Tensor};
use rayon::prelude::*;

/// `x` rounded to the nearest fp16 value (ties to even), as f32: the same
/// as `half::f16::from_f32(x).to_f32()`, in a few integer operations.
#[inline]
pub fn round_to_f16(x: f32) -> f32 {
    let b = x.to_bits();
    let sign = b & 0x8000_0000;
    let a = b & 0x7FFF_FFFF;
    if a >= 0x3880_0000 {
        // Normal fp16 range and above: keep 10 mantissa bits, ties to even.
        if a > 0x7F80_0000 {
            return x; // NaN
        }
        let r = (a + 0x0FFF + ((a >> 13) & 1)) & !0x1FFF;
        if r >= 0x4780_0000 {
            return f32::from_bits(sign | 0x7F80_0000); // 65520 and up: inf
        }
        f32::from_bits(sign | r)
    } else {
        // fp16 subnormals: multiples of 2^-24 (the scaling is exact).
        let y = (f32::from_bits(a) * 16_777_216.0).round_ties_even() / 16_777_216.0;
        f32::from_bits(sign | y.to_bits())
    }
}

/// Run `f` on the contiguous f32 values of `t` (without a copy when possible).
pub(super) fn with_f32<R>(
    t: &Tensor,
    f: impl FnOnce(&[f32]) -> R,
) -> Result<R, candle_core::Error> {
    {
        let (storage, layout) = t.storage_and_layout();
        if let (candle_core::Storage::Cpu(candle_core::CpuStorage::F32(v)), Some((a, b))) =
            (&*storage, layout.contiguous_offsets())
        {
            return Ok(f(&v[a..b]));
        }
    }
    let v = t.flatten_all()?.to_vec1::<f32>()?;
    Ok(f(&v))
}

/// The f32 tensor `t` as f16, exactly for values rounded to fp16 already;
/// F16C converts 8 values at a time where the CPU has it (`half`'s slice
/// conversion; candle's `to_dtype` converts one value at a time).
pub(super) fn f16_of(t: &Tensor) -> Result<Tensor, candle_core::Error> {
    use half::slice::HalfFloatSliceExt;
    use rayon::prelude::*;
    let v = with_f32(t, |v| {
        let mut out = vec![half::f16::ZERO; v.len()];
        out.par_chunks_mut(1 << 16)
            .zip(v.par_chunks(1 << 16))
            .for_each(|(o, v)| o.convert_from_f32_slice(v));
        out
    })?;
    Tensor::from_vec(v, t.dims(), t.device())
}

/// `f` on the values of a contiguous f16 tensor (the weights the
/// interpreter keeps as stored); `None` for any other tensor.
pub(super) fn with_f16<R>(t: &Tensor, f: impl FnOnce(&[half::f16]) -> R) -> Option<R> {
    let (storage, layout) = t.storage_and_layout();
    match (&*storage, layout.contiguous_offsets()) {
        (candle_core::Storage::Cpu(candle_core::CpuStorage::F16(v)), Some((a, b))) => {
            Some(f(&v[a..b]))
        }
        _ => None,
    }
}

/// Round every value of `v` to the nearest fp16 value, as f32, in place;
/// with `check`, first count the values that are (non-finite, finite but
/// beyond fp16's range), in the same pass. On x86-64 with F16C the rounding
/// is the hardware conversion (8 values per instruction, round to nearest
/// even, subnormals and overflow to inf as IEEE 754 says); elsewhere
/// [`round_to_f16`], which gives the same bits.
pub fn round_f16_in_place(v: &mut [f32], check: bool) -> (usize, usize) {
    #[cfg(target_arch = "x86_64")]
    {
        if std::arch::is_x86_feature_detected!("f16c")
            && std::arch::is_x86_feature_detected!("avx")
            && std::arch::is_x86_feature_detected!("popcnt")
        {
            // SAFETY: the CPU has the features the function is compiled for.
            return unsafe { round_f16c(v, check) };
        }
    }
    let mut counts = (0, 0);
    for x in v {
        *x = round1(*x, check, &mut counts);
    }
    counts
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx,f16c,popcnt")]
unsafe fn round_f16c(v: &mut [f32], check: bool) -> (usize, usize) {
    use std::arch::x86_64::*;
    let mut counts = (0, 0);
    let mut chunks = v.chunks_exact_mut(8);
    for c in &mut chunks {
        // SAFETY: `c` holds exactly 8 f32 values; unaligned loads and stores.
        unsafe {
            let x = round8(_mm256_loadu_ps(c.as_ptr()), check, &mut counts);
            _mm256_storeu_ps(c.as_mut_ptr(), x);
        }
    }
    let rest = chunks.into_remainder();
    for x in rest {
        *x = round1(*x, check, &mut counts);
    }
    counts
}

/// Eight values rounded to fp16 (as f32) by F16C; with `check`, first add
/// the (non-finite, finite beyond fp16's range) ones to `counts`.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx,f16c,popcnt")]
#[inline]
pub(super) fn round8(
    x: std::arch::x86_64::__m256,
    check: bool,
    counts: &mut (usize, usize),
) -> std::arch::x86_64::__m256 {
    use std::arch::x86_64::*;
    let a = _mm256_andnot_ps(_mm256_set1_ps(-0.0), x);
    // One compare finds any value that is NaN or beyond 65504; only then
    // are the kinds counted.
    let odd = _mm256_cmp_ps::<_CMP_NLE_UQ>(a, _mm256_set1_ps(65504.0));
    if check && _mm256_movemask_ps(odd) != 0 {
        let n = |m: __m256| _mm256_movemask_ps(m).count_ones() as usize;
        let nan = n(_mm256_cmp_ps::<_CMP_UNORD_Q>(x, x));
        let infs = n(_mm256_cmp_ps::<_CMP_EQ_OQ>(
            a,
            _mm256_set1_ps(f32::INFINITY),
        ));
        // Beyond 65504: inf included, NaN not.
        let big = n(_mm256_cmp_ps::<_CMP_GT_OQ>(a, _mm256_set1_ps(65504.0)));
        counts.0 += nan + infs;
        counts.1 += big - infs;
    }
    _mm256_cvtph_ps(_mm256_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(x))
}

/// One value rounded to fp16 (as f32), counted first as [`round8`] counts.
#[inline]
pub(crate) fn round1(x: f32, check: bool, counts: &mut (usize, usize)) -> f32 {
    if check {
        if !x.is_finite() {
            counts.0 += 1;
        } else if x.abs() > 65504.0 {
            counts.1 += 1;
        }
    }
    round_to_f16(x)
}

/// What ane mode does to one op's output after its fp16 rounding: the
/// Neural Engine's published behaviours (sources: `docs/numerics.md`, "The
/// ANE precision mode"; [A] is github sbryngelson/ANEForge's docs, [G]
/// sbryngelson/ane-guide `part-1-machine/03-numerics.md`). Every rule is a
/// function of one value, so packed values (carried columns) and the
/// shortcuts get the plain path's bits.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct AneRule {
    /// matmul, linear and conv of two or more taps: an fp16 value with
    /// `|x| >= 32768` becomes ±inf, 32,752 passes ([G] "Saturation hazard";
    /// [A] docs/numeric-cliffs.md "Matmul output saturation", independent of
    /// K). Applied to the op's final output, bias included: no source says
    /// whether the ceiling is checked before or after the bias add. A conv
    /// of one tap (one input channel per group, kernel 1) passed 60,000
    /// ([G]): no ceiling there.
    pub ceiling: bool,
    /// matmul, linear, conv: fp16 subnormals become +0 (flushed in the
    /// matmul accumulator on M1, kept on M5, M2-M4 unmeasured: [G] "Edge
    /// behavior"; the conservative M1 model).
    pub flush: bool,
    /// slice_by_index with a nonzero begin on the last axis: `|x| > 4094`
    /// becomes ±inf (the crop DMA's Q.4 x16 format: [A] docs/numeric-cliffs.md
    /// "Width-offset slice saturation"; [G]: 4094 passes, 4095 is inf; M1/M2
    /// class chips, fixed later: the conservative model).
    pub slice_clamp: bool,
    /// log: `log(+inf) = 0` ([A] docs/faq.md "What about NaN handling?").
    pub log_inf_zero: bool,
}

impl AneRule {
    /// A product's output (matmul, linear, and conv of two or more taps):
    /// the ceiling and the flush.
    pub(crate) const PRODUCT: AneRule = AneRule {
        ceiling: true,
        flush: true,
        slice_clamp: false,
        log_inf_zero: false,
    };

    /// [`AneRule::PRODUCT`] where `product`, else the rule of NaN alone:
    /// an attention chain's stages, of which the first (the scores) is a
    /// matmul's output.
    pub(crate) fn product_if(product: bool) -> AneRule {
        if product {
            AneRule::PRODUCT
        } else {
            AneRule::default()
        }
    }

    /// Whether the rule changes nothing but NaN (which ane mode always
    /// makes +0: [A] faq, 23 ops probed, never NaN; [G]: inf-inf, 0*inf,
    /// sqrt(-1) give +0).
    fn only_nan(&self) -> bool {
        !(self.ceiling || self.flush || self.slice_clamp || self.log_inf_zero)
    }

    /// One fp16 value (as f32) as the Neural Engine leaves it; `made`
    /// counts the values a ceiling or clamp made infinite.
    #[inline]
    pub(crate) fn apply(&self, x: f32, made: &mut usize) -> f32 {
        if x.is_nan() {
            return 0.0;
        }
        let a = x.abs();
        if (self.ceiling && a >= 32768.0 || self.slice_clamp && a > 4094.0) && a.is_finite() {
            *made += 1;
            return f32::INFINITY.copysign(x);
        }
        if self.flush && a < 6.103_515_6e-5 && a > 0.0 {
            return 0.0;
        }
        if self.log_inf_zero && x == f32::INFINITY {
            return 0.0;
        }
        x
    }
}

/// What one rounding pass saw: (non-finite, beyond fp16's range) before
/// rounding (with `check`), the largest `|x|` after (inf where a NaN
/// stays), and, with an [`AneRule`], the infs of the result and those the
/// rule made.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub(crate) struct Seen {
    pub(crate) counts: (usize, usize),
    pub(crate) max_abs: f32,
    pub(crate) infs: usize,
    pub(crate) made: usize,
}

impl Seen {
    pub(crate) fn add(self, o: Seen) -> Seen {
        Seen {
            counts: (self.counts.0 + o.counts.0, self.counts.1 + o.counts.1),
            max_abs: self.max_abs.max(o.max_abs),
            infs: self.infs + o.infs,
            made: self.made + o.made,
        }
    }
}

/// The largest `|x|` of `v`, inf if it holds a NaN; in lanes of 8 so that
/// the compiler keeps it in vector registers.
pub(crate) fn max_abs(v: &[f32]) -> f32 {
    let mut m = [0f32; 8];
    let mut nan = false;
    let mut chunks = v.chunks_exact(8);
    for c in &mut chunks {
        for i in 0..8 {
            let a = c[i].abs();
            nan |= a.is_nan();
            m[i] = if a > m[i] { a } else { m[i] };
        }
    }
    for x in chunks.remainder() {
        let a = x.abs();
        nan |= a.is_nan();
        m[0] = if a > m[0] { a } else { m[0] };
    }
    if nan {
        return f32::INFINITY;
    }
    m.iter().fold(0f32, |a, &b| a.max(b))
}

/// [`round_f16_in_place`] and, in the same pass over the chunk (still in
/// cache), `rule` and the largest `|x|` ([`Seen`]).
pub(crate) fn round_f16_seen(v: &mut [f32], check: bool, rule: Option<&AneRule>) -> Seen {
    let counts = round_f16_in_place(v, check && rule.is_none());
    match rule {
        None => Seen {
            counts,
            max_abs: max_abs(v),
            ..Seen::default()
        },
        Some(r) => ane_in_place(v, r),
    }
}

/// [`AneRule::apply`] on each value of `v` (at most 2^32 - 1 of them),
/// without branches so that it vectorises (the same values:
/// `ane_in_place_is_apply`), in AVX2's lanes where the CPU has them; the
/// values a ceiling or clamp made infinite.
fn rule_block(v: &mut [f32], rule: &AneRule) -> u32 {
    #[inline(always)]
    fn each(v: &mut [f32], rule: &AneRule) -> u32 {
        let (ceiling, clamp) = (rule.ceiling, rule.slice_clamp);
        let (flush, log_inf_zero) = (rule.flush, rule.log_inf_zero);
        let mut made = 0u32;
        for x in v.iter_mut() {
            let (y, a) = (*x, x.abs());
            // NaN compares false: never over, flushed nor inf.
            let over = ((ceiling & (a >= 32768.0)) | (clamp & (a > 4094.0))) & (a < f32::INFINITY);
            let zero = y.is_nan()
                | (flush & (a < 6.103_515_6e-5) & (a > 0.0))
                | (log_inf_zero & (y == f32::INFINITY));
            made += u32::from(over);
            let y = if over { f32::INFINITY.copysign(y) } else { y };
            *x = if zero { 0.0 } else { y };
        }
        made
    }
    #[cfg(target_arch = "x86_64")]
    {
        #[target_feature(enable = "avx2")]
        fn avx2(v: &mut [f32], rule: &AneRule) -> u32 {
            each(v, rule)
        }
        static AVX2: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
        if *AVX2.get_or_init(|| std::arch::is_x86_feature_detected!("avx2")) {
            // SAFETY: the CPU has AVX2.
            return unsafe { avx2(v, rule) };
        }
    }
    each(v, rule)
}

/// `rule` on fp16 values, in place, with what it saw ([`Seen`]).
pub(crate) fn ane_in_place(v: &mut [f32], rule: &AneRule) -> Seen {
    let mut seen = Seen::default();
    if rule.only_nan() {
        for x in v.iter_mut() {
            // NaN -> +0; branch-free so that it vectorises.
            *x = if x.is_nan() { 0.0 } else { *x };
        }
    } else {
        seen.made = v
            .chunks_mut(1 << 20)
            .map(|b| rule_block(b, rule) as usize)
            .sum();
    }
    seen.max_abs = max_abs(v);
    if seen.max_abs.is_infinite() {
        seen.infs = v.iter().filter(|x| x.is_infinite()).count();
    }
    seen
}

/// Values of `v` that are (non-finite, finite but beyond fp16's range).
#[cfg(test)]
pub(super) fn count_overflow(v: &[f32]) -> (usize, usize) {
    v.iter().fold((0, 0), |(n, s), x| {
        if !x.is_finite() {
            (n + 1, s)
        } else if x.abs() > 65504.0 {
            (n, s + 1)
        } else {
            (n, s)
        }
    })
}

/// Round an f32 tensor to fp16 and back in one parallel pass; with `check`,
/// also count its (non-finite, beyond fp16 range) values before rounding.
pub(super) fn round_f16_checked(
    t: &Tensor,
    check: bool,
) -> Result<(Tensor, usize, usize), candle_core::Error> {
    round_f16_seen_copy(t, check, None).map(|(t, s)| (t, s.counts.0, s.counts.1))
}

/// [`round_f16_checked`] with `rule` and what it saw ([`round_f16_seen`]).
pub(super) fn round_f16_seen_copy(
    t: &Tensor,
    check: bool,
    rule: Option<&AneRule>,
) -> Result<(Tensor, Seen), candle_core::Error> {
    const CHUNK: usize = 1 << 14;
    let (out, seen) = with_f32(t, |v| {
        let mut out = v.to_vec();
        let seen = out
            .par_chunks_mut(CHUNK)
            .map(|o| round_f16_seen(o, check, rule))
            .reduce(Seen::default, Seen::add);
        (out, seen)
    })?;
    Ok((Tensor::from_vec(out, t.dims(), &Device::Cpu)?, seen))
}

/// `rule` alone on an f32 tensor of fp16 values (a moved value), copied.
pub(super) fn ane_copy(t: &Tensor, rule: &AneRule) -> Result<(Tensor, Seen), candle_core::Error> {
    let (out, seen) = with_f32(t, |v| {
        let mut out = v.to_vec();
        let seen = out
            .par_chunks_mut(1 << 14)
            .map(|o| ane_in_place(o, rule))
            .reduce(Seen::default, Seen::add);
        (out, seen)
    })?;
    Ok((Tensor::from_vec(out, t.dims(), &Device::Cpu)?, seen))
}

/// The address of a tensor's f32 storage (shared by every view of it).
pub(super) fn storage_addr(t: &Tensor) -> Option<usize> {
    match &*t.storage_and_layout().0 {
        candle_core::Storage::Cpu(candle_core::CpuStorage::F32(v)) => Some(v.as_ptr() as usize),
        _ => None,
    }
}

/// [`round_f16_in_place`] over a contiguous f32 tensor's own storage, in
/// parallel; the counts are left in `counts`.
pub(super) struct RoundInPlace {
    check: bool,
    rule: Option<AneRule>,
    seen: std::sync::Mutex<Seen>,
}

impl candle_core::InplaceOp1 for RoundInPlace {
    fn name(&self) -> &'static str {
        "round-f16-in-place"
    }

    fn cpu_fwd(
        &self,
        storage: &mut candle_core::CpuStorage,
        layout: &candle_core::Layout,
    ) -> candle_core::Result<()> {
        const CHUNK: usize = 1 << 14;
        let (candle_core::CpuStorage::F32(v), Some((a, b))) =
            (storage, layout.contiguous_offsets())
        else {
            candle_core::bail!("in-place rounding needs a contiguous f32 tensor");
        };
        let seen = v[a..b]
            .par_chunks_mut(CHUNK)
            .map(|o| round_f16_seen(o, self.check, self.rule.as_ref()))
            .reduce(Seen::default, Seen::add);
        *self
            .seen
            .lock()
            .map_err(|_| candle_core::Error::Msg("poisoned".into()))? = seen;
        Ok(())
    }
}

/// [`round_f16_checked`] without the copy, for a tensor whose storage no
/// other value shares (the caller's promise): rounded in place.
pub(super) fn round_f16_checked_owned(
    t: Tensor,
    check: bool,
    rule: Option<&AneRule>,
) -> Result<(Tensor, Seen), candle_core::Error> {
    if t.dtype() != CDType::F32 || !t.is_contiguous() {
        return round_f16_seen_copy(&t, check, rule);
    }
    let op = RoundInPlace {
        check,
        rule: rule.copied(),
        seen: std::sync::Mutex::new(Seen::default()),
    };
    t.inplace_op1(&op)?;
    let seen = *op
        .seen
        .lock()
        .map_err(|_| candle_core::Error::Msg("poisoned".into()))?;
    Ok((t, seen))
}

/// Round an f32 tensor to fp16 and back.
pub(super) fn round_f16(t: &Tensor) -> Result<Tensor, candle_core::Error> {
    round_f16_checked(t, false).map(|r| r.0)
}

/// [`round_f16`], sharing `t`'s storage where every value is an fp16 value
/// already (rounding would give the same bits): a bucket's additive mask,
/// 0 and -1e4 over `N x N`, is not copied.
pub(super) fn round_f16_shared(t: &Tensor) -> Result<Tensor, candle_core::Error> {
    let exact = with_f32(t, |v| {
        v.par_chunks(1 << 14).all(|c| {
            c.iter()
                .all(|&x| half::f16::from_f32(x).to_f32().to_bits() == x.to_bits())
        })
    })?;
    if exact { Ok(t.clone()) } else { round_f16(t) }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// [`ane_in_place`] gives [`AneRule::apply`]'s values and count under
    /// every combination of rules, on the values each rule tells apart.
    #[test]
    fn ane_in_place_is_apply() {
        let special = [
            0.0f32,
            -0.0,
            1.0,
            -2.5,
            5.9e-8,
            -3e-5,
            6.103_515_6e-5,
            -6.1e-5,
            4094.0,
            -4095.0,
            32752.0,
            -32768.0,
            65504.0,
            f32::INFINITY,
            f32::NEG_INFINITY,
            f32::NAN,
            -f32::NAN,
        ];
        // Every value at each lane position of the vectorised loop.
        let v: Vec<f32> = (0..special.len() * 19)
            .map(|i| special[(i * 7) % special.len()])
            .collect();
        for bits in 0..16u8 {
            let rule = AneRule {
                ceiling: bits & 1 != 0,
                flush: bits & 2 != 0,
                slice_clamp: bits & 4 != 0,
                log_inf_zero: bits & 8 != 0,
            };
            let mut made = 0;
            let want: Vec<u32> = v
                .iter()
                .map(|&x| rule.apply(x, &mut made).to_bits())
                .collect();
            let mut got = v.clone();
            let seen = ane_in_place(&mut got, &rule);
            let got: Vec<u32> = got.iter().map(|x| x.to_bits()).collect();
            assert_eq!(got, want, "{rule:?}");
            assert_eq!(seen.made, made, "{rule:?}");
            let infs = want
                .iter()
                .filter(|&&b| f32::from_bits(b).is_infinite())
                .count();
            assert_eq!(seen.infs, infs, "{rule:?}");
        }
    }

    /// An input whose values are all fp16 values already is shared, not
    /// copied; any other is rounded as `round_f16` rounds it, bit for bit.
    #[test]
    fn exact_inputs_are_shared_and_others_rounded() {
        let mask: Vec<f32> = (0..100_000)
            .map(|i| if i % 3 == 0 { -1e4 } else { 0.0 })
            .collect();
        let t = Tensor::from_vec(mask, 100_000, &Device::Cpu).unwrap();
        let r = round_f16_shared(&t).unwrap();
        assert_eq!(storage_addr(&r), storage_addr(&t), "shared");
        let bits = |t: &Tensor| -> Vec<u32> {
            t.to_vec1::<f32>()
                .unwrap()
                .iter()
                .map(|x| x.to_bits())
                .collect()
        };
        // One inexact value anywhere (here the last) makes it a rounded copy.
        for odd in [0.1f32, 1e-8, 70000.0, -0.0, f32::NAN] {
            let mut v = vec![0.5f32; 100_000];
            v[99_999] = odd;
            let t = Tensor::from_vec(v, 100_000, &Device::Cpu).unwrap();
            let r = round_f16_shared(&t).unwrap();
            assert_eq!(bits(&r), bits(&round_f16(&t).unwrap()), "{odd}");
            assert_eq!(
                storage_addr(&r) == storage_addr(&t),
                odd == 0.0 || odd.is_nan(),
                "-0.0 and the quiet NaN round to themselves, the others not: {odd}"
            );
        }
    }

    /// The bit-level rounding equals the half crate's conversion on a sweep
    /// of the f32 bit patterns (every 509th, and the edges of fp16's range).
    #[test]
    fn rounding_matches_half() {
        let same = |x: f32| {
            let want = half::f16::from_f32(x).to_f32();
            let got = round_to_f16(x);
            assert!(
                got.to_bits() == want.to_bits() || (got.is_nan() && want.is_nan()),
                "{x:e} ({:#x}): got {got:e}, half says {want:e}",
                x.to_bits()
            );
        };
        for b in (0..=u32::MAX).step_by(509) {
            same(f32::from_bits(b));
        }
        for x in [
            65504.0,
            65519.99,
            65520.0,
            65536.0,
            6.1035156e-5,
            6.1e-5,
            5.96e-8,
            2.98e-8,
            2.9802322e-8,
            1.0 + 1.0 / 2048.0,
            1.0 + 3.0 / 2048.0,
            0.0,
            -0.0,
            f32::INFINITY,
            f32::MIN_POSITIVE,
        ] {
            same(x);
            same(-x);
        }
        // The slice rounding (F16C where the CPU has it) gives the same bits.
        let xs: Vec<f32> = (0..=u32::MAX)
            .step_by(4099)
            .map(f32::from_bits)
            .chain([65519.99, 65520.0, 2.9802322e-8, 2.98e-8, 6.1e-5, -0.0])
            .collect();
        let mut ys = xs.clone();
        round_f16_in_place(&mut ys, false);
        for (x, y) in xs.iter().zip(&ys) {
            let want = round_to_f16(*x);
            assert!(
                y.to_bits() == want.to_bits() || (y.is_nan() && want.is_nan()),
                "{x:e}: slice rounding gave {y:e}, expected {want:e}"
            );
        }
        // Counts in the same pass, in the vector body and the tail alike.
        let mut v: Vec<f32> = (0..45).map(|i| i as f32).collect();
        for (i, x) in [
            (0, f32::NAN),
            (3, f32::INFINITY),
            (9, -70000.0),
            (17, 65504.0),
            (18, -65505.0),
            (30, f32::NEG_INFINITY),
            (41, f32::NAN),
            (44, 1e6),
        ] {
            v[i] = x;
        }
        let want = count_overflow(&v);
        assert_eq!(want, (4, 3));
        let mut w = v.clone();
        assert_eq!(round_f16_in_place(&mut w, true), want);
        assert_eq!(round_f16_in_place(&mut v, false), (0, 0));
        let t = Tensor::new(&[1.0f32, 70000.0, f32::NAN, 1e-9], &Device::Cpu).unwrap();
        let (r, nonfinite, saturated) = round_f16_checked(&t, true).unwrap();
        assert_eq!((nonfinite, saturated), (1, 1));
        let v = r.to_vec1::<f32>().unwrap();
        assert_eq!(v[0], 1.0);
        assert!(v[1].is_infinite() && v[2].is_nan() && v[3] == 0.0);
    }
}
