#!/usr/bin/env python3
"""Benchmark `ane-run embed` over a folder of images, with and without overlap.

    .venv-dev/bin/python python/bench/bench_embed.py [--images 200] [--out BENCHMARKS.md]
        [--artifact-2b DIR --images-2b 20 [--max-side-2b 512] [--overlap-only-2b]]

1. Writes a folder of N deterministic synthetic images (PNG and JPEG, sizes
   from 96 to 900 pixels a side, random shapes on gradients).
2. Builds and gates the bundled tiny model (b1024 and b4096) unless given.
3. Runs `ane-run embed` over the folder twice in fresh processes: host work
   overlapped with execution (`--jobs 2`, the default) and `--no-overlap`.
   Reports images per second and the share of wall time spent on host work
   (decode + preprocess, summed from the per-image JSON lines).
4. Optionally the same on a Qwen3-VL-2B-shaped artifact (bench_gate.py's
   work directory) over a smaller folder: up to 512 pixels a side (b1024
   only) by default; with --max-side-2b larger, a mix of b1024 and b4096.
   The interpreter's time for each bucket is measured in the same run
   (`ane-export exec --function B --runs 2` on the host inputs of one of
   the folder's images, the second run, the precision `embed` uses), and
   the embed run is reported against it: images/s, and the wall time over
   the sum of each image's bucket time (1.00 would mean host work, bucket
   choice and the runtime cost nothing beyond executing the buckets).
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
import bench_tower as bt  # noqa: E402

ROOT = bt.ROOT


def write_images(d: Path, n: int, max_side: int, seed: int = 0) -> None:
    import numpy as np
    from PIL import Image, ImageDraw

    d.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    for i in range(n):
        w, h = (int(x) for x in rng.integers(96, max_side, 2))
        y, x = np.mgrid[0:h, 0:w]
        base = np.stack([x * 255 // w, y * 255 // h, (x + y) * 127 // (w + h) * 2], -1).astype(np.uint8)
        img = Image.fromarray(base)
        draw = ImageDraw.Draw(img)
        for _ in range(4):
            x0, y0 = int(rng.integers(0, w - 8)), int(rng.integers(0, h - 8))
            x1, y1 = x0 + int(rng.integers(8, max(9, w // 2))), y0 + int(rng.integers(8, max(9, h // 2)))
            colour = tuple(int(c) for c in rng.integers(0, 256, 3))
            (draw.ellipse if rng.random() < 0.5 else draw.rectangle)([x0, y0, x1, y1], fill=colour)
        if i % 2:
            img.save(d / f"img{i:03d}.jpg", quality=90)
        else:
            img.save(d / f"img{i:03d}.png")


def embed(run_bin: Path, art: Path, imgs: Path, out: Path, env: dict, extra: list[str], log: Path) -> dict:
    cmd = [str(run_bin), "embed", "--artifact", str(art), str(imgs), "--out", str(out), *extra]
    r = bt.run_measured(cmd, env, log)
    lines = [json.loads(l) for l in r["stdout"].splitlines() if l.strip()]
    host = sum(l["seconds"]["decode"] + l["seconds"]["preprocess"] for l in lines)
    execute = sum(l["seconds"]["execute"] for l in lines)
    buckets = {}
    for l in lines:
        buckets[l["bucket"]] = buckets.get(l["bucket"], 0) + 1
    return {"images": len(lines), "wall": r["wall_s"], "rss": r["rss_mb"], "host": host, "execute": execute,
            "buckets": buckets, "per_image": [(l["image"], l["bucket"]) for l in lines]}


def bucket_times(binary: Path, run_bin: Path, art: Path, imgs: Path, per_image: list, env: dict,
                 work: Path) -> dict:
    """Seconds of one warm `exec` run of each bucket the embed run used, on
    the host inputs of one of its images (fp32, as `embed` runs)."""
    out = {}
    for image, bucket in per_image:
        if bucket in out:
            continue
        hi = work / f"hi_{bucket}.safetensors"
        bt.run_measured([str(run_bin), "host-inputs", "--artifact", str(art), "--bucket", bucket, "--image",
                         str(imgs / Path(image).name), "--out", str(hi)], env, work / f"hi_{bucket}")
        e = bt.run_measured([str(binary), "exec", str(art / f"{art.name}.mlpackage"), "--function", bucket,
                             "--inputs", str(hi), "--out", str(work / f"ho_{bucket}.safetensors"), "--precision",
                             "fp32", "--runs", "2"], env, work / f"exec_{bucket}")
        runs = [ln for ln in e["stderr"].splitlines() if "seconds per run:" in ln]
        out[bucket] = float(runs[-1].split(":")[-1].split(",")[-1])
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", default="target/release/ane-export")
    ap.add_argument("--run-bin", default="target/release/ane-run")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--images", type=int, default=200)
    ap.add_argument("--artifact-2b", type=Path, help="a gated 2B-shaped artifact (bench_gate.py's work/art)")
    ap.add_argument("--images-2b", type=int, default=20)
    ap.add_argument("--max-side-2b", type=int, default=512, help="largest image side of the 2B folder")
    ap.add_argument("--overlap-only-2b", action="store_true", help="2B: the default (overlapped) run only")
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    binary = (ROOT / args.bin).resolve()
    run_bin = (ROOT / args.run_bin).resolve()
    env = bt.child_env(args.threads)
    work = Path(tempfile.mkdtemp(prefix="bench_embed_"))
    imgs = work / "imgs"
    write_images(imgs, args.images, 900)
    art = work / "tiny"
    bt.run_measured([str(binary), "build", "--model", str(ROOT / "golden/models/tiny-a"), "--out", str(art)], env,
                    work / "build")
    bt.run_measured([str(binary), "gate", str(art), "--skip", "vqa", "--images", str(ROOT / "golden/images")], env,
                    work / "gate")
    rows = []
    for name, extra in (("overlap (--jobs 2)", []), ("no overlap", ["--no-overlap"])):
        # tiny-a has no language model, so its gate skips VQA and cannot accept it.
        r = embed(run_bin, art, imgs, work / "out", env, extra + ["--allow-unaccepted"], work / f"embed_{len(rows)}")
        rows.append(("tiny-a (b1024, b4096), fp32 interpreter", name, r))
        print(name, {k: v for k, v in r.items() if k != "per_image"}, flush=True)
    bucket_s = {}
    if args.artifact_2b:
        imgs2 = work / "imgs2b"
        write_images(imgs2, args.images_2b, args.max_side_2b, seed=1)
        modes = [("overlap (--jobs 2)", [])]
        if not args.overlap_only_2b:
            modes.append(("no overlap", ["--no-overlap"]))
        for name, extra in modes:
            r = embed(run_bin, args.artifact_2b, imgs2, work / "out2", env, extra + ["--allow-unaccepted"],
                      work / f"embed2b_{len(rows)}")
            rows.append(("2B-shaped, fp32 interpreter", name, r))
            print(name, {k: v for k, v in r.items() if k != "per_image"}, flush=True)
        bucket_s = bucket_times(binary, run_bin, args.artifact_2b, imgs2, r["per_image"], env, work)
        print(f"bucket times: {bucket_s}", flush=True)

    L = [f"### ane-run embed over a folder ({dt.datetime.now(dt.timezone.utc).strftime('%Y-%m-%d %H:%M:%S UTC')})", ""]
    L.append(f"- command: `{shlex.join([bt._rel(sys.executable)] + sys.argv)}`")
    L.append(bt.machine_line(args.threads, None, args.bin))
    L.append(f"- images: deterministic synthetic PNG and JPEG, 96 to 900 pixels a side (2B: to {args.max_side_2b})")
    L.append("")
    L.append("| artifact | mode | images | buckets used | wall s | images/s | host work s (sum) | host share of wall | "
             "peak RSS MB |")
    L.append("|---|---|---|---|---|---|---|---|---|")
    for art_name, mode, r in rows:
        L.append(f"| {art_name} | {mode} | {r['images']} | {', '.join(f'{k}: {v}' for k, v in sorted(r['buckets'].items()))} "
                 f"| {r['wall']:.1f} | {r['images'] / r['wall']:.2f} | {r['host']:.1f} | {r['host'] / r['wall']:.1%} | "
                 f"{r['rss']:.0f} |")
    by = {}
    for art_name, mode, r in rows:
        by.setdefault(art_name, {})[mode] = r
    L.append("")
    for art_name, m in by.items():
        if len(m) == 2:
            a, b = m["overlap (--jobs 2)"], m["no overlap"]
            L.append(f"- {art_name}: overlap / no overlap throughput ratio "
                     f"{(a['images'] / a['wall']) / (b['images'] / b['wall']):.2f}")
    if bucket_s:
        L.append("- 2B-shaped: the interpreter's time per bucket (`exec --runs 2`, the second run, fp32): "
                 + ", ".join(f"{b} {t:.2f} s" for b, t in sorted(bucket_s.items())))
        for art_name, mode, r in rows:
            if art_name.startswith("2B"):
                floor = sum(bucket_s[b] for _, b in r["per_image"])
                L.append(f"- 2B-shaped, {mode}: {r['images'] / r['wall']:.3f} images/s; the images' bucket times "
                         f"sum to {floor:.1f} s ({r['images'] / floor:.3f} images/s); wall / that sum "
                         f"{r['wall'] / floor:.2f}")
    report = "\n".join(L) + "\n"
    print(report)
    if args.out:
        with open(args.out, "a") as f:
            f.write("\n" + report)


if __name__ == "__main__":
    main()
