#!/usr/bin/env python3
"""Where coremltools' conversion spends its time on a bucket's program.

    .venv/bin/python python/bench/convert_passes.py [--patches 4096] [--depth 4] [--heads 16] [--default-pipeline]

Builds a Qwen3-VL-shaped program with small random weights (hidden 64, so
that weights cost nothing) but the 2B tower's op structure per block (16
heads, query chunks of 512), converts it as `ane-export build` does
(`qwen3_vl.convert`: the fp16 program through `CONVERT_PASSES`, macOS 15),
and prints the op count, the conversion time and the seconds spent in each
graph pass (the twelve slowest). `--default-pipeline` converts through
coremltools' default pipeline instead, for comparison. Op count and pass
time grow with depth: the 2B tower has 24 blocks.
"""

import argparse
import collections
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def weights(depth: int, d: int, inter: int, out: int, patch_dim: int) -> dict:
    rng = np.random.default_rng(0)

    def conv(o, i):
        return rng.standard_normal((o, i, 1, 1)).astype(np.float32) * 0.1

    def zeros(n):
        return np.zeros(n, np.float32)

    w = {"patch_embed.weight": conv(d, patch_dim), "patch_embed.bias": zeros(d)}
    for i in range(depth):
        b = f"blocks.{i}"
        for n in ("norm1", "norm2"):
            w[f"{b}.{n}.weight"], w[f"{b}.{n}.bias"] = np.ones(d, np.float32), zeros(d)
        for n, (o, ii) in {"attn.qkv": (3 * d, d), "attn.proj": (d, d), "mlp.linear_fc1": (inter, d),
                           "mlp.linear_fc2": (d, inter)}.items():
            w[f"{b}.{n}.weight"], w[f"{b}.{n}.bias"] = conv(o, ii), zeros(o)
    for p, norm in (("merger", d), ("deepstack_merger_list.0", 4 * d)):
        w[f"{p}.norm.weight"], w[f"{p}.norm.bias"] = np.ones(norm, np.float32), zeros(norm)
        w[f"{p}.linear_fc1.weight"], w[f"{p}.linear_fc1.bias"] = conv(4 * d, 4 * d), zeros(4 * d)
        w[f"{p}.linear_fc2.weight"], w[f"{p}.linear_fc2.bias"] = conv(out, 4 * d), zeros(out)
    return w


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--patches", type=int, default=4096)
    ap.add_argument("--depth", type=int, default=4)
    ap.add_argument("--heads", type=int, default=16)
    ap.add_argument("--default-pipeline", action="store_true", help="coremltools' default pass pipeline")
    args = ap.parse_args()

    from ane_export.emit import CONVERT_PASSES, convert
    from ane_export.qwen3_vl import build_program
    from coremltools.converters.mil.mil.passes.pass_registry import PASS_REGISTRY

    d, inter, out, patch_dim = 64, 96, 32, 12
    spec = dict(hidden_size=d, num_heads=args.heads, depth=args.depth, out_hidden_size=out,
                intermediate_size=inter, deepstack_visual_indexes=[min(1, args.depth - 1)], patch_dim=patch_dim,
                hidden_act="gelu_pytorch_tanh")
    w = weights(args.depth, d, inter, out, patch_dim)

    seconds = collections.Counter()
    for name, p in PASS_REGISTRY.passes.items():
        cls = p if isinstance(p, type) else p.__class__
        orig = cls.apply

        def timed(self, prog, _orig=orig, _name=name):
            t = time.perf_counter()
            try:
                return _orig(self, prog)
            finally:
                seconds[_name] += time.perf_counter() - t

        cls.apply = timed
    t0 = time.perf_counter()
    prog = build_program(spec, w, args.patches)
    t1 = time.perf_counter()
    ops = len(list(prog.functions["main"].operations))
    convert(prog, "macOS15", passes=None if args.default_pipeline else CONVERT_PASSES)
    t2 = time.perf_counter()
    pipeline = "default pipeline" if args.default_pipeline else "CONVERT_PASSES"
    print(f"depth {args.depth}, {args.heads} heads, {args.patches} patches, {pipeline}: {ops} ops; build_program "
          f"{t1 - t0:.1f} s, ct.convert {t2 - t1:.1f} s, of which in timed passes {sum(seconds.values()):.1f} s")
    for name, s in seconds.most_common(12):
        print(f"{s:8.2f} s  {name}")


if __name__ == "__main__":
    main()
