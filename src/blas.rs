//! The large matrix products of a tower (its Linears: the reference's fused
//! Linear and the interpreter's 1x1 convolution), over all cores.
//!
//! On Linux they run the system's OpenBLAS (`libopenblas`, Debian's
//! `libopenblas-dev`), which reaches this kind of machine's fp32 matmul
//! rate: the `gemm` crate's AVX2 kernels measured about 0.75x its rate
//! (BENCHMARKS.md, "Matrix products"). OpenBLAS is held to one thread of its
//! own; the rows of the product are split over rayon's threads instead, so the
//! process keeps one thread pool and OpenBLAS's idle threads never compete
//! with rayon's. Elsewhere (macOS, where the tower runs on the Neural Engine)
//! the `gemm` crate does the work.
//!
//! Both sides of the cosine gate use this module, as they used the `gemm`
//! crate before it: ARCHITECTURE.md's table of shared code says how each side is
//! checked against code that is not this.

/// A row-major f32 matrix operand: pointer and row stride (elements between
/// the starts of two rows; columns are contiguous).
pub type Rows = (*const f32, usize);

/// `c = (accumulate ? c : 0) + a · b` for `a [m, k]`, `b [k, n]` and
/// `c [m, n]`, all row-major with unit column stride and the given row
/// strides, split by rows of `a` and `c` over rayon's threads.
///
/// # Safety
/// Each operand's rows must lie inside its buffer (`(rows - 1) * stride +
/// cols` elements from the pointer), row strides must be at least the
/// column counts, and `c` must not overlap `a` or `b`.
pub unsafe fn sgemm(
    (m, n, k): (usize, usize, usize),
    a: Rows,
    b: Rows,
    c: (*mut f32, usize),
    accumulate: bool,
) {
    // SAFETY: forwarded from the caller.
    unsafe { split_product((m, n, k), a, b, c, accumulate, false) }
}

/// [`sgemm`] split by columns of `b` and `c` over rayon's threads instead of
/// rows: each task's OpenBLAS call packs all of `a` and its own columns of
/// `b`, so this is the split for `m < n`, where a row split would have every
/// task pack all of the larger `b`. The reference's Linear over an image of
/// fewer tokens than output channels (an encoder's 257 to 1024 tokens against
/// MLPs of 4096) is such a product: split by rows, OpenBLAS's copy of the
/// weight took 8% of a CLIP-L-shaped forward.
///
/// # Safety
/// As [`sgemm`].
pub unsafe fn sgemm_by_columns(
    (m, n, k): (usize, usize, usize),
    a: Rows,
    b: Rows,
    c: (*mut f32, usize),
    accumulate: bool,
) {
    // SAFETY: forwarded from the caller.
    unsafe { split_product((m, n, k), a, b, c, accumulate, true) }
}

/// [`sgemm`] or [`sgemm_by_columns`].
///
/// # Safety
/// As [`sgemm`].
unsafe fn split_product(
    (m, n, k): (usize, usize, usize),
    a: Rows,
    b: Rows,
    c: (*mut f32, usize),
    accumulate: bool,
    by_columns: bool,
) {
    if m == 0 || n == 0 {
        return;
    }
    // SAFETY: forwarded from the caller.
    unsafe { imp::split_product((m, n, k), a, b, c, accumulate, by_columns) }
}

/// [`sgemm`] with `a [m, k]` stored as fp16, row-major and contiguous: each
/// task widens its own rows of `a` to f32 just before its product, into a
/// buffer its thread keeps, so an f32 copy of the whole of `a` never exists.
/// The interpreter holds a package's fp16 weights this way (half the memory
/// of f32 copies). Widening fp16 to f32 is exact, so `c` is what [`sgemm`]
/// gives on the widened `a`.
///
/// # Safety
/// As [`sgemm`] for `b` and `c`; `a` must hold `m * k` values.
pub unsafe fn sgemm_f16a(
    (m, n, k): (usize, usize, usize),
    a: &[half::f16],
    b: Rows,
    c: (*mut f32, usize),
    accumulate: bool,
) {
    if m == 0 || n == 0 {
        return;
    }
    assert!(
        a.len() >= m * k,
        "sgemm_f16a: a holds {} values, not {m} x {k}",
        a.len()
    );
    // SAFETY: forwarded from the caller.
    unsafe { imp::sgemm_f16a((m, n, k), a, b, c, accumulate) }
}

/// `a`'s values as f32 in `scratch` (grown as needed), then `f` on them.
/// A buffer beyond [`SCRATCH_KEPT`] values is freed afterwards.
fn widened<R>(scratch: &mut Vec<f32>, a: &[half::f16], f: impl FnOnce(&[f32]) -> R) -> R {
    use half::slice::HalfFloatSliceExt;
    if scratch.len() < a.len() {
        scratch.resize(a.len(), 0.0);
    }
    let w = &mut scratch[..a.len()];
    a.convert_to_f32_slice(w);
    let r = f(w);
    if scratch.len() > SCRATCH_KEPT {
        *scratch = Vec::new();
    }
    r
}

/// The most values a thread's widening buffer keeps between products (16
/// MB): a tower's block weights fit (Qwen3-VL-2B's MLP halves are 8 MB a
/// thread); a merger's 4096 x 4096 (32 MB a thread) is widened into a
/// buffer freed after its product, whose memory the values can use
/// between mergers rather than it being held for the whole run.
const SCRATCH_KEPT: usize = 1 << 22;

std::thread_local! {
    /// Each thread's buffer for the rows of `a` it widens ([`sgemm_f16a`]):
    /// kept between products (up to [`SCRATCH_KEPT`] values) so that
    /// widening touches no new pages.
    static SCRATCH: std::cell::RefCell<Vec<f32>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// Which library runs [`sgemm`], for reports.
pub fn backend() -> &'static str {
    imp::BACKEND
}

/// Restart this process with OpenBLAS held to a kernel it has, when it did
/// not recognise the CPU.
///
/// A DYNAMIC_ARCH OpenBLAS (Debian's) picks its kernels by CPU model when it
/// loads, and falls back to its generic `Prescott` kernels for a model newer
/// than its release: Debian 12's 0.3.21 does so on Intel's Emerald Rapids
/// Xeons, where the 1x1 convolutions of a b4096 Qwen3-VL-2B-shaped run took
/// 67 s with it and 14 s with its SkylakeX kernels (BENCHMARKS.md, "OpenBLAS's
/// kernels"). It reads `OPENBLAS_CORETYPE` only as it loads, before `main`, so
/// the one way to choose is to start again with it set: the binaries call
/// this first thing, and it returns unless OpenBLAS named `Prescott`, the
/// variable is unset (a user's choice stands, and the restart happens once)
/// and the CPU has AVX-512 (SkylakeX) or AVX2 with FMA (Haswell). If the
/// restart fails, the process carries on with the generic kernels, and the
/// warning to show is returned.
pub fn restart_with_known_kernel() -> Option<String> {
    #[cfg(target_os = "linux")]
    {
        use std::os::unix::process::CommandExt;
        if std::env::var_os("OPENBLAS_CORETYPE").is_some() {
            return None;
        }
        let core = imp::kernel_for_unknown_cpu()?;
        let exe = std::env::current_exe().ok()?;
        let mut args = std::env::args_os();
        let arg0 = args.next().unwrap_or_else(|| exe.clone().into_os_string());
        let err = std::process::Command::new(&exe)
            .arg0(arg0)
            .args(args)
            .env("OPENBLAS_CORETYPE", core)
            .exec();
        Some(format!(
            "warning: could not restart with OpenBLAS's {core} kernels ({err}); its generic ones are slower"
        ))
    }
    #[cfg(not(target_os = "linux"))]
    None
}

/// Whether [`sgemm`] computes every output column with the same sum in the
/// same order wherever the column stands (among columns in whole groups of
/// 16), so that equal columns of `b` give equal columns of `c`, bit for bit.
/// Measured, not derived: OpenBLAS's Prescott, SandyBridge, SkylakeX and
/// Cooperlake kernels did on products of 96 x 70 weights by 320, 768 and
/// 4096 columns; its Haswell and Zen kernels did not (57,064 of 286,720
/// outputs of equal columns differed at 4096). In groups of 16 (each kernel
/// chosen with OPENBLAS_CORETYPE, fp16 weights widened): 16 to 656 columns
/// of 1024 gave the bits they have among 1024, at 96 x 70, 96 x 33,
/// 50 x 129, 1024 x 1024, 2048 x 4096 and 4096 x 4096; under SkylakeX and
/// Cooperlake, 8, 24 and 40 columns did not at the three small shapes.
/// Every other kernel counts as not.
pub fn columns_independent() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| cfg!(target_os = "linux") && columns_independent_kernel(&kernel()))
}

/// Whether OpenBLAS's kernels of this name are among those of
/// [`columns_independent`].
pub fn columns_independent_kernel(name: &str) -> bool {
    ["prescott", "sandybridge", "skylakex", "cooperlake"].contains(&name.to_lowercase().as_str())
}

/// The kernels OpenBLAS chose when it loaded (`openblas_get_corename`), or
/// the backend's name where OpenBLAS is not used.
pub fn kernel() -> String {
    imp::kernel()
}

#[cfg(target_os = "linux")]
mod imp {
    use std::sync::Once;

    use rayon::prelude::*;

    use super::Rows;

    pub const BACKEND: &str = "OpenBLAS (system libopenblas, one thread per rayon task)";

    const ROW_MAJOR: i32 = 101;
    const NO_TRANS: i32 = 111;

    #[link(name = "openblas")]
    unsafe extern "C" {
        fn cblas_sgemm(
            order: i32,
            trans_a: i32,
            trans_b: i32,
            m: i32,
            n: i32,
            k: i32,
            alpha: f32,
            a: *const f32,
            lda: i32,
            b: *const f32,
            ldb: i32,
            beta: f32,
            c: *mut f32,
            ldc: i32,
        );
        fn openblas_set_num_threads(n: i32);
        fn openblas_get_corename() -> *const std::ffi::c_char;
    }

    pub fn kernel() -> String {
        // SAFETY: OpenBLAS returns a static, NUL-terminated name.
        let name = unsafe { openblas_get_corename() };
        if name.is_null() {
            return "unknown".into();
        }
        // SAFETY: as above.
        unsafe { std::ffi::CStr::from_ptr(name) }
            .to_string_lossy()
            .into_owned()
    }

    /// The kernels to ask for when OpenBLAS fell back to its generic ones.
    pub fn kernel_for_unknown_cpu() -> Option<&'static str> {
        if !kernel().eq_ignore_ascii_case("prescott") {
            return None;
        }
        #[cfg(target_arch = "x86_64")]
        {
            use std::arch::is_x86_feature_detected as has;
            if has!("avx512f") && has!("avx512bw") && has!("avx512dq") && has!("avx512vl") {
                return Some("SkylakeX");
            }
            if has!("avx2") && has!("fma") {
                return Some("Haswell");
            }
        }
        None
    }

    #[derive(Clone, Copy)]
    struct Ptr(*const f32);
    // SAFETY: only read, by tasks the caller's contract makes disjoint.
    unsafe impl Send for Ptr {}
    unsafe impl Sync for Ptr {}
    #[derive(Clone, Copy)]
    struct MutPtr(*mut f32);
    // SAFETY: each task writes its own rows (or columns) of `c`.
    unsafe impl Send for MutPtr {}
    unsafe impl Sync for MutPtr {}

    fn dim(v: usize) -> i32 {
        // Checked by `split_product` before any task starts.
        v as i32
    }

    /// Rows per task: enough to keep OpenBLAS's kernel busy (it packs `b`
    /// once per task), and at least one task per thread.
    const MIN_ROWS: usize = 64;

    /// The product split over rayon's threads by rows of `a` and `c`, or
    /// `by_columns` of `b` and `c`.
    ///
    /// # Safety
    /// As [`super::sgemm`].
    pub unsafe fn split_product(
        (m, n, k): (usize, usize, usize),
        a: Rows,
        b: Rows,
        c: (*mut f32, usize),
        accumulate: bool,
        by_columns: bool,
    ) {
        if [m, n, k, a.1, b.1, c.1]
            .iter()
            .any(|&v| i32::try_from(v).is_err())
        {
            // SAFETY: forwarded from the caller.
            return unsafe { super::gemm_crate((m, n, k), a, b, c, accumulate) };
        }
        let (ap, bp, cp) = (Ptr(a.0), Ptr(b.0), MutPtr(c.0));
        let (lda, ldb, ldc) = (a.1, b.1, c.1);
        split(if by_columns { n } else { m }, move |lo, hi| {
            let (ap, bp, cp) = (ap, bp, cp);
            // Rows lo..hi of a and c, or columns lo..hi of b and c.
            let (rows, cols, a0, b0, c0) = if by_columns {
                (m, hi - lo, 0, lo, lo)
            } else {
                (hi - lo, n, lo * lda, 0, lo * ldc)
            };
            // SAFETY: those rows or columns lie inside their buffers by the
            // caller's contract; the tasks' ranges are disjoint.
            unsafe {
                product(
                    rows,
                    cols,
                    k,
                    (ap.0.add(a0), lda),
                    (bp.0.add(b0), ldb),
                    cp.0.add(c0),
                    ldc,
                    accumulate,
                )
            }
        });
    }

    pub unsafe fn sgemm_f16a(
        (m, n, k): (usize, usize, usize),
        a: &[half::f16],
        b: Rows,
        c: (*mut f32, usize),
        accumulate: bool,
    ) {
        if [m, n, k, b.1, c.1]
            .iter()
            .any(|&v| i32::try_from(v).is_err())
        {
            let mut w = Vec::new();
            super::widened(&mut w, &a[..m * k], |w| {
                // SAFETY: forwarded from the caller; w holds m rows of k.
                unsafe { super::gemm_crate((m, n, k), (w.as_ptr(), k), b, c, accumulate) }
            });
            return;
        }
        let (bp, cp) = (Ptr(b.0), MutPtr(c.0));
        let (ldb, ldc) = (b.1, c.1);
        // A task widens its rows a chunk at a time, each within the
        // buffer its thread keeps: a merger's 4096 x 4096 weight on one
        // thread is four products of 1024 rows rather than one 64 MB
        // buffer allocated, faulted in and freed at every product (half
        // the rate at 77 columns, `examples/matmul_rate.rs`). Each row of
        // `c` is the same product of its own row of `a` either way.
        let chunk = (super::SCRATCH_KEPT / k.max(1)).max(MIN_ROWS);
        split(m, move |lo, hi| {
            let (bp, cp) = (bp, cp);
            super::SCRATCH.with_borrow_mut(|scratch| {
                for r0 in (lo..hi).step_by(chunk) {
                    let r1 = (r0 + chunk).min(hi);
                    super::widened(scratch, &a[r0 * k..r1 * k], |w| {
                        // SAFETY: w holds rows r0..r1 of a; rows r0..r1 of c
                        // lie inside its buffer by the caller's contract, and
                        // the tasks' row ranges are disjoint.
                        unsafe {
                            product(
                                r1 - r0,
                                n,
                                k,
                                (w.as_ptr(), k),
                                (bp.0, ldb),
                                cp.0.add(r0 * ldc),
                                ldc,
                                accumulate,
                            )
                        }
                    })
                }
            })
        });
    }

    /// Run `task(lo, hi)` over the rows (or columns) `0..m`, split over rayon's threads.
    fn split(m: usize, task: impl Fn(usize, usize) + Sync + Send) {
        static ONE_THREAD: Once = Once::new();
        // SAFETY: sets a library-global thread count, before any product.
        ONE_THREAD.call_once(|| unsafe { openblas_set_num_threads(1) });
        let tasks = rayon::current_num_threads()
            .min(m.div_ceil(MIN_ROWS))
            .max(1);
        (0..tasks).into_par_iter().for_each(|t| {
            let (lo, hi) = (m * t / tasks, m * (t + 1) / tasks);
            if hi > lo {
                task(lo, hi);
            }
        });
    }

    /// One OpenBLAS product of `rows` rows.
    ///
    /// # Safety
    /// As [`super::sgemm`], for these rows; every size fits i32.
    #[allow(clippy::too_many_arguments)]
    unsafe fn product(
        rows: usize,
        n: usize,
        k: usize,
        a: Rows,
        b: Rows,
        c: *mut f32,
        ldc: usize,
        accumulate: bool,
    ) {
        let beta = if accumulate { 1.0 } else { 0.0 };
        // SAFETY: forwarded from the caller.
        unsafe {
            cblas_sgemm(
                ROW_MAJOR,
                NO_TRANS,
                NO_TRANS,
                dim(rows),
                dim(n),
                dim(k),
                1.0,
                a.0,
                dim(a.1),
                b.0,
                dim(b.1),
                beta,
                c,
                dim(ldc),
            );
        }
    }
}

#[cfg(not(target_os = "linux"))]
mod imp {
    pub const BACKEND: &str = "the gemm crate";

    pub fn kernel() -> String {
        BACKEND.into()
    }

    #[allow(dead_code)] // restart_with_known_kernel is Linux's alone
    pub fn kernel_for_unknown_cpu() -> Option<&'static str> {
        None
    }
    /// The `gemm` crate splits the product over rayon's threads itself.
    ///
    /// # Safety
    /// As [`super::sgemm`].
    pub unsafe fn split_product(
        dims: (usize, usize, usize),
        a: super::Rows,
        b: super::Rows,
        c: (*mut f32, usize),
        accumulate: bool,
        _by_columns: bool,
    ) {
        // SAFETY: forwarded from the caller.
        unsafe { super::gemm_crate(dims, a, b, c, accumulate) }
    }

    pub unsafe fn sgemm_f16a(
        (m, n, k): (usize, usize, usize),
        a: &[half::f16],
        b: super::Rows,
        c: (*mut f32, usize),
        accumulate: bool,
    ) {
        super::SCRATCH.with_borrow_mut(|scratch| {
            super::widened(scratch, &a[..m * k], |w| {
                // SAFETY: forwarded from the caller; w holds m rows of k.
                unsafe { super::gemm_crate((m, n, k), (w.as_ptr(), k), b, c, accumulate) }
            })
        })
    }
}

/// [`sgemm`] by the `gemm` crate, over rayon's threads: what runs where
/// OpenBLAS is not used, and the comparison `examples/matmul_rate.rs` times.
///
/// # Safety
/// As [`sgemm`].
pub unsafe fn gemm_crate(
    (m, n, k): (usize, usize, usize),
    a: Rows,
    b: Rows,
    c: (*mut f32, usize),
    accumulate: bool,
) {
    // SAFETY: forwarded from the caller; the strides fit isize as they
    // address allocated buffers.
    unsafe {
        gemm::gemm(
            m,
            n,
            k,
            c.0,
            1,
            c.1 as isize,
            accumulate,
            a.0,
            1,
            a.1 as isize,
            b.0,
            1,
            b.1 as isize,
            1.0,
            1.0,
            false,
            false,
            false,
            gemm::Parallelism::Rayon(rayon::current_num_threads()),
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Widening gives the exact f32 values; a buffer within
    /// `SCRATCH_KEPT` is kept for the next product, a larger one freed.
    #[test]
    fn widening_keeps_small_buffers_and_frees_large_ones() {
        let a: Vec<half::f16> = (0..1000).map(|i| half::f16::from_f32(val(i, 3))).collect();
        let mut scratch = Vec::new();
        let sum = widened(&mut scratch, &a, |w| {
            assert!(w.iter().zip(&a).all(|(x, h)| *x == h.to_f32()));
            w.len()
        });
        assert_eq!((sum, scratch.len()), (1000, 1000));
        let big = vec![half::f16::ONE; SCRATCH_KEPT + 1];
        let n = widened(&mut scratch, &big, |w| {
            w.iter().filter(|&&x| x == 1.0).count()
        });
        assert_eq!(n, SCRATCH_KEPT + 1);
        assert!(scratch.is_empty() && scratch.capacity() == 0, "freed");
    }

    /// Deterministic values in [-1, 1) for operand `s`.
    fn val(i: usize, s: usize) -> f32 {
        ((i * 2654435761 + s) % 1000) as f32 / 500.0 - 1.0
    }

    /// The product against a plain triple loop in f64, at shapes with tails
    /// (rows not a multiple of the task split, odd k and n), accumulating and
    /// not, with row strides wider than the columns.
    #[test]
    fn sgemm_matches_a_plain_product() {
        for &(m, n, k, accumulate) in &[
            (1, 1, 1, false),
            (7, 5, 3, true),
            (131, 67, 45, false),
            (257, 90, 61, true),
            (45, 263, 61, false),
            (90, 257, 45, true),
        ] {
            let (lda, ldb, ldc) = (k + 3, n + 1, n + 2);
            let a: Vec<f32> = (0..m * lda).map(|i| val(i, 1)).collect();
            let b: Vec<f32> = (0..k * ldb).map(|i| val(i, 2)).collect();
            let c0: Vec<f32> = (0..m * ldc).map(|i| val(i, 3)).collect();
            for by_columns in [false, true] {
                let mut c = c0.clone();
                let product = if by_columns { sgemm_by_columns } else { sgemm };
                // SAFETY: the buffers hold m, k and m rows of their strides.
                unsafe {
                    product(
                        (m, n, k),
                        (a.as_ptr(), lda),
                        (b.as_ptr(), ldb),
                        (c.as_mut_ptr(), ldc),
                        accumulate,
                    );
                }
                for i in 0..m {
                    for j in 0..ldc {
                        let got = c[i * ldc + j];
                        if j >= n {
                            assert_eq!(got, c0[i * ldc + j], "padding of row {i} written");
                            continue;
                        }
                        let mut want = if accumulate {
                            f64::from(c0[i * ldc + j])
                        } else {
                            0.0
                        };
                        for p in 0..k {
                            want += f64::from(a[i * lda + p]) * f64::from(b[p * ldb + j]);
                        }
                        assert!(
                            (f64::from(got) - want).abs() <= 1e-5 * (k as f64).sqrt().max(1.0),
                            "{m}x{n}x{k} acc {accumulate} by columns {by_columns}: c[{i},{j}] = {got}, want {want}"
                        );
                    }
                }
            }
        }
    }

    /// The fp16 variant gives exactly [`sgemm`]'s result on the widened
    /// values, at shapes with tails and with several tasks.
    #[test]
    fn sgemm_f16a_is_sgemm_on_the_widened_values() {
        for &(m, n, k, accumulate) in &[(1, 1, 1, false), (7, 5, 3, true), (263, 67, 45, false)] {
            let a16: Vec<half::f16> = (0..m * k).map(|i| half::f16::from_f32(val(i, 1))).collect();
            let a: Vec<f32> = a16.iter().map(|v| v.to_f32()).collect();
            let b: Vec<f32> = (0..k * n).map(|i| val(i, 2)).collect();
            let c0: Vec<f32> = (0..m * n).map(|i| val(i, 3)).collect();
            let (mut want, mut got) = (c0.clone(), c0.clone());
            // SAFETY: the buffers hold m, k and m rows of their widths.
            unsafe {
                sgemm(
                    (m, n, k),
                    (a.as_ptr(), k),
                    (b.as_ptr(), n),
                    (want.as_mut_ptr(), n),
                    accumulate,
                );
                sgemm_f16a(
                    (m, n, k),
                    &a16,
                    (b.as_ptr(), n),
                    (got.as_mut_ptr(), n),
                    accumulate,
                );
            }
            assert_eq!(got, want, "{m}x{n}x{k}");
        }
    }
}
