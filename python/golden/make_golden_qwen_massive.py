#!/usr/bin/env python3
"""Golden Qwen towers with planted massive activations (deterministic, seed 0).

Run with the developer venv (torch, transformers, pillow), no network:

    .venv-dev/bin/python python/golden/make_golden_qwen_massive.py

For each Qwen family it takes the family's tiny golden config (Qwen3-VL
tiny-a, Qwen2.5-VL tiny-q25, Qwen2-VL tiny-q2), builds it with the same
seeded random weights as `make_golden.py` / `make_golden_qwen2.py`, plants
massive activations and saves it in bf16 twice:

- `<base>-massive32k`: the stream holds about 45,056 and -38,912 in two channels,
  under fp16's 65,504, but the MLP down projection (a Linear the builders
  emit as a 1x1 conv) that writes them outputs past 32,752, where ANEForge
  measured the Neural Engine's matmul and conv outputs to saturate
  (github.com/sbryngelson/ANEForge, docs/numeric-cliffs.md, "Matmul output
  saturation"). An idealised fp16 machine accepts it, the ANE does not.
- `<base>-massive`: about 98,304 and -81,920, past fp16's 65,504.

How they are planted (`plant`): as trained towers have them, a few
channels, written by one block's MLP and then carried by the residual
stream, nearly constant over tokens and images, and gone again in a later
block (Sun et al., "Massive Activations in Large Language Models", arXiv
2402.17762: they appear abruptly in one early layer, stay constant, act as
biases, and vanish in the last layers). Block `plant`'s MLP writes them
from 16 hidden units that read nothing and hold a constant (a bias-driven
plant), so every token of every image carries them (the gate's golden and
stress images included); block `erase`'s MLP removes them with the same
units and the negated weights, before any deepstack tap or the merger reads
the stream, so the tower's outputs still depend on the image (a LayerNorm
dominated by two channels would flatten every token). Every other writer of
those channels (patch embedding, position table, attention and MLP output
rows) is zeroed up to `erase`, so the channels go 0, V, 0 exactly in any
arithmetic that rounds symmetrically (fp16 included, scaled by a power of
two or not): all the information the stream loses to fp16 next to V is in
channels that hold none. Every weight stays a finite fp16 value (the down
projection's largest about 2,100).

It rewrites, and touches nothing else of golden/:

- golden/models/<base>-massive32k, <base>-massive: the checkpoints (bf16,
  `save_pretrained`, the base's processor config; the patch-14 families
  also the tiny VLM's tokenizer, as their bases).
- golden/tower/<model>/<case>.safetensors: the tower outputs in fp32 (sdpa)
  of the checkpoint reloaded from disk, in the formats and under the case
  names of the bases' own goldens (without `large`, to keep them small):
  Qwen3-VL `embeds`, `deepstack.<i>`, `grid_thw` and the preprocess stems
  in metadata `images`; the patch-14 families `levels`, `grid_thw`, `embeds`.
- golden/README-qwen-massive.md: what was made and what was measured with
  forward hooks on every golden image (and golden/images-stress/ when it
  exists): the largest |value| of the stream and of the down projections.
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
from safetensors import safe_open
from transformers import Qwen3VLConfig, Qwen3VLForConditionalGeneration
from transformers.models.qwen2_vl.image_processing_qwen2_vl import Qwen2VLImageProcessor

sys.path.insert(0, str(Path(__file__).resolve().parent))
import make_golden as q3  # noqa: E402  (Qwen3-VL: tiny-a's config, seeds, pixel formula)
import make_golden_qwen2 as q2  # noqa: E402  (Qwen2.5-VL, Qwen2-VL: tiny-q25, tiny-q2)
from make_golden import save_file  # noqa: E402  (the byte-deterministic writer)

GOLDEN = q3.GOLDEN
FP16_MAX = 65504.0
# ANEForge docs/numeric-cliffs.md: matmul / conv outputs saturate near half of fp16's maximum.
ANE_MATMUL_MAX = 32752.0
IMAGE_EXTS = (".png", ".jpg", ".jpeg", ".webp")  # what the gate takes from an image folder

CHANNELS = [5, 17]
# Exact in bf16 and fp16 (at most 4 significant bits), so erasing them is exact too.
LEVELS = {
    "massive32k": [45056.0, -38912.0],  # the stream < 65,504, the down projection > 32,752
    "massive": [98304.0, -81920.0],  # past 65,504
}
# base -> family, the MLP's input projections (name, bias of the planting
# units), its down projection, and the blocks that write and erase the channels.
BASES = {
    "tiny-a": dict(family="qwen3_vl", fc=[("linear_fc1", 3.0)], down="linear_fc2", plant=1, erase=2),
    "tiny-q25": dict(family="qwen2_5_vl", fc=[("gate_proj", 3.0), ("up_proj", 1.0)], down="down_proj",
                     plant=1, erase=2),
    "tiny-q2": dict(family="qwen2_vl", fc=[("fc1", 3.0)], down="fc2", plant=0, erase=2),
}
# The MLP hidden units that write the channels: each reads nothing (a zero
# row) and holds a constant near 3, under the Neural Engine's exp cliffs.
UNITS = list(range(16))
# The bases' tower cases, without `large` (a 4096-patch file of several MB).
Q3_CASES = {k: v for k, v in q3.TOWER_CASES.items() if k != "large"}
Q2_CASES = {k: v for k, v in q2.TOWER_CASES.items() if k != "large"}


def models() -> dict[str, dict]:
    """name -> dict(base, levels, **BASES[base])."""
    return {f"{b}-{suffix}": dict(BASES[b], base=b, levels=v) for b in BASES for suffix, v in LEVELS.items()}


def build(base: str) -> torch.nn.Module:
    """The base golden model with the random weights its own script gives it
    (same seeds, same order), in fp32."""
    fam = BASES[base]["family"]
    if fam == "qwen3_vl":
        spec = q3.MODELS[base]
        torch.manual_seed(q3.SEED)
        cfg = Qwen3VLConfig(vision_config=dict(q3.VISION_COMMON, **spec["vision"]), text_config=dict(q3.TEXT_CONFIG),
                            tie_word_embeddings=True, **q3.TOKEN_IDS)
        model = Qwen3VLForConditionalGeneration(cfg).eval()
        q3.randomise_vision(model.model.visual, spec["seed"])
        return model
    spec = q2.MODELS[base]
    torch.manual_seed(q2.SEED + spec["seed"])
    Cfg, Model = q2.model_classes(fam)
    model = Model(Cfg(vision_config=dict(spec["vision"]), text_config=dict(spec["text"]),
                      tie_word_embeddings=spec["tied"], **q2.TOKEN_IDS)).eval()
    q2.randomise_vision(model.model.visual, spec["seed"])
    with torch.no_grad():  # as make_golden_qwen2.make_models: the decoder's matrices wider than the default
        g = torch.Generator().manual_seed(q2.SEED * 1000 + spec["seed"] + 500)
        for name, p in model.named_parameters():
            if "visual" not in name and p.dim() >= 2:
                p.copy_(0.08 * torch.randn(p.shape, generator=g))
    return model


def zero_rows(linear: torch.nn.Module, channels: list[int]) -> None:
    """`linear` (or conv) writes nothing into `channels`."""
    linear.weight[channels] = 0.0
    if linear.bias is not None:
        linear.bias[channels] = 0.0


@torch.no_grad()
def constant_units(mlp: torch.nn.Module, fc: list[tuple[str, float]], down: str) -> float:
    """Makes hidden units UNITS of `mlp` constant (zero input rows, the
    biases `fc`) and returns the sum of their activations."""
    for name, bias in fc:
        lin = getattr(mlp, name)
        lin.weight[UNITS] = 0.0
        lin.bias[UNITS] = bias
    d = getattr(mlp, down)
    seen = []
    hook = d.register_forward_pre_hook(lambda _m, a: seen.append(a[0][0, UNITS].sum()))
    mlp(torch.zeros(1, d.out_features))
    hook.remove()
    return float(seen[0])


@torch.no_grad()
def plant(visual: torch.nn.Module, m: dict) -> None:
    """Channels CHANNELS of the stream hold 0 up to block `plant`'s MLP,
    whose down projection writes about `levels` into them from the constant
    hidden units UNITS, and block `erase`'s MLP takes them out again with the
    same units and the negated weights. Every other writer of those channels
    before that is zeroed, so the channels are 0, V, then 0 again exactly
    in any arithmetic that rounds symmetrically (the same products negated)."""
    zero_rows(visual.patch_embed.proj, CHANNELS)
    if hasattr(visual, "pos_embed"):
        visual.pos_embed.weight[:, CHANNELS] = 0.0
    for i in range(m["erase"] + 1):
        blk = visual.blocks[i]
        zero_rows(blk.attn.proj, CHANNELS)
        zero_rows(getattr(blk.mlp, m["down"]), CHANNELS)
    for i, sign in ((m["plant"], 1.0), (m["erase"], -1.0)):
        mlp = visual.blocks[i].mlp
        total = constant_units(mlp, m["fc"], m["down"])
        for c, v in zip(CHANNELS, m["levels"]):
            # rounded to bf16 as the checkpoint stores it, the same in both blocks
            getattr(mlp, m["down"]).weight[c, UNITS] = torch.tensor(sign * v / total).to(torch.bfloat16).float()


def save_model(name: str, m: dict) -> int:
    d = GOLDEN / "models" / name
    shutil.rmtree(d, ignore_errors=True)
    model = build(m["base"])
    plant(model.model.visual, m)
    model = model.to(torch.bfloat16)
    model.save_pretrained(d, safe_serialization=True)
    pre = q3.PREPROCESSOR_CONFIG if m["family"] == "qwen3_vl" else q2.PREPROCESSOR_CONFIG
    (d / "preprocessor_config.json").write_text(json.dumps(pre, indent=2) + "\n")
    if m["family"] != "qwen3_vl":
        shutil.copy(q2.TOKENIZER, d / "tokenizer.json")
    with safe_open(d / "model.safetensors", "pt") as f:  # every weight a finite fp16 value
        assert all(float(f.get_tensor(k).float().abs().max()) < FP16_MAX for k in f.keys()), name
    size = (d / "model.safetensors").stat().st_size
    print(f"  model {name}: {size / 1e6:.2f} MB")
    return size


def load_tower(name: str, family: str) -> torch.nn.Module:
    """The tower reloaded from disk in fp32 (sdpa), checked against the stored values."""
    if family == "qwen3_vl":
        return q3.load_tower(GOLDEN / "models" / name, "sdpa")
    return q2.load_tower(GOLDEN / "models" / name, family, "sdpa")


def processor(family: str) -> Qwen2VLImageProcessor:
    return Qwen2VLImageProcessor(**q3.PROCESSOR_KWARGS) if family == "qwen3_vl" else q2.processor()


def check_images() -> list[Path]:
    """The gate's default images (golden/images) and the stress images, when there are any."""
    paths = []
    for d in ("images", "images-stress"):
        if (GOLDEN / d).is_dir():
            paths += sorted(p for p in (GOLDEN / d).iterdir() if p.suffix.lower() in IMAGE_EXTS)
    return paths


class Probe:
    """Forward hooks on a tower: the largest |value| of the residual stream
    (each block's input, after its attention, its output), of the down
    projections' outputs, of every other Linear's output, and of the planted
    channels once block `erase` has taken them out."""

    def __init__(self, visual: torch.nn.Module, down: str, erase: int):
        self.stream = self.down = self.other = self.left = 0.0
        self.handles = []
        last = visual.blocks[erase]
        self.handles.append(last.register_forward_hook(lambda _m, _a, o: self._put("left", o[:, CHANNELS])))
        for blk in visual.blocks:
            self.handles.append(blk.norm1.register_forward_pre_hook(lambda _m, a: self._put("stream", a[0])))
            self.handles.append(blk.norm2.register_forward_pre_hook(lambda _m, a: self._put("stream", a[0])))
            self.handles.append(blk.register_forward_hook(lambda _m, _a, o: self._put("stream", o)))
            self.handles.append(getattr(blk.mlp, down).register_forward_hook(lambda _m, _a, o: self._put("down", o)))
        downs = {id(getattr(b.mlp, down)) for b in visual.blocks}
        for mod in visual.modules():
            if isinstance(mod, torch.nn.Linear) and id(mod) not in downs:
                self.handles.append(mod.register_forward_hook(lambda _m, _a, o: self._put("other", o)))

    def _put(self, key: str, t) -> None:
        t = t[0] if isinstance(t, tuple) else t
        setattr(self, key, max(getattr(self, key), float(t.detach().abs().max())))

    def close(self) -> None:
        for h in self.handles:
            h.remove()


def spread(x: torch.Tensor) -> float:
    """How much the rows of `x` differ: the mean over channels of the
    standard deviation over rows, over the rows' RMS. Near 0 when one
    constant (a norm flattened by massive channels) dominates every row."""
    return float(x.std(0).mean() / x.pow(2).mean().sqrt())


def outputs(visual, pv: torch.Tensor, grid: torch.Tensor) -> list[torch.Tensor]:
    with torch.no_grad():
        out = visual(pv, grid_thw=grid)
    return [out.pooler_output] + list(getattr(out, "deepstack_features", None) or [])


def check_model(name: str, m: dict, images: list[Path]) -> dict:
    """Runs every image through the reloaded tower with the probe and asserts
    the planted values sit where they should; returns the measured extremes."""
    visual = load_tower(name, m["family"])
    proc = processor(m["family"])
    worst = dict(stream=[], down=[], other=0.0, out=0.0, spread=1.0)
    for path in images:
        probe = Probe(visual, m["down"], m["erase"])
        with Image.open(path) as opened:
            b = proc(images=[ImageOps.exif_transpose(opened)], return_tensors="pt")
        outs = outputs(visual, b["pixel_values"].to(torch.float32), b["image_grid_thw"])
        probe.close()
        assert all(bool(torch.isfinite(o).all()) for o in outs), (name, path.name)
        top = max(abs(v) for v in m["levels"])  # bf16 weights: within 1% of it
        assert abs(probe.stream / top - 1) < 0.01 and abs(probe.down / top - 1) < 0.01, (name, path.name)
        assert probe.other < ANE_MATMUL_MAX and probe.left == 0.0, (name, path.name, probe.other, probe.left)
        worst["stream"].append(probe.stream)
        worst["down"].append(probe.down)
        worst["other"] = max(worst["other"], probe.other)
        worst["out"] = max(worst["out"], max(float(o.abs().max()) for o in outs))
        worst["spread"] = min(worst["spread"], min(spread(o) for o in outs))
    lo, hi = (ANE_MATMUL_MAX, FP16_MAX) if m["levels"][0] < FP16_MAX else (FP16_MAX, float("inf"))
    assert all(lo < v < hi for v in worst["stream"] + worst["down"]), (name, lo, hi)
    assert worst["spread"] > 0.1, (name, worst["spread"])
    print(f"  check {name}: {len(images)} images, stream max {max(worst['stream']):.0f}, down max "
          f"{max(worst['down']):.0f}, other Linear max {worst['other']:.1f}, output max {worst['out']:.2f}, "
          f"least row spread {worst['spread']:.2f}")
    return dict(worst, n=len(images))


def q3_case(visual, stems: list[str]) -> tuple[dict, dict]:
    """A Qwen3-VL case as make_golden.make_tower stores it: pixels rebuilt from golden/preprocess levels."""
    levels = [q3_levels(s) for s in stems]
    pv = torch.cat([q3.pixel_values_from_levels(lv) for lv, _ in levels])
    grid = torch.cat([g for _, g in levels]).to(torch.int64)
    emb, ds = q3.run_tower(visual, pv, grid)
    t = {"embeds": emb.contiguous(), "grid_thw": grid.contiguous()}
    t |= {f"deepstack.{i}": x.contiguous() for i, x in enumerate(ds)}
    return t, {"images": ",".join(stems)}


def q3_levels(stem: str):
    with safe_open(GOLDEN / "preprocess" / f"{stem}.safetensors", "pt") as s:
        return s.get_tensor("levels"), s.get_tensor("grid_thw")


def q2_case(visual, images: list[str], max_pixels) -> tuple[dict, dict]:
    """A patch-14 case as make_golden_qwen2.make_tower stores it: the levels with it."""
    parts = [q2.preprocess(i, max_pixels) for i in images]
    levels = torch.cat([torch.from_numpy(q2.levels_of(pv)) for pv, _ in parts])
    grid = torch.cat([g for _, g in parts])
    emb = q2.run_tower(visual, q2.pixel_values_of(levels), grid)
    t = {"levels": levels.contiguous(), "grid_thw": grid.contiguous(), "embeds": emb.contiguous()}
    return t, {"images": ",".join(images), "max_pixels": str(max_pixels or q2.MAX_PIXELS)}


def make_tower(name: str, m: dict) -> list[dict]:
    out = GOLDEN / "tower" / name
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    visual = load_tower(name, m["family"])
    rows = []
    cases = Q3_CASES if m["family"] == "qwen3_vl" else Q2_CASES
    for case, spec in cases.items():
        t, meta = q3_case(visual, spec) if m["family"] == "qwen3_vl" else q2_case(visual, *spec)
        assert all(bool(torch.isfinite(v).all()) for k, v in t.items() if k != "levels" and v.is_floating_point())
        save_file(t, out / f"{case}.safetensors", metadata=meta | {"model": name})
        scale = max(float(v.abs().max()) for k, v in t.items() if k == "embeds" or k.startswith("deepstack"))
        rows.append(dict(model=name, case=case, images=meta["images"], rows=t["embeds"].shape[0], scale=scale))
        print(f"  tower {name} {case}: max |out| {scale:.3f}")
    return rows


def write_readme(checks: dict, sizes: dict, tower_rows: list[dict], images: list[Path]) -> None:
    L = ["# Golden Qwen towers with massive activations", "",
         "Written by `python/golden/make_golden_qwen_massive.py` (`make golden-qwen-massive`); do not edit.", "",
         f"Made with torch {torch.__version__}, transformers {transformers.__version__}, pillow {PIL.__version__}, "
         f"numpy {np.__version__}, python {platform.python_version()}.", "",
         "## Models", "",
         "Each is its base golden model (same config, same seeded random weights; see README.md and "
         "README-qwen2.md) with massive activations planted, stored in bf16. Channels "
         f"{CHANNELS} of the residual stream are exactly 0 up to block `plant`'s MLP, whose down projection writes "
         f"about the levels below into them from hidden units {UNITS[0]}-{UNITS[-1]} (zero input rows, constant "
         "activations from their biases: every token of every image), the stream carries them, and block `erase`'s "
         "MLP takes them out again with the same units and the negated weights, before any deepstack tap or the "
         "merger, leaving exactly 0. Every other writer of those channels is zeroed up to `erase`. `-massive32k`: "
         "the stream stays under fp16's 65,504 but the down projection's output (a 1x1 conv in the artifact) passes "
         "32,752, where the Neural Engine's matmul and conv outputs saturate (ANEForge, docs/numeric-cliffs.md). "
         "`-massive`: past 65,504. Following Sun et al., arXiv 2402.17762 (massive activations appear in one early "
         "layer, stay nearly constant, act as biases, and vanish in late layers).", "",
         "| name | base | family | levels | plant | erase | file size |", "|---|---|---|---|---|---|---|"]
    for name, m in models().items():
        L.append(f"| {name} | {m['base']} | {m['family']} | {m['levels']} | {m['plant']} | {m['erase']} | "
                 f"{sizes[name] / 1e6:.2f} MB |")
    L += ["", "## Measured (forward hooks, fp32, the checkpoints reloaded from disk)", "",
          f"Over {len(images)} images: " + ", ".join(f"`{p.relative_to(GOLDEN)}`" for p in images) + ". "
          "`stream`: the largest |value| of the residual stream (each block's input, after its attention, its "
          "output); `down`: of the down projections' outputs; `other Linear`: of every other Linear's output (qkv, "
          "attention output, fc1 / gate / up, mergers); `outputs`: of the merger and deepstack outputs; `row "
          "spread`: the least, over images and outputs, of the mean over channels of the standard deviation over "
          "rows, over the rows' RMS (near 0 if a flattened norm made every row alike). Asserted: the stream and "
          "down maxima in (32,752, 65,504) for `-massive32k` and above 65,504 for `-massive` on every image, "
          "`other Linear` under 32,752, the planted channels exactly 0 after block `erase`, the outputs finite, "
          "the spread above 0.1.", "",
          "| name | stream (min - max over images) | down (min - max) | other Linear | outputs | row spread |",
          "|---|---|---|---|---|---|"]
    for name, c in checks.items():
        L.append(f"| {name} | {min(c['stream']):.0f} - {max(c['stream']):.0f} | {min(c['down']):.0f} - "
                 f"{max(c['down']):.0f} | {c['other']:.1f} | {c['out']:.2f} | {c['spread']:.2f} |")
    L += ["", "## Tower outputs (`tower/<name>`)", "",
          "fp32, sdpa attention, the checkpoint reloaded from disk, in the bases' formats and case names (not "
          "`large`): Qwen3-VL `embeds`, `deepstack.<i>`, `grid_thw`, the `preprocess/` stems in metadata `images`; "
          "Qwen2.5-VL and Qwen2-VL `levels` (`preprocess-p14` formula), `grid_thw`, `embeds`.", "",
          "| model | case | images | rows | max abs out |", "|---|---|---|---|---|"]
    L += [f"| {r['model']} | {r['case']} | {r['images']} | {r['rows']} | {r['scale']:.3f} |" for r in tower_rows]
    (GOLDEN / "README-qwen-massive.md").write_text("\n".join(L) + "\n")


def main() -> None:
    torch.set_num_threads(2)
    transformers.utils.logging.disable_progress_bar()
    images = check_images()
    sizes, checks, rows = {}, {}, []
    for name, m in models().items():
        sizes[name] = save_model(name, m)
        checks[name] = check_model(name, m, images)
        rows += make_tower(name, m)
    write_readme(checks, sizes, rows, images)


if __name__ == "__main__":
    main()
