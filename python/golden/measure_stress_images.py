#!/usr/bin/env python3
"""Measure which stress images drive the golden towers' activations hardest.

Writes golden/README-stress.md. Run with the developer venv (torch,
transformers, pillow; CPU, no network):

    .venv-dev/bin/python python/golden/measure_stress_images.py

Every candidate of make_stress_images.py and every default natural golden image
goes through each golden tiny tower in transformers (fp32), preprocessed by the
checkpoint's own image processor with the Qwen processors capped at the largest
default bucket (4096 patches, as the gate scales an image into it). Forward
hooks on each vision block record the largest |value| of the residual stream
(the block's output) and of the MLP's hidden layer (the largest of the first
projection's output, before the activation, and of the down projection's input,
after it). The Qwen mergers are not hooked.
"""

from __future__ import annotations

import json
import platform
import sys
import tempfile
from pathlib import Path

import numpy as np
import PIL
import torch
import transformers
from PIL import Image

sys.path.insert(0, str(Path(__file__).resolve().parent))
import make_stress_images as msi  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
GOLDEN = ROOT / "golden"
README = GOLDEN / "README-stress.md"
LARGEST_BUCKET = 4096

# The gate's default natural images (src/gate/cosine/cases.rs, GOLDEN_IMAGES).
NATURAL = ["square.png", "wide.jpg", "tall.png", "tiny.png", "large.jpg", "extreme.png", "rgba.png", "gray.jpg"]

# (name, directory): one tiny checkpoint per family, the two trained VLMs, and
# the encoders with planted massive activations.
MODELS = [
    ("tiny-a", "models/tiny-a"),
    ("tiny-q25", "models/tiny-q25"),
    ("tiny-q2", "models/tiny-q2"),
    ("tiny-vlm", "tiny-vlm"),
    ("tiny-vlm-q25", "tiny-vlm-q25"),
    ("tiny-clip", "models/tiny-clip"),
    ("tiny-siglip", "models/tiny-siglip"),
    ("tiny-dinov2", "models/tiny-dinov2"),
    ("tiny-clip-massive", "models/tiny-clip-massive"),
    ("tiny-siglip-massive", "models/tiny-siglip-massive"),
    ("tiny-dinov2-massive", "models/tiny-dinov2-massive"),
]


# Why the kept set is what it is, and what it costs (the gate times were
# measured by hand, as the text says; the rest of README-stress.md is measured
# by this script).
CHOICE = """
## What the measurement shows

- No candidate comes near fp16's limits in these towers: the peaks reach at most about 1.8 times the natural
  images' (the patch-sized and coarse checkerboards in the residual stream, noise in the Qwen MLPs). Trained towers may
  differ: the rows above say which inputs push a tower's statistics furthest, not how far a trained tower's
  outliers go.
- Cells shifted half a patch off the grid (a patch then holds an edge) rank above aligned cells at both patch sizes,
  though not on every tower; the 16-px cells rank above the 14-px ones even on the patch-14 towers.
- The fine checkerboards (1 and 2 px cells) lower the peaks almost everywhere: every patch then sees the same
  pattern, and a fixed-resolution encoder's resize blurs them to grey. One is kept for coverage (issue 51 asks for
  fine content; a trained patch embedding may answer it differently), not because it drives activations.
- Binary noise and eight-colour noise score alike; the binary image is the smaller file.
- The 1024 x 1024 candidates score within 0.2 of their 448 x 448 versions; the highest-ranked, the 56-px checkerboard, is the
  pattern of ollama PR #18070 at the largest bucket's size.

## Cost

The interpreter runs a case at its bucket's full shape whatever the image (a small image is padded), so each added
image costs a run per bucket; the large one costs no more than a small one there, only its fp32 reference is slower.
`ane-export gate A -q --skip vqa --skip task` with the default buckets, before (`--images` with the eight natural
images, named so that the same three make the multi-image call: the old default cases) and after (the default cases,
15 images and the call), the same binary, alternating, two rounds each, on a shared 2-core Linux machine (seconds):

| model (family) | cases before | cases after | before | after |
|---|---|---|---|---|
| tiny-a (Qwen3-VL) | 18 | 32 | 23.4, 23.0 | 41.2, 40.2 |
| tiny-q25 (Qwen2.5-VL) | 18 | 32 | 8.6, 8.2 | 15.0, 14.6 |
| tiny-q2 (Qwen2-VL) | 18 | 32 | 12.1, 11.4 | 21.5, 21.3 |
| tiny-clip (CLIP) | 9 | 16 | 0.57, 0.55 | 0.62, 0.67 |
| tiny-siglip (SigLIP) | 9 | 16 | 0.23, 0.22 | 0.36, 0.45 |
| tiny-dinov2 (DINOv2) | 9 | 16 | 0.57, 0.55 | 0.61, 0.54 |
| tiny-siglip2 (SigLIP2) | 18 | 32 | 8.4, 8.9 | 15.9, 16.0 |

Every case passed in both runs (the lowest minimum cosine over the stress cases was 0.999999, as on the natural
ones). The project's tests pass `--images` for most Qwen gates; those that use the default cases are the encoder
tests (under a second each), the SigLIP2 default-bucket tests and `make test-install` (the tiny VLM).
"""


class Peaks:
    """Forward hooks on a tower's blocks: the largest |residual| and |MLP hidden|."""

    def __init__(self, blocks: torch.nn.ModuleList):
        self.residual = 0.0
        self.mlp = 0.0
        self.handles = []
        for b in blocks:
            self.handles.append(b.register_forward_hook(self._block))
            linears = [m for m in b.mlp.modules() if isinstance(m, torch.nn.Linear)]
            for m in linears[:-1]:
                self.handles.append(m.register_forward_hook(self._first))
            self.handles.append(linears[-1].register_forward_pre_hook(self._down))

    def _block(self, _m, _i, out):
        t = out[0] if isinstance(out, tuple) else out
        self.residual = max(self.residual, float(t.abs().max()))

    def _first(self, _m, _i, out):
        self.mlp = max(self.mlp, float(out.abs().max()))

    def _down(self, _m, inp):
        self.mlp = max(self.mlp, float(inp[0].abs().max()))

    def reset(self):
        self.residual = self.mlp = 0.0


def load(path: Path):
    """(run(image) -> None, hooked Peaks) for the checkpoint at `path`."""
    cfg = json.loads((path / "config.json").read_text())
    cls = getattr(transformers, cfg["architectures"][0])
    model = cls.from_pretrained(path, dtype=torch.float32, attn_implementation="eager").eval()
    proc = transformers.AutoImageProcessor.from_pretrained(path)
    if cfg["model_type"].startswith("qwen"):
        visual = model.model.visual
        patch = cfg["vision_config"]["patch_size"]
        cap = LARGEST_BUCKET * patch * patch
        peaks = Peaks(visual.blocks)

        def run(img):
            x = proc(images=img, return_tensors="pt",
                     size={"shortest_edge": min(proc.size["shortest_edge"], cap), "longest_edge": cap})
            visual(x["pixel_values"], grid_thw=x["image_grid_thw"])
    else:
        vm = getattr(model, "vision_model", model)
        layers = vm.encoder.layers if hasattr(vm.encoder, "layers") else vm.encoder.layer
        peaks = Peaks(layers)

        def run(img):
            vm(pixel_values=proc(images=img, return_tensors="pt")["pixel_values"])
    return run, peaks


def measure(images: dict[str, Path]) -> dict[str, dict[str, tuple[float, float]]]:
    """model -> image -> (residual peak, MLP peak)."""
    out = {}
    for name, rel in MODELS:
        run, peaks = load(GOLDEN / rel)
        out[name] = {}
        for img_name, p in images.items():
            peaks.reset()
            with torch.no_grad():
                run(Image.open(p).convert("RGB"))
            out[name][img_name] = (peaks.residual, peaks.mlp)
        print(f"  {name}: {len(images)} images", file=sys.stderr)
    return out


def fmt(v: float) -> str:
    return f"{v:.3g}" if v < 1e4 else f"{v:.0f}"


def table(res, images: list[str], col: int, natural_max: dict[str, float]) -> list[str]:
    """One row per image: each model's peak, and its ratio to the model's
    natural-image maximum in parentheses."""
    models = [m for m, _ in MODELS]
    lines = ["| image | kind | " + " | ".join(models) + " |", "|---|---|" + "---|" * len(models)]
    for i in images:
        k = "natural" if i in NATURAL else msi.kind(i)
        cells = []
        for m in models:
            v = res[m][i][col]
            cells.append(fmt(v) if i in NATURAL else f"{fmt(v)} ({v / natural_max[m]:.2f})")
        lines.append(f"| {i}{' **kept**' if i in msi.KEPT else ''} | {k} | " + " | ".join(cells) + " |")
    return lines


def main() -> int:
    with tempfile.TemporaryDirectory() as d:
        cands = msi.candidates()
        msi.write(cands, Path(d))
        images = {n: GOLDEN / "images" / n for n in NATURAL} | {n: Path(d) / n for n in cands}
        res = measure(images)
    order = NATURAL + list(cands)
    scores = {}
    body = []
    for col, what in ((0, "residual stream"), (1, "MLP hidden layer")):
        nat = {m: max(res[m][i][col] for i in NATURAL) for m, _ in MODELS}
        body += [f"### Largest |{what}| over the blocks", ""] + table(res, order, col, nat) + [""]
        for i in cands:
            # Geometric mean over the models without planted activations of
            # the peak relative to the natural images' largest.
            r = [res[m][i][col] / nat[m] for m, _ in MODELS if "massive" not in m]
            scores.setdefault(i, []).append(float(np.exp(np.mean(np.log(r)))))
    rank = sorted(cands, key=lambda i: -max(scores[i]))
    chosen = choose(rank)
    head = [
        "# Stress images of the cosine gate (`images-stress/`)",
        "",
        "Written by `python/golden/make_stress_images.py` (numpy and PIL only; the kept set); the measurement below "
        "by `python/golden/measure_stress_images.py` (torch, transformers; rewrites this file). Do not edit.",
        "",
        f"Measured with torch {torch.__version__}, transformers {transformers.__version__}, pillow {PIL.__version__}, "
        f"numpy {np.__version__}, python {platform.python_version()}.",
        "",
        "## Why",
        "",
        "Trained Qwen towers cross fp16's limits on high-frequency images: a 56-px checkerboard at 1350x1800 breaks "
        "qwen2.5vl:3b under fp16 accumulation while Qwen3-VL passes (ollama PR #18070); Qwen2.5-VL-3B's vision MLP "
        "down projection reaches -inf with SwiGLU values in the thousands (llama.cpp #17534). The natural-looking "
        "golden images (`images/`) contain nothing like that, so the gate's default cases add these.",
        "",
        "## Candidates",
        "",
        "Black-and-white checkerboards with square cells of 1, 2 (fine), 14, 16 (a patch of Qwen2/2.5-VL, of "
        "Qwen3-VL; edges on the patch grid, `shift` half a patch off it) and 56 px (coarse, as in ollama #18070); "
        "a page of small black text on white (PIL's built-in bitmap font); seeded noise (`noise`: each pixel black "
        "or white; `noise-rgb`: each channel 0 or 255). Each at 448 x 448 (no Qwen processor resizes it: 784 "
        "patches at patch 16, 1024 at patch 14, the `b1024` bucket) and 1024 x 1024 (64 x 64 patches at patch 16, "
        "the largest default bucket `b4096` unresized; at patch 14 scaled by 7/8 to 896 x 896, again 64 x 64 "
        "patches and 4096 Qwen2.5-VL slots, a 16-px cell becoming a 14-px one on the grid). The fixed-resolution "
        "encoders resize every image to their side (120 to 160 px here), which blurs the fine patterns to grey.",
        "",
        "## Measurement",
        "",
        "Each image through each golden tiny tower in transformers (fp32, eager attention), preprocessed by the "
        "checkpoint's own processor (the Qwen ones capped at 4096 patches, as the gate scales an image into the "
        "largest bucket). Forward hooks on every vision block record the largest |value| of the residual stream "
        "(the block's output) and of the MLP's hidden layer (the first projection's output before the activation, "
        "and the down projection's input after it). In parentheses: the ratio to the model's largest over the eight "
        "default natural images. The `-massive` encoders carry planted activations that dominate every image alike.",
        "",
        "**These are tiny checkpoints, random except tiny-vlm and tiny-vlm-q25 (trained on easy-vqa for a few "
        "minutes): only a proxy for trained towers, whose large activations come from training (and sit in a few "
        "channels, llama.cpp #17534). The ranking here is what a random or barely trained tower does with the "
        "input statistics; it does not show that the kept images provoke a 3B tower's outliers.**",
        "",
    ]
    rank_lines = [
        "## Ranking and choice",
        "",
        "Score: the geometric mean over the seven models without planted activations of the peak relative to the "
        "natural images' largest; candidates ranked by the larger of the residual and the MLP score. Kept: the "
        "highest-ranked 448 x 448 candidate of each kind, and the highest-ranked 1024 x 1024 one (every image "
        "costs a gate run per bucket; see Cost).",
        "",
        "| candidate | kind | residual score | MLP score | kept |",
        "|---|---|---|---|---|",
    ] + [f"| {i} | {msi.kind(i)} | {scores[i][0]:.2f} | {scores[i][1]:.2f} | {'yes' if i in msi.KEPT else ''} |"
         for i in rank] + [""]
    README.write_text("\n".join(head + body + rank_lines + choice_text()) + "\n")
    print("\n".join(rank_lines))
    if sorted(chosen) != sorted(msi.KEPT):
        print(f"make_stress_images.KEPT should now be {chosen}", file=sys.stderr)
        return 1
    return 0


def choose(rank: list[str]) -> list[str]:
    """The kept set: the highest-scoring small candidate of each kind, then
    the highest-scoring large one (each image costs a gate run per bucket,
    so one large image stands for the largest bucket's size)."""
    small = [i for i in rank if i.endswith(f"-{msi.SMALL}.png")]
    best = {}
    for i in small:
        best.setdefault(msi.kind(i), i)
    large = next(i for i in rank if i.endswith(f"-{msi.LARGE}.png"))
    return list(best.values()) + [large]


def choice_text() -> list[str]:
    return CHOICE.strip("\n").splitlines()


if __name__ == "__main__":
    sys.exit(main())
