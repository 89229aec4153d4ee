#!/usr/bin/env python3
"""Golden data of the SigLIP2 NaFlex family (deterministic, seed 0).

Run with the developer venv (torch, torchvision, transformers, pillow), no network:

    .venv-dev/bin/python python/golden/make_golden_siglip2.py

It rewrites, and touches nothing else of golden/:

- golden/models/tiny-siglip2: a tiny random `Siglip2Model` (a text tower
  too, so `model_type` `siglip2`), bf16, with the attention-pooling head:
  width 60, 3 heads of 20, MLP 90, 3 blocks, tanh GELU, patch 12, a 7 x 7
  position table (`num_patches` 49), and the processor config of the
  released NaFlex checkpoints scaled down (`Siglip2ImageProcessor`, patch
  12, `max_num_patches` 144 (its largest budget), bilinear, mean = std = 0.5).
- golden/models/tiny-siglip2-nohead: a tiny random `Siglip2VisionModel`
  (`siglip2_vision_model`) without the head, erf GELU, width 44, 4 heads
  of 11, MLP 70, 2 blocks, patch 8, a 6 x 6 table, `max_num_patches` 100;
  transformers 5 saves its tensors without the `vision_model.` prefix.
- golden/preprocess-siglip2/<stem>-<budget>.safetensors: transformers'
  SigLIP2 image processors on the lossless golden images at patch 12 and
  budgets (`max_num_patches`) 64 and 144: `tv` (the torchvision backend,
  transformers 5's default) and `pil` (`Siglip2ImageProcessorPil`), the
  real rows only, `[n, 432]` in the processor's own (py, px, c) order, and
  `spatial_shapes` `[2]` (patch rows, patch columns).
- golden/tower/<model>/<stem>-<budget>.safetensors: the outputs of the
  model reloaded from disk in fp32 (eager attention) for the torchvision
  processor's output of one image: `pixel_values` `[budget, 3 p p]` (padded
  rows too), `pixel_attention_mask` `[budget]`, `spatial_shapes` `[2]`,
  `last_hidden_state` `[n, D]` (the real rows only) and `pooler_output`
  `[1, D]` (with the head only).
- golden/pixel-values/tiny-siglip2.safetensors: transformers' own batch of
  two images (tall.png, padded, and square.png, not) at budget 64 and the
  model's outputs for it, all rows, for `ane-export reference
  --pixel-values`. The other files of golden/pixel-values are left alone.
- golden/README-siglip2.md: what was made.

It also asserts what the goldens rest on: the position table resampled as
`F.interpolate(bilinear, align_corners=False, antialias=True)` of the fp32
table, pad rows given row 0 of it; the real rows' outputs equal to a run
without padding (pad keys are masked for every query, pad queries attend
to the real keys); both processors reproduced from their definitions.
"""

from __future__ import annotations

import json
import platform
import shutil
import sys
from pathlib import Path

import numpy as np
import PIL
import torch
import torch.nn.functional as F
import torchvision
import transformers
from PIL import Image
from safetensors import safe_open
from transformers import Siglip2Config, Siglip2Model, Siglip2VisionConfig, Siglip2VisionModel
from transformers.image_transforms import convert_to_rgb
from transformers.models.siglip2.image_processing_pil_siglip2 import Siglip2ImageProcessorPil
from transformers.models.siglip2.image_processing_siglip2 import (
    Siglip2ImageProcessor,
    get_image_size_for_max_num_patches,
)

sys.path.insert(0, str(Path(__file__).resolve().parent))
from make_golden import save_file  # noqa: E402  (the byte-deterministic writer)
from make_golden_encoders import open_image, randomise  # noqa: E402  (the same images and random weights)

SEED = 0
ROOT = Path(__file__).resolve().parents[2]
GOLDEN = ROOT / "golden"
MEAN = STD = [0.5, 0.5, 0.5]

MODELS = {
    "tiny-siglip2": dict(
        cls="siglip2",
        vision=dict(hidden_size=60, intermediate_size=90, num_hidden_layers=3, num_attention_heads=3,
                    patch_size=12, num_patches=49, hidden_act="gelu_pytorch_tanh", layer_norm_eps=1e-6,
                    vision_use_head=True),
        budgets=[64, 144]),
    "tiny-siglip2-nohead": dict(
        cls="siglip2-vision",
        vision=dict(hidden_size=44, intermediate_size=70, num_hidden_layers=2, num_attention_heads=4,
                    patch_size=8, num_patches=36, hidden_act="gelu", layer_norm_eps=1e-6,
                    vision_use_head=False),
        budgets=[100]),
}
TEXT = dict(vocab_size=64, hidden_size=32, intermediate_size=40, num_hidden_layers=2, num_attention_heads=2,
            max_position_embeddings=16, pad_token_id=1, bos_token_id=2, eos_token_id=3)
# Lossless golden images: square, tall, wide, tiny (upscaled), RGBA and palette (converted to RGB).
PRE_IMAGES = ["square.png", "tall.png", "rgba.png", "tiny.png", "lossless.webp", "palette.png"]
PRE_PATCH, PRE_BUDGETS = 12, [64, 144]
TOWER_IMAGES = ["square.png", "tall.png", "palette.png", "tiny.png"]
BATCH_IMAGES, BATCH_BUDGET = ["tall.png", "square.png"], 64


def processor_config(patch: int, budget: int) -> dict:
    return {
        "do_convert_rgb": True,
        "do_normalize": True,
        "do_rescale": True,
        "do_resize": True,
        "image_mean": MEAN,
        "image_std": STD,
        "image_processor_type": "Siglip2ImageProcessor",
        "max_num_patches": budget,
        "patch_size": patch,
        "resample": 2,
        "rescale_factor": 1 / 255,
    }


def preprocess(names: list[str], patch: int, budget: int, pil: bool = False) -> dict[str, torch.Tensor]:
    """The processor's `pixel_values` [B, budget, 3 p p] f32, `pixel_attention_mask` [B, budget] i64 and
    `spatial_shapes` [B, 2] i64 (bilinear, the class default). `do_convert_rgb` as the checkpoints' config
    sets it: the classes leave it unset, and then the torchvision one fails on RGBA."""
    cls = Siglip2ImageProcessorPil if pil else Siglip2ImageProcessor
    pp = cls(patch_size=patch, max_num_patches=budget, image_mean=MEAN, image_std=STD, do_convert_rgb=True)
    o = pp(images=[open_image(n) for n in names], return_tensors="pt")
    return {"pixel_values": o["pixel_values"].to(torch.float32).contiguous(),
            "pixel_attention_mask": o["pixel_attention_mask"].to(torch.int64).contiguous(),
            "spatial_shapes": o["spatial_shapes"].to(torch.int64).contiguous()}


def check_padding(x: dict[str, torch.Tensor], i: int = 0) -> int:
    """The mask is 1 on the first n = h w rows and 0 after; the pad rows of pixel_values are 0."""
    h, w = x["spatial_shapes"][i].tolist()
    n, budget = h * w, x["pixel_values"].shape[1]
    want = torch.zeros(budget, dtype=torch.int64)
    want[:n] = 1
    assert torch.equal(x["pixel_attention_mask"][i], want), "mask is not 1 on the real rows and 0 after"
    assert not x["pixel_values"][i, n:].any(), "pad rows of pixel_values are not 0"
    return n


def patchify(img: torch.Tensor, p: int) -> torch.Tensor:
    """[3, H, W] -> [(H/p)(W/p), p p 3]: patches in raster order, each row (py, px, c)."""
    c, h, w = img.shape
    return img.reshape(c, h // p, p, w // p, p).permute(1, 3, 2, 4, 0).reshape((h // p) * (w // p), p * p * c)


def check_processors(name: str, patch: int, budget: int, tv: torch.Tensor, pil: torch.Tensor) -> None:
    """Both backends reproduced bit for bit from their definitions. Both convert to RGB with
    transformers' `convert_to_rgb` (RGBA and palette transparency composited onto white). torchvision: the uint8 image resized
    as uint8 (`F.interpolate` bilinear, antialias: ATen's fixed-point uint8 kernel, on CPUs with AVX2
    or AVX-512; elsewhere torchvision resizes in f32 and rounds), then (x - 127.5) / 127.5 in f32 (the
    fused rescale and normalise: mean and std times 255). PIL: `Image.resize` BILINEAR to uint8, then
    f32(x * (1/255) in f64), then (x - 0.5) / 0.5 in f32."""
    rgb = convert_to_rgb(open_image(name), return_numpy=True)  # transparency composited onto white
    img, (h, w) = Image.fromarray(rgb), rgb.shape[:2]
    th, tw = get_image_size_for_max_num_patches(h, w, patch, budget)
    u8 = torch.from_numpy(rgb).permute(2, 0, 1).contiguous()
    if torch.backends.cpu.get_cpu_capability() in ("AVX2", "AVX512"):
        r = F.interpolate(u8[None], size=(th, tw), mode="bilinear", align_corners=False, antialias=True)[0]
        ref_tv = (r.to(torch.float32) - 127.5) / 127.5
        assert torch.equal(patchify(ref_tv, patch), tv), f"{name}: the torchvision backend is not reproduced"
    r = np.asarray(img.resize((tw, th), Image.BILINEAR)).transpose(2, 0, 1)
    x = (r.astype(np.float64) * (1 / 255)).astype(np.float32)
    ref_pil = torch.from_numpy((x - np.float32(0.5)) / np.float32(0.5))
    assert torch.equal(patchify(ref_pil, patch), pil), f"{name}: the PIL backend is not reproduced"


def make_models() -> list[dict]:
    rows = []
    for k, (name, m) in enumerate(MODELS.items()):
        out = GOLDEN / "models" / name
        shutil.rmtree(out, ignore_errors=True)
        torch.manual_seed(SEED)
        if m["cls"] == "siglip2":
            model = Siglip2Model(Siglip2Config(vision_config=m["vision"], text_config=TEXT))
        else:
            model = Siglip2VisionModel(Siglip2VisionConfig(**m["vision"]))
        randomise(model, 20 + k)
        model.to(torch.bfloat16).save_pretrained(out)
        cfg = processor_config(m["vision"]["patch_size"], m["budgets"][-1])
        (out / "preprocessor_config.json").write_text(json.dumps(cfg, indent=2) + "\n")
        vm = getattr(model, "vision_model", model)
        with safe_open(out / "model.safetensors", "pt") as f:
            keys = sorted(f.keys())
        prefix = "vision_model." if any(k.startswith("vision_model.") for k in keys) else "(none)"
        rows.append(dict(name=name, params=sum(p.numel() for p in model.parameters()),
                         vision=sum(p.numel() for p in vm.parameters()), prefix=prefix,
                         model_type=json.loads((out / "config.json").read_text())["model_type"]))
        print(f"  model {name}: {rows[-1]['params']} parameters ({rows[-1]['vision']} vision), "
              f"model_type {rows[-1]['model_type']}, vision tensors prefixed {prefix}")
    return rows


def make_preprocess() -> list[dict]:
    rows = []
    out = GOLDEN / "preprocess-siglip2"
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    for name in PRE_IMAGES:
        for budget in PRE_BUDGETS:
            tv, pil = preprocess([name], PRE_PATCH, budget), preprocess([name], PRE_PATCH, budget, pil=True)
            assert torch.equal(tv["spatial_shapes"], pil["spatial_shapes"])
            n = check_padding(tv)
            assert check_padding(pil) == n
            h, w = tv["spatial_shapes"][0].tolist()
            t = {"tv": tv["pixel_values"][0, :n].contiguous(), "pil": pil["pixel_values"][0, :n].contiguous(),
                 "spatial_shapes": tv["spatial_shapes"][0].contiguous()}
            check_processors(name, PRE_PATCH, budget, t["tv"], t["pil"])
            size = f"{h * PRE_PATCH}x{w * PRE_PATCH}"
            save_file(t, out / f"{Path(name).stem}-{budget}.safetensors",
                      metadata={"image": name, "budget": str(budget), "patch": str(PRE_PATCH), "resized_hw": size})
            iw, ih = open_image(name).size
            d = (t["tv"] - t["pil"]).abs()
            rows.append(dict(image=name, size=f"{iw}x{ih}", budget=budget, shape=(h, w), n=n, resized=size,
                             diff=float(d.max()), frac=float((d > 1e-6).float().mean())))
            print(f"  preprocess {name} ({iw}x{ih}) at {budget}: spatial_shapes {h}x{w} ({n} rows, "
                  f"{budget - n} pad), resized {size}, |tv - pil| max {rows[-1]['diff']:.3g} "
                  f"({100 * rows[-1]['frac']:.1f}% of values differ)")
    return rows


def check_position_table(vm: torch.nn.Module, x: dict[str, torch.Tensor], n: int) -> float:
    """The embeddings are patch_embedding(rows) + the 7 x 7 (6 x 6) table resampled to the grid by
    F.interpolate(bilinear, align_corners False, antialias True) in f32, pad rows row 0 of it; returns
    how far the antialias-free resampling would be (0 where the grid grows on both axes)."""
    e = vm.embeddings
    s, d = e.position_embedding_size, e.embed_dim
    table = e.position_embedding.weight.reshape(s, s, d).permute(2, 0, 1)[None].to(torch.float32)
    h, w = x["spatial_shapes"][0].tolist()
    with torch.no_grad():
        got = e(x["pixel_values"], x["spatial_shapes"])[0] - e.patch_embedding(x["pixel_values"])[0]
        want = {aa: F.interpolate(table, size=(h, w), mode="bilinear", align_corners=False,
                                  antialias=aa)[0].reshape(d, h * w).T for aa in (True, False)}
    assert (got[:n] - want[True]).abs().max() < 1e-5, "the position table is not resampled as expected"
    assert n == got.shape[0] or (got[n:] - want[True][0]).abs().max() < 1e-5, "the pad rows do not get row 0 of the table"
    return float((want[True] - want[False]).abs().max())


def make_tower() -> list[dict]:
    rows = []
    for name, m in MODELS.items():
        out = GOLDEN / "tower" / name
        shutil.rmtree(out, ignore_errors=True)
        out.mkdir(parents=True)
        path = GOLDEN / "models" / name
        cls = Siglip2Model if m["cls"] == "siglip2" else Siglip2VisionModel
        model = cls.from_pretrained(path, dtype=torch.float32, attn_implementation="eager").eval()
        # transformers 5's Siglip2VisionModel is the vision transformer itself (its tensors unprefixed).
        vm = getattr(model, "vision_model", model)
        p = m["vision"]["patch_size"]
        # The processor as the checkpoint's config makes it, at each budget.
        pp = Siglip2ImageProcessor.from_pretrained(path)
        for budget in m["budgets"]:
            for image in TOWER_IMAGES:
                o = pp(images=[open_image(image)], max_num_patches=budget, return_tensors="pt")
                x = {"pixel_values": o["pixel_values"].to(torch.float32).contiguous(),
                     "pixel_attention_mask": o["pixel_attention_mask"].to(torch.int64).contiguous(),
                     "spatial_shapes": o["spatial_shapes"].to(torch.int64).contiguous()}
                ref = preprocess([image], p, budget)
                assert all(torch.equal(x[k], ref[k]) for k in x), "preprocessor_config.json differs"
                n = check_padding(x)
                h, w = x["spatial_shapes"][0].tolist()
                aa = check_position_table(vm, x, n)
                with torch.no_grad():
                    o = vm(**x, output_hidden_states=True)
                    residual = max(float(s[0, :n].abs().max()) for s in o.hidden_states)
                    # Without padding: the real rows must not change (pad keys masked for every query).
                    u = vm(pixel_values=x["pixel_values"][:, :n], pixel_attention_mask=x["pixel_attention_mask"][:, :n],
                           spatial_shapes=x["spatial_shapes"])
                    o64 = vm.double()(pixel_values=x["pixel_values"].double(),
                                      pixel_attention_mask=x["pixel_attention_mask"],
                                      spatial_shapes=x["spatial_shapes"])
                    vm.float()
                lhs = o.last_hidden_state[0]
                unpadded = float((u.last_hidden_state[0] - lhs[:n]).abs().max())
                pad_spread = float((lhs[n:] - lhs[n:n + 1]).abs().max()) if n < budget else 0.0
                pad_abs = float(lhs[n:].abs().max()) if n < budget else 0.0
                if o.pooler_output is not None:
                    unpadded = max(unpadded, float((u.pooler_output - o.pooler_output).abs().max()))
                assert unpadded < 1e-5, f"{name} {image}: the padding changes the real rows ({unpadded})"
                t = {"pixel_values": x["pixel_values"][0].contiguous(),
                     "pixel_attention_mask": x["pixel_attention_mask"][0].contiguous(),
                     "spatial_shapes": x["spatial_shapes"][0].contiguous(),
                     "last_hidden_state": lhs[:n].contiguous()}
                if o.pooler_output is not None:
                    t["pooler_output"] = o.pooler_output.contiguous()
                floor = float((o64.last_hidden_state[0, :n] - lhs[:n].double()).abs().max())
                if o.pooler_output is not None:
                    floor = max(floor, float((o64.pooler_output - o.pooler_output.double()).abs().max()))
                size = f"{h * p}x{w * p}"
                save_file(t, out / f"{Path(image).stem}-{budget}.safetensors",
                          metadata={"image": image, "model": name, "budget": str(budget), "resized_hw": size})
                s = vm.embeddings.position_embedding_size
                rows.append(dict(model=name, image=image, budget=budget, shape=(h, w), n=n, table=s,
                                 max_abs=float(lhs[:n].abs().max()), residual=residual, floor=floor, aa=aa,
                                 unpadded=unpadded, pad_spread=pad_spread, pad_abs=pad_abs))
                print(f"  tower {name} {image} at {budget}: spatial_shapes {h}x{w} (table {s}x{s}), {n} rows, "
                      f"{budget - n} pad, max |h| {rows[-1]['max_abs']:.3f}, residual {residual:.1f}, "
                      f"fp32-fp64 {floor:.2g}, table without antialias off by {aa:.3g}, unpadded run off by "
                      f"{unpadded:.2g}, pad rows |h| {pad_abs:.3f} (spread {pad_spread:.2g})")
    return rows


def make_pixel_values() -> dict:
    name = "tiny-siglip2"
    out = GOLDEN / "pixel-values"
    out.mkdir(parents=True, exist_ok=True)
    model = Siglip2Model.from_pretrained(GOLDEN / "models" / name, dtype=torch.float32,
                                         attn_implementation="eager").eval()
    vm = model.vision_model
    x = preprocess(BATCH_IMAGES, MODELS[name]["vision"]["patch_size"], BATCH_BUDGET)
    with torch.no_grad():
        o = vm(**x)
        # Each image alone gives the same real rows and pooled vector.
        off = 0.0
        for i, image in enumerate(BATCH_IMAGES):
            n = check_padding(x, i)
            one = vm(**preprocess([image], MODELS[name]["vision"]["patch_size"], BATCH_BUDGET))
            off = max(off, float((one.last_hidden_state[0, :n] - o.last_hidden_state[i, :n]).abs().max()),
                      float((one.pooler_output[0] - o.pooler_output[i]).abs().max()))
    assert off < 1e-5, f"the batch changes an image's outputs ({off})"
    t = dict(x, last_hidden_state=o.last_hidden_state.contiguous(), pooler_output=o.pooler_output.contiguous())
    save_file(t, out / f"{name}.safetensors",
              metadata={"images": ",".join(BATCH_IMAGES), "model": name, "budget": str(BATCH_BUDGET)})
    shapes = [tuple(s) for s in x["spatial_shapes"].tolist()]
    print(f"  pixel values {name}: {tuple(x['pixel_values'].shape)}, spatial_shapes {shapes} -> "
          f"last_hidden_state {tuple(o.last_hidden_state.shape)}, pooler_output {tuple(o.pooler_output.shape)}, "
          f"batch vs one by one {off:.2g}")
    return dict(shapes=shapes, off=off)


def write_readme(model_rows, pre_rows, tower_rows, batch) -> None:
    v = dict(torch=torch.__version__, torchvision=torchvision.__version__, transformers=transformers.__version__,
             pillow=PIL.__version__, numpy=np.__version__, python=platform.python_version())
    lines = ["# Golden data of the SigLIP2 NaFlex family", "",
             "Written by `python/golden/make_golden_siglip2.py` (`make golden-siglip2`); do not edit.", "",
             "Made with " + ", ".join(f"{k} {x}" for k, x in v.items())
             + f" on {platform.machine()} (ATen CPU capability {torch.backends.cpu.get_cpu_capability()}).", "",
             "## Models", "",
             "| name | class | model_type | vision config | parameters (vision) | vision tensors prefixed |",
             "|---|---|---|---|---|---|"]
    classes = {"siglip2": "Siglip2Model", "siglip2-vision": "Siglip2VisionModel"}
    for r in model_rows:
        m = MODELS[r["name"]]
        lines.append(f"| {r['name']} | {classes[m['cls']]} | {r['model_type']} | {json.dumps(m['vision'])} | "
                     f"{r['params']} ({r['vision']}) | `{r['prefix']}` |")
    lines += ["", f"tiny-siglip2's text tower: {json.dumps(TEXT)} (left as transformers initialises it).", "",
              "All weights bf16; vision parameters seeded random as in make_golden_encoders.py (norm weights "
              "1 + 0.1 N(0,1), biases 0.05 N(0,1), embeddings (the patch Linear and the position table) "
              "0.5 N(0,1), other weights (the head's probe and in_proj too) N(0, s), "
              "s = clamp(1/sqrt(fan_in), 0.05, 0.1)). `preprocessor_config.json`: `Siglip2ImageProcessor`, "
              "the model's patch, `max_num_patches` 144 (tiny-siglip2) and 100 (tiny-siglip2-nohead), bilinear, "
              "mean = std = 0.5.", "",
              "## Preprocessing (`preprocess-siglip2/<stem>-<budget>.safetensors`)", "",
              "Patch 12, `max_num_patches` (budget) 64 and 144, bilinear, mean = std = 0.5; the image opened with "
              "`PIL.Image.open` then `ImageOps.exif_transpose`, the processor converts it to RGB. `tv` "
              "(`Siglip2ImageProcessor`, torchvision) and `pil` (`Siglip2ImageProcessorPil`) are the real rows "
              "only, f32 `[n, 432]`, n = h w, each row (py, px, c); `spatial_shapes` i64 `[2]` = (h, w) in "
              "patches. Both backends agree on the size, the mask (1 on the first n rows, 0 after) and zero pad "
              "rows (asserted). torchvision resizes the uint8 image as uint8 (antialiased bilinear, fixed point) "
              "and computes (x - 127.5) / 127.5 in f32; PIL resizes with `Image.resize(BILINEAR)` and computes "
              "(f32(x / 255) - 0.5) / 0.5 (both reproduced bit for bit, asserted). One uint8 level is 0.00784.",
              "", "| image | size | budget | spatial_shapes | rows | pad | resized (HxW) | max abs tv - pil "
              "| values differing |", "|---|---|---|---|---|---|---|---|---|"]
    lines += [f"| {r['image']} | {r['size']} | {r['budget']} | {r['shape'][0]}x{r['shape'][1]} | {r['n']} "
              f"| {r['budget'] - r['n']} | {r['resized']} | {r['diff']:.3g} | {100 * r['frac']:.1f}% |"
              for r in pre_rows]
    lines += ["", "## Tower outputs (`tower/<model>/<stem>-<budget>.safetensors`)", "",
              "fp32, eager attention, the torchvision backend's output for one image (the processor loaded from "
              "the model's `preprocessor_config.json`, `max_num_patches` = budget). Tensors: `pixel_values` f32 "
              "`[budget, 3 p p]` (pad rows 0), `pixel_attention_mask` i64 `[budget]`, `spatial_shapes` i64 `[2]`, "
              "`last_hidden_state` f32 `[n, D]` (the real rows only), `pooler_output` f32 `[1, D]` (tiny-siglip2 "
              "only). `fp32-fp64`: the largest |difference| of `last_hidden_state` (and `pooler_output`) from an "
              "fp64 run of the same weights (transformers resamples the table in f32 even then); `residual`: the "
              "largest |value| of the hidden states' real rows; `no antialias`: how far the table resampled "
              "without antialiasing would be (beyond rounding, about 1e-6, only where the grid is smaller than the "
              "table on an axis); "
              "`pad rows`: the largest |value| of `last_hidden_state`'s pad rows, which transformers computes "
              "(all alike: a zero patch plus row 0 of the table, attending to the real keys) and a consumer "
              "should ignore.", "",
              "| model | image | budget | spatial_shapes | table | rows | pad | max abs | residual | fp32-fp64 "
              "| no antialias | pad rows |", "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    lines += [f"| {r['model']} | {r['image']} | {r['budget']} | {r['shape'][0]}x{r['shape'][1]} | "
              f"{r['table']}x{r['table']} | {r['n']} | {r['budget'] - r['n']} | {r['max_abs']:.3f} | "
              f"{r['residual']:.1f} | {r['floor']:.2g} | {r['aa']:.3g} | "
              f"{'-' if r['n'] == r['budget'] else format(r['pad_abs'], '.3f')} |" for r in tower_rows]
    lines += ["", "Asserted for every case: the embeddings are the patch Linear plus the 7 x 7 (6 x 6) table "
              "resampled by `F.interpolate(mode='bilinear', align_corners=False, antialias=True)` in f32, the pad "
              "rows getting row 0 of the resampled table; the real rows of `last_hidden_state` and "
              "`pooler_output` equal (to 1e-5) a run on the real rows alone, without padding.", "",
              "## Pixel values (`pixel-values/tiny-siglip2.safetensors`)", "",
              f"The torchvision processor's batch of {', '.join(BATCH_IMAGES)} at budget {BATCH_BUDGET} "
              f"(spatial_shapes {batch['shapes']}): `pixel_values` f32 `[2, 64, 432]`, `pixel_attention_mask` i64 "
              "`[2, 64]`, `spatial_shapes` i64 `[2, 2]`, and tiny-siglip2's outputs as transformers returns them: "
              "`last_hidden_state` f32 `[2, 64, 60]` (all rows, pad rows too), `pooler_output` f32 `[2, 60]`. "
              f"Each image run alone gives the same real rows and pooled vector (largest difference "
              f"{batch['off']:.2g})."]
    (GOLDEN / "README-siglip2.md").write_text("\n".join(lines) + "\n")


def main() -> None:
    torch.set_num_threads(2)
    models = make_models()
    pre = make_preprocess()
    tower = make_tower()
    batch = make_pixel_values()
    write_readme(models, pre, tower, batch)


if __name__ == "__main__":
    main()
