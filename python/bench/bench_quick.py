#!/usr/bin/env python3
"""The matmul-rate table and the 2B-shaped tower against it, in one run (`make bench-quick`).

    .venv-dev/bin/python python/bench/bench_quick.py [--work DIR] [--threads 2] [--tower] [--default-set]
        [--rounds 1] [--cpu avx2] [--bin target/release/ane-export] [--run-bin target/release/ane-run]
        [--out BENCHMARKS.md]

One after the other on the same machine, each figure as a fraction of the
matmul rate, the fastest of its measurements across the run:
1. the matmul rate: numpy's sgemm of 4096 x 4096 (its bundled OpenBLAS, best
   of 5, OPENBLAS_CORETYPE and OPENBLAS_L2_SIZE unset for that command alone),
   measured first, after the table, after each round of 3. and at the end (on
   a shared host it moves: 130 GFLOP/s at the start of a run on 2026-12-07
   and 158 by hand right after it); every measurement is reported, and each
   fraction is of the fastest, which is the stricter reading;
2. the candidates for the towers' Linears side by side on the same operands
   (`examples/matmul_rate --quick`): what the project runs (`blas::sgemm`),
   Debian's system OpenBLAS where it is installed (`--library`, opened as it
   would be linked: under the environment's OPENBLAS_* variables), and the
   `gemm` crate, at 4096^3 and the 2B-shaped tower's shapes;
3. with --tower, the 2B-shaped Qwen3-VL tower (bench_tower.py's random
   checkpoint, its artifact built once in --work): the fp32 reference (`reference
   --pixel-values`, its forward) and the interpreter (`exec --runs 2`, the
   second run) in fp32 and fp16 at 1024 and 4096 patches, in GFLOP/s (the
   weights' products and the attention's, bench_build.tower_flops);
4. the whole gate (`gate --skip vqa`, the interpreter in its default ane mode) on the eight
   natural golden images (`--images`: the cases other work adds to the
   default set do not move it) and, with --default-set, on the default set
   too: wall seconds and peak RSS against the fp16 weights.
With --rounds N, each figure of 3. and 4. is the fastest of N rounds, the
rounds taken in turn (every measurement of round 1, then of round 2, ...),
with the rounds' spread beside it (the tower's slowest over its fastest,
every gate round's wall seconds): the matmul rate is a best of 5
and the table a best of 3, so that a single run on a shared host, slowed by
its neighbours, is not set against a best (on a family-25 EPYC on
2026-12-07, one binary's `exec` at 4096 patches took 38.6 s in one run and
53.4 s two runs later).
With --compare-simd, every interpreter figure (3. and 4.) is measured twice in
turn, the second time with ANE_EXPORT_SIMD=none (the attention chain without
its vector path: portable stages, gemm's product with V, no dead keys and no
packed query rows, as AVX2 CPUs ran it before they had one), with the ratio.
With --cpu avx2, the project runs as on a CPU with at most AVX2 (every
command under ANE_EXPORT_CPU=avx2: its own kernels' AVX2 paths, OpenBLAS's
Haswell kernels; the table's example under OPENBLAS_CORETYPE=Haswell), and
numpy's rate is measured each time under OPENBLAS_CORETYPE=Haswell as well
(the kernels an AVX2 CPU's numpy gets), each fraction of the fastest of
all: the AVX2 paths measured on an AVX-512 host. The `gemm` crate chooses
its own kernels and keeps AVX-512 where the CPU has it (the fp32
reference's attention products); the CPU's caches and clocks stay its own.
Without the options it is `make bench-quick`: in the run BENCHMARKS.md
records (2-core AMD EPYC of family 23, artifact already in --work) the rate
and the table took under a minute and the gate 6.6 minutes. `make bench`
runs it with both options and --rounds 3.
Prints a markdown section and appends it to --out.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_build as bb  # noqa: E402
import bench_qwen25 as q25  # noqa: E402
import bench_tower as bt  # noqa: E402

ROOT = bt.ROOT
DEBIAN_OPENBLAS = Path("/usr/lib/x86_64-linux-gnu/libopenblas.so.0")


def resolve(p: str) -> Path:
    b = Path(p)
    for c in ([b] if b.is_absolute() else [Path.cwd() / b, ROOT / b]):
        if c.is_file():
            return c.resolve()
    raise SystemExit(f"not found: {p} (make build)")


class Rates:
    """numpy's matmul rate, measured again at each call of `measure` (with
    the variables unset, and under each of `coretypes` too); every fraction
    in the report is of the fastest of all (`best`)."""

    def __init__(self, threads: int, work: Path, coretypes: tuple[str, ...] = ()):
        self.threads, self.work, self.seen, self.coretypes = threads, work, [], coretypes

    def measure(self, when: str) -> None:
        for core in (None,) + self.coretypes:
            r = q25.matmul_rate(self.threads, self.work, core)
            label = when + (f", OPENBLAS_CORETYPE={core}" if core else "")
            self.seen.append((label, {**r, "coretype": core}))
            print(f"matmul rate {label}: {r['gflops']:.0f} GFLOP/s", flush=True)

    def best(self) -> dict:
        return max((r for _, r in self.seen), key=lambda r: r["gflops"])

    def best_unset(self) -> dict:
        """The fastest with the variables unset: the machine line's rate."""
        return max((r for _, r in self.seen if not r["coretype"]), key=lambda r: r["gflops"])

    def line(self) -> str:
        return ("numpy's matmul rate, each measurement in turn: " + ", ".join(
            f"{r['gflops']:.0f} ({when})" for when, r in self.seen)
            + f" GFLOP/s; every fraction below is of the fastest, {self.best()['gflops']:.0f}")


def matmul_table(threads: int, work: Path, coretype: str | None = None) -> list[dict]:
    """`matmul_rate --quick`; with `coretype`, OpenBLAS's kernels of that name
    (the example opens the library as the environment says)."""
    subprocess.run(["cargo", "build", "--release", "--locked", "--example", "matmul_rate"], cwd=ROOT, check=True,
                   capture_output=True)
    cmd = [str(ROOT / "target/release/examples/matmul_rate"), "--quick", "--reps", "3"]
    if DEBIAN_OPENBLAS.is_file():
        cmd += ["--library", str(DEBIAN_OPENBLAS)]
    env = bt.child_env(threads)
    if coretype:
        env["OPENBLAS_CORETYPE"] = coretype
    r = bt.run_measured(cmd, env, work / "matmul-table")
    return [json.loads(line) for line in r["stdout"].splitlines()]


def matmul_lines(rows: list[dict], rate: float) -> list[str]:
    L = ["| product | m x k x n | backend | GFLOP/s | of the matmul rate |", "|---|---|---|---|---|"]
    for x in rows:
        L.append(f"| {x['shape']} | {x['m']} x {x['k']} x {x['n']} | {x['backend']} | {x['gflops']:.0f} | "
                 f"{x['gflops'] / rate:.0%} |")
    return L


# The baseline of --compare-simd: the chain without its vector path.
BASELINE = {"ANE_EXPORT_SIMD": "none"}


def tower_rows(binary: Path, run_bin: Path, work: Path, ckpt: Path, art: Path, threads: int, rates: Rates,
               compare: bool = False, rounds: int = 1):
    """Runs the tower's rounds (numpy's rate measured after each); returns
    its table as a function of the rate, formatted once every rate is in."""
    import numpy as np
    from PIL import Image

    env = bt.child_env(threads)
    prepared = []
    for n in (1024, 4096):
        pv = work / f"pv{n}.safetensors"
        if not pv.is_file():
            bt.child_call(bt.__file__, "write_inputs", path=str(pv), n=n, seed=0)
        ref = bt.run_rust(binary, ckpt, pv, work / f"ref{n}.safetensors", argparse.Namespace(threads=threads),
                          work / f"ref{n}")
        side = bt.math.isqrt(n) * 16
        img = work / f"img{n}.png"
        Image.fromarray(np.random.default_rng(n).integers(0, 256, (side, side, 3), dtype=np.uint8)).save(img)
        bucket = "b1024" if n <= 1024 else "b4096"
        hi = work / f"hi{n}.safetensors"
        bt.run_measured([str(run_bin), "host-inputs", "--artifact", str(art), "--bucket", bucket, "--image", str(img),
                         "--out", str(hi)], env, work / f"hi{n}")
        prepared.append((n, pv, hi, bucket))
    keys = ["reference", "fp32", "fp16"] + (["fp32 none", "fp16 none"] if compare else [])
    # Every figure's seconds, round by round, the rounds in turn.
    seen = {n: {k: [] for k in keys} for n, *_ in prepared}
    for r in range(rounds):
        for n, pv, hi, bucket in prepared:
            row = seen[n]
            ref = bt.run_rust(binary, ckpt, pv, work / f"ref{n}.safetensors", argparse.Namespace(threads=threads),
                              work / f"ref{n}")
            row["reference"].append(ref["forward_s"])
            for prec in ("fp32", "fp16"):
                for key, extra in [(prec, {})] + ([(prec + " none", BASELINE)] if compare else []):
                    e = bt.run_measured([str(binary), "exec", str(art / "art.mlpackage"), "--function", bucket,
                                         "--inputs", str(hi), "--out", str(work / f"exec{n}{prec}.safetensors"),
                                         "--precision", prec, "--runs", "2"], {**env, **extra},
                                        work / f"exec{n}{prec}")
                    runs = bb.RUNS_RE.search(e["stderr"])
                    row[key].append(float(runs.group(1).split(",")[-1]))
            print(f"round {r + 1}, {n} patches: " + ", ".join(f"{k} {row[k][-1]:.1f} s" for k in keys), flush=True)
        rates.measure(f"after the tower's round {r + 1}")
    rows = []
    for n, *_ in prepared:
        row = {"patches": n, **{k: min(v) for k, v in seen[n].items()}}
        row["spread"] = {k: max(v) / min(v) for k, v in seen[n].items()}
        rows.append((row, bb.tower_flops(n) / 1e9))
    return lambda rate: tower_lines(rows, keys, rate, compare, rounds)


def tower_lines(rows, keys, rate: float, compare: bool, rounds: int) -> list[str]:
    names = {"fp32": "interpreter fp32", "fp32 none": "fp32, SIMD none", "fp16 none": "fp16, SIMD none"}
    head = ["patches", "GFLOP per forward"]
    for k in keys:
        head += [f"{names.get(k, k)} s", "GFLOP/s", "of the rate"]
    L = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for row, g in rows:
        cells = [f"{row['patches']}", f"{g:.0f}"]
        for k in keys:
            cells += [f"{row[k]:.2f}", f"{g / row[k]:.0f}", f"{g / row[k] / rate:.0%}"]
        L.append("| " + " | ".join(cells) + " |")
    if rounds > 1:
        L += ["", f"The fastest of {rounds} rounds each; the slowest over the fastest: " + "; ".join(
            f"{row['patches']} patches " + ", ".join(f"{names.get(k, k)} {row['spread'][k]:.2f}x" for k in keys)
            for row, _ in rows)]
    if compare:
        L += ["", "Interpreter seconds, ANE_EXPORT_SIMD=none over the default path: " + "; ".join(
            f"{row['patches']} patches fp32 {row['fp32 none'] / row['fp32']:.2f}x, "
            f"fp16 {row['fp16 none'] / row['fp16']:.2f}x" for row, _ in rows)]
    return L


def gate_rows(binary: Path, art: Path, ckpt: Path, work: Path, threads: int, weights_mb: float, default_set: bool,
              compare: bool = False, rounds: int = 1):
    import bench_gate_memory as gm

    images = work / "images"
    images.mkdir(exist_ok=True)
    for name in bt.NATURAL_IMAGES:
        shutil.copy(ROOT / "golden" / "images" / name, images / name)
    sets = [("the eight natural golden images (`--images`)", ["--images", str(images)])]
    if default_set:
        sets.append(("the default set (natural and stress images)", []))
    L = ["| cases | path | wall s | peak RSS MB | peak RSS / fp16 weights | cosine gate | lowest cosine | split |",
         "|---|---|---|---|---|---|---|---|"]
    paths = [("default", {})] + ([("ANE_EXPORT_SIMD=none", BASELINE)] if compare else [])
    # Each (set, path)'s runs, the rounds in turn; the fastest is reported.
    seen: dict[tuple[str, str], list[tuple[dict, dict]]] = {(label, p): [] for label, _ in sets for p, _ in paths}
    for r in range(rounds):
        for label, extra in sets:
            for path, env in paths:
                m = bt.run_measured([str(binary), "gate", str(art), "--model", str(ckpt), "--skip", "vqa", "--json"]
                                    + extra, {**bt.child_env(threads), **env}, work / f"gate{len(extra)}")
                seen[(label, path)].append((m, json.loads(m["stdout"])))
                print(f"round {r + 1}, gate on {label}, {path}: {m['wall_s']:.1f} s, {m['rss_mb']:.0f} MB", flush=True)
    ratios, spreads = [], []
    for label, _ in sets:
        walls = []
        for path, _ in paths:
            runs = seen[(label, path)]
            m, rep = min(runs, key=lambda x: x[0]["wall_s"])
            L.append(f"| {label} | {path} | {m['wall_s']:.1f} | {m['rss_mb']:.0f} | {m['rss_mb'] / weights_mb:.2f}x | "
                     f"{rep['gates']['cosine']['status']} | {gm.lowest_cosine(rep):.6f} | {gm.split(rep)} |")
            walls.append(m["wall_s"])
            if rounds > 1:
                w = [x[0]["wall_s"] for x in runs]
                spreads.append(f"{label}, {path}: " + ", ".join(f"{x:.1f}" for x in w) + " s")
        if compare:
            ratios.append(f"{label}: {walls[1] / walls[0]:.2f}x")
    if spreads:
        L += ["", f"The fastest of {rounds} rounds each (its report's split and cosines); every round's wall: "
              + "; ".join(spreads)]
    if ratios:
        L += ["", "Gate wall seconds, ANE_EXPORT_SIMD=none over the default path: " + "; ".join(ratios)]
    return L


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bin", default="target/release/ane-export")
    ap.add_argument("--run-bin", default="target/release/ane-run")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--work", type=Path, help="keeps the checkpoint and the artifact between runs")
    ap.add_argument("--tower", action="store_true", help="the tower's reference and interpreter at 1024 and 4096 patches")
    ap.add_argument("--default-set", action="store_true", help="the gate on the default set too")
    ap.add_argument("--compare-simd", action="store_true",
                    help="each interpreter figure again with ANE_EXPORT_SIMD=none, side by side")
    ap.add_argument("--rounds", type=int, default=1,
                    help="each tower and gate figure the fastest of this many rounds, taken in turn")
    ap.add_argument("--cpu", choices=["avx2"],
                    help="run the project as on a CPU with at most AVX2 (ANE_EXPORT_CPU=avx2; OpenBLAS's Haswell "
                         "kernels), numpy's rate measured under OPENBLAS_CORETYPE=Haswell too")
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    if args.cpu:
        # Every child of the project's binaries inherits it; numpy ignores it.
        os.environ["ANE_EXPORT_CPU"] = args.cpu
    if args.rounds < 1:
        ap.error("--rounds: at least 1")
    binary, run_bin = resolve(args.bin), resolve(args.run_bin)
    work = (args.work or Path(os.environ.get("TMPDIR", "/tmp")) / "ane-export-bench-quick").resolve()
    work.mkdir(parents=True, exist_ok=True)
    ckpt, art = work / "qwen3vl-2b-vision-random", work / "art"
    if not (ckpt / "model.safetensors").is_file():
        bt.child_call(bt.__file__, "write_checkpoint", d=str(ckpt), seed=0)
    if not (art / "manifest.json").is_file():
        # Residual scale 1: a random checkpoint has no massive activations, and
        # calibrating on the gate's images would add two minutes to a first run.
        bt.run_measured([str(binary), "build", "--model", str(ckpt), "--out", str(art), "--force",
                         "--residual-scale", "1"],
                        bt.child_env(args.threads), work / "build")
    weights_mb = sum(f.stat().st_size for f in art.rglob("weight.bin")) / 2**20

    haswell = "Haswell" if args.cpu == "avx2" else None
    rates = Rates(args.threads, work, (haswell,) if haswell else ())
    rates.measure("first")
    mm = matmul_table(args.threads, work, haswell)
    rates.measure("after the table")
    compare = args.compare_simd
    rounds = args.rounds
    tower = tower_rows(binary, run_bin, work, ckpt, art, args.threads, rates, compare, rounds) if args.tower else None
    gate = gate_rows(binary, art, ckpt, work, args.threads, weights_mb, args.default_set, compare, rounds)
    rates.measure("at the end")
    rate = rates.best()["gflops"]
    unset = rates.best_unset()

    stamp = dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")
    L = [f"### The matmul rate, the 2B-shaped tower and its gate, one run ({stamp})", "",
         f"- command: `{shlex.join([bt._rel(sys.executable)] + sys.argv)}`",
         bt.machine_line(args.threads, unset["gflops"], binary, unset["blas"]),
         f"- artifact: the 2B-shaped Qwen3-VL tower (bench_tower.py's random checkpoint), buckets b1024 and b4096, "
         f"fp16 weights {weights_mb:.0f} MB",
         f"- {rates.line()}", "",
         "Matrix products (best of 3 each"
         + ("; OPENBLAS_CORETYPE=Haswell for the example, the `gemm` crate's rows in its own choice of kernels, "
            "AVX-512 where the CPU has it" if haswell else "") + "):", ""] + matmul_lines(mm, rate)
    if tower:
        each = "one forward each" if rounds == 1 else f"the fastest forward of {rounds} rounds each"
        L += ["", f"The tower ({each}; the interpreter's second of two runs):", ""] + tower(rate)
    L += ["", "The whole gate (`gate ARTIFACT --model M --skip vqa`, the interpreter in ane mode, the gate's default):", ""] + gate
    bt.emit(L, args.out)


if __name__ == "__main__":
    main()
