#!/usr/bin/env python3
"""Golden data of the Qwen2.5-VL and Qwen2-VL families (deterministic, seed 0).

Run with the developer venv (torch, transformers, pillow), no network:

    .venv-dev/bin/python python/golden/make_golden_qwen2.py

It rewrites, and touches nothing else of golden/:

- golden/models/tiny-q25, golden/models/tiny-q2: tiny random checkpoints of
  each family (bf16, odd sizes: head_dim 20 and 28, widths that are not
  multiples of 8) saved by `save_pretrained`, with the processor config of
  the released checkpoints (patch 14, merge 2, CLIP mean and std).
- golden/preprocess-p14/<stem>.safetensors: transformers' Qwen2-VL image
  processor (torchvision backend, the default) on the lossless golden images
  with that config: `pixel_values` f32 `[n, 1176]` for the small ones,
  `levels` u8 `[n, 588]` (the first temporal frame mapped back to 0..255
  levels) and `grid_thw` for every one.
- golden/tower/tiny-q25/<case>.safetensors, golden/tower/tiny-q2/...: the
  vision tower's output (`model.model.visual(pixel_values, grid_thw=...)`,
  the merger's output) in fp32 from the checkpoint reloaded from disk, for
  pixel values rebuilt from `levels` by the formula in `pixel_values_of`.
  Tensors: `levels` u8 `[n, 588]`, `grid_thw` i64 `[k, 3]`, `embeds` f32
  `[n/4, out]`; metadata `images`, `model`, `max_pixels`.
- golden/lm/tiny-q25-<k>.safetensors, golden/lm/tiny-q2-<k>.safetensors:
  language-model parity (the models' Qwen2 decoders, random weights): the
  prompt ids of the chat template (with its default system turn), the
  image's merged embeddings, every prompt logit and 4 greedy tokens, from
  transformers on the checkpoint reloaded from disk. The models use the
  word-level tokenizer of the golden tiny VLM (golden/tiny-vlm/tokenizer.json).
- golden/README-qwen2.md: what was made, with the noise floors
  measured (sdpa against eager attention, fp32 against fp64).
"""

from __future__ import annotations

import json
import math
import platform
import shutil
import sys
from pathlib import Path

import numpy as np
import PIL
import torch
import transformers
from PIL import Image, ImageOps
from safetensors import safe_open
from transformers import (
    Qwen2_5_VLConfig,
    Qwen2_5_VLForConditionalGeneration,
    Qwen2VLConfig,
    Qwen2VLForConditionalGeneration,
)
from transformers.models.qwen2_vl.image_processing_qwen2_vl import Qwen2VLImageProcessor

sys.path.insert(0, str(Path(__file__).resolve().parent))
from make_golden import save_file  # noqa: E402  (the byte-deterministic writer)

SEED = 0
ROOT = Path(__file__).resolve().parents[2]
GOLDEN = ROOT / "golden"

PATCH = 14
TEMPORAL = 2
MERGE = 2
MEAN = [0.48145466, 0.4578275, 0.40821073]
STD = [0.26862954, 0.26130258, 0.27577711]
MIN_PIXELS = 3136
MAX_PIXELS = 12845056
ROW = 3 * PATCH * PATCH

# The released Qwen2.5-VL / Qwen2-VL preprocessor_config.json.
PREPROCESSOR_CONFIG = {
    "patch_size": PATCH,
    "temporal_patch_size": TEMPORAL,
    "merge_size": MERGE,
    "image_mean": MEAN,
    "image_std": STD,
    "min_pixels": MIN_PIXELS,
    "max_pixels": MAX_PIXELS,
    "resample": 3,
    "do_rescale": True,
    "rescale_factor": 1 / 255,
    "do_normalize": True,
    "do_convert_rgb": True,
    "image_processor_type": "Qwen2VLImageProcessor",
}

# The golden tiny VLM's word-level tokenizer and its special tokens' ids.
TOKENIZER = GOLDEN / "tiny-vlm" / "tokenizer.json"
TOKEN_IDS = dict(image_token_id=5, video_token_id=6, vision_start_token_id=3, vision_end_token_id=4)
SYSTEM = "You are a helpful assistant."


def text_config(hidden: int, mrope: list[int], heads: int, kv: int) -> dict:
    return dict(
        vocab_size=128, bos_token_id=0, eos_token_id=2, pad_token_id=0, hidden_size=hidden, intermediate_size=48, num_hidden_layers=2,
        num_attention_heads=heads, num_key_value_heads=kv, max_position_embeddings=2048,
        rms_norm_eps=1e-6, hidden_act="silu",
        rope_parameters={"rope_type": "default", "rope_theta": 1000000.0, "mrope_section": mrope},
    )


MODELS = {
    # Qwen2.5-VL: window 112 px (8 x 8 patches), full attention in blocks 1 and 3.
    "tiny-q25": dict(
        family="qwen2_5_vl", seed=25, tied=True,
        vision=dict(depth=4, hidden_size=60, num_heads=3, intermediate_size=90, out_hidden_size=44,
                    patch_size=PATCH, temporal_patch_size=TEMPORAL, spatial_merge_size=MERGE, in_channels=3,
                    window_size=112, fullatt_block_indexes=[1, 3], hidden_act="silu"),
        text=text_config(44, [3, 4, 4], 2, 1),
    ),
    # Qwen2-VL: embed_dim 84 (head_dim 28), MLP 84 * 3 = 252, output 52.
    "tiny-q2": dict(
        family="qwen2_vl", seed=2, tied=False,
        vision=dict(depth=3, embed_dim=84, hidden_size=52, num_heads=3, mlp_ratio=3,
                    patch_size=PATCH, temporal_patch_size=TEMPORAL, spatial_merge_size=MERGE, in_channels=3,
                    hidden_act="quick_gelu"),
        text=text_config(52, [4, 4, 5], 2, 2),
    ),
}

# case -> (images, max_pixels for the processor or None for the config's)
TOWER_CASES = {
    "square": (["square.png"], None),  # 11 x 11 merge units: windows of 4, 4 and an edge of 3
    "tall": (["tall.png"], None),
    "wide": (["wide.jpg"], None),
    "multi": (["square.png", "tiny.png", "tall.png"], None),  # windows never cross images
    "large": (["large.jpg"], 4096 * PATCH * PATCH),  # a grid near 4096 patches
}
# Lossless images whose preprocessing is compared; the first ones also with pixel_values.
PRE_IMAGES = ["tiny.png", "la.png", "rgb16.png", "palette.png", "gray16.png", "rgba.png",
              "square.png", "tall.png", "extreme.png", "lossless.webp"]
PRE_WITH_PIXELS = 5


def processor(max_pixels: int | None = None) -> Qwen2VLImageProcessor:
    return Qwen2VLImageProcessor(
        patch_size=PATCH, temporal_patch_size=TEMPORAL, merge_size=MERGE, image_mean=MEAN, image_std=STD,
        size={"shortest_edge": MIN_PIXELS, "longest_edge": max_pixels or MAX_PIXELS}, resample=3,
        do_rescale=True, rescale_factor=1 / 255, do_normalize=True, do_convert_rgb=True)


def open_image(name: str) -> Image.Image:
    img = Image.open(GOLDEN / "images" / name)
    return ImageOps.exif_transpose(img)


def levels_of(pv: torch.Tensor) -> np.ndarray:
    """The processor's pixel_values mapped back to 0..255 levels, first temporal frame, (c, py, px)."""
    n = pv.shape[0]
    x = pv.reshape(n, 3, TEMPORAL, PATCH, PATCH)
    assert torch.equal(x[:, :, 0], x[:, :, 1]), "still images repeat the frame"
    mean = torch.tensor(MEAN).view(1, 3, 1, 1)
    std = torch.tensor(STD).view(1, 3, 1, 1)
    v = (x[:, :, 0].double() * std.double() + mean.double()) * 255.0
    lv = v.round()
    assert float((v - lv).abs().max()) < 1e-3, "pixel_values are not normalised levels"
    return lv.clamp(0, 255).to(torch.uint8).reshape(n, ROW).numpy()


def pixel_values_of(levels: torch.Tensor) -> torch.Tensor:
    """The exact fp32 formula the tower goldens feed the tower: x = (levels / 255 - mean) / std
    per channel, the frame repeated over t. The Rust tests rebuild it the same way."""
    n = levels.shape[0]
    x = levels.to(torch.float32).reshape(n, 3, PATCH * PATCH) / 255.0
    x = (x - torch.tensor(MEAN, dtype=torch.float32).view(1, 3, 1)) / torch.tensor(STD, dtype=torch.float32).view(1, 3, 1)
    x = x.reshape(n, 3, 1, PATCH, PATCH).repeat(1, 1, TEMPORAL, 1, 1)
    return x.reshape(n, 3 * TEMPORAL * PATCH * PATCH).contiguous()


def preprocess(name: str, max_pixels: int | None = None):
    out = processor(max_pixels)(images=[open_image(name)], return_tensors="pt")
    return out["pixel_values"].to(torch.float32), out["image_grid_thw"].to(torch.int64)


def make_preprocess(out_dir: Path) -> list[dict]:
    out_dir.mkdir(parents=True)
    rows = []
    for k, name in enumerate(PRE_IMAGES):
        pv, grid = preprocess(name)
        tensors = {"levels": torch.from_numpy(levels_of(pv)), "grid_thw": grid.contiguous()}
        if k < PRE_WITH_PIXELS:
            tensors["pixel_values"] = pv.contiguous()
        save_file(tensors, out_dir / f"{Path(name).stem}.safetensors",
                  metadata={"image": name, "has_pixel_values": str(k < PRE_WITH_PIXELS)})
        g = grid[0].tolist()
        rows.append(dict(image=name, grid=g, n=pv.shape[0], pixels=k < PRE_WITH_PIXELS))
        print(f"  preprocess {name}: grid {g}")
    return rows


def randomise_vision(visual: torch.nn.Module, seed: int) -> None:
    """Every vision parameter gets a seeded random value; none is trivially 0 or 1."""
    g = torch.Generator().manual_seed(SEED * 1000 + seed)
    with torch.no_grad():
        for name, p in visual.named_parameters():
            shape = p.shape
            is_norm = p.dim() == 1 and ("norm" in name or "ln_q" in name)
            if is_norm and name.endswith("weight"):
                v = 1.0 + 0.1 * torch.randn(shape, generator=g)
            elif name.endswith("bias"):
                v = 0.05 * torch.randn(shape, generator=g)
            elif name.startswith("patch_embed"):
                v = 0.05 * torch.randn(shape, generator=g)
            else:
                std = min(0.1, max(0.05, 1.0 / math.sqrt(shape[1])))
                v = std * torch.randn(shape, generator=g)
            p.copy_(v.to(p.dtype))


def model_classes(family: str):
    if family == "qwen2_5_vl":
        return Qwen2_5_VLConfig, Qwen2_5_VLForConditionalGeneration
    return Qwen2VLConfig, Qwen2VLForConditionalGeneration


def make_models(out_dir: Path) -> dict:
    info = {}
    for mname, spec in MODELS.items():
        d = out_dir / mname
        if d.exists():
            shutil.rmtree(d)
        torch.manual_seed(SEED + spec["seed"])
        Cfg, Model = model_classes(spec["family"])
        cfg = Cfg(vision_config=dict(spec["vision"]), text_config=dict(spec["text"]),
                  tie_word_embeddings=spec["tied"], **TOKEN_IDS)
        model = Model(cfg).eval()
        randomise_vision(model.model.visual, spec["seed"])
        with torch.no_grad():  # the decoder's matrices wider than the default init, so logits are not flat
            g = torch.Generator().manual_seed(SEED * 1000 + spec["seed"] + 500)
            for name, p in model.named_parameters():
                if "visual" not in name and p.dim() >= 2:
                    p.copy_(0.08 * torch.randn(p.shape, generator=g))
        model = model.to(torch.bfloat16)
        model.save_pretrained(d, safe_serialization=True)
        shutil.copy(TOKENIZER, d / "tokenizer.json")
        (d / "preprocessor_config.json").write_text(json.dumps(PREPROCESSOR_CONFIG, indent=2) + "\n")
        with safe_open(d / "model.safetensors", "pt") as f:
            keys = sorted(f.keys())
        size = (d / "model.safetensors").stat().st_size
        info[mname] = dict(keys=keys, size=size)
        print(f"  model {mname}: {len(keys)} tensors, {size / 1e6:.2f} MB")
    return info


def load_tower(model_dir: Path, family: str, attn: str) -> torch.nn.Module:
    """The vision tower of the checkpoint reloaded from disk, upcast exactly to fp32."""
    _, Model = model_classes(family)
    model, info = Model.from_pretrained(model_dir, dtype=torch.float32, attn_implementation=attn,
                                        output_loading_info=True)
    bad = {k: v for k, v in info.items() if v and k in ("missing_keys", "unexpected_keys", "mismatched_keys")}
    assert not bad, bad
    visual = model.model.visual.eval()
    with safe_open(model_dir / "model.safetensors", "pt") as f:
        keys = set(f.keys())
        for name, p in visual.named_parameters():
            # These families' checkpoints keep the tower under `visual.` (the released layout).
            stored = f.get_tensor(next(k for k in ("visual." + name, "model.visual." + name) if k in keys))
            assert torch.equal(p, stored.to(torch.float32)), name
    return visual


def run_tower(visual, pv, grid) -> torch.Tensor:
    with torch.no_grad():
        out = visual(pv, grid_thw=grid)
    return out.pooler_output if hasattr(out, "pooler_output") else out


def make_tower(model_dir: Path, out_root: Path) -> list[dict]:
    rows = []
    for mname, spec in MODELS.items():
        out_dir = out_root / mname
        if out_dir.exists():
            shutil.rmtree(out_dir)
        out_dir.mkdir(parents=True)
        visual = load_tower(model_dir / mname, spec["family"], "sdpa")
        eager = load_tower(model_dir / mname, spec["family"], "eager")
        v64 = load_tower(model_dir / mname, spec["family"], "sdpa").double()
        out_w = spec["vision"].get("out_hidden_size", spec["vision"]["hidden_size"])
        for case, (images, max_pixels) in TOWER_CASES.items():
            parts = [preprocess(i, max_pixels) for i in images]
            levels = torch.cat([torch.from_numpy(levels_of(pv)) for pv, _ in parts])
            grid = torch.cat([g for _, g in parts])
            pv = pixel_values_of(levels)
            ref = torch.cat([p for p, _ in parts])
            assert float((pv - ref).abs().max()) < 1e-5, "pixel_values_of reproduces the processor"
            n = pv.shape[0]
            emb = run_tower(visual, pv, grid)
            assert emb.dtype == torch.float32 and emb.shape == (n // 4, out_w), emb.shape
            d_eager = float((emb - run_tower(eager, pv, grid)).abs().max())
            d_64 = float((emb.double() - run_tower(v64, pv.double(), grid)).abs().max())
            d_sep = None
            if len(images) > 1:
                sep = []
                s = 0
                for _, g in parts:
                    k = int(g.prod())
                    sep.append(run_tower(visual, pv[s:s + k], g))
                    s += k
                d_sep = float((emb - torch.cat(sep)).abs().max())
                assert d_sep < 1e-5, d_sep
            save_file({"levels": levels.contiguous(), "grid_thw": grid.contiguous(), "embeds": emb.contiguous()},
                      out_dir / f"{case}.safetensors",
                      metadata={"images": ",".join(images), "model": mname,
                                "max_pixels": str(max_pixels or MAX_PIXELS)})
            scale = float(emb.abs().max())
            rows.append(dict(model=mname, case=case, images=",".join(images), grid=grid.tolist(), n=n,
                             scale=scale, d_eager=d_eager, d_64=d_64, d_sep=d_sep))
            print(f"  tower {mname} {case:6s} n={n:5d} max|out|={scale:.3f} "
                  f"sdpa-eager={d_eager:.2e} fp32-fp64={d_64:.2e}")
    return rows


def prompt_ids(tok, n_image_tokens: int, question: str) -> list[int]:
    """The released Qwen2-VL / Qwen2.5-VL chat template for one image and one question, with its
    default system turn and the generation prompt."""
    text = (f"<|im_start|>system\n{SYSTEM}<|im_end|>\n<|im_start|>user\n<|vision_start|>"
            + "<|image_pad|>" * n_image_tokens + "<|vision_end|>" + question + "<|im_end|>\n<|im_start|>assistant\n")
    return tok.encode(text, add_special_tokens=False).ids


LM_CASES = [("test-0000.png", "what is the color of the shape?"),
            ("canvas-06-640x640.png", "what color is the shape in the top left?")]


@torch.no_grad()
def make_lm(model_dir: Path, out_dir: Path) -> list[dict]:
    from tokenizers import Tokenizer

    out_dir.mkdir(parents=True, exist_ok=True)
    rows = []
    for mname, spec in MODELS.items():
        _, Model = model_classes(spec["family"])
        model = Model.from_pretrained(model_dir / mname, dtype=torch.float32, attn_implementation="sdpa").eval()
        tok = Tokenizer.from_file(str(model_dir / mname / "tokenizer.json"))
        for k, (image, question) in enumerate(LM_CASES):
            img = Image.open(GOLDEN / "vqa" / "images" / image).convert("RGB")
            out = processor()(images=[img], return_tensors="pt")
            pv, grid = out["pixel_values"], out["image_grid_thw"]
            n = int(grid.prod()) // (MERGE * MERGE)
            ids = torch.tensor([prompt_ids(tok, n, question)])
            inputs = dict(input_ids=ids, attention_mask=torch.ones_like(ids), pixel_values=pv, image_grid_thw=grid,
                          mm_token_type_ids=(ids == TOKEN_IDS["image_token_id"]).to(torch.int32))
            embeds = model.model.get_image_features(pv, grid).pooler_output[0]
            logits = model(**inputs).logits[0]
            gen = model.generate(**inputs, max_new_tokens=4, do_sample=False)[0, ids.shape[1]:]
            save_file({"input_ids": ids[0].contiguous(), "grid_thw": grid.contiguous(),
                       "embeds": embeds.contiguous(), "logits": logits.contiguous(), "generated": gen.contiguous()},
                      out_dir / f"{mname}-{k}.safetensors", metadata={"question": question, "model": mname,
                                                                       "image": image})
            rows.append(dict(model=mname, k=k, image=image, tokens=ids.shape[1], generated=gen.tolist()))
            print(f"  lm {mname}-{k}: {ids.shape[1]} prompt tokens, generated {gen.tolist()}")
    return rows


def write_readme(pre_rows, info, tower_rows) -> None:
    L = ["# Golden data of the Qwen2.5-VL and Qwen2-VL families", "",
         "Written by `python/golden/make_golden_qwen2.py` (`make golden-qwen2`); do not edit.", "",
         f"Made with torch {torch.__version__}, transformers {transformers.__version__}, "
         f"pillow {PIL.__version__}, numpy {np.__version__}, python {platform.python_version()}.", "",
         "## Models", "",
         "| name | family | vision | text | file size |", "|---|---|---|---|---|"]
    for m, spec in MODELS.items():
        L.append(f"| {m} | {spec['family']} | {json.dumps(spec['vision'])} | "
                 f"{json.dumps({k: spec['text'][k] for k in ('hidden_size', 'num_hidden_layers', 'num_attention_heads', 'num_key_value_heads', 'rope_parameters')})}, "
                 f"tied {spec['tied']} | {info[m]['size'] / 1e6:.2f} MB |")
    L += ["", "All weights bf16; decoder matrices N(0, 0.08); vision parameters seeded random (norm weights 1 + 0.1 N(0,1), biases 0.05 N(0,1), "
          "linear weights N(0, s), s = clamp(1/sqrt(fan_in), 0.05, 0.1)).", "",
          "## Preprocessing (`preprocess-p14/`)", "",
          "Processor: patch 14, temporal 2, merge 2 (factor 28), CLIP mean and std, min_pixels 3136, "
          "max_pixels 12845056, bicubic; torchvision backend.", "",
          "| image | grid | patches | pixel_values stored |", "|---|---|---|---|"]
    for r in pre_rows:
        L.append(f"| {r['image']} | {r['grid']} | {r['n']} | {'yes' if r['pixels'] else 'no (levels only)'} |")
    L += ["", "## Tower outputs (`tower/tiny-q25`, `tower/tiny-q2`)", "",
          "fp32, sdpa attention. `pixel_values` = `(levels / 255 - mean) / std` per channel in fp32, the frame "
          "repeated over t (within 1e-5 of the processor's). Noise floors: the largest |difference| of the "
          "outputs from eager attention and from an fp64 run of the same weights; `vs separate` compares one "
          "call of several images with one call per image.", "",
          "| model | case | images | grid_thw | patches | max abs out | sdpa-eager | fp32-fp64 | vs separate |",
          "|---|---|---|---|---|---|---|---|---|"]
    for r in tower_rows:
        sep = "-" if r["d_sep"] is None else f"{r['d_sep']:.1e}"
        L.append(f"| {r['model']} | {r['case']} | {r['images']} | {r['grid']} | {r['n']} | {r['scale']:.3f} | "
                 f"{r['d_eager']:.1e} | {r['d_64']:.1e} | {sep} |")
    L += ["", "## Language-model parity (`lm/tiny-q25-*`, `lm/tiny-q2-*`)", "",
          "The prompt is the released chat template's rendering (system turn `" + SYSTEM + "`, then the user turn "
          "with the image and the question, then the assistant prompt), encoded by the tiny VLM's tokenizer. "
          "Tensors: `input_ids`, `grid_thw`, `embeds` (the tower's merged output), `logits` `[len, 128]` (fp32, "
          "sdpa), `generated` (4 greedy tokens). Images and questions from `golden/vqa`."]
    (GOLDEN / "README-qwen2.md").write_text("\n".join(L) + "\n")


def main() -> None:
    torch.set_num_threads(2)
    pre_dir = GOLDEN / "preprocess-p14"
    if pre_dir.exists():
        shutil.rmtree(pre_dir)
    print("preprocess")
    pre_rows = make_preprocess(pre_dir)
    print("models")
    info = make_models(GOLDEN / "models")
    print("tower")
    tower_rows = make_tower(GOLDEN / "models", GOLDEN / "tower")
    print("lm")
    make_lm(GOLDEN / "models", GOLDEN / "lm")
    write_readme(pre_rows, info, tower_rows)


if __name__ == "__main__":
    main()
