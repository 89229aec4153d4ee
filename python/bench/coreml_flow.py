#!/usr/bin/env python3
"""The plain coremltools flow for a tower, as a user would run it by hand:
the baseline `bench_build.py` times `ane-export build` against.

    .venv/bin/python python/bench/coreml_flow.py --layout DIR --out PKG [--buckets 1024 4096]

DIR is what `ane-export layout` writes (weights.safetensors in the ANE layout
and layout.json with the tower's configuration). For each bucket the
project's MIL program (`qwen3_vl.build_program`) goes through `ct.convert`
with coremltools' default pass pipeline and fp16 compute precision, is saved
as its own package, and `ct.utils.save_multifunction` merges the packages
into PKG, one function per bucket, as coremltools documents for multifunction
models. The program is the one `ane-export build` emits, already in fp16, so
the default pipeline's fp16 cast pass has nothing to do: if anything this
flatters the baseline against a program built in fp32.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--layout", type=Path, required=True)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--buckets", type=int, nargs="+", default=[1024, 4096])
    args = ap.parse_args()

    import coremltools as ct
    from ane_export.coreml import read_safetensors
    from ane_export.qwen3_vl import build_program

    cfg = json.loads((args.layout / "layout.json").read_text())["config"]
    spec = dict(cfg, patch_dim=3 * cfg["patch_size"] ** 2,
                hidden_act="gelu_pytorch_tanh" if cfg["hidden_act"] == "GeluTanh" else "gelu")
    weights = read_safetensors(args.layout / "weights.safetensors")
    tmp = Path(tempfile.mkdtemp(prefix="coreml_flow_"))
    try:
        desc = ct.utils.MultiFunctionDescriptor()
        for n in args.buckets:
            t = time.perf_counter()
            m = ct.convert(build_program(spec, weights, n), convert_to="mlprogram",
                           minimum_deployment_target=ct.target.macOS15,
                           compute_precision=ct.precision.FLOAT16, skip_model_load=True)
            m.save(str(tmp / f"b{n}.mlpackage"))
            del m
            desc.add_function(str(tmp / f"b{n}.mlpackage"), src_function_name="main", target_function_name=f"b{n}")
            print(f"b{n}: convert and save {time.perf_counter() - t:.1f} s", file=sys.stderr, flush=True)
        desc.default_function_name = f"b{args.buckets[0]}"
        t = time.perf_counter()
        ct.utils.save_multifunction(desc, str(args.out))
        print(f"save_multifunction {time.perf_counter() - t:.1f} s", file=sys.stderr, flush=True)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
