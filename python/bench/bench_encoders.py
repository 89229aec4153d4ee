#!/usr/bin/env python3
"""Benchmark encoder towers, a CLIP ViT-L/14-336-shaped one, a
SigLIP-so400m-shaped one, a SigLIP2-so400m-NaFlex-shaped one and a DINOv2-L/14-shaped one: the Rust reference and the MIL interpreter (fp32,
fp16 emulation) against transformers, side by side in one run, with
GFLOP/s against this machine's fp32 matmul rate; `build`; and, with
`--gate`, the whole gate (residency, cosine, task).

    .venv-dev/bin/python python/bench/bench_encoders.py [--bin target/release/ane-export]
        [--run-bin target/release/ane-run] [--rounds 2] [--towers clip-l so400m so400m-naflex dinov2-l]
        [--gate clip-l]
        [--out BENCHMARKS.md]

The towers get random bf16 weights (seed 0) in temporary checkpoints laid out
as the released ones (`vision_model.*`, and CLIP's `visual_projection.weight`;
DINOv2's at the top level), with their released processor configs:
- clip-l: 24 blocks, width 1024, 16 heads, MLP 4096, patch 14, 336 px (576
  patches and the class token), projection 768, quick GELU;
- so400m: 27 blocks, width 1152, 16 heads, MLP 4304, patch 14, 384 px (27 x
  27 = 729 patches: the convolution drops the last 6 pixels), tanh GELU, the
  attention-pooling head;
- so400m-naflex: so400m's blocks and head at patch 16, a 16 x 16 position
  table, and a bucket of 1024 patches (transformers' `max_num_patches`) filled
  by one 512 x 512 image (32 x 32 patches: the table resized, no padding);
- dinov2-l: 24 blocks, width 1024, 16 heads, MLP 4096, LayerScale, patch 14,
  a position table for 518 px and the released processor's 224 px crop (16 x
  16 = 256 patches and the class token: the table resampled, bicubic).

- transformers: a child process builds `CLIPVisionModel` / `SiglipVisionModel`
  from the config, loads the bf16 weights upcast to fp32 (every key
  checked), sdpa, 2 threads, one warm-up forward, then times one forward of
  one image.
- reference: `ane-export reference --pixel-values` (its `forward_s`).
- interpreter: `ane-run host-inputs` of a random image of the bucket's side,
  `ane-export exec --runs 2` (the second run timed), in fp32 and fp16.
- matmul rate: numpy's OpenBLAS sgemm 4096 x 4096, as bench_qwen25.py measures it.
- gate: `ane-export gate` with the golden images and labels (9 cosine cases,
  450 labelled images for the task gate), wall time and peak RSS.

Rounds alternate every run so that the shared machine's drift falls on all of
them; the table gives medians. Peak RSS per child from os.wait4. A child's
peak RSS on Linux starts from its parent's at the fork, so this script's own
process stays small: the checkpoint and the inputs are written by a child
(`--child-write`), and torch is never imported here.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
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
CLIP_MEAN = [0.48145466, 0.4578275, 0.40821073]
CLIP_STD = [0.26862954, 0.26130258, 0.27577711]
TOWERS = {
    "clip-l": {
        "family": "clip", "side": 336, "patch": 14, "mean": CLIP_MEAN, "std": CLIP_STD,
        "describe": "CLIP ViT-L/14-336-shaped: 24 blocks, width 1024, 16 heads, MLP 4096, patch 14, 336 px "
                    "(576 patches + the class token), projection 768",
        "vision": {"hidden_size": 1024, "intermediate_size": 4096, "num_hidden_layers": 24, "num_attention_heads": 16,
                   "image_size": 336, "patch_size": 14, "hidden_act": "quick_gelu", "layer_norm_eps": 1e-5,
                   "projection_dim": 768},
        "processor": {"crop_size": {"height": 336, "width": 336}, "do_center_crop": True, "do_convert_rgb": True,
                      "do_normalize": True, "do_rescale": True, "do_resize": True, "image_mean": CLIP_MEAN,
                      "image_processor_type": "CLIPImageProcessor", "image_std": CLIP_STD, "resample": 3,
                      "rescale_factor": 1 / 255, "size": {"shortest_edge": 336}},
    },
    "so400m": {
        "family": "siglip", "side": 384, "patch": 14, "mean": [0.5] * 3, "std": [0.5] * 3,
        "describe": "SigLIP-so400m-shaped: 27 blocks, width 1152, 16 heads, MLP 4304, patch 14, 384 px "
                    "(729 patches), attention-pooling head",
        "vision": {"hidden_size": 1152, "intermediate_size": 4304, "num_hidden_layers": 27, "num_attention_heads": 16,
                   "image_size": 384, "patch_size": 14, "hidden_act": "gelu_pytorch_tanh", "layer_norm_eps": 1e-6},
        "processor": {"do_convert_rgb": True, "do_normalize": True, "do_rescale": True, "do_resize": True,
                      "image_mean": [0.5] * 3, "image_processor_type": "SiglipImageProcessor", "image_std": [0.5] * 3,
                      "resample": 3, "rescale_factor": 1 / 255, "size": {"height": 384, "width": 384}},
    },
    "so400m-naflex": {
        "family": "siglip2", "side": 512, "patch": 16, "mean": [0.5] * 3, "std": [0.5] * 3, "budget": 1024,
        "describe": "SigLIP2-so400m-NaFlex-shaped: 27 blocks, width 1152, 16 heads, MLP 4304, patch 16, a 16 x 16 "
                    "table resized to 32 x 32, a bucket of 1024 patches (no padding), attention-pooling head",
        "vision": {"hidden_size": 1152, "intermediate_size": 4304, "num_hidden_layers": 27, "num_attention_heads": 16,
                   "num_patches": 256, "patch_size": 16, "hidden_act": "gelu_pytorch_tanh", "layer_norm_eps": 1e-6},
        "processor": {"do_convert_rgb": True, "do_normalize": True, "do_rescale": True, "do_resize": True,
                      "image_mean": [0.5] * 3, "image_processor_type": "Siglip2ImageProcessor", "image_std": [0.5] * 3,
                      "max_num_patches": 1024, "patch_size": 16, "resample": 2, "rescale_factor": 1 / 255},
    },
    "dinov2-l": {
        "family": "dinov2", "side": 224, "patch": 14, "mean": [0.485, 0.456, 0.406], "std": [0.229, 0.224, 0.225],
        "prefix": "",
        "describe": "DINOv2-L/14-shaped: 24 blocks, width 1024, 16 heads, MLP 4096, LayerScale, patch 14, a 518 px "
                    "position table resampled to 224 px (256 patches + the class token)",
        "vision": {"hidden_size": 1024, "num_hidden_layers": 24, "num_attention_heads": 16, "mlp_ratio": 4,
                   "image_size": 518, "patch_size": 14, "hidden_act": "gelu", "layer_norm_eps": 1e-6},
        "processor": {"crop_size": {"height": 224, "width": 224}, "do_center_crop": True, "do_convert_rgb": True,
                      "do_normalize": True, "do_rescale": True, "do_resize": True,
                      "image_mean": [0.485, 0.456, 0.406], "image_processor_type": "BitImageProcessor",
                      "image_std": [0.229, 0.224, 0.225], "resample": 3, "rescale_factor": 1 / 255,
                      "size": {"shortest_edge": 256}},
    },
}


def vision_model(tower: dict, device: str):
    import torch
    from transformers import (
        CLIPVisionConfig,
        CLIPVisionModel,
        Dinov2Config,
        Dinov2Model,
        Siglip2VisionConfig,
        Siglip2VisionModel,
        SiglipVisionConfig,
        SiglipVisionModel,
    )

    if tower["family"] == "clip":
        cfg, cls = CLIPVisionConfig(**tower["vision"]), CLIPVisionModel
    elif tower["family"] == "dinov2":
        cfg, cls = Dinov2Config(**tower["vision"]), Dinov2Model
    elif tower["family"] == "siglip2":
        cfg, cls = Siglip2VisionConfig(**tower["vision"]), Siglip2VisionModel
    else:
        cfg, cls = SiglipVisionConfig(**tower["vision"]), SiglipVisionModel
    cfg._attn_implementation = "sdpa"
    with torch.device(device):
        return cls(cfg)


#: transformers 5's DINOv2 module names and the released checkpoints' (which save_pretrained writes).
DINOV2_NAMES = [("attention.q_proj", "attention.attention.query"), ("attention.k_proj", "attention.attention.key"),
                ("attention.v_proj", "attention.attention.value"), ("attention.o_proj", "attention.output.dense")]


def hub_name(name: str) -> str:
    for a, b in DINOV2_NAMES:
        name = name.replace(a, b)
    return name


def module_name(name: str) -> str:
    for a, b in DINOV2_NAMES:
        name = name.replace(b, a)
    return name


def write_checkpoint(tower: dict, d: Path, seed: int) -> int:
    import torch
    from safetensors.torch import save_file

    d.mkdir(parents=True, exist_ok=True)
    model_type = {"clip": "clip_vision_model", "dinov2": "dinov2",
                  "siglip2": "siglip2_vision_model"}.get(tower["family"], "siglip_vision_model")
    cfg = dict(tower["vision"], model_type=model_type)
    prefix = tower.get("prefix", "vision_model.")
    (d / "config.json").write_text(json.dumps(cfg, indent=2) + "\n")
    (d / "preprocessor_config.json").write_text(json.dumps(tower["processor"], indent=2) + "\n")
    g = torch.Generator().manual_seed(seed)
    tensors = {}
    for name, p in sorted(vision_model(tower, "meta").named_parameters()):
        if p.dim() == 1 and "norm" in name:
            t = 1.0 + 0.1 * torch.randn(p.shape, generator=g)
        elif name.endswith("lambda1"):  # LayerScale
            t = 0.5 + 0.2 * torch.rand(p.shape, generator=g)
        else:
            t = 0.02 * torch.randn(p.shape, generator=g)
        tensors[prefix + hub_name(name.removeprefix("vision_model."))] = t.to(torch.bfloat16)
    if tower["family"] == "clip":
        v = tower["vision"]
        tensors["visual_projection.weight"] = (0.02 * torch.randn((v["projection_dim"], v["hidden_size"]),
                                                                  generator=g)).to(torch.bfloat16)
    save_file(tensors, d / "model.safetensors", metadata={"format": "pt"})
    return sum(t.numel() for t in tensors.values())


def write_inputs(tower: dict, path: Path, seed: int) -> None:
    """Random levels normalised as the processor does: patch rows in raster order, (c, py, px); for
    SigLIP2 transformers' NaFlex batch of one, (py, px, c) rows with `spatial_shapes` and the mask."""
    import torch
    from safetensors.torch import save_file

    p, g = tower["patch"], tower["side"] // tower["patch"]
    gen = torch.Generator().manual_seed(seed)
    lv = torch.randint(0, 256, (g * g, 3, p * p), generator=gen, dtype=torch.uint8).to(torch.float32) / 255.0
    x = (lv - torch.tensor(tower["mean"]).view(1, 3, 1)) / torch.tensor(tower["std"]).view(1, 3, 1)
    if tower["family"] == "siglip2":
        n = tower["budget"]
        rows = torch.zeros(1, n, 3 * p * p)
        rows[0, :g * g] = x.transpose(1, 2).reshape(g * g, -1)
        mask = torch.zeros(1, n, dtype=torch.int64)
        mask[0, :g * g] = 1
        save_file({"pixel_values": rows.contiguous(), "pixel_attention_mask": mask,
                   "spatial_shapes": torch.tensor([[g, g]], dtype=torch.int64)}, path)
        return
    save_file({"pixel_values": x.reshape(g * g, -1).contiguous(),
               "grid_thw": torch.tensor([[1, g, g]], dtype=torch.int64)}, path)


def child_torch(args) -> None:

    import torch
    import transformers
    from safetensors.torch import load_file

    torch.set_num_threads(args.threads)
    tower = TOWERS[args.tower]
    t0 = time.perf_counter()
    model = vision_model(tower, "cpu").eval()
    prefix = tower.get("prefix", "vision_model.")
    sd = {module_name(k.removeprefix(prefix)): v.to(torch.float32)
          for k, v in load_file(Path(args.model) / "model.safetensors").items() if k.startswith(prefix)}
    # transformers 5's CLIPVisionModel is the vision transformer itself (its keys unprefixed).
    target = getattr(model, "vision_model", model)
    want = set(target.state_dict())
    assert set(sd) == want, sorted(set(sd) ^ want)[:5]
    target.load_state_dict(sd, strict=True)
    del sd
    inputs = load_file(args.pixel_values)
    rows = inputs["pixel_values"]
    p, g = tower["patch"], tower["side"] // tower["patch"]
    if tower["family"] == "siglip2":
        kw = {"pixel_values": rows, "pixel_attention_mask": inputs["pixel_attention_mask"],
              "spatial_shapes": inputs["spatial_shapes"]}
        return child_forward(model, kw, t0, args.child_out, g * g, torch, transformers)
    # The rows cover g * p pixels a side; a side beyond that (384 at patch 14) is dropped by the convolution.
    img = rows.reshape(1, g, g, 3, p, p).permute(0, 3, 1, 4, 2, 5).reshape(1, 3, g * p, g * p)
    pv = torch.zeros(1, 3, tower["side"], tower["side"])
    pv[:, :, :g * p, :g * p] = img
    return child_forward(model, {"pixel_values": pv}, t0, args.child_out, None, torch, transformers)


def child_forward(model, kw: dict, t0: float, out_path: str, real, torch, transformers) -> None:
    """One warm-up forward, one timed; the first `real` rows of `last_hidden_state` (all when None) saved."""
    import resource

    from safetensors.torch import save_file

    load_s = time.perf_counter() - t0
    with torch.inference_mode():
        model(**kw)
        t1 = time.perf_counter()
        out = model(**kw)
        forward_s = time.perf_counter() - t1
    save_file({"last_hidden_state": out.last_hidden_state[0, :real].contiguous()}, out_path)
    print(json.dumps({"load_s": load_s, "forward_s": forward_s,
                      "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0,
                      "versions": f"torch {torch.__version__}, transformers {transformers.__version__}"}))


def tower_flops(tower: dict) -> float:
    """FLOPs of one forward: every matrix on its tokens, and the attention products (4 s^2 d per block)."""
    v = tower["vision"]
    d, depth = v["hidden_size"], v["num_hidden_layers"]
    i = v.get("intermediate_size") or int(d * v["mlp_ratio"])
    n = tower.get("budget") or (tower["side"] // tower["patch"]) ** 2
    s = n + (1 if tower["family"] in ("clip", "dinov2") else 0)
    f = depth * (2 * s * (4 * d * d + 2 * d * i) + 4.0 * s * s * d) + 2 * n * 3 * tower["patch"] ** 2 * d
    if tower["family"] == "clip":
        return f + 2 * d * v["projection_dim"]
    if tower["family"] == "dinov2":
        return f
    # The pooling head: k and v over the tokens, the probe's attention, out_proj and the MLP on one token.
    return f + 2 * n * 2 * d * d + 4.0 * n * d + 2 * (2 * d * d + 2 * d * i)


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


def bench_tower(name: str, args, binary: Path, run_bin: Path, work: Path, env: dict, peak: dict) -> list[str]:
    tower = TOWERS[name]
    tw = work / name
    tw.mkdir(parents=True, exist_ok=True)
    ck = tw / "checkpoint"
    pv = tw / "pv.safetensors"
    w = bt.run_measured([sys.executable, str(Path(__file__).resolve()), "--child-write", "--tower", name,
                         "--model", str(ck), "--pixel-values", str(pv)], env, tw / "write")
    n_params = json.loads(w["stdout"].strip().splitlines()[-1])["parameters"]
    weight_mb = n_params * 2 / 1e6
    print(f"{name}: {n_params / 1e6:.1f} M parameters, {weight_mb:.0f} MB in bf16/fp16", flush=True)
    art = tw / "art"
    extra = []
    if "budget" in tower:  # a NaFlex bucket: a patch budget
        (tw / "buckets.yaml").write_text(f"buckets:\n  - name: b{tower['budget']}\n    patches: {tower['budget']}\n")
        extra = ["--buckets", str(tw / "buckets.yaml")]
    b = bt.run_measured([str(binary), "build", "--model", str(ck), "--out", str(art), "--force", *extra], env,
                        tw / "build")
    build = {"wall_s": b["wall_s"], "rss_mb": b["rss_mb"]}
    print(f"{name} build: {build['wall_s']:.1f} s, {build['rss_mb']:.0f} MB", flush=True)
    bucket = f"b{tower.get('budget', tower['side'])}"
    hi = bq.host_inputs(run_bin, art, bucket, tower["side"], tw, env)
    rounds, versions = [], ""
    for k in range(args.rounds):
        r = {}
        tr = bt.run_measured([sys.executable, str(Path(__file__).resolve()), "--child-torch", "--tower", name,
                              "--model", str(ck), "--pixel-values", str(pv), "--child-out",
                              str(tw / "torch.safetensors"), "--threads", str(args.threads)], env, tw / "torch")
        rep = json.loads(tr["stdout"].strip().splitlines()[-1])
        r["torch"], versions = (rep["forward_s"], tr["rss_mb"]), rep["versions"]
        rr = bt.run_measured([str(binary), "reference", "--model", str(ck), "--pixel-values", str(pv), "--out",
                              str(tw / "ref.safetensors")], env, tw / "ref")
        m = None
        for line in rr["stderr"].splitlines():
            m = bt.TIMING_RE.search(line) or m
        r["reference"] = (float(m.group(2)) if m else rr["wall_s"], rr["rss_mb"])
        for prec in ("fp32", "fp16"):
            r[prec] = bq.exec_run(binary, art, bucket, hi, tw / f"ho{prec}.safetensors", prec, env,
                                  tw / f"exec{prec}")
        print(f"[{name} round {k + 1}/{args.rounds}] " + ", ".join(f"{a} {v[0]:.2f} s" for a, v in r.items()),
              flush=True)
        rounds.append(r)
    row = {key: tuple(statistics.median(x[key][i] for x in rounds) for i in range(2)) for key in rounds[0]}
    cos = min_cosine(tw / "ref.safetensors", tw / "torch.safetensors")
    gate = None
    if name in args.gate:
        g = gate_measured([str(binary), "gate", str(art), "--model", str(ck), "--images",
                           str(ROOT / "golden" / "images"), "--task", str(ROOT / "golden" / "task" / "labels.jsonl")],
                          env)
        rep = json.loads((art / "gate" / "report.json").read_text())
        gate = {"wall_s": g["wall_s"], "rss_mb": g["rss_mb"], "accepted": rep["accepted"],
                "statuses": {k: v["status"] for k, v in rep["gates"].items()},
                "agreement": rep["gates"]["task"].get("agreement")}
        print(f"{name} gate: {gate['wall_s']:.1f} s, {gate['rss_mb']:.0f} MB, {gate['statuses']}", flush=True)
    fl = tower_flops(tower)
    L = [f"- tower: {tower['describe']}; {n_params / 1e6:.1f} M parameters, random bf16 ({weight_mb:.0f} MB as "
         f"fp16); {versions}; {args.rounds} rounds, medians", "",
         "| run | forward s | peak RSS MB | / transformers | GFLOP/s | of matmul rate |", "|---|---|---|---|---|---|"]
    for key, label in (("torch", "transformers fp32"), ("reference", "reference fp32"),
                       ("fp32", "interpreter fp32"), ("fp16", "interpreter fp16 emulation")):
        s, rss = row[key]
        L.append(f"| {label} | {s:.3f} | {rss:.0f} | {s / row['torch'][0]:.2f}x | {fl / s / 1e9:.0f} | "
                 f"{fl / s / 1e9 / peak['gflops'] * 100:.0f}% |")
    L += ["", f"- min cosine between the reference's and transformers' `last_hidden_state` rows: {cos:.6f}",
          f"- build of {bucket}: {build['wall_s']:.1f} s, peak RSS {build['rss_mb']:.0f} MB "
          f"({build['rss_mb'] / weight_mb:.2f}x the fp16 weights)"]
    if gate:
        L.append(f"- whole gate (residency, cosine over the 9 golden cases, task over 450 labelled images): "
                 f"{gate['wall_s']:.1f} s, peak RSS {gate['rss_mb']:.0f} MB ({gate['rss_mb'] / weight_mb:.2f}x the "
                 f"fp16 weights); statuses {gate['statuses']}, task agreement {gate['agreement']}, "
                 f"accepted {gate['accepted']}")
    return L + [""]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bin", default="target/release/ane-export")
    ap.add_argument("--run-bin", default="target/release/ane-run")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--towers", nargs="+", default=list(TOWERS), choices=list(TOWERS))
    ap.add_argument("--gate", nargs="*", default=[], choices=list(TOWERS), help="towers whose whole gate is timed")
    ap.add_argument("--out", type=Path)
    ap.add_argument("--workdir", type=Path)
    ap.add_argument("--child-torch", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--child-write", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--tower", help=argparse.SUPPRESS)
    ap.add_argument("--model", help=argparse.SUPPRESS)
    ap.add_argument("--pixel-values", help=argparse.SUPPRESS)
    ap.add_argument("--child-out", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child_torch:
        return child_torch(args)
    if args.child_write:
        tower = TOWERS[args.tower]
        n = write_checkpoint(tower, Path(args.model), 0)
        write_inputs(tower, Path(args.pixel_values), 0)
        print(json.dumps({"parameters": n}))
        return None

    binary, run_bin = (ROOT / args.bin).resolve(), (ROOT / args.run_bin).resolve()
    work = args.workdir or Path(tempfile.mkdtemp(prefix="bench-encoders-"))
    work.mkdir(parents=True, exist_ok=True)
    env = bt.child_env(args.threads)
    peak = bq.matmul_rate(args.threads, work)
    print(f"matmul rate: {peak['gflops']:.0f} GFLOP/s", flush=True)
    body = []
    for name in args.towers:
        body += bench_tower(name, args, binary, run_bin, work, env, peak)
    stamp = dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")
    L = [f"### Encoder towers ({', '.join(args.towers)}): reference, interpreter, build ({stamp})", "",
         f"- command: `.venv-dev/bin/python python/bench/bench_encoders.py "
         f"{shlex.join(bt._rel(a) for a in sys.argv[1:])}`",
         bt.machine_line(args.threads, peak["gflops"], args.bin, peak["blas"]), ""] + body
    bt.emit(L, args.out)


if __name__ == "__main__":
    main()
