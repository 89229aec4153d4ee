#!/usr/bin/env python3
"""Regenerate the JPEG goldens: golden/images-jpeg and golden/preprocess-jpeg.

Run with the developer venv (torch, transformers 5, torchvision, pillow):

    .venv-dev/bin/python python/golden/make_golden_jpeg.py

JPEGs written by Pillow (libjpeg-turbo) at several qualities, chroma
subsamplings (4:4:4, 4:2:2, 4:2:0, 4:1:1), baseline and progressive, with
optimised Huffman tables and restart markers, in gray and CMYK, at odd sizes
(the edge of a subsampled chroma plane is where upsamplers disagree), and with
every EXIF orientation. Each file under preprocess-jpeg holds what
transformers' `load_image` path gives (`ImageOps.exif_transpose`, then
`convert_to_rgb`): `rgb`, the decoded upright image, and `levels`/`grid_thw`
from `Qwen2VLImageProcessor` (torchvision backend), in the layout of
golden/preprocess. One file is truncated on purpose: Pillow refuses it.
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import numpy as np
import PIL
import PIL.features
from PIL import Image, ImageOps

sys.path.insert(0, str(Path(__file__).resolve().parent))
from make_golden import GOLDEN, make_preprocess, synth_rgb  # noqa: E402

IMAGES = GOLDEN / "images-jpeg"
PRE = GOLDEN / "preprocess-jpeg"

# name -> (seed, (w, h), Pillow save options)
COLOUR = {
    "q50_420.jpg": (20, (227, 181), dict(quality=50, subsampling="4:2:0")),
    "q75_420.jpg": (21, (301, 163), dict(quality=75, subsampling="4:2:0")),
    "q95_420.jpg": (22, (255, 255), dict(quality=95, subsampling="4:2:0")),
    "q90_444.jpg": (23, (229, 187), dict(quality=90, subsampling="4:4:4")),
    "q85_422.jpg": (24, (183, 261), dict(quality=85, subsampling="4:2:2")),
    "q80_411.jpg": (25, (219, 197), dict(quality=80, subsampling="4:1:1")),
    "prog_q85_420.jpg": (26, (241, 179), dict(quality=85, subsampling="4:2:0", progressive=True)),
    "prog_q92_444.jpg": (27, (197, 233), dict(quality=92, subsampling="4:4:4", progressive=True)),
    "opt_q70_420.jpg": (28, (263, 151), dict(quality=70, subsampling="4:2:0", optimize=True)),
    "restart_q80_420.jpg": (29, (211, 199), dict(quality=80, subsampling="4:2:0", restart_marker_blocks=7)),
}
TRUNCATED = "truncated.jpg"


def main() -> None:
    assert PIL.features.check_feature("libjpeg_turbo"), "Pillow must be built with libjpeg-turbo"
    for d in (IMAGES, PRE):
        shutil.rmtree(d, ignore_errors=True)
    IMAGES.mkdir(parents=True)
    specs: dict[str, tuple[str, tuple[int, int]]] = {}
    for name, (seed, (w, h), opts) in COLOUR.items():
        Image.fromarray(synth_rgb(h, w, seed, noise=4.0), "RGB").save(IMAGES / name, **opts)
        specs[name] = ("RGB", (w, h))

    gray = synth_rgb(173, 239, 30, noise=4.0).astype(np.float64) @ np.array([0.299, 0.587, 0.114])
    gray = np.clip(gray, 0, 255).round().astype(np.uint8)
    Image.fromarray(gray, "L").save(IMAGES / "gray_prog_q80.jpg", quality=80, progressive=True)
    specs["gray_prog_q80.jpg"] = ("L", (239, 173))

    rgbc = synth_rgb(167, 193, 31, noise=4.0).astype(np.int32)
    k = np.broadcast_to((np.arange(193) * 90 // 192)[None, :], (167, 193))
    cmyk = np.clip(np.dstack([255 - rgbc - k[..., None] // 2, k]), 0, 255).astype(np.uint8)
    Image.frombytes("CMYK", (193, 167), cmyk.tobytes()).save(IMAGES / "cmyk_q85.jpg", quality=85)
    specs["cmyk_q85.jpg"] = ("CMYK", (193, 167))

    # Every EXIF orientation but 1, on one small 4:2:0 image (61 x 37 stored).
    base = synth_rgb(37, 61, 32, noise=4.0)
    for o in range(2, 9):
        exif = Image.Exif()
        exif[0x0112] = o
        name = f"exif{o}.jpg"
        Image.fromarray(base, "RGB").save(IMAGES / name, quality=88, exif=exif.tobytes())
        specs[name] = ("RGB", (61, 37))

    whole = (IMAGES / "q75_420.jpg").read_bytes()
    (IMAGES / TRUNCATED).write_bytes(whole[: len(whole) * 2 // 3])
    try:
        with Image.open(IMAGES / TRUNCATED) as im:
            im.load()
        raise AssertionError("Pillow decoded the truncated JPEG")
    except OSError as e:
        assert "truncated" in str(e), e

    for name, (mode, size) in specs.items():
        with Image.open(IMAGES / name) as im:
            assert (im.mode, im.size) == (mode, size), (name, im.mode, im.size)
            if name.startswith("exif"):
                upright = ImageOps.exif_transpose(im).size
                assert upright == (size if int(name[4]) < 5 else size[::-1]), (name, upright)
    rows = make_preprocess(IMAGES, PRE, specs, pil_levels=False)
    options = {name: opts for name, (_, _, opts) in COLOUR.items()}
    options["gray_prog_q80.jpg"] = dict(quality=80, progressive=True)
    options["cmyk_q85.jpg"] = dict(quality=85)
    L = [
        "# JPEG goldens",
        "",
        "Written by `python/golden/make_golden_jpeg.py` with Pillow "
        f"{PIL.__version__} (libjpeg-turbo {PIL.features.version('libjpeg_turbo')}). "
        "`images-jpeg/` holds the JPEGs, `preprocess-jpeg/` what transformers' `load_image` path gives "
        "for each (`rgb`: upright decoded RGB; `levels`, `grid_thw`: `Qwen2VLImageProcessor`, torchvision "
        "backend). `truncated.jpg` is the first two thirds of `q75_420.jpg`; Pillow refuses it.",
        "",
        "| image | mode | stored WxH | upright WxH | grid h x w | Pillow save options |",
        "|---|---|---|---|---|---|",
    ]
    for r in rows:
        opts = options.get(r["name"], dict(quality=88, exif=f"Orientation {r['name'][4:5]}"))
        L.append(f"| {r['name']} | {r['mode']} | {r['size'][0]}x{r['size'][1]} | "
                 f"{r['rgb_hw'][1]}x{r['rgb_hw'][0]} | {r['grid'][0]} x {r['grid'][1]} | "
                 + ", ".join(f"{k}={v}" for k, v in opts.items()) + " |")
    (GOLDEN / "README-jpeg.md").write_text("\n".join(L) + "\n")
    total = sum(p.stat().st_size for d in (IMAGES, PRE) for p in d.iterdir())
    print(f"done: {len(rows)} cases, {total / 1e6:.2f} MB")


if __name__ == "__main__":
    main()
