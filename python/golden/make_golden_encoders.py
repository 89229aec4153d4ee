#!/usr/bin/env python3
"""Golden data of the encoder families, CLIP, SigLIP and DINOv2 (deterministic, seed 0).

Run with the developer venv (torch, torchvision, transformers, pillow), no network:

    .venv-dev/bin/python python/golden/make_golden_encoders.py

It rewrites, and touches nothing else of golden/:

- golden/models/tiny-clip: a tiny random `CLIPModel` (a text tower too, so
  `model_type` `clip` and a `visual_projection`), bf16, odd sizes (width 60,
  3 heads of 20, MLP 90, projection 36), image 140 at patch 14 (a 10 x 10
  grid: 100 patches, above the sequence the Neural Engine takes, R11),
  saved by `save_pretrained` with the processor config of the released
  CLIP checkpoints scaled to 140 pixels (shortest edge, centre crop,
  bicubic, OpenAI mean and std).
- golden/models/tiny-clip-vision: a tiny random `CLIPVisionModel`
  (`clip_vision_model`, no projection, erf GELU, 2 blocks, width 44, 4
  heads of 11), image 120 at patch 12; transformers 5 saves its tensors
  without the `vision_model.` prefix that released checkpoints have.
- golden/models/tiny-siglip: a tiny random `SiglipModel` (a text tower
  too, so `model_type` `siglip`), bf16, with the attention-pooling head:
  width 72, 4 heads of 18, MLP 100, 3 blocks, image 160 at patch 16 (100
  patches), the processor config of the released SigLIP checkpoints (resize
  to the image size, mean = std = 0.5).
- golden/models/tiny-siglip-nohead: a tiny random `SiglipVisionModel`
  without the head (`vision_use_head` false, as PaliGemma's and Idefics3's
  towers), erf GELU, image 126 at patch 12: the convolution drops the last 6
  pixels (10 x 10 patches), as so400m's 384 px at patch 14 does.
- golden/models/tiny-dinov2: a tiny random `Dinov2Model` (`dinov2`), bf16,
  SwiGLU MLP, width 60, 3 heads of 20, 3 blocks, LayerScale not 1, image
  98 at patch 14 (a 7 x 7 position table) and the released processor's
  sizing scaled down (shortest edge 128, centre crop 112: an 8 x 8 grid,
  so the table is resampled, plain bicubic).
- golden/models/tiny-dinov2-reg: a tiny random `Dinov2WithRegistersModel`
  (`dinov2_with_registers`), 3 registers, fc MLP (erf GELU, mlp_ratio
  3: 132), width 44, 4 heads of 11, 2 blocks, image 84 at patch 12 (7 x
  7), processor shortest edge 110, crop 96 (8 x 8; antialiased bicubic).
- golden/models/tiny-dinov2-massive: tiny-dinov2-reg's shape (3 blocks)
  with massive activations, as trained towers have and random weights
  never do: two channels of the register tokens start at 40,000, and
  block 0's MLP adds 30,000 more to them in the register tokens alone (one
  hidden unit that fires only where those channels dominate the
  LayerNorm), so the residual stream reaches 70,000 there: beyond fp16's
  65,504, where a naive fp16 program overflows. (Published analyses report
  hundreds to thousands in trained CLIP, DINOv2 and SigLIP; the values
  here are larger so that storage in fp16 overflows.)
- golden/models/tiny-clip-massive: tiny-clip-vision's shape (a
  `CLIPVisionModel`) with massive activations in one patch token at a fixed
  position (token 38: row 3, column 7 of the 10 x 10 grid): two channels of
  its position row start high enough to dominate it after `pre_layrnorm`,
  and block 0's MLP writes about 80,000 into them there alone (one hidden
  unit that fires only where those channels dominate `layer_norm2`), so
  `last_hidden_state` itself, which CLIP returns before any norm, holds
  values beyond fp16's 65,504.
- golden/models/tiny-siglip-massive: a `SiglipVisionModel` with the head
  (width 44, 4 heads of 11, 2 blocks, image 120 at patch 12) with massive
  activations in patch token 38: two channels of its position row hold
  40,000 and block 0's MLP adds about 30,000 there alone, so the stream
  passes fp16's 65,504 at block 0's residual add (both outputs follow
  `post_layernorm`).
- golden/preprocess-clip/<stem>.safetensors, golden/preprocess-siglip/ and
  golden/preprocess-dinov2/ (`BitImageProcessor`, 128 then 112 at 14):
  transformers' CLIP and SigLIP image processors on the lossless golden
  images: `tv` (the torchvision backend, transformers 5's default) and `pil`
  (the `...Pil` classes), each `pixel_values` as patch rows in raster order,
  (c, py, px): `[100, 588]` for CLIP (140 px at 14), `[100, 768]` for SigLIP
  (160 px at 16).
- golden/tower/<model>/<case>.safetensors for each model: the outputs of
  the model reloaded from disk in fp32 (`vision_model`, and
  `visual_projection` where there is one) for the processor's pixel values
  of one image: `pixel_values` (patch rows), `last_hidden_state` (`[101, D]`
  for CLIP, class token first; `[100, D]` for SigLIP), `pooler_output`
  `[1, D]` (not for the headless SigLIP), `image_embeds` `[1, 36]` (CLIP
  with its projection). tiny-clip and tiny-siglip also at a second side
  (112 and 128: an 8 x 8 grid, their tables resampled by transformers'
  `interpolate_pos_encoding`), in `<stem>-<side>.safetensors`. For the
  DINOv2 models also at a second side (a
  6 x 6 grid for tiny-dinov2, 5 x 5 for tiny-dinov2-reg: the table shrunk,
  where antialiasing matters), in `<stem>-<side>.safetensors`;
  `last_hidden_state` is `[1 + R + N, D]` (class token, registers, patches).
- golden/pixel-values/<model>.safetensors: transformers' own `pixel_values`
  `[1, 3, H, W]` of one image and the model's outputs for it, for
  `ane-export reference --pixel-values`: tiny-dinov2 at 84 x 112 (a 6 x 8
  grid: not square, the table resampled to it), tiny-siglip-nohead at 126
  x 126 (the convolution drops 6 pixels).
- golden/README-encoders.md: what was made.
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
import transformers
from PIL import Image, ImageOps
from transformers import (
    CLIPConfig,
    CLIPModel,
    CLIPVisionConfig,
    CLIPVisionModel,
    Dinov2Config,
    Dinov2Model,
    Dinov2WithRegistersConfig,
    Dinov2WithRegistersModel,
    SiglipConfig,
    SiglipModel,
    SiglipVisionConfig,
    SiglipVisionModel,
)
from transformers.models.bit.image_processing_bit import BitImageProcessor
from transformers.models.bit.image_processing_pil_bit import BitImageProcessorPil
from transformers.models.clip.image_processing_clip import CLIPImageProcessor
from transformers.models.clip.image_processing_pil_clip import CLIPImageProcessorPil
from transformers.models.siglip.image_processing_pil_siglip import SiglipImageProcessorPil
from transformers.models.siglip.image_processing_siglip import SiglipImageProcessor

sys.path.insert(0, str(Path(__file__).resolve().parent))
from make_golden import save_file  # noqa: E402  (the byte-deterministic writer)

SEED = 0
ROOT = Path(__file__).resolve().parents[2]
GOLDEN = ROOT / "golden"
MEAN = [0.48145466, 0.4578275, 0.40821073]
STD = [0.26862954, 0.26130258, 0.27577711]

MODELS = {
    "tiny-clip": dict(
        cls="clip",
        vision=dict(hidden_size=60, intermediate_size=90, num_hidden_layers=3, num_attention_heads=3,
                    image_size=140, patch_size=14, hidden_act="quick_gelu", layer_norm_eps=1e-5),
        projection_dim=36, sides=[140, 112]),
    "tiny-clip-vision": dict(
        cls="vision",
        vision=dict(hidden_size=44, intermediate_size=70, num_hidden_layers=2, num_attention_heads=4,
                    image_size=120, patch_size=12, hidden_act="gelu", layer_norm_eps=1e-5)),
    "tiny-siglip": dict(
        cls="siglip",
        vision=dict(hidden_size=72, intermediate_size=100, num_hidden_layers=3, num_attention_heads=4,
                    image_size=160, patch_size=16, hidden_act="gelu_pytorch_tanh", layer_norm_eps=1e-6),
        sides=[160, 128]),
    "tiny-siglip-nohead": dict(
        cls="siglip-vision",
        vision=dict(hidden_size=44, intermediate_size=70, num_hidden_layers=2, num_attention_heads=4,
                    image_size=126, patch_size=12, hidden_act="gelu", layer_norm_eps=1e-6,
                    vision_use_head=False)),
    "tiny-dinov2": dict(
        cls="dinov2",
        vision=dict(hidden_size=60, num_hidden_layers=3, num_attention_heads=3, mlp_ratio=2,
                    use_swiglu_ffn=True, image_size=98, patch_size=14, hidden_act="gelu", layer_norm_eps=1e-6),
        pre=(128, 112), sides=[112, 84]),
    "tiny-dinov2-reg": dict(
        cls="dinov2-reg",
        vision=dict(hidden_size=44, num_hidden_layers=2, num_attention_heads=4, mlp_ratio=3,
                    num_register_tokens=3, image_size=84, patch_size=12, hidden_act="gelu",
                    layer_norm_eps=1e-6),
        pre=(110, 96), sides=[96, 60]),
    "tiny-dinov2-massive": dict(
        cls="dinov2-reg",
        vision=dict(hidden_size=44, num_hidden_layers=3, num_attention_heads=4, mlp_ratio=3,
                    num_register_tokens=3, image_size=84, patch_size=12, hidden_act="gelu",
                    layer_norm_eps=1e-6),
        pre=(110, 96), sides=[96], massive=dict(channels=[5, 17], start=40000.0, boost=30000.0)),
    "tiny-clip-massive": dict(
        cls="vision",
        vision=dict(hidden_size=44, intermediate_size=70, num_hidden_layers=2, num_attention_heads=4,
                    image_size=120, patch_size=12, hidden_act="quick_gelu", layer_norm_eps=1e-5),
        massive=dict(channels=[5, 17], start=1000.0, boost=80000.0, token=38)),
    "tiny-siglip-massive": dict(
        cls="siglip-vision",
        vision=dict(hidden_size=44, intermediate_size=70, num_hidden_layers=2, num_attention_heads=4,
                    image_size=120, patch_size=12, hidden_act="gelu_pytorch_tanh", layer_norm_eps=1e-6),
        massive=dict(channels=[5, 17], start=40000.0, boost=30000.0, token=38)),
}
SIGLIP_MEAN = SIGLIP_STD = [0.5, 0.5, 0.5]
IMAGENET_MEAN = [0.485, 0.456, 0.406]
IMAGENET_STD = [0.229, 0.224, 0.225]
# Lossless golden images: square, tall and wide (the crop cuts each differently), tiny (upscaled).
PRE_IMAGES = ["square.png", "tall.png", "rgba.png", "tiny.png", "lossless.webp", "palette.png"]
TOWER_IMAGES = ["square.png", "tall.png", "palette.png"]


def processor_config(side: int, family: str = "clip", pre=None) -> dict:
    if family.startswith("dinov2"):
        return {
            "crop_size": {"height": pre[1], "width": pre[1]},
            "do_center_crop": True,
            "do_convert_rgb": True,
            "do_normalize": True,
            "do_rescale": True,
            "do_resize": True,
            "image_mean": IMAGENET_MEAN,
            "image_processor_type": "BitImageProcessor",
            "image_std": IMAGENET_STD,
            "resample": 3,
            "rescale_factor": 1 / 255,
            "size": {"shortest_edge": pre[0]},
        }
    if family.startswith("siglip"):
        return {
            "do_convert_rgb": True,
            "do_normalize": True,
            "do_rescale": True,
            "do_resize": True,
            "image_mean": SIGLIP_MEAN,
            "image_processor_type": "SiglipImageProcessor",
            "image_std": SIGLIP_STD,
            "resample": 3,
            "rescale_factor": 1 / 255,
            "size": {"height": side, "width": side},
        }
    return {
        "crop_size": {"height": side, "width": side},
        "do_center_crop": True,
        "do_convert_rgb": True,
        "do_normalize": True,
        "do_rescale": True,
        "do_resize": True,
        "image_mean": MEAN,
        "image_processor_type": "CLIPImageProcessor",
        "image_std": STD,
        "resample": 3,
        "rescale_factor": 1 / 255,
        "size": {"shortest_edge": side},
    }


def open_image(name: str) -> Image.Image:
    return ImageOps.exif_transpose(Image.open(GOLDEN / "images" / name))


def patch_rows(pv: torch.Tensor, p: int) -> torch.Tensor:
    """[1, 3, H, W] -> [(H//p)*(W//p), 3*p*p]: raster order of patches, (c, py, px) per row."""
    b, c, h, w = pv.shape
    h, w = h // p * p, w // p * p  # the convolution drops what a whole patch does not cover
    x = pv[:, :, :h, :w].reshape(b, c, h // p, p, w // p, p).permute(0, 2, 4, 1, 3, 5)
    return x.reshape(b * (h // p) * (w // p), c * p * p).contiguous()


def randomise(model: torch.nn.Module, seed: int) -> None:
    """Every vision parameter gets a seeded random value; none is trivially 0 or 1."""
    g = torch.Generator().manual_seed(SEED * 1000 + seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.startswith(("text_model.", "text_projection", "logit_scale", "logit_bias")):
                continue
            if name.endswith("lambda1"):  # LayerScale: positive, not 1
                p.copy_(0.5 + 0.2 * torch.rand(p.shape, generator=g))
            elif name.endswith("norm1.weight") or name.endswith("norm2.weight") or "layernorm.weight" in name \
                    or "layrnorm.weight" in name:
                p.copy_(1 + 0.1 * torch.randn(p.shape, generator=g))
            elif name.endswith(".bias"):
                p.copy_(0.05 * torch.randn(p.shape, generator=g))
            elif "embedding" in name:
                p.copy_(0.5 * torch.randn(p.shape, generator=g))
            else:
                fan_in = p.shape[1] if p.dim() == 2 else int(np.prod(p.shape[1:]))
                s = min(max(fan_in ** -0.5, 0.05), 0.1)
                p.copy_(s * torch.randn(p.shape, generator=g))


def make_massive(model: torch.nn.Module, channels: list[int], start: float, boost: float) -> None:
    """Massive activations in the register tokens: `channels` start at
    `start` there, and block 0's MLP adds `boost` to them in those tokens
    only, through hidden unit 0: it reads the channels after norm2 (about
    4.6 where they dominate a token, about N(0, 1) elsewhere) with weight 10
    and bias -60, so GELU gives 0 everywhere but the registers."""
    e, layer = model.embeddings, model.encoder.layer[0]
    with torch.no_grad():
        for c in channels:
            e.register_tokens[:, :, c] = start
        fc1, fc2 = layer.mlp.fc1, layer.mlp.fc2
        n2 = layer.norm2
        fc1.weight[0].zero_()
        fc1.bias[0] = -60.0
        for c in channels:
            n2.weight[c], n2.bias[c] = 1.0, 0.0
            fc1.weight[0, c] = 10.0
        layer.layer_scale2.lambda1[channels] = 1.0
        # What the hidden unit reaches in a register token, whose norm2 input
        # the massive channels dominate: each normalises to (start - mean) / std.
        d, k = model.config.hidden_size, len(channels)
        mean = k * start / d
        std = ((k * (start - mean) ** 2 + (d - k) * mean**2) / d) ** 0.5
        h = 10.0 * k * (start - mean) / std - 60.0
        fc2.weight[:, 0] = 0.0
        for c in channels:
            fc2.weight[c, 0] = boost / h


def make_massive_token(model: torch.nn.Module, channels: list[int], start: float, boost: float, token: int) -> None:
    """Massive activations in one patch token at a fixed position, as trained
    towers show them (published analyses find them in a few low-information
    patch tokens), for CLIP and SigLIP: `channels` of the position row
    `token` (a row of the sequence: CLIP's class token is row 0) start at
    `start`, so that they dominate that token (CLIP: after `pre_layrnorm`,
    whose weight there is 1 and bias 0; SigLIP: in the stream itself); block
    0's hidden unit 0 reads them after `layer_norm2` (weight 1, bias 0
    there) with weight 10 and bias -60, which fires in that token alone, and
    fc2 writes `boost` into the channels through it: the unit's activation
    is measured in that token of the tower images (their mean) and fc2's
    weight set to `boost` over it."""
    vm = getattr(model, "vision_model", model)
    e, layer = vm.embeddings, vm.encoder.layers[0]
    with torch.no_grad():
        for c in channels:
            e.position_embedding.weight[token, c] = start
            if hasattr(vm, "pre_layrnorm"):
                vm.pre_layrnorm.weight[c], vm.pre_layrnorm.bias[c] = 1.0, 0.0
            layer.layer_norm2.weight[c], layer.layer_norm2.bias[c] = 1.0, 0.0
        fc1, fc2 = layer.mlp.fc1, layer.mlp.fc2
        fc1.weight[0].zero_()
        fc1.bias[0] = -60.0
        for c in channels:
            fc1.weight[0, c] = 10.0
        fc2.weight[:, 0] = 0.0
        seen = []
        hook = fc2.register_forward_pre_hook(lambda _m, a: seen.append(a[0][0, :, 0].clone()))
        side = model.config.image_size
        family = "vision" if hasattr(vm, "pre_layrnorm") else "siglip"
        for image in TOWER_IMAGES:
            model(pixel_values=preprocess(image, side, False, family))
        hook.remove()
        hot = torch.stack([a[token] for a in seen])
        rest = torch.cat([torch.cat([a[:token], a[token + 1:]]) for a in seen])
        assert float(hot.min()) > 1.0 and float(rest.abs().max()) < 1e-3 * float(hot.min()), (hot, rest.abs().max())
        for c in channels:
            fc2.weight[c, 0] = boost / float(hot.mean())


def make_models() -> None:
    for k, (name, m) in enumerate(MODELS.items()):
        out = GOLDEN / "models" / name
        shutil.rmtree(out, ignore_errors=True)
        torch.manual_seed(SEED)
        if m["cls"] == "clip":
            cfg = CLIPConfig(
                vision_config=m["vision"], projection_dim=m["projection_dim"],
                text_config=dict(vocab_size=64, hidden_size=32, intermediate_size=40, num_hidden_layers=1,
                                 num_attention_heads=2, max_position_embeddings=16))
            model = CLIPModel(cfg)
        elif m["cls"] == "siglip":
            cfg = SiglipConfig(
                vision_config=m["vision"],
                text_config=dict(vocab_size=64, hidden_size=32, intermediate_size=40, num_hidden_layers=1,
                                 num_attention_heads=2, max_position_embeddings=16))
            model = SiglipModel(cfg)
        elif m["cls"] == "siglip-vision":
            model = SiglipVisionModel(SiglipVisionConfig(**m["vision"]))
        elif m["cls"] == "dinov2":
            model = Dinov2Model(Dinov2Config(**m["vision"]))
        elif m["cls"] == "dinov2-reg":
            model = Dinov2WithRegistersModel(Dinov2WithRegistersConfig(**m["vision"]))
        else:
            model = CLIPVisionModel(CLIPVisionConfig(**m["vision"]))
        randomise(model, k)
        if "massive" in m:
            (make_massive if m["cls"].startswith("dinov2") else make_massive_token)(model, **m["massive"])
        model.to(torch.bfloat16).save_pretrained(out)
        (out / "preprocessor_config.json").write_text(
            json.dumps(processor_config(m["vision"]["image_size"], m["cls"], m.get("pre")), indent=2) + "\n")
        print(f"  model {name}: {sum(p.numel() for p in model.parameters())} parameters")


def preprocess(name: str, side: int, pil: bool, family: str = "clip", shortest: int | None = None) -> torch.Tensor:
    if family.startswith("dinov2"):
        cls = BitImageProcessorPil if pil else BitImageProcessor
        pp = cls(size={"shortest_edge": shortest}, crop_size={"height": side, "width": side},
                 image_mean=IMAGENET_MEAN, image_std=IMAGENET_STD, resample=3, do_center_crop=True)
    elif family.startswith("siglip"):
        cls = SiglipImageProcessorPil if pil else SiglipImageProcessor
        pp = cls(size={"height": side, "width": side}, image_mean=SIGLIP_MEAN, image_std=SIGLIP_STD, resample=3)
    else:
        cls = CLIPImageProcessorPil if pil else CLIPImageProcessor
        pp = cls(size={"shortest_edge": side}, crop_size={"height": side, "width": side}, image_mean=MEAN,
                 image_std=STD, resample=3)
    return pp(images=[open_image(name)], return_tensors="pt")["pixel_values"].to(torch.float32)


def make_preprocess() -> list[dict]:
    rows = []
    for family, side, patch, shortest in [("clip", 140, 14, None), ("siglip", 160, 16, None),
                                          ("dinov2", 112, 14, 128)]:
        out = GOLDEN / f"preprocess-{family}"
        shutil.rmtree(out, ignore_errors=True)
        out.mkdir(parents=True)
        for name in PRE_IMAGES:
            tv, pil = preprocess(name, side, False, family, shortest), preprocess(name, side, True, family, shortest)
            save_file({"tv": patch_rows(tv, patch), "pil": patch_rows(pil, patch)},
                      out / f"{Path(name).stem}.safetensors",
                      metadata={"image": name, "side": str(side), "patch": str(patch)})
            w, h = open_image(name).size
            rows.append(dict(family=family, image=name, size=f"{w}x{h}", diff=float((tv - pil).abs().max())))
            print(f"  preprocess {family} {name}: {w}x{h}, |tv - pil| max {rows[-1]['diff']:.3g}")
    return rows


def make_tower() -> list[dict]:
    rows = []
    for name, m in MODELS.items():
        out = GOLDEN / "tower" / name
        shutil.rmtree(out, ignore_errors=True)
        out.mkdir(parents=True)
        path = GOLDEN / "models" / name
        cls = {"clip": CLIPModel, "vision": CLIPVisionModel, "siglip": SiglipModel,
               "siglip-vision": SiglipVisionModel, "dinov2": Dinov2Model,
               "dinov2-reg": Dinov2WithRegistersModel}[m["cls"]]
        model = cls.from_pretrained(path, dtype=torch.float32, attn_implementation="eager").eval()
        # transformers 5's CLIPVisionModel is the vision transformer itself (its tensors unprefixed).
        vm = getattr(model, "vision_model", model)
        p = m["vision"]["patch_size"]
        # (side, shortest edge, file suffix): the processor's size, and for DINOv2 a second grid.
        cases = [(m["vision"]["image_size"], None, "")]
        if "sides" in m and "pre" not in m:  # CLIP and SigLIP at another side: the table resampled
            cases = [(s, None, "" if s == m["vision"]["image_size"] else f"-{s}") for s in m["sides"]]
        if "pre" in m:
            short, crop = m["pre"]
            cases = [(s, round(short * s / crop), "" if s == crop else f"-{s}") for s in m["sides"]]
        for image, (side, shortest, suffix) in [(i, c) for c in cases for i in TOWER_IMAGES]:
            pv = preprocess(image, side, False, m["cls"], shortest)
            with torch.no_grad():
                interp = {"interpolate_pos_encoding": True} if suffix and "pre" not in m else {}
                o = vm(pixel_values=pv, output_hidden_states=True, **interp)
                residual = max(float(h.abs().max()) for h in o.hidden_states)
                t = {"pixel_values": patch_rows(pv, p), "last_hidden_state": o.last_hidden_state[0].contiguous()}
                if o.pooler_output is not None:
                    t["pooler_output"] = o.pooler_output.contiguous()
                if m["cls"] == "clip":
                    t["image_embeds"] = model.visual_projection(o.pooler_output).contiguous()
                o64 = vm.double()(pixel_values=pv.double(), **interp)
                vm.float()
            floor = float((o64.last_hidden_state[0] - t["last_hidden_state"].double()).abs().max())
            meta = {"image": image, "model": name} | ({"side": str(side)} if "pre" in m or suffix else {})
            save_file(t, out / f"{Path(image).stem}{suffix}.safetensors", metadata=meta)
            rows.append(dict(model=name, image=f"{image} at {side}", tokens=t["last_hidden_state"].shape[0],
                             max_abs=float(t["last_hidden_state"].abs().max()), floor=floor,
                             residual=residual))
            print(f"  tower {name} {image}: max |h| {rows[-1]['max_abs']:.3f}, residual stream {residual:.1f}, "
                  f"fp32-fp64 {floor:.2g}")
    return rows


def make_pixel_values() -> None:
    out = GOLDEN / "pixel-values"  # shared with make_golden_siglip2.py: only this script's files are rewritten
    out.mkdir(parents=True, exist_ok=True)
    for name, cls, size in [("tiny-dinov2", Dinov2Model, (84, 112)), ("tiny-siglip-nohead", SiglipVisionModel, (126, 126))]:
        model = cls.from_pretrained(GOLDEN / "models" / name, dtype=torch.float32, attn_implementation="eager").eval()
        vm = getattr(model, "vision_model", model)
        img = np.asarray(open_image("tall.png").convert("RGB").resize(size[::-1], Image.BICUBIC), dtype=np.float32)
        pv = torch.from_numpy(((img / 255.0 - 0.5) / 0.5).transpose(2, 0, 1)[None].copy())
        with torch.no_grad():
            o = vm(pixel_values=pv)
        t = {"pixel_values": pv.contiguous(), "last_hidden_state": o.last_hidden_state[0].contiguous(),
             "pooler_output": o.pooler_output.contiguous() if o.pooler_output is not None else None}
        save_file({k: v for k, v in t.items() if v is not None}, out / f"{name}.safetensors",
                  metadata={"image": "tall.png", "model": name, "size": f"{size[0]}x{size[1]}"})
        print(f"  pixel values {name}: {tuple(pv.shape)} -> last_hidden_state {tuple(o.last_hidden_state[0].shape)}")


def write_readme(pre_rows, tower_rows) -> None:
    v = dict(torch=torch.__version__, transformers=transformers.__version__, pillow=PIL.__version__,
             numpy=np.__version__, python=platform.python_version())
    lines = ["# Golden data of the encoder families (CLIP, SigLIP, DINOv2)", "",
             "Written by `python/golden/make_golden_encoders.py` (`make golden-encoders`); do not edit.", "",
             "Made with " + ", ".join(f"{k} {x}" for k, x in v.items()) + ".", "", "## Models", "",
             "| name | class | vision config | projection |", "|---|---|---|---|"]
    classes = {"clip": "CLIPModel", "vision": "CLIPVisionModel", "siglip": "SiglipModel",
               "siglip-vision": "SiglipVisionModel", "dinov2": "Dinov2Model",
               "dinov2-reg": "Dinov2WithRegistersModel"}
    for name, m in MODELS.items():
        lines.append(f"| {name} | {classes[m['cls']]} | "
                     f"{json.dumps(m['vision'])} | {m.get('projection_dim', '-')} |")
    lines += ["", "All weights bf16; vision parameters seeded random (norm weights 1 + 0.1 N(0,1), biases "
              "0.05 N(0,1), embeddings 0.5 N(0,1), LayerScale 0.5 + 0.2 U(0,1), linear weights N(0, s), "
              "s = clamp(1/sqrt(fan_in), 0.05, 0.1)).", "",
              "tiny-dinov2-massive then gets massive activations (`make_massive`): channels "
              f"{MODELS['tiny-dinov2-massive']['massive']['channels']} of its register tokens start at "
              f"{MODELS['tiny-dinov2-massive']['massive']['start']:.0f}, and block 0's MLP adds "
              f"{MODELS['tiny-dinov2-massive']['massive']['boost']:.0f} to them there alone (hidden unit 0 reads "
              "them after norm2, weight 10, bias -60), so the residual stream passes fp16's 65,504 (the "
              "`residual` column below). tiny-clip-massive likewise in patch token "
              f"{MODELS['tiny-clip-massive']['massive']['token']} (`make_massive_token`): channels "
              f"{MODELS['tiny-clip-massive']['massive']['channels']} of its position row start at "
              f"{MODELS['tiny-clip-massive']['massive']['start']:.0f} (dominating it after `pre_layrnorm`), and "
              f"block 0's MLP writes about {MODELS['tiny-clip-massive']['massive']['boost']:.0f} into them there "
              "alone, so `last_hidden_state`, the stream itself, passes 65,504. tiny-siglip-massive in patch "
              f"token {MODELS['tiny-siglip-massive']['massive']['token']}: channels "
              f"{MODELS['tiny-siglip-massive']['massive']['channels']} of its position row hold "
              f"{MODELS['tiny-siglip-massive']['massive']['start']:.0f} and block 0's MLP adds about "
              f"{MODELS['tiny-siglip-massive']['massive']['boost']:.0f} there alone.",
              "", "## Preprocessing (`preprocess-clip/`, `preprocess-siglip/`, `preprocess-dinov2/`)", "",
              "CLIP: shortest edge 140, centre crop 140, bicubic, OpenAI mean and std. SigLIP: resize to 160 x 160, "
              "bicubic, mean = std = 0.5. DINOv2 (`BitImageProcessor`): shortest edge 128, centre crop 112, bicubic, "
              "ImageNet mean and std. `tv` the torchvision backend, `pil` the PIL one.", "",
              "| family | image | size | max abs tv - pil |", "|---|---|---|---|"]
    lines += [f"| {r['family']} | {r['image']} | {r['size']} | {r['diff']:.3g} |" for r in pre_rows]
    lines += ["", "## Tower outputs (`tower/<model>`)", "",
              "fp32, eager attention, the torchvision backend's pixel values. `fp32-fp64`: the largest |difference| "
              "of `last_hidden_state` from an fp64 run of the same weights; `residual`: the largest |value| of the "
              "hidden states (the embeddings and every block's output).", "",
              "| model | image | tokens | max abs | residual | fp32-fp64 |", "|---|---|---|---|---|---|"]
    lines += [f"| {r['model']} | {r['image']} | {r['tokens']} | {r['max_abs']:.3f} | {r['residual']:.1f} "
              f"| {r['floor']:.2g} |" for r in tower_rows]
    (GOLDEN / "README-encoders.md").write_text("\n".join(lines) + "\n")


def main() -> None:
    torch.set_num_threads(2)
    make_models()
    pre = make_preprocess()
    tower = make_tower()
    make_pixel_values()
    write_readme(pre, tower)


if __name__ == "__main__":
    main()
