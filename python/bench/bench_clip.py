#!/usr/bin/env python3
"""Benchmark a CLIP ViT-L/14-336-shaped vision tower: the Rust reference and
the MIL interpreter (fp32, fp16 emulation) against transformers, side by side
in one run, with GFLOP/s against this machine's fp32 matmul rate; `build`;
and the whole gate (residency, cosine, task).

    .venv-dev/bin/python python/bench/bench_clip.py [--bin target/release/ane-export]
        [--run-bin target/release/ane-run] [--rounds 2] [--no-gate] [--out BENCHMARKS.md]

The tower (24 blocks, width 1024, 16 heads, MLP 4096, patch 14, 336 px: 576
patches and the class token, projection 768, quick GELU) gets random bf16
weights (seed 0) in a temporary `CLIPVisionModelWithProjection`-style
checkpoint (`vision_model.*` and `visual_projection.weight`), with
openai/clip-vit-large-patch14-336's processor config.

- transformers: a child process builds `CLIPVisionModel` from the config,
  loads the bf16 weights upcast to fp32 (every key checked), sdpa, 2 threads,
  one warm-up forward, then times one forward of one image.
- reference: `ane-export reference --pixel-values` (its `forward_s`).
- interpreter: `ane-run host-inputs` of a random 336 x 336 image, `ane-export
  exec --runs 2` (the second run timed), in fp32 and fp16.
- matmul rate: numpy's OpenBLAS sgemm 4096 x 4096, as bench_qwen25.py measures it.
- gate: `ane-export gate` with the golden images and labels, wall time and peak RSS.

Rounds alternate every run so that the shared machine's drift falls on all of
them; the table gives medians. Peak RSS per child from os.wait4.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import shlex
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_qwen25 as bq  # noqa: E402  (matmul_rate, exec_run, host_inputs)
import bench_tower as bt  # noqa: E402  (run_measured, child_env, cpu_model)

ROOT = Path(__file__).resolve().parents[2]
PATCH, SIDE = 14, 336
MEAN = [0.48145466, 0.4578275, 0.40821073]
STD = [0.26862954, 0.26130258, 0.27577711]
VISION = {"hidden_size": 1024, "intermediate_size": 4096, "num_hidden_layers": 24, "num_attention_heads": 16,
          "image_size": SIDE, "patch_size": PATCH, "hidden_act": "quick_gelu", "layer_norm_eps": 1e-5,
          "projection_dim": 768}
PREPROCESSOR = {"crop_size": {"height": SIDE, "width": SIDE}, "do_center_crop": True, "do_convert_rgb": True,
                "do_normalize": True, "do_rescale": True, "do_resize": True, "image_mean": MEAN,
                "image_processor_type": "CLIPImageProcessor", "image_std": STD, "resample": 3,
                "rescale_factor": 1 / 255, "size": {"shortest_edge": SIDE}}


def vision_model(device: str):
    import torch
    from transformers import CLIPVisionConfig, CLIPVisionModel

    cfg = CLIPVisionConfig(**VISION)
    cfg._attn_implementation = "sdpa"
    with torch.device(device):
        return CLIPVisionModel(cfg)


def write_checkpoint(d: Path, seed: int) -> int:
    import torch
    from safetensors.torch import save_file

    d.mkdir(parents=True, exist_ok=True)
    cfg = dict(VISION, model_type="clip_vision_model", architectures=["CLIPVisionModelWithProjection"])
    (d / "config.json").write_text(json.dumps(cfg, indent=2) + "\n")
    (d / "preprocessor_config.json").write_text(json.dumps(PREPROCESSOR, indent=2) + "\n")
    g = torch.Generator().manual_seed(seed)
    tensors = {}
    for name, p in sorted(vision_model("meta").named_parameters()):
        if p.dim() == 1 and "norm" in name:
            t = 1.0 + 0.1 * torch.randn(p.shape, generator=g)
        else:
            t = 0.02 * torch.randn(p.shape, generator=g)
        tensors["vision_model." + name.removeprefix("vision_model.")] = t.to(torch.bfloat16)
    tensors["visual_projection.weight"] = (0.02 * torch.randn((VISION["projection_dim"], VISION["hidden_size"]),
                                                              generator=g)).to(torch.bfloat16)
    save_file(tensors, d / "model.safetensors", metadata={"format": "pt"})
    return sum(t.numel() for t in tensors.values())


def write_inputs(path: Path, seed: int) -> None:
    """Random levels normalised as the processor does: patch rows in raster order, (c, py, px)."""
    import torch
    from safetensors.torch import save_file

    g = (SIDE // PATCH)
    gen = torch.Generator().manual_seed(seed)
    lv = torch.randint(0, 256, (g * g, 3, PATCH * PATCH), generator=gen, dtype=torch.uint8).to(torch.float32) / 255.0
    x = (lv - torch.tensor(MEAN).view(1, 3, 1)) / torch.tensor(STD).view(1, 3, 1)
    save_file({"pixel_values": x.reshape(g * g, -1).contiguous(),
               "grid_thw": torch.tensor([[1, g, g]], dtype=torch.int64)}, path)


def child_torch(args) -> None:
    import resource

    import torch
    import transformers
    from safetensors.torch import load_file, save_file

    torch.set_num_threads(args.threads)
    t0 = time.perf_counter()
    model = vision_model("cpu").eval()
    sd = {k.removeprefix("vision_model."): v.to(torch.float32)
          for k, v in load_file(Path(args.model) / "model.safetensors").items() if k.startswith("vision_model.")}
    want = {k.removeprefix("vision_model.") for k in model.state_dict()}
    assert set(sd) == want, sorted(set(sd) ^ want)[:5]
    model.vision_model.load_state_dict(sd, strict=True)
    del sd
    rows = load_file(args.pixel_values)["pixel_values"]
    g = SIDE // PATCH
    pv = rows.reshape(1, g, g, 3, PATCH, PATCH).permute(0, 3, 1, 4, 2, 5).reshape(1, 3, SIDE, SIDE).contiguous()
    load_s = time.perf_counter() - t0
    with torch.inference_mode():
        model(pixel_values=pv)
        t1 = time.perf_counter()
        out = model(pixel_values=pv)
        forward_s = time.perf_counter() - t1
    save_file({"last_hidden_state": out.last_hidden_state[0].contiguous()}, args.child_out)
    print(json.dumps({"load_s": load_s, "forward_s": forward_s,
                      "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0,
                      "versions": f"torch {torch.__version__}, transformers {transformers.__version__}"}))


def tower_flops() -> float:
    """FLOPs of one forward: every matrix on its tokens, and the attention products (4 s^2 d per block)."""
    d, i, depth = VISION["hidden_size"], VISION["intermediate_size"], VISION["num_hidden_layers"]
    n = (SIDE // PATCH) ** 2
    s = n + 1
    return depth * (2 * s * (4 * d * d + 2 * d * i) + 4.0 * s * s * d) + 2 * n * 3 * PATCH * PATCH * d \
        + 2 * d * VISION["projection_dim"]


def min_cosine(a: Path, b: Path) -> float:
    from safetensors.numpy import load_file

    x = load_file(str(a))["last_hidden_state"].astype("float64")
    y = load_file(str(b))["last_hidden_state"].astype("float64")
    c = (x * y).sum(1) / ((x * x).sum(1) ** 0.5 * (y * y).sum(1) ** 0.5)
    return float(c.min())


def gate_measured(cmd: list[str], env: dict) -> dict:
    """Run the gate; wall time and peak RSS whatever its verdict (exit 1 is a failed gate, not a failed run)."""
    import subprocess

    t0 = time.perf_counter()
    p = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
    _, status, ru = os.wait4(p.pid, 0)
    code = os.waitstatus_to_exitcode(status)
    if code not in (0, 1):
        raise SystemExit(f"gate could not run ({code}): {shlex.join(cmd)}")
    return {"wall_s": time.perf_counter() - t0, "rss_mb": ru.ru_maxrss / 1024.0}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bin", default="target/release/ane-export")
    ap.add_argument("--run-bin", default="target/release/ane-run")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--no-gate", action="store_true", help="skip the whole-gate measurement")
    ap.add_argument("--out", type=Path)
    ap.add_argument("--workdir", type=Path)
    ap.add_argument("--child-torch", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--model", help=argparse.SUPPRESS)
    ap.add_argument("--pixel-values", help=argparse.SUPPRESS)
    ap.add_argument("--child-out", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child_torch:
        return child_torch(args)

    binary, run_bin = (ROOT / args.bin).resolve(), (ROOT / args.run_bin).resolve()
    work = args.workdir or Path(tempfile.mkdtemp(prefix="bench-clip-"))
    work.mkdir(parents=True, exist_ok=True)
    env = bt.child_env(args.threads)
    ck = work / "clip-l14-336"
    n_params = write_checkpoint(ck, 0)
    weight_mb = n_params * 2 / 1e6
    print(f"checkpoint: {n_params / 1e6:.1f} M parameters, {weight_mb:.0f} MB in bf16/fp16", flush=True)
    peak = bq.matmul_rate(args.threads, work)
    print(f"matmul rate: {peak['gflops']:.0f} GFLOP/s", flush=True)

    art = work / "art"
    b = bt.run_measured([str(binary), "build", "--model", str(ck), "--out", str(art), "--force"], env, work / "build")
    build = {"wall_s": b["wall_s"], "rss_mb": b["rss_mb"]}
    print(f"build: {build['wall_s']:.1f} s, {build['rss_mb']:.0f} MB", flush=True)
    bucket = f"b{SIDE}"
    hi = bq.host_inputs(run_bin, art, bucket, SIDE, work, env)
    pv = work / "pv.safetensors"
    write_inputs(pv, 0)
    rounds, versions = [], ""
    for k in range(args.rounds):
        r = {}
        tr = bt.run_measured([sys.executable, str(Path(__file__).resolve()), "--child-torch", "--model", str(ck),
                              "--pixel-values", str(pv), "--child-out", str(work / "torch.safetensors"),
                              "--threads", str(args.threads)], env, work / "torch")
        rep = json.loads(tr["stdout"].strip().splitlines()[-1])
        r["torch"], versions = (rep["forward_s"], tr["rss_mb"]), rep["versions"]
        rr = bt.run_measured([str(binary), "reference", "--model", str(ck), "--pixel-values", str(pv), "--out",
                              str(work / "ref.safetensors")], env, work / "ref")
        m = None
        for line in rr["stderr"].splitlines():
            m = bt.TIMING_RE.search(line) or m
        r["reference"] = (float(m.group(2)) if m else rr["wall_s"], rr["rss_mb"])
        for prec in ("fp32", "fp16"):
            r[prec] = bq.exec_run(binary, art, bucket, hi, work / f"ho{prec}.safetensors", prec, env,
                                  work / f"exec{prec}")
        print(f"[round {k + 1}/{args.rounds}] " + ", ".join(f"{a} {v[0]:.2f} s" for a, v in r.items()), flush=True)
        rounds.append(r)
    row = {key: tuple(statistics.median(x[key][i] for x in rounds) for i in range(2)) for key in rounds[0]}
    cos = min_cosine(work / "ref.safetensors", work / "torch.safetensors")
    gate = None
    if not args.no_gate:
        g = gate_measured([str(binary), "gate", str(art), "--model", str(ck), "--images",
                           str(ROOT / "golden" / "images"), "--task", str(ROOT / "golden" / "task" / "labels.jsonl")],
                          env)
        rep = json.loads((art / "gate" / "report.json").read_text())
        gate = {"wall_s": g["wall_s"], "rss_mb": g["rss_mb"], "accepted": rep["accepted"],
                "statuses": {k: v["status"] for k, v in rep["gates"].items()}}
        print(f"gate: {gate['wall_s']:.1f} s, {gate['rss_mb']:.0f} MB, {gate['statuses']}", flush=True)

    stamp = dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")
    fl = tower_flops()
    L = [f"### CLIP ViT-L/14-336-shaped tower: reference, interpreter, build, gate ({stamp})", "",
         f"- command: `.venv-dev/bin/python python/bench/bench_clip.py {shlex.join(bt._rel(a) for a in sys.argv[1:])}`",
         f"- machine: `uname -m` = {platform.machine()}, CPU {bt.cpu_model()}, {os.cpu_count()} logical CPUs; "
         f"{args.threads} threads; load average at end {' '.join(f'{x:.2f}' for x in os.getloadavg())}",
         f"- tower: 24 blocks, width 1024, 16 heads, MLP 4096, patch 14, 336 px (576 patches + the class token), "
         f"projection 768; {n_params / 1e6:.1f} M parameters, random bf16 ({weight_mb:.0f} MB as fp16); {versions}; "
         f"{args.rounds} rounds, medians",
         f"- this machine's fp32 matmul rate: **{peak['gflops']:.0f} GFLOP/s** (numpy sgemm 4096, best of 5, "
         f"OPENBLAS_CORETYPE and OPENBLAS_L2_SIZE unset; {peak['blas']})", "",
         "| run | forward s | peak RSS MB | / transformers | GFLOP/s | of matmul rate |", "|---|---|---|---|---|---|"]
    for key, label in (("torch", "transformers fp32"), ("reference", "reference fp32"),
                       ("fp32", "interpreter fp32"), ("fp16", "interpreter fp16 emulation")):
        s, rss = row[key]
        L.append(f"| {label} | {s:.3f} | {rss:.0f} | {s / row['torch'][0]:.2f}x | {fl / s / 1e9:.0f} | "
                 f"{fl / s / 1e9 / peak['gflops'] * 100:.0f}% |")
    L += ["", f"- min cosine between the reference's and transformers' `last_hidden_state` rows: {cos:.6f}",
          f"- build of b336: {build['wall_s']:.1f} s, peak RSS {build['rss_mb']:.0f} MB "
          f"({build['rss_mb'] / weight_mb:.2f}x the fp16 weights)"]
    if gate:
        L.append(f"- whole gate (residency, cosine over the 9 golden cases, task over 450 labelled images): "
                 f"{gate['wall_s']:.1f} s, peak RSS {gate['rss_mb']:.0f} MB ({gate['rss_mb'] / weight_mb:.2f}x the "
                 f"fp16 weights); statuses {gate['statuses']}, accepted {gate['accepted']}")
    L.append("")
    bt.emit(L, args.out)


if __name__ == "__main__":
    main()
