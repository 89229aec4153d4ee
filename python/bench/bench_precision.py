#!/usr/bin/env python3
"""Benchmark the cosine gate's two interpreter modes side by side on a
Qwen3-VL-2B-shaped tower: `--precision ane` (fp16 plus the Neural Engine's
published limits and the per-op headroom, the gate's default) against
`--precision fp16` (the idealised fp16 machine).

    .venv-dev/bin/python python/bench/bench_precision.py [--bin target/release/ane-export]
        [--work DIR] [--bucket b1024] [--rounds 2] [--out BENCHMARKS.md]

Writes the 2B-shaped checkpoint of bench_tower.py (random weights, bf16) and
builds the bucket (with --residual-scale 1: the random tower needs none, and
calibration is not what is timed), unless --work holds them. Then gates the
bucket on the eight natural golden images (`--images`, so that the stress
images, which the default cases now include, do not move the comparison),
VQA skipped, alternating the two modes for --rounds rounds in one run, and
reports each run's wall time, the cosine gate's artifact side, and the ratio
ane / fp16. Prints a markdown section and appends it to --out.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import shlex
import shutil
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_qwen25 as q25  # noqa: E402
import bench_tower as bt  # noqa: E402

ROOT = bt.ROOT
NATURAL = ["square.png", "wide.jpg", "tall.png", "tiny.png", "large.jpg", "extreme.png", "rgba.png", "gray.jpg"]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", default="target/release/ane-export")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--work", type=Path, help="work directory to reuse (checkpoint and artifact)")
    ap.add_argument("--bucket", default="b1024")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    binary = (ROOT / args.bin).resolve() if not Path(args.bin).is_absolute() else Path(args.bin)
    env = bt.child_env(args.threads)
    work = args.work or Path(tempfile.mkdtemp(prefix="bench_precision_"))
    work.mkdir(parents=True, exist_ok=True)
    ckpt = work / "qwen3vl-2b-vision-random"
    art = work / f"art-{args.bucket}"
    if not (ckpt / "model.safetensors").is_file():
        n = bt.child_call(bt.__file__, "write_checkpoint", d=str(ckpt), seed=0)
        print(f"checkpoint: {n / 1e6:.1f} M params", flush=True)
    if not (art / "manifest.json").is_file():
        r = bt.run_measured([str(binary), "build", "--model", str(ckpt), "--out", str(art), "--force",
                             "--bucket", args.bucket, "--residual-scale", "1"], env, work / "build")
        print(f"build: {r['wall_s']:.1f} s", flush=True)
    images = work / "images"
    images.mkdir(exist_ok=True)
    for name in NATURAL:
        shutil.copy(ROOT / "golden" / "images" / name, images / name)

    rate = q25.matmul_rate(args.threads, work)["gflops"]
    print(f"matmul rate: {rate:.0f} GFLOP/s", flush=True)
    runs = {"ane": [], "fp16": []}
    for i in range(args.rounds):
        for mode in ("fp16", "ane"):
            r = bt.run_measured([str(binary), "gate", str(art), "--model", str(ckpt), "--skip", "vqa",
                                 "--images", str(images), "--precision", mode, "--json"], env,
                                work / f"gate_{mode}_{i}")
            rep = json.loads(r["stdout"])
            c = rep["gates"]["cosine"]
            ran = [x for x in c["cases"] if x["seconds"]]
            runs[mode].append({"wall": r["wall_s"], "rss": r["rss_mb"], "cases": len(ran),
                               "art": c.get("seconds", {}).get("artifact", float("nan")),
                               "status": c["status"], "executor": c["executor"],
                               "worst": min((o["min_cos"] for x in ran for o in x["outputs"]), default=float("nan")),
                               "ops": len(c.get("headroom", {}).get("ops", []))})
            print(f"{mode} round {i}: {r['wall_s']:.1f} s, artifact side {runs[mode][-1]['art']:.1f} s", flush=True)

    best = {m: min(v, key=lambda x: x["wall"]) for m, v in runs.items()}
    L = [f"### Cosine gate, ane mode against fp16 mode, Qwen3-VL-2B-shaped tower "
         f"({dt.datetime.now(dt.timezone.utc).strftime('%Y-%m-%d %H:%M:%S UTC')})", ""]
    L.append(f"- command: `{shlex.join([bt._rel(sys.executable)] + sys.argv)}`; binary `{bt._rel(str(binary))}`")
    L.append(bt.machine_line(args.threads, rate, binary))
    L.append(f"- bucket {args.bucket} alone, the eight natural golden images (`--images`), VQA skipped; "
             f"{args.rounds} rounds, the modes alternating (fp16 first)")
    L.append("")
    L.append("| mode | run | gate wall s | cosine artifact side s | peak RSS MB | cases | ops in headroom | "
             "min cosine | cosine |")
    L.append("|---|---|---|---|---|---|---|---|---|")
    for mode in ("fp16", "ane"):
        for i, r in enumerate(runs[mode]):
            L.append(f"| {mode} | {i} | {r['wall']:.1f} | {r['art']:.1f} | {r['rss']:.0f} | {r['cases']} | "
                     f"{r['ops']} | {r['worst']:.6f} | {r['status']} |")
    L.append("")
    L.append(f"- ane / fp16, fastest run of each: gate wall {best['ane']['wall'] / best['fp16']['wall']:.2f}x, "
             f"artifact side {best['ane']['art'] / best['fp16']['art']:.2f}x")
    report = "\n".join(L) + "\n"
    print(report)
    if args.out:
        with open(args.out, "a") as f:
            f.write("\n" + report)


if __name__ == "__main__":
    main()
