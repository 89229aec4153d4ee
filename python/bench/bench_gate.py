#!/usr/bin/env python3
"""Benchmark `ane-export gate` on a Qwen3-VL-2B-shaped tower.

    .venv-dev/bin/python python/bench/bench_gate.py [--bin target/release/ane-export]
        [--work DIR] [--out BENCHMARKS.md]

1. Writes the 2B-shaped checkpoint of bench_tower.py (random weights, bf16)
   and builds the artifact (b1024 and b4096), unless --work holds them.
2. Gates each bucket alone (`gate --bucket B --skip vqa`, the default golden
   cases: 8 images and one call with three), then merges: wall time and
   peak RSS of each process, and the per-case split between the fp32
   reference and the artifact in the interpreter (fp16). Then the whole
   gate in one process (`gate ARTIFACT --skip vqa`), as a release runs it.
3. As a yardstick, PyTorch (transformers' vision model, fp32, SDPA) runs one
   forward pass of the bucket's full size in a fresh process; and the
   machine's fp32 matmul rate (numpy's sgemm 4096, OPENBLAS_CORETYPE and
   OPENBLAS_L2_SIZE unset), measured in the same run, gives the time of the
   full-bucket work: every case's bucket-sized forward pass, the FLOPs of its
   Linears (every weight matrix on every slot; attention left out) at that
   rate. The Neural Engine computes all of it; the interpreter computes
   repeated pad columns once and skips dead keys, where that is exact, so
   on padded cases it can take less.
Prints a markdown section and appends it to --out.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import shlex
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_build as bb  # noqa: E402
import bench_qwen25 as q25  # noqa: E402
import bench_tower as bt  # noqa: E402

ROOT = bt.ROOT


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", default="target/release/ane-export")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--work", type=Path, help="work directory to reuse (checkpoint and artifact)")
    ap.add_argument("--buckets", nargs="*", default=["b1024", "b4096"])
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    binary = (ROOT / args.bin).resolve() if not Path(args.bin).is_absolute() else Path(args.bin)
    env = bt.child_env(args.threads)
    work = args.work or Path(tempfile.mkdtemp(prefix="bench_gate_"))
    work.mkdir(parents=True, exist_ok=True)
    ckpt = work / "qwen3vl-2b-vision-random"
    art = work / "art"
    if not (ckpt / "model.safetensors").is_file():
        n = bt.child_call(bt.__file__, "write_checkpoint", d=str(ckpt), seed=0)
        print(f"checkpoint: {n / 1e6:.1f} M params", flush=True)
    if not (art / "manifest.json").is_file():
        r = bt.run_measured([str(binary), "build", "--model", str(ckpt), "--out", str(art), "--force"], env,
                            work / "build")
        print(f"build: {r['wall_s']:.1f} s", flush=True)

    rate = q25.matmul_rate(args.threads, work)["gflops"]
    print(f"matmul rate: {rate:.0f} GFLOP/s", flush=True)
    weights_mb = sum(f.stat().st_size for f in art.rglob("weight.bin")) / 2**20
    rows = []
    total = 0.0
    for b in args.buckets:
        r = bt.run_measured([str(binary), "gate", str(art), "--model", str(ckpt), "--bucket", b, "--skip", "vqa",
                             "--json"], env, work / f"gate_{b}")
        rep = json.loads(r["stdout"])
        cases = rep["gates"]["cosine"]["cases"]
        ran = [c for c in cases if c["seconds"]]
        ref_s = sum(c["seconds"]["reference"] for c in ran)
        art_s = sum(c["seconds"]["artifact"] for c in ran)
        worst = min((o["min_cos"] for c in ran for o in c["outputs"]), default=float("nan"))
        pv = work / f"pv_{b}.safetensors"
        n = int(b[1:])
        bt.child_call(bt.__file__, "write_inputs", path=str(pv), n=n, seed=0)
        t = bt.run_torch(ckpt, pv, work / f"torch_{b}.safetensors", args, work / f"torch_{b}")
        rows.append({"bucket": b, "wall": r["wall_s"], "rss": r["rss_mb"], "cases": len(ran), "ref": ref_s,
                     "art": art_s, "torch": t["forward_s"], "worst": worst,
                     "status": rep["gates"]["cosine"]["status"], "res": rep["gates"]["residency"]["status"]})
        total += r["wall_s"]
        print(f"gate {b}: {r['wall_s']:.1f} s ({len(ran)} cases, reference {ref_s:.1f} s, artifact {art_s:.1f} s), "
              f"torch forward {t['forward_s']:.1f} s", flush=True)
    m = bt.run_measured([str(binary), "gate", str(art), "--model", str(ckpt), "--merge", "--skip", "vqa"], env,
                        work / "gate_merge")
    total += m["wall_s"]
    # The whole gate in one process, as `ane-export gate ARTIFACT` runs it: the
    # weights are decoded once, and a case's reference run serves every bucket
    # whose preprocessing gives the same pixels (a reused run reports the same
    # seconds under each bucket, so distinct (case, seconds) pairs are summed).
    w = bt.run_measured([str(binary), "gate", str(art), "--model", str(ckpt), "--skip", "vqa", "--json"], env,
                        work / "gate_whole")
    wrep = json.loads(w["stdout"])
    wcases = [c for c in wrep["gates"]["cosine"]["cases"] if c["seconds"]]
    whole = {"wall": w["wall_s"], "rss": w["rss_mb"], "cases": len(wcases),
             "art": sum(c["seconds"]["artifact"] for c in wcases),
             "ref": sum(s for _, s in {(c["case"], c["seconds"]["reference"]) for c in wcases}),
             "status": wrep["gates"]["cosine"]["status"], "accepted": wrep["accepted"],
             "sides": wrep["gates"]["cosine"].get("seconds", {}),
             "at_once": wrep["gates"]["cosine"].get("side_by_side", 0)}
    print(f"whole gate: {whole['wall']:.1f} s ({whole['cases']} cases, reference {whole['ref']:.1f} s, "
          f"artifact {whole['art']:.1f} s)", flush=True)

    L = [f"### ane-export gate, Qwen3-VL-2B-shaped tower ({dt.datetime.now(dt.timezone.utc).strftime('%Y-%m-%d %H:%M:%S UTC')})", ""]
    L.append(f"- command: `{shlex.join([bt._rel(sys.executable)] + sys.argv)}`")
    L.append(bt.machine_line(args.threads, rate, args.bin))
    L.append("- cases per bucket: the default golden set (8 images alone, 3 in one call); VQA skipped; "
             "artifact executed by the MIL interpreter in fp16")
    L.append("")
    L.append("| bucket | cases | gate wall s | peak RSS MB | reference s (sum) | "
             "artifact s (sum; one thread per case once cases run side by side) | "
             "PyTorch forward at full bucket s | artifact s per case / PyTorch | min cosine | residency | cosine |")
    L.append("|---|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        per = r["art"] / max(r["cases"], 1)
        L.append(f"| {r['bucket']} | {r['cases']} | {r['wall']:.1f} | {r['rss']:.0f} | {r['ref']:.1f} | "
                 f"{r['art']:.1f} | {r['torch']:.1f} | {per / r['torch']:.2f} | {r['worst']:.6f} | {r['res']} | "
                 f"{r['status']} |")
    L.append("")
    L.append(f"- merge: {m['wall_s']:.1f} s; both buckets gated apart and merged: {total:.1f} s "
             f"({total / 60:.1f} min)")
    L.append(f"- the whole gate in one process (`gate ARTIFACT --model M --skip vqa`): {whole['wall']:.1f} s "
             f"({whole['wall'] / 60:.1f} min), peak RSS {whole['rss']:.0f} MB; {whole['cases']} cases, artifact "
             f"{whole['art']:.1f} s, reference {whole['ref']:.1f} s (each distinct run once); cosine "
             f"{whole['status']}, accepted: {whole['accepted']}")
    if whole["sides"]:
        L.append(f"- the whole gate's sides, wall: reference {whole['sides']['reference']:.1f} s (with loading), "
                 f"artifact {whole['sides']['artifact']:.1f} s with up to {whole['at_once']} cases at once, one "
                 "thread each (so the cases' artifact seconds above add up thread-seconds)")
    L.append(f"- the whole gate's peak RSS against the package's fp16 weights ({weights_mb:.0f} MB): "
             f"{whole['rss'] / weights_mb:.2f}x")
    vc = bt.VISION_CONFIG
    linear_flops = sum(bb.tower_flops(n) - vc["depth"] * 4.0 * n * n * vc["hidden_size"]
                       for n in (int(c["bucket"][1:]) for c in wcases))
    floor = linear_flops / (rate * 1e9)
    L.append(f"- the artifact side's full-bucket work: {len(wcases)} forward passes, {linear_flops / 1e12:.1f} TFLOP "
             f"in their Linears alone, {floor:.1f} s at the matmul rate (what the Neural Engine computes; the "
             f"interpreter computes repeated pad columns once where exact); measured {whole['art']:.1f} s")
    report = "\n".join(L) + "\n"
    print(report)
    if args.out:
        with open(args.out, "a") as f:
            f.write("\n" + report)


if __name__ == "__main__":
    main()
