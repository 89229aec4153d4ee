//! The large matrix products of a tower (its Linears: the reference's fused
//! Linear and the interpreter's 1x1 convolution), over all cores.
//!
//! On Linux they run OpenBLAS as the `scipy-openblas32` wheel ships it (the
//! build numpy's and SciPy's wheels use: DYNAMIC_ARCH, kernels chosen at load
//! by the CPU), pinned in `python/requirements-runtime.txt` and opened from
//! the tool's venv, not the system's OpenBLAS: a system build's choice of
//! kernels depends on its release knowing the CPU (Debian 12's 0.3.21 fell
//! back to its generic kernels on Intel's Emerald Rapids) and on
//! `OPENBLAS_*` variables machines set for it, which the binaries hide from
//! the pinned one ([`init`]). Side by side at the towers' shapes the pinned
//! build and the system's ran at the same rate where both knew the CPU, the
//! `gemm` crate at about three quarters of it (BENCHMARKS.md, "Matrix
//! products"). OpenBLAS is held to one thread of its own; the rows of the
//! product are split over rayon's threads instead, so the process keeps one
//! thread pool and OpenBLAS's idle threads never compete with rayon's.
//! Without the library (no venv) the `gemm` crate does the work, and the
//! binaries say so. On macOS Accelerate does it (as numpy's wheels there).
//!
//! Both sides of the cosine gate use this module, as they used the `gemm`
//! crate before it: ARCHITECTURE.md's table of shared code says how each side is
//! checked against code that is not this.

/// Little-endian fp16 values (`b`, two bytes each) widened to f32 in `o`,
/// exactly (F16C where the CPU has it): the interpreter's decoded constants
/// and the exact kernel's packed fp16 weights.
pub(crate) fn widen_f16(o: &mut [f32], b: &[u8]) {
    // The F16C loop reads `b` unchecked: two bytes for every output.
    assert_eq!(b.len(), 2 * o.len(), "two bytes per fp16 value");
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

/// `c = alpha · a · op(b)` on the calling thread alone (no split over
/// threads: for callers that run many products in parallel, one per
/// task, as the reference's attention does under
/// `ANE_EXPORT_REFERENCE_ATTENTION=blas`), where
/// `op(b)` is `b [k, n]`, or with `b_transposed` the transpose of `b`
/// stored `[n, k]`; all row-major with the given row strides; `c` is
/// overwritten.
///
/// # Safety
/// As [`sgemm`], with `b` holding `n` rows of `k` when transposed.
pub unsafe fn sgemm_serial(
    (m, n, k): (usize, usize, usize),
    alpha: f32,
    a: Rows,
    (b, b_transposed): (Rows, bool),
    c: (*mut f32, usize),
) {
    if m == 0 || n == 0 {
        return;
    }
    // SAFETY: forwarded from the caller.
    unsafe { imp::sgemm_serial((m, n, k), alpha, a, (b, b_transposed), c) }
}

/// [`sgemm_serial`] by the `gemm` crate: the fallback where the library
/// cannot take a shape, and the fp32 reference's attention products (its
/// per-block products with a `k` or `n` of a head's width ran faster on it
/// than on OpenBLAS: `reference::kernels`).
///
/// # Safety
/// As [`sgemm_serial`].
pub unsafe fn gemm_crate_serial(
    (m, n, k): (usize, usize, usize),
    alpha: f32,
    a: Rows,
    (b, b_transposed): (Rows, bool),
    c: (*mut f32, usize),
) {
    let (bcs, brs) = if b_transposed {
        (b.1 as isize, 1)
    } else {
        (1, b.1 as isize)
    };
    // SAFETY: forwarded from the caller; the strides address allocated buffers.
    unsafe {
        gemm::gemm(
            m,
            n,
            k,
            c.0,
            1,
            c.1 as isize,
            false,
            a.0,
            1,
            a.1 as isize,
            b.0,
            bcs,
            brs,
            0.0,
            alpha,
            false,
            false,
            false,
            gemm::Parallelism::None,
        );
    }
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

/// Which library runs [`sgemm`], for reports (its version and file where
/// it says them).
pub fn backend() -> String {
    imp::backend()
}

/// The environment variable that names the BLAS library to open instead
/// of the pinned one (a path to a shared library exporting `cblas_sgemm`,
/// e.g. Debian's `libopenblas.so.0`, for a side-by-side benchmark), or
/// `gemm` for the `gemm` crate. Linux only.
pub const LIBRARY_VAR: &str = "ANE_EXPORT_BLAS";

/// The environment variable that chooses OpenBLAS's kernels (a name
/// OpenBLAS's `OPENBLAS_CORETYPE` takes, e.g. `Haswell`, `SkylakeX`). The
/// binaries hide every `OPENBLAS_*` variable from the library as they open
/// it ([`init`]), so this is the one way to choose; unset, OpenBLAS chooses
/// by the CPU. Linux only.
pub const CORETYPE_VAR: &str = "ANE_EXPORT_BLAS_CORETYPE";

/// The environment variable that runs the binaries as on a CPU with at most
/// AVX2 (`avx2`, the one value it takes): every vector path of the
/// project's own code (the interpreter's kernels and attention chains, the
/// reference's kernels) takes AVX2 where the CPU also has AVX-512, and
/// OpenBLAS its Haswell kernels unless [`CORETYPE_VAR`] names others. For
/// measuring the AVX2 paths on an AVX-512 host; the `gemm` crate chooses its
/// kernels itself and keeps AVX-512. Read once ([`cpu_cap`]).
pub const CPU_VAR: &str = "ANE_EXPORT_CPU";

/// What [`CPU_VAR`] asks: `Ok(true)` for `avx2`, `Ok(false)` unset or
/// empty, an error naming the variable and the value it takes otherwise.
pub fn cpu_cap_from(value: Option<&std::ffi::OsStr>) -> Result<bool, String> {
    match value.map(|v| v.to_str()) {
        None | Some(Some("")) => Ok(false),
        Some(Some("avx2")) => Ok(true),
        Some(v) => Err(format!(
            "error: {CPU_VAR}={} is not a setting: the one value it takes is avx2 (run as on a CPU with at most AVX2), or leave it unset",
            v.unwrap_or("(not UTF-8)")
        )),
    }
}

/// Whether [`CPU_VAR`] caps the project's vector paths at AVX2 (read once;
/// a value it does not take counts as unset here, and [`init`] refuses it).
pub fn cpu_cap() -> bool {
    static CAP: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *CAP.get_or_init(|| cpu_cap_from(std::env::var_os(CPU_VAR).as_deref()).unwrap_or(false))
}

/// Whether the project's own AVX-512 paths run here: the CPU has AVX-512F
/// and [`CPU_VAR`] does not cap them at AVX2. Every dispatch between an
/// AVX-512 and an AVX2 path asks this.
pub fn avx512() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        std::arch::is_x86_feature_detected!("avx512f") && !cpu_cap()
    }
    #[cfg(not(target_arch = "x86_64"))]
    false
}

/// The project's own vector paths here, for reports (`--version`): `AVX-512`,
/// `AVX2` (saying so where [`CPU_VAR`] capped a CPU with AVX-512), or
/// `portable`.
pub fn vector_paths() -> String {
    #[cfg(target_arch = "x86_64")]
    {
        use std::arch::is_x86_feature_detected as has;
        if avx512() {
            return "AVX-512".into();
        }
        if has!("avx2") && has!("fma") {
            return if has!("avx512f") {
                format!("AVX2 ({CPU_VAR}=avx2, on a CPU with AVX-512)")
            } else {
                "AVX2".into()
            };
        }
    }
    "portable".into()
}

/// Open the BLAS library now, hiding the environment's `OPENBLAS_*`
/// variables (and `GOTO_NUM_THREADS`) from it: the binaries call this
/// first thing. OpenBLAS reads them only as it loads; machines set
/// `OPENBLAS_CORETYPE` for older system OpenBLAS builds that fail on newer
/// CPUs (BENCHMARKS.md, "OpenBLAS's kernels"), and what suits those slows
/// the pinned one (`Haswell` on an AVX-512 CPU halves its rate). The
/// variables are restored once it is open, for child processes. Opened
/// lazily instead (a library caller that never calls this), it sees the
/// environment as it is.
///
/// If OpenBLAS still fell back to its generic kernels (a CPU
/// newer than its release) and the CPU has AVX-512 or AVX2 with FMA, the
/// process starts again once with [`CORETYPE_VAR`] naming `SkylakeX` or
/// `Haswell`. Returns a warning to print: the library was not found (the
/// products then run on the `gemm` crate), or the restart failed; or an
/// error, for a [`CPU_VAR`] value it does not take (the binaries stop
/// with exit code 2, before any work).
///
/// # Safety
/// No other thread may be running: this sets and removes environment
/// variables.
pub unsafe fn init() -> Result<Option<String>, String> {
    cpu_cap_from(std::env::var_os(CPU_VAR).as_deref())?;
    // SAFETY: forwarded from the caller.
    Ok(unsafe { imp::init() })
}

/// CBLAS's `sgemm` as both platforms' libraries export it (enums as int).
#[cfg(any(target_os = "linux", target_os = "macos"))]
type CblasSgemm = unsafe extern "C" fn(
    i32,
    i32,
    i32,
    i32,
    i32,
    i32,
    f32,
    *const f32,
    i32,
    *const f32,
    i32,
    f32,
    *mut f32,
    i32,
);

/// One call of `f`: `c = alpha · a · op(b) + beta · c`, row-major, `op(b)`
/// transposed with `b_transposed`.
///
/// # Safety
/// As [`sgemm_serial`]; every size and stride fits i32.
#[cfg(any(target_os = "linux", target_os = "macos"))]
unsafe fn cblas_call(
    f: CblasSgemm,
    (m, n, k): (usize, usize, usize),
    alpha: f32,
    a: Rows,
    (b, b_transposed): (Rows, bool),
    (c, beta): ((*mut f32, usize), f32),
) {
    let d = |v: usize| v as i32;
    // SAFETY: forwarded from the caller.
    unsafe {
        f(
            101, // row-major
            111, // a not transposed
            if b_transposed { 112 } else { 111 },
            d(m),
            d(n),
            d(k),
            alpha,
            a.0,
            d(a.1),
            b.0,
            d(b.1),
            beta,
            c.0,
            d(c.1),
        )
    }
}

pub mod exact;

/// What runs the interpreter's 1x1 convolutions ([`conv_sgemm`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ConvRoute {
    /// [`sgemm`]: its kernels compute columns alike ([`columns_independent_kernel`]).
    Blas,
    /// [`exact::sgemm`]: the library's kernels do not, and the CPU has
    /// the exact kernel's instructions.
    Exact,
    /// [`sgemm`], whose kernels do not compute columns alike.
    Plain,
}

/// The route of the interpreter's 1x1 convolutions on this machine:
/// OpenBLAS where its kernels compute every column alike, else the exact
/// kernel where the CPU has AVX2 and FMA (OpenBLAS's Haswell and Zen
/// kernels, which such CPUs get, do not), else OpenBLAS all the same.
/// `ANE_EXPORT_BLAS=gemm` keeps the `gemm` crate for them too, and
/// `ANE_EXPORT_EXACT=0` the library (for a side-by-side comparison; the
/// repeated-columns shortcut is then off on such CPUs).
pub fn conv_route() -> ConvRoute {
    static R: std::sync::OnceLock<ConvRoute> = std::sync::OnceLock::new();
    *R.get_or_init(|| {
        if cfg!(target_os = "linux") && columns_independent_kernel(&kernel()) {
            ConvRoute::Blas
        } else if exact::available()
            && std::env::var_os(LIBRARY_VAR).is_none_or(|v| v != "gemm")
            && std::env::var_os("ANE_EXPORT_EXACT").is_none_or(|v| v != "0")
        {
            ConvRoute::Exact
        } else {
            ConvRoute::Plain
        }
    })
}

/// What runs the interpreter's 1x1 convolutions, for reports.
pub fn conv_backend() -> &'static str {
    match conv_route() {
        ConvRoute::Blas | ConvRoute::Plain => "the matrix products' library",
        ConvRoute::Exact => "the exact kernel (AVX2, every column alike)",
    }
}

/// `c = (accumulate ? c : 0) + a · b` for the interpreter's 1x1
/// convolutions, on [`conv_route`]'s backend.
///
/// # Safety
/// As [`sgemm`] (or [`sgemm_f16a`] for fp16 `a`).
pub unsafe fn conv_sgemm(
    (m, n, k): (usize, usize, usize),
    a: exact::Left,
    b: Rows,
    c: (*mut f32, usize),
    accumulate: bool,
) {
    // SAFETY: forwarded from the caller; Exact only where `available`.
    unsafe {
        match (conv_route(), a) {
            (ConvRoute::Exact, a) => exact::sgemm((m, n, k), a, b, c, accumulate),
            (_, exact::Left::F32(p, lda)) => sgemm((m, n, k), (p, lda), b, c, accumulate),
            (_, exact::Left::F16(h)) => sgemm_f16a((m, n, k), h, b, c, accumulate),
        }
    }
}

/// Whether [`conv_sgemm`] computes every output column with the same sum in
/// the same order wherever the column stands (among columns in whole groups
/// of 16), so that equal columns of `b` give equal columns of `c`, bit for
/// bit: the exact kernel by construction ([`exact`]), OpenBLAS's kernels as
/// measured. Measured, not derived, on Debian's OpenBLAS 0.3.21: its Prescott,
/// SandyBridge, SkylakeX and Cooperlake kernels did on products of 96 x 70
/// weights by 320, 768 and 4096 columns; its Haswell and Zen kernels did
/// not (57,064 of 286,720 outputs of equal columns differed at 4096). In
/// groups of 16 (each kernel chosen with OPENBLAS_CORETYPE, fp16 weights
/// widened): 16 to 656 columns of 1024 gave the bits they have among 1024,
/// at 96 x 70, 96 x 33, 50 x 129, 1024 x 1024, 2048 x 4096 and 4096 x
/// 4096; under SkylakeX and Cooperlake, 8, 24 and 40 columns did not at the
/// three small shapes. Every other kernel counts as not. Whatever kernels
/// load, the tests check the claim on them (`interp::fast::conv`'s tests).
pub fn columns_independent() -> bool {
    conv_route() != ConvRoute::Plain
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
pub use imp::{Library, pinned_library};

#[cfg(target_os = "linux")]
mod imp {
    use std::ffi::{CStr, CString, OsString, c_char, c_void};
    use std::os::unix::ffi::OsStrExt;
    use std::path::{Path, PathBuf};
    use std::sync::{Once, OnceLock};

    use rayon::prelude::*;

    use super::{CORETYPE_VAR, LIBRARY_VAR, Rows};

    type SgemmFn = super::CblasSgemm;
    type SetThreadsFn = unsafe extern "C" fn(i32);
    type NameFn = unsafe extern "C" fn() -> *const c_char;

    /// A CBLAS library opened from a file: OpenBLAS as the `scipy-openblas32`
    /// wheel ships it (its symbols prefixed `scipy_`), or any library with
    /// CBLAS's `cblas_sgemm` (OpenBLAS's own functions used where it has them).
    pub struct Library {
        path: PathBuf,
        sgemm: SgemmFn,
        set_threads: Option<SetThreadsFn>,
        corename: Option<NameFn>,
        config: Option<NameFn>,
        one_thread: Once,
    }

    fn dlerror() -> String {
        // SAFETY: dlerror returns a thread-local message or null.
        let e = unsafe { libc::dlerror() };
        if e.is_null() {
            return "unknown error".into();
        }
        // SAFETY: as above, NUL-terminated.
        unsafe { CStr::from_ptr(e) }.to_string_lossy().into_owned()
    }

    /// A name function's string, if it has one.
    fn name(f: Option<NameFn>) -> Option<String> {
        // SAFETY: OpenBLAS's name functions return a static, NUL-terminated
        // string (or null).
        let p = unsafe { f?() };
        // SAFETY: as above.
        (!p.is_null()).then(|| unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned())
    }

    impl Library {
        /// Open the shared library at `path` (its handle is kept for the
        /// process's life). The error names the file and what is wrong.
        pub fn open(path: &Path) -> Result<Library, String> {
            let c = CString::new(path.as_os_str().as_bytes())
                .map_err(|_| format!("{}: the path holds a NUL byte", path.display()))?;
            // SAFETY: opening a shared library runs its initialisers: the
            // caller names a BLAS library, whose initialisers set up its
            // kernels and buffers.
            let h = unsafe { libc::dlopen(c.as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL) };
            if h.is_null() {
                return Err(format!("{}: {}", path.display(), dlerror()));
            }
            for prefix in ["scipy_", ""] {
                let sym = |n: &str| {
                    let n = CString::new(format!("{prefix}{n}")).expect("no NUL in a symbol name");
                    // SAFETY: h is an open handle; n is NUL-terminated.
                    unsafe { libc::dlsym(h, n.as_ptr()) }
                };
                let sgemm = sym("cblas_sgemm");
                if sgemm.is_null() {
                    continue;
                }
                let named = |p: *mut c_void| {
                    // SAFETY: OpenBLAS's name functions take nothing and
                    // return a C string.
                    (!p.is_null()).then(|| unsafe { std::mem::transmute::<*mut c_void, NameFn>(p) })
                };
                let threads = sym("openblas_set_num_threads");
                // SAFETY: CBLAS's sgemm and OpenBLAS's thread setter have
                // these signatures (cblas.h, with enums as int).
                return Ok(unsafe {
                    Library {
                        path: path.to_path_buf(),
                        sgemm: std::mem::transmute::<*mut c_void, SgemmFn>(sgemm),
                        set_threads: (!threads.is_null())
                            .then(|| std::mem::transmute::<*mut c_void, SetThreadsFn>(threads)),
                        corename: named(sym("openblas_get_corename")),
                        config: named(sym("openblas_get_config")),
                        one_thread: Once::new(),
                    }
                });
            }
            // SAFETY: h is open and nothing of it is used.
            unsafe { libc::dlclose(h) };
            Err(format!(
                "{}: exports neither cblas_sgemm nor scipy_cblas_sgemm",
                path.display()
            ))
        }

        /// The kernels OpenBLAS chose as it loaded, or `unknown`.
        pub fn kernel(&self) -> String {
            name(self.corename).unwrap_or_else(|| "unknown".into())
        }

        /// The library's version (its `openblas_get_config` as far as the
        /// version) and file.
        pub fn describe(&self) -> String {
            let version = name(self.config)
                .map(|c| c.split_whitespace().take(2).collect::<Vec<_>>().join(" "))
                .unwrap_or_else(|| "a CBLAS".into());
            let file = self.path.file_name().unwrap_or_default().to_string_lossy();
            format!("{version} ({file}), one thread per rayon task")
        }

        /// [`super::sgemm`] (or, `by_columns`, [`super::sgemm_by_columns`])
        /// on this library.
        ///
        /// # Safety
        /// As [`super::sgemm`].
        pub unsafe fn sgemm(
            &self,
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
            if [m, n, k, a.1, b.1, c.1]
                .iter()
                .any(|&v| i32::try_from(v).is_err())
            {
                // SAFETY: forwarded from the caller.
                return unsafe { super::gemm_crate((m, n, k), a, b, c, accumulate) };
            }
            let (ap, bp, cp) = (Ptr(a.0), Ptr(b.0), MutPtr(c.0));
            let (lda, ldb, ldc) = (a.1, b.1, c.1);
            self.split(if by_columns { n } else { m }, move |lo, hi| {
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
                    self.product(
                        (rows, cols, k),
                        (ap.0.add(a0), lda),
                        (bp.0.add(b0), ldb),
                        (cp.0.add(c0), ldc),
                        accumulate,
                    )
                }
            });
        }

        /// [`super::sgemm_f16a`] on this library.
        ///
        /// # Safety
        /// As [`super::sgemm_f16a`].
        pub unsafe fn sgemm_f16a(
            &self,
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
            self.split(m, move |lo, hi| {
                let (bp, cp) = (bp, cp);
                super::SCRATCH.with_borrow_mut(|scratch| {
                    for r0 in (lo..hi).step_by(chunk) {
                        let r1 = (r0 + chunk).min(hi);
                        super::widened(scratch, &a[r0 * k..r1 * k], |w| {
                            // SAFETY: w holds rows r0..r1 of a; rows r0..r1 of c
                            // lie inside its buffer by the caller's contract, and
                            // the tasks' row ranges are disjoint.
                            unsafe {
                                self.product(
                                    (r1 - r0, n, k),
                                    (w.as_ptr(), k),
                                    (bp.0, ldb),
                                    (cp.0.add(r0 * ldc), ldc),
                                    accumulate,
                                )
                            }
                        })
                    }
                })
            });
        }

        /// [`super::sgemm_serial`] on this library.
        ///
        /// # Safety
        /// As [`super::sgemm_serial`].
        pub unsafe fn sgemm_serial(
            &self,
            (m, n, k): (usize, usize, usize),
            alpha: f32,
            a: Rows,
            (b, b_transposed): (Rows, bool),
            c: (*mut f32, usize),
        ) {
            if [m, n, k, a.1, b.1, c.1]
                .iter()
                .any(|&v| i32::try_from(v).is_err())
            {
                // SAFETY: forwarded from the caller.
                return unsafe {
                    super::gemm_crate_serial((m, n, k), alpha, a, (b, b_transposed), c)
                };
            }
            self.hold_to_one_thread();
            // SAFETY: forwarded from the caller; every size fits i32.
            unsafe {
                super::cblas_call(self.sgemm, (m, n, k), alpha, a, (b, b_transposed), (c, 0.0))
            }
        }

        /// The library held to one thread of its own, before its first product.
        fn hold_to_one_thread(&self) {
            self.one_thread.call_once(|| {
                if let Some(f) = self.set_threads {
                    // SAFETY: sets the library's thread count, before any
                    // product of this process.
                    unsafe { f(1) }
                }
            });
        }

        /// Run `task(lo, hi)` over the rows (or columns) `0..m`, split over
        /// rayon's threads, the library held to one thread of its own.
        fn split(&self, m: usize, task: impl Fn(usize, usize) + Sync + Send) {
            self.hold_to_one_thread();
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

        /// One library call.
        ///
        /// # Safety
        /// As [`super::sgemm`], for these rows; every size fits i32.
        unsafe fn product(
            &self,
            (rows, n, k): (usize, usize, usize),
            a: Rows,
            b: Rows,
            c: (*mut f32, usize),
            accumulate: bool,
        ) {
            let beta = if accumulate { 1.0 } else { 0.0 };
            // SAFETY: forwarded from the caller (checked to fit by `sgemm`).
            unsafe { super::cblas_call(self.sgemm, (rows, n, k), 1.0, a, (b, false), (c, beta)) }
        }
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

    /// Rows per task: enough to keep OpenBLAS's kernel busy (it packs `b`
    /// once per task), and at least one task per thread.
    const MIN_ROWS: usize = 64;

    /// The pinned OpenBLAS: `scipy_openblas32/lib/libscipy_openblas.so` in
    /// the tool's venv (`make setup`, `make install`; the version is pinned in
    /// `python/requirements-runtime.txt`), or why it is not there.
    pub fn pinned_library() -> Result<PathBuf, String> {
        let env = crate::home::find_env().map_err(|e| format!("the tool's venv: {e}"))?;
        let lib = env
            .site_packages
            .join("scipy_openblas32/lib/libscipy_openblas.so");
        if lib.is_file() {
            Ok(lib)
        } else {
            Err(format!(
                "{} is missing (`make setup` installs scipy-openblas32, python/requirements-runtime.txt)",
                lib.display()
            ))
        }
    }

    enum Loaded {
        Blas(Library),
        /// The `gemm` crate, and why.
        Fallback(String),
    }

    static LOADED: OnceLock<Loaded> = OnceLock::new();

    fn loaded() -> &'static Loaded {
        LOADED.get_or_init(|| {
            let path = match std::env::var_os(LIBRARY_VAR) {
                Some(v) if v == "gemm" => return Loaded::Fallback(format!("{LIBRARY_VAR}=gemm")),
                Some(v) => Ok(PathBuf::from(v)),
                None => pinned_library(),
            };
            match path.and_then(|p| Library::open(&p)) {
                Ok(l) => Loaded::Blas(l),
                Err(e) => Loaded::Fallback(e),
            }
        })
    }

    pub fn backend() -> String {
        match loaded() {
            Loaded::Blas(l) => l.describe(),
            Loaded::Fallback(_) => "the gemm crate".into(),
        }
    }

    pub fn kernel() -> String {
        match loaded() {
            Loaded::Blas(l) => l.kernel(),
            Loaded::Fallback(_) => "the gemm crate".into(),
        }
    }

    /// # Safety
    /// As [`super::init`].
    pub unsafe fn init() -> Option<String> {
        let hidden: Vec<(OsString, OsString)> = std::env::vars_os()
            .filter(|(k, _)| {
                let k = k.to_string_lossy();
                k.starts_with("OPENBLAS_") || k == "GOTO_NUM_THREADS"
            })
            .collect();
        // As an AVX2 CPU would load them, where `ANE_EXPORT_CPU=avx2` asks
        // and the CPU has them.
        let choice = std::env::var_os(CORETYPE_VAR)
            .or_else(|| (super::cpu_cap() && super::exact::available()).then(|| "Haswell".into()));
        // SAFETY: the caller runs no other thread. OpenBLAS starts no
        // threads of its own with OPENBLAS_NUM_THREADS=1 (it is held to one
        // anyway; rayon splits the products).
        unsafe {
            for (k, _) in &hidden {
                std::env::remove_var(k);
            }
            std::env::set_var("OPENBLAS_NUM_THREADS", "1");
            if let Some(c) = &choice {
                std::env::set_var("OPENBLAS_CORETYPE", c);
            }
        }
        let l = loaded();
        // SAFETY: as above.
        unsafe {
            std::env::remove_var("OPENBLAS_NUM_THREADS");
            std::env::remove_var("OPENBLAS_CORETYPE");
            for (k, v) in &hidden {
                std::env::set_var(k, v);
            }
        }
        match l {
            Loaded::Fallback(why) => Some(format!(
                "warning: matrix products run on the gemm crate, slower than OpenBLAS: {why}"
            )),
            Loaded::Blas(lib) if choice.is_none() => restart_with(lib),
            Loaded::Blas(_) => None,
        }
    }

    /// Start again with [`CORETYPE_VAR`] set, when OpenBLAS fell back to
    /// its generic kernels on a CPU with wider ones.
    fn restart_with(lib: &Library) -> Option<String> {
        use std::os::unix::process::CommandExt;
        // The generic kernels' name: Debian's 0.3.21 says Prescott, the
        // pinned 0.3.34 Katmai (measured, with OPENBLAS_CORETYPE=Prescott).
        if !["prescott", "katmai"].contains(&lib.kernel().to_lowercase().as_str()) {
            return None;
        }
        let core = kernel_for_unknown_cpu()?;
        let exe = std::env::current_exe().ok()?;
        let mut args = std::env::args_os();
        let arg0 = args.next().unwrap_or_else(|| exe.clone().into_os_string());
        let err = std::process::Command::new(&exe)
            .arg0(arg0)
            .args(args)
            .env(CORETYPE_VAR, core)
            .exec();
        Some(format!(
            "warning: could not restart with OpenBLAS's {core} kernels ({err}); its generic ones are slower"
        ))
    }

    /// The kernels to ask for when OpenBLAS fell back to its generic ones.
    fn kernel_for_unknown_cpu() -> Option<&'static str> {
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

    /// # Safety
    /// As [`super::sgemm`].
    pub unsafe fn split_product(
        dims: (usize, usize, usize),
        a: Rows,
        b: Rows,
        c: (*mut f32, usize),
        accumulate: bool,
        by_columns: bool,
    ) {
        match loaded() {
            // SAFETY: forwarded from the caller.
            Loaded::Blas(l) => unsafe { l.sgemm(dims, a, b, c, accumulate, by_columns) },
            // SAFETY: forwarded from the caller.
            Loaded::Fallback(_) => unsafe { super::gemm_crate(dims, a, b, c, accumulate) },
        }
    }

    /// # Safety
    /// As [`super::sgemm_serial`].
    pub unsafe fn sgemm_serial(
        dims: (usize, usize, usize),
        alpha: f32,
        a: Rows,
        b: (Rows, bool),
        c: (*mut f32, usize),
    ) {
        match loaded() {
            // SAFETY: forwarded from the caller.
            Loaded::Blas(l) => unsafe { l.sgemm_serial(dims, alpha, a, b, c) },
            // SAFETY: forwarded from the caller.
            Loaded::Fallback(_) => unsafe { super::gemm_crate_serial(dims, alpha, a, b, c) },
        }
    }

    /// # Safety
    /// As [`super::sgemm_f16a`].
    pub unsafe fn sgemm_f16a(
        dims: (usize, usize, usize),
        a: &[half::f16],
        b: Rows,
        c: (*mut f32, usize),
        accumulate: bool,
    ) {
        match loaded() {
            // SAFETY: forwarded from the caller.
            Loaded::Blas(l) => unsafe { l.sgemm_f16a(dims, a, b, c, accumulate) },
            // SAFETY: forwarded from the caller.
            Loaded::Fallback(_) => unsafe { super::gemm_crate_f16a(dims, a, b, c, accumulate) },
        }
    }
}

/// Accelerate on macOS, where numpy's wheels use it too: its `cblas_sgemm`
/// runs on Apple silicon's matrix units with its own threads, so a product
/// is one call. Not run in this project's CI (no Mac); type-checked.
#[cfg(target_os = "macos")]
mod imp {
    use super::Rows;

    #[link(name = "Accelerate", kind = "framework")]
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
    }

    pub fn backend() -> String {
        "Accelerate (cblas_sgemm, its own threads)".into()
    }

    pub fn kernel() -> String {
        "Accelerate".into()
    }

    pub unsafe fn init() -> Option<String> {
        None
    }

    /// # Safety
    /// As [`super::sgemm`].
    pub unsafe fn split_product(
        (m, n, k): (usize, usize, usize),
        a: Rows,
        b: Rows,
        c: (*mut f32, usize),
        accumulate: bool,
        _by_columns: bool,
    ) {
        let fits = [m, n, k, a.1, b.1, c.1]
            .iter()
            .all(|&v| i32::try_from(v).is_ok());
        if !fits {
            // SAFETY: forwarded from the caller.
            return unsafe { super::gemm_crate((m, n, k), a, b, c, accumulate) };
        }
        let beta = if accumulate { 1.0 } else { 0.0 };
        // SAFETY: forwarded from the caller; every size fits i32.
        unsafe { super::cblas_call(cblas_sgemm, (m, n, k), 1.0, a, (b, false), (c, beta)) }
    }

    /// # Safety
    /// As [`super::sgemm_serial`].
    pub unsafe fn sgemm_serial(
        (m, n, k): (usize, usize, usize),
        alpha: f32,
        a: Rows,
        (b, b_transposed): (Rows, bool),
        c: (*mut f32, usize),
    ) {
        let fits = [m, n, k, a.1, b.1, c.1]
            .iter()
            .all(|&v| i32::try_from(v).is_ok());
        if !fits {
            // SAFETY: forwarded from the caller.
            return unsafe { super::gemm_crate_serial((m, n, k), alpha, a, (b, b_transposed), c) };
        }
        // SAFETY: forwarded from the caller; every size fits i32.
        unsafe {
            super::cblas_call(
                cblas_sgemm,
                (m, n, k),
                alpha,
                a,
                (b, b_transposed),
                (c, 0.0),
            )
        }
    }

    /// # Safety
    /// As [`super::sgemm_f16a`].
    pub unsafe fn sgemm_f16a(
        (m, n, k): (usize, usize, usize),
        a: &[half::f16],
        b: Rows,
        c: (*mut f32, usize),
        accumulate: bool,
    ) {
        super::SCRATCH.with_borrow_mut(|scratch| {
            super::widened(scratch, &a[..m * k], |w| {
                // SAFETY: forwarded from the caller; w holds m rows of k.
                unsafe { split_product((m, n, k), (w.as_ptr(), k), b, c, accumulate, false) }
            })
        })
    }
}

/// Elsewhere, the `gemm` crate.
#[cfg(not(any(target_os = "linux", target_os = "macos")))]
mod imp {
    pub fn backend() -> String {
        "the gemm crate".into()
    }

    pub fn kernel() -> String {
        backend()
    }

    pub unsafe fn init() -> Option<String> {
        None
    }

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

    /// # Safety
    /// As [`super::sgemm_serial`].
    pub unsafe fn sgemm_serial(
        dims: (usize, usize, usize),
        alpha: f32,
        a: super::Rows,
        b: (super::Rows, bool),
        c: (*mut f32, usize),
    ) {
        // SAFETY: forwarded from the caller.
        unsafe { super::gemm_crate_serial(dims, alpha, a, b, c) }
    }

    /// # Safety
    /// As [`super::sgemm_f16a`].
    pub unsafe fn sgemm_f16a(
        dims: (usize, usize, usize),
        a: &[half::f16],
        b: super::Rows,
        c: (*mut f32, usize),
        accumulate: bool,
    ) {
        // SAFETY: forwarded from the caller.
        unsafe { super::gemm_crate_f16a(dims, a, b, c, accumulate) }
    }
}

/// [`sgemm_f16a`] by the `gemm` crate: `a` widened whole into the thread's
/// buffer.
///
/// # Safety
/// As [`sgemm_f16a`].
#[allow(dead_code)] // macOS widens into Accelerate instead
unsafe fn gemm_crate_f16a(
    (m, n, k): (usize, usize, usize),
    a: &[half::f16],
    b: Rows,
    c: (*mut f32, usize),
    accumulate: bool,
) {
    SCRATCH.with_borrow_mut(|scratch| {
        widened(scratch, &a[..m * k], |w| {
            // SAFETY: forwarded from the caller; w holds m rows of k.
            unsafe { gemm_crate((m, n, k), (w.as_ptr(), k), b, c, accumulate) }
        })
    })
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

    /// `ANE_EXPORT_CPU` takes `avx2` alone (unset or empty: no cap); any
    /// other value is an error that names the variable and what it takes.
    #[test]
    fn the_cpu_setting_takes_avx2_alone() {
        use std::ffi::OsStr;
        assert_eq!(cpu_cap_from(None), Ok(false));
        assert_eq!(cpu_cap_from(Some(OsStr::new(""))), Ok(false));
        assert_eq!(cpu_cap_from(Some(OsStr::new("avx2"))), Ok(true));
        for bad in ["AVX2", "avx512", "none", " avx2"] {
            let e = cpu_cap_from(Some(OsStr::new(bad))).unwrap_err();
            assert!(
                e.contains("ANE_EXPORT_CPU") && e.contains(bad) && e.contains("avx2"),
                "{e}"
            );
        }
        // Unset in the tests' environment: the dispatch's answer is the CPU's.
        #[cfg(target_arch = "x86_64")]
        if std::env::var_os(CPU_VAR).is_none() {
            assert_eq!(avx512(), std::arch::is_x86_feature_detected!("avx512f"));
        }
    }

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
    pub(super) fn val(i: usize, s: usize) -> f32 {
        ((i * 2654435761 + s) % 1000) as f32 / 500.0 - 1.0
    }

    pub(super) type Product<'a> =
        &'a dyn Fn((usize, usize, usize), Rows, Rows, (*mut f32, usize), bool, bool);

    /// The shapes [`matches_a_plain_product`] tries by default: tails in
    /// every dimension (rows not a multiple of the task split, odd k and n).
    pub(super) const SHAPES: &[(usize, usize, usize, bool)] = &[
        (1, 1, 1, false),
        (7, 5, 3, true),
        (131, 67, 45, false),
        (257, 90, 61, true),
        (45, 263, 61, false),
        (90, 257, 45, true),
    ];

    /// `product` against a plain triple loop in f64 at `shapes` (m, n, k,
    /// accumulate), with row strides wider than the columns, split by rows
    /// and by columns (the flag `product` is given); with `fp16_a`, `a`'s
    /// values are fp16's (so that widening them is exact).
    pub(super) fn matches_a_plain_product(
        what: &str,
        shapes: &[(usize, usize, usize, bool)],
        fp16_a: bool,
        product: Product,
    ) {
        for &(m, n, k, accumulate) in shapes {
            let (lda, ldb, ldc) = (k + 3, n + 1, n + 2);
            let round = |v: f32| {
                if fp16_a {
                    half::f16::from_f32(v).to_f32()
                } else {
                    v
                }
            };
            let a: Vec<f32> = (0..m * lda).map(|i| round(val(i, 1))).collect();
            let b: Vec<f32> = (0..k * ldb).map(|i| val(i, 2)).collect();
            let c0: Vec<f32> = (0..m * ldc).map(|i| val(i, 3)).collect();
            for by_columns in [false, true] {
                let mut c = c0.clone();
                product(
                    (m, n, k),
                    (a.as_ptr(), lda),
                    (b.as_ptr(), ldb),
                    (c.as_mut_ptr(), ldc),
                    accumulate,
                    by_columns,
                );
                for i in 0..m {
                    for j in 0..ldc {
                        let got = c[i * ldc + j];
                        if j >= n {
                            assert_eq!(got, c0[i * ldc + j], "{what}: padding of row {i} written");
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
                            "{what}: {m}x{n}x{k} acc {accumulate} by columns {by_columns}: c[{i},{j}] = {got}, want {want}"
                        );
                    }
                }
            }
        }
    }

    /// What the Linears run (whichever backend this process opened), and
    /// the `gemm` crate.
    #[test]
    fn sgemm_matches_a_plain_product() {
        matches_a_plain_product(&backend(), SHAPES, false, &|d, a, b, c, acc, by_columns| {
            let product = if by_columns { sgemm_by_columns } else { sgemm };
            // SAFETY: the test's buffers hold their rows of their strides.
            unsafe { product(d, a, b, c, acc) }
        });
        matches_a_plain_product("the gemm crate", SHAPES, false, &|d, a, b, c, acc, _| {
            // SAFETY: as above.
            unsafe { gemm_crate(d, a, b, c, acc) }
        });
    }

    /// The serial product, plain and with `b` transposed, scaled, against
    /// a plain product in f64; the `gemm` crate's too.
    #[test]
    fn sgemm_serial_matches_a_plain_product() {
        type Serial = unsafe fn((usize, usize, usize), f32, Rows, (Rows, bool), (*mut f32, usize));
        let products: [(&str, Serial); 2] =
            [("backend", sgemm_serial), ("gemm crate", gemm_crate_serial)];
        for (what, product) in products {
            for &(m, n, k) in &[(1, 1, 1), (7, 5, 3), (131, 67, 64), (16, 257, 61)] {
                for transposed in [false, true] {
                    let (lda, ldc) = (k + 3, n + 2);
                    let ldb = if transposed { k + 1 } else { n + 1 };
                    let rows_b = if transposed { n } else { k };
                    let a: Vec<f32> = (0..m * lda).map(|i| val(i, 1)).collect();
                    let b: Vec<f32> = (0..rows_b * ldb).map(|i| val(i, 2)).collect();
                    let mut c: Vec<f32> = (0..m * ldc).map(|i| val(i, 3)).collect();
                    // SAFETY: the buffers hold their rows of their strides.
                    unsafe {
                        product(
                            (m, n, k),
                            0.125,
                            (a.as_ptr(), lda),
                            ((b.as_ptr(), ldb), transposed),
                            (c.as_mut_ptr(), ldc),
                        )
                    };
                    for i in 0..m {
                        for j in 0..n {
                            let mut want = 0f64;
                            for p in 0..k {
                                let bv = if transposed {
                                    b[j * ldb + p]
                                } else {
                                    b[p * ldb + j]
                                };
                                want += f64::from(a[i * lda + p]) * f64::from(bv);
                            }
                            want *= 0.125;
                            let got = f64::from(c[i * ldc + j]);
                            assert!(
                                (got - want).abs() <= 1e-6 * (k as f64).sqrt().max(1.0),
                                "{what} {m}x{n}x{k} transposed {transposed}: c[{i},{j}] = {got}, want {want}"
                            );
                        }
                    }
                }
            }
        }
    }

    /// The pinned OpenBLAS is in the checkout's venv (`make setup`), opens,
    /// names its version and kernels, and multiplies as a plain product.
    #[cfg(target_os = "linux")]
    #[test]
    fn the_pinned_openblas_opens_and_multiplies() {
        let path = pinned_library().unwrap();
        let lib = Library::open(&path).unwrap();
        assert!(
            lib.describe().starts_with("OpenBLAS 0.3.34"),
            "{}",
            lib.describe()
        );
        assert!(!lib.kernel().is_empty() && lib.kernel() != "unknown");
        matches_a_plain_product(
            &lib.describe(),
            SHAPES,
            false,
            &|d, a, b, c, acc, by_columns| {
                // SAFETY: as above.
                unsafe { lib.sgemm(d, a, b, c, acc, by_columns) }
            },
        );
        if std::env::var_os(LIBRARY_VAR).is_none() {
            assert_eq!(backend(), lib.describe(), "the process's own backend");
        }
    }

    /// A file that is no shared library, and one without CBLAS, are
    /// refused by name.
    #[cfg(target_os = "linux")]
    #[test]
    fn opening_what_is_not_a_blas_names_the_file() {
        let e = Library::open(std::path::Path::new("Cargo.toml"))
            .err()
            .unwrap();
        assert!(e.starts_with("Cargo.toml: "), "{e}");
        let e = Library::open(std::path::Path::new("libm.so.6"))
            .err()
            .unwrap();
        assert_eq!(
            e,
            "libm.so.6: exports neither cblas_sgemm nor scipy_cblas_sgemm"
        );
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
