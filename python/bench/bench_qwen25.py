#!/usr/bin/env python3
"""Benchmark a Qwen2.5-VL-7B-shaped vision tower: the Rust reference and the
MIL interpreter (fp32, fp16 emulation) against transformers, side by side in
one run, with GFLOP/s against this machine's fp32 matmul rate; `build` of
both buckets; and what the window layout saves at b4096.

    .venv-dev/bin/python python/bench/bench_qwen25.py [--bin target/release/ane-export]
        [--run-bin target/release/ane-run] [--rounds 2] [--out BENCHMARKS.md]

The tower (depth 32, width 1280, 16 heads, SwiGLU 3420, out 3584, window 112,
full attention in blocks 7, 15, 23, 31) gets random bf16 weights (seed 0) in a
temporary checkpoint (`visual.*` tensors, as the released checkpoints store
them). Inputs: 32 x 32 and 64 x 64 patches (1024 and 4096 patches, exactly
16 and 64 windows of 64 slots, so no slot is padding).

- transformers: a child process builds `Qwen2_5_VisionTransformerPretrainedModel`
  from the config, loads the bf16 weights upcast to fp32 (every key checked),
  sdpa, 2 threads, one warm-up forward, then times one forward.
- reference: `ane-export reference --pixel-values` (its `forward_s`).
- interpreter: `ane-export build` of b1024 and b4096, `ane-run host-inputs`
  of a random image of the bucket's size, `ane-export exec --runs 2` (the
  second run timed), in fp32 and fp16.
- windows: the same weights with `fullatt_block_indexes` = every block,
  built for b4096 and executed in fp16: the time of full attention in every
  block against the windowed tower.
- matmul rate: numpy's OpenBLAS sgemm 4096 x 4096 on the benchmark's
  threads, best of 5, in a child with OPENBLAS_CORETYPE and OPENBLAS_L2_SIZE
  unset (the kernel threadpoolctl reports is recorded).

Rounds alternate every run (transformers, reference, interpreter fp32,
fp16), so that the shared machine's drift falls on all of them; the table
gives medians. Peak RSS per child from os.wait4.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import re
import shlex
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_tower as bt  # noqa: E402  (run_measured, child_env, cpu_model)

ROOT = Path(__file__).resolve().parents[2]
EXEC_RE = re.compile(r"in ([0-9.]+) s, precision")
RUNS_RE = re.compile(r"seconds per run: ([0-9., ]+)")
TIMING_RE = bt.TIMING_RE

PATCH = 14
MEAN = [0.48145466, 0.4578275, 0.40821073]
STD = [0.26862954, 0.26130258, 0.27577711]
VISION = {
    "depth": 32, "hidden_act": "silu", "hidden_size": 1280, "intermediate_size": 3420, "num_heads": 16,
    "in_channels": 3, "out_hidden_size": 3584, "patch_size": PATCH, "spatial_merge_size": 2,
    "temporal_patch_size": 2, "window_size": 112, "fullatt_block_indexes": [7, 15, 23, 31],
    "tokens_per_second": 2, "model_type": "qwen2_5_vl",
}
PREPROCESSOR = {
    "patch_size": PATCH, "temporal_patch_size": 2, "merge_size": 2, "image_mean": MEAN, "image_std": STD,
    "min_pixels": 3136, "max_pixels": 12845056, "resample": 3, "do_rescale": True, "rescale_factor": 1 / 255,
    "do_normalize": True, "do_convert_rgb": True, "image_processor_type": "Qwen2VLImageProcessor",
}


def vision_model(vc: dict, device: str):
    import torch
    from transformers.models.qwen2_5_vl.configuration_qwen2_5_vl import Qwen2_5_VLVisionConfig
    from transformers.models.qwen2_5_vl.modeling_qwen2_5_vl import Qwen2_5_VisionTransformerPretrainedModel

    cfg = Qwen2_5_VLVisionConfig(**{k: v for k, v in vc.items() if k != "model_type"})
    cfg._attn_implementation = "sdpa"
    with torch.device(device):
        return Qwen2_5_VisionTransformerPretrainedModel(cfg)


def write_checkpoint(d: Path | str, seed: int, fullatt=None) -> int:
    import torch
    from safetensors.torch import save_file

    d = Path(d)
    d.mkdir(parents=True, exist_ok=True)
    vc = dict(VISION)
    if fullatt is not None:
        vc["fullatt_block_indexes"] = fullatt
    cfg = {"architectures": ["Qwen2_5_VLForConditionalGeneration"], "model_type": "qwen2_5_vl", "vision_config": vc}
    (d / "config.json").write_text(json.dumps(cfg, indent=2) + "\n")
    (d / "preprocessor_config.json").write_text(json.dumps(PREPROCESSOR, indent=2) + "\n")
    if fullatt is not None:
        return 0
    g = torch.Generator().manual_seed(seed)
    tensors = {}
    for name, p in sorted(vision_model(VISION, "meta").named_parameters()):
        if p.dim() == 1 and ("norm" in name or "ln_q" in name):
            t = 1.0 + 0.1 * torch.randn(p.shape, generator=g)
        else:
            t = 0.02 * torch.randn(p.shape, generator=g)
        tensors["visual." + name] = t.to(torch.bfloat16)
    save_file(tensors, d / "model.safetensors", metadata={"format": "pt"})
    return sum(t.numel() for t in tensors.values())


def write_inputs(path: Path | str, side: int, seed: int) -> None:
    """Random levels normalised as the processor does, the frame repeated over t."""
    import torch
    from safetensors.torch import save_file

    n = side * side
    g = torch.Generator().manual_seed(seed * 1000 + n)
    lv = torch.randint(0, 256, (n, 3, PATCH * PATCH), generator=g, dtype=torch.uint8).to(torch.float32) / 255.0
    x = (lv - torch.tensor(MEAN).view(1, 3, 1)) / torch.tensor(STD).view(1, 3, 1)
    pv = x.reshape(n, 3, 1, PATCH, PATCH).repeat(1, 1, 2, 1, 1).reshape(n, -1).contiguous()
    save_file({"pixel_values": pv, "grid_thw": torch.tensor([[1, side, side]], dtype=torch.int64)}, path)


def child_torch(args) -> None:
    import resource

    import torch
    import transformers
    from safetensors.torch import load_file, save_file

    torch.set_num_threads(args.threads)
    t0 = time.perf_counter()
    model = vision_model(VISION, "cpu").eval()
    sd = {k[len("visual."):]: v.to(torch.float32) for k, v in load_file(Path(args.model) / "model.safetensors").items()}
    model.load_state_dict(sd, strict=True)  # every key present, none extra
    del sd
    inp = load_file(args.pixel_values)
    pv, grid = inp["pixel_values"], inp["grid_thw"]
    load_s = time.perf_counter() - t0
    with torch.inference_mode():
        model(pv, grid_thw=grid)
        t1 = time.perf_counter()
        out = model(pv, grid_thw=grid)
        forward_s = time.perf_counter() - t1
    save_file({"embeds": out.pooler_output.contiguous()}, args.child_out)
    print(json.dumps({"load_s": load_s, "forward_s": forward_s,
                      "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0,
                      "versions": f"torch {torch.__version__}, transformers {transformers.__version__}"}))


def child_matmul(args) -> None:
    import numpy as np
    from threadpoolctl import threadpool_info

    a = np.random.default_rng(0).standard_normal((4096, 4096), dtype=np.float32)
    b = np.random.default_rng(1).standard_normal((4096, 4096), dtype=np.float32)
    a @ b
    best = min(_timed(lambda: a @ b) for _ in range(5))
    info = [{k: i.get(k) for k in ("internal_api", "num_threads", "architecture")} for i in threadpool_info()]
    print(json.dumps({"gflops": 2 * 4096 ** 3 / best / 1e9, "blas": info}))


def _timed(f) -> float:
    t = time.perf_counter()
    f()
    return time.perf_counter() - t


def matmul_rate(threads: int, work: Path, coretype: str | None = None) -> dict:
    """numpy's sgemm 4096 rate, OPENBLAS_CORETYPE and OPENBLAS_L2_SIZE unset,
    or OPENBLAS_CORETYPE set to `coretype` (the kernels another CPU gets)."""
    env = bt.child_env(threads)
    env.pop("OPENBLAS_CORETYPE", None)
    env.pop("OPENBLAS_L2_SIZE", None)
    if coretype:
        env["OPENBLAS_CORETYPE"] = coretype
    r = bt.run_measured([sys.executable, str(Path(__file__).resolve()), "--child-matmul"], env, work / "matmul")
    return json.loads(r["stdout"].strip().splitlines()[-1])


def tower_flops(n: int, full_blocks: int) -> float:
    """FLOPs of one forward over n patches: every matrix on its tokens, and the
    attention products (4 n k d per block, k = n for full blocks, 64 within windows)."""
    d, i, depth = VISION["hidden_size"], VISION["intermediate_size"], VISION["depth"]
    md, out = 4 * d, VISION["out_hidden_size"]
    per_block = 2 * n * (4 * d * d + 3 * d * i)
    f = depth * per_block + 2 * n * (3 * 2 * PATCH * PATCH) * d + 2 * (n // 4) * (md * md + md * out)
    s = (VISION["window_size"] // PATCH) ** 2
    return f + full_blocks * 4.0 * n * n * d + (depth - full_blocks) * 4.0 * n * s * d


def exec_run(binary, art, bucket, hi, out, prec, env, log) -> tuple[float, float]:
    e = bt.run_measured([str(binary), "exec", str(art / f"{art.name}.mlpackage"), "--function", bucket,
                         "--inputs", str(hi), "--out", str(out), "--precision", prec, "--runs", "2"], env, log)
    m = EXEC_RE.search(e["stderr"])
    runs = RUNS_RE.search(e["stderr"])
    # The second of two runs, as transformers times the forward after a warm-up.
    t = float(runs.group(1).split(",")[-1]) if runs else (float(m.group(1)) if m else e["wall_s"])
    return t, e["rss_mb"]


def host_inputs(run_bin, art, bucket, side_px, work, env) -> Path:
    import numpy as np
    from PIL import Image

    img = work / f"img{side_px}.png"
    Image.fromarray(np.random.default_rng(side_px).integers(0, 256, (side_px, side_px, 3), dtype=np.uint8)).save(img)
    hi = work / f"hi-{art.name}-{bucket}.safetensors"
    bt.run_measured([str(run_bin), "host-inputs", "--artifact", str(art), "--bucket", bucket, "--image", str(img),
                     "--out", str(hi)], env, work / f"hi-{art.name}-{bucket}")
    return hi


def cosine(a: Path, b: Path) -> float:
    from safetensors.numpy import load_file

    x, y = load_file(str(a))["embeds"].astype("float64"), load_file(str(b))["embeds"].astype("float64")
    c = (x * y).sum(1) / ((x * x).sum(1) ** 0.5 * (y * y).sum(1) ** 0.5)
    return float(c.min())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bin", default="target/release/ane-export")
    ap.add_argument("--run-bin", default="target/release/ane-run")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", type=Path)
    ap.add_argument("--workdir", type=Path)
    ap.add_argument("--child-torch", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--child-matmul", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--model", help=argparse.SUPPRESS)
    ap.add_argument("--pixel-values", help=argparse.SUPPRESS)
    ap.add_argument("--child-out", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child_torch:
        return child_torch(args)
    if args.child_matmul:
        return child_matmul(args)

    binary, run_bin = (ROOT / args.bin).resolve(), (ROOT / args.run_bin).resolve()
    work = args.workdir or Path(tempfile.mkdtemp(prefix="bench-q25-"))
    work.mkdir(parents=True, exist_ok=True)
    env = bt.child_env(args.threads)
    ck, ck_full = work / "q25-7b-vision", work / "q25-7b-vision-fullatt"
    # In children, so that this script stays small (see bench_tower.child_call).
    n_params = bt.child_call(__file__, "write_checkpoint", d=str(ck), seed=0)
    bt.child_call(__file__, "write_checkpoint", d=str(ck_full), seed=0, fullatt=list(range(VISION["depth"])))
    if not (ck_full / "model.safetensors").exists():
        os.symlink(ck / "model.safetensors", ck_full / "model.safetensors")
    weight_mb = n_params * 2 / 1e6
    print(f"checkpoint: {n_params / 1e6:.1f} M parameters, {weight_mb:.0f} MB in bf16/fp16", flush=True)

    peak = matmul_rate(args.threads, work)
    print(f"matmul rate: {peak['gflops']:.0f} GFLOP/s ({peak['blas']})", flush=True)

    art = work / "art"
    b = bt.run_measured([str(binary), "build", "--model", str(ck), "--out", str(art), "--bucket", "b1024",
                         "--bucket", "b4096", "--force"], env, work / "build")
    build = {"wall_s": b["wall_s"], "rss_mb": b["rss_mb"]}
    print(f"build: {build['wall_s']:.1f} s, {build['rss_mb']:.0f} MB", flush=True)
    art_full = work / "artfull"
    bt.run_measured([str(binary), "build", "--model", str(ck_full), "--out", str(art_full), "--bucket", "b4096",
                     "--force"], env, work / "buildfull")

    sides = {1024: 32, 4096: 64}
    his = {n: host_inputs(run_bin, art, f"b{n}", s * PATCH, work, env) for n, s in sides.items()}
    hi_full = host_inputs(run_bin, art_full, "b4096", 64 * PATCH, work, env)
    rows = {}
    for n, side in sides.items():
        pv = work / f"pv{n}.safetensors"
        bt.child_call(__file__, "write_inputs", path=str(pv), side=side, seed=0)
        rounds = []
        for k in range(args.rounds):
            r = {}
            tr = bt.run_measured([sys.executable, str(Path(__file__).resolve()), "--child-torch", "--model", str(ck),
                                  "--pixel-values", str(pv), "--child-out", str(work / f"torch{n}.safetensors"),
                                  "--threads", str(args.threads)], env, work / f"torch{n}")
            rep = json.loads(tr["stdout"].strip().splitlines()[-1])
            r["torch"], versions = (rep["forward_s"], tr["rss_mb"]), rep["versions"]
            rr = bt.run_measured([str(binary), "reference", "--model", str(ck), "--pixel-values", str(pv), "--out",
                                  str(work / f"ref{n}.safetensors")], env, work / f"ref{n}")
            m = None
            for line in rr["stderr"].splitlines():
                m = TIMING_RE.search(line) or m
            r["reference"] = (float(m.group(2)) if m else rr["wall_s"], rr["rss_mb"])
            for prec in ("fp32", "fp16"):
                r[prec] = exec_run(binary, art, f"b{n}", his[n], work / f"ho{n}{prec}.safetensors", prec, env,
                                   work / f"exec{n}{prec}")
            if n == 4096:
                r["fullatt_fp16"] = exec_run(binary, art_full, "b4096", hi_full, work / "hofull.safetensors", "fp16",
                                             env, work / "execfull")
            print(f"[{n} round {k + 1}/{args.rounds}] " + ", ".join(f"{a} {v[0]:.1f} s" for a, v in r.items()),
                  flush=True)
            rounds.append(r)
        rows[n] = {key: tuple(statistics.median(x[key][i] for x in rounds) for i in range(2)) for key in rounds[0]}
        rows[n]["cos"] = cosine(work / f"ref{n}.safetensors", work / f"torch{n}.safetensors")

    stamp = dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")
    L = [f"### Qwen2.5-VL-7B-shaped tower: reference, interpreter, build, windows ({stamp})", "",
         f"- command: `.venv-dev/bin/python python/bench/bench_qwen25.py {shlex.join(bt._rel(a) for a in sys.argv[1:])}`",
         bt.machine_line(args.threads, peak["gflops"], args.bin, peak["blas"]),
         f"- tower: depth 32, width 1280, 16 heads, SwiGLU 3420, out 3584, window 112 px, full attention in "
         f"blocks 7, 15, 23, 31; {n_params / 1e6:.1f} M parameters, random bf16 ({weight_mb:.0f} MB as fp16); "
         f"{versions}; {args.rounds} rounds, medians",
         "",
         "| patches | run | forward s | peak RSS MB | / transformers | GFLOP/s | of matmul rate |",
         "|---|---|---|---|---|---|---|"]
    for n, r in rows.items():
        fl = tower_flops(n, len(VISION["fullatt_block_indexes"]))
        for key, label in (("torch", "transformers fp32"), ("reference", "reference fp32"),
                           ("fp32", "interpreter fp32"), ("fp16", "interpreter fp16 emulation")):
            s, rss = r[key]
            L.append(f"| {n} | {label} | {s:.2f} | {rss:.0f} | {s / r['torch'][0]:.2f}x | {fl / s / 1e9:.0f} | "
                     f"{fl / s / 1e9 / peak['gflops'] * 100:.0f}% |")
    L += ["", "- min cosine between the reference's and transformers' merged tokens: "
          + ", ".join(f"{n} patches {r['cos']:.6f}" for n, r in rows.items()),
          f"- build of b1024 and b4096: {build['wall_s']:.1f} s, peak RSS {build['rss_mb']:.0f} MB "
          f"({build['rss_mb'] / weight_mb:.2f}x the fp16 weights)"]
    w, f = rows[4096]["fp16"][0], rows[4096]["fullatt_fp16"][0]
    L += [f"- windows at b4096 (interpreter, fp16 emulation): windowed tower {w:.2f} s, the same weights with full "
          f"attention in every block {f:.2f} s: windowed / full = {w / f:.2f}", ""]
    bt.emit(L, args.out)


if __name__ == "__main__" and not bt.serve_child_call(sys.argv, globals()):
    main()
