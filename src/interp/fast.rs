//! CPU kernels for the ops that dominate a vision tower's program: the 1x1
//! convolution (the ANE layout's Linear), layer norm over the channel axis,
//! softmax over the last axis, fp16 weight decoding, and the attention chain
//! `matmul → mul → add → softmax → matmul` run in tiles of query rows (see
//! [`attention_chain`]). Each computes what the op-by-op path computes, in
//! f32, over all cores; in fp16 mode every op output is still rounded.

use std::borrow::Cow;

use gemm::Parallelism;
use rayon::prelude::*;

use super::kernels::{SendPtr, softmax_in_place};
use super::round_f16_in_place;

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

/// The weights of a 1x1 convolution, `[o, c]` row-major: f32, or fp16 as
/// the package stores them (widened a task's rows at a time, exactly).
#[derive(Clone, Copy)]
pub enum ConvWeights<'a> {
    F32(&'a [f32]),
    F16(&'a [half::f16]),
}

impl ConvWeights<'_> {
    fn len(&self) -> usize {
        match self {
            ConvWeights::F32(w) => w.len(),
            ConvWeights::F16(w) => w.len(),
        }
    }
}

/// `y[b] = W · x[b] + bias` for `x [n, c, s]`, `W [o, c]`, `bias [o]`:
/// a 1x1 convolution with unit stride and no padding. The output starts as
/// the broadcast bias and the product accumulates into it.
///
/// A column of `x[b]` equal bit for bit to the one before it (in every
/// channel) has the same output column: where such repeats are a quarter of
/// the columns or more, the product runs over the distinct columns alone and
/// each repeat copies its column's output ([`distinct_columns`]). Padding is
/// where this pays: a bucket's pad slots hold the same values, block after
/// block, until the merger.
///
/// The bits are the whole product's because BLAS computes each output
/// column in the lanes of one kernel, the same sum in the same order
/// wherever the column stands, as long as it is not in the kernel's
/// remainder (the last columns when their count is not a multiple of its
/// width). So the shortcut runs only when the column count is a multiple of
/// [`COLUMN_GROUP`], and fills the distinct columns up to such a multiple:
/// every column of both products is in a whole group. That holds for some
/// kernels and not others: OpenBLAS's Haswell and Zen kernels give equal
/// columns of one product different bits by position, so the shortcut runs
/// only under the kernels [`crate::blas::columns_independent`] names.
/// Checked against the whole product in the tests, and by
/// `ANE_EXPORT_SHORTCUTS=0` on whole towers.
pub fn conv1x1(
    x: &[f32],
    (n, c, s): (usize, usize, usize),
    w: ConvWeights,
    o: usize,
    bias: Option<&[f32]>,
) -> Vec<f32> {
    debug_assert_eq!(x.len(), n * c * s);
    debug_assert_eq!(w.len(), o * c);
    let mut dst = vec![0f32; n * o * s];
    for (bi, out) in dst.chunks_exact_mut(o * s).enumerate() {
        let xb = &x[bi * c * s..(bi + 1) * c * s];
        let distinct = (shortcuts() && crate::blas::columns_independent())
            .then(|| distinct_columns(xb, c, s))
            .flatten();
        count_work(0, distinct.as_ref().map_or(s, |(cols, _)| cols.len()), s);
        match distinct {
            Some((cols, of)) => {
                let u = cols.len();
                // The distinct columns, gathered: [c, u].
                let mut xu = vec![0f32; c * u];
                xu.par_chunks_mut(u)
                    .zip(xb.par_chunks(s))
                    .for_each(|(d, row)| d.iter_mut().zip(&cols).for_each(|(d, &j)| *d = row[j]));
                let mut yu = vec![0f32; o * u];
                product(&xu, (c, u), w, bias, &mut yu);
                out.par_chunks_mut(s)
                    .zip(yu.par_chunks(u))
                    .for_each(|(d, row)| d.iter_mut().zip(&of).for_each(|(d, &k)| *d = row[k]));
            }
            None => product(xb, (c, s), w, bias, out),
        }
    }
    dst
}

/// `out [o, s] = W · x + bias` for `x [c, s]`: `out` starts as the
/// broadcast bias and the product accumulates into it (without a bias it
/// is overwritten).
fn product(
    x: &[f32],
    (c, s): (usize, usize),
    w: ConvWeights,
    bias: Option<&[f32]>,
    out: &mut [f32],
) {
    let o = out.len() / s;
    debug_assert_eq!(out.len(), o * s);
    if let Some(b) = bias {
        out.par_chunks_mut(s)
            .enumerate()
            .for_each(|(r, row)| row.fill(b[r]));
    }
    // SAFETY: out is [o, s], W [o, c] and x [c, s], all row-major and
    // contiguous, with the lengths the caller's shapes give.
    unsafe {
        match w {
            ConvWeights::F32(w) => crate::blas::sgemm(
                (o, s, c),
                (w.as_ptr(), c),
                (x.as_ptr(), s),
                (out.as_mut_ptr(), s),
                bias.is_some(),
            ),
            ConvWeights::F16(w) => crate::blas::sgemm_f16a(
                (o, s, c),
                w,
                (x.as_ptr(), s),
                (out.as_mut_ptr(), s),
                bias.is_some(),
            ),
        }
    }
}

/// What the shortcuts saved in this process so far: (computed, in all) of
/// the 1x1 convolutions' columns, of the attention chains' scores, and of
/// the other ops' output columns (last axis; fewer where a value is packed,
/// see `packed.rs`).
pub fn shortcut_work() -> [(u64, u64); 3] {
    use std::sync::atomic::Ordering::Relaxed;
    [0, 1, 2].map(|k| (WORK[2 * k].load(Relaxed), WORK[2 * k + 1].load(Relaxed)))
}

static WORK: [std::sync::atomic::AtomicU64; 6] =
    [const { std::sync::atomic::AtomicU64::new(0) }; 6];

/// Add to [`shortcut_work`]'s counts of `kind` (0 convolution columns, 1
/// attention scores, 2 other ops' columns).
pub(super) fn count_work(kind: usize, computed: usize, all: usize) {
    use std::sync::atomic::Ordering::Relaxed;
    WORK[2 * kind].fetch_add(computed as u64, Relaxed);
    WORK[2 * kind + 1].fetch_add(all as u64, Relaxed);
}

/// Whether the interpreter takes its exact shortcuts (repeated columns of
/// a 1x1 convolution, dead keys and equal batches of an attention chain,
/// packed columns carried through the program): yes unless
/// `ANE_EXPORT_SHORTCUTS=0`, which computes every column, key and batch, to
/// check that the shortcuts change no bit.
pub fn shortcuts() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| std::env::var_os("ANE_EXPORT_SHORTCUTS").is_none_or(|v| v != "0"))
}

/// The columns of a 1x1 convolution go through BLAS in whole groups of
/// this many for [`conv1x1`]'s shortcut: the width of OpenBLAS's sgemm
/// kernels in the columns' dimension (16 lanes of AVX-512), a multiple of
/// the narrower kernels' widths. Measured (`crate::blas::columns_independent`):
/// a column in a product of any multiple of 16 columns has the bits it has
/// among 1024; 8, 24 or 40 columns gave others under the SkylakeX and
/// Cooperlake kernels. Groups of 64 computed up to 63 dummy columns: 48 of
/// 384 for a 324-patch image in a 1024-patch bucket.
pub(super) const COLUMN_GROUP: usize = 16;

/// For `x [c, s]` whose columns repeat: the distinct columns' indices (each
/// run's first column, then the last one again up to a multiple of
/// [`COLUMN_GROUP`]) and, per column, the index of its run in that list.
/// `None` when fewer than a quarter of the columns repeat the one before,
/// or `s` is not a multiple of [`COLUMN_GROUP`].
fn distinct_columns(x: &[f32], c: usize, s: usize) -> Option<(Vec<usize>, Vec<usize>)> {
    if s < 2 || c == 0 || !s.is_multiple_of(COLUMN_GROUP) {
        return None;
    }
    // Per column j >= 1: equal to column j - 1 in every channel, as bits
    // (+0 and -0 differ; a NaN is equal to the same NaN).
    const BAND: usize = 32;
    let same = x
        .par_chunks(s * BAND)
        .map(|band| {
            let mut same = vec![true; s];
            for row in band.chunks_exact(s) {
                for (j, eq) in same.iter_mut().enumerate().skip(1) {
                    *eq &= row[j].to_bits() == row[j - 1].to_bits();
                }
            }
            same
        })
        .reduce(
            || vec![true; s],
            |mut a, b| {
                a.iter_mut().zip(b).for_each(|(a, b)| *a &= b);
                a
            },
        );
    let repeats = same[1..].iter().filter(|&&e| e).count();
    if repeats * 4 < s {
        return None;
    }
    let mut cols = Vec::with_capacity(s - repeats);
    let mut of = Vec::with_capacity(s);
    for (j, &eq) in same.iter().enumerate() {
        if j == 0 || !eq {
            cols.push(j);
        }
        of.push(cols.len() - 1);
    }
    let last = cols[cols.len() - 1];
    cols.resize(cols.len().next_multiple_of(COLUMN_GROUP), last);
    (cols.len() < s).then_some((cols, of))
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
    /// `v` as [`values_transposed`] gives it, if it does: the probabilities
    /// are then multiplied by it with AVX-512, without packing.
    pub vt: Option<&'a TransposedV>,
    /// The mask's [`MaskSpans`], if the caller keeps them (else scanned here
    /// when they can serve).
    pub spans: Option<&'a MaskSpans>,
    /// The keys' largest norm per batch, if the caller keeps it for the
    /// chains that share `k` (a head's query chunks): computed here on first
    /// need.
    pub kmax: Option<&'a std::sync::OnceLock<Vec<f64>>>,
    pub scale: f32,
    pub batch: usize,
    pub hd: usize,
    pub hdv: usize,
    pub queries: usize,
    pub keys: usize,
}

thread_local! {
    /// Each thread's block of scores, kept from one chain to the next.
    static SCORES: std::cell::RefCell<Vec<f32>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// `v` transposed for [`Chain::vt`].
pub struct TransposedV {
    /// `[batch, keys, hdv]`.
    pub data: Vec<f32>,
    /// Every value is finite: a zero probability then contributes exactly
    /// nothing, and keys whose probabilities are all zero may be skipped.
    /// (Made and read only by the x86-64 AVX-512 product.)
    #[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
    pub finite: bool,
}

/// `v [batch, hdv, keys]` transposed to `[batch, keys, hdv]` for
/// [`Chain::vt`], where the AVX-512 product takes this value width.
pub fn values_transposed(v: &[f32], batch: usize, hdv: usize, keys: usize) -> Option<TransposedV> {
    if !pv_avx512_fits(hdv) || v.len() != batch * hdv * keys {
        return None;
    }
    let mut data = Vec::with_capacity(v.len());
    for b in v.chunks_exact(hdv * keys) {
        data.extend(super::kernels::transpose(b, hdv, keys));
    }
    let finite = v
        .par_chunks(1 << 14)
        .all(|c| c.iter().all(|x| x.is_finite()));
    Some(TransposedV { data, finite })
}

/// Whether [`attention_chain`] computes each query row the same way
/// wherever it stands among the queries, so that a chain over a subset of
/// the rows gives those rows' bits of the whole chain: with the AVX-512
/// product of `vt` (each row its own sums), not with gemm's, which takes a
/// tile's rows as its columns and sums its last columns otherwise.
pub fn rows_independent(vt: Option<&TransposedV>, hdv: usize) -> bool {
    vt.is_some() && has_avx512_stages() && pv_avx512_fits(hdv)
}

/// Whether this CPU computes attention rows alike wherever they stand, for
/// a value width of 16 (see [`rows_independent`]).
pub fn rows_independent_here() -> bool {
    has_avx512_stages() && pv_avx512_fits(16)
}

/// Values of one stage that were (non-finite, finite beyond fp16's range).
pub type Counts = (usize, usize);

/// Run an attention chain in tiles of query rows. Every op of the chain is
/// row-wise over the queries, so a tile's score block never leaves the
/// cache and the result is the op-by-op result; with `fp16`, each stage's
/// values are rounded as the op-by-op path rounds them (and with `check`,
/// counted first). Returns `ctx [batch, hdv, queries]` (not rounded: the
/// caller rounds op outputs) and the counts of the four inner stages.
///
/// A tile whose rows' mask leaves keys dead ([`DeadKeys`]) computes only the
/// span of keys its rows can attend to, with the same bits.
pub fn attention_chain(ch: &Chain, fp16: bool, check: bool) -> (Vec<f32>, [Counts; 4]) {
    attention_chain_with(ch, fp16, check, shortcuts())
}

/// [`attention_chain`], with its shortcuts (dead keys skipped, equal
/// batches computed once) on or off (off: every score of every tile of
/// every batch is computed, for the tests that compare the two).
fn attention_chain_with(
    ch: &Chain,
    fp16: bool,
    check: bool,
    shortcuts: bool,
) -> (Vec<f32>, [Counts; 4]) {
    let (nq, nk, hd, hdv) = (ch.queries, ch.keys, ch.hd, ch.hdv);
    // One tile of query rows per thread (at most 256 rows, at least 16): the
    // operands gemm packs (k, and v without AVX-512) are packed once per
    // tile, and a row's stages run while it is in L1.
    let threads = rayon::current_num_threads().max(1);
    let simd = has_avx512_stages();
    let vt = ch
        .vt
        .filter(|vt| vt.data.len() == ch.batch * nk * hdv && pv_avx512_fits(hdv));
    // Skipping needs the AVX-512 stages and product (whose sums it keeps)
    // and finite values (a zero probability then contributes nothing).
    let spans = match (ch.mask, vt) {
        (Some(m), Some(vt)) if shortcuts && simd && vt.finite && m.len() % (nq * nk) == 0 => {
            Some(match ch.spans {
                Some(s) if s.rows.len() * nk == m.len() => Cow::Borrowed(s),
                _ => Cow::Owned(MaskSpans::scan(m, nk)),
            })
        }
        _ => None,
    };
    // The keys' norms only where some row leaves keys dead.
    let dead = spans
        .as_deref()
        .filter(|s| s.any_dead)
        .map(|spans| DeadKeys {
            spans,
            kmax: match ch.kmax {
                Some(kept) => kept
                    .get_or_init(|| key_norms(ch.k, (ch.batch, hd, nk)))
                    .clone(),
                None => key_norms(ch.k, (ch.batch, hd, nk)),
            },
        });
    // Batches (Qwen2.5-VL's windows) equal bit for bit to an earlier one
    // are computed once: a bucket's pad windows.
    let batches = if shortcuts {
        DistinctBatches::of(ch)
    } else {
        DistinctBatches::all(ch.batch)
    };
    count_work(1, 0, (ch.batch - batches.reps.len()) * nq * nk);
    // Tiles of up to 256 rows, one per thread at least. Where keys are dead,
    // rows go by 16, so that the span of pad rows that attend to themselves
    // stays narrow; runs of rows that compute every key anyway go together
    // again. The AVX-512 product computes each row alike in any tile
    // (`query_rows_are_computed_alike_wherever_they_stand`).
    let big = nq.div_ceil(threads).clamp(16, 256).min(nq.max(1));
    let mask_rows = |b: usize| {
        ch.mask
            .map_or(0, |m| if m.len() == nq * nk { 0 } else { b })
            * nq
    };
    let jobs: Vec<(usize, usize, usize)> = batches
        .reps
        .iter()
        .flat_map(|&b| {
            let tiles = match &dead {
                Some(d) => d.tiles(mask_rows(b), nq, big),
                None => (0..nq).step_by(big).map(|i| (i, big.min(nq - i))).collect(),
            };
            tiles.into_iter().map(move |(i0, t)| (b, i0, t))
        })
        .collect();
    let mut ctx = vec![0f32; ch.batch * hdv * nq];
    let out = SendPtr(ctx.as_mut_ptr());
    let counts = (0..jobs.len())
        .into_par_iter()
        .map(|job| {
            SCORES.with_borrow_mut(|s| {
                let (b, i0, t) = jobs[job];
                if s.len() < t * nk {
                    s.resize(t * nk, 0f32);
                }
                let s = &mut s[..t * nk];
                let q = &ch.q[b * hd * nq..];
                let k = &ch.k[b * hd * nk..];
                let v = &ch.v[b * hdv * nk..];
                let row0 = mask_rows(b);
                // The keys this tile computes: all, or the live span only.
                let span = dead
                    .as_ref()
                    .and_then(|d| d.tile_span((b, row0 + i0, t), (q, nq, i0), ch.scale));
                let (lo, hi) = span.unwrap_or((0, nk));
                let w = hi - lo;
                count_work(1, t * w, t * nk);
                let s = &mut s[..t * w];
                // SAFETY: q^T rows i0..i0+t ([hd, nq] read with column stride nq),
                // k [hd, nk] from column lo, s [t, w]: all inside their buffers
                // for this batch.
                unsafe {
                    matmul(
                        (t, w, hd),
                        (s.as_mut_ptr(), 1, w as isize),
                        false,
                        (q.as_ptr().add(i0), nq as isize, 1),
                        (k.as_ptr().add(lo), 1, nk as isize),
                        Parallelism::None,
                    );
                }
                let mut c = [(0, 0); 4];
                // Row by row, so that every stage reads a row still in L1.
                for (r, row) in s.chunks_exact_mut(w).enumerate() {
                    let at = row0 + i0 + r;
                    let m = match ch.mask {
                        None => RowMask::Absent,
                        // Zero over every key the tile computes: not read.
                        Some(_) if spans.as_ref().is_some_and(|s| s.zero_over(at, lo, hi)) => {
                            RowMask::Zero
                        }
                        Some(m) => RowMask::Values(&m[at * nk + lo..at * nk + hi]),
                    };
                    inner_stages(row, m, ch.scale, fp16.then_some(check), &mut c, simd);
                }
                // The AVX-512 product where `vt` was made (x86-64 with AVX-512F
                // only), gemm elsewhere; a span is taken only with `vt`.
                let done = match vt {
                    #[cfg(target_arch = "x86_64")]
                    Some(vt) => {
                        // SAFETY: `vt` was made only on a CPU with AVX-512F, for
                        // this hdv, and a span only where it is finite; vt rows
                        // lo..hi of batch b; ctx[b] is [hdv, nq] and this task
                        // alone writes its columns i0..i0+t.
                        unsafe {
                            pv_avx512(
                                s,
                                (t, w, hdv),
                                &vt.data[(b * nk + lo) * hdv..(b * nk + hi) * hdv],
                                out.get().add(b * hdv * nq + i0),
                                nq,
                                vt.finite,
                            );
                        }
                        true
                    }
                    _ => false,
                };
                if !done {
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
                }
                // The batches this one stands for count as often.
                let m = batches.mult[b];
                c.map(|(n, sat)| (n * m, sat * m))
            })
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
    let size = hdv * nq;
    for (b, &r) in batches.of.iter().enumerate() {
        if r != b {
            ctx.copy_within(r * size..(r + 1) * size, b * size);
        }
    }
    (ctx, counts)
}

/// A chain's batches grouped by their operands' bits: `q`, `k`, `v` and
/// (where it has one per batch) the mask. Two equal batches go through the
/// same operations on the same values, so their contexts and counts are
/// equal bit for bit.
struct DistinctBatches {
    /// The batches computed, in order.
    reps: Vec<usize>,
    /// Per batch, the batch computed for it.
    of: Vec<usize>,
    /// Per batch computed, how many batches it stands for (else 0).
    mult: Vec<usize>,
}

impl DistinctBatches {
    fn all(batch: usize) -> Self {
        DistinctBatches {
            reps: (0..batch).collect(),
            of: (0..batch).collect(),
            mult: vec![1; batch],
        }
    }

    /// Each batch compared with the batches kept so far, the last match
    /// first (pad windows come in runs); a comparison stops at the first
    /// differing value, so distinct batches cost little.
    fn of(ch: &Chain) -> Self {
        let (batch, nq, nk) = (ch.batch, ch.queries, ch.keys);
        if batch < 2 {
            return Self::all(batch);
        }
        let per_batch_mask = ch.mask.filter(|m| m.len() == batch * nq * nk);
        let parts = |b: usize| {
            [
                &ch.q[b * ch.hd * nq..(b + 1) * ch.hd * nq],
                &ch.k[b * ch.hd * nk..(b + 1) * ch.hd * nk],
                &ch.v[b * ch.hdv * nk..(b + 1) * ch.hdv * nk],
                per_batch_mask.map_or(&[][..], |m| &m[b * nq * nk..(b + 1) * nq * nk]),
            ]
        };
        // Bit for bit, 64 values at a time (a fold the compiler vectorises),
        // stopping at the first block that differs.
        let same = |a: usize, b: usize| {
            parts(a).iter().zip(parts(b)).all(|(x, y)| {
                x.chunks(64).zip(y.chunks(64)).all(|(x, y)| {
                    x.iter()
                        .zip(y)
                        .fold(0u32, |d, (x, y)| d | (x.to_bits() ^ y.to_bits()))
                        == 0
                })
            })
        };
        let mut d = DistinctBatches {
            reps: Vec::new(),
            of: Vec::with_capacity(batch),
            mult: vec![0; batch],
        };
        let mut last: Option<usize> = None;
        for b in 0..batch {
            let found = last.filter(|&r| same(r, b)).or_else(|| {
                d.reps
                    .iter()
                    .copied()
                    .find(|&r| Some(r) != last && same(r, b))
            });
            let r = found.unwrap_or_else(|| {
                d.reps.push(b);
                b
            });
            d.of.push(r);
            d.mult[r] += 1;
            last = Some(r);
        }
        d
    }
}

/// The query rows of a tile where [`DeadKeys`] cut spans.
const DEAD_TILE_ROWS: usize = 16;

/// A mask value at or below this makes a key dead for its query row: its
/// probability is exactly 0 whatever the scores are, when [`DeadKeys::tile_span`]
/// bounds them. (Masks put -1e4 there; real keys get 0.)
const DEAD_MASK: f32 = -1000.0;

/// Where a chain's mask leaves keys dead, and how large the keys can make a
/// score.
///
/// The op-by-op path computes every score, then `exp(x - max)` of each; a
/// dead key's `x` lies so far below the row's maximum that its exponential
/// is exactly 0 (the interpreter's `exp` is 0 below [`super::kernels::EXP_LO`]),
/// so its probability is exactly 0 and, with finite values, it adds exactly
/// nothing to the product with `v`. A tile of query rows then computes only
/// the keys from its rows' first live key to their last (16-aligned, so that
/// the softmax's lanes sum what they summed), and the bits are those of the
/// whole row. Whether a dead key's score stays small enough is not assumed:
/// `|q . k| <= |q| |k|` bounds every score of the row, and a tile whose bound
/// is not far enough below its live keys, or would leave fp16's range (the
/// op-by-op path would count it), is computed whole.
struct DeadKeys<'a> {
    spans: &'a MaskSpans,
    /// Per batch (head): the largest `|k_j|` over every key.
    kmax: Vec<f64>,
}

/// Each row of a mask `[rows, keys]`: the span of its live keys (mask above
/// [`DEAD_MASK`]), the mask's extremes, and whether it is zero over the
/// span. One scan serves every head and block that adds the same mask (the
/// interpreter keeps it by the mask's name for a run).
#[derive(Clone)]
pub struct MaskSpans {
    /// `None` where every key is dead or a value outside the span is not
    /// finite.
    rows: Vec<Option<RowSpan>>,
    keys: usize,
    /// Some row's span leaves keys out.
    any_dead: bool,
}

#[derive(Clone, Copy)]
struct RowSpan {
    /// The first live key and one past the last.
    lo: usize,
    hi: usize,
    /// The mask's largest value in `lo..hi` (a live key's).
    live_max: f64,
    /// The mask's largest and smallest value outside `lo..hi`.
    out_max: f64,
    out_min: f64,
    /// Every value in `lo..hi` is +0 or -0 (a lone image's keys).
    zero: bool,
}

impl MaskSpans {
    /// Scan `mask [rows, keys]`, each row once.
    pub fn scan(mask: &[f32], keys: usize) -> Self {
        let rows = mask
            .par_chunks(keys)
            .map(|row| {
                // Live: above DEAD_MASK, or NaN.
                let dead = |m: &f32| *m <= DEAD_MASK;
                let lo = row.iter().position(|m| !dead(m))?;
                let hi = row.iter().rposition(|m| !dead(m))? + 1;
                let live_max = row[lo..hi].iter().fold(f32::NEG_INFINITY, |a, &b| a.max(b));
                let (mut out_max, mut out_min) = (f32::NEG_INFINITY, f32::INFINITY);
                for &m in row[..lo].iter().chain(&row[hi..]) {
                    // Outside the span every value is <= DEAD_MASK (not NaN).
                    (out_max, out_min) = (out_max.max(m), out_min.min(m));
                }
                (live_max.is_finite() && out_min > f32::NEG_INFINITY).then_some(RowSpan {
                    lo,
                    hi,
                    live_max: live_max as f64,
                    out_max: out_max as f64,
                    out_min: out_min as f64,
                    zero: row[lo..hi].iter().all(|&m| m == 0.0),
                })
            })
            .collect::<Vec<_>>();
        let any_dead = rows.iter().flatten().any(|r| r.hi - r.lo < keys);
        MaskSpans {
            rows,
            keys,
            any_dead,
        }
    }

    /// Whether mask row `row` is zero over the keys `lo..hi`.
    fn zero_over(&self, row: usize, lo: usize, hi: usize) -> bool {
        self.rows
            .get(row)
            .copied()
            .flatten()
            .is_some_and(|r| r.zero && r.lo <= lo && hi <= r.hi)
    }
}

/// Per batch of `k [batch, hd, keys]`: the largest norm of a key.
fn key_norms(k: &[f32], (batch, hd, keys): (usize, usize, usize)) -> Vec<f64> {
    (0..batch)
        .into_par_iter()
        .map(|b| {
            let mut sq = vec![0f64; keys];
            for d in k[b * hd * keys..(b + 1) * hd * keys].chunks_exact(keys) {
                for (s, &x) in sq.iter_mut().zip(d) {
                    *s += x as f64 * x as f64;
                }
            }
            sq.iter().fold(0f64, |a, &b| a.max(b)).sqrt()
        })
        .collect()
}

impl DeadKeys<'_> {
    /// The tiles `(first row, rows)` of a chain's `nq` query rows whose mask
    /// rows start at `row0`: 16 rows each ([`DEAD_TILE_ROWS`]), except that
    /// consecutive groups of 16 that compute every key anyway
    /// ([`DeadKeys::whole`]) go together, up to `big` rows.
    fn tiles(&self, row0: usize, nq: usize, big: usize) -> Vec<(usize, usize)> {
        let mut tiles = Vec::new();
        let mut i = 0;
        while i < nq {
            let t = DEAD_TILE_ROWS.min(nq - i);
            let mut j = i + t;
            if self.whole(row0 + i, t) {
                while j < nq && j - i < big {
                    let u = DEAD_TILE_ROWS.min(nq - j).min(big - (j - i));
                    if !self.whole(row0 + j, u) {
                        break;
                    }
                    j += u;
                }
            }
            tiles.push((i, j - i));
            i = j;
        }
        tiles
    }

    /// Whether a tile of the `t` mask rows from `row0` computes every key
    /// whatever its scores: a row with no span, or a span of most keys
    /// ([`DeadKeys::tile_span`]'s first tests).
    fn whole(&self, row0: usize, t: usize) -> bool {
        self.union(row0, t)
            .is_none_or(|(lo, hi)| (hi - lo) * 4 > self.spans.keys * 3)
    }

    /// The 16-aligned union of the spans of the `t` mask rows from `row0`;
    /// `None` where a row has no span.
    fn union(&self, row0: usize, t: usize) -> Option<(usize, usize)> {
        let keys = self.spans.keys;
        let rows = self.spans.rows.get(row0..row0 + t)?;
        let (mut lo, mut hi) = (usize::MAX, 0);
        for r in rows {
            let r = r.as_ref()?;
            (lo, hi) = (lo.min(r.lo), hi.max(r.hi));
        }
        Some((lo / 16 * 16, hi.next_multiple_of(16).min(keys)))
    }

    /// The keys `lo..hi` that the `t` query rows from mask row `row0` of
    /// batch `b` must compute, or `None` when the tile runs whole: a row
    /// with no live key or a non-finite mask, a span of most keys anyway,
    /// or a bound too weak. `q [hd, nq]` is batch `b`'s queries, the tile's
    /// from column `i0`.
    fn tile_span(
        &self,
        (b, row0, t): (usize, usize, usize),
        (q, nq, i0): (&[f32], usize, usize),
        scale: f32,
    ) -> Option<(usize, usize)> {
        let keys = self.spans.keys;
        let rows = self.spans.rows.get(row0..row0 + t)?;
        let (lo, hi) = self.union(row0, t)?;
        if (hi - lo) * 4 > keys * 3 {
            return None;
        }
        let mut qsq = vec![0f64; t];
        let hd = q.len() / nq;
        for d in 0..hd {
            let row = &q[d * nq + i0..d * nq + i0 + t];
            for (s, &x) in qsq.iter_mut().zip(row) {
                *s += x as f64 * x as f64;
            }
        }
        // |score| <= |q| |k| (the f32 dot product is within hd * 2^-24 of
        // it: 1e-3 covers that and each stage's fp16 rounding, 2^-11).
        let kmax = self.kmax[b];
        let ok = rows.iter().zip(&qsq).all(|(r, &qs)| {
            let r = r.as_ref().expect("checked above");
            let score = qs.sqrt() * kmax * 1.001 + 1.0;
            let a = score * (scale.abs() as f64) * 1.002 + 1.0;
            let slack = |x: f64| x.abs() * 2e-3 + 1.0;
            // The largest a dead key's value can be, the smallest the row's
            // maximum can be (a live key's).
            let dead_hi = r.out_max + a;
            let max_lo = r.live_max - a;
            let gap = (max_lo - slack(max_lo)) - (dead_hi + slack(dead_hi));
            score < 60000.0
                && a < 60000.0
                && r.out_min - a - slack(r.out_min - a) > -60000.0
                && gap > 100.0
        });
        ok.then_some((lo, hi))
    }
}

/// Whether [`pv_avx512`] takes a value width of `hdv`: at most eight zmm
/// registers a row (the last one partly, under a mask), on a CPU with
/// AVX-512F.
fn pv_avx512_fits(hdv: usize) -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        (1..=PV_MAX_WIDTH).contains(&hdv) && std::arch::is_x86_feature_detected!("avx512f")
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = hdv;
        false
    }
}

/// The widest value [`pv_avx512`] takes: eight zmm registers.
#[cfg(target_arch = "x86_64")]
const PV_MAX_WIDTH: usize = 128;

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
/// The CPU must have AVX-512F and [`pv_avx512_fits`]`(hdv)`; `vt` is
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
unsafe fn pv_block<const R: usize, const C: usize>((p, (stride, n), vt, hdv, tail, out): PvArgs) {
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

/// [`pv_block`]'s operands: `(p, (stride, n), vt, hdv, tail, out)`.
#[cfg(target_arch = "x86_64")]
type PvArgs<'a> = (
    &'a [f32],
    (usize, usize),
    &'a [f32],
    usize,
    u16,
    &'a mut [f32],
);

/// Whether [`inner_stages`] may take its AVX-512 path (with F16C and
/// POPCNT for the rounding and counting).
fn has_avx512_stages() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        use std::arch::is_x86_feature_detected as has;
        has!("avx512f") && has!("avx2") && has!("f16c") && has!("popcnt")
    }
    #[cfg(not(target_arch = "x86_64"))]
    false
}

/// The mask that [`inner_stages`] adds to one row of scores.
#[derive(Clone, Copy)]
enum RowMask<'a> {
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
/// first into `c`. `simd` (from [`has_avx512_stages`]) takes the AVX-512
/// path, which gives the same bits in three passes over the row instead of
/// seven.
fn inner_stages(
    row: &mut [f32],
    mask: RowMask,
    scale: f32,
    fp16: Option<bool>,
    c: &mut [Counts; 4],
    simd: bool,
) {
    #[cfg(target_arch = "x86_64")]
    if simd {
        // SAFETY: `simd` says the CPU has the features the path needs.
        unsafe { inner_stages_avx512(row, mask, scale, fp16, c) };
        return;
    }
    let _ = simd;
    let mut stage = |s: &mut [f32], i: usize| {
        if let Some(check) = fp16 {
            let (n, sat) = round_f16_in_place(s, check);
            c[i].0 += n;
            c[i].1 += sat;
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

/// [`inner_stages`] in three passes of 16 lanes: the elementwise stages
/// (each rounded) and the row's maximum; the exponentials and `1 / sum`
/// ([`super::kernels::exp_shift_inv_sum`], as the op-by-op softmax takes
/// them); the normalisation. The operations and their order are the
/// op-by-op path's, so the bits are.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx2,f16c,popcnt")]
unsafe fn inner_stages_avx512(
    row: &mut [f32],
    mask: RowMask,
    scale: f32,
    fp16: Option<bool>,
    c: &mut [Counts; 4],
) {
    use super::round1;
    use std::arch::x86_64::*;
    #[inline]
    #[target_feature(enable = "avx512f,f16c,popcnt")]
    fn round16(x: __m512, check: bool, c: &mut Counts) -> __m512 {
        if check {
            count16(x, c);
        }
        _mm512_cvtph_ps(_mm512_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(x))
    }
    /// The counts of [`round16`] alone (for values fp16 already).
    #[inline]
    #[target_feature(enable = "avx512f,popcnt")]
    fn count16(x: __m512, c: &mut Counts) {
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
    let n = row.len();
    let whole = n / 16 * 16;
    let (check, round) = (fp16.unwrap_or(false), fp16.is_some());
    let sc = _mm512_set1_ps(scale);
    let mut lanes = _mm512_set1_ps(f32::NEG_INFINITY);
    let p = row.as_mut_ptr();
    for i in (0..whole).step_by(16) {
        // SAFETY: i + 16 <= n, the length of `row` and of the mask's values.
        unsafe {
            let mut x = _mm512_loadu_ps(p.add(i));
            if round {
                x = round16(x, check, &mut c[0]);
            }
            x = _mm512_mul_ps(x, sc);
            if round {
                x = round16(x, check, &mut c[1]);
            }
            match mask {
                RowMask::Absent => {}
                // `x` is fp16 already: its rounding would keep it.
                RowMask::Zero => {
                    if check {
                        count16(x, &mut c[2]);
                    }
                }
                RowMask::Values(m) => {
                    x = _mm512_add_ps(x, _mm512_loadu_ps(m.as_ptr().add(i)));
                    if round {
                        x = round16(x, check, &mut c[2]);
                    }
                }
            }
            _mm512_storeu_ps(p.add(i), x);
            // Returns `lanes` when `x` is NaN, as f32::max does.
            lanes = _mm512_max_ps(x, lanes);
        }
    }
    for i in whole..n {
        let mut x = row[i];
        if round {
            x = round1(x, check, &mut c[0]);
        }
        x *= scale;
        if round {
            x = round1(x, check, &mut c[1]);
        }
        match mask {
            RowMask::Absent => {}
            RowMask::Zero => {
                if round {
                    x = round1(x, check, &mut c[2]);
                }
            }
            RowMask::Values(m) => {
                x += m[i];
                if round {
                    x = round1(x, check, &mut c[2]);
                }
            }
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
    let inv = super::kernels::exp_shift_inv_sum_avx512(row, max);
    let iv = _mm512_set1_ps(inv);
    for i in (0..whole).step_by(16) {
        // SAFETY: i + 16 <= n.
        unsafe {
            let mut x = _mm512_mul_ps(_mm512_loadu_ps(p.add(i)), iv);
            if round {
                x = round16(x, check, &mut c[3]);
            }
            _mm512_storeu_ps(p.add(i), x);
        }
    }
    for x in &mut row[whole..] {
        *x *= inv;
        if round {
            *x = round1(*x, check, &mut c[3]);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What [`COLUMN_GROUP`] rests on, under the kernels that
    /// `columns_independent` names: a column multiplied among any whole
    /// number of groups of columns has the bits it has among 1024, with
    /// f32 and fp16 weights, at small and odd inner sizes (where narrower
    /// remainder kernels would show) and at a tower's. Elsewhere the
    /// shortcut does not run, and there is nothing to check.
    #[test]
    fn columns_in_whole_groups_are_computed_alike_wherever_they_stand() {
        if !crate::blas::columns_independent() {
            eprintln!("BLAS kernels {}: not checked", crate::blas::kernel());
            return;
        }
        let s = 1024;
        for (o, c) in [(96, 70), (96, 33), (50, 129), (256, 1024)] {
            let w = lcg(o * c, 21);
            let w16: Vec<half::f16> = w.iter().map(|&v| half::f16::from_f32(v)).collect();
            let x = lcg(c * s, 22);
            for w in [ConvWeights::F32(&w), ConvWeights::F16(&w16)] {
                let mut whole = vec![0f32; o * s];
                product(&x, (c, s), w, None, &mut whole);
                for groups in [1, 2, 3, 5, 7, 21] {
                    let u = groups * COLUMN_GROUP;
                    // Columns from all over, out of order.
                    let cols: Vec<usize> = (0..u).map(|j| (j * 37 + 11) % s).collect();
                    let mut xu = vec![0f32; c * u];
                    for (d, row) in xu.chunks_exact_mut(u).zip(x.chunks_exact(s)) {
                        d.iter_mut().zip(&cols).for_each(|(d, &j)| *d = row[j]);
                    }
                    let mut yu = vec![0f32; o * u];
                    product(&xu, (c, u), w, None, &mut yu);
                    for (a, b) in yu.chunks_exact(u).zip(whole.chunks_exact(s)) {
                        for (k, &j) in cols.iter().enumerate() {
                            assert_eq!(a[k].to_bits(), b[j].to_bits(), "{o} x {c}, {u} columns");
                        }
                    }
                }
            }
        }
    }

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
        let y = conv1x1(&x, (n, c, s), ConvWeights::F32(&w), o, Some(&b));
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
        let y0 = conv1x1(&x, (n, c, s), ConvWeights::F32(&w), o, None);
        let no_bias: Vec<f32> = want
            .iter()
            .enumerate()
            .map(|(i, v)| v - b[(i / s) % o])
            .collect();
        close(&y0, &no_bias, 1e-6);
        // fp16 weights: bit for bit the product with the widened weights.
        let w16: Vec<half::f16> = w.iter().map(|&v| half::f16::from_f32(v)).collect();
        let wide: Vec<f32> = w16.iter().map(|v| v.to_f32()).collect();
        assert_eq!(
            conv1x1(&x, (n, c, s), ConvWeights::F16(&w16), o, Some(&b)),
            conv1x1(&x, (n, c, s), ConvWeights::F32(&wide), o, Some(&b))
        );
    }

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

    /// Bits, with every NaN alike (the compiler may commute a product, and
    /// with it which NaN's sign propagates).
    fn bits(v: &[f32]) -> Vec<u32> {
        v.iter()
            .map(|x| if x.is_nan() { u32::MAX } else { x.to_bits() })
            .collect()
    }

    /// The AVX-512 inner stages give the portable stages' bits and
    /// counts: on plain rows with a tail, on rows with values beyond fp16's
    /// range, and on rows with an infinity or a NaN.
    #[test]
    fn inner_stages_paths_agree() {
        for len in [5usize, 8, 16, 37, 300] {
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
            for (kind, row) in [
                ("plain", &plain),
                ("big", &big),
                ("inf", &inf),
                ("nan", &nan),
            ] {
                for fp16 in [None, Some(false), Some(true)] {
                    for m in [RowMask::Absent, RowMask::Values(&mask)] {
                        let mut a = row.clone();
                        let mut ca = [(0, 0); 4];
                        inner_stages(&mut a, m, 0.37, fp16, &mut ca, false);
                        if has_avx512_stages() {
                            let mut b = row.clone();
                            let mut cb = [(0, 0); 4];
                            inner_stages(&mut b, m, 0.37, fp16, &mut cb, true);
                            let at = format!("{kind} len {len} fp16 {fp16:?}");
                            assert_eq!(bits(&a), bits(&b), "{at}");
                            assert_eq!(ca, cb, "{at}");
                        }
                        if fp16 == Some(true) {
                            let want = match kind {
                                "plain" => (0, 0),
                                "big" => (0, 2),
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
            let simds = if has_avx512_stages() {
                vec![false, true]
            } else {
                vec![false]
            };
            for row in [&plain, &vec![-0f32; len], &big, &odd] {
                for fp16 in [None, Some(false), Some(true)] {
                    for added in [&zeros, &negzeros] {
                        for &simd in &simds {
                            let (mut a, mut b) = (row.clone(), row.clone());
                            let (mut ca, mut cb) = ([(0, 0); 4], [(0, 0); 4]);
                            inner_stages(
                                &mut a,
                                RowMask::Values(added),
                                0.125,
                                fp16,
                                &mut ca,
                                simd,
                            );
                            inner_stages(&mut b, RowMask::Zero, 0.125, fp16, &mut cb, simd);
                            let at = format!("len {len} fp16 {fp16:?} simd {simd}");
                            assert_eq!(bits(&a), bits(&b), "{at}");
                            assert_eq!(ca, cb, "{at}");
                            if fp16 == Some(true) && row == &big {
                                assert_eq!(cb[2], (1, 0), "{at}: 7e4 is inf after stage 1");
                            }
                        }
                    }
                }
            }
        }
    }

    /// Skipping the keys whose probabilities are zero in a whole block gives
    /// the bits of the full product: pad rows that attend to themselves
    /// alone, real rows whose tail is masked, a row of zeros, -0 and NaN.
    #[cfg(target_arch = "x86_64")]
    #[test]
    fn pv_skips_zero_keys_bit_exactly() {
        if !pv_avx512_fits(64) {
            return;
        }
        // Whole registers, and a last one partly masked.
        for hdv in [64, 72, 80, 128] {
            pv_skips_zero_keys_at(hdv);
        }
    }

    #[cfg(target_arch = "x86_64")]
    fn pv_skips_zero_keys_at(hdv: usize) {
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
        let run = |skip: bool| {
            let mut ctx = vec![0f32; hdv * t];
            // SAFETY: AVX-512F is present (checked above); ctx is [hdv, t].
            unsafe { pv_avx512(&probs, (t, nk, hdv), &vt.data, ctx.as_mut_ptr(), t, skip) };
            ctx
        };
        let (full, skipped) = (run(false), run(true));
        let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        assert_eq!(bits(&full), bits(&skipped));
        assert!((0..hdv).all(|d| skipped[d * t + 12].is_nan() && skipped[d * t + 10] == 0.0));
        assert_eq!(nonzero_span_checked(&probs[10 * nk..11 * nk]), (nk, 0));
        assert_eq!(nonzero_span_checked(&probs[20 * nk..21 * nk]), (50, 51));
        // A value that is not finite turns skipping off: 0 * inf is NaN.
        let mut v_inf = v.clone();
        v_inf[5] = f32::INFINITY;
        assert!(!values_transposed(&v_inf, 1, hdv, nk).unwrap().finite);
    }

    #[cfg(target_arch = "x86_64")]
    fn nonzero_span_checked(row: &[f32]) -> (usize, usize) {
        // SAFETY: callers check AVX-512F first.
        unsafe { nonzero_span(row) }
    }

    /// Repeated columns: the product over the distinct ones gives the whole
    /// product's bits, with f32 and fp16 weights, with and without a bias,
    /// for repeats at the start, inside and at the end, and -0 against +0.
    #[test]
    fn repeated_columns_are_computed_once_bit_exactly() {
        let (c, s, o) = (96, 320, 70);
        let mut x = lcg(c * s, 11);
        // Column j takes the values of column src(j): runs of repeats.
        let src = |j: usize| match j {
            0..=9 => 0,
            40..=59 => 40,
            100 => 99,
            150..=319 => 150,
            j => j,
        };
        for row in x.chunks_exact_mut(s) {
            for j in 0..s {
                row[j] = row[src(j)];
            }
        }
        // Column 120 equals 119 but for one -0 against +0: not a repeat.
        for j in [119, 120] {
            x[5 * s + j] = if j == 119 { 0.0 } else { -0.0 };
        }
        for j in 121..150 {
            for ch in 0..c {
                x[ch * s + j] = x[ch * s + 121];
            }
        }
        if !crate::blas::columns_independent() {
            eprintln!(
                "BLAS kernels {}: repeated columns are not shortcut",
                crate::blas::kernel()
            );
            let y = conv1x1(&x, (1, c, s), ConvWeights::F32(&lcg(o * c, 12)), o, None);
            let mut whole = vec![0f32; o * s];
            product(
                &x,
                (c, s),
                ConvWeights::F32(&lcg(o * c, 12)),
                None,
                &mut whole,
            );
            assert!(
                y.iter()
                    .zip(&whole)
                    .all(|(a, b)| a.to_bits() == b.to_bits())
            );
            return;
        }
        let (cols, of) = distinct_columns(&x, c, s).expect("repeats");
        // 0; 10..=39; 40; 60..=99; 101..=118; 119; 120; 121; 150: 94 distinct,
        // then 150 again up to 96.
        assert_eq!(cols.len(), 96);
        assert!(cols[94..].iter().all(|&j| j == 150));
        assert!(cols.contains(&120) && !cols.contains(&100) && cols.contains(&150));
        assert_eq!(of.len(), s);
        let w = lcg(o * c, 12);
        let w16: Vec<half::f16> = w.iter().map(|&v| half::f16::from_f32(v)).collect();
        let bias = lcg(o, 13);
        let bits = |x: &[f32]| x.iter().map(|v| v.to_bits()).collect::<Vec<_>>();
        for w in [ConvWeights::F32(&w), ConvWeights::F16(&w16)] {
            for b in [None, Some(bias.as_slice())] {
                let mut whole = vec![0f32; o * s];
                product(&x, (c, s), w, b, &mut whole);
                let y = conv1x1(&x, (1, c, s), w, o, b);
                assert!(bits(&whole) == bits(&y));
            }
        }
        // Few repeats, or a column count out of whole groups: the whole
        // product runs.
        assert!(distinct_columns(&lcg(c * s, 14), c, s).is_none());
        assert!(distinct_columns(&x[..c * 300], c, 300).is_none());
    }

    /// A block-diagonal mask as the hosts make them: images of `sizes`
    /// tokens in turn, every later row a pad that attends to itself alone.
    fn padded_mask(n: usize, sizes: &[usize]) -> Vec<f32> {
        let mut m = vec![-1e4f32; n * n];
        let mut start = 0;
        for &len in sizes {
            for q in start..start + len {
                m[q * n + start..q * n + start + len].fill(0.0);
            }
            start += len;
        }
        for q in start..n {
            m[q * n + q] = 0.0;
        }
        m
    }

    /// Equal batches (a bucket's pad windows) computed once give every
    /// batch's bits and the whole chain's counts: windows of 64 slots with
    /// Qwen2.5-VL's window mask, value widths of whole and masked
    /// registers, fp32 and fp16, at a scale where the scores overflow fp16.
    #[test]
    fn equal_batches_are_computed_once_bit_exactly() {
        let (batch, hd, n) = (7, 16, 64);
        for hdv in [16, 80] {
            let (mut q, mut k, mut v) = (
                lcg(batch * hd * n, 31),
                lcg(batch * hd * n, 32),
                lcg(batch * hdv * n, 33),
            );
            // Windows 0 and 4 hold 40 and 25 real slots; the others are
            // pad windows, each slot attending to itself, equal to window 1
            // (2, 3, 5) or with one value apart (6).
            let mut mask = Vec::new();
            for w in 0..batch {
                mask.extend(padded_mask(n, &[[40, 0, 0, 0, 25, 0, 0][w]]));
            }
            for w in [2, 3, 5, 6] {
                q.copy_within(hd * n..2 * hd * n, w * hd * n);
                k.copy_within(hd * n..2 * hd * n, w * hd * n);
                v.copy_within(hdv * n..2 * hdv * n, w * hdv * n);
            }
            v[6 * hdv * n + 5] += 1.0;
            let base = Chain {
                q: &q,
                k: &k,
                v: &v,
                mask: Some(&mask),
                vt: None,
                kmax: None,
                spans: None,
                scale: 0.125,
                batch,
                hd,
                hdv,
                queries: n,
                keys: n,
            };
            let d = DistinctBatches::of(&base);
            assert_eq!(d.reps, [0, 1, 4, 6]);
            assert_eq!(d.of, [0, 1, 1, 1, 4, 1, 6]);
            assert_eq!(d.mult, [1, 4, 0, 0, 1, 0, 1]);
            let vt = values_transposed(&v, batch, hdv, n);
            for scale in [0.125, 1e6] {
                for fp16 in [false, true] {
                    let ch = Chain {
                        vt: vt.as_ref(),
                        scale,
                        ..base
                    };
                    let (on, c_on) = attention_chain_with(&ch, fp16, true, true);
                    let (off, c_off) = attention_chain_with(&ch, fp16, true, false);
                    let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
                    assert_eq!(
                        bits(&on),
                        bits(&off),
                        "hdv {hdv}, scale {scale}, fp16 {fp16}"
                    );
                    assert_eq!(c_on, c_off, "hdv {hdv}, scale {scale}, fp16 {fp16}");
                    if fp16 && scale > 1.0 {
                        assert!(c_on[1].1 > 0, "the scaled scores overflow fp16");
                    }
                }
            }
        }
    }

    /// Skipping dead keys gives the whole chain's bits and counts, where it
    /// skips and where its bound sends a tile back to the whole row: padded
    /// and windowed masks, fp32 and fp16, values that overflow fp16.
    #[test]
    fn dead_keys_are_skipped_bit_exactly() {
        if !has_avx512_stages() || !pv_avx512_fits(64) {
            eprintln!("no AVX-512: the chain computes every key, nothing to compare");
            return;
        }
        let (batch, hd, hdv, n) = (3, 64, 64, 300);
        let masks = [
            ("one image and pads", padded_mask(n, &[100])),
            ("two images and pads", padded_mask(n, &[37, 90])),
            ("windows", padded_mask(n, &[64, 64, 64, 64, 44])),
            ("a large image and pads", padded_mask(n, &[260])),
            ("no padding", padded_mask(n, &[n])),
        ];
        // Tiles: rows that attend to most keys (the large image's, and a
        // group of 16 that holds some) in tiles of up to 150 rows (a
        // thread's share), the pad rows by 16.
        let large = MaskSpans::scan(&masks[3].1, n);
        let d = DeadKeys {
            spans: &large,
            kmax: vec![1.0; batch],
        };
        assert_eq!(
            d.tiles(0, n, 150),
            [(0, 150), (150, 112), (262, 16), (278, 16), (294, 6)]
        );
        let base = (
            lcg(batch * hd * n, 1),
            lcg(batch * hd * n, 2),
            lcg(batch * hdv * n, 3),
        );
        // Scaled queries: ordinary scores; scores whose bound is too weak
        // (the tile runs whole); scores beyond fp16's range (counted).
        for (what, qscale) in [
            ("ordinary", 1.0f32),
            ("weak bound", 1800.0),
            ("overflow", 10000.0),
        ] {
            let q: Vec<f32> = base.0.iter().map(|x| x * qscale).collect();
            let (k, v) = (&base.1, &base.2);
            let vt = values_transposed(v, batch, hdv, n).unwrap();
            for (mname, mask) in &masks {
                for fp16 in [false, true] {
                    let ch = Chain {
                        q: &q,
                        k,
                        v,
                        mask: Some(mask),
                        vt: Some(&vt),
                        kmax: None,
                        spans: None,
                        scale: 0.125,
                        batch,
                        hd,
                        hdv,
                        queries: n,
                        keys: n,
                    };
                    let (whole, cw) = attention_chain_with(&ch, fp16, true, false);
                    let (skipped, cs) = attention_chain_with(&ch, fp16, true, true);
                    // With the spans kept by the caller, as the interpreter does.
                    let spans = MaskSpans::scan(mask, n);
                    let kept = Chain {
                        spans: Some(&spans),
                        ..ch
                    };
                    let (kept, ck) = attention_chain_with(&kept, fp16, true, true);
                    let bits = |x: &[f32]| x.iter().map(|v| v.to_bits()).collect::<Vec<_>>();
                    assert!(
                        bits(&whole) == bits(&skipped),
                        "{what}, {mname}, fp16 {fp16}"
                    );
                    assert!(bits(&whole) == bits(&kept), "{what}, {mname}, fp16 {fp16}");
                    assert_eq!(cw, cs, "{what}, {mname}, fp16 {fp16}");
                    assert_eq!(cw, ck, "{what}, {mname}, fp16 {fp16}");
                    if what == "overflow" && fp16 {
                        assert!(cw[0].1 > 0, "{mname}: the scores should overflow");
                    }
                }
            }
            // Whether a pad-only tile of batch 0 is cut to its own keys.
            let one = MaskSpans::scan(&masks[0].1, n);
            let dead = DeadKeys {
                spans: &one,
                kmax: key_norms(k, (batch, hd, n)),
            };
            let span = dead.tile_span((0, 200, 50), (&q[..hd * n], n, 200), 0.125);
            let expect = (what == "ordinary").then_some((192, 256));
            assert_eq!(span, expect, "{what}");
            // Unpadded rows attend to every key: nothing to cut.
            let dead = DeadKeys {
                spans: &large,
                kmax: key_norms(k, (batch, hd, n)),
            };
            assert_eq!(
                dead.tile_span((0, 0, 50), (&q[..hd * n], n, 0), 0.125),
                None
            );
        }
    }

    /// With the AVX-512 product (`vt`), a query row's context is a function
    /// of its own row of q and of the mask, wherever the row stands: the
    /// chain run on a subset of the rows (q's columns and the mask's rows
    /// gathered) gives those rows' bits of the whole chain, for every count
    /// of 1 to 40 rows and larger subsets, with and without dead keys, fp32
    /// and fp16. The interpreter's packed columns rely on it
    /// ([`rows_independent`]). (The gemm product, which takes a tile's rows
    /// as its columns, does not: its last columns' sums differ.)
    #[test]
    fn query_rows_are_computed_alike_wherever_they_stand() {
        if !has_avx512_stages() {
            eprintln!("no AVX-512: the chain's product is gemm's, rows are not independent");
            return;
        }
        let (batch, hd, n) = (2, 64, 300);
        let (q, k) = (lcg(batch * hd * n, 11), lcg(batch * hd * n, 12));
        let mut checked = 0;
        // Value widths of whole and of partly masked registers.
        for hdv in [16, 64, 72, 80] {
            let v = lcg(batch * hdv * n, 13);
            let vt = values_transposed(&v, batch, hdv, n);
            assert!(
                vt.as_ref()
                    .is_some_and(|vt| rows_independent(Some(vt), hdv))
            );
            for mask in [padded_mask(n, &[100]), padded_mask(n, &[n])] {
                for fp16 in [false, true] {
                    let ch = Chain {
                        q: &q,
                        k: &k,
                        v: &v,
                        mask: Some(&mask),
                        vt: vt.as_ref(),
                        kmax: None,
                        spans: None,
                        scale: 0.125,
                        batch,
                        hd,
                        hdv,
                        queries: n,
                        keys: n,
                    };
                    let (whole, _) = attention_chain(&ch, fp16, true);
                    let mut subsets: Vec<Vec<usize>> = vec![
                        vec![7],
                        vec![0, 150],
                        (0..101).collect(),
                        (3..300).step_by(2).collect(),
                        (0..n).collect(),
                    ];
                    // Every count from 1 to 40 rows, spread over the queries.
                    subsets.extend((1..=40).map(|m| (0..m).map(|i| (i * 7 + m) % n).collect()));
                    for rows in subsets {
                        let m = rows.len();
                        let qs: Vec<f32> = (0..batch * hd)
                            .flat_map(|bd| rows.iter().map(move |&r| (bd, r)))
                            .map(|(bd, r)| q[bd * n + r])
                            .collect();
                        let ms: Vec<f32> = rows
                            .iter()
                            .flat_map(|&r| mask[r * n..(r + 1) * n].iter().copied())
                            .collect();
                        let sub = Chain {
                            q: &qs,
                            mask: Some(&ms),
                            queries: m,
                            ..ch
                        };
                        let (part, _) = attention_chain(&sub, fp16, true);
                        let bad = (0..batch * hdv)
                            .flat_map(|bd| rows.iter().enumerate().map(move |(i, &r)| (bd, i, r)))
                            .filter(|&(bd, i, r)| {
                                part[bd * m + i].to_bits() != whole[bd * n + r].to_bits()
                            })
                            .count();
                        assert_eq!(bad, 0, "hdv {hdv}, fp16 {fp16}, {m} rows");
                        checked += 1;
                    }
                }
            }
        }
        assert_eq!(checked, 4 * 2 * 2 * 45);
    }

    /// The tiled chain against the same ops on whole tensors.
    #[test]
    fn attention_chain_matches_op_by_op() {
        // hdv 136 takes gemm; the others the AVX-512 product (where the
        // CPU has it), in blocks of 3 to 6 rows and a remainder, 6 and 80
        // with their last register masked.
        for hdv in [6, 16, 48, 64, 80, 112, 136] {
            // 37 queries: tiles of 19 (blocks of 6, 6, 6, 1 at hdv 64);
            // 35: of 18 and 17 (6, 6, 6 and 6, 6, 5).
            for nq in [37, 35] {
                chain_case(hdv, nq);
            }
        }
    }

    fn chain_case(hdv: usize, nq: usize) {
        let (batch, hd, nk) = (2, 8, 300);
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
            let vt = values_transposed(&v, batch, hdv, nk);
            assert_eq!(vt.is_some(), hdv <= 128 && has_avx512_stages());
            let ch = Chain {
                q: &q,
                k: &k,
                v: &v,
                mask: Some(&mask),
                vt: vt.as_ref(),
                kmax: None,
                spans: None,
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
                    // Masked keys get nothing (the interpreter's exp is 0 below -87.3).
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
