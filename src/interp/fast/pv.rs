//! The product of an attention chain's probabilities with V, by vector
//! registers holding a block of query rows (AVX-512, or AVX2 with FMA),
//! skipping keys of zero probability exactly. Each output is one fused
//! multiply-add chain in key order from +0 on both, so the two give the
//! same bits.

#[cfg(target_arch = "x86_64")]
use super::stages::Simd;

/// Whether [`pv`] takes a value width of `hdv` on this CPU: at most 128
/// values (eight zmm registers a row), where the stages have a vector path
/// ([`Simd::here`]: AVX-512F, or AVX2 with FMA).
pub(super) fn pv_fits(hdv: usize) -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        (1..=PV_MAX_WIDTH).contains(&hdv) && Simd::here().any()
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = hdv;
        false
    }
}

/// The widest value [`pv`] takes: eight zmm registers.
#[cfg(target_arch = "x86_64")]
const PV_MAX_WIDTH: usize = 128;

/// [`pv_avx512`] where the CPU has AVX-512F, else [`pv_avx2`]: the same
/// bits.
///
/// # Safety
/// [`pv_fits`]`(hdv)`, and the rest of [`pv_avx512`]'s contract.
#[cfg(target_arch = "x86_64")]
pub(super) unsafe fn pv(
    probs: &[f32],
    dims: (usize, usize, usize),
    vt: &[f32],
    ctx: *mut f32,
    nq: usize,
    skip_zeros: bool,
) {
    // SAFETY: forwarded; `pv_fits` says the CPU has one of the two.
    unsafe {
        if Simd::here() == Simd::Avx512 {
            pv_avx512(probs, dims, vt, ctx, nq, skip_zeros)
        } else {
            pv_avx2(probs, dims, vt, ctx, nq, skip_zeros)
        }
    }
}

/// `ctx[d, i] = sum_k probs[i, k] * vt[k, d]` for the `t` rows of `probs
/// [t, nk]`, written to `ctx` with row stride `nq` (column `i` of each of
/// the `hdv` rows). Blocks of query rows by the whole value width (in
/// `C = ceil(hdv / 16)` registers, the last one masked where `hdv` is not a
/// multiple of 16) are held in registers while the keys stream by, so
/// neither operand is packed. Each output is one running sum in key order,
/// however many rows a block holds, so the block sizes leave the bits alone.
///
/// With `skip_zeros` (every value of `vt` finite), a block runs over the
/// keys from its rows' first non-zero probability to their last only. The
/// keys left out have probability exactly 0 in every row of the block, and
/// `fma(0, v, s) = s` for finite `v` (the running sum never is -0), so the
/// bits are those of the full sum. Padding is where this pays: a pad query
/// attends to itself alone, and a real one to its own image's tokens.
///
/// # Safety
/// The CPU must have AVX-512F and [`pv_fits`]`(hdv)`; `vt` is
/// `[nk, hdv]`; `ctx + d * nq + i` must be writable for every `d < hdv`,
/// `i < t`, by this caller alone.
#[cfg(target_arch = "x86_64")]
unsafe fn pv_avx512(
    probs: &[f32],
    (t, nk, hdv): (usize, usize, usize),
    vt: &[f32],
    ctx: *mut f32,
    nq: usize,
    skip_zeros: bool,
) {
    debug_assert!(probs.len() >= t * nk && vt.len() >= nk * hdv);
    debug_assert!((1..=PV_MAX_WIDTH).contains(&hdv));
    let regs = hdv.div_ceil(16);
    // The lanes of the last register that hold values.
    let tail: u16 = if hdv % 16 == 0 {
        u16::MAX
    } else {
        (1u16 << (hdv % 16)) - 1
    };
    // Rows a block holds: R * C accumulators, C values and a broadcast
    // within the 32 zmm registers.
    let block_rows = match regs {
        4 => 6,
        1..=6 => 4,
        _ => 3,
    };
    let w = 16 * regs;
    let mut tmp = [0f32; 6 * PV_MAX_WIDTH];
    let mut i = 0;
    while i < t {
        let rows = (t - i).min(block_rows);
        let block = &probs[i * nk..(i + rows) * nk];
        let (lo, hi) = if skip_zeros {
            block.chunks_exact(nk).fold((nk, 0), |(lo, hi), row| {
                // SAFETY: the CPU has AVX-512F (the caller's promise).
                let (a, b) = unsafe { nonzero_span(row) };
                (lo.min(a), hi.max(b))
            })
        } else {
            (0, nk)
        };
        let (lo, n) = (lo.min(hi), hi.saturating_sub(lo));
        let p = &probs[i * nk + lo..];
        let v = &vt[lo * hdv..];
        let a = (p, (nk, n), v, hdv, tail, &mut tmp[..]);
        // SAFETY: the CPU has AVX-512F (the caller's promise); `p` holds
        // `rows` rows of stride nk from key `lo`, n <= nk - lo keys each;
        // `v` holds n rows of hdv values, the last register's lanes past
        // hdv masked off; `tmp` holds 6 rows of 128.
        unsafe {
            macro_rules! dispatch {
                ($($r:literal),*) => {
                    match (rows, regs) {
                        $(
                            ($r, 1) => pv_block::<$r, 1>(a),
                            ($r, 2) => pv_block::<$r, 2>(a),
                            ($r, 3) => pv_block::<$r, 3>(a),
                            ($r, 4) => pv_block::<$r, 4>(a),
                            ($r, 5) => pv_block::<$r, 5>(a),
                            ($r, 6) => pv_block::<$r, 6>(a),
                            ($r, 7) => pv_block::<$r, 7>(a),
                            ($r, _) => pv_block::<$r, 8>(a),
                        )*
                        _ => unreachable!("blocks hold 1 to 6 rows"),
                    }
                };
            }
            dispatch!(1, 2, 3, 4, 5, 6);
        }
        for r in 0..rows {
            for d in 0..hdv {
                // SAFETY: d < hdv and i + r < t, inside the caller's promise.
                unsafe { *ctx.add(d * nq + i + r) = tmp[r * w + d] };
            }
        }
        i += rows;
    }
}

/// The span `(first, last + 1)` of a row's values that are not zero (NaN
/// counts as not zero); `(len, 0)` when every value is zero.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
fn nonzero_span(row: &[f32]) -> (usize, usize) {
    use std::arch::x86_64::*;
    let n = row.len();
    let whole = n / 16 * 16;
    let zero = _mm512_setzero_ps();
    // The bits of 16 values at i that are not zero.
    let lanes = |i: usize| -> u16 {
        // SAFETY: callers pass i + 16 <= n.
        unsafe { _mm512_cmp_ps_mask::<_CMP_NEQ_UQ>(_mm512_loadu_ps(row.as_ptr().add(i)), zero) }
    };
    let first = (0..whole)
        .step_by(16)
        .find_map(|i| {
            let m = lanes(i);
            (m != 0).then(|| i + m.trailing_zeros() as usize)
        })
        .or_else(|| (whole..n).find(|&i| row[i] != 0.0));
    let Some(first) = first else {
        return (n, 0);
    };
    let last = (whole..n)
        .rev()
        .find(|&i| row[i] != 0.0)
        .or_else(|| {
            (0..whole).step_by(16).rev().find_map(|i| {
                let m = lanes(i);
                (m != 0).then(|| i + 15 - m.leading_zeros() as usize)
            })
        })
        .unwrap_or(first);
    (first, last + 1)
}

/// `out [R, 16 C] = p [R, n] · vt [n, hdv]`, the rows of `p` `stride`
/// apart and those of `vt` `hdv` (`16 (C - 1) < hdv <= 16 C`: the last
/// register loads the lanes `tail` sets, the others are 0), with `R * C`
/// zmm accumulators: each output is one running sum in key order.
/// (Blocking the keys so that V's rows stay in L1 measured slower.)
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn pv_block<const R: usize, const C: usize>(
    (p, (stride, n), vt, hdv, tail, out): PvArgs<u16>,
) {
    use std::arch::x86_64::*;
    let w = 16 * C;
    debug_assert!(
        (R == 0 || p.len() >= (R - 1) * stride + n)
            && (n == 0 || vt.len() >= (n - 1) * hdv + 16 * (C - 1) + (tail.count_ones() as usize))
            && out.len() >= R * w
            && 16 * (C - 1) < hdv
            && hdv <= w
    );
    let (pp, vp) = (p.as_ptr(), vt.as_ptr());
    let mut acc = [[_mm512_setzero_ps(); C]; R];
    for k in 0..n {
        // SAFETY: k < n: row k of vt holds hdv values, of which the last
        // register reads the `tail` lanes alone; p[r * stride + k] lies in
        // row r < R.
        unsafe {
            let mut v = [_mm512_setzero_ps(); C];
            for (c, v) in v.iter_mut().enumerate() {
                let at = vp.add(k * hdv + 16 * c);
                *v = if c + 1 < C {
                    _mm512_loadu_ps(at)
                } else {
                    _mm512_maskz_loadu_ps(tail, at)
                };
            }
            for (r, acc) in acc.iter_mut().enumerate() {
                let b = _mm512_set1_ps(*pp.add(r * stride + k));
                for (a, v) in acc.iter_mut().zip(&v) {
                    *a = _mm512_fmadd_ps(b, *v, *a);
                }
            }
        }
    }
    for (r, acc) in acc.iter().enumerate() {
        for (c, a) in acc.iter().enumerate() {
            // SAFETY: r * w + 16 c + 16 <= R * w <= out.len().
            unsafe { _mm512_storeu_ps(out.as_mut_ptr().add(r * w + 16 * c), *a) };
        }
    }
}

/// [`pv_avx512`] with AVX2 and FMA: blocks of up to 6 query rows by 16
/// columns (two ymm registers: 12 accumulators, two values and a broadcast
/// within the 16 registers), the keys in chunks of [`PV_KEYS`] whose rows
/// of `vt` stay in L1 while every block of rows and columns passes over
/// them (a head's `vt` at 4096 keys is 1 MB: streamed once per block, it
/// came from L3). A block's sums wait in a buffer between chunks, stored
/// and loaded exactly, so each output is still one running sum in key
/// order from +0: the same bits as [`pv_avx512`]. Keys of zero probability
/// in every row of a block are skipped alike.
///
/// # Safety
/// The CPU must have AVX2 and FMA; the rest as [`pv_avx512`].
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn pv_avx2(
    probs: &[f32],
    (t, nk, hdv): (usize, usize, usize),
    vt: &[f32],
    ctx: *mut f32,
    nq: usize,
    skip_zeros: bool,
) {
    const ROWS: usize = 6;
    debug_assert!(probs.len() >= t * nk && vt.len() >= nk * hdv);
    debug_assert!((1..=PV_MAX_WIDTH).contains(&hdv));
    let regs = hdv.div_ceil(8);
    // A row of sums in the buffer: the width in whole passes of 16.
    let wide = regs.div_ceil(2) * 16;
    // Per block of rows: its first row and the keys it computes.
    let blocks: Vec<(usize, usize, usize)> = (0..t)
        .step_by(ROWS)
        .map(|i| {
            let rows = (t - i).min(ROWS);
            let (lo, hi) = if skip_zeros {
                probs[i * nk..(i + rows) * nk]
                    .chunks_exact(nk)
                    .fold((nk, 0), |(lo, hi), row| {
                        let (a, b) = nonzero_span_portable(row);
                        (lo.min(a), hi.max(b))
                    })
            } else {
                (0, nk)
            };
            (i, lo, hi)
        })
        .collect();
    PV_SUMS.with_borrow_mut(|sums| {
        sums.clear();
        sums.resize(t * wide, 0.0);
        for k0 in (0..nk).step_by(PV_KEYS) {
            let k1 = (k0 + PV_KEYS).min(nk);
            for &(i, lo, hi) in &blocks {
                let rows = (t - i).min(ROWS);
                let (lo, hi) = (lo.max(k0), hi.min(k1));
                if lo >= hi {
                    continue;
                }
                let mut r0 = 0;
                while r0 < regs {
                    let g = (regs - r0).min(2);
                    let col = 8 * r0;
                    // The columns this pass holds; the last register's
                    // lanes past them are masked off.
                    let width = (hdv - col).min(8 * g);
                    let p = &probs[i * nk + lo..];
                    let v = &vt[lo * hdv + col..];
                    let out = &mut sums[i * wide + col..];
                    let a = (p, (nk, hi - lo), v, hdv, (width, wide), out);
                    // SAFETY: the CPU has AVX2 and FMA (the caller's
                    // promise); `p` holds `rows` rows of stride nk from key
                    // `lo`, hi - lo <= nk - lo keys each; `v` holds those
                    // keys' rows of hdv values from column `col`, of which
                    // `width` are read; `out` holds `rows` rows of `wide`
                    // from column `col`, and col + 16 <= wide.
                    unsafe {
                        macro_rules! dispatch {
                            ($($r:literal),*) => {
                                match (rows, g, width == 8 * g) {
                                    $(
                                        ($r, 1, true) => pv_block_avx2::<$r, 1, true>(a),
                                        ($r, 1, false) => pv_block_avx2::<$r, 1, false>(a),
                                        ($r, _, true) => pv_block_avx2::<$r, 2, true>(a),
                                        ($r, _, false) => pv_block_avx2::<$r, 2, false>(a),
                                    )*
                                    _ => unreachable!("blocks hold 1 to 6 rows"),
                                }
                            };
                        }
                        dispatch!(1, 2, 3, 4, 5, 6);
                    }
                    r0 += g;
                }
            }
        }
        // Along ctx's rows, from the sums' columns (in L2). Across them,
        // each store went to another row `nq` values away, rows that share
        // their cache sets when `nq` is a multiple of 1024 (BENCHMARKS.md:
        // 1.14x the product's rate at 1024 queries).
        for d in 0..hdv {
            for r in 0..t {
                // SAFETY: d < hdv and r < t, inside the caller's promise.
                unsafe { *ctx.add(d * nq + r) = sums[r * wide + d] };
            }
        }
    });
}

/// Keys per chunk of [`pv_avx2`]: their rows of `vt` (at most 128 values,
/// 32 KB) stay in L1.
#[cfg(target_arch = "x86_64")]
const PV_KEYS: usize = 64;

#[cfg(target_arch = "x86_64")]
std::thread_local! {
    /// Each thread's sums of [`pv_avx2`] between chunks of keys.
    static PV_SUMS: std::cell::RefCell<Vec<f32>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// The span `(first, last + 1)` of a row's values that are not zero (NaN
/// counts as not zero); `(len, 0)` when every value is zero.
#[cfg(target_arch = "x86_64")]
fn nonzero_span_portable(row: &[f32]) -> (usize, usize) {
    match row.iter().position(|&x| x != 0.0) {
        None => (row.len(), 0),
        Some(first) => {
            let last = row.iter().rposition(|&x| x != 0.0).unwrap_or(first);
            (first, last + 1)
        }
    }
}

/// `out [R, 8 G] += p [R, n] · vt [n, width]` (the first `width <= 8 G`
/// columns of each row of `vt`, its rows `hdv` apart, the lanes past
/// `width` masked off; the rows of `out` `wide` apart), with `R * G` ymm
/// accumulators loaded from `out` and stored back: each output goes on as
/// one running sum in key order.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn pv_block_avx2<const R: usize, const G: usize, const FULL: bool>(
    (p, (stride, n), vt, hdv, (width, wide), out): PvArgs<(usize, usize)>,
) {
    use std::arch::x86_64::*;
    debug_assert!(
        (R == 0 || p.len() >= (R - 1) * stride + n)
            && (n == 0 || vt.len() >= (n - 1) * hdv + width)
            && (R == 0 || out.len() >= (R - 1) * wide + 8 * G)
            && 8 * (G - 1) < width
            && width <= 8 * G
    );
    debug_assert_eq!(FULL, width == 8 * G);
    let (pp, vp) = (p.as_ptr(), vt.as_ptr());
    // The last register's lanes that hold values (all of them with `FULL`,
    // a constant, so that the loop over the keys has no branch).
    let left = (width - 8 * (G - 1)) as i32;
    let lanes = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    let last = _mm256_cmpgt_epi32(_mm256_set1_epi32(left), lanes);
    let mut acc = [[_mm256_setzero_ps(); G]; R];
    for (r, acc) in acc.iter_mut().enumerate() {
        for (c, a) in acc.iter_mut().enumerate() {
            // SAFETY: r * wide + 8 c + 8 <= out.len() (checked above).
            *a = unsafe { _mm256_loadu_ps(out.as_ptr().add(r * wide + 8 * c)) };
        }
    }
    for k in 0..n {
        // SAFETY: k < n: row k of vt holds `width` values from here, of
        // which the last register reads its masked lanes alone; p[r *
        // stride + k] lies in row r < R.
        unsafe {
            let mut v = [_mm256_setzero_ps(); G];
            for (c, v) in v.iter_mut().enumerate() {
                let at = vp.add(k * hdv + 8 * c);
                *v = if c + 1 < G || FULL {
                    _mm256_loadu_ps(at)
                } else {
                    _mm256_maskload_ps(at, last)
                };
            }
            for (r, acc) in acc.iter_mut().enumerate() {
                let b = _mm256_broadcast_ss(&*pp.add(r * stride + k));
                for (a, v) in acc.iter_mut().zip(&v) {
                    *a = _mm256_fmadd_ps(b, *v, *a);
                }
            }
        }
    }
    for (r, acc) in acc.iter().enumerate() {
        for (c, a) in acc.iter().enumerate() {
            // SAFETY: r * wide + 8 c + 8 <= out.len() (checked above).
            unsafe { _mm256_storeu_ps(out.as_mut_ptr().add(r * wide + 8 * c), *a) };
        }
    }
}

/// [`pv_block`]'s and [`pv_block_avx2`]'s operands: `(p, (stride, n), vt,
/// hdv, lanes, out)`, the last register's lanes as a mask or a width.
#[cfg(target_arch = "x86_64")]
type PvArgs<'a, L> = (
    &'a [f32],
    (usize, usize),
    &'a [f32],
    usize,
    L,
    &'a mut [f32],
);

#[cfg(all(test, target_arch = "x86_64"))]
mod tests {
    use super::super::attention::values_transposed;
    use super::*;
    use crate::interp::fast::testing::lcg;

    /// Skipping the keys whose probabilities are zero in a whole block gives
    /// the bits of the full product, and the AVX2 and AVX-512 products give
    /// the same bits, those of one fused multiply-add chain per output in
    /// key order, near a plain f64 product: pad rows that attend to
    /// themselves alone, real rows whose tail is masked, a row of zeros, -0
    /// and NaN.
    #[test]
    fn pv_skips_zero_keys_bit_exactly() {
        if !pv_fits(64) {
            eprintln!("no AVX2 with FMA: no product to check");
            return;
        }
        // Whole registers, and a last one partly masked (on AVX2 also a
        // last pass of one register, and of a masked one).
        for hdv in [6, 20, 64, 72, 80, 128] {
            pv_skips_zero_keys_at(hdv);
        }
    }

    fn pv_skips_zero_keys_at(hdv: usize) {
        use std::arch::is_x86_feature_detected as has;
        let (t, nk) = (23, 70);
        let v = lcg(hdv * nk, 21);
        let vt = values_transposed(&v, 1, hdv, nk).unwrap();
        assert!(vt.finite);
        let mut probs = vec![0f32; t * nk];
        let dense = lcg(t * nk, 22);
        for (r, row) in probs.chunks_exact_mut(nk).enumerate() {
            match r {
                0..=9 => row[..40].copy_from_slice(&dense[r * nk..r * nk + 40]),
                10 => {} // all zero
                11 => row[17] = -0.0,
                12 => row[nk - 1] = f32::NAN,
                _ => row[r + 30] = 1.0, // a pad: itself alone
            }
        }
        let run = |avx512: bool, skip: bool| {
            let mut ctx = vec![0f32; hdv * t];
            // SAFETY: the CPU has what each path needs (checked by the
            // callers of `run`); ctx is [hdv, t].
            unsafe {
                if avx512 {
                    pv_avx512(&probs, (t, nk, hdv), &vt.data, ctx.as_mut_ptr(), t, skip)
                } else {
                    pv_avx2(&probs, (t, nk, hdv), &vt.data, ctx.as_mut_ptr(), t, skip)
                }
            };
            ctx
        };
        let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        let full = run(false, false);
        assert_eq!(bits(&full), bits(&run(false, true)), "AVX2, hdv {hdv}");
        if has!("avx512f") {
            assert_eq!(bits(&full), bits(&run(true, false)), "AVX-512, hdv {hdv}");
            assert_eq!(bits(&full), bits(&run(true, true)), "AVX-512, hdv {hdv}");
        }
        // Each output is one fused multiply-add chain in key order from +0,
        // bit for bit.
        for r in 0..t {
            for d in 0..hdv {
                let chain = (0..nk).fold(0f32, |s, k| probs[r * nk + k].mul_add(v[d * nk + k], s));
                let got = full[d * t + r];
                assert!(
                    got.to_bits() == chain.to_bits() || (got.is_nan() && chain.is_nan()),
                    "hdv {hdv} row {r} value {d}: {got} against the chain's {chain}"
                );
            }
        }
        for r in (0..t).filter(|&r| r != 12) {
            for d in 0..hdv {
                let want: f64 = (0..nk)
                    .map(|k| probs[r * nk + k] as f64 * v[d * nk + k] as f64)
                    .sum();
                let got = full[d * t + r] as f64;
                assert!(
                    (got - want).abs() < 1e-5,
                    "hdv {hdv} row {r}: {got} vs {want}"
                );
            }
        }
        assert!((0..hdv).all(|d| full[d * t + 12].is_nan() && full[d * t + 10] == 0.0));
        assert_eq!(nonzero_span_portable(&probs[10 * nk..11 * nk]), (nk, 0));
        assert_eq!(nonzero_span_portable(&probs[20 * nk..21 * nk]), (50, 51));
        if has!("avx512f") {
            for row in probs.chunks_exact(nk) {
                assert_eq!(nonzero_span_checked(row), nonzero_span_portable(row));
            }
        }
        // A value that is not finite turns skipping off: 0 * inf is NaN.
        let mut v_inf = v.clone();
        v_inf[5] = f32::INFINITY;
        assert!(!values_transposed(&v_inf, 1, hdv, nk).unwrap().finite);
    }

    fn nonzero_span_checked(row: &[f32]) -> (usize, usize) {
        // SAFETY: callers check AVX-512F first.
        unsafe { nonzero_span(row) }
    }
}
