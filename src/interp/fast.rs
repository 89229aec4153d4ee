//! CPU kernels for the ops that dominate a vision tower's program: the 1x1
//! convolution (the ANE layout's Linear), layer norm over the channel axis,
//! softmax over the last axis, fp16 weight decoding, and the attention chain
//! `matmul → mul → add → softmax → matmul` run in tiles of query rows (see
//! [`attention_chain`]). Each computes what the op-by-op path computes, in
//! f32, over all cores; in fp16 mode every op output is still rounded.

use gemm::Parallelism;
use rayon::prelude::*;

use super::round_f16_in_place;
use crate::reference::kernels::{SendPtr, softmax_in_place};

/// A strided f32 matrix operand of [`matmul`]: pointer, column stride, row stride.
type Mat = (*const f32, isize, isize);

/// `dst = (read_dst ? dst : 0) + lhs · rhs` for `lhs [m, k]`, `rhs [k, n]`,
/// `dst [m, n]`, each given by pointer and (column, row) strides.
///
/// # Safety
/// Every element the strides address must lie inside its buffer, and `dst`
/// must not overlap the operands or another task's output.
unsafe fn matmul(
    (m, n, k): (usize, usize, usize),
    dst: (*mut f32, isize, isize),
    read_dst: bool,
    lhs: Mat,
    rhs: Mat,
    par: Parallelism,
) {
    // SAFETY: forwarded from the caller.
    unsafe {
        gemm::gemm(
            m, n, k, dst.0, dst.1, dst.2, read_dst, lhs.0, lhs.1, lhs.2, rhs.0, rhs.1, rhs.2, 1.0,
            1.0, false, false, false, par,
        );
    }
}

/// `y[b] = W · x[b] + bias` for `x [n, c, s]`, `W [o, c]`, `bias [o]`:
/// a 1x1 convolution with unit stride and no padding. The output starts as
/// the broadcast bias and gemm accumulates into it.
pub fn conv1x1(
    x: &[f32],
    (n, c, s): (usize, usize, usize),
    w: &[f32],
    o: usize,
    bias: Option<&[f32]>,
) -> Vec<f32> {
    debug_assert_eq!(x.len(), n * c * s);
    debug_assert_eq!(w.len(), o * c);
    let mut dst = vec![0f32; n * o * s];
    if let Some(b) = bias {
        dst.par_chunks_mut(s)
            .enumerate()
            .for_each(|(r, row)| row.fill(b[r % o]));
    }
    for (bi, out) in dst.chunks_exact_mut(o * s).enumerate() {
        let xb = &x[bi * c * s..(bi + 1) * c * s];
        // SAFETY: out is [o, s], W [o, c] and xb [c, s], all row-major and
        // contiguous, with the lengths the caller's shapes give.
        unsafe {
            matmul(
                (o, s, c),
                (out.as_mut_ptr(), 1, s as isize),
                bias.is_some(),
                (w.as_ptr(), 1, c as isize),
                (xb.as_ptr(), 1, s as isize),
                Parallelism::Rayon(rayon::current_num_threads()),
            );
        }
    }
    dst
}

/// Layer norm of `x [outer, c, inner]` over the middle axis:
/// `(x - mean) / sqrt(var + eps) * gamma[c] + beta[c]`, with the mean and
/// the (biased) variance taken over `c` in two passes.
pub fn layer_norm_axis(
    x: &[f32],
    (outer, c, inner): (usize, usize, usize),
    gamma: Option<&[f32]>,
    beta: Option<&[f32]>,
    eps: f32,
) -> Vec<f32> {
    debug_assert_eq!(x.len(), outer * c * inner);
    let mut out = vec![0f32; x.len()];
    let inv_c = 1.0 / c as f32;
    if inner == 1 {
        // Normalised axis last: contiguous rows.
        out.par_chunks_mut(c)
            .zip(x.par_chunks(c))
            .for_each(|(o, r)| {
                let mean = r.iter().sum::<f32>() * inv_c;
                let var = r.iter().map(|v| (v - mean) * (v - mean)).sum::<f32>() * inv_c;
                let den = (var + eps).sqrt();
                for (k, (o, &v)) in o.iter_mut().zip(r).enumerate() {
                    *o = affine((v - mean) / den, k, gamma, beta);
                }
            });
        return out;
    }
    // Strided: each task takes a band of columns and sweeps the rows, so
    // that every inner loop runs over contiguous values.
    const BAND: usize = 64;
    let ptr = SendPtr(out.as_mut_ptr());
    let bands = inner.div_ceil(BAND);
    (0..outer * bands).into_par_iter().for_each(|job| {
        let (b, j0) = (job / bands, (job % bands) * BAND);
        let w = BAND.min(inner - j0);
        let base = b * c * inner + j0;
        let row = |k: usize| &x[base + k * inner..base + k * inner + w];
        let mut mean = [0f32; BAND];
        for k in 0..c {
            for (m, v) in mean.iter_mut().zip(row(k)) {
                *m += v;
            }
        }
        mean.iter_mut().for_each(|m| *m *= inv_c);
        let mut den = [0f32; BAND];
        for k in 0..c {
            for ((d, v), m) in den.iter_mut().zip(row(k)).zip(&mean) {
                *d += (v - m) * (v - m);
            }
        }
        den.iter_mut().for_each(|d| *d = (*d * inv_c + eps).sqrt());
        for k in 0..c {
            // SAFETY: this task alone writes columns j0..j0+w of every row of
            // batch b; the range lies inside `out` (same length as `x`).
            let o = unsafe { std::slice::from_raw_parts_mut(ptr.get().add(base + k * inner), w) };
            for (((o, v), m), d) in o.iter_mut().zip(row(k)).zip(&mean).zip(&den) {
                *o = affine((v - m) / d, k, gamma, beta);
            }
        }
    });
    out
}

#[inline(always)]
fn affine(y: f32, k: usize, gamma: Option<&[f32]>, beta: Option<&[f32]>) -> f32 {
    let y = gamma.map_or(y, |g| y * g[k]);
    beta.map_or(y, |b| y + b[k])
}

/// Softmax over contiguous rows of length `len`, over all cores.
pub fn softmax_rows(x: &[f32], len: usize) -> Vec<f32> {
    let mut out = x.to_vec();
    let rows_per_task = (1 << 14) / len.max(1) + 1;
    out.par_chunks_mut(len * rows_per_task)
        .for_each(|rows| rows.chunks_exact_mut(len).for_each(softmax_in_place));
    out
}

/// Little-endian fp16 values widened to f32, over all cores (F16C where the
/// CPU has it).
pub fn decode_f16(b: &[u8], n: usize) -> Vec<f32> {
    const CHUNK: usize = 1 << 16;
    let mut out = vec![0f32; n];
    out.par_chunks_mut(CHUNK)
        .zip(b[..2 * n].par_chunks(2 * CHUNK))
        .for_each(|(o, b)| widen_f16(o, b));
    out
}

fn widen_f16(o: &mut [f32], b: &[u8]) {
    #[cfg(target_arch = "x86_64")]
    {
        if std::arch::is_x86_feature_detected!("f16c") && std::arch::is_x86_feature_detected!("avx")
        {
            // SAFETY: the CPU has the features the function is compiled for.
            unsafe { widen_f16c(o, b) };
            return;
        }
    }
    for (o, c) in o.iter_mut().zip(b.chunks_exact(2)) {
        *o = half::f16::from_le_bytes([c[0], c[1]]).to_f32();
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx,f16c")]
unsafe fn widen_f16c(o: &mut [f32], b: &[u8]) {
    use std::arch::x86_64::*;
    let whole = o.len() / 8 * 8;
    for i in (0..whole).step_by(8) {
        // SAFETY: 16 bytes at 2*i and 8 f32 at i lie inside `b` and `o`.
        unsafe {
            let h = _mm_loadu_si128(b.as_ptr().add(2 * i).cast());
            _mm256_storeu_ps(o.as_mut_ptr().add(i), _mm256_cvtph_ps(h));
        }
    }
    for i in whole..o.len() {
        o[i] = half::f16::from_le_bytes([b[2 * i], b[2 * i + 1]]).to_f32();
    }
}

/// The operands of an attention chain, batch-major:
/// `scores = matmul(q, k, transpose_x)`, `scaled = scores * scale`,
/// `masked = scaled + mask`, `probs = softmax(masked, -1)`,
/// `ctx = matmul(v, probs, transpose_y)`.
pub struct Chain<'a> {
    /// `[batch, hd, queries]`.
    pub q: &'a [f32],
    /// `[batch, hd, keys]`.
    pub k: &'a [f32],
    /// `[batch, hdv, keys]`.
    pub v: &'a [f32],
    /// `[batch or 1, queries, keys]`, if the chain has the add.
    pub mask: Option<&'a [f32]>,
    pub scale: f32,
    pub batch: usize,
    pub hd: usize,
    pub hdv: usize,
    pub queries: usize,
    pub keys: usize,
}

/// Values of one stage that were (non-finite, finite beyond fp16's range).
pub type Counts = (usize, usize);

/// Run an attention chain in tiles of query rows. Every op of the chain is
/// row-wise over the queries, so a tile's score block never leaves the
/// cache and the result is the op-by-op result; with `fp16`, each stage's
/// values are rounded as the op-by-op path rounds them (and with `check`,
/// counted first). Returns `ctx [batch, hdv, queries]` (not rounded: the
/// caller rounds op outputs) and the counts of the four inner stages.
pub fn attention_chain(ch: &Chain, fp16: bool, check: bool) -> (Vec<f32>, [Counts; 4]) {
    let (nq, nk, hd, hdv) = (ch.queries, ch.keys, ch.hd, ch.hdv);
    // One tile of query rows per thread (at most 256 rows, at least 16): the
    // operands gemm packs (k, v) are packed once per tile, and a row's
    // stages run while it is in L1.
    let threads = rayon::current_num_threads().max(1);
    let tile = nq.div_ceil(threads).clamp(16, 256).min(nq.max(1));
    let tiles = nq.div_ceil(tile);
    let mut ctx = vec![0f32; ch.batch * hdv * nq];
    let out = SendPtr(ctx.as_mut_ptr());
    let counts = (0..ch.batch * tiles)
        .into_par_iter()
        .map_init(Vec::new, |s, job| {
            let (b, i0) = (job / tiles, (job % tiles) * tile);
            let t = tile.min(nq - i0);
            s.resize(t * nk, 0f32);
            let s = &mut s[..t * nk];
            let q = &ch.q[b * hd * nq..];
            let k = &ch.k[b * hd * nk..];
            let v = &ch.v[b * hdv * nk..];
            // SAFETY: q^T rows i0..i0+t ([hd, nq] read with column stride nq),
            // k [hd, nk], s [t, nk]: all inside their buffers for this batch.
            unsafe {
                matmul(
                    (t, nk, hd),
                    (s.as_mut_ptr(), 1, nk as isize),
                    false,
                    (q.as_ptr().add(i0), nq as isize, 1),
                    (k.as_ptr(), 1, nk as isize),
                    Parallelism::None,
                );
            }
            let mut c = [(0, 0); 4];
            let mut stage = |s: &mut [f32], i: usize| {
                if fp16 {
                    let (n, sat) = round_f16_in_place(s, check);
                    c[i].0 += n;
                    c[i].1 += sat;
                }
            };
            // Row by row, so that every stage reads a row still in L1.
            let mask = ch.mask.map(|m| {
                let mb = if m.len() == nq * nk { 0 } else { b };
                &m[(mb * nq + i0) * nk..(mb * nq + i0 + t) * nk]
            });
            for (r, row) in s.chunks_exact_mut(nk).enumerate() {
                stage(row, 0);
                row.iter_mut().for_each(|x| *x *= ch.scale);
                stage(row, 1);
                if let Some(m) = mask {
                    row.iter_mut()
                        .zip(&m[r * nk..(r + 1) * nk])
                        .for_each(|(x, m)| *x += m);
                    stage(row, 2);
                }
                softmax_in_place(row);
                stage(row, 3);
            }
            // SAFETY: ctx[b] is [hdv, nq]; this task alone writes its columns
            // i0..i0+t. v [hdv, nk]; probs^T read from s [t, nk] with row stride 1.
            unsafe {
                matmul(
                    (hdv, t, nk),
                    (out.get().add(b * hdv * nq + i0), 1, nq as isize),
                    false,
                    (v.as_ptr(), 1, nk as isize),
                    (s.as_ptr(), nk as isize, 1),
                    Parallelism::None,
                );
            }
            c
        })
        .reduce(
            || [(0, 0); 4],
            |mut a, b| {
                for (a, b) in a.iter_mut().zip(b) {
                    a.0 += b.0;
                    a.1 += b.1;
                }
                a
            },
        );
    (ctx, counts)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lcg(n: usize, seed: u64) -> Vec<f32> {
        let mut s = seed;
        (0..n)
            .map(|_| {
                s = s
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                ((s >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
            })
            .collect()
    }

    fn close(a: &[f32], b: &[f32], tol: f32) {
        assert_eq!(a.len(), b.len());
        for (i, (x, y)) in a.iter().zip(b).enumerate() {
            assert!((x - y).abs() <= tol * (1.0 + y.abs()), "at {i}: {x} vs {y}");
        }
    }

    #[test]
    fn conv1x1_is_a_matrix_product_plus_bias() {
        let (n, c, s, o) = (2, 5, 7, 3);
        let (x, w, b) = (lcg(n * c * s, 1), lcg(o * c, 2), lcg(o, 3));
        let y = conv1x1(&x, (n, c, s), &w, o, Some(&b));
        let mut want = vec![0f32; n * o * s];
        for bi in 0..n {
            for r in 0..o {
                for j in 0..s {
                    let dot: f32 = (0..c).map(|k| w[r * c + k] * x[(bi * c + k) * s + j]).sum();
                    want[(bi * o + r) * s + j] = dot + b[r];
                }
            }
        }
        close(&y, &want, 1e-6);
        let y0 = conv1x1(&x, (n, c, s), &w, o, None);
        let no_bias: Vec<f32> = want
            .iter()
            .enumerate()
            .map(|(i, v)| v - b[(i / s) % o])
            .collect();
        close(&y0, &no_bias, 1e-6);
    }

    #[test]
    fn layer_norm_over_the_middle_and_last_axis() {
        let (outer, c, inner) = (2, 6, 70); // 70 columns: a full band and a partial one
        let x = lcg(outer * c * inner, 4);
        let (g, b) = (lcg(c, 5), lcg(c, 6));
        let y = layer_norm_axis(&x, (outer, c, inner), Some(&g), Some(&b), 1e-5);
        for o in 0..outer {
            for j in 0..inner {
                let col: Vec<f32> = (0..c).map(|k| x[(o * c + k) * inner + j]).collect();
                let mean = col.iter().sum::<f32>() / c as f32;
                let var = col.iter().map(|v| (v - mean).powi(2)).sum::<f32>() / c as f32;
                for k in 0..c {
                    let want = (col[k] - mean) / (var + 1e-5).sqrt() * g[k] + b[k];
                    let got = y[(o * c + k) * inner + j];
                    assert!((got - want).abs() < 1e-5, "{got} vs {want}");
                }
            }
        }
        // The last axis (inner = 1) through the row path, without gamma and beta.
        let y = layer_norm_axis(&x, (outer * inner, c, 1), None, None, 1e-5);
        for r in y.chunks_exact(c) {
            let mean = r.iter().sum::<f32>() / c as f32;
            let var = r.iter().map(|v| (v - mean).powi(2)).sum::<f32>() / c as f32;
            assert!(
                mean.abs() < 1e-5 && (var - 1.0).abs() < 1e-3,
                "{mean} {var}"
            );
        }
    }

    #[test]
    fn fp16_decoding_matches_half() {
        let vals: Vec<u16> = (0..=u16::MAX).collect();
        let bytes: Vec<u8> = vals.iter().flat_map(|v| v.to_le_bytes()).collect();
        let got = decode_f16(&bytes, vals.len());
        for (v, g) in vals.iter().zip(&got) {
            let want = half::f16::from_bits(*v).to_f32();
            assert!(
                g.to_bits() == want.to_bits() || (g.is_nan() && want.is_nan()),
                "{v:#x}"
            );
        }
    }

    /// The tiled chain against the same ops on whole tensors.
    #[test]
    fn attention_chain_matches_op_by_op() {
        let (batch, hd, hdv, nq, nk) = (2, 8, 6, 37, 300);
        let (q, k, v) = (
            lcg(batch * hd * nq, 7),
            lcg(batch * hd * nk, 8),
            lcg(batch * hdv * nk, 9),
        );
        let mask: Vec<f32> = (0..nq * nk)
            .map(|i| if i % nk >= 250 { -30000.0 } else { 0.0 })
            .collect();
        for fp16 in [false, true] {
            let r = |x: f32| {
                if fp16 {
                    super::super::round_to_f16(x)
                } else {
                    x
                }
            };
            let ch = Chain {
                q: &q,
                k: &k,
                v: &v,
                mask: Some(&mask),
                scale: 0.3,
                batch,
                hd,
                hdv,
                queries: nq,
                keys: nk,
            };
            let (ctx, counts) = attention_chain(&ch, fp16, true);
            assert_eq!(counts, [(0, 0); 4]);
            for b in 0..batch {
                for i in 0..nq {
                    let mut s: Vec<f32> = (0..nk)
                        .map(|j| {
                            let dot: f32 = (0..hd)
                                .map(|d| q[(b * hd + d) * nq + i] * k[(b * hd + d) * nk + j])
                                .sum();
                            r(r(r(dot) * 0.3) + mask[i * nk + j])
                        })
                        .collect();
                    softmax_in_place(&mut s);
                    s.iter_mut().for_each(|x| *x = r(*x));
                    // Masked keys get nothing (exp_f32 bottoms out at the smallest normal).
                    assert!(s[250..].iter().all(|&p| p < 1e-37));
                    for d in 0..hdv {
                        let want: f32 = (0..nk).map(|j| v[(b * hdv + d) * nk + j] * s[j]).sum();
                        let got = ctx[(b * hdv + d) * nq + i];
                        assert!((got - want).abs() < 1e-4, "fp16 {fp16}: {got} vs {want}");
                    }
                }
            }
        }
    }
}
