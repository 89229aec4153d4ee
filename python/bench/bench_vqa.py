#!/usr/bin/env python3
"""VQA accuracy and latency of the golden tiny VLM, Rust against transformers.

    .venv-dev/bin/python python/bench/bench_vqa.py [--out BENCHMARKS.md] [--questions N] [--latency-only]

1. Builds golden/tiny-vlm (b1024 and b4096) into a work directory.
2. Writes question files: every easy-vqa test question (or the first N), and
   the questions about 64 canvases composed from test images (the held-out
   canvas set of make_tiny_vlm.py).
3. Runs `ane-export gate --skip residency --skip cosine --vqa FILE` on each:
   the Rust language model answers every question from the reference tower
   (fp32) and from the artifact (MIL interpreter, fp16 emulation); reports
   accuracy of both, side by side, and their agreement.
4. Per-question latency, per bucket (64x64 test images in b1024, a 640x640
   canvas in b4096): `ane-run vqa` (one process per question, as a user
   runs it; its wall time and its JSON timings, from the same runs) against
   transformers' `generate` on the same image and question in this process
   (processor + vision + decoding), both greedy, 2 threads; the machine's
   load average at the start and the end. `--latency-only` skips step 3.
Prints a markdown section and appends it to --out.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "golden"))
import bench_tower as bt  # noqa: E402
import make_tiny_vlm as vlm  # noqa: E402

ROOT = bt.ROOT
MODEL = ROOT / "golden" / "tiny-vlm"


def gate_vqa(binary: Path, art: Path, qfile: Path, env: dict) -> tuple[dict, float]:
    t = time.time()
    p = subprocess.run([str(binary), "gate", str(art), "--skip", "residency", "--skip", "cosine", "--vqa",
                        str(qfile), "--json"], capture_output=True, text=True, env=env)
    secs = time.time() - t
    if p.returncode not in (0, 1):
        raise SystemExit(f"gate failed ({p.returncode}):\n{p.stderr}")
    return json.loads(p.stdout)["gates"]["vqa"], secs


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path)
    ap.add_argument("--questions", type=int, default=0, help="first N test questions (default: all)")
    ap.add_argument("--latency-runs", type=int, default=10)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--latency-only", action="store_true",
                    help="skip the two accuracy gates; time the per-question latency alone")
    args = ap.parse_args()
    import easy_vqa
    import torch
    from PIL import Image
    from transformers import Qwen3VLForConditionalGeneration

    bins = ROOT / "target" / "release"
    env = bt.child_env(args.threads)
    work = Path(tempfile.mkdtemp(prefix="bench-vqa-"))
    art = work / "tiny-vlm"
    subprocess.run([str(bins / "ane-export"), "build", "--model", str(MODEL), "--out", str(art)], check=True,
                   env=env, capture_output=True)

    all_q, test_img = vlm.load_split("test")
    test_lab = vlm.labels(all_q, test_img)
    test_q = all_q[: args.questions] if args.questions else all_q
    paths = easy_vqa.get_test_image_paths()
    qfile = work / "test.jsonl"
    qfile.write_text("".join(json.dumps(dict(image=paths[i], question=q, answer=a)) + "\n"
                             for q, a, i in sorted(test_q, key=lambda x: x[2])))
    canvases = vlm.canvas_questions(test_img, test_lab, 100, 64,
                                    [(c, c) for c in vlm.CELLS] + vlm.GOLDEN_CANVAS_SIZES)
    cdir = work / "canvases"
    cdir.mkdir()
    lines = []
    for name, img, qs in canvases:
        img.save(cdir / name)
        lines += [json.dumps(dict(image=f"canvases/{name}", question=q, answer=a)) + "\n" for q, a in qs]
    cfile = work / "canvases.jsonl"
    cfile.write_text("".join(lines))

    rows = []
    load_start = " ".join(f"{x:.2f}" for x in os.getloadavg())
    for label, f in [] if args.latency_only else [("easy-vqa test split", qfile),
                                                  ("canvases from test images (64, both buckets)", cfile)]:
        g, secs = gate_vqa(bins / "ane-export", art, f, env)
        rows.append((label, len(g["questions"]), g, secs))
        print(label, g["message"], f"{secs:.0f}s", flush=True)

    # latency: ane-run vqa per question vs transformers generate, on the
    # artifact accepted by the whole gate (ane-run refuses one gated with --skip)
    subprocess.run([str(bins / "ane-export"), "gate", str(art)], check=True, env=env, capture_output=True)
    torch.set_num_threads(args.threads)
    model = Qwen3VLForConditionalGeneration.from_pretrained(MODEL, dtype=torch.float32).eval()
    from tokenizers import Tokenizer
    tok = Tokenizer.from_file(str(MODEL / "tokenizer.json"))
    batcher = vlm.Batcher(tok, vlm.Qwen2VLImageProcessor(**{k: v for k, v in vlm.PREPROCESSOR_CONFIG.items()
                                                            if k != "image_processor_type"}), model.config)
    # One warm-up of each side (page cache, first allocations), not timed.
    big = next(c for c in canvases if c[0].endswith("640x640.png"))  # 1600 patches: b4096
    kinds = {"b1024": [(paths[i], q) for q, _, i in test_q[: args.latency_runs]],
             "b4096": [(str(cdir / big[0]), q) for q, _ in big[2][: max(2, args.latency_runs // 3)]]}
    cols = ["process wall", "load", "tower", "prefill", "decode", "ane-run total", "transformers generate"]
    lat = {k: {c: [] for c in cols} for k in kinds}
    buckets_seen = {}
    for kind, samples in kinds.items():
        for n, (path, q) in enumerate([samples[0]] + samples):
            t = time.time()
            p = subprocess.run([str(bins / "ane-run"), "vqa", "--artifact", str(art), "--image", path, "--question",
                                q, "--json"], capture_output=True, text=True, env=env, check=True)
            wall = time.time() - t
            out = json.loads(p.stdout)
            j = out["timings_s"]
            buckets_seen.setdefault(kind, set()).add(out.get("bucket", "?"))
            t = time.time()
            with torch.no_grad():
                inputs, _ = batcher.batch([Image.open(path).convert("RGB")], [q])
                model.generate(**inputs, max_new_tokens=32, do_sample=False)
            gen = time.time() - t
            if n == 0:
                continue
            for c, v in zip(cols, [wall, j["load"], j["tower"], j["prefill"], j["decode"], j["total"], gen]):
                lat[kind][c].append(v)
    load_end = " ".join(f"{x:.2f}" for x in os.getloadavg())

    now = dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")
    L = [f"### VQA latency: the golden tiny VLM, ane-run vqa against transformers ({now})" if args.latency_only
         else f"### VQA: the golden tiny VLM, accuracy and latency ({now})", ""]
    L.append(f"- command: `{shlex.join([bt._rel(sys.executable)] + sys.argv)}`")
    L.append(bt.machine_line(args.threads, None, ROOT / "target/release/ane-export") + " (for every side)")
    if rows:
        L.append("- Rust: `ane-export gate --skip residency --skip cosine --vqa FILE`: the Rust language model "
                 "answers each question greedily from the fp32 reference tower and from the artifact run by the "
                 "MIL interpreter in fp16 emulation")
    L.append(f"- load average (1, 5, 15 min): {load_start} at the start, {load_end} at the end")
    if rows:
        L.append("")
        L.append("| questions | n | accuracy, reference tower | accuracy, artifact (fp16) | agreement | gate wall time |")
        L.append("|---|---|---|---|---|---|")
    for label, n, g, secs in rows:
        L.append(f"| {label} | {n} | {g['accuracy_reference'] * 100:.2f}% | {g['accuracy_artifact'] * 100:.2f}% | "
                 f"{g['agreement'] * 100:.2f}% | {secs:.0f} s |")
    L.append("")
    L.append("Per-question latency: each question is one `ane-run vqa --json` process (its wall time measured "
             "by this script, the other columns from its `timings_s`), then transformers' `generate` on the same "
             "image and question in this warm process (processor, fp32 tower, greedy decoding, 32 tokens at most). "
             "One untimed warm-up of each kind first. Median (min to max), ms:")
    L.append("")
    L.append("| image | bucket | n | " + " | ".join(cols) + " |")
    L.append("|---|---|---|" + "---|" * len(cols))
    desc = {"b1024": "64x64 test image", "b4096": "640x640 canvas"}
    for kind, d in lat.items():
        cells = [f"{bt.med(v) * 1000:.0f} ({min(v) * 1000:.0f} to {max(v) * 1000:.0f})" for v in d.values()]
        L.append(f"| {desc[kind]} | {', '.join(sorted(buckets_seen[kind]))} | {len(d['tower'])} | "
                 + " | ".join(cells) + " |")
    L.append("")
    for kind, d in lat.items():
        ratio = bt.med(d["process wall"]) / bt.med(d["transformers generate"])
        L.append(f"- {desc[kind]}: `ane-run vqa` per question (a fresh process: load, hash check, tower in fp16 "
                 f"emulation, decoding) takes {ratio:.2f}x the time of transformers' `generate` in a warm process "
                 "(fp32 tower).")
    bt.emit(L, args.out)


if __name__ == "__main__":
    main()
