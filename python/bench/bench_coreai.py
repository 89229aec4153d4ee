#!/usr/bin/env python3
"""Benchmark Apple's Core AI runtime on Linux against the project's
interpreter, side by side, on a Qwen3-VL-2B-shaped tower at one bucket.

    .venv-dev/bin/python python/bench/bench_coreai.py [--bin target/release/ane-export]
        [--work DIR] [--bucket b1024] [--rounds 2] [--out BENCHMARKS.md]

Writes the 2B-shaped checkpoint of bench_tower.py (random weights, bf16) and
builds the bucket with `--format both` (`--residual-scale 1`: the random
tower needs none), unless --work holds them. Then, for --rounds rounds,
alternating: the interpreter runs the package's function (`ane-export exec
--precision ane --runs 2`, the second run timed, as the gates run it) and the
Core AI runtime runs the `.aimodel`'s graph of the same name in a child of
the project's venv (loaded once, a warm-up run, then two timed runs), both on
the host inputs of one image filling the bucket. Reports each side's
seconds, the load time of Core AI, peak RSS, the ratio Core AI /
interpreter, and the cosine between the two sides' outputs. Prints a
markdown section and appends it to --out.
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
import bench_qwen25 as q25  # noqa: E402
import bench_tower as bt  # noqa: E402

ROOT = bt.ROOT

#: The Core AI side, run by the project's venv (coreai-core is pinned there).
CHILD = r"""
import json, sys, time
import numpy as np
from ane_export import coreai
from ane_export.coreml import read_safetensors, write_safetensors
path, fn, inp, out, runs = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4], int(sys.argv[5])
feed = read_safetensors(inp)
t = time.perf_counter(); host = coreai._Host(path); f = host.load(fn); load = time.perf_counter() - t
t = time.perf_counter(); y = f.predict(feed); warm = time.perf_counter() - t
ts = []
for _ in range(runs):
    t = time.perf_counter(); y = f.predict(feed); ts.append(time.perf_counter() - t)
write_safetensors(out, y)
host.close()
print(json.dumps({"load_s": load, "first_s": warm, "runs_s": ts}), flush=True)
import os; os._exit(0)
"""


def cosine_all(a: Path, b: Path) -> float:
    """The smallest per-output cosine between two safetensors files' outputs."""
    import numpy as np
    from safetensors.numpy import load_file

    x, y = load_file(str(a)), load_file(str(b))
    out = []
    for k in x:
        u, v = x[k].astype(np.float64).ravel(), y[k].astype(np.float64).ravel()
        out.append(float(u @ v / (np.linalg.norm(u) * np.linalg.norm(v))))
    return min(out)


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
    run_bin = binary.with_name("ane-run")
    venv_python = ROOT / ".venv" / "bin" / "python"
    env = bt.child_env(args.threads)
    work = args.work or Path(tempfile.mkdtemp(prefix="bench_coreai_"))
    work.mkdir(parents=True, exist_ok=True)
    ckpt = work / "qwen3vl-2b-vision-random"
    art = work / f"art-{args.bucket}-both"
    if not (ckpt / "model.safetensors").is_file():
        n = bt.child_call(bt.__file__, "write_checkpoint", d=str(ckpt), seed=0)
        print(f"checkpoint: {n / 1e6:.1f} M params", flush=True)
    if not (art / "manifest.json").is_file():
        r = bt.run_measured([str(binary), "build", "--model", str(ckpt), "--out", str(art), "--force",
                             "--bucket", args.bucket, "--residual-scale", "1", "--format", "both"], env,
                            work / "build")
        print(f"build --format both: {r['wall_s']:.1f} s, peak RSS {r['rss_mb']:.0f} MB", flush=True)
    manifest = json.loads((art / "manifest.json").read_text())
    aimodel = art / manifest["aimodel"]
    side = int((int(args.bucket[1:]) * 16 * 16) ** 0.5)
    hi = q25.host_inputs(run_bin, art, args.bucket, side, work, env)
    rate = q25.matmul_rate(args.threads, work)["gflops"]
    print(f"matmul rate: {rate:.0f} GFLOP/s", flush=True)

    py_env = dict(env, PYTHONPATH=str(ROOT / "python"))
    rows = {"interpreter": [], "coreai": []}
    for i in range(args.rounds):
        out_i = work / f"interp_{i}.safetensors"
        t, rss = q25.exec_run(binary, art, args.bucket, hi, out_i, "ane", env, work / f"interp_{i}")
        rows["interpreter"].append({"s": t, "rss": rss})
        print(f"interpreter round {i}: {t:.2f} s", flush=True)
        out_c = work / f"coreai_{i}.safetensors"
        r = bt.run_measured([str(venv_python), "-c", CHILD, str(aimodel), args.bucket, str(hi), str(out_c), "2"],
                            py_env, work / f"coreai_{i}")
        c = json.loads(r["stdout"].strip().splitlines()[-1])
        rows["coreai"].append({"s": min(c["runs_s"]), "load": c["load_s"], "first": c["first_s"],
                               "rss": r["rss_mb"], "cos": cosine_all(out_c, out_i)})
        print(f"coreai round {i}: {min(c['runs_s']):.2f} s (load {c['load_s']:.1f} s)", flush=True)

    best = {k: min(v, key=lambda x: x["s"]) for k, v in rows.items()}
    L = [f"### Core AI runtime on Linux against the interpreter, Qwen3-VL-2B-shaped tower, {args.bucket} "
         f"({dt.datetime.now(dt.timezone.utc).strftime('%Y-%m-%d %H:%M:%S UTC')})", ""]
    L.append(f"- command: `{shlex.join([bt._rel(sys.executable)] + sys.argv)}`; binaries `{bt._rel(str(binary))}`, "
             f"`{bt._rel(str(run_bin))}`; Core AI: coreai-core 1.0.0b3 in the project's venv")
    L.append(bt.machine_line(args.threads, rate, binary) + " (the threads are the interpreter's; the Core AI "
             "runtime chooses its own)")
    L.append(f"- one random image filling {args.bucket}; the interpreter in the gates' ane mode, the second of two "
             f"runs; Core AI loaded once, a warm-up, the faster of two runs; {args.rounds} round(s), alternating")
    L.append("")
    L.append("| executor | round | run s | Core AI load s | Core AI first run s | peak RSS MB | min cosine to the "
             "interpreter |")
    L.append("|---|---|---|---|---|---|---|")
    for i in range(args.rounds):
        a, b = rows["interpreter"][i], rows["coreai"][i]
        L.append(f"| interpreter (ane) | {i} | {a['s']:.2f} | - | - | {a['rss']:.0f} | - |")
        L.append(f"| Core AI runtime | {i} | {b['s']:.2f} | {b['load']:.1f} | {b['first']:.2f} | {b['rss']:.0f} | "
                 f"{b['cos']:.6f} |")
    L.append("")
    L.append(f"- Core AI / interpreter, fastest run of each: {best['coreai']['s'] / best['interpreter']['s']:.1f}x")
    report = "\n".join(L) + "\n"
    print(report)
    if args.out:
        with open(args.out, "a") as f:
            f.write("\n" + report)


if __name__ == "__main__":
    main()
