//! GFLOP/s of `ane_export::blas::sgemm` (what the towers' Linears run) and
//! of the `gemm` crate on the same operands, at the Linear shapes of the
//! benchmarked towers and at 4096 x 4096 x 4096, and of
//! `ane_export::blas::sgemm_f16a` (the interpreter's 1x1 convolution on
//! fp16 weights) at the convolutions' shapes; one JSON line per shape and
//! backend, best of `--reps` (default 5). Run by
//! `python/bench/bench_matmul.py`, next to numpy's sgemm.
//!
//!     cargo run --release --example matmul_rate -- [--reps N]

use std::time::Instant;

type Product = unsafe fn(
    (usize, usize, usize),
    (*const f32, usize),
    (*const f32, usize),
    (*mut f32, usize),
    bool,
);

fn main() {
    let mut args = std::env::args().skip(1);
    let mut reps = 5usize;
    while let Some(a) = args.next() {
        match (a.as_str(), args.next().and_then(|v| v.parse().ok())) {
            ("--reps", Some(n)) if n > 0 => reps = n,
            _ => {
                eprintln!("usage: matmul_rate [--reps N]");
                std::process::exit(2);
            }
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
    ];
    let backends: [(&str, Product); 2] = [
        (ane_export::blas::backend(), ane_export::blas::sgemm),
        ("the gemm crate", ane_export::blas::gemm_crate),
    ];
    for (name, m, k, n) in shapes {
        let a: Vec<f32> = (0..m * k).map(|i| (i % 13) as f32 * 0.05 - 0.3).collect();
        let b: Vec<f32> = (0..k * n).map(|i| (i % 7) as f32 * 0.05 - 0.15).collect();
        for (backend, f) in backends {
            let mut c = vec![0f32; m * n];
            let mut best = f64::MAX;
            for _ in 0..reps {
                let t = Instant::now();
                // SAFETY: a is [m, k], b [k, n] and c [m, n], contiguous.
                unsafe {
                    f(
                        (m, n, k),
                        (a.as_ptr(), k),
                        (b.as_ptr(), n),
                        (c.as_mut_ptr(), n),
                        false,
                    )
                };
                best = best.min(t.elapsed().as_secs_f64());
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
        let backend = format!("{} on fp16 weights", ane_export::blas::backend());
        report(name, (m, k, n), &backend, best);
    }
}

/// One JSON line: the product's shape, its backend and its rate at `best` seconds.
fn report(name: &str, (m, k, n): (usize, usize, usize), backend: &str, best: f64) {
    let gflops = 2.0 * (m * n * k) as f64 / best / 1e9;
    println!(
        "{{\"shape\": \"{name}\", \"m\": {m}, \"k\": {k}, \"n\": {n}, \"backend\": \"{backend}\", \"gflops\": {gflops:.1}}}"
    );
}
