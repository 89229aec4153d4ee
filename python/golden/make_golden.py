#!/usr/bin/env python3
"""Regenerate every golden file under golden/ (deterministic, seed 0).

Run with the developer venv (torch, transformers 5, torchvision, pillow):

    .venv-dev/bin/python python/golden/make_golden.py

It deletes and rewrites golden/images, golden/preprocess, golden/models and
golden/tower, and rewrites golden/README.md (including the measured
torchvision-vs-PIL table). Nothing is downloaded: models are built from configs.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import platform
import shutil
import struct
import sys
import zlib
from pathlib import Path

import numpy as np
import PIL
import torch
import transformers
from PIL import Image, ImageDraw, ImageOps
from safetensors import safe_open
from transformers import Qwen3VLConfig, Qwen3VLForConditionalGeneration
from transformers.image_transforms import convert_to_rgb
from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil
from transformers.models.qwen2_vl.image_processing_qwen2_vl import Qwen2VLImageProcessor, smart_resize

SEED = 0
ROOT = Path(__file__).resolve().parents[2]
GOLDEN = ROOT / "golden"

PATCH = 16
TEMPORAL = 2
MERGE = 2
MEAN = [0.5, 0.5, 0.5]
STD = [0.5, 0.5, 0.5]
MIN_PIXELS = 65536
MAX_PIXELS = 16777216
ROW = 3 * PATCH * PATCH  # one temporal frame of a patch row: (c, py, px)

# The real Qwen3-VL preprocessor_config.json (what the checkpoints ship with).
PREPROCESSOR_CONFIG = {
    "patch_size": PATCH,
    "temporal_patch_size": TEMPORAL,
    "merge_size": MERGE,
    "image_mean": MEAN,
    "image_std": STD,
    "size": {"shortest_edge": MIN_PIXELS, "longest_edge": MAX_PIXELS},
    "resample": 3,
    "do_rescale": True,
    "rescale_factor": 1 / 255,
    "do_normalize": True,
    "do_convert_rgb": True,
    "image_processor_type": "Qwen2VLImageProcessorFast",
}

PROCESSOR_KWARGS = dict(
    patch_size=PATCH,
    temporal_patch_size=TEMPORAL,
    merge_size=MERGE,
    image_mean=MEAN,
    image_std=STD,
    size={"shortest_edge": MIN_PIXELS, "longest_edge": MAX_PIXELS},
    resample=3,
    do_rescale=True,
    rescale_factor=1 / 255,
    do_normalize=True,
    do_convert_rgb=True,
)

MAX_FILE_BYTES = 8 * 1024 * 1024
MAX_TOTAL_BYTES = 25 * 1024 * 1024


_ST_DTYPES = {torch.float32: "F32", torch.float16: "F16", torch.bfloat16: "BF16", torch.int64: "I64",
              torch.int32: "I32", torch.uint8: "U8", torch.float64: "F64"}


def save_file(tensors: dict[str, torch.Tensor], path: Path, metadata: dict[str, str] | None = None) -> None:
    """Byte-deterministic safetensors writer (the library's writer orders `__metadata__` by a
    randomly seeded hash map, so its files differ from run to run). Keys sorted, header padded
    with spaces to a multiple of 8, tensors little-endian and contiguous in key order."""
    header: dict = {}
    if metadata:
        header["__metadata__"] = {k: str(metadata[k]) for k in sorted(metadata)}
    blobs, off = [], 0
    for k in sorted(tensors):
        t = tensors[k].detach().cpu().contiguous()
        b = t.view(torch.uint8).numpy().tobytes() if t.numel() else b""
        header[k] = {"dtype": _ST_DTYPES[t.dtype], "shape": list(t.shape), "data_offsets": [off, off + len(b)]}
        blobs.append(b)
        off += len(b)
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * (-len(h) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)))
        f.write(h)
        for b in blobs:
            f.write(b)


# --------------------------------------------------------------------------
# 1. synthetic images
# --------------------------------------------------------------------------


def synth_rgb(h: int, w: int, seed: int, noise: float = 2.0) -> np.ndarray:
    """Smooth gradients + a few hard-edged shapes + fine stripes + mild noise, uint8 [h, w, 3]."""
    rng = np.random.default_rng([SEED, seed])
    yy, xx = np.mgrid[0:h, 0:w].astype(np.float64)
    y = yy / max(h - 1, 1)
    x = xx / max(w - 1, 1)
    ph = rng.uniform(0, 2 * np.pi, 3)
    r = 128 + 90 * np.sin(2 * np.pi * (0.9 * x + 0.35 * y) + ph[0])
    g = 40 + 180 * y * (0.6 + 0.4 * x)
    b = 128 + 100 * np.cos(2 * np.pi * (0.5 * x - 0.8 * y) + ph[1])
    img = np.stack([r, g, b], -1)

    # fine horizontal stripes in one band (exercises the antialiasing filter)
    band = (y > 0.62) & (y < 0.78) & (x > 0.05) & (x < 0.45)
    stripes = ((yy.astype(int) // 1) % 2) * 120.0 - 60.0
    img[band] += stripes[band][:, None]

    pil = Image.fromarray(np.clip(img, 0, 255).round().astype(np.uint8), "RGB")
    d = ImageDraw.Draw(pil)
    s = min(h, w)
    # filled circle, hard-edged rectangle, diagonal lines, an "L" marker at the top-left (shows orientation)
    cx, cy = int(w * 0.68), int(h * 0.38)
    rad = max(2, int(s * 0.22))
    d.ellipse([cx - rad, cy - rad, cx + rad, cy + rad], fill=(240, 200, 30))
    d.rectangle([int(w * 0.1), int(h * 0.15), int(w * 0.35), int(h * 0.45)], fill=(20, 30, 160))
    lw = max(1, s // 60)
    for k in range(4):
        off = int(w * (0.1 + 0.2 * k))
        d.line([(off, h - 1), (off + int(h * 0.5), int(h * 0.5))], fill=(255, 255, 255), width=lw)
    mk = max(2, s // 8)
    d.rectangle([0, 0, max(1, mk // 4), mk], fill=(255, 0, 0))
    d.rectangle([0, 0, mk, max(1, mk // 4)], fill=(255, 0, 0))
    out = np.asarray(pil).astype(np.float64)
    out += rng.normal(0.0, noise, out.shape)
    return np.clip(out, 0, 255).round().astype(np.uint8)


def write_png_rgb16(path: Path, arr: np.ndarray) -> None:
    """Minimal PNG encoder: 16-bit-per-channel RGB (colour type 2, bit depth 16), no filter."""
    assert arr.dtype == np.uint16 and arr.ndim == 3 and arr.shape[2] == 3
    h, w, _ = arr.shape
    raw = b"".join(b"\x00" + arr[yy].astype(">u2").tobytes() for yy in range(h))

    def chunk(tag: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + tag + data + struct.pack(">I", zlib.crc32(tag + data) & 0xFFFFFFFF)

    ihdr = struct.pack(">IIBBBBB", w, h, 16, 2, 0, 0, 0)
    path.write_bytes(
        b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", zlib.compress(raw, 9)) + chunk(b"IEND", b"")
    )


# name -> (expected mode after PIL.Image.open, expected (w, h) as stored)
IMAGE_SPECS: dict[str, tuple[str, tuple[int, int]]] = {
    "square.png": ("RGB", (300, 300)),
    "wide.jpg": ("RGB", (640, 240)),
    "tall.png": ("RGB", (180, 500)),
    "tiny.png": ("RGB", (20, 12)),
    "large.jpg": ("RGB", (1030, 1010)),
    "extreme.png": ("RGB", (3200, 20)),
    "gray.jpg": ("L", (256, 200)),
    "gray16.png": ("I;16", (160, 120)),
    "rgb16.png": ("RGB", (120, 90)),  # PIL decodes 16-bit RGB PNGs to 8-bit RGB (rawmode RGB;16B)
    "rgba.png": ("RGBA", (200, 150)),
    "la.png": ("LA", (100, 80)),
    "palette.png": ("P", (160, 100)),
    "cmyk.jpg": ("CMYK", (128, 96)),
    "exif_rot.jpg": ("RGB", (240, 160)),
    "lossless.webp": ("RGB", (200, 120)),
    "lossy.webp": ("RGB", (200, 120)),
}


def make_images(d: Path) -> None:
    d.mkdir(parents=True)
    Image.fromarray(synth_rgb(300, 300, 1), "RGB").save(d / "square.png", optimize=True)
    Image.fromarray(synth_rgb(240, 640, 2), "RGB").save(d / "wide.jpg", quality=90)
    Image.fromarray(synth_rgb(500, 180, 3), "RGB").save(d / "tall.png", optimize=True)
    Image.fromarray(synth_rgb(12, 20, 4, noise=6.0), "RGB").save(d / "tiny.png")
    Image.fromarray(synth_rgb(1010, 1030, 5, noise=1.5), "RGB").save(d / "large.jpg", quality=85)
    Image.fromarray(synth_rgb(20, 3200, 6), "RGB").save(d / "extreme.png", optimize=True)

    gray = synth_rgb(200, 256, 7).astype(np.float64) @ np.array([0.299, 0.587, 0.114])
    Image.fromarray(np.clip(gray, 0, 255).round().astype(np.uint8), "L").save(d / "gray.jpg", quality=90)

    # 16-bit grayscale: full-range gradient on top, a region of values < 256 bottom-left,
    # and a region straddling 255 bottom-right (PIL clips I;16 -> 8 bit, it does not scale).
    h, w = 120, 160
    yy, xx = np.mgrid[0:h, 0:w]
    g16 = (xx / (w - 1) * 65535.0 * (0.5 + 0.5 * yy / (h - 1)))
    low = (yy >= 60) & (xx < 80)
    g16[low] = ((xx[low] * 3 + (yy[low] - 60) * 2) % 256)
    straddle = (yy >= 60) & (xx >= 80)
    g16[straddle] = 150 + (xx[straddle] - 80) * 2.6 + ((yy[straddle] // 8) % 2) * 40
    g16[0, 0], g16[0, 1] = 0, 65535
    g16 = np.clip(g16, 0, 65535).round().astype(np.uint16)
    Image.fromarray(g16).save(d / "gray16.png")  # numpy uint16 2-D -> PIL mode I;16

    base = synth_rgb(90, 120, 8).astype(np.uint16)
    rng = np.random.default_rng([SEED, 9])
    rgb16 = base * 257 + rng.integers(-128, 128, base.shape)  # low byte varies: truncation != rounding
    write_png_rgb16(d / "rgb16.png", np.clip(rgb16, 0, 65535).astype(np.uint16))

    rgb = synth_rgb(150, 200, 10)
    yy, xx = np.mgrid[0:150, 0:200]
    alpha = (xx * 255 // 199).astype(np.uint8)  # 0..255 left to right
    alpha[:20, :] = 0  # a fully transparent band (colour underneath must not leak)
    alpha[-20:, :] = 255
    Image.fromarray(np.dstack([rgb, alpha]), "RGBA").save(d / "rgba.png")

    yy, xx = np.mgrid[0:80, 0:100]
    lum = ((xx * 2.5 + yy) % 256).astype(np.uint8)
    la_alpha = (yy * 255 // 79).astype(np.uint8)
    Image.frombytes("LA", (100, 80), np.dstack([lum, la_alpha]).tobytes()).save(d / "la.png")

    # palette image: 16 colours, index 0 transparent
    yy, xx = np.mgrid[0:100, 0:160]
    idx = ((xx // 20) + 8 * (yy // 50)).astype(np.uint8) % 16
    idx[(xx - 110) ** 2 + (yy - 40) ** 2 < 25**2] = 0
    pal = []
    for k in range(16):
        pal += [(37 * k + 11) % 256, (91 * k + 50) % 256, (53 * k + 200) % 256]
    pim = Image.frombytes("P", (160, 100), idx.tobytes())
    pim.putpalette(pal + [0] * (768 - len(pal)))
    pim.save(d / "palette.png", transparency=0)

    rgbc = synth_rgb(96, 128, 11).astype(np.int32)
    yy, xx = np.mgrid[0:96, 0:128]
    k = (xx * 120 // 127).astype(np.int32)
    cmyk = np.dstack([255 - rgbc[..., 0], 255 - rgbc[..., 1], 255 - rgbc[..., 2], k])
    cmyk = np.clip(cmyk - k[..., None] // 2 * np.array([1, 1, 1, 0]), 0, 255).astype(np.uint8)
    Image.frombytes("CMYK", (128, 96), cmyk.tobytes()).save(d / "cmyk.jpg", quality=90)

    exif = Image.Exif()
    exif[0x0112] = 6  # Orientation: rotate 90 CW to display
    Image.fromarray(synth_rgb(160, 240, 12), "RGB").save(d / "exif_rot.jpg", quality=90, exif=exif.tobytes())

    Image.fromarray(synth_rgb(120, 200, 13), "RGB").save(d / "lossless.webp", lossless=True)
    Image.fromarray(synth_rgb(120, 200, 14), "RGB").save(d / "lossy.webp", quality=80)

    for name, (mode, size) in IMAGE_SPECS.items():
        with Image.open(d / name) as im:
            assert im.mode == mode, (name, im.mode, mode)
            assert im.size == size, (name, im.size, size)
    with Image.open(d / "palette.png") as im:
        assert im.info.get("transparency") == 0
    with Image.open(d / "exif_rot.jpg") as im:
        assert im.getexif().get(0x0112) == 6
        assert ImageOps.exif_transpose(im).size == (160, 240)
    with Image.open(d / "rgb16.png") as im:
        assert im.tile[0].args == "RGB;16B", im.tile
    with Image.open(d / "gray16.png") as im:
        a = np.asarray(im)
        assert a.dtype.kind == "u" and a.min() == 0 and a.max() == 65535 and (a < 256).sum() > 1000


# --------------------------------------------------------------------------
# 2. preprocessing goldens
# --------------------------------------------------------------------------


def levels_from_pixel_values(pv: torch.Tensor, what: str) -> np.ndarray:
    """pixel_values [n, 3*2*16*16] (c, t, py, px) -> uint8 levels [n, 3*16*16] (c, py, px), exact."""
    pv = pv.detach().to(torch.float32).cpu()
    n = pv.shape[0]
    v = pv.reshape(n, 3, TEMPORAL, PATCH, PATCH)
    assert torch.equal(v[:, :, 0], v[:, :, 1]), f"{what}: temporal frames differ"
    f0 = v[:, :, 0].reshape(n, ROW).numpy().astype(np.float64)
    lv = np.rint((f0 * 0.5 + 0.5) * 255.0)
    assert lv.min() >= 0 and lv.max() <= 255, what
    levels = lv.astype(np.uint8)
    back64 = (levels.astype(np.float64) / 255.0 - 0.5) / 0.5
    err64 = np.abs(f0 - back64).max()
    back32 = reconstruct_frame(torch.from_numpy(levels)).numpy()
    err32 = np.abs(v[:, :, 0].reshape(n, ROW).numpy() - back32).max()
    assert err64 < 1e-5 and err32 < 1e-5, (what, err64, err32)
    return levels


def reconstruct_frame(levels: torch.Tensor) -> torch.Tensor:
    """The exact fp32 formula the tower goldens use: x = levels/255; x = (x - 0.5)/0.5."""
    x = levels.to(torch.float32) / 255.0
    return (x - 0.5) / 0.5


def pixel_values_from_levels(levels: torch.Tensor) -> torch.Tensor:
    """uint8 [n, 768] (c, py, px) -> f32 [n, 1536] (c, t, py, px), t = 2 duplicated frames."""
    x = reconstruct_frame(levels)
    n = x.shape[0]
    x = x.reshape(n, 3, 1, PATCH, PATCH).repeat(1, 1, TEMPORAL, 1, 1)
    return x.reshape(n, 3 * TEMPORAL * PATCH * PATCH).contiguous()


def make_preprocess(img_dir: Path, out_dir: Path, specs: dict | None = None, pil_levels: bool = True) -> list[dict]:
    """transformers' preprocessing of each image in `specs` (default IMAGE_SPECS), one file each;
    `levels_pil` (the PIL backend's levels) only with `pil_levels`."""
    specs = IMAGE_SPECS if specs is None else specs
    out_dir.mkdir(parents=True)
    tv = Qwen2VLImageProcessor(**PROCESSOR_KWARGS)
    pilp = Qwen2VLImageProcessorPil(**PROCESSOR_KWARGS)
    rows = []
    for name, (mode, size) in specs.items():
        stem = Path(name).stem
        with Image.open(img_dir / name) as opened:
            img = ImageOps.exif_transpose(opened)  # what transformers' load_image does
            img.load()
            rgb = convert_to_rgb(img, return_numpy=True)
            load_image_rgb = np.asarray(img.convert("RGB"))  # load_image() path: alpha dropped, no compositing
            out_tv = tv(images=img, return_tensors="pt")
            out_pil = pilp(images=img, return_tensors="pt")
        assert rgb.dtype == np.uint8 and rgb.ndim == 3 and rgb.shape[2] == 3
        grid = out_tv["image_grid_thw"].to(torch.int64)
        grid_pil = torch.as_tensor(out_pil["image_grid_thw"]).to(torch.int64)
        assert torch.equal(grid, grid_pil), (name, grid, grid_pil)
        t, gh, gw = grid[0].tolist()
        assert t == 1
        rh, rw = smart_resize(rgb.shape[0], rgb.shape[1], PATCH * MERGE, MIN_PIXELS, MAX_PIXELS)
        assert (rh, rw) == (gh * PATCH, gw * PATCH), (name, rh, rw, gh, gw)
        n = gh * gw
        assert out_tv["pixel_values"].shape == (n, 3 * TEMPORAL * PATCH * PATCH)
        lv = levels_from_pixel_values(out_tv["pixel_values"], f"{name} torchvision")
        lv_pil = levels_from_pixel_values(torch.as_tensor(out_pil["pixel_values"]), f"{name} pil")
        if name == "large.jpg":
            assert (gh, gw) == (64, 64) and n == 4096, (gh, gw)
        tensors = {
            "levels": torch.from_numpy(lv),
            "grid_thw": grid.clone(),
        }
        if pil_levels:
            tensors["levels_pil"] = torch.from_numpy(lv_pil)
        diff = np.abs(lv.astype(np.int16) - lv_pil.astype(np.int16))
        # keep `rgb` unless it pushes the file past the per-file budget
        est = lv.nbytes + lv_pil.nbytes + rgb.nbytes + 4096
        has_rgb = est < MAX_FILE_BYTES
        if has_rgb:
            tensors["rgb"] = torch.from_numpy(np.ascontiguousarray(rgb))
        meta = {
            "image": name,
            "mode": mode,
            "size_wh": f"{size[0]},{size[1]}",
            "rgb_hw": f"{rgb.shape[0]},{rgb.shape[1]}",
            "resized_hw": f"{rh},{rw}",
            "has_rgb": str(has_rgb).lower(),
        }
        save_file(tensors, out_dir / f"{stem}.safetensors", metadata=meta)
        rows.append(
            dict(
                name=name,
                mode=mode,
                size=size,
                rgb_hw=(rgb.shape[0], rgb.shape[1]),
                resized_hw=(rh, rw),
                grid=(gh, gw),
                n=n,
                n_diff=int((diff > 0).sum()),
                total=int(diff.size),
                max_diff=int(diff.max()),
                rgb_vs_convert=int((load_image_rgb != rgb).any(-1).sum()),
                has_rgb=has_rgb,
            )
        )
        print(f"  preprocess {name:14s} {mode:5s} -> {rw}x{rh} n={n:5d} tv!=pil {rows[-1]['n_diff']} (max {rows[-1]['max_diff']})")
    return rows


def _white_composite(c: np.ndarray, a: np.ndarray) -> np.ndarray:
    c = c.astype(np.int64)
    a = a.astype(np.int64)
    return np.floor((c * a + 255 * (255 - a)) / 255 + 0.5).astype(np.uint8)


def verify_pil_conversions(img_dir: Path) -> None:
    """Assert the PIL -> RGB rules documented in the README, on the golden images themselves."""

    def rgb_of(name):
        with Image.open(img_dir / name) as im:
            return convert_to_rgb(ImageOps.exif_transpose(im), return_numpy=True)

    def raw_of(name):
        with Image.open(img_dir / name) as im:
            return np.asarray(im)

    # alpha compositing on white, exhaustive over (c, a)
    c, a = np.meshgrid(np.arange(256), np.arange(256), indexing="ij")
    im = Image.frombytes("RGBA", (256, 256), np.stack([c, c, c, a], -1).astype(np.uint8).tobytes())
    got = convert_to_rgb(im, return_numpy=True)[..., 0]
    assert np.array_equal(got, _white_composite(c, a)), "alpha compositing rule"
    # CMYK -> RGB, exhaustive over (C, K)
    im = Image.frombytes("CMYK", (256, 256), np.stack([c, c * 0, c * 0, a], -1).astype(np.uint8).tobytes())
    got = np.asarray(im.convert("RGB")).astype(np.int64)
    assert np.array_equal(got[..., 0], np.floor((255 - c) * (255 - a) / 255 + 0.5)), "CMYK rule"

    g16 = raw_of("gray16.png").astype(np.int64)
    assert np.array_equal(rgb_of("gray16.png"), np.repeat(np.minimum(g16, 255)[..., None], 3, -1).astype(np.uint8))
    # 16-bit RGB: decode the PNG ourselves (one IDAT, filter 0 rows) and keep the high byte
    data = (img_dir / "rgb16.png").read_bytes()
    w, h = struct.unpack(">II", data[16:24])
    idat = data[data.index(b"IDAT") + 4:data.index(b"IEND") - 8]
    rows = np.frombuffer(zlib.decompress(idat), np.uint8).reshape(h, 1 + w * 6)
    assert (rows[:, 0] == 0).all()
    v16 = rows[:, 1:].copy().view(">u2").reshape(h, w, 3).astype(np.int64)
    assert np.array_equal(rgb_of("rgb16.png"), (v16 >> 8).astype(np.uint8)), "16-bit RGB rule"
    cm = raw_of("cmyk.jpg").astype(np.int64)
    exp = np.floor((255 - cm[..., :3]) * (255 - cm[..., 3:]) / 255 + 0.5).astype(np.uint8)
    assert np.array_equal(rgb_of("cmyk.jpg"), exp), "CMYK golden"
    ra = raw_of("rgba.png")
    assert np.array_equal(rgb_of("rgba.png"), _white_composite(ra[..., :3], ra[..., 3:]))
    la = raw_of("la.png")
    assert np.array_equal(rgb_of("la.png"), np.repeat(_white_composite(la[..., :1], la[..., 1:]), 3, -1))
    with Image.open(img_dir / "palette.png") as im:
        idx = np.asarray(im)
        pal = np.array(im.getpalette()[:768], np.uint8).reshape(-1, 3)
        alpha = np.where(idx == im.info["transparency"], 0, 255)
    assert np.array_equal(rgb_of("palette.png"), _white_composite(pal[idx], alpha[..., None]))
    gr = raw_of("gray.jpg")
    assert np.array_equal(rgb_of("gray.jpg"), np.repeat(gr[..., None], 3, -1))
    ex = raw_of("exif_rot.jpg")
    assert np.array_equal(rgb_of("exif_rot.jpg"), np.rot90(ex, k=-1)), "EXIF 6 = rotate 90 clockwise"


# --------------------------------------------------------------------------
# 3. tiny checkpoints
# --------------------------------------------------------------------------

TEXT_CONFIG = dict(
    vocab_size=512,
    hidden_size=32,
    intermediate_size=32,
    num_hidden_layers=1,
    num_attention_heads=2,
    num_key_value_heads=2,
    head_dim=16,
    rope_parameters={"rope_type": "default", "rope_theta": 5000000.0, "mrope_section": [4, 2, 2], "mrope_interleaved": True},
)
TOKEN_IDS = dict(image_token_id=500, video_token_id=501, vision_start_token_id=502, vision_end_token_id=503)

MODELS = {
    "tiny-a": dict(
        dtype=torch.float32,
        seed=0,
        vision=dict(depth=4, hidden_size=72, num_heads=6, intermediate_size=100, out_hidden_size=56,
                    deepstack_visual_indexes=[0, 2], num_position_embeddings=256),
    ),
    "tiny-b": dict(
        dtype=torch.bfloat16,
        seed=1,
        vision=dict(depth=3, hidden_size=48, num_heads=2, intermediate_size=80, out_hidden_size=40,
                    deepstack_visual_indexes=[1], num_position_embeddings=2304),
    ),
    "tiny-c": dict(
        dtype=torch.float16,
        seed=2,
        vision=dict(depth=3, hidden_size=64, num_heads=4, intermediate_size=96, out_hidden_size=24,
                    deepstack_visual_indexes=[0, 1, 2], num_position_embeddings=576),
    ),
}
VISION_COMMON = dict(patch_size=PATCH, temporal_patch_size=TEMPORAL, spatial_merge_size=MERGE, in_channels=3,
                     hidden_act="gelu_pytorch_tanh")


def randomise_vision(visual: torch.nn.Module, seed: int) -> None:
    """Every vision parameter gets a seeded random value; none is trivially 0 or 1."""
    g = torch.Generator().manual_seed(SEED * 1000 + seed)
    with torch.no_grad():
        for name, p in visual.named_parameters():
            shape = p.shape
            is_norm = ".norm" in name or name.startswith("norm")
            if is_norm and name.endswith("weight"):
                v = 1.0 + 0.1 * torch.randn(shape, generator=g)
            elif is_norm and name.endswith("bias"):
                v = 0.1 * torch.randn(shape, generator=g)
            elif name == "pos_embed.weight":
                # larger than the other weights so errors in the interpolation are clearly visible
                v = 0.5 * torch.randn(shape, generator=g)
            elif name.endswith("bias"):
                v = 0.05 * torch.randn(shape, generator=g)
            elif name.startswith("patch_embed"):
                v = 0.05 * torch.randn(shape, generator=g)
            else:  # linear weights: std between 0.05 and 0.1, larger for narrow layers
                std = min(0.1, max(0.05, 1.0 / math.sqrt(shape[1])))
                v = std * torch.randn(shape, generator=g)
            p.copy_(v.to(p.dtype))
            assert not torch.any(p == 0) or p.numel() > 10000, name


def make_models(out_dir: Path) -> dict[str, dict]:
    out_dir.mkdir(parents=True)
    info = {}
    for mname, spec in MODELS.items():
        torch.manual_seed(SEED)
        vc = dict(VISION_COMMON, **spec["vision"])
        cfg = Qwen3VLConfig(vision_config=vc, text_config=dict(TEXT_CONFIG), tie_word_embeddings=True, **TOKEN_IDS)
        model = Qwen3VLForConditionalGeneration(cfg).eval()
        randomise_vision(model.model.visual, spec["seed"])
        model = model.to(spec["dtype"])
        d = out_dir / mname
        model.save_pretrained(d, safe_serialization=True)
        (d / "preprocessor_config.json").write_text(json.dumps(PREPROCESSOR_CONFIG, indent=2) + "\n")
        with safe_open(d / "model.safetensors", "pt") as f:
            keys = list(f.keys())
            dtypes = {str(f.get_slice(k).get_dtype()) for k in keys}
        size = (d / "model.safetensors").stat().st_size
        info[mname] = dict(keys=keys, dtypes=sorted(dtypes), size=size, vision=vc, dtype=str(spec["dtype"]))
        print(f"  model {mname}: {len(keys)} tensors, {size/1e6:.2f} MB, dtypes {sorted(dtypes)}")
    return info


# --------------------------------------------------------------------------
# 4. tower goldens
# --------------------------------------------------------------------------

TOWER_CASES = {
    "square": ["square"],
    "wide": ["wide"],
    "tall": ["tall"],
    "multi": ["square", "tall", "tiny"],
    "large": ["large"],
}


def load_tower(model_dir: Path, attn: str = "sdpa") -> torch.nn.Module:
    model, info = Qwen3VLForConditionalGeneration.from_pretrained(
        model_dir, dtype=torch.float32, attn_implementation=attn, output_loading_info=True
    )
    bad = {k: v for k, v in info.items() if v and k in ("missing_keys", "unexpected_keys", "mismatched_keys")}
    assert not bad, bad
    visual = model.model.visual.eval()
    # the upcast must reproduce the stored (bf16/f16/f32) values exactly
    with safe_open(model_dir / "model.safetensors", "pt") as f:
        for name, p in visual.named_parameters():
            stored = f.get_tensor("model.visual." + name)
            assert p.dtype == torch.float32 and torch.equal(p, stored.to(torch.float32)), name
    return visual


def run_tower(visual, pv: torch.Tensor, grid: torch.Tensor):
    with torch.no_grad():
        out = visual(pv, grid_thw=grid)
    return out.pooler_output, list(out.deepstack_features)


def make_tower(pre_dir: Path, model_dir: Path, out_dir: Path) -> list[dict]:
    out_dir.mkdir(parents=True)
    rows = []
    levels = {}
    for f in pre_dir.glob("*.safetensors"):
        with safe_open(f, "pt") as s:
            levels[f.stem] = (s.get_tensor("levels"), s.get_tensor("grid_thw"))
    for mname, spec in MODELS.items():
        (out_dir / mname).mkdir()
        visual = load_tower(model_dir / mname, "sdpa")
        visual_eager = load_tower(model_dir / mname, "eager")
        visual64 = load_tower(model_dir / mname, "sdpa").double()
        n_ds = len(spec["vision"]["deepstack_visual_indexes"])
        out_w = spec["vision"]["out_hidden_size"]
        for case, stems in TOWER_CASES.items():
            if case == "large" and mname != "tiny-a":
                continue
            pv = torch.cat([pixel_values_from_levels(levels[s][0]) for s in stems])
            grid = torch.cat([levels[s][1] for s in stems]).to(torch.int64)
            n = pv.shape[0]
            assert n == int(grid.prod(-1).sum())
            emb, ds = run_tower(visual, pv, grid)
            assert emb.dtype == torch.float32 and emb.shape == (n // 4, out_w)
            assert len(ds) == n_ds and all(x.shape == (n // 4, out_w) for x in ds)
            tensors = {"embeds": emb.contiguous(), "grid_thw": grid.contiguous()}
            for i, x in enumerate(ds):
                tensors[f"deepstack.{i}"] = x.contiguous()
            save_file(tensors, out_dir / mname / f"{case}.safetensors",
                      metadata={"images": ",".join(stems), "model": mname})
            # noise floors: eager attention, and an fp64 run of the same weights
            emb_e, ds_e = run_tower(visual_eager, pv, grid)
            emb_d, ds_d = run_tower(visual64, pv.double(), grid)
            all32 = [emb] + ds
            d_eager = max(float((a - b).abs().max()) for a, b in zip(all32, [emb_e] + ds_e))
            d_64 = max(float((a.double() - b).abs().max()) for a, b in zip(all32, [emb_d] + ds_d))
            scale = max(float(a.abs().max()) for a in all32)
            d_sep = None
            if len(stems) > 1:  # one call with k images == k separate calls, row for row
                sep = [run_tower(visual, pixel_values_from_levels(levels[s][0]), levels[s][1]) for s in stems]
                sep_all = [torch.cat([e for e, _ in sep])] + [torch.cat([d[i] for _, d in sep]) for i in range(n_ds)]
                d_sep = max(float((a - b).abs().max()) for a, b in zip(all32, sep_all))
                assert d_sep < 1e-5, d_sep
            rows.append(dict(model=mname, case=case, images=",".join(stems), n=n, out=out_w, n_ds=n_ds,
                             scale=scale, d_eager=d_eager, d_64=d_64, d_sep=d_sep))
            print(f"  tower {mname} {case:6s} n={n:5d} max|out|={scale:.3f} sdpa-eager={d_eager:.2e} fp32-fp64={d_64:.2e}")
    return rows


# --------------------------------------------------------------------------
# 5. README
# --------------------------------------------------------------------------


def write_readme(pre_rows, model_info, tower_rows) -> None:
    L = []
    L.append("# Golden data\n")
    L.append("Generated by `python/golden/make_golden.py` (`make golden`, i.e. "
             "`.venv-dev/bin/python python/golden/make_golden.py`; needs the developer venv with torch, "
             "torchvision, transformers and pillow, CPU only, no network). Deterministic (seed 0): rerunning it "
             "rewrites `images/`, `preprocess/`, `models/`, `tower/` and this file.\n")
    L.append(f"Made with torch {torch.__version__}, torchvision {__import__('torchvision').__version__}, "
             f"transformers {transformers.__version__}, pillow {PIL.__version__}, numpy {np.__version__}, "
             f"python {platform.python_version()} on {platform.machine()}.\n")
    L.append("## Layout\n")
    L.append("- `images/`: synthetic, deterministic test images (numpy + PIL; `rgb16.png` is written by a "
             "minimal PNG encoder because PIL cannot write 16-bit RGB).")
    L.append("- `preprocess/<stem>.safetensors`: transformers' Qwen2-VL image processor output for each image, "
             "opened with `PIL.Image.open`, then `PIL.ImageOps.exif_transpose`, then the PIL object is passed to "
             "the processor (which does its own `convert_to_rgb`). Processor config = the real Qwen3-VL "
             "preprocessor config (patch 16, temporal 2, merge 2, mean = std = 0.5, min_pixels 65536, "
             "max_pixels 16777216, bicubic). Tensors:")
    L.append("  - `levels` u8 `[n, 768]`: torchvision backend (`Qwen2VLImageProcessor`, the transformers 5 "
             "default) `pixel_values` mapped back to 0..255 levels, first temporal frame only, each row "
             "ordered (c, py, px); rows in merge-block order.")
    L.append("  - `levels_pil` u8 `[n, 768]`: the same for the PIL backend (`Qwen2VLImageProcessorPil`).")
    L.append("  - `grid_thw` i64 `[1, 3]`: identical for both backends.")
    L.append("  - `rgb` u8 `[H, W, 3]`: `transformers.image_transforms.convert_to_rgb(img, return_numpy=True)` "
             "of the EXIF-transposed image, i.e. the image the processor resized (omitted when the file would "
             "exceed 8 MB: see the table).")
    L.append("  - metadata: `image`, `mode`, `size_wh`, `rgb_hw`, `resized_hw`, `has_rgb`.")
    L.append("- `models/<name>/`: tiny random Qwen3-VL checkpoints (`config.json`, `model.safetensors`, "
             "`generation_config.json`, `preprocessor_config.json`) saved by "
             "`Qwen3VLForConditionalGeneration.save_pretrained`. All vision parameters are random (seeded).")
    L.append("- `tower/<model>/<case>.safetensors`: transformers' vision tower output "
             "(`model.model.visual(pixel_values, grid_thw=grid)`) computed in fp32 (weights upcast exactly "
             "from the stored dtype), `attn_implementation=\"sdpa\"`. Tensors: `embeds` f32 `[n/4, out]` "
             "(`pooler_output`, the merger output), `deepstack.{i}` f32 `[n/4, out]`, `grid_thw` i64 `[k, 3]`; "
             "metadata `images` = comma-separated preprocess stems in order (one call, rows concatenated), "
             "`model`.\n")
    L.append("## Pixel values fed to the tower\n")
    L.append("Reconstructed from `preprocess/<stem>.safetensors:levels` (torchvision backend) in float32, exactly:\n")
    L.append("```python")
    L.append("x = levels.to(torch.float32) / 255.0          # [n, 768], (c, py, px)")
    L.append("x = (x - 0.5) / 0.5")
    L.append("x = x.reshape(n, 3, 1, 16, 16).repeat(1, 1, 2, 1, 1).reshape(n, 1536)  # (c, t, py, px), t duplicated")
    L.append("```\n")
    L.append("The processor's own `pixel_values` equal this to within 1e-5 (asserted; the torchvision backend "
             "computes `(v - 127.5) / 127.5`). Several images in one call: rows concatenated in `images` order, "
             "`grid_thw` stacked.\n")
    L.append("## Preprocess images\n")
    L.append("`tv != pil` counts the u8 levels (out of n*768) where the torchvision and PIL backends disagree. "
             "`convert('RGB') differs` counts pixels where `img.convert(\"RGB\")` (what `transformers.load_image` "
             "does) differs from `convert_to_rgb` (white compositing of transparency).\n")
    L.append("| image | mode | original WxH | upright WxH | resized WxH | grid h x w | n patches | tv != pil (count / total) | max abs diff | convert('RGB') differs | rgb stored |")
    L.append("|---|---|---|---|---|---|---|---|---|---|---|")
    for r in pre_rows:
        pct = 100.0 * r["n_diff"] / r["total"]
        L.append(f"| {r['name']} | {r['mode']} | {r['size'][0]}x{r['size'][1]} | {r['rgb_hw'][1]}x{r['rgb_hw'][0]} | "
                 f"{r['resized_hw'][1]}x{r['resized_hw'][0]} | {r['grid'][0]} x {r['grid'][1]} | {r['n']} | "
                 f"{r['n_diff']} / {r['total']} ({pct:.2f}%) | {r['max_diff']} | {r['rgb_vs_convert']} | "
                 f"{'yes' if r['has_rgb'] else 'no (too large)'} |")
    L.append("")
    L.append("How PIL turns the special modes into RGB (each rule is asserted by make_golden.py on these images):\n")
    L.append("- `I;16` (16-bit gray PNG): `convert(\"RGB\")` clips, `min(v, 255)`; it does not scale by 1/257.")
    L.append("- 16-bit RGB PNG: PIL decodes it as mode `RGB` with rawmode `RGB;16B`, keeping the high byte "
             "(`v >> 8`, truncation, not rounding).")
    L.append("- `CMYK` JPEG (Adobe, inverted on disk, PIL undoes it): `R = round((255-C)(255-K)/255)`, same for G/B with M/Y.")
    L.append("- `RGBA`/`LA`/`P` with transparency: `convert_to_rgb` composites on white: "
             "`round((c*a + 255*(255-a)) / 255)` (exact for all 65536 (c, a) pairs); `LA` replicates L; `P` "
             "looks up the palette, the transparent index has a = 0.")
    L.append("- EXIF orientation 6: `exif_transpose` rotates 90 degrees clockwise (240x160 stored -> 160x240 upright).\n")
    L.append("## transformers 5.23 details that matter when reimplementing the tower\n")
    L.append("- Position-table interpolation (`vision_utils.get_vision_interpolation_indices_and_weights`, "
             "bilinear, align_corners): `src = float32(i) * (S-1) / (size-1)` in fp32 (a closed form, not "
             "`torch.linspace`, which differs from it by 1 ulp at about 18% of positions), `y0 = floor(src)`, "
             "taps `y0` and `min(y0+1, S-1)` with weights `1 - |src - y0|` and `1 - |src - y0 - 1|`; the 2-D "
             "weights are the fp32 products `wy * wx`, the 4 taps summed in the order (y0,x0), (y0,x1), (y1,x0), "
             "(y1,x1); computed in merge-block order directly.")
    L.append("- `model.model.visual(pixel_values, grid_thw=grid)` returns `BaseModelOutputWithDeepstackFeatures`: "
             "`last_hidden_state` = block output before the merger `[n, D]`, `pooler_output` = merger output "
             "`[n/4, out]` (stored here as `embeds`), `deepstack_features` = list of `[n/4, out]` (stored as "
             "`deepstack.{i}`).")
    L.append("- With sdpa (or eager) attention each image is attended separately (`cu_seqlens` split), so a "
             "multi-image call matches the single-image calls row for row (column `vs separate calls` below).\n")
    L.append("## Models\n")
    L.append("| name | stored dtype | depth | hidden | heads (head_dim) | intermediate | out | deepstack | pos table | file size |")
    L.append("|---|---|---|---|---|---|---|---|---|---|")
    for mname, mi in model_info.items():
        v = mi["vision"]
        side = int(round(math.sqrt(v["num_position_embeddings"])))
        L.append(f"| {mname} | {mi['dtypes']} | {v['depth']} | {v['hidden_size']} | {v['num_heads']} "
                 f"({v['hidden_size'] // v['num_heads']}) | {v['intermediate_size']} | {v['out_hidden_size']} | "
                 f"{v['deepstack_visual_indexes']} | {v['num_position_embeddings']} ({side}x{side}) | "
                 f"{mi['size'] / 1e6:.2f} MB |")
    L.append("")
    L.append("Common: patch 16, temporal 2, spatial merge 2, gelu_pytorch_tanh, vision rope theta 10000. Text "
             "model: 1 layer, hidden 32, 2 heads, intermediate 32, vocab 512, tied embeddings (no `lm_head.weight`, like Qwen3-VL-2B); image/video/vision_start/vision_end token ids "
             "500/501/502/503. Vision parameters: LayerNorm weights 1 + 0.1 N(0,1), LayerNorm biases 0.1 N(0,1), "
             "other biases 0.05 N(0,1), patch embedding 0.05 N(0,1), pos table 0.5 N(0,1), linear weights "
             "N(0, s) with s = clamp(1/sqrt(fan_in), 0.05, 0.1); then cast to the stored dtype.\n")
    L.append("Tensor keys (tiny-a; the others differ only in block / deepstack counts):\n")
    L.append("```")
    L.extend(model_info["tiny-a"]["keys"])
    L.append("```\n")
    L.append("## Tower cases\n")
    L.append("`sdpa-eager` and `fp32-fp64` are the max abs differences over embeds and all deepstack outputs "
             "between this golden and, respectively, transformers with eager attention and the same model run in "
             "float64 (rope / pos-interpolation weights still fp32 as transformers computes them): a guide to a "
             "reasonable tolerance. `vs separate calls`: max abs difference between the multi-image call and "
             "the concatenated single-image calls.\n")
    L.append("| model | case | images | n patches | out rows | deepstack | max abs value | sdpa-eager | fp32-fp64 | vs separate calls |")
    L.append("|---|---|---|---|---|---|---|---|---|---|")
    for r in tower_rows:
        sep = "-" if r["d_sep"] is None else f"{r['d_sep']:.1e}"
        L.append(f"| {r['model']} | {r['case']} | {r['images']} | {r['n']} | {r['n'] // 4} | {r['n_ds']} | "
                 f"{r['scale']:.3f} | {r['d_eager']:.1e} | {r['d_64']:.1e} | {sep} |")
    L.append("")
    L.append("## Files\n")
    L.append("| file | bytes | sha256 (first 16) |")
    L.append("|---|---|---|")
    for p in sorted(GOLDEN.rglob("*")):
        if p.is_file() and p.name != "README.md":
            h = hashlib.sha256(p.read_bytes()).hexdigest()[:16]
            L.append(f"| {p.relative_to(GOLDEN)} | {p.stat().st_size} | {h} |")
    L.append("")
    (GOLDEN / "README.md").write_text("\n".join(L))


def check_sizes() -> int:
    total = 0
    for p in GOLDEN.rglob("*"):
        if p.is_file():
            s = p.stat().st_size
            assert s < MAX_FILE_BYTES, (p, s)
            total += s
    assert total < MAX_TOTAL_BYTES, total
    return total


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.parse_args()
    torch.set_num_threads(2)
    transformers.utils.logging.disable_progress_bar()
    torch.manual_seed(SEED)
    np.random.seed(SEED)
    GOLDEN.mkdir(exist_ok=True)
    for sub in ("images", "preprocess", "models", "tower"):
        shutil.rmtree(GOLDEN / sub, ignore_errors=True)
    print("images")
    make_images(GOLDEN / "images")
    print("preprocess")
    pre_rows = make_preprocess(GOLDEN / "images", GOLDEN / "preprocess")
    verify_pil_conversions(GOLDEN / "images")
    print("models")
    model_info = make_models(GOLDEN / "models")
    print("tower")
    tower_rows = make_tower(GOLDEN / "preprocess", GOLDEN / "models", GOLDEN / "tower")
    write_readme(pre_rows, model_info, tower_rows)
    total = check_sizes()
    print(f"done: golden/ holds {total / 1e6:.2f} MB")


if __name__ == "__main__":
    sys.exit(main())
