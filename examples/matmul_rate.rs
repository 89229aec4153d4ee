//! GFLOP/s of the candidates for the towers' Linears on the same operands,
//! side by side: `ane_export::blas::sgemm` (what they run: the pinned
//! OpenBLAS on Linux), each library given with `--library PATH` (another
//! CBLAS opened the same way, e.g. Debian's `libopenblas.so.0`; its kernels
//! chosen by the environment as it is), and the `gemm` crate; at the Linear
//! shapes of the benchmarked towers and at 4096 x 4096 x 4096; and
//! `ane_export::blas::sgemm_f16a` (the interpreter's 1x1 convolution on fp16
//! weights) at the convolutions' shapes; and the interpreter's attention
//! scores (`q^T k` of one head at 4096 patches of the 2B-shaped tower, in
//! tiles of 256 queries over the threads, as its chains run them) by the
//! `gemm` crate (`k` packed per tile) and by the exact kernel (`k` packed
//! once per head, the packing timed with them). Every product is checked against
//! the first backend's on the same operands (a relative difference over
//! 1e-4 exits 1). One JSON line per shape and backend, best of `--reps`
//! (default 5). Run by `python/bench/bench_matmul.py`, next to numpy's
//! sgemm.
//!
//!     cargo run --release --example matmul_rate -- [--reps N] [--library PATH]... [--quick]

use std::time::Instant;

type Product = unsafe fn(
    (usize, usize, usize),
    (*const f32, usize),
    (*const f32, usize),
    (*mut f32, usize),
    bool,
);

/// A candidate: one of the crate's products, or a library opened by path.
enum Backend {
    Product(Product),
    #[cfg(target_os = "linux")]
    Library(&'static ane_export::blas::Library),
    /// The interpreter's exact kernel (`blas::exact`).
    Exact,
}

impl Backend {
    /// `c = a · b`.
    ///
    /// # Safety
    /// As `ane_export::blas::sgemm`.
    unsafe fn run(
        &self,
        dims: (usize, usize, usize),
        a: (*const f32, usize),
        b: (*const f32, usize),
        c: (*mut f32, usize),
    ) {
        // SAFETY: forwarded from the caller.
        unsafe {
            match self {
                Backend::Product(f) => f(dims, a, b, c, false),
                #[cfg(target_os = "linux")]
                Backend::Library(l) => l.sgemm(dims, a, b, c, false, false),
                Backend::Exact => ane_export::blas::exact::sgemm(
                    dims,
                    ane_export::blas::exact::Left::F32(a.0, a.1),
                    b,
                    c,
                    false,
                ),
            }
        }
    }
}

fn usage() -> ! {
    eprintln!("usage: matmul_rate [--reps N] [--library PATH]... [--quick]");
    std::process::exit(2);
}

/// Exit 1 unless `got` is `want` within a relative 1e-4 of its largest magnitude.
fn check(shape: &str, backend: &str, want: &[f32], got: &[f32]) {
    let scale = want.iter().fold(0f32, |m, v| m.max(v.abs())).max(1e-30);
    let worst = want
        .iter()
        .zip(got)
        .map(|(w, g)| (w - g).abs())
        .fold(
            0f32,
            |m, d| if d.is_nan() { f32::INFINITY } else { m.max(d) },
        );
    if worst / scale > 1e-4 {
        eprintln!("matmul_rate: {backend} differs at {shape}: {worst} of {scale}");
        std::process::exit(1);
    }
}

fn main() {
    let mut args = std::env::args().skip(1);
    let mut reps = 5usize;
    let mut quick = false;
    #[cfg_attr(not(target_os = "linux"), allow(unused_mut))]
    let mut libraries: Vec<(String, Backend)> = Vec::new();
    while let Some(a) = args.next() {
        match a.as_str() {
            "--quick" => quick = true,
            "--reps" => match args.next().and_then(|v| v.parse().ok()) {
                Some(n) if n > 0 => reps = n,
                _ => usage(),
            },
            #[cfg(target_os = "linux")]
            "--library" => {
                let Some(p) = args.next() else { usage() };
                match ane_export::blas::Library::open(std::path::Path::new(&p)) {
                    Ok(l) => {
                        let name = format!("{}, kernels {}", l.describe(), l.kernel());
                        libraries.push((name, Backend::Library(Box::leak(Box::new(l)))));
                    }
                    Err(e) => {
                        eprintln!("matmul_rate: {e}");
                        std::process::exit(2);
                    }
                }
            }
            _ => usage(),
        }
    }
    // (m, k, n): tokens x width -> out, as the reference's Linear (x W^T),
    // then the interpreter's layout.
    let shapes = [
        ("square 4096", 4096, 4096, 4096),
        ("Qwen2.5-VL-7B qkv, 4096 tokens", 4096, 1280, 3840),
        ("Qwen2.5-VL-7B MLP up, 4096 tokens", 4096, 1280, 3420),
        ("Qwen2.5-VL-7B MLP down, 4096 tokens", 4096, 3420, 1280),
        ("Qwen2.5-VL-7B MLP up, 1024 tokens", 1024, 1280, 3420),
        ("Qwen3-VL-2B MLP up, 4096 tokens", 4096, 1024, 4096),
        // The interpreter's 1x1 conv: W [out, in] times x [in, tokens].
        (
            "Qwen2.5-VL-7B qkv as 1x1 conv, 4096 tokens",
            3840,
            1280,
            4096,
        ),
        (
            "Qwen2.5-VL-7B MLP up as 1x1 conv, 4096 tokens",
            3420,
            1280,
            4096,
        ),
        (
            "Qwen2.5-VL-7B MLP down as 1x1 conv, 4096 tokens",
            1280,
            3420,
            4096,
        ),
        (
            "Qwen2.5-VL-7B proj as 1x1 conv, 4096 tokens",
            1280,
            1280,
            4096,
        ),
        // A 2B-shaped Qwen3-VL merger over a 308-patch image (77 merged
        // tokens), and a block's MLP up over its 308 patches.
        (
            "Qwen3-VL-2B merger fc1 as 1x1 conv, 77 tokens",
            4096,
            4096,
            77,
        ),
        (
            "Qwen3-VL-2B merger fc2 as 1x1 conv, 77 tokens",
            2048,
            4096,
            77,
        ),
        (
            "Qwen3-VL-2B MLP up as 1x1 conv, 308 tokens",
            4096,
            1024,
            308,
        ),
        // The 2B-shaped tower's block at 1024 and 4096 patches, as the
        // interpreter multiplies it.
        ("Qwen3-VL-2B qkv as 1x1 conv, 4096 tokens", 3072, 1024, 4096),
        (
            "Qwen3-VL-2B MLP up as 1x1 conv, 4096 tokens",
            4096,
            1024,
            4096,
        ),
        (
            "Qwen3-VL-2B MLP down as 1x1 conv, 4096 tokens",
            1024,
            4096,
            4096,
        ),
        (
            "Qwen3-VL-2B MLP up as 1x1 conv, 1024 tokens",
            4096,
            1024,
            1024,
        ),
        (
            "Qwen3-VL-2B MLP down as 1x1 conv, 1024 tokens",
            1024,
            4096,
            1024,
        ),
    ];
    let mut backends = vec![(
        format!(
            "{}, kernels {}",
            ane_export::blas::backend(),
            ane_export::blas::kernel()
        ),
        Backend::Product(ane_export::blas::sgemm),
    )];
    backends.extend(libraries);
    backends.push((
        "the gemm crate".to_string(),
        Backend::Product(ane_export::blas::gemm_crate),
    ));
    let exact = ane_export::blas::exact::available();
    if exact {
        backends.push(("the exact kernel".to_string(), Backend::Exact));
    }
    let shapes: Vec<_> = if quick {
        shapes
            .into_iter()
            .filter(|s| s.0.contains("square") || s.0.contains("Qwen3-VL-2B"))
            .collect()
    } else {
        shapes.to_vec()
    };
    for (name, m, k, n) in shapes {
        let a: Vec<f32> = (0..m * k).map(|i| (i % 13) as f32 * 0.05 - 0.3).collect();
        let b: Vec<f32> = (0..k * n).map(|i| (i % 7) as f32 * 0.05 - 0.15).collect();
        let mut first: Option<Vec<f32>> = None;
        for (backend, f) in &backends {
            let mut c = vec![0f32; m * n];
            let mut best = f64::MAX;
            for _ in 0..reps {
                let t = Instant::now();
                // SAFETY: a is [m, k], b [k, n] and c [m, n], contiguous.
                unsafe {
                    f.run(
                        (m, n, k),
                        (a.as_ptr(), k),
                        (b.as_ptr(), n),
                        (c.as_mut_ptr(), n),
                    )
                };
                best = best.min(t.elapsed().as_secs_f64());
            }
            match &first {
                None => first = Some(c),
                Some(want) => check(name, backend, want, &c),
            }
            report(name, (m, k, n), backend, best);
        }
        if !name.contains("1x1 conv") {
            continue;
        }
        let a16: Vec<half::f16> = a.iter().map(|&v| half::f16::from_f32(v)).collect();
        let mut c = vec![0f32; m * n];
        let mut best = f64::MAX;
        for _ in 0..reps {
            let t = Instant::now();
            // SAFETY: a16 holds [m, k], b [k, n] and c [m, n], contiguous.
            unsafe {
                ane_export::blas::sgemm_f16a(
                    (m, n, k),
                    &a16,
                    (b.as_ptr(), n),
                    (c.as_mut_ptr(), n),
                    false,
                )
            };
            best = best.min(t.elapsed().as_secs_f64());
        }
        let backend = format!("{} on fp16 weights", backends[0].0);
        report(name, (m, k, n), &backend, best);
        if exact {
            let mut best = f64::MAX;
            for _ in 0..reps {
                let t = Instant::now();
                // SAFETY: a16 holds [m, k], b [k, n] and c [m, n], contiguous.
                unsafe {
                    ane_export::blas::exact::sgemm(
                        (m, n, k),
                        ane_export::blas::exact::Left::F16(&a16),
                        (b.as_ptr(), n),
                        (c.as_mut_ptr(), n),
                        false,
                    )
                };
                best = best.min(t.elapsed().as_secs_f64());
            }
            report(name, (m, k, n), "the exact kernel on fp16 weights", best);
        }
    }
    if exact {
        attention_scores(reps);
    }
}

/// One head's attention scores as the interpreter's chains compute them:
/// `s [t, nk] = q^T · k` for tiles of `t` queries of `q [hd, nq]` (column
/// stride 1), `k [hd, nk]`, each tile one rayon task on one thread; by the
/// `gemm` crate and by the exact kernel on `k` packed once (the packing
/// inside the timing). The two give the same bits (checked).
fn attention_scores(reps: usize) {
    use ane_export::blas::exact;
    use rayon::prelude::*;
    let (hd, nq, nk) = (64usize, 4096usize, 4096usize);
    let t = 256usize;
    let name =
        "Qwen3-VL-2B attention scores q^T k, one head at 4096 patches (tiles of 256 queries)";
    let q: Vec<f32> = (0..hd * nq)
        .map(|i| (i % 11) as f32 * 0.07 - 0.35)
        .collect();
    let k: Vec<f32> = (0..hd * nk).map(|i| (i % 5) as f32 * 0.09 - 0.2).collect();
    #[derive(Clone, Copy)]
    struct Ptr(*mut f32);
    // SAFETY: each tile writes its own rows.
    unsafe impl Send for Ptr {}
    unsafe impl Sync for Ptr {}
    impl Ptr {
        fn get(&self) -> *mut f32 {
            self.0
        }
    }
    let run = |packed: bool, s: &mut [f32]| {
        let out = Ptr(s.as_mut_ptr());
        // SAFETY: k holds hd rows of nk.
        let kp = packed.then(|| unsafe { exact::PackedB::new((k.as_ptr(), nk), (hd, nk)) });
        (0..nq / t).into_par_iter().for_each(|tile| {
            // SAFETY: tile's rows of s [nq, nk]; q's columns tile * t.., k whole.
            unsafe {
                let dst = out.get().add(tile * t * nk);
                match &kp {
                    Some(kp) => exact::sgemm_packed_serial(
                        t,
                        (q.as_ptr().add(tile * t), nq),
                        kp,
                        (0, nk),
                        (dst, nk),
                    ),
                    None => gemm::gemm(
                        t,
                        nk,
                        hd,
                        dst,
                        1,
                        nk as isize,
                        false,
                        q.as_ptr().add(tile * t),
                        nq as isize,
                        1,
                        k.as_ptr(),
                        1,
                        nk as isize,
                        1.0,
                        1.0,
                        false,
                        false,
                        false,
                        gemm::Parallelism::None,
                    ),
                }
            }
        });
    };
    // The two in turn, rep by rep, so that a busy host's slow spells fall on both.
    let backends = [
        ("the gemm crate, k packed per tile", false),
        ("the exact kernel, k packed once", true),
    ];
    let mut out = [vec![0f32; nq * nk], vec![0f32; nq * nk]];
    let mut best = [f64::MAX; 2];
    for _ in 0..reps {
        for (i, &(_, packed)) in backends.iter().enumerate() {
            let t0 = Instant::now();
            run(packed, &mut out[i]);
            best[i] = best[i].min(t0.elapsed().as_secs_f64());
        }
    }
    if out[0]
        .iter()
        .zip(&out[1])
        .any(|(a, b)| a.to_bits() != b.to_bits())
    {
        eprintln!("matmul_rate: the exact kernel differs from gemm's bits at {name}");
        std::process::exit(1);
    }
    for ((backend, _), best) in backends.iter().zip(best) {
        report(name, (nq, hd, nk), backend, best);
    }
}

/// One JSON line: the product's shape, its backend and its rate at `best` seconds.
fn report(name: &str, (m, k, n): (usize, usize, usize), backend: &str, best: f64) {
    let gflops = 2.0 * (m * n * k) as f64 / best / 1e9;
    println!(
        "{{\"shape\": \"{name}\", \"m\": {m}, \"k\": {k}, \"n\": {n}, \"backend\": \"{backend}\", \"gflops\": {gflops:.1}}}"
    );
}
