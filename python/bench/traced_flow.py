#!/usr/bin/env python3
"""The path a user would take without ane-export: transformers' Qwen3-VL
vision model traced with `torch.jit.trace` at a fixed grid and converted with
`ct.convert`. Records what it does, step by step.

    .venv-dev/bin/python python/bench/traced_flow.py --model DIR [--patches 1024] [--out PKG]

Needs torch, transformers and coremltools in one venv (`.venv-dev`:
`python/requirements-dev.txt`). Loads the checkpoint's vision tower in fp32
(SDPA attention), traces `visual(pixel_values, grid_thw)` for one still
image of the bucket's patch count (a square grid), and converts the trace
with `ct.convert` (ML program, fp16, macOS 15). Prints one JSON line: the
versions, the seconds of each step reached, and the error of the step that
failed (its type, message and the innermost frames), if one did.
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import sys
import time
import traceback
from pathlib import Path


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", type=Path, required=True)
    ap.add_argument("--patches", type=int, default=1024)
    ap.add_argument("--out", type=Path)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()

    import coremltools as ct
    import torch
    import transformers
    from transformers import Qwen3VLForConditionalGeneration

    torch.set_num_threads(args.threads)
    transformers.utils.logging.set_verbosity_error()
    # coremltools logs which traced op it failed on; keep those lines for the record.
    logged = []

    class Keep(logging.Handler):
        def emit(self, record):
            logged.append(record.getMessage().strip())

    logging.getLogger("coremltools").addHandler(Keep(level=logging.ERROR))
    rec = {"versions": {"torch": torch.__version__, "transformers": transformers.__version__,
                        "coremltools": ct.__version__},
           "patches": args.patches, "steps": {}}
    side = math.isqrt(args.patches)
    step = "load"
    try:
        t = time.perf_counter()
        model = Qwen3VLForConditionalGeneration.from_pretrained(args.model, dtype=torch.float32,
                                                                attn_implementation="sdpa")
        visual = model.model.visual.eval()
        vc = model.config.vision_config
        rec["steps"]["load"] = time.perf_counter() - t
        row = vc.in_channels * vc.temporal_patch_size * vc.patch_size ** 2
        pv = torch.randn(side * side, row)
        grid = torch.tensor([[1, side, side]], dtype=torch.int64)

        class Tower(torch.nn.Module):
            """The vision model's merged embeddings and deepstack features as plain tensors."""

            def __init__(self, v):
                super().__init__()
                self.v = v

            def forward(self, pixel_values, grid_thw):
                out = self.v(pixel_values, grid_thw=grid_thw)
                return (out.pooler_output, *out.deepstack_features)

        step = "torch.jit.trace"
        t = time.perf_counter()
        with torch.no_grad():
            traced = torch.jit.trace(Tower(visual), (pv, grid), check_trace=False, strict=False)
        rec["steps"]["torch.jit.trace"] = time.perf_counter() - t
        step = "ct.convert"
        t = time.perf_counter()
        m = ct.convert(traced, inputs=[ct.TensorType(name="pixel_values", shape=tuple(pv.shape)),
                                       ct.TensorType(name="grid_thw", shape=(1, 3), dtype=int)],
                       convert_to="mlprogram", minimum_deployment_target=ct.target.macOS15,
                       compute_precision=ct.precision.FLOAT16, skip_model_load=True)
        rec["steps"]["ct.convert"] = time.perf_counter() - t
        if args.out:
            step = "save"
            t = time.perf_counter()
            m.save(str(args.out))
            rec["steps"]["save"] = time.perf_counter() - t
        rec["outcome"] = "converted"
    except Exception as e:  # the point is to record how the flow fails
        frames = traceback.extract_tb(e.__traceback__)[-3:]
        rec["outcome"] = "failed"
        rec["failed_step"] = step
        rec["error"] = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"[:400]
        rec["where"] = [f"{Path(f.filename).name}:{f.lineno} in {f.name}" for f in frames]
        rec["logged"] = [m for m in logged if m][:3]
    print(json.dumps(rec))
    sys.exit(0 if rec["outcome"] == "converted" else 1)


if __name__ == "__main__":
    main()
