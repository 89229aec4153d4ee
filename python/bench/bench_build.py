#!/usr/bin/env python3
"""Benchmark `ane-export build` and the MIL interpreter on a Qwen3-VL-2B-shaped tower.

    .venv-dev/bin/python python/bench/bench_build.py [--bin target/release/ane-export]
        [--run-bin target/release/ane-run] [--interp-patches 1024] [--out BENCHMARKS.md]

1. Writes the 2B-shaped checkpoint of bench_tower.py (random weights, bf16).
2. `ane-export build` with the project's buckets.yaml (b1024 and b4096, one
   multifunction package): wall time and peak RSS of the process (os.wait4),
   against the fp16 weight size.
3. `ane-export build --bucket b1024` alone: the multifunction package's size
   against a single bucket's.
3b. The plain coremltools flow on the same tower (`coreml_flow.py`: the same
   MIL program, `ct.convert` per bucket with the default pipeline, then
   `save_multifunction`), from `ane-export layout`'s weights: wall time and
   peak RSS, and its ratio to `ane-export build`'s.
3c. transformers' vision model traced and converted (`traced_flow.py`, 1024
   patches): what it does, recorded as is.
4. The interpreter: `ane-run host-inputs` for a 512x512 image (1024 patches),
   then `ane-export exec --function b1024 --runs 2` in fp32 and fp16 (the
   second, warm run is timed), against
   transformers' vision model (fp32, SDPA) on a 1024-patch input of the same
   shape, each in a fresh process with the same threads.
Prints a markdown section and appends it to --out.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import re
import shlex
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_tower as bt  # noqa: E402

ROOT = bt.ROOT
EXEC_RE = re.compile(r"in ([0-9.]+) s, precision")
RUNS_RE = re.compile(r"seconds per run: ([0-9., ]+)")


def du(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", default="target/release/ane-export")
    ap.add_argument("--run-bin", default="target/release/ane-run")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--interp-patches", type=int, nargs="*", default=[1024])
    ap.add_argument("--rounds", type=int, default=1, help="alternating rounds of the interpreter and PyTorch")
    ap.add_argument("--out", type=Path)
    ap.add_argument("--build-only", action="store_true", help="measure the build steps, not the interpreter")
    ap.add_argument("--interp-only", type=Path, metavar="WORKDIR",
                    help="reuse the checkpoint and artifact of an earlier run's work directory; measure only the "
                         "interpreter against PyTorch")
    args = ap.parse_args()
    binary = (ROOT / args.bin).resolve() if not Path(args.bin).is_absolute() else Path(args.bin)
    run_bin = (ROOT / args.run_bin).resolve() if not Path(args.run_bin).is_absolute() else Path(args.run_bin)
    env = bt.child_env(args.threads)
    work = args.interp_only or Path(tempfile.mkdtemp(prefix="bench_build_"))
    ckpt = work / "qwen3vl-2b-vision-random"
    rows = []
    if args.interp_only:
        n_params = sum(int(bt.math.prod(s)) for s in bt.vision_param_shapes().values())
        weight_mb = multi = single = traced = None
    else:
        n_params, weight_mb, multi, single, traced = build_rows(binary, ckpt, work, env, rows)
    interp, peak = [], None
    if not args.build_only:
        interp = interp_rows(args, binary, run_bin, work, ckpt, env)
        peak = matmul_peak(args.threads)
        print(f"fp32 matmul peak: {peak:.0f} GFLOP/s", flush=True)
    report(args, rows, interp, n_params, weight_mb, multi, single, peak, traced)


def build_rows(binary, ckpt, work, env, rows):
    n_params = bt.child_call(bt.__file__, "write_checkpoint", d=str(ckpt), seed=0)
    print(f"checkpoint: {n_params / 1e6:.1f} M params", flush=True)
    r = bt.run_measured([str(binary), "build", "--model", str(ckpt), "--out", str(work / "art"), "--json"],
                        env, work / "build_all")
    summ = json.loads(r["stdout"])
    weight_mb = summ["fp16_weight_bytes"] / 2**20
    rows.append(("build b1024 + b4096 (multifunction)", r["wall_s"], r["rss_mb"]))
    print(f"build both: {r['wall_s']:.1f} s, {r['rss_mb']:.0f} MB peak, fp16 weights {weight_mb:.0f} MB", flush=True)
    multi = du(work / "art" / "art.mlpackage")
    r1 = bt.run_measured([str(binary), "build", "--model", str(ckpt), "--out", str(work / "one"), "--bucket", "b1024",
                          "--json"], env, work / "build_one")
    single = du(work / "one" / "one.mlpackage")
    rows.append(("build b1024 alone", r1["wall_s"], r1["rss_mb"]))
    print(f"build b1024: {r1['wall_s']:.1f} s; package sizes multi {multi} vs single {single}", flush=True)
    # The baseline: the plain coremltools flow on the same program and weights.
    bt.run_measured([str(binary), "layout", "--model", str(ckpt), "--out", str(work / "layout")], env,
                    work / "layout")
    flow = bt.run_measured([str(ROOT / ".venv" / "bin" / "python"), str(Path(__file__).resolve().parent /
                            "coreml_flow.py"), "--layout", str(work / "layout"), "--out",
                            str(work / "flow.mlpackage")], env, work / "coreml_flow")
    rows.append(("plain coremltools flow: ct.convert per bucket (default pipeline) + save_multifunction",
                 flow["wall_s"], flow["rss_mb"]))
    print(f"plain coremltools flow: {flow['wall_s']:.1f} s, {flow['rss_mb']:.0f} MB peak", flush=True)
    # The path without ane-export: transformers' model traced and converted (it may fail; recorded as is).
    cmd = [sys.executable, str(Path(__file__).resolve().parent / "traced_flow.py"), "--model", str(ckpt),
           "--patches", "1024"]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    traced = json.loads(lines[-1]) if lines else {"outcome": "no record", "error": proc.stderr[-400:]}
    print(f"traced flow: {traced}", flush=True)
    return n_params, weight_mb, multi, single, traced


def tower_flops(n: int) -> float:
    """FLOPs of one forward pass over n patches: every weight matrix applied
    to each of its tokens (n, or n / 4 after the merge), and per block the
    two attention products (4 n^2 hidden)."""
    shapes = bt.vision_param_shapes()
    flops = 0.0
    for name, shape in shapes.items():
        if len(shape) < 2 or name.startswith("pos_embed"):
            continue
        tokens = n // 4 if "merger" in name else n
        flops += 2.0 * tokens * bt.math.prod(shape)
    vc = bt.VISION_CONFIG
    return flops + vc["depth"] * 4.0 * n * n * vc["hidden_size"]


def matmul_peak(threads: int) -> float:
    """This machine's fp32 matmul rate, GFLOP/s: the best of 5 torch.mm on
    4096 x 4096 (MKL) with the benchmark's threads, after a warm-up."""
    import time

    import torch

    torch.set_num_threads(threads)
    a, b = torch.randn(4096, 4096), torch.randn(4096, 4096)
    torch.mm(a, b)
    best = float("inf")
    for _ in range(5):
        t = time.perf_counter()
        torch.mm(a, b)
        best = min(best, time.perf_counter() - t)
    return 2 * 4096**3 / best / 1e9


def interp_rows(args, binary, run_bin, work, ckpt, env):
    interp = []
    for n in args.interp_patches:
        side = bt.math.isqrt(n) * 16
        import numpy as np
        from PIL import Image
        img = work / f"img{n}.png"
        rng = np.random.default_rng(n)
        Image.fromarray(rng.integers(0, 256, (side, side, 3), dtype=np.uint8)).save(img)
        bucket = "b1024" if n <= 1024 else "b4096"
        hi = work / f"hi{n}.safetensors"
        bt.run_measured([str(run_bin), "host-inputs", "--artifact", str(work / "art"), "--bucket", bucket,
                         "--image", str(img), "--out", str(hi)], env, work / f"hi{n}")
        res = {"patches": n, "bucket": bucket, "rounds": []}
        pv = work / f"pv{n}.safetensors"
        bt.child_call(bt.__file__, "write_inputs", path=str(pv), n=n, seed=0)
        # Rounds alternate the three runs, so that the machine's drift (it is
        # shared) falls on all of them; the table reports each one's median.
        for k in range(args.rounds):
            rnd = {}
            for prec in ("fp32", "fp16"):
                # Two runs, as PyTorch does one warm-up forward: the second is timed.
                e = bt.run_measured([str(binary), "exec", str(work / "art" / "art.mlpackage"), "--function",
                                     bucket, "--inputs", str(hi), "--out", str(work / f"ho{n}{prec}.safetensors"),
                                     "--precision", prec, "--runs", "2"], env, work / f"exec{n}{prec}")
                m = EXEC_RE.search(e["stderr"])
                runs = RUNS_RE.search(e["stderr"])
                first = float(runs.group(1).split(",")[0]) if runs else float("nan")
                rnd[prec] = (float(m.group(1)) if m else e["wall_s"], e["rss_mb"], first)
                print(f"[round {k + 1}/{args.rounds}] exec {bucket} {prec}: {rnd[prec][0]:.1f} s "
                      f"(first run {first:.1f} s), {e['rss_mb']:.0f} MB", flush=True)
            t = bt.run_torch(ckpt, pv, work / f"torch{n}.safetensors", args, work / f"torch{n}")
            rnd["torch"] = (t["forward_s"], t["rss_mb"])
            print(f"[round {k + 1}/{args.rounds}] torch {n}: {t['forward_s']:.1f} s", flush=True)
            res["rounds"].append(rnd)
        for key in ("fp32", "fp16", "torch"):
            vals = [r[key] for r in res["rounds"]]
            res[key] = tuple(statistics.median(v[i] for v in vals) for i in range(len(vals[0])))
        interp.append(res)
    return interp


def report(args, rows, interp, n_params, weight_mb, multi, single, peak, traced=None):
    L = [f"### ane-export build and the MIL interpreter, Qwen3-VL-2B-shaped tower "
         f"({dt.datetime.now(dt.timezone.utc).strftime('%Y-%m-%d %H:%M:%S UTC')})", ""]
    L.append(f"- command: `{shlex.join([bt._rel(sys.executable)] + sys.argv)}`")
    L.append(bt.machine_line(args.threads, None, args.bin))
    L.append(f"- tower: depth 24, hidden 1024, 16 heads, MLP 4096, out 2048, deepstack [5, 11, 17], "
             f"{n_params / 1e6:.1f} M params")
    L.append("")
    if rows:
        L.append(f"fp16 weights in the package: {weight_mb:.0f} MB")
        L.append("")
        L.append("| step | wall s | peak RSS MB | RSS / fp16 weights |")
        L.append("|---|---|---|---|")
        for name, wall, rss in rows:
            L.append(f"| {name} | {wall:.1f} | {rss:.0f} | {rss / weight_mb:.2f} |")
        L.append("")
        L.append(f"- package size: multifunction (b1024 + b4096) {multi / 2**20:.1f} MB, b1024 alone "
                 f"{single / 2**20:.1f} MB, ratio {multi / single:.3f}")
        ours, flow = rows[0], rows[-1]
        L.append(f"- `ane-export build` against the plain coremltools flow (same program, same weights, both "
                 f"buckets): {ours[1] / flow[1]:.2f}x its time, {ours[2] / flow[2]:.2f}x its peak RSS "
                 f"(the flow's time excludes reading the checkpoint: it starts from `ane-export layout`'s weights)")
        if traced:
            v = traced.get("versions", {})
            steps = ", ".join(f"{k} {x:.1f} s" for k, x in traced.get("steps", {}).items())
            what = (f"failed at {traced.get('failed_step')}: `{traced.get('error')}` "
                    f"({'; '.join(traced.get('where', []))}; coremltools logged: "
                    f"{' / '.join(traced.get('logged', [])) or 'nothing'})" if traced.get("outcome") != "converted"
                    else "converted")
            L.append(f"- transformers' vision model traced with `torch.jit.trace` at 32 x 32 patches and converted "
                     f"with `ct.convert` (`traced_flow.py`; torch {v.get('torch')}, transformers "
                     f"{v.get('transformers')}, coremltools {v.get('coremltools')}): {what}; steps reached: "
                     f"{steps or 'none'}")
        L.append("")
    if interp:
        L.append("| patches | interpreter fp32 s | fp16 s | PyTorch fp32 SDPA s | fp32 / torch | fp16 / torch | "
                 "first run fp32 s | fp16 s | interp fp32 RSS MB | torch RSS MB |")
        L.append("|---|---|---|---|---|---|---|---|---|---|")
        for r in interp:
            L.append(f"| {r['patches']} | {r['fp32'][0]:.1f} | {r['fp16'][0]:.1f} | {r['torch'][0]:.1f} | "
                     f"{r['fp32'][0] / r['torch'][0]:.2f} | {r['fp16'][0] / r['torch'][0]:.2f} | "
                     f"{r['fp32'][2]:.1f} | {r['fp16'][2]:.1f} | {r['fp32'][1]:.0f} | {r['torch'][1]:.0f} |")
        L.append("")
        L.append(f"Throughput against this machine's fp32 matmul rate, {peak:.0f} GFLOP/s (best of 5 `torch.mm` "
                 f"of 4096 x 4096, MKL, {args.threads} threads, in the benchmark's process):")
        L.append("")
        L.append("| patches | GFLOP per forward | interpreter fp32 GFLOP/s | % of matmul rate | fp16 GFLOP/s | "
                 "% | PyTorch GFLOP/s | % |")
        L.append("|---|---|---|---|---|---|---|---|")
        for r in interp:
            g = tower_flops(r["patches"]) / 1e9
            rates = [g / r[k][0] for k in ("fp32", "fp16", "torch")]
            cells = " | ".join(f"{x:.0f} | {100 * x / peak:.0f}%" for x in rates)
            L.append(f"| {r['patches']} | {g:.0f} | {cells} |")
        L.append("")
        for r in interp:
            per = "; ".join(f"{k}: " + ", ".join(f"{x[k][0]:.1f}" for x in r["rounds"]) for k in ("fp32", "fp16", "torch"))
            L.append(f"- {r['patches']} patches, seconds per round ({len(r['rounds'])} alternating rounds; the table "
                     f"holds medians): {per}")
        L.append("")
        L.append("Interpreter time is `exec --runs 2`'s timing of the second run (the first decodes the weights, "
                 "as PyTorch converts its checkpoint when it loads; its time is in the \"first run\" columns); "
                 "PyTorch's is one timed forward after a warm-up. Inputs have the same shape, not the same values.")
    report = "\n".join(L) + "\n"
    print(report)
    if args.out:
        with open(args.out, "a") as f:
            f.write("\n" + report)


if __name__ == "__main__":
    main()
