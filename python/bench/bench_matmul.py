#!/usr/bin/env python3
"""Matrix products: what the towers' Linears run against the machine's rate.

    .venv-dev/bin/python python/bench/bench_matmul.py [--rounds 3] [--out BENCHMARKS.md]

In each round, one after the other on the same machine: numpy's sgemm of
4096 x 4096 (OpenBLAS, best of 5, OPENBLAS_CORETYPE and OPENBLAS_L2_SIZE unset
for that command alone: the matmul rate every other benchmark reports
against), then `examples/matmul_rate.rs`, which times `ane_export::blas::sgemm`
(the backend the reference's Linear and the interpreter's 1x1 convolution
use) and the `gemm` crate on the same operands, at 4096^3 and at the Linear
shapes of the benchmarked towers. Reports each backend's best over the rounds
and its fraction of numpy's best. Prints a markdown section and appends it to
--out.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import shlex
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_qwen25 as q25  # noqa: E402
import bench_tower as bt  # noqa: E402

ROOT = bt.ROOT


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    subprocess.run(["cargo", "build", "--release", "--locked", "--example", "matmul_rate"], cwd=ROOT, check=True,
                   capture_output=True)
    example = ROOT / "target" / "release" / "examples" / "matmul_rate"
    work = Path(tempfile.mkdtemp(prefix="bench-matmul-"))
    env = bt.child_env(args.threads)
    numpy_best, blas_info, best = 0.0, None, {}
    for k in range(args.rounds):
        peak = q25.matmul_rate(args.threads, work)
        numpy_best, blas_info = max(numpy_best, peak["gflops"]), peak["blas"]
        p = subprocess.run([str(example), "--reps", "3"], capture_output=True, text=True, env=env, check=True)
        for line in p.stdout.splitlines():
            r = json.loads(line)
            key = (r["shape"], r["m"], r["k"], r["n"], r["backend"])
            best[key] = max(best.get(key, 0.0), r["gflops"])
        print(f"round {k + 1}/{args.rounds}: numpy {peak['gflops']:.0f} GFLOP/s", flush=True)

    stamp = dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")
    L = [f"### Matrix products: the towers' Linears against the matmul rate ({stamp})", "",
         f"- command: `.venv-dev/bin/python python/bench/bench_matmul.py {shlex.join(bt._rel(a) for a in sys.argv[1:])}`",
         bt.machine_line(args.threads, numpy_best, ROOT / "target/release/ane-export", blas_info),
         f"- the matmul rate: numpy sgemm 4096, best of 5 per round, best of {args.rounds} rounds: "
         f"**{numpy_best:.0f} GFLOP/s** ({blas_info})",
         f"- `ane_export::blas::sgemm` and the gemm crate: best of 3 per round, best of {args.rounds} rounds, "
         "interleaved with numpy's", "",
         "| product | m x k x n | backend | GFLOP/s | of the matmul rate |", "|---|---|---|---|---|"]
    for (shape, m, k, n, backend), g in best.items():
        L.append(f"| {shape} | {m} x {k} x {n} | {backend} | {g:.0f} | {g / numpy_best * 100:.0f}% |")
    bt.emit(L, args.out)


if __name__ == "__main__":
    main()
