#!/usr/bin/env python3
"""Benchmark the Rust fp32 reference tower against transformers' Qwen3-VL vision model.

    .venv-dev/bin/python python/bench/bench_tower.py [--bin target/release/ane-export]
        [--patches 1024 4096] [--repeats 3] [--out bench.md] [--torch-only]

Builds a Qwen3-VL-2B-shaped vision tower with random weights (seed 0) in a temp
checkpoint dir (config.json in the hub layout, model.safetensors with only the
`model.visual.*` tensors in bf16, preprocessor_config.json), writes random
pixel_values per patch count, then runs torch and Rust alternately (A B A B ...),
each in its own fresh process so the peak RSS is per process:

- torch: a child of this script (`--child-torch`) loads the tower with
  transformers from the same bf16 safetensors, upcasts to fp32, sdpa,
  torch.set_num_threads(threads), runs warm-up forward(s), times one forward.
- Rust: `BIN reference --model DIR --pixel-values FILE --out OUT.safetensors`;
  wall time measured here, `timing: load_s=<f> forward_s=<f>` parsed from its
  stderr when present.

Peak RSS of each child comes from os.wait4() (the kernel's ru_maxrss for that one
child, exact per process). Reports medians, the rust/torch ratios and the cosine
similarity between the Rust `embeds` and torch's merged output, prints a
markdown table and appends it (with command line, date, machine) to --out.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import math
import os
import platform
import re
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _rel(path) -> str:
    """A path relative to the repository when it lies inside it, `$TMPDIR/...` when it lies in the
    temporary directory (reports stay machine-independent)."""
    import tempfile

    p = Path(path).absolute()
    for base, shown in ((ROOT, None), (Path(tempfile.gettempdir()).resolve(), "$TMPDIR")):
        try:
            rel = p.relative_to(base)
        except ValueError:
            continue
        return str(rel) if shown is None else f"{shown}/{rel}"
    return str(path)
KEY_PREFIX = "model.visual."

VISION_CONFIG = {
    # Qwen3-VL-2B-Instruct vision_config, hub layout (vision model_type "qwen3_vl", as released)
    "deepstack_visual_indexes": [5, 11, 17],
    "depth": 24,
    "hidden_act": "gelu_pytorch_tanh",
    "hidden_size": 1024,
    "in_channels": 3,
    "initializer_range": 0.02,
    "intermediate_size": 4096,
    "model_type": "qwen3_vl",
    "num_heads": 16,
    "num_position_embeddings": 2304,
    "out_hidden_size": 2048,
    "patch_size": 16,
    "spatial_merge_size": 2,
    "temporal_patch_size": 2,
}

# Qwen3-VL-8B-Instruct's vision_config (head dim 72, as released): issue 22's
# 8B-shaped gate.
VISION_CONFIG_8B = {
    **VISION_CONFIG,
    "deepstack_visual_indexes": [8, 16, 24],
    "depth": 27,
    "hidden_size": 1152,
    "intermediate_size": 4304,
    "out_hidden_size": 4096,
}

# The vision configs by name (`write_checkpoint`'s `shape`).
SHAPES = {"2b": VISION_CONFIG, "8b": VISION_CONFIG_8B}

TEXT_CONFIG = {  # tiny: the checkpoint holds no text weights; only here so the config is complete
    "model_type": "qwen3_vl_text",
    "vocab_size": 512,
    "hidden_size": 32,
    "intermediate_size": 32,
    "num_hidden_layers": 1,
    "num_attention_heads": 2,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "hidden_act": "silu",
    "rms_norm_eps": 1e-06,
    "max_position_embeddings": 4096,
    "rope_scaling": {"mrope_interleaved": True, "mrope_section": [4, 2, 2], "rope_type": "default"},
    "rope_theta": 5000000,
    "attention_bias": False,
    "tie_word_embeddings": True,
    "torch_dtype": "bfloat16",
}

CONFIG = {
    "architectures": ["Qwen3VLForConditionalGeneration"],
    "model_type": "qwen3_vl",
    "image_token_id": 151655,
    "video_token_id": 151656,
    "vision_start_token_id": 151652,
    "vision_end_token_id": 151653,
    "tie_word_embeddings": True,
    "torch_dtype": "bfloat16",
    "text_config": TEXT_CONFIG,
    "vision_config": VISION_CONFIG,
}

PREPROCESSOR_CONFIG = {
    "patch_size": 16,
    "temporal_patch_size": 2,
    "merge_size": 2,
    "image_mean": [0.5, 0.5, 0.5],
    "image_std": [0.5, 0.5, 0.5],
    "size": {"shortest_edge": 65536, "longest_edge": 16777216},
    "resample": 3,
    "do_rescale": True,
    "rescale_factor": 1 / 255,
    "do_normalize": True,
    "do_convert_rgb": True,
    "image_processor_type": "Qwen2VLImageProcessorFast",
}

TIMING_RE = re.compile(r"timing:\s*load_s=([0-9.eE+-]+)\s+forward_s=([0-9.eE+-]+)")


# --------------------------------------------------------------------------
# setup: checkpoint and inputs (parent process)
# --------------------------------------------------------------------------


def vision_param_shapes(shape: str = "2b") -> dict[str, tuple[int, ...]]:
    """Parameter names/shapes of transformers' Qwen3VLVisionModel of a `SHAPES` entry, without allocating it."""
    import torch
    from transformers.models.qwen3_vl.configuration_qwen3_vl import Qwen3VLVisionConfig
    from transformers.models.qwen3_vl.modeling_qwen3_vl import Qwen3VLVisionModel

    vc = {k: v for k, v in SHAPES[shape].items() if k != "model_type"}
    with torch.device("meta"):
        m = Qwen3VLVisionModel(Qwen3VLVisionConfig(**vc))
    return {n: tuple(p.shape) for n, p in m.named_parameters()}


def write_checkpoint(d: Path | str, seed: int, shape: str = "2b") -> int:
    import torch
    from safetensors.torch import save_file

    d = Path(d)
    d.mkdir(parents=True, exist_ok=True)
    g = torch.Generator().manual_seed(seed)
    tensors = {}
    for name, dims in sorted(vision_param_shapes(shape).items()):
        is_norm = ".norm" in name or name.startswith("norm")
        if is_norm and name.endswith("weight"):
            t = 1.0 + 0.1 * torch.randn(dims, generator=g)
        elif is_norm and name.endswith("bias"):
            t = 0.1 * torch.randn(dims, generator=g)
        elif name == "pos_embed.weight":
            t = 0.5 * torch.randn(dims, generator=g)
        else:  # HF-style init scale keeps a 24-block random tower finite and well-conditioned
            t = 0.02 * torch.randn(dims, generator=g)
        tensors[KEY_PREFIX + name] = t.to(torch.bfloat16)
    save_file(tensors, d / "model.safetensors", metadata={"format": "pt"})
    (d / "config.json").write_text(json.dumps({**CONFIG, "vision_config": SHAPES[shape]}, indent=2) + "\n")
    (d / "preprocessor_config.json").write_text(json.dumps(PREPROCESSOR_CONFIG, indent=2) + "\n")
    return sum(t.numel() for t in tensors.values())


def grid_for(n: int) -> list[int]:
    side = math.isqrt(n)
    if side * side != n or side % 2:
        raise SystemExit(f"--patches {n}: must be (2k)^2 (e.g. 1024 -> 32x32, 4096 -> 64x64)")
    return [1, side, side]


def write_inputs(path: Path | str, n: int, seed: int) -> None:
    """Random still image: random u8 levels per (c, py, px), reconstructed as in golden/README.md
    and duplicated over the two temporal frames, so pixel_values look like processor output."""
    import torch
    from safetensors.torch import save_file

    g = torch.Generator().manual_seed(seed * 1000 + n)
    levels = torch.randint(0, 256, (n, 3 * 16 * 16), generator=g, dtype=torch.uint8)
    x = levels.to(torch.float32) / 255.0
    x = (x - 0.5) / 0.5
    pv = x.reshape(n, 3, 1, 16, 16).repeat(1, 1, 2, 1, 1).reshape(n, 3 * 2 * 16 * 16).contiguous()
    save_file({"pixel_values": pv, "grid_thw": torch.tensor([grid_for(n)], dtype=torch.int64)}, path)


# --------------------------------------------------------------------------
# torch child
# --------------------------------------------------------------------------


def child_torch(args) -> None:
    import torch

    torch.set_num_threads(args.threads)
    import transformers
    from safetensors.torch import load_file, save_file
    from transformers import Qwen3VLForConditionalGeneration

    transformers.utils.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    t0 = time.perf_counter()
    # the official path: from_pretrained upcasts the bf16 weights to fp32; the (absent) text
    # weights of the tiny text config are initialised randomly and unused
    model, info = Qwen3VLForConditionalGeneration.from_pretrained(
        args.model, dtype=torch.float32, attn_implementation="sdpa", output_loading_info=True
    )
    # every vision weight must come from the checkpoint (a missing key would be silently random)
    bad = [k for k in (info.get("missing_keys") or []) if "visual" in k]
    bad += [k for k in (info.get("mismatched_keys") or [])]
    bad += [k for k in (info.get("unexpected_keys") or [])]
    assert not bad, f"vision weights not loaded from the checkpoint: {sorted(bad)[:10]}"
    visual = model.model.visual.eval()
    del model.model.language_model, model.lm_head
    assert next(visual.parameters()).dtype == torch.float32
    inp = load_file(args.pixel_values)
    pv, grid = inp["pixel_values"], inp["grid_thw"]
    load_s = time.perf_counter() - t0
    warm = []
    with torch.inference_mode():
        for _ in range(args.warmup):
            t1 = time.perf_counter()
            visual(pv, grid_thw=grid)
            warm.append(time.perf_counter() - t1)
        t1 = time.perf_counter()
        out = visual(pv, grid_thw=grid)
        forward_s = time.perf_counter() - t1
    tensors = {"embeds": out.pooler_output.contiguous()}
    for i, f in enumerate(out.deepstack_features):
        tensors[f"deepstack.{i}"] = f.contiguous()
    save_file(tensors, args.out)
    import resource

    rss_kb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    print(json.dumps({
        "load_s": load_s,
        "warmup_s": warm,
        "forward_s": forward_s,
        "peak_rss_mb": rss_kb / 1024.0,
        "threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
    }))


# --------------------------------------------------------------------------
# running children
# --------------------------------------------------------------------------


def run_measured(cmd: list[str], env: dict, log_prefix: Path) -> dict:
    """Run one child; wall time here, peak RSS from os.wait4 (that child's own ru_maxrss)."""
    out_f = open(f"{log_prefix}.stdout", "w+")
    err_f = open(f"{log_prefix}.stderr", "w+")
    t0 = time.perf_counter()
    p = subprocess.Popen(cmd, stdout=out_f, stderr=err_f, env=env)
    _, status, ru = os.wait4(p.pid, 0)
    wall = time.perf_counter() - t0
    p.returncode = os.waitstatus_to_exitcode(status)
    out_f.seek(0)
    err_f.seek(0)
    stdout, stderr = out_f.read(), err_f.read()
    out_f.close()
    err_f.close()
    if p.returncode != 0:
        sys.stderr.write(stderr[-4000:])
        raise SystemExit(f"child failed ({p.returncode}): {shlex.join(cmd)}")
    return {"wall_s": wall, "rss_mb": ru.ru_maxrss / 1024.0, "stdout": stdout, "stderr": stderr}


def child_call(script: str, name: str, **kwargs):
    """`name(**kwargs)` of `script` (a bench script that serves `--child-call`
    with [`serve_child_call`]) run in a child process; its JSON result.

    What needs torch or much memory (writing a random checkpoint) runs in a
    child so that the bench script stays small: on Linux a child's peak RSS
    (`ru_maxrss` from `wait4`) starts from its parent's at the fork, so a
    parent holding the checkpoint would floor every measured child at its own
    size."""
    r = subprocess.run([sys.executable, script, "--child-call", name, json.dumps(kwargs)], check=True,
                       capture_output=True, text=True)
    return json.loads(r.stdout.strip().splitlines()[-1])


def serve_child_call(argv: list[str], namespace: dict) -> bool:
    """Serve a [`child_call`]: run the named function, print its result as JSON; False when not asked."""
    if len(argv) < 4 or argv[1] != "--child-call":
        return False
    print(json.dumps(namespace[argv[2]](**json.loads(argv[3]))))
    return True


def child_env(threads: int) -> dict:
    env = dict(os.environ)
    for k in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS", "RAYON_NUM_THREADS"):
        env[k] = str(threads)
    env.setdefault("TOKENIZERS_PARALLELISM", "false")
    env["HF_HUB_OFFLINE"] = "1"
    return env


def run_torch(model: Path, pv: Path, out: Path, args, log_prefix: Path) -> dict:
    cmd = [sys.executable, str(Path(__file__).resolve()), "--child-torch", "--model", str(model),
           "--pixel-values", str(pv), "--child-out", str(out), "--threads", str(args.threads),
           "--warmup", str(args.warmup)]
    r = run_measured(cmd, child_env(args.threads), log_prefix)
    rep = json.loads(r["stdout"].strip().splitlines()[-1])
    return {"wall_s": r["wall_s"], "rss_mb": r["rss_mb"], "self_rss_mb": rep["peak_rss_mb"],
            "forward_s": rep["forward_s"], "load_s": rep["load_s"], "warmup_s": rep["warmup_s"],
            "versions": f"torch {rep['torch']}, transformers {rep['transformers']}"}


def run_rust(binary: Path, model: Path, pv: Path, out: Path, args, log_prefix: Path) -> dict:
    cmd = [str(binary), "reference", "--model", str(model), "--pixel-values", str(pv), "--out", str(out)]
    r = run_measured(cmd, child_env(args.threads), log_prefix)
    m = None
    for line in r["stderr"].splitlines():
        m = TIMING_RE.search(line) or m
    return {"wall_s": r["wall_s"], "rss_mb": r["rss_mb"],
            "forward_s": float(m.group(2)) if m else None, "load_s": float(m.group(1)) if m else None}


def compare(rust_out: Path, torch_out: Path) -> dict:
    import torch
    from safetensors.torch import load_file

    a, b = load_file(str(rust_out)), load_file(str(torch_out))
    res = {}
    for k in sorted(b):
        if k not in a:
            continue
        x, y = a[k].double(), b[k].double()
        if x.shape != y.shape:
            res[k] = {"error": f"shape {tuple(x.shape)} vs {tuple(y.shape)}"}
            continue
        cos = float(torch.nn.functional.cosine_similarity(x.flatten(), y.flatten(), dim=0))
        row_cos = float(torch.nn.functional.cosine_similarity(x, y, dim=-1).min())
        res[k] = {"cos": cos, "min_row_cos": row_cos, "max_abs": float((x - y).abs().max()),
                  "ref_max_abs": float(y.abs().max())}
    if "embeds" not in res:
        res["embeds"] = {"error": f"no `embeds` in {rust_out.name} (keys: {sorted(a)})"}
    return res


# --------------------------------------------------------------------------
# report
# --------------------------------------------------------------------------


def emit(lines: list[str], out: Path | None) -> None:
    """Print a benchmark's markdown section and append it to `out`."""
    text = "\n".join(lines) + "\n"
    print(text)
    if out:
        with open(out, "a") as f:
            f.write("\n" + text)


def med(xs):
    xs = [x for x in xs if x is not None]
    return statistics.median(xs) if xs else None


def fmt(x, spec=".2f", none="-"):
    return none if x is None else format(x, spec)


def ratio(a, b):
    return None if a is None or b is None or b == 0 else a / b


def cpu_model() -> str:
    """The CPU's model name, with its family and model where /proc/cpuinfo has
    them (the name alone is often just 'AMD EPYC', which covers CPUs 2.5x apart)."""
    fields: dict[str, str] = {}
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            k, _, v = line.partition(":")
            fields.setdefault(k.strip().lower(), v.strip())
    except OSError:
        pass
    name = fields.get("model name") or platform.processor() or "unknown"
    if "cpu family" in fields and "model" in fields:
        return f"{name} (family {fields['cpu family']}, model {fields['model']})"
    return name


# The gate's eight natural golden images (src/gate/cosine/cases.rs's
# GOLDEN_IMAGES), which benchmarks pass with --images so that cases added to
# the default set later do not move their figures.
NATURAL_IMAGES = ["square.png", "wide.jpg", "tall.png", "tiny.png", "large.jpg", "extreme.png", "rgba.png", "gray.jpg"]


def environment(binary) -> str:
    """The environment the project ran in: what runs its matrix products, as
    `BINARY --version` names them (library, version, kernels; and the
    project's own vector paths where it names them), and the
    OPENBLAS_* variables the benchmark's environment sets (the binaries hide
    them from their OpenBLAS; binaries before that linked the system's, which
    read them)."""
    products = "not named by this binary (it predates `--version`'s long form)"
    paths = None
    if binary is not None:
        try:
            out = subprocess.run([str(binary), "--version"], capture_output=True, text=True, timeout=120).stdout
            products = next((line.split(": ", 1)[1] for line in out.splitlines()
                             if line.startswith("matrix products: ")), products)
            paths = next((line.split(": ", 1)[1] for line in out.splitlines()
                          if line.startswith("vector paths: ")), None)
        except (OSError, subprocess.TimeoutExpired) as e:
            products = f"unknown ({e})"
    if paths:
        products += f"; the project's vector paths: {paths}"
    blas_vars = sorted(f"{k}={v}" for k, v in os.environ.items() if k.startswith("OPENBLAS_"))
    own = sorted(f"{k}={v}" for k, v in os.environ.items() if k.startswith("ANE_EXPORT_") and k != "ANE_EXPORT_VENV")
    return (f"the project's matrix products: {products}; OPENBLAS_* set: {', '.join(blas_vars) or 'none'}"
            + (f"; set for the project's binaries: {', '.join(own)}" if own else ""))


def machine_line(threads: int, rate: float | None, binary, numpy_blas=None) -> str:
    """The `- machine:` line of a benchmark's section: the CPU model, the
    threads, the load, numpy's matmul rate with the variables unset (and the
    kernels numpy chose; measured now when `rate` is None), and the
    environment the project ran in."""
    if rate is None:
        import bench_qwen25 as q25

        r = q25.matmul_rate(threads, Path(tempfile.mkdtemp(prefix="numpy-rate-")))
        rate, numpy_blas = r["gflops"], r["blas"]
    load = os.getloadavg()
    rate_s = f"{rate:.0f} GFLOP/s"
    if numpy_blas:
        kernels = ", ".join(f"{b.get('internal_api')} {b.get('architecture')}" for b in numpy_blas)
        rate_s += f" ({kernels})"
    return (f"- machine: `uname -m` = {os.uname().machine}, CPU {cpu_model()}, {os.cpu_count()} logical CPUs; "
            f"{threads} threads; load average at end {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}; fp32 matmul rate "
            f"(numpy sgemm 4096, OPENBLAS_CORETYPE and OPENBLAS_L2_SIZE unset) {rate_s}; {environment(binary)}")


def build_report(args, results, n_params, versions) -> str:
    L = []
    now = dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")
    L.append(f"### Qwen3-VL-2B vision tower: Rust reference vs transformers ({now})\n")
    L.append(f"- command: `{shlex.join([_rel(sys.executable)] + sys.argv)}`")
    L.append(machine_line(args.threads, None, None if args.torch_only else args.bin)
             + " (threads: torch.set_num_threads, OMP/MKL/RAYON_NUM_THREADS)")
    L.append(f"- tower: depth 24, hidden 1024, 16 heads, MLP 4096, out 2048, deepstack [5, 11, 17], "
             f"{n_params / 1e6:.1f} M params stored bf16, computed fp32; {versions}; "
             f"Rust binary: {'(not run, --torch-only)' if args.torch_only else _rel(args.bin)}")
    L.append(f"- load average (1/5/15 min) at start {args.load_start}, at end "
             f"{' '.join(f'{x:.2f}' for x in os.getloadavg())} (other work on the machine skews timings)")
    L.append(f"- {args.repeats} alternating round(s) per size, each run a fresh process; torch does "
             f"{args.warmup} warm-up forward(s) then times one; Rust forward = its `timing:` line "
             f"(else wall). Medians. RSS = peak resident set of the process (os.wait4 ru_maxrss).\n")
    L.append("| patches | grid | torch fwd s | rust fwd s | fwd rust/torch | torch load s | rust load s | "
             "torch wall s | rust wall s | torch RSS MB | rust RSS MB | RSS rust/torch | cos(embeds) | min row cos | cos deepstack (min) |")
    L.append("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for n, r in results.items():
        tf, rf = med([x["forward_s"] for x in r["torch"]]), med([x["forward_s"] or x["wall_s"] for x in r["rust"]])
        tl, rl = med([x["load_s"] for x in r["torch"]]), med([x["load_s"] for x in r["rust"]])
        tw, rw = med([x["wall_s"] for x in r["torch"]]), med([x["wall_s"] for x in r["rust"]])
        tm, rm = med([x["rss_mb"] for x in r["torch"]]), med([x["rss_mb"] for x in r["rust"]])
        cmpd = r.get("compare") or {}
        emb = cmpd.get("embeds", {})
        ds = [v["cos"] for k, v in cmpd.items() if k.startswith("deepstack") and "cos" in v]
        cos = emb.get("cos")
        cos_s = fmt(cos, ".7f") if cos is not None else (emb.get("error", "-") if cmpd else "-")
        g = grid_for(n)
        L.append(f"| {n} | {g[1]}x{g[2]} | {fmt(tf)} | {fmt(rf)} | {fmt(ratio(rf, tf), '.2f')} | {fmt(tl)} | "
                 f"{fmt(rl)} | {fmt(tw)} | {fmt(rw)} | {fmt(tm, '.0f')} | {fmt(rm, '.0f')} | "
                 f"{fmt(ratio(rm, tm), '.2f')} | {cos_s} | {fmt(emb.get('min_row_cos'), '.7f')} | "
                 f"{fmt(min(ds) if ds else None, '.7f')} |")
    L.append("")
    for n, r in results.items():
        cmpd = r.get("compare")
        if cmpd:
            parts = [f"{k}: max abs diff {v['max_abs']:.3e} (max |torch| {v['ref_max_abs']:.3f})"
                     for k, v in cmpd.items() if "max_abs" in v]
            L.append(f"- {n} patches: " + "; ".join(parts))
        t_runs = ", ".join(fmt(x["forward_s"]) for x in r["torch"])
        r_runs = ", ".join(fmt(x["forward_s"] or x["wall_s"]) for x in r["rust"]) or "-"
        L.append(f"- {n} patches, per-run forward s: torch [{t_runs}], rust [{r_runs}]")
    L.append("")
    return "\n".join(L)


# --------------------------------------------------------------------------


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bin", default="target/release/ane-export", help="Rust binary (relative paths: cwd, then repo root)")
    ap.add_argument("--patches", type=int, nargs="+", default=[1024, 4096])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--out", type=Path, help="markdown file to append the report to")
    ap.add_argument("--torch-only", action="store_true", help="skip the Rust binary")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--warmup", type=int, default=1, help="torch warm-up forwards per run")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--workdir", type=Path, help="keep checkpoint/inputs/outputs here instead of a temp dir")
    # internal: the torch child
    ap.add_argument("--child-torch", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--model", help=argparse.SUPPRESS)
    ap.add_argument("--pixel-values", help=argparse.SUPPRESS)
    ap.add_argument("--child-out", help=argparse.SUPPRESS)
    args = ap.parse_args()

    if args.child_torch:
        args.out = args.child_out
        child_torch(args)
        return

    for n in args.patches:
        grid_for(n)
    args.load_start = " ".join(f"{x:.2f}" for x in os.getloadavg())
    binary = None
    if not args.torch_only:
        b = Path(args.bin)
        cands = [b] if b.is_absolute() else [Path.cwd() / b, ROOT / b]
        binary = next((c.resolve() for c in cands if c.is_file()), None)
        if binary is None:
            raise SystemExit(f"Rust binary not found: {args.bin} (build it, or pass --torch-only)")
        args.bin = str(binary)

    tmp = None
    if args.workdir:
        work = args.workdir.resolve()
        work.mkdir(parents=True, exist_ok=True)
    else:
        tmp = tempfile.mkdtemp(prefix="bench_tower_")
        work = Path(tmp)
    try:
        model_dir = work / "qwen3vl-2b-vision-random"
        t0 = time.perf_counter()
        n_params = child_call(__file__, "write_checkpoint", d=str(model_dir), seed=args.seed)
        print(f"checkpoint: {model_dir} ({n_params / 1e6:.1f} M params, "
              f"{(model_dir / 'model.safetensors').stat().st_size / 1e6:.0f} MB, {time.perf_counter() - t0:.1f} s)",
              flush=True)
        results: dict[int, dict] = {}
        versions = ""
        for n in args.patches:
            pv = work / f"pixel_values_{n}.safetensors"
            child_call(__file__, "write_inputs", path=str(pv), n=n, seed=args.seed)
            res = {"torch": [], "rust": []}
            t_out, r_out = work / f"torch_out_{n}.safetensors", work / f"rust_out_{n}.safetensors"
            for k in range(args.repeats):
                tr = run_torch(model_dir, pv, t_out, args, work / f"torch_{n}_{k}")
                versions = tr["versions"]
                res["torch"].append(tr)
                print(f"[{n} patches, round {k + 1}/{args.repeats}] torch: forward {tr['forward_s']:.2f} s, "
                      f"load {tr['load_s']:.2f} s, wall {tr['wall_s']:.2f} s, peak RSS {tr['rss_mb']:.0f} MB "
                      f"(self-reported {tr['self_rss_mb']:.0f} MB)", flush=True)
                if binary is not None:
                    rr = run_rust(binary, model_dir, pv, r_out, args, work / f"rust_{n}_{k}")
                    res["rust"].append(rr)
                    print(f"[{n} patches, round {k + 1}/{args.repeats}] rust:  forward {fmt(rr['forward_s'])} s, "
                          f"load {fmt(rr['load_s'])} s, wall {rr['wall_s']:.2f} s, peak RSS {rr['rss_mb']:.0f} MB",
                          flush=True)
            if binary is not None:
                res["compare"] = compare(r_out, t_out)
            results[n] = res
        report = build_report(args, results, n_params, versions)
        print()
        print(report)
        if args.out:
            args.out.parent.mkdir(parents=True, exist_ok=True)
            with open(args.out, "a") as f:
                f.write(report + "\n")
            print(f"appended to {args.out}")
    finally:
        if tmp:
            shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__" and not serve_child_call(sys.argv, globals()):
    main()
