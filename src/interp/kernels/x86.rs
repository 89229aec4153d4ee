//! The x86-64 paths of the kernels: the portable operations, 8 (AVX2) or
//! 16 (AVX-512F) lanes at a time, chosen at run time by `Isa::best`.

use super::{EXP_HI, EXP_LO, LN2_HEAD, LN2_TAIL, LOG2E, TAYLOR, sum16};
use std::arch::x86_64::*;

/// Round to nearest, ties to even, without exceptions.
const NEAREST: i32 = _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC;

/// [`super::exp`] on 16 lanes.
#[inline]
#[target_feature(enable = "avx512f")]
fn exp16(x: __m512) -> __m512 {
    let [e] = exp16n([x]);
    e
}

/// [`exp16`] on `N` registers at once, step by step across them, as
/// [`exp8n`] takes its registers: the same bits.
#[inline]
#[target_feature(enable = "avx512f")]
fn exp16n<const N: usize>(x: [__m512; N]) -> [__m512; N] {
    let c = _mm512_set1_ps;
    // max/min return their second operand when either is NaN: NaN stays.
    let xc = x.map(|x| _mm512_min_ps(c(EXP_HI), _mm512_max_ps(c(EXP_LO), x)));
    let n = xc.map(|xc| _mm512_roundscale_ps::<NEAREST>(_mm512_mul_ps(xc, c(LOG2E))));
    let mut r = [_mm512_setzero_ps(); N];
    for j in 0..N {
        r[j] = _mm512_sub_ps(
            _mm512_sub_ps(xc[j], _mm512_mul_ps(n[j], c(LN2_HEAD))),
            _mm512_mul_ps(n[j], c(LN2_TAIL)),
        );
    }
    let mut p = [c(TAYLOR[0]); N];
    for &k in &TAYLOR[1..] {
        for j in 0..N {
            p[j] = _mm512_add_ps(_mm512_mul_ps(p[j], r[j]), c(k));
        }
    }
    let mut e = [_mm512_setzero_ps(); N];
    for j in 0..N {
        // n is integral, so the conversion is exact (NaN gives i32::MIN,
        // whose shift is 0, as `NaN as i32` is).
        let shift = _mm512_slli_epi32::<23>(_mm512_cvtps_epi32(n[j]));
        let v = _mm512_castsi512_ps(_mm512_add_epi32(_mm512_castps_si512(p[j]), shift));
        let over = _mm512_cmp_ps_mask::<_CMP_GT_OQ>(x[j], c(EXP_HI));
        let under = _mm512_cmp_ps_mask::<_CMP_LT_OQ>(x[j], c(EXP_LO));
        let v = _mm512_mask_blend_ps(over, v, c(f32::INFINITY));
        e[j] = _mm512_mask_blend_ps(under, v, _mm512_setzero_ps());
    }
    e
}

/// [`super::exp`] on 8 lanes.
#[inline]
#[target_feature(enable = "avx2")]
fn exp8(x: __m256) -> __m256 {
    let [e] = exp8n([x]);
    e
}

/// [`exp8`] on `N` registers at once, step by step across them, so that
/// `N` polynomials' chains are in flight together (one chain alone is
/// bound by its latency, BENCHMARKS.md): each lane the same operations in
/// the same order, so the same bits.
#[inline]
#[target_feature(enable = "avx2")]
fn exp8n<const N: usize>(x: [__m256; N]) -> [__m256; N] {
    let c = _mm256_set1_ps;
    let xc = x.map(|x| _mm256_min_ps(c(EXP_HI), _mm256_max_ps(c(EXP_LO), x)));
    let n = xc.map(|xc| _mm256_round_ps::<NEAREST>(_mm256_mul_ps(xc, c(LOG2E))));
    let mut r = [_mm256_setzero_ps(); N];
    for j in 0..N {
        r[j] = _mm256_sub_ps(
            _mm256_sub_ps(xc[j], _mm256_mul_ps(n[j], c(LN2_HEAD))),
            _mm256_mul_ps(n[j], c(LN2_TAIL)),
        );
    }
    let mut p = [c(TAYLOR[0]); N];
    for &k in &TAYLOR[1..] {
        for j in 0..N {
            p[j] = _mm256_add_ps(_mm256_mul_ps(p[j], r[j]), c(k));
        }
    }
    let mut e = [_mm256_setzero_ps(); N];
    for j in 0..N {
        let shift = _mm256_slli_epi32::<23>(_mm256_cvtps_epi32(n[j]));
        let v = _mm256_castsi256_ps(_mm256_add_epi32(_mm256_castps_si256(p[j]), shift));
        let over = _mm256_cmp_ps::<_CMP_GT_OQ>(x[j], c(EXP_HI));
        let under = _mm256_cmp_ps::<_CMP_LT_OQ>(x[j], c(EXP_LO));
        e[j] = _mm256_andnot_ps(under, _mm256_blendv_ps(v, c(f32::INFINITY), over));
    }
    e
}

/// The first `n` of 16 lanes (`n < 16`).
#[inline]
fn mask16(n: usize) -> __mmask16 {
    ((1u32 << n) - 1) as __mmask16
}

/// All bits set in the first `n` of 8 lanes (`n <= 8`).
#[inline]
#[target_feature(enable = "avx2")]
fn mask8(n: usize) -> __m256i {
    _mm256_cmpgt_epi32(
        _mm256_set1_epi32(n as i32),
        _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7),
    )
}

/// See [`super::row_max`].
#[target_feature(enable = "avx512f")]
pub fn row_max_avx512(row: &[f32]) -> f32 {
    let (n, p) = (row.len(), row.as_ptr());
    let whole = n / 16 * 16;
    let low = _mm512_set1_ps(f32::NEG_INFINITY);
    let mut acc = low;
    for i in (0..whole).step_by(16) {
        // SAFETY: i + 16 <= n. `acc` second: a NaN value leaves it.
        acc = _mm512_max_ps(unsafe { _mm512_loadu_ps(p.add(i)) }, acc);
    }
    if whole < n {
        // SAFETY: the mask reads only the n - whole values left.
        let x = unsafe { _mm512_mask_loadu_ps(low, mask16(n - whole), p.add(whole)) };
        acc = _mm512_max_ps(x, acc);
    }
    let mut l = [0f32; 16];
    // SAFETY: `l` holds 16 values.
    unsafe { _mm512_storeu_ps(l.as_mut_ptr(), acc) };
    l.iter().fold(f32::NEG_INFINITY, |a, &b| a.max(b))
}

/// See [`super::row_max`].
#[target_feature(enable = "avx2")]
pub fn row_max_avx2(row: &[f32]) -> f32 {
    let (n, p) = (row.len(), row.as_ptr());
    let whole = n / 8 * 8;
    let low = _mm256_set1_ps(f32::NEG_INFINITY);
    let mut acc = low;
    for i in (0..whole).step_by(8) {
        // SAFETY: i + 8 <= n. `acc` second: a NaN value leaves it.
        acc = _mm256_max_ps(unsafe { _mm256_loadu_ps(p.add(i)) }, acc);
    }
    if whole < n {
        let m = mask8(n - whole);
        // SAFETY: the mask reads only the n - whole values left.
        let x = unsafe { _mm256_maskload_ps(p.add(whole), m) };
        acc = _mm256_max_ps(_mm256_blendv_ps(low, x, _mm256_castsi256_ps(m)), acc);
    }
    let mut l = [0f32; 8];
    // SAFETY: `l` holds 8 values.
    unsafe { _mm256_storeu_ps(l.as_mut_ptr(), acc) };
    l.iter().fold(f32::NEG_INFINITY, |a, &b| a.max(b))
}

/// See [`super::exp_shift_inv_sum`]: element `i` adds to lane `i % 16`.
#[target_feature(enable = "avx512f")]
pub fn exp_shift_inv_sum_avx512(row: &mut [f32], max: f32) -> f32 {
    let (n, p) = (row.len(), row.as_mut_ptr());
    let whole = n / 16 * 16;
    let m = _mm512_set1_ps(max);
    let mut acc = _mm512_setzero_ps();
    // Four registers a turn (added in order), then one.
    let quads = n / 64 * 64;
    for i in (0..quads).step_by(64) {
        // SAFETY: i + 64 <= n.
        unsafe {
            let x = [0, 16, 32, 48].map(|o| _mm512_sub_ps(_mm512_loadu_ps(p.add(i + o)), m));
            for (j, e) in exp16n(x).into_iter().enumerate() {
                _mm512_storeu_ps(p.add(i + 16 * j), e);
                acc = _mm512_add_ps(acc, e);
            }
        }
    }
    for i in (quads..whole).step_by(16) {
        // SAFETY: i + 16 <= n.
        unsafe {
            let e = exp16(_mm512_sub_ps(_mm512_loadu_ps(p.add(i)), m));
            _mm512_storeu_ps(p.add(i), e);
            acc = _mm512_add_ps(acc, e);
        }
    }
    if whole < n {
        let k = mask16(n - whole);
        // SAFETY: the mask reads and writes only the n - whole values left.
        unsafe {
            let e = exp16(_mm512_sub_ps(_mm512_maskz_loadu_ps(k, p.add(whole)), m));
            _mm512_mask_storeu_ps(p.add(whole), k, e);
            acc = _mm512_mask_add_ps(acc, k, acc, e);
        }
    }
    let mut l = [0f32; 16];
    // SAFETY: `l` holds 16 values.
    unsafe { _mm512_storeu_ps(l.as_mut_ptr(), acc) };
    1.0 / sum16(&l)
}

/// See [`super::exp_shift_inv_sum`]: lanes 0-7 and 8-15 in two registers.
#[target_feature(enable = "avx2")]
pub fn exp_shift_inv_sum_avx2(row: &mut [f32], max: f32) -> f32 {
    let (n, p) = (row.len(), row.as_mut_ptr());
    let m = _mm256_set1_ps(max);
    let mut acc = [_mm256_setzero_ps(); 2];
    let mut i = 0;
    // Four registers a turn: lanes 0-7 take the first and third, 8-15
    // the second and fourth, in order, as the loop below alternates them.
    while i + 32 <= n {
        // SAFETY: i + 32 <= n.
        unsafe {
            let x = [0, 8, 16, 24].map(|o| _mm256_sub_ps(_mm256_loadu_ps(p.add(i + o)), m));
            let e = exp8n(x);
            for (j, e) in e.into_iter().enumerate() {
                _mm256_storeu_ps(p.add(i + 8 * j), e);
                acc[j % 2] = _mm256_add_ps(acc[j % 2], e);
            }
        }
        i += 32;
    }
    while i < n {
        let half = (i / 8) % 2;
        let left = n - i;
        if left >= 8 {
            // SAFETY: i + 8 <= n.
            unsafe {
                let e = exp8(_mm256_sub_ps(_mm256_loadu_ps(p.add(i)), m));
                _mm256_storeu_ps(p.add(i), e);
                acc[half] = _mm256_add_ps(acc[half], e);
            }
        } else {
            let k = mask8(left);
            // SAFETY: the mask reads and writes only the `left` values left.
            unsafe {
                let e = exp8(_mm256_sub_ps(_mm256_maskload_ps(p.add(i), k), m));
                _mm256_maskstore_ps(p.add(i), k, e);
                // +0 in the lanes past the end: the sums (+0 or more, or
                // NaN) keep their bits.
                let e = _mm256_and_ps(e, _mm256_castsi256_ps(k));
                acc[half] = _mm256_add_ps(acc[half], e);
            }
        }
        i += 8;
    }
    let mut l = [0f32; 16];
    // SAFETY: `l` holds 16 values.
    unsafe {
        _mm256_storeu_ps(l.as_mut_ptr(), acc[0]);
        _mm256_storeu_ps(l.as_mut_ptr().add(8), acc[1]);
    }
    1.0 / sum16(&l)
}

/// `row *= s`.
#[target_feature(enable = "avx512f")]
pub fn scale_avx512(row: &mut [f32], s: f32) {
    let (n, p) = (row.len(), row.as_mut_ptr());
    let whole = n / 16 * 16;
    let sv = _mm512_set1_ps(s);
    for i in (0..whole).step_by(16) {
        // SAFETY: i + 16 <= n.
        unsafe { _mm512_storeu_ps(p.add(i), _mm512_mul_ps(_mm512_loadu_ps(p.add(i)), sv)) };
    }
    if whole < n {
        let k = mask16(n - whole);
        // SAFETY: the mask reads and writes only the n - whole values left.
        unsafe {
            let x = _mm512_maskz_loadu_ps(k, p.add(whole));
            _mm512_mask_storeu_ps(p.add(whole), k, _mm512_mul_ps(x, sv));
        }
    }
}

/// `row *= s`.
#[target_feature(enable = "avx2")]
pub fn scale_avx2(row: &mut [f32], s: f32) {
    let (n, p) = (row.len(), row.as_mut_ptr());
    let whole = n / 8 * 8;
    let sv = _mm256_set1_ps(s);
    for i in (0..whole).step_by(8) {
        // SAFETY: i + 8 <= n.
        unsafe { _mm256_storeu_ps(p.add(i), _mm256_mul_ps(_mm256_loadu_ps(p.add(i)), sv)) };
    }
    if whole < n {
        let k = mask8(n - whole);
        // SAFETY: the mask reads and writes only the n - whole values left.
        unsafe {
            let x = _mm256_maskload_ps(p.add(whole), k);
            _mm256_maskstore_ps(p.add(whole), k, _mm256_mul_ps(x, sv));
        }
    }
}

/// [`super::gelu_tanh1`] on 16 lanes.
#[inline]
#[target_feature(enable = "avx512f")]
fn gelu16(x: __m512) -> __m512 {
    let c = _mm512_set1_ps;
    let x2 = _mm512_mul_ps(x, x);
    let z = _mm512_mul_ps(
        x,
        _mm512_add_ps(c(super::GELU_A), _mm512_mul_ps(c(super::GELU_B), x2)),
    );
    _mm512_div_ps(x, _mm512_add_ps(c(1.0), exp16(z)))
}

/// [`super::gelu_tanh1`] on 8 lanes.
#[inline]
#[target_feature(enable = "avx2")]
fn gelu8(x: __m256) -> __m256 {
    let c = _mm256_set1_ps;
    let x2 = _mm256_mul_ps(x, x);
    let z = _mm256_mul_ps(
        x,
        _mm256_add_ps(c(super::GELU_A), _mm256_mul_ps(c(super::GELU_B), x2)),
    );
    _mm256_div_ps(x, _mm256_add_ps(c(1.0), exp8(z)))
}

/// [`super::gelu_erf1`] on 16 lanes: both branches, then a blend.
#[inline]
#[target_feature(enable = "avx512f")]
fn gelu_erf16(x: __m512) -> __m512 {
    use super::{ERF_NEAR, ERFC_A_MAX, ERFC_FAR, ERFC_MID, ERFC_SCALE, HEAD_12};
    let c = _mm512_set1_ps;
    let z = _mm512_mul_ps(x, c(std::f32::consts::FRAC_1_SQRT_2));
    let a = _mm512_abs_ps(z);
    let w = _mm512_mul_ps(z, z);
    let mut p = c(ERF_NEAR[ERF_NEAR.len() - 1]);
    for &k in ERF_NEAR[..ERF_NEAR.len() - 1].iter().rev() {
        p = _mm512_add_ps(_mm512_mul_ps(p, w), c(k));
    }
    let near = _mm512_add_ps(c(1.0), _mm512_mul_ps(z, p));
    let t = _mm512_mul_ps(
        _mm512_sub_ps(_mm512_div_ps(c(1.0), a), c(ERFC_MID)),
        c(ERFC_SCALE),
    );
    let mut q = c(ERFC_FAR[ERFC_FAR.len() - 1]);
    for &k in ERFC_FAR[..ERFC_FAR.len() - 1].iter().rev() {
        q = _mm512_add_ps(_mm512_mul_ps(q, t), c(k));
    }
    // min returns its second operand (16) when `a` is NaN.
    let ac = _mm512_min_ps(a, c(ERFC_A_MAX));
    let h = _mm512_castsi512_ps(_mm512_and_si512(
        _mm512_castps_si512(ac),
        _mm512_set1_epi32(HEAD_12 as i32),
    ));
    let l = _mm512_sub_ps(ac, h);
    // -0.0 - y is -y for every y that is not NaN.
    let e1 = exp16(_mm512_sub_ps(c(-0.0), _mm512_mul_ps(h, h)));
    let e2 = exp16(_mm512_sub_ps(
        c(-0.0),
        _mm512_mul_ps(l, _mm512_add_ps(ac, h)),
    ));
    let erfc = _mm512_mul_ps(_mm512_mul_ps(e1, e2), q);
    let pos = _mm512_cmp_ps_mask::<_CMP_GT_OQ>(z, c(0.0));
    let far = _mm512_mask_blend_ps(pos, erfc, _mm512_sub_ps(c(2.0), erfc));
    let small = _mm512_cmp_ps_mask::<_CMP_LT_OQ>(a, c(1.0));
    let s = _mm512_mask_blend_ps(small, far, near);
    _mm512_mul_ps(_mm512_mul_ps(c(0.5), x), s)
}

/// [`super::gelu_erf1`] on 8 lanes.
#[inline]
#[target_feature(enable = "avx2")]
fn gelu_erf8(x: __m256) -> __m256 {
    use super::{ERF_NEAR, ERFC_A_MAX, ERFC_FAR, ERFC_MID, ERFC_SCALE, HEAD_12};
    let c = _mm256_set1_ps;
    let z = _mm256_mul_ps(x, c(std::f32::consts::FRAC_1_SQRT_2));
    let a = _mm256_andnot_ps(c(-0.0), z);
    let w = _mm256_mul_ps(z, z);
    let mut p = c(ERF_NEAR[ERF_NEAR.len() - 1]);
    for &k in ERF_NEAR[..ERF_NEAR.len() - 1].iter().rev() {
        p = _mm256_add_ps(_mm256_mul_ps(p, w), c(k));
    }
    let near = _mm256_add_ps(c(1.0), _mm256_mul_ps(z, p));
    let t = _mm256_mul_ps(
        _mm256_sub_ps(_mm256_div_ps(c(1.0), a), c(ERFC_MID)),
        c(ERFC_SCALE),
    );
    let mut q = c(ERFC_FAR[ERFC_FAR.len() - 1]);
    for &k in ERFC_FAR[..ERFC_FAR.len() - 1].iter().rev() {
        q = _mm256_add_ps(_mm256_mul_ps(q, t), c(k));
    }
    let ac = _mm256_min_ps(a, c(ERFC_A_MAX));
    let h = _mm256_and_ps(ac, _mm256_castsi256_ps(_mm256_set1_epi32(HEAD_12 as i32)));
    let l = _mm256_sub_ps(ac, h);
    let e1 = exp8(_mm256_sub_ps(c(-0.0), _mm256_mul_ps(h, h)));
    let e2 = exp8(_mm256_sub_ps(
        c(-0.0),
        _mm256_mul_ps(l, _mm256_add_ps(ac, h)),
    ));
    let erfc = _mm256_mul_ps(_mm256_mul_ps(e1, e2), q);
    let pos = _mm256_cmp_ps::<_CMP_GT_OQ>(z, c(0.0));
    let far = _mm256_blendv_ps(erfc, _mm256_sub_ps(c(2.0), erfc), pos);
    let small = _mm256_cmp_ps::<_CMP_LT_OQ>(a, c(1.0));
    let s = _mm256_blendv_ps(far, near, small);
    _mm256_mul_ps(_mm256_mul_ps(c(0.5), x), s)
}

/// [`super::sigmoid1`] on 16 lanes.
#[inline]
#[target_feature(enable = "avx512f")]
fn sigmoid16(x: __m512) -> __m512 {
    let c = _mm512_set1_ps;
    _mm512_div_ps(
        c(1.0),
        _mm512_add_ps(c(1.0), exp16(_mm512_sub_ps(c(0.0), x))),
    )
}

/// [`super::sigmoid1`] on 8 lanes.
#[inline]
#[target_feature(enable = "avx2")]
fn sigmoid8(x: __m256) -> __m256 {
    let c = _mm256_set1_ps;
    _mm256_div_ps(
        c(1.0),
        _mm256_add_ps(c(1.0), exp8(_mm256_sub_ps(c(0.0), x))),
    )
}

/// [`super::silu1`] on 16 lanes.
#[inline]
#[target_feature(enable = "avx512f")]
fn silu16(x: __m512) -> __m512 {
    let c = _mm512_set1_ps;
    _mm512_div_ps(x, _mm512_add_ps(c(1.0), exp16(_mm512_sub_ps(c(0.0), x))))
}

/// [`super::silu1`] on 8 lanes.
#[inline]
#[target_feature(enable = "avx2")]
fn silu8(x: __m256) -> __m256 {
    let c = _mm256_set1_ps;
    _mm256_div_ps(x, _mm256_add_ps(c(1.0), exp8(_mm256_sub_ps(c(0.0), x))))
}

/// `out[i] = f(x[i])` 16 lanes at a time, the tail through a mask;
/// the lengths equal (the caller's check).
macro_rules! lanes16 {
    ($name:ident, $f:ident, $what:literal) => {
        #[doc = concat!("`out = ", $what, "(x)`, the lengths equal (the caller's check).")]
        #[target_feature(enable = "avx512f")]
        pub fn $name(out: &mut [f32], x: &[f32]) {
            let n = x.len().min(out.len());
            let (o, p) = (out.as_mut_ptr(), x.as_ptr());
            let whole = n / 16 * 16;
            for i in (0..whole).step_by(16) {
                // SAFETY: i + 16 <= n, the length of both.
                unsafe { _mm512_storeu_ps(o.add(i), $f(_mm512_loadu_ps(p.add(i)))) };
            }
            if whole < n {
                let k = mask16(n - whole);
                // SAFETY: the mask reads and writes only the n - whole values left.
                unsafe {
                    let y = $f(_mm512_maskz_loadu_ps(k, p.add(whole)));
                    _mm512_mask_storeu_ps(o.add(whole), k, y);
                }
            }
        }
    };
}

/// As `lanes16`, 8 lanes at a time.
macro_rules! lanes8 {
    ($name:ident, $f:ident, $what:literal) => {
        #[doc = concat!("`out = ", $what, "(x)`, the lengths equal (the caller's check).")]
        #[target_feature(enable = "avx2")]
        pub fn $name(out: &mut [f32], x: &[f32]) {
            let n = x.len().min(out.len());
            let (o, p) = (out.as_mut_ptr(), x.as_ptr());
            let whole = n / 8 * 8;
            for i in (0..whole).step_by(8) {
                // SAFETY: i + 8 <= n, the length of both.
                unsafe { _mm256_storeu_ps(o.add(i), $f(_mm256_loadu_ps(p.add(i)))) };
            }
            if whole < n {
                let k = mask8(n - whole);
                // SAFETY: the mask reads and writes only the n - whole values left.
                unsafe {
                    let y = $f(_mm256_maskload_ps(p.add(whole), k));
                    _mm256_maskstore_ps(o.add(whole), k, y);
                }
            }
        }
    };
}

lanes16!(gelu_tanh_avx512, gelu16, "gelu_tanh");
lanes16!(gelu_erf_avx512, gelu_erf16, "gelu_erf");
lanes8!(gelu_erf_avx2, gelu_erf8, "gelu_erf");
lanes8!(gelu_tanh_avx2, gelu8, "gelu_tanh");
lanes16!(sigmoid_avx512, sigmoid16, "sigmoid");
lanes8!(sigmoid_avx2, sigmoid8, "sigmoid");
lanes16!(silu_avx512, silu16, "silu");
lanes8!(silu_avx2, silu8, "silu");

/// [`super::exp`] of every value, 16 or 8 lanes at a time (tests only).
#[cfg(test)]
pub fn exp_slice(wide: bool, v: &mut [f32]) {
    if wide {
        assert!(is_x86_feature_detected!("avx512f"));
        for c in v.chunks_mut(16) {
            let mut b = [0f32; 16];
            b[..c.len()].copy_from_slice(c);
            // SAFETY: AVX-512F is present (asserted above); `b` holds 16 values.
            unsafe { _mm512_storeu_ps(b.as_mut_ptr(), exp16(_mm512_loadu_ps(b.as_ptr()))) };
            let len = c.len();
            c.copy_from_slice(&b[..len]);
        }
    } else {
        assert!(is_x86_feature_detected!("avx2"));
        for c in v.chunks_mut(8) {
            let mut b = [0f32; 8];
            b[..c.len()].copy_from_slice(c);
            // SAFETY: AVX2 is present (asserted above); `b` holds 8 values.
            unsafe { _mm256_storeu_ps(b.as_mut_ptr(), exp8(_mm256_loadu_ps(b.as_ptr()))) };
            let len = c.len();
            c.copy_from_slice(&b[..len]);
        }
    }
}
