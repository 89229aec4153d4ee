//! The attention chain `matmul → mul → add → softmax → matmul` run in
//! tiles of query rows ([`attention_chain_seen`]), its equal batches computed
//! once.

use std::borrow::Cow;

use gemm::Parallelism;
use rayon::prelude::*;

use super::dead_keys::{DeadKeys, MaskSpans, key_norms};
#[cfg(target_arch = "x86_64")]
use super::pv::pv;
use super::pv::pv_fits;
use super::stages::{RowMask, Simd, inner_stages};
use crate::blas::exact::{self, PackedB};
use crate::interp::Tally;
use crate::interp::kernels::SendPtr;
use crate::interp::packed::input_classes;

/// A strided f32 matrix operand of [`matmul`]: pointer, column stride, row stride.
type Mat = (*const f32, isize, isize);

/// `dst = (read_dst ? dst : 0) + lhs · rhs` for `lhs [m, k]`, `rhs [k, n]`,
/// `dst [m, n]`, each given by pointer and (column, row) strides.
///
/// # Safety
/// Every element the strides address must lie inside its buffer, and `dst`
/// must not overlap the operands or another task's output.
pub(super) unsafe fn matmul(
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
    /// are then multiplied by it with AVX-512 or AVX2, without packing.
    pub vt: Option<&'a TransposedV>,
    /// The mask's [`MaskSpans`], if the caller keeps them (else scanned here
    /// when they can serve).
    pub spans: Option<&'a MaskSpans>,
    /// What the caller keeps of `k` for the chains that share it (a head's
    /// query chunks): computed here on first need.
    pub kfacts: Option<&'a KeyFacts>,
    pub scale: f32,
    pub batch: usize,
    pub hd: usize,
    pub hdv: usize,
    pub queries: usize,
    pub keys: usize,
}

/// What the chains that share `k` keep of it, each computed on first need.
#[derive(Default)]
pub struct KeyFacts {
    /// Per batch, the keys' largest norm ([`key_norms`]).
    norms: std::sync::OnceLock<Vec<f64>>,
    /// Per batch, each key's class (`packed::input_classes` over `k`'s
    /// columns; `None` where few repeat).
    classes: std::sync::OnceLock<Vec<Option<Vec<u32>>>>,
    /// Per batch, `k` packed for the exact kernel's scores ([`Keys`]),
    /// each packed on first need.
    packed: std::sync::OnceLock<Vec<std::sync::OnceLock<PackedB>>>,
}

impl KeyFacts {
    /// Batch `b`'s keys `k [hd, nk]` packed, once.
    fn packed(&self, k: &[f32], (batch, hd, nk): (usize, usize, usize), b: usize) -> &PackedB {
        let all = self
            .packed
            .get_or_init(|| (0..batch).map(|_| std::sync::OnceLock::new()).collect());
        all[b].get_or_init(|| {
            let kb = &k[b * hd * nk..(b + 1) * hd * nk];
            // SAFETY: kb holds hd rows of nk.
            unsafe { PackedB::new((kb.as_ptr(), nk), (hd, nk)) }
        })
    }
}

/// Whether the chains' scores run on the exact kernel ([`Keys`]): with
/// the vector stages (`ANE_EXPORT_SIMD=none` keeps gemm's product, the
/// baseline's) and where the CPU has the kernel's instructions.
fn exact_scores() -> bool {
    Simd::here().any() && exact::available()
}

thread_local! {
    /// Each thread's block of scores, kept from one chain to the next.
    static SCORES: std::cell::RefCell<Vec<f32>> = const { std::cell::RefCell::new(Vec::new()) };
    /// Each thread's block of a tile's skipped scores (for their peaks).
    static DEAD: std::cell::RefCell<Vec<f32>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// `v` transposed for [`Chain::vt`].
pub struct TransposedV {
    /// `[batch, keys, hdv]`.
    pub data: Vec<f32>,
    /// Every value is finite: a zero probability then contributes exactly
    /// nothing, and keys whose probabilities are all zero may be skipped.
    /// (Made and read only by the x86-64 vector product.)
    #[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
    pub finite: bool,
}

/// `v [batch, hdv, keys]` transposed to `[batch, keys, hdv]` for
/// [`Chain::vt`], where the vector product takes this value width.
pub fn values_transposed(v: &[f32], batch: usize, hdv: usize, keys: usize) -> Option<TransposedV> {
    if !pv_fits(hdv) || v.len() != batch * hdv * keys {
        return None;
    }
    let mut data = Vec::with_capacity(v.len());
    for b in v.chunks_exact(hdv * keys) {
        data.extend(crate::interp::kernels::transpose(b, hdv, keys));
    }
    let finite = v
        .par_chunks(1 << 14)
        .all(|c| c.iter().all(|x| x.is_finite()));
    Some(TransposedV { data, finite })
}

/// Whether [`attention_chain_seen`] computes each query row the same way
/// wherever it stands among the queries, so that a chain over a subset of
/// the rows gives those rows' bits of the whole chain: with the vector
/// stages and product of `vt` (each row its own sums; AVX-512, or AVX2 with
/// FMA), not with gemm's product, which takes a tile's rows as its columns
/// and sums its last columns otherwise.
pub fn rows_independent(vt: Option<&TransposedV>, hdv: usize) -> bool {
    vt.is_some() && Simd::here().any() && pv_fits(hdv)
}

/// What runs the attention chains' stages and product with V here, for
/// `exec` to print: the vector path ([`Simd::here`]) or the portable one.
pub fn attention_path() -> &'static str {
    match Simd::here() {
        Simd::Avx512 => "AVX-512 (dead keys skipped, rows alike)",
        Simd::Avx2 => "AVX2 (dead keys skipped, rows alike)",
        Simd::None => "portable stages, gemm's product",
    }
}

/// Whether this CPU computes attention rows alike wherever they stand, for
/// a value width of 16 (see [`rows_independent`]).
pub fn rows_independent_here() -> bool {
    Simd::here().any() && pv_fits(16)
}

/// Values of one stage that were (non-finite, finite beyond fp16's range).
pub type Counts = (usize, usize);

/// The numeric mode of [`attention_chain_seen`].
#[derive(Clone, Copy, Debug)]
pub struct Mode {
    /// Round each stage to fp16 as the op-by-op path rounds it.
    pub fp16: bool,
    /// Also each stage's ane rule (`AneRule`): the scores' matmul ceiling
    /// and flush, NaN to +0 in every stage, as the op-by-op path applies
    /// them (the portable and AVX2 stages alike).
    pub ane: bool,
}

/// [`attention_chain_seen`] in fp16 (or f32) mode, without the peaks.
#[cfg(test)]
pub fn attention_chain(
    ch: &Chain,
    fp16: bool,
    check: bool,
    shortcuts: bool,
    tally: &Tally,
) -> (Vec<f32>, [Counts; 4]) {
    let mode = Mode { fp16, ane: false };
    let (ctx, counts, _) = attention_chain_seen(ch, mode, check, shortcuts, tally);
    (ctx, counts)
}

/// Run an attention chain in tiles of query rows. Every op of the chain is
/// row-wise over the queries, so a tile's score block never leaves the
/// cache and the result is the op-by-op result; with `fp16`, each stage's
/// values are rounded as the op-by-op path rounds them (and with `check`,
/// counted first). Returns `ctx [batch, hdv, queries]` (not rounded: the
/// caller rounds op outputs), the counts of the four inner stages and, with
/// `fp16`, their largest `|x|` (a dead key's scores, skipped, are bounded
/// within fp16's range but not in the peaks).
///
/// A tile whose rows' mask leaves keys dead ([`DeadKeys`]) computes only the
/// span of keys its rows can attend to, with the same bits; equal batches
/// are computed once. Both only with `shortcuts` (off: every score of every
/// tile of every batch is computed, for the tests that compare the two).
/// The scores computed, and all the chain has, are added to `tally`.
pub fn attention_chain_seen(
    ch: &Chain,
    mode: Mode,
    check: bool,
    shortcuts: bool,
    tally: &Tally,
) -> (Vec<f32>, [Counts; 4], [f32; 4]) {
    let Mode { fp16, ane } = mode;
    let (nq, nk, hd, hdv) = (ch.queries, ch.keys, ch.hd, ch.hdv);
    // What is kept of k: the caller's, shared with the chains that read
    // the same k, or this chain's own.
    let own = KeyFacts::default();
    let kfacts = ch.kfacts.unwrap_or(&own);
    // One tile of query rows per thread (at most 256 rows, at least 16): the
    // operands gemm packs (k without the vector stages, v without the vector
    // product) are packed once per tile (k for the exact kernel once per
    // head), and a row's stages run while it is in L1.
    let threads = rayon::current_num_threads().max(1);
    let simd = Simd::here();
    let vt = ch
        .vt
        .filter(|vt| vt.data.len() == ch.batch * nk * hdv && pv_fits(hdv));
    // Skipping needs the vector stages and product (whose sums it keeps)
    // and finite values (a zero probability then contributes nothing).
    let spans = match (ch.mask, vt) {
        (Some(m), Some(vt)) if shortcuts && simd.any() && vt.finite && m.len() % (nq * nk) == 0 => {
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
            kmax: kfacts
                .norms
                .get_or_init(|| key_norms(ch.k, (ch.batch, hd, nk)))
                .clone(),
        });
    // Batches (Qwen2.5-VL's windows) equal bit for bit to an earlier one
    // are computed once: a bucket's pad windows.
    let batches = if shortcuts {
        DistinctBatches::of(ch)
    } else {
        DistinctBatches::all(ch.batch)
    };
    tally.scores(0, (ch.batch - batches.reps.len()) * nq * nk);
    // Tiles of up to 256 rows, one per thread at least. Where keys are dead,
    // rows go by 16, so that the span of pad rows that attend to themselves
    // stays narrow; runs of rows that compute every key anyway go together
    // again. The vector product computes each row alike in any tile
    // (`query_rows_are_computed_alike_wherever_they_stand`).
    let big = nq.div_ceil(threads).clamp(16, 256).min(nq.max(1));
    let mask_rows = |b: usize| {
        ch.mask
            .map_or(0, |m| if m.len() == nq * nk { 0 } else { b })
            * nq
    };
    let jobs: Vec<Job> = batches
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
    // The keys each tile computes: all (`None`), or the live span only.
    let spans_of: Vec<Span> = match &dead {
        Some(d) => jobs
            .par_iter()
            .map(|&(b, i0, t)| {
                let q = &ch.q[b * hd * nq..];
                d.tile_span(
                    (b, mask_rows(b) + i0, t),
                    (q, nq, i0),
                    ch.scale,
                    (fp16, ane),
                )
            })
            .collect(),
        None => vec![None; jobs.len()],
    };
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
                let span = spans_of[job];
                let (lo, hi) = span.unwrap_or((0, nk));
                let w = hi - lo;
                tally.scores(t * w, t * nk);
                let s = &mut s[..t * w];
                let keys = if exact_scores() {
                    Keys::Packed(kfacts.packed(ch.k, (ch.batch, hd, nk), b), lo)
                } else {
                    // SAFETY: k [hd, nk] columns lo..hi of this batch.
                    Keys::Columns(unsafe { k.as_ptr().add(lo) }, nk)
                };
                // SAFETY: columns lo..hi of k, packed or not.
                unsafe { scores(s, (t, w, hd), (q, nq, i0), keys) };
                let mut c = [(0, 0); 4];
                let mut pk = [0f32; 4];
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
                    let round = fp16.then_some(check);
                    inner_stages(row, m, ch.scale, round, ane, &mut c, &mut pk, simd);
                }
                // The vector product where `vt` was made (x86-64 with AVX-512F,
                // or AVX2 and FMA), gemm elsewhere; a span is taken only with `vt`.
                let done = match vt {
                    #[cfg(target_arch = "x86_64")]
                    Some(vt) => {
                        // SAFETY: `vt` was made only where `pv_fits(hdv)`, and
                        // a span only where it is finite; vt rows lo..hi of
                        // batch b; ctx[b] is [hdv, nq] and this task alone
                        // writes its columns i0..i0+t.
                        unsafe {
                            pv(
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
                (c.map(|(n, sat)| (n * m, sat * m)), pk)
            })
        })
        .reduce(
            || ([(0, 0); 4], [0f32; 4]),
            |(mut a, mut pa), (b, pb)| {
                for (a, b) in a.iter_mut().zip(b) {
                    a.0 += b.0;
                    a.1 += b.1;
                }
                for (a, b) in pa.iter_mut().zip(pb) {
                    *a = a.max(b);
                }
                (a, pa)
            },
        );
    let (counts, mut peaks) = counts;
    // The skipped keys' scores, for the peaks alone (fp16 and ane modes: a
    // peak is every score's), by groups of tiles that skipped the same keys.
    if let (true, Some(d)) = (fp16, &dead) {
        let (dead_peaks, computed) =
            skipped_peaks(ch, kfacts, d, (&jobs, &spans_of), mask_rows, ane);
        for (p, d) in peaks.iter_mut().zip(dead_peaks) {
            *p = p.max(d);
        }
        // Computed, though neither normalised nor multiplied by v.
        tally.scores(computed, 0);
    }
    let size = hdv * nq;
    for (b, &r) in batches.of.iter().enumerate() {
        if r != b {
            ctx.copy_within(r * size..(r + 1) * size, b * size);
        }
    }
    (ctx, counts, peaks)
}

/// The peaks of the first three stages over the keys the tiles skipped
/// ([`DeadKeys::dead_peaks`]), and how many scores that took: the tiles
/// that skipped the same keys in a batch, in runs of consecutive rows up to
/// [`SKIPPED_ROWS`], multiply their rows by the distinct skipped keys
/// (`packed::input_classes` of k's columns: equal keys, equal scores) in blocks of
/// [`SKIPPED_KEYS`] (a score's bits are the whole row's: each is the same
/// dot product wherever it stands, as the live spans' are), keeping each
/// row's smallest and largest.
fn skipped_peaks(
    ch: &Chain,
    kfacts: &KeyFacts,
    d: &DeadKeys,
    (jobs, spans_of): (&[Job], &[Span]),
    mask_rows: impl Fn(usize) -> usize + Sync,
    ane: bool,
) -> ([f32; 4], usize) {
    let (nq, nk, hd) = (ch.queries, ch.keys, ch.hd);
    // Runs (batch, first row, rows, span) of tiles with one span.
    let mut runs: Vec<(usize, usize, usize, (usize, usize))> = Vec::new();
    for (&(b, i0, t), span) in jobs.iter().zip(spans_of) {
        let Some(span) = *span else { continue };
        match runs.last_mut() {
            Some(r) if r.0 == b && r.1 + r.2 == i0 && r.3 == span && r.2 + t <= SKIPPED_ROWS => {
                r.2 += t
            }
            _ => runs.push((b, i0, t, span)),
        }
    }
    // Per batch with skipped keys, its keys' classes: equal keys give equal
    // scores, so each distinct skipped key is multiplied once (a bucket's
    // pad keys repeat).
    let of = |b: usize| input_classes(&[&ch.k[b * hd * nk..(b + 1) * hd * nk]], nk);
    let classes = kfacts
        .classes
        .get_or_init(|| (0..ch.batch).into_par_iter().map(of).collect());
    runs.par_iter()
        .map(|&(b, i0, t, (lo, hi))| {
            DEAD.with_borrow_mut(|dd| {
                let q = &ch.q[b * hd * nq..];
                let k = &ch.k[b * hd * nk..];
                // The distinct skipped keys, side by side: kd [hd, n].
                let class = |j: usize| classes[b].as_ref().map_or(j, |c| c[j] as usize);
                let mut seen = vec![false; nk];
                let keys: Vec<usize> = (0..lo)
                    .chain(hi..nk)
                    .filter(|&j| !std::mem::replace(&mut seen[class(j)], true))
                    .collect();
                let n = keys.len();
                let mut kd = vec![0f32; hd * n];
                for (row, src) in kd.chunks_exact_mut(n.max(1)).zip(k.chunks_exact(nk)) {
                    row.iter_mut().zip(&keys).for_each(|(x, &j)| *x = src[j]);
                }
                let mut ext = vec![(f32::INFINITY, f32::NEG_INFINITY); t];
                if dd.len() < t * SKIPPED_KEYS {
                    dd.resize(t * SKIPPED_KEYS, 0f32);
                }
                // SAFETY: kd holds hd rows of n.
                let kp = exact_scores().then(|| unsafe { PackedB::new((kd.as_ptr(), n), (hd, n)) });
                for k0 in (0..n).step_by(SKIPPED_KEYS) {
                    let m = SKIPPED_KEYS.min(n - k0);
                    let dd = &mut dd[..t * m];
                    let keys = match &kp {
                        Some(kp) => Keys::Packed(kp, k0),
                        // SAFETY: kd [hd, n] columns k0..k0+m.
                        None => Keys::Columns(unsafe { kd.as_ptr().add(k0) }, n),
                    };
                    // SAFETY: columns k0..k0 + m of kd, packed or not.
                    unsafe { scores(dd, (t, m, hd), (q, nq, i0), keys) };
                    for (e, row) in ext.iter_mut().zip(dd.chunks_exact(m)) {
                        *e = row.iter().fold(*e, |(a, b), &x| (a.min(x), b.max(x)));
                    }
                }
                let mut pk = [0f32; 4];
                d.dead_peaks(mask_rows(b) + i0, &ext, ch.scale, ane, &mut pk);
                (pk, t * n)
            })
        })
        .reduce(
            || ([0f32; 4], 0),
            |(mut a, n), (b, m)| {
                for (a, b) in a.iter_mut().zip(b) {
                    *a = a.max(b);
                }
                (a, n + m)
            },
        )
}

/// The keys a tile's scores multiply its queries by, from the first of
/// them: packed for the exact kernel (`PackedB`, from column `lo`), or the
/// columns of a row-major `k` from a pointer, its rows `stride` apart
/// (gemm's product, where [`exact_scores`] is false). The two give the same
/// bits (each score one fused multiply-add chain over `hd` in order, from
/// 0, for `hd` up to the exact kernel's block of 256: checked by
/// `scores_by_the_exact_kernel_have_gemms_bits`); the exact kernel's are
/// each score's wherever its row and column stand, and its `k` is packed
/// once per head instead of once per tile.
enum Keys<'a> {
    Packed(&'a PackedB, usize),
    Columns(*const f32, usize),
}

/// `dst [t, n] = q^T [t, hd] · k [hd, n]`: a tile's scores, its query rows
/// the columns `i0..i0 + t` of `q [hd, nq]`, its keys `n` columns of
/// `keys`.
///
/// # Safety
/// `dst` holds `t * n` values, `q` the tile's columns; the `n` columns of
/// `keys` lie inside its buffer (or its packing), `hd` rows each.
unsafe fn scores(
    dst: &mut [f32],
    (t, n, hd): (usize, usize, usize),
    (q, nq, i0): (&[f32], usize, usize),
    keys: Keys,
) {
    debug_assert!(dst.len() >= t * n && (hd == 0 || q.len() >= (hd - 1) * nq + i0 + t));
    match keys {
        // SAFETY: as the caller promises; `exact_scores` made the packing.
        Keys::Packed(kp, lo) => unsafe {
            exact::sgemm_packed_serial(
                t,
                (q.as_ptr().add(i0), nq),
                kp,
                (lo, lo + n),
                (dst.as_mut_ptr(), n),
            )
        },
        // SAFETY: as the caller promises.
        Keys::Columns(k, k_stride) => unsafe {
            matmul(
                (t, n, hd),
                (dst.as_mut_ptr(), 1, n as isize),
                false,
                (q.as_ptr().add(i0), nq as isize, 1),
                (k, 1, k_stride as isize),
                Parallelism::None,
            );
        },
    }
}

/// A tile of a chain: (batch, first query row, rows).
type Job = (usize, usize, usize);
/// The keys a tile computes, `lo..hi` (`None`: every key).
type Span = Option<(usize, usize)>;

/// Query rows per run of [`skipped_peaks`] at most.
const SKIPPED_ROWS: usize = 256;
/// Keys per block of [`skipped_peaks`] (256 rows of 512 scores: 512 KB).
const SKIPPED_KEYS: usize = 512;

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

#[cfg(test)]
mod tests {
    use super::*;

    use crate::interp::fast::testing::{lcg, padded_mask};
    use crate::interp::kernels::softmax_in_place;

    /// A tile's scores on the exact kernel, its keys packed once, have
    /// gemm's bits, for any tile of queries and any span of keys (spans
    /// that start and end inside the packed panels of 16): head widths of
    /// 1 to 256, scores of both signs and a score past fp16's range.
    #[test]
    fn scores_by_the_exact_kernel_have_gemms_bits() {
        if !exact::available() {
            eprintln!("no AVX2 and FMA: no exact kernel to check");
            return;
        }
        let (nq, nk) = (29, 75);
        for hd in [1, 7, 16, 64, 72, 128, 256] {
            let q = lcg(hd * nq, 31);
            let mut k = lcg(hd * nk, 32);
            k[3] = 3e4;
            // SAFETY: k holds hd rows of nk.
            let kp = unsafe { PackedB::new((k.as_ptr(), nk), (hd, nk)) };
            for (i0, t) in [(0, 29), (5, 6), (11, 13), (28, 1)] {
                for (lo, hi) in [(0, nk), (3, 70), (16, 48), (17, 18), (74, 75)] {
                    let n = hi - lo;
                    let (mut a, mut b) = (vec![0f32; t * n], vec![0f32; t * n]);
                    // SAFETY: k's columns lo..hi, q's columns i0..i0 + t.
                    unsafe {
                        scores(&mut a, (t, n, hd), (&q, nq, i0), Keys::Packed(&kp, lo));
                        scores(
                            &mut b,
                            (t, n, hd),
                            (&q, nq, i0),
                            Keys::Columns(k.as_ptr().add(lo), nk),
                        );
                    }
                    let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
                    assert_eq!(
                        bits(&a),
                        bits(&b),
                        "hd {hd}, rows {i0}+{t}, keys {lo}..{hi}"
                    );
                    let want: f64 = (0..hd)
                        .map(|p| q[p * nq + i0] as f64 * k[p * nk + lo] as f64)
                        .sum();
                    assert!(
                        (a[0] as f64 - want).abs() <= 1e-4 * want.abs().max(1.0),
                        "hd {hd}"
                    );
                }
            }
        }
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
                kfacts: None,
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
                    let (on, c_on) = attention_chain(&ch, fp16, true, true, &Tally::default());
                    let (off, c_off) = attention_chain(&ch, fp16, true, false, &Tally::default());
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

    /// With the vector product (`vt`), a query row's context is a function
    /// of its own row of q and of the mask, wherever the row stands: the
    /// chain run on a subset of the rows (q's columns and the mask's rows
    /// gathered) gives those rows' bits of the whole chain, for every count
    /// of 1 to 40 rows and larger subsets, with and without dead keys, fp32
    /// and fp16. The interpreter's packed columns rely on it
    /// ([`rows_independent`]). (The gemm product, which takes a tile's rows
    /// as its columns, does not: its last columns' sums differ.)
    #[test]
    fn query_rows_are_computed_alike_wherever_they_stand() {
        if !Simd::here().any() {
            eprintln!(
                "no AVX2 nor AVX-512: the chain's product is gemm's, rows are not independent"
            );
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
                        kfacts: None,
                        spans: None,
                        scale: 0.125,
                        batch,
                        hd,
                        hdv,
                        queries: n,
                        keys: n,
                    };
                    let (whole, _) = attention_chain(&ch, fp16, true, true, &Tally::default());
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
                        let (part, _) = attention_chain(&sub, fp16, true, true, &Tally::default());
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
        // hdv 136 takes gemm; the others the vector product (where the
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
                    crate::interp::round_to_f16(x)
                } else {
                    x
                }
            };
            let vt = values_transposed(&v, batch, hdv, nk);
            assert_eq!(vt.is_some(), hdv <= 128 && Simd::here().any());
            let ch = Chain {
                q: &q,
                k: &k,
                v: &v,
                mask: Some(&mask),
                vt: vt.as_ref(),
                kfacts: None,
                spans: None,
                scale: 0.3,
                batch,
                hd,
                hdv,
                queries: nq,
                keys: nk,
            };
            let (ctx, counts) = attention_chain(&ch, fp16, true, true, &Tally::default());
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
