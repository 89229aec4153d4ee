#!/usr/bin/env python3
"""Write the cosine gate's stress images, golden/images-stress (deterministic).

Trained Qwen towers are known to cross fp16's limits on high-frequency images
(a 56-px checkerboard at 1350x1800 broke qwen2.5vl:3b under fp16 accumulation,
ollama PR #18070; Qwen2.5-VL's vision MLP reaching -inf, llama.cpp #17534), and
the natural-looking golden images (golden/images) contain nothing like it. These
images do: checkerboards at several periods and phases relative to the patch
grid, a page of small text and noise, small and at the largest default bucket's
size. Only numpy and PIL (no downloads; the text uses PIL's built-in bitmap
font, which is part of PIL and rendered without FreeType).

    .venv-dev/bin/python python/golden/make_stress_images.py            # the kept set
    .venv-dev/bin/python python/golden/make_stress_images.py --all DIR  # every candidate

The kept set (`KEPT`, which `src/gate/cosine/cases.rs` lists as `STRESS_IMAGES`)
was chosen from the candidates by python/golden/measure_stress_images.py, whose
table is golden/README-stress.md.

Sizes. 448 x 448 is a multiple of 32 and of 28 (the merged patch of patch 16 and
of patch 14), so no Qwen processor resizes it: 784 patches at patch 16 and 1024
at patch 14, both the `b1024` bucket. 1024 x 1024 is 64 x 64 patches at patch 16
(Qwen3-VL), exactly the largest default bucket (`b4096`), unresized. At patch 14
(Qwen2-VL, Qwen2.5-VL) it exceeds 4096 * 14^2 pixels and is scaled by 7/8 to
896 x 896, again 64 x 64 patches (and 8 x 8 whole Qwen2.5-VL windows, 4096
slots): the largest bucket filled, and a 16-px cell becomes a 14-px cell with
its phase scaled alike, so the large checkerboards stay aligned to both grids.
Fixed-resolution encoders (CLIP, SigLIP, DINOv2) resize every image to their own
side, which blurs the finest patterns; the coarse ones survive.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
from PIL import Image, ImageDraw, ImageFont

ROOT = Path(__file__).resolve().parents[2]
OUT = ROOT / "golden" / "images-stress"
SEED = 0
SMALL = 448
LARGE = 1024

# The kept candidates, in the gate's order (see golden/README-stress.md).
KEPT = [
    "checker2-448.png",
    "checker14-shift7-448.png",
    "checker16-shift8-448.png",
    "checker56-448.png",
    "text-448.png",
    "noise-448.png",
    "checker56-1024.png",
]

TEXT = (
    "The quick brown fox jumps over the lazy dog. 0123456789 "
    "PACK MY BOX WITH FIVE DOZEN LIQUOR JUGS! (a+b)*c = [x/y] {z}; "
    "sphinx of black quartz, judge my vow: #%&@$ "
)


def checker(side: int, cell: int, shift: int = 0) -> Image.Image:
    """Black and white squares of `cell` pixels, their edges `shift` pixels
    from the origin (so from the patch grid's lines) on both axes."""
    i = (np.arange(side) + shift) // cell
    board = (i[:, None] + i[None, :]) % 2
    return Image.fromarray((board * 255).astype(np.uint8), "L").convert("RGB")


def text_page(side: int) -> Image.Image:
    """Small black text on white, PIL's bitmap font (6 x 11 px glyphs),
    lines 12 px apart, a 4 px margin."""
    img = Image.new("RGB", (side, side), "white")
    draw = ImageDraw.Draw(img)
    font = ImageFont.load_default_imagefont()
    words = (TEXT * 200).split(" ")
    y, k = 4, 0
    while y + 11 <= side - 4:
        line = ""
        while k < len(words) and font.getlength(line + words[k] + " ") <= side - 8:
            line += words[k] + " "
            k += 1
        draw.text((4, y), line, fill="black", font=font)
        y += 12
    return img


def noise(side: int, rgb: bool) -> Image.Image:
    """Seeded noise at full contrast: each pixel black or white, or each of
    its channels 0 or 255 independently (eight colours, a small file)."""
    rng = np.random.default_rng([SEED, side, int(rgb)])
    if rgb:
        return Image.fromarray(rng.integers(0, 2, (side, side, 3), dtype=np.uint8) * 255, "RGB")
    bw = rng.integers(0, 2, (side, side), dtype=np.uint8) * 255
    return Image.fromarray(bw, "L").convert("RGB")


def candidates() -> dict[str, Image.Image]:
    """Every candidate the measurement compares, by file name."""
    out: dict[str, Image.Image] = {}
    for side in (SMALL, LARGE):
        for cell, shifts in ((1, [0]), (2, [0]), (14, [0, 7]), (16, [0, 8]), (56, [0, 28])):
            for s in shifts:
                name = f"checker{cell}" + (f"-shift{s}" if s else "") + f"-{side}.png"
                out[name] = checker(side, cell, s)
        out[f"text-{side}.png"] = text_page(side)
        out[f"noise-{side}.png"] = noise(side, rgb=False)
        out[f"noise-rgb-{side}.png"] = noise(side, rgb=True)
    return out


def kind(name: str) -> str:
    """The candidate's kind: the kept set has the hardest of each."""
    if name.startswith("checker"):
        cell = int(name.removeprefix("checker").split("-")[0])
        return {1: "fine checkerboard", 2: "fine checkerboard", 14: "patch-14 checkerboard",
                16: "patch-16 checkerboard"}.get(cell, "coarse checkerboard")
    return "text" if name.startswith("text") else "noise"


def write(images: dict[str, Image.Image], out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    for name, img in images.items():
        # Grayscale content is stored as L (smaller files); decoders give RGB alike.
        arr = np.asarray(img)
        gray = (arr[..., 0] == arr[..., 1]).all() and (arr[..., 1] == arr[..., 2]).all()
        (img.convert("L") if gray else img).save(out / name, optimize=True)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--all", type=Path, metavar="DIR", help="write every candidate to DIR instead")
    args = ap.parse_args()
    images = candidates()
    if args.all:
        write(images, args.all)
        return 0
    for old in OUT.glob("*.png"):
        old.unlink()
    write({n: images[n] for n in KEPT}, OUT)
    return 0


if __name__ == "__main__":
    sys.exit(main())
