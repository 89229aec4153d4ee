//! A matrix product whose output columns are computed alike wherever they
//! stand: every `c[i][j]` is the same sum in the same order whatever `j`
//! is and however many columns the product has, bit for bit. The
//! interpreter's 1x1 convolutions run on it where OpenBLAS's kernels are
//! not so (its Haswell and Zen kernels, the ones AVX2 CPUs get:
//! `columns_independent`), so that its exact shortcuts (a bucket's pad
//! columns computed once) hold on those CPUs too.
//!
//! The blocking is the usual one of a packed GEMM (Goto and van de Geijn,
//! "Anatomy of high-performance matrix multiplication", ACM TOMS 34(3),
//! 2008; BLIS's loops): `b` packed in panels of [`NR`] columns and
//! [`KC`] rows, `a` in panels of [`MR`] rows, an `MR x NR` tile of `c`
//! computed in registers. What makes the columns alike: a tile always
//! computes [`NR`] columns and [`MR`] rows (the packed panels are padded
//! with zeros, and the lanes past the edge are computed and not stored);
//! each element's sum runs over `k` in order, one fused multiply-add at a
//! time, from zero within each block of [`KC`] rows of `b` (fixed, not
//! chosen by the shape), and each block's sum is added to `c` in block
//! order. Nothing depends on `n`, on the column's place or on the split of
//! the rows over threads. (A fused multiply-add rounds once, whatever the
//! vector width: a kernel of another width with the same order would give
//! the same bits.)
//!
//! [`PackedB`] keeps `b` packed for the products that share it (an
//! attention head's keys, multiplied by each tile of its queries), and
//! [`sgemm_packed_serial`] multiplies by it on the calling thread, each
//! panel of `a`'s rows passing over a block of `b`'s panels: the same sums
//! in the same order, so the same bits, for any of `b`'s columns.

use rayon::prelude::*;

use super::Rows;

/// Rows of a tile (of `a`'s panels).
pub const MR: usize = 6;
/// Columns of a tile (of `b`'s panels): two AVX2 vectors.
pub const NR: usize = 16;
/// Rows of `b` (columns of `a`) per block: a `KC x NR` panel of `b` (16
/// KB) stays in L1 while the tile walks `a`'s panels.
pub const KC: usize = 256;
/// Rows of `a` per task at most (20 panels; 120 KB packed, in L2); fewer
/// where that evens the tasks out over the threads ([`rows_per_task`]).
const MC: usize = 120;

/// Rows of `a` per task: at most [`MC`], a multiple of [`MR`], and as
/// many tasks as a multiple of the threads where there are enough rows (a
/// 1024-row product in 9 tasks of 120 keeps one of 2 threads idle for the
/// last; in 10 of 108 it does not). Only which rows a task computes
/// changes, not any sum.
fn rows_per_task(m: usize, threads: usize) -> usize {
    let threads = threads.max(1);
    let tasks = m.div_ceil(MC).div_ceil(threads) * threads;
    m.div_ceil(tasks).div_ceil(MR).max(1) * MR
}
/// Columns of `b` per block (4 MB packed).
const NC: usize = 4096;

/// The left operand: f32 rows with a row stride, or fp16 rows, contiguous
/// (widened as they are packed; widening is exact).
#[derive(Clone, Copy)]
pub enum Left<'a> {
    F32(*const f32, usize),
    F16(&'a [half::f16]),
}

// SAFETY: only read, under the caller's contract of `sgemm`.
unsafe impl Send for Left<'_> {}
unsafe impl Sync for Left<'_> {}

/// Whether this CPU has the kernel's instructions (AVX2 and FMA).
pub fn available() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("fma")
    }
    #[cfg(not(target_arch = "x86_64"))]
    false
}

#[derive(Clone, Copy)]
struct Out(*mut f32);
// SAFETY: each task writes its own rows of `c`.
unsafe impl Send for Out {}
unsafe impl Sync for Out {}
impl Out {
    fn get(&self) -> *mut f32 {
        self.0
    }
}
#[derive(Clone, Copy)]
struct In(*const f32);
// SAFETY: only read.
unsafe impl Send for In {}
unsafe impl Sync for In {}
impl In {
    fn get(&self) -> *const f32 {
        self.0
    }
}

/// `c = (accumulate ? c : 0) + a · b` for `a [m, k]`, `b [k, n]` and
/// `c [m, n]`, row-major with the given row strides, over rayon's threads.
///
/// # Safety
/// As [`super::sgemm`]; `F16` holds `m * k` values; [`available`] is true.
pub unsafe fn sgemm(
    (m, n, k): (usize, usize, usize),
    a: Left,
    b: Rows,
    c: (*mut f32, usize),
    accumulate: bool,
) {
    if m == 0 || n == 0 {
        return;
    }
    if k == 0 {
        if !accumulate {
            for i in 0..m {
                // SAFETY: row i of c lies in its buffer (the caller's contract).
                unsafe { std::ptr::write_bytes(c.0.add(i * c.1), 0, n) };
            }
        }
        return;
    }
    let (bp, cp) = (In(b.0), Out(c.0));
    let mut bpack = vec![0f32; NC.min(n).div_ceil(NR) * NR * KC.min(k)];
    for jc in (0..n).step_by(NC) {
        let nc = NC.min(n - jc);
        for pc in (0..k).step_by(KC) {
            let kc = KC.min(k - pc);
            // b's rows pc.., columns jc.., in panels of NR columns; each
            // task packs a run of panels row by row, reading b's rows in
            // order.
            let panels = nc.div_ceil(NR);
            let per_task = panels
                .div_ceil(rayon::current_num_threads().max(1) * 4)
                .max(1);
            bpack[..panels * NR * kc]
                .par_chunks_mut(per_task * NR * kc)
                .enumerate()
                .for_each(|(t, run)| {
                    let jp0 = t * per_task;
                    let count = run.len() / (NR * kc);
                    for p in 0..kc {
                        let j0 = jc + jp0 * NR;
                        let w = (count * NR).min(n - j0);
                        // SAFETY: row pc + p of b, columns j0..j0 + w, lie in b.
                        let src = unsafe {
                            std::slice::from_raw_parts(bp.get().add((pc + p) * b.1 + j0), w)
                        };
                        pack_b_row(src, p, kc, run);
                    }
                });
            let bpack = &bpack;
            let first = pc == 0 && !accumulate;
            let mc_max = rows_per_task(m, rayon::current_num_threads());
            (0..m.div_ceil(mc_max)).into_par_iter().for_each(|ib| {
                let i0 = ib * mc_max;
                let mc = mc_max.min(m - i0);
                APACK.with_borrow_mut(|apack| {
                    apack.resize(MC.div_ceil(MR) * MR * KC, 0.0);
                    // SAFETY: rows i0.., columns pc.. of a lie in a.
                    unsafe { pack_a(Packable::Left(a, k), (i0, mc), (pc, kc), apack) };
                    for jp in 0..nc.div_ceil(NR) {
                        let j0 = jc + jp * NR;
                        let bpanel = &bpack[jp * NR * kc..(jp + 1) * NR * kc];
                        for ip in 0..mc.div_ceil(MR) {
                            let r0 = i0 + ip * MR;
                            let apanel = &apack[ip * MR * kc..(ip + 1) * MR * kc];
                            // SAFETY: the tile's rows r0.. and columns j0..
                            // that lie inside c are this task's own.
                            unsafe {
                                tile(
                                    kc,
                                    apanel,
                                    bpanel,
                                    (cp.get().add(r0 * c.1 + j0), c.1),
                                    (MR.min(m - r0), 0, NR.min(n - j0)),
                                    first,
                                )
                            };
                        }
                    }
                });
            });
        }
    }
}

/// `b [k, n]` packed once for the products that share it (an attention
/// head's keys, multiplied by each tile of its queries): panels of [`NR`]
/// columns in blocks of [`KC`] rows, as [`sgemm`] packs them per call.
pub struct PackedB {
    data: Vec<f32>,
    k: usize,
    n: usize,
}

impl PackedB {
    /// # Safety
    /// `b` holds `k` rows of `n` values, its rows `b.1` apart.
    pub unsafe fn new(b: Rows, (k, n): (usize, usize)) -> PackedB {
        let panels = n.div_ceil(NR);
        let mut data = vec![0f32; panels * NR * k];
        for pc in (0..k).step_by(KC) {
            let kc = KC.min(k - pc);
            let block = &mut data[pc * panels * NR..(pc + kc) * panels * NR];
            for p in 0..kc {
                // SAFETY: row pc + p of b holds n values (the caller's contract).
                let src = unsafe { std::slice::from_raw_parts(b.0.add((pc + p) * b.1), n) };
                pack_b_row(src, p, kc, block);
            }
        }
        PackedB { data, k, n }
    }

    /// The packed panel `jp` of the block of rows from `pc` (`kc` rows).
    fn panel(&self, pc: usize, kc: usize, jp: usize) -> &[f32] {
        let block = &self.data[pc * self.n.div_ceil(NR) * NR..];
        &block[jp * NR * kc..(jp + 1) * NR * kc]
    }
}

/// Row `p` of a block of `kc` rows of `b` (`src`: its values over the
/// block's panels) into those panels of [`NR`] columns (`panels[q * NR * kc
/// + p * NR..]`), the last panel's lanes past `src` set to zero.
fn pack_b_row(src: &[f32], p: usize, kc: usize, panels: &mut [f32]) {
    for (q, panel) in panels.chunks_exact_mut(NR * kc).enumerate() {
        let dst = &mut panel[p * NR..(p + 1) * NR];
        let (lo, hi) = ((q * NR).min(src.len()), ((q + 1) * NR).min(src.len()));
        dst[..hi - lo].copy_from_slice(&src[lo..hi]);
        dst[hi - lo..].fill(0.0);
    }
}

/// Values of packed `b` that [`sgemm_packed_serial`] takes at a time.
const B_BLOCK: usize = 1 << 16;

/// `c = a · b[:, lo..hi]` for `a [m, k]` given by its columns (`a[i][p] =
/// a.0[p * a.1 + i]`), `b` packed ([`PackedB`], `k` rows) and `c [m, hi -
/// lo]` row-major with row stride `c.1`, on the calling thread alone: every
/// `c[i][j]` the sum [`sgemm`] computes, in the same order (bit for bit),
/// whatever the columns taken.
///
/// # Safety
/// `a` addresses `k` rows of `m` values with its stride, `c` `m` rows of
/// `hi - lo`; `lo <= hi <= ` b's columns; [`available`] is true.
pub unsafe fn sgemm_packed_serial(
    m: usize,
    a: (*const f32, usize),
    b: &PackedB,
    (lo, hi): (usize, usize),
    c: (*mut f32, usize),
) {
    let (n, k) = (hi - lo, b.k);
    debug_assert!(lo <= hi && hi <= b.n);
    if m == 0 || n == 0 {
        return;
    }
    if k == 0 {
        for i in 0..m {
            // SAFETY: row i of c lies in its buffer (the caller's contract).
            unsafe { std::ptr::write_bytes(c.0.add(i * c.1), 0, n) };
        }
        return;
    }
    APACK.with_borrow_mut(|apack| {
        for pc in (0..k).step_by(KC) {
            let kc = KC.min(k - pc);
            for i0 in (0..m).step_by(MC) {
                let mc = MC.min(m - i0);
                apack.resize(MC.div_ceil(MR) * MR * KC, 0.0);
                // SAFETY: rows pc..pc + kc of the row-major matrix hold
                // columns i0..i0 + mc (the caller's contract).
                unsafe { pack_a(Packable::Columns(a.0, a.1), (i0, mc), (pc, kc), apack) };
                // Each panel of a's rows passes over a block of b's panels
                // (256 KB, in L2), so that c's rows are written along
                // their length (the other order, a block of a's rows under
                // each panel of b, wrote 120 rows of c at once, a row of
                // scores apart: slower with two threads, BENCHMARKS.md).
                let panels = lo / NR..hi.div_ceil(NR);
                let jb = (B_BLOCK / (kc * NR)).max(1);
                for jp0 in panels.clone().step_by(jb) {
                    for ip in 0..mc.div_ceil(MR) {
                        let r0 = i0 + ip * MR;
                        let apanel = &apack[ip * MR * kc..(ip + 1) * MR * kc];
                        for jp in jp0..(jp0 + jb).min(panels.end) {
                            // The panel's columns inside lo..hi, and where they go in c.
                            let (from, to) = ((jp * NR).max(lo), ((jp + 1) * NR).min(hi));
                            let bpanel = b.panel(pc, kc, jp);
                            // SAFETY: the tile's rows, and its columns from - lo..to - lo, inside c.
                            unsafe {
                                tile(
                                    kc,
                                    apanel,
                                    bpanel,
                                    (c.0.add(r0 * c.1 + from - lo), c.1),
                                    (MR.min(m - r0), from - jp * NR, to - from),
                                    pc == 0,
                                )
                            };
                        }
                    }
                }
            }
        }
    });
}

std::thread_local! {
    /// Each thread's packed block of `a`.
    static APACK: std::cell::RefCell<Vec<f32>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// A left operand as [`pack_a`] reads it: a [`Left`] of `k` columns, or
/// `a[i][p] = ptr[p * ld + i]` (its rows are the columns of a row-major
/// matrix: an attention tile's queries, `q [hd, nq]`'s columns).
#[derive(Clone, Copy)]
enum Packable<'a> {
    Left(Left<'a>, usize),
    Columns(*const f32, usize),
}

/// Rows `i0..i0 + mc`, columns `p0..p0 + kc` of `a` into panels of [`MR`]
/// rows (`panel[p * MR + i]`), the last padded with zero rows.
///
/// # Safety
/// Those rows and columns lie inside `a`.
unsafe fn pack_a(a: Packable, (i0, mc): (usize, usize), (p0, kc): (usize, usize), out: &mut [f32]) {
    if let Packable::Columns(ptr, ld) = a {
        for ip in 0..mc.div_ceil(MR) {
            let panel = &mut out[ip * MR * kc..(ip + 1) * MR * kc];
            let rows = MR.min(mc - ip * MR);
            for p in 0..kc {
                let dst = &mut panel[p * MR..(p + 1) * MR];
                // SAFETY: row p0 + p of the row-major matrix, its values
                // i0 + ip * MR.. (`rows` of them), lie inside it.
                let src = unsafe {
                    std::slice::from_raw_parts(ptr.add((p0 + p) * ld + i0 + ip * MR), rows)
                };
                dst[..rows].copy_from_slice(src);
                dst[rows..].fill(0.0);
            }
        }
        return;
    }
    let Packable::Left(a, k) = a else {
        unreachable!("columns returned above")
    };
    assert!(kc <= KC, "a block of at most KC columns");
    const _: () = assert!(
        cfg!(target_endian = "little"),
        "fp16 values read as little-endian bytes"
    );
    // Each panel's rows into `rows` (widened from fp16 with F16C where the
    // CPU has it), then interleaved: one pass of contiguous reads per row,
    // and the panel written in order.
    let mut rows = [[0f32; KC]; MR];
    for ip in 0..mc.div_ceil(MR) {
        let panel = &mut out[ip * MR * kc..(ip + 1) * MR * kc];
        let live = MR.min(mc - ip * MR);
        for (i, row) in rows.iter_mut().enumerate() {
            let row = &mut row[..kc];
            if i >= live {
                row.fill(0.0);
                continue;
            }
            let r = i0 + ip * MR + i;
            match a {
                // SAFETY: row r, columns p0..p0 + kc, lie inside a.
                Left::F32(ptr, lda) => row.copy_from_slice(unsafe {
                    std::slice::from_raw_parts(ptr.add(r * lda + p0), kc)
                }),
                Left::F16(h) => {
                    let h = &h[r * k + p0..r * k + p0 + kc];
                    // SAFETY: kc fp16 values are 2 * kc bytes; on the
                    // little-endian targets the crate builds for, their
                    // little-endian bytes (checked at compile time above).
                    let b = unsafe { std::slice::from_raw_parts(h.as_ptr().cast::<u8>(), 2 * kc) };
                    super::widen_f16(row, b)
                }
            }
        }
        // (`take(KC)`: the compiler then sees every `p` inside `rows`.)
        for (p, dst) in panel.chunks_exact_mut(MR).take(KC).enumerate() {
            for i in 0..MR {
                dst[i] = rows[i][p];
            }
        }
    }
}

/// One `MR x NR` tile: `c = (first ? 0 : c) + a_panel · b_panel`, the
/// `rows` rows of its lanes `skip..skip + cols` stored (`c` addresses the
/// first of them).
///
/// # Safety
/// `c` addresses `rows` rows of `cols` values with its row stride;
/// `skip + cols <= NR`; the panels hold `kc` steps; AVX2 and FMA are
/// present.
unsafe fn tile(
    kc: usize,
    a: &[f32],
    b: &[f32],
    c: (*mut f32, usize),
    (rows, skip, cols): (usize, usize, usize),
    first: bool,
) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: forwarded from the caller.
    unsafe {
        x86::tile(kc, a, b, c, (rows, skip, cols), first)
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = (kc, a, b, c, rows, skip, cols, first);
        unreachable!("the exact product runs only where `available`")
    }
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use std::arch::x86_64::*;

    use super::{MR, NR};

    #[target_feature(enable = "avx2,fma")]
    pub(super) unsafe fn tile(
        kc: usize,
        a: &[f32],
        b: &[f32],
        c: (*mut f32, usize),
        (rows, skip, cols): (usize, usize, usize),
        first: bool,
    ) {
        debug_assert!(a.len() >= kc * MR && b.len() >= kc * NR && skip + cols <= NR);
        // The tile's rows of c, asked for now so that they have arrived
        // when the sums are added to them (c's rows lie a whole row of c
        // apart: each is its own miss, which the sums' loop hides).
        if !first {
            for i in 0..rows {
                // A prefetch reads nothing and cannot fault; the row lies in c.
                let at = c.0.wrapping_add(i * c.1) as *const i8;
                _mm_prefetch::<_MM_HINT_T0>(at);
                _mm_prefetch::<_MM_HINT_T0>(at.wrapping_add(60));
            }
        }
        let mut acc = [_mm256_setzero_ps(); 2 * MR];
        let (ap, bp) = (a.as_ptr(), b.as_ptr());
        // One step of k: each accumulator's next fused multiply-add.
        let step = |acc: &mut [__m256; 2 * MR], p: usize| {
            // SAFETY: p < kc; the panels hold kc steps.
            unsafe {
                let b0 = _mm256_loadu_ps(bp.add(p * NR));
                let b1 = _mm256_loadu_ps(bp.add(p * NR + 8));
                for i in 0..MR {
                    let ai = _mm256_broadcast_ss(&*ap.add(p * MR + i));
                    acc[2 * i] = _mm256_fmadd_ps(ai, b0, acc[2 * i]);
                    acc[2 * i + 1] = _mm256_fmadd_ps(ai, b1, acc[2 * i + 1]);
                }
            }
        };
        // Four steps a turn (the same steps in the same order).
        let whole = kc / 4 * 4;
        for p in (0..whole).step_by(4) {
            step(&mut acc, p);
            step(&mut acc, p + 1);
            step(&mut acc, p + 2);
            step(&mut acc, p + 3);
        }
        for p in whole..kc {
            step(&mut acc, p);
        }
        if rows == MR && skip == 0 && cols == NR {
            for i in 0..MR {
                // SAFETY: row i, columns 0..NR, lie inside c (a whole tile).
                unsafe {
                    let at = c.0.add(i * c.1);
                    let (mut lo, mut hi) = (acc[2 * i], acc[2 * i + 1]);
                    if !first {
                        lo = _mm256_add_ps(_mm256_loadu_ps(at), lo);
                        hi = _mm256_add_ps(_mm256_loadu_ps(at.add(8)), hi);
                    }
                    _mm256_storeu_ps(at, lo);
                    _mm256_storeu_ps(at.add(8), hi);
                }
            }
            return;
        }
        // An edge tile: the same sums, the lanes inside c stored one by one
        // (the same single rounding of c + sum as the vector add).
        let mut t = [0f32; MR * NR];
        for i in 0..MR {
            // SAFETY: t holds MR rows of NR.
            unsafe {
                _mm256_storeu_ps(t.as_mut_ptr().add(i * NR), acc[2 * i]);
                _mm256_storeu_ps(t.as_mut_ptr().add(i * NR + 8), acc[2 * i + 1]);
            }
        }
        for i in 0..rows {
            for j in 0..cols {
                // SAFETY: row i < rows, column j < cols lie inside c.
                unsafe {
                    let at = c.0.add(i * c.1 + j);
                    let v = t[i * NR + skip + j];
                    *at = if first { v } else { *at + v };
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::blas::tests::{matches_a_plain_product, val};

    /// Against a plain product in f64, at shapes with tails in every
    /// dimension and more than one block of `KC`, accumulating and not,
    /// with row strides wider than the columns, f32 and fp16 `a`.
    #[test]
    fn matches_a_plain_product_f32_and_fp16() {
        if !available() {
            eprintln!("no AVX2 and FMA: not checked");
            return;
        }
        let shapes = [
            (1, 1, 1, false),
            (7, 5, 3, true),
            (13, 33, 257, false),
            (121, 90, 600, true),
            (6, 16, 256, false),
            (250, 17, 70, false),
        ];
        matches_a_plain_product("exact, f32", &shapes, false, &|d, a, b, c, acc, _| {
            // SAFETY: the checker's buffers hold their rows of their strides.
            unsafe { sgemm(d, Left::F32(a.0, a.1), b, c, acc) }
        });
        matches_a_plain_product(
            "exact, fp16",
            &shapes,
            true,
            &|(m, n, k), a, b, c, acc, _| {
                // a's values are fp16's: as contiguous fp16 rows, exactly.
                let a16: Vec<half::f16> = (0..m * k)
                    // SAFETY: row i of a holds k values from a.0 + i * a.1.
                    .map(|i| half::f16::from_f32(unsafe { *a.0.add((i / k) * a.1 + i % k) }))
                    .collect();
                // SAFETY: as above; a16 holds m rows of k.
                unsafe { sgemm((m, n, k), Left::F16(&a16), b, c, acc) }
            },
        );
    }

    /// `a [m, k] · b [k, n]` by [`sgemm`], contiguous.
    fn product((m, n, k): (usize, usize, usize), a: &[f32], b: &[f32]) -> Vec<f32> {
        assert!(a.len() == m * k && b.len() == k * n);
        let mut c = vec![0f32; m * n];
        // SAFETY: contiguous buffers of their shapes (checked).
        unsafe {
            sgemm(
                (m, n, k),
                Left::F32(a.as_ptr(), k),
                (b.as_ptr(), n),
                (c.as_mut_ptr(), n),
                false,
            )
        };
        c
    }

    /// The product on a packed `b` ([`sgemm_packed_serial`]), its left
    /// operand given by columns, has [`sgemm`]'s bits for any range of
    /// columns, over more than one block of [`KC`] rows.
    #[test]
    fn packed_b_has_the_products_bits() {
        if !available() {
            eprintln!("no AVX2 and FMA: not checked");
            return;
        }
        for (m, k, n) in [(1, 1, 1), (13, 64, 75), (37, 600, 50), (250, 33, 17)] {
            let a: Vec<f32> = (0..m * k).map(|i| val(i, 6)).collect();
            // a's columns, as a row-major [k, m].
            let at: Vec<f32> = (0..k * m).map(|i| a[(i % m) * k + i / m]).collect();
            let b: Vec<f32> = (0..k * n).map(|i| val(i, 7)).collect();
            let whole = product((m, n, k), &a, &b);
            // SAFETY: b holds k rows of n.
            let bp = unsafe { PackedB::new((b.as_ptr(), n), (k, n)) };
            for (lo, hi) in [(0, n), (n / 3, n), (1, n.div_ceil(2)), (n - 1, n)] {
                let w = hi - lo;
                let mut c = vec![f32::NAN; m * w];
                // SAFETY: at holds k rows of m; c m rows of w.
                unsafe {
                    sgemm_packed_serial(m, (at.as_ptr(), m), &bp, (lo, hi), (c.as_mut_ptr(), w))
                };
                for i in 0..m {
                    for j in 0..w {
                        assert_eq!(
                            c[i * w + j].to_bits(),
                            whole[i * n + lo + j].to_bits(),
                            "{m}x{k}x{n}, columns {lo}..{hi}: c[{i},{j}]"
                        );
                    }
                }
            }
        }
    }

    /// Any columns taken out of a product, in any order and any number,
    /// have the bits they have in it; and so do rows.
    #[test]
    fn columns_and_rows_have_their_bits_wherever_they_stand() {
        if !available() {
            eprintln!("no AVX2 and FMA: not checked");
            return;
        }
        let (m, k, n) = (37, 300, 4100);
        let a: Vec<f32> = (0..m * k).map(|i| val(i, 4)).collect();
        let b: Vec<f32> = (0..k * n).map(|i| val(i, 5)).collect();
        let whole = product((m, n, k), &a, &b);
        for u in [1, 3, 16, 17, 100, 4097] {
            let cols: Vec<usize> = (0..u).map(|j| (j * 37 + 11) % n).collect();
            let mut bu = vec![0f32; k * u];
            for (d, row) in bu.chunks_exact_mut(u).zip(b.chunks_exact(n)) {
                d.iter_mut().zip(&cols).for_each(|(d, &j)| *d = row[j]);
            }
            let rows = [5usize, 36, 0];
            let ar: Vec<f32> = rows
                .iter()
                .flat_map(|&r| a[r * k..(r + 1) * k].to_vec())
                .collect();
            let mut cu = vec![0f32; rows.len() * u];
            // SAFETY: as above.
            unsafe {
                sgemm(
                    (rows.len(), u, k),
                    Left::F32(ar.as_ptr(), k),
                    (bu.as_ptr(), u),
                    (cu.as_mut_ptr(), u),
                    false,
                )
            };
            for (ri, &r) in rows.iter().enumerate() {
                for (jj, &j) in cols.iter().enumerate() {
                    assert_eq!(
                        cu[ri * u + jj].to_bits(),
                        whole[r * n + j].to_bits(),
                        "{u} columns: c[{r},{j}]"
                    );
                }
            }
        }
    }
}
