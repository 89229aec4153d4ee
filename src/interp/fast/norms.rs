//! Row kernels: layer norm over the channel axis and softmax over the last.

use rayon::prelude::*;

use crate::interp::kernels::{SendPtr, softmax_in_place};

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
    let inv_c = 1.0 / c as f32;
    if inner == 1 {
        let mut out = vec![0f32; x.len()];
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
    // that every inner loop runs over contiguous values: one band per
    // thread where the columns allow, of 64 to 512 (on the 2560 x 1024 of
    // Qwen2.5-VL's RMSNorm, 512 columns took 0.6x the time of 64).
    const MAX_BAND: usize = 512;
    let band = inner
        .div_ceil(rayon::current_num_threads().max(1))
        .next_multiple_of(16)
        .clamp(64, MAX_BAND);
    let mut out: Vec<f32> = Vec::with_capacity(x.len());
    let ptr = SendPtr(out.as_mut_ptr());
    let bands = inner.div_ceil(band);
    (0..outer * bands).into_par_iter().for_each(|job| {
        let (b, j0) = (job / bands, (job % bands) * band);
        let w = band.min(inner - j0);
        let base = b * c * inner + j0;
        let row = |k: usize| &x[base + k * inner..base + k * inner + w];
        let mut mean = [0f32; MAX_BAND];
        let mean = &mut mean[..w];
        for k in 0..c {
            for (m, v) in mean.iter_mut().zip(row(k)) {
                *m += v;
            }
        }
        mean.iter_mut().for_each(|m| *m *= inv_c);
        let mut den = [0f32; MAX_BAND];
        let den = &mut den[..w];
        for k in 0..c {
            for ((d, v), m) in den.iter_mut().zip(row(k)).zip(mean.iter()) {
                *d += (v - m) * (v - m);
            }
        }
        den.iter_mut().for_each(|d| *d = (*d * inv_c + eps).sqrt());
        for k in 0..c {
            // SAFETY: this task alone writes columns j0..j0+w of every row of
            // batch b; the range lies inside `out`'s capacity (the length of
            // `x`), and every element of it is written below.
            let o = unsafe { std::slice::from_raw_parts_mut(ptr.get().add(base + k * inner), w) };
            let each = o.iter_mut().zip(row(k)).zip(mean.iter()).zip(den.iter());
            // The affine step as [`affine`] takes it (times gamma, then plus
            // beta), with the row's gamma and beta taken out of the loop.
            match (gamma.map(|g| g[k]), beta.map(|b| b[k])) {
                (Some(g), Some(bk)) => each.for_each(|(((o, v), m), d)| *o = (v - m) / d * g + bk),
                (Some(g), None) => each.for_each(|(((o, v), m), d)| *o = (v - m) / d * g),
                (None, Some(bk)) => each.for_each(|(((o, v), m), d)| *o = (v - m) / d + bk),
                (None, None) => each.for_each(|(((o, v), m), d)| *o = (v - m) / d),
            }
        }
    });
    // SAFETY: the tasks wrote every element (each band of columns, for every
    // batch and row), and all of them have finished.
    unsafe { out.set_len(x.len()) };
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::interp::fast::testing::lcg;

    #[test]
    fn layer_norm_over_the_middle_and_last_axis() {
        // 70 columns: one band, or a full one and a partial one; 1100: three
        // bands of up to 512, the last partial. Bit for bit the plain
        // computation: sums over the channels in order, the mean times 1/c,
        // the deviation divided, then times gamma and plus beta.
        for (outer, c, inner) in [(2, 6, 70), (1, 37, 1100)] {
            let x = lcg(outer * c * inner, 4);
            let (g, b) = (lcg(c, 5), lcg(c, 6));
            for (gamma, beta) in [
                (Some(&g), Some(&b)),
                (Some(&g), None),
                (None, Some(&b)),
                (None, None),
            ] {
                let (gs, bs) = (gamma.map(|v| &v[..]), beta.map(|v| &v[..]));
                let y = layer_norm_axis(&x, (outer, c, inner), gs, bs, 1e-5);
                let inv_c = 1.0 / c as f32;
                for o in 0..outer {
                    for j in 0..inner {
                        let col: Vec<f32> = (0..c).map(|k| x[(o * c + k) * inner + j]).collect();
                        let mean = col.iter().fold(0f32, |a, v| a + v) * inv_c;
                        let var = col.iter().fold(0f32, |a, v| a + (v - mean) * (v - mean)) * inv_c;
                        let den = (var + 1e-5).sqrt();
                        for k in 0..c {
                            let mut want = (col[k] - mean) / den;
                            if let Some(g) = gs {
                                want *= g[k];
                            }
                            if let Some(b) = bs {
                                want += b[k];
                            }
                            let got = y[(o * c + k) * inner + j];
                            assert_eq!(
                                got.to_bits(),
                                want.to_bits(),
                                "{got} vs {want} at {o} {k} {j}"
                            );
                        }
                    }
                }
            }
        }
        let (outer, c, inner) = (2, 6, 70);
        let x = lcg(outer * c * inner, 4);
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
}
