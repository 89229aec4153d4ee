#!/usr/bin/env python3
"""The whole gate of a benchmark tower run by two binaries side by side.

    .venv-dev/bin/python python/bench/bench_gate_memory.py --a OLD_BIN [--b NEW_BIN]
        [--a-env K=V]... [--tower qwen3vl-2b|qwen3vl-8b|qwen25-7b] [--work DIR] [--rounds 1] [--natural]
        [--out BENCHMARKS.md]

Writes (or reuses, in --work) the tower's random checkpoint (bench_tower.py's
Qwen3-VL-2B or -8B shape, or bench_qwen25.py's Qwen2.5-VL-7B shape) and its
artifact (built by --b, or --a without it), then runs `gate ARTIFACT --model
M --skip vqa --json` with each binary in turn, A then B, for --rounds
rounds (without --b, A alone: the gate's own figures): peak RSS
(the child's own ru_maxrss) against the fp16 weights, wall time, the lowest
cosine over every case and output, and whether the two reports agree on
every case (every field but the seconds). For a change to the gate, A is the
binary before it and B after; for a change an environment variable turns off,
A and B may be one binary, A run with --a-env (e.g. ANE_EXPORT_SIMD=none). The machine's fp32 matmul rate (numpy's sgemm
4096, bench_qwen25.matmul_rate) is measured in the same run, before the
gates.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import shlex
import shutil
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_qwen25 as q25  # noqa: E402
import bench_tower as bt  # noqa: E402


def cosines(report: dict) -> list:
    """Every case of the cosine gate, all but its timings."""
    return [{k: v for k, v in c.items() if k != "seconds"} for c in report["gates"]["cosine"]["cases"]]


def lowest_cosine(report: dict) -> float:
    """The lowest cosine of any output of any case that ran."""
    return min(o["min_cos"] for c in report["gates"]["cosine"]["cases"] for o in c.get("outputs", []))


# Per tower: its checkpoint's directory name, the script that writes it
# (and what else its `write_checkpoint` takes), and its name in the report.
TOWERS = {
    "qwen3vl-2b": ("qwen3vl-2b-vision-random", bt.__file__, {}, "Qwen3-VL-2B-shaped tower"),
    "qwen3vl-8b": ("qwen3vl-8b-vision-random", bt.__file__, {"shape": "8b"}, "Qwen3-VL-8B-shaped tower"),
    "qwen25-7b": ("qwen25-7b-vision-random", q25.__file__, {}, "Qwen2.5-VL-7B-shaped tower"),
}


def split(report: dict) -> str:
    """The report's seconds by side: the wall time of each side where the
    report records it, then the cases' own seconds: each distinct reference
    run (images and real patches) counted once, the artifact's summed per
    bucket (thread-seconds when cases ran side by side)."""
    ref, art = {}, {}
    for c in report["gates"]["cosine"]["cases"]:
        s = c.get("seconds", {})
        if "reference" in s:
            ref[(tuple(c["images"]), c["real_patches"])] = s["reference"]
        if "artifact" in s:
            b = f"b{c['bucket_patches']}"
            art[b] = art.get(b, 0.0) + s["artifact"]
    parts = [f"reference {sum(ref.values()):.1f} s ({len(ref)} distinct runs)"]
    parts += [f"artifact {b} {v:.1f} s" for b, v in sorted(art.items(), key=lambda kv: int(kv[0][1:]))]
    wall = report["gates"]["cosine"].get("seconds", {})
    if not wall:
        return ", ".join(parts)
    at_once = report["gates"]["cosine"].get("side_by_side", 0)
    return (f"wall: reference {wall['reference']:.1f} s (with loading), artifact {wall['artifact']:.1f} s "
            f"(up to {at_once} cases at once); cases' own seconds: " + ", ".join(parts))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--a", required=True, type=Path, help="binary A (e.g. before a change)")
    ap.add_argument("--b", type=Path, help="binary B (e.g. after it); without it, A alone")
    ap.add_argument("--a-env", action="append", default=[], metavar="K=V",
                    help="an environment variable for A's runs alone (repeatable)")
    ap.add_argument("--tower", choices=sorted(TOWERS), default="qwen3vl-2b")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--work", type=Path)
    ap.add_argument("--natural", action="store_true",
                    help="gate on the eight natural golden images (--images) rather than the default set")
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    env = bt.child_env(args.threads)
    work = args.work or Path(tempfile.mkdtemp(prefix="bench_gate_memory_"))
    work.mkdir(parents=True, exist_ok=True)
    ckpt_name, writer, shape, tower = TOWERS[args.tower]
    ckpt, art = work / ckpt_name, work / "art"
    if not (ckpt / "model.safetensors").is_file():
        bt.child_call(writer, "write_checkpoint", d=str(ckpt), seed=0, **shape)
    if not (art / "manifest.json").is_file():
        bt.run_measured([str(args.b or args.a), "build", "--model", str(ckpt), "--out", str(art), "--force"], env,
                        work / "build")
    manifest = json.loads((art / "manifest.json").read_text())
    weights_mb = sum(f.stat().st_size for f in art.rglob("weight.bin")) / 2**20
    images = []
    if args.natural:
        (work / "images").mkdir(exist_ok=True)
        for name in bt.NATURAL_IMAGES:
            shutil.copy(bt.ROOT / "golden" / "images" / name, work / "images" / name)
        images = ["--images", str(work / "images")]
    rate = q25.matmul_rate(args.threads, work)
    print(f"matmul rate: {rate['gflops']:.0f} GFLOP/s", flush=True)
    a_env = dict(kv.split("=", 1) for kv in args.a_env)
    bins = [("A", args.a)] + ([("B", args.b)] if args.b else [])
    runs = {name: [] for name, _ in bins}
    reports = {}
    for r in range(args.rounds):
        for name, binary in bins:
            m = bt.run_measured([str(binary), "gate", str(art), "--model", str(ckpt), "--skip", "vqa", "--json"]
                                + images, {**env, **(a_env if name == "A" else {})}, work / f"gate_{name}_{r}")
            rep = json.loads(m["stdout"])
            reports[name] = rep
            runs[name].append(m)
            print(f"round {r} {name}: {m['wall_s']:.1f} s, peak RSS {m['rss_mb']:.0f} MB, "
                  f"cosine {rep['gates']['cosine']['status']}, lowest {lowest_cosine(rep):.6f}", flush=True)
    med = {k: (statistics.median(x["wall_s"] for x in v), statistics.median(x["rss_mb"] for x in v))
           for k, v in runs.items()}
    title = "two binaries side by side" if args.b else "one binary"
    L = [f"### Whole gate, {title}, {tower} "
         f"({dt.datetime.now(dt.timezone.utc).strftime('%Y-%m-%d %H:%M:%S UTC')})", ""]
    L.append(f"- command: `{shlex.join([bt._rel(sys.executable)] + sys.argv)}`")
    L.append(bt.machine_line(args.threads, rate["gflops"], args.b or args.a, rate["blas"]))
    L.append(f"- artifact: buckets {', '.join(b['name'] for b in manifest['buckets'])}, fp16 weights "
             f"{weights_mb:.0f} MB; `gate ARTIFACT --model M --skip vqa{' --images DIR' if images else ''}`"
             f"{' (DIR: the eight natural golden images)' if images else ' (the default cases)'}, the MIL "
             "interpreter in ane mode (the gate's default --precision: fp16 with the Neural Engine's limits); "
             f"{args.rounds} round(s){', A then B' if args.b else ''}, medians")
    L.append("")
    L.append("| binary | wall s | peak RSS MB | peak RSS / fp16 weights | cosine gate | accepted | lowest cosine |")
    L.append("|---|---|---|---|---|---|---|")
    for k, path in bins:
        rep = reports[k]
        extra = "".join(f" {kv}" for kv in args.a_env) if k == "A" else ""
        L.append(f"| {k} (`{bt._rel(path)}`{extra}) | {med[k][0]:.1f} | {med[k][1]:.0f} | {med[k][1] / weights_mb:.2f}x | "
                 f"{rep['gates']['cosine']['status']} | {rep.get('accepted')} | {lowest_cosine(rep):.6f} |")
    L.append("")
    for k, _ in bins:
        L.append(f"- {k}'s split (its last round's report): {split(reports[k])}")
    if args.b:
        same = cosines(reports["A"]) == cosines(reports["B"])
        L.append(f"- B / A: wall {med['B'][0] / med['A'][0]:.3f}, peak RSS {med['B'][1] / med['A'][1]:.3f}; "
                 f"every case {'identical' if same else 'DIFFERENT'} between the two reports (all fields but seconds)")
    report = "\n".join(L) + "\n"
    print(report)
    if args.out:
        with open(args.out, "a") as f:
            f.write("\n" + report)


if __name__ == "__main__":
    main()
