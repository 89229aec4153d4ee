"""The DINOv2 tower (with or without registers) as a static-shape MIL program
in the ANE layout.

Rust rewrites the checkpoint's weights into this layout and passes them as
numpy arrays (see the Rust `export::dinov2::layout`); this module only
assembles ops from `vit`'s layers (see its docstring for the ANE rules they
keep). The program is emitted in fp16: fp32 inputs cast once on entry,
outputs cast back to fp32.

The tower (transformers' `Dinov2Model`, `Dinov2WithRegistersModel`): patch
embedding with bias, the class token prepended, the position rows added (an
input: the host resamples the checkpoint's table to the bucket's grid), the
register tokens inserted after the class token, `depth` pre-norm blocks
(LayerNorm, attention without rotary, LayerScale, residual; LayerNorm, MLP
fc1 - `hidden_act` - fc2 or SwiGLU, LayerScale, residual), the final
LayerNorm. `last_hidden_state` is the normalised sequence, `pooler_output`
its class token.

A bucket is one image of exactly N patches (a square resolution), so the
sequence of 1 + R + N tokens has no padding and attention no mask.

With `residual_scale` S in the spec (`build --residual-scale`), the program
carries the residual stream divided by S, so that massive activations stay
within fp16: the patch embedding, the class and register tokens and both
LayerScales are divided by S (exact for a power of two, away from fp16's
subnormals), and the position rows are multiplied by 1/S on entry.
LayerNorm gives the same result for x / S (its epsilon then weighs S^2
times more against the variance), and both outputs come after the final
LayerNorm, so nothing is scaled back.

Inputs of a bucket of N patches:
  patches   [1, 3*P*P, 1, N]  normalised patch rows in raster order, (c, py, px)
  positions [1, D, 1, N+1]    position rows of the class token and the patches
Outputs: last_hidden_state [1, D, 1, 1+R+N], pooler_output [1, D, 1, 1].
"""

import numpy as np

from . import emit
from .vit import (
    QUERY_CHUNK,
    _conv,
    _layer_norm,
    block,
    fc_mlp_of,
    layer_norm_of,
    query_chunks,
    swiglu_mlp_of,
)

__all__ = ["QUERY_CHUNK", "build_program", "describe", "input_shapes", "output_names", "save_packages"]


def describe(spec, patches):
    """What each input and output of a bucket's function holds (shown in Xcode)."""
    n, d, r = int(patches), spec["hidden_size"], spec["registers"]
    return {
        "patches": f"[1, {spec['patch_dim']}, 1, {n}] normalised patch rows in raster order, (c, py, px) per "
                   "channel; one image of exactly this many patches",
        "positions": f"[1, {d}, 1, {n + 1}] position rows of the class token and the patches: the "
                     "checkpoint's table resampled by the host to this bucket's grid",
        "last_hidden_state": f"[1, {d}, 1, {1 + r + n}] the final layernorm's output: class token, {r} "
                             "registers, patches",
        "pooler_output": f"[1, {d}, 1, 1] the class token of last_hidden_state",
    }


def build_program(spec, weights, patches, target="macOS15", query_chunk=QUERY_CHUNK):
    """A MIL program for one bucket of `patches` patches (one image).

    spec: dict with hidden_size, num_heads, depth, mlp_hidden, patch_dim
    (3*P*P), hidden_act, swiglu, registers, layer_norm_eps.
    weights: dict of float32 (or float16) arrays in the ANE layout.
    """
    import coremltools as ct
    from coremltools.converters.mil import Builder as mb

    n = int(patches)
    if n <= 0:
        raise ValueError(f"bucket of {n} patches: expected a positive count")
    d, depth, eps, r = spec["hidden_size"], spec["depth"], spec["layer_norm_eps"], spec["registers"]
    seq = 1 + r + n
    scale = spec.get("residual_scale") or 1
    if scale != 1:
        weights = dict(weights)
        for k in ["patch_embed.weight", "patch_embed.bias", "embeddings.class", "embeddings.registers"] + \
                [f"blocks.{i}.ls{j}" for i in range(depth) for j in (1, 2)]:
            if k in weights:
                weights[k] = weights[k].astype("float32") / scale
    w = emit.to_fp16(weights)
    if r and w["embeddings.registers"].shape != (1, d, 1, r):
        raise ValueError(f"register tokens {w['embeddings.registers'].shape}: expected (1, {d}, 1, {r})")
    norm = layer_norm_of(w, eps)
    mlp = swiglu_mlp_of(w, spec["mlp_hidden"]) if spec["swiglu"] else fc_mlp_of(w, spec["hidden_act"])

    @mb.program(input_specs=[mb.TensorSpec(shape=(1, spec["patch_dim"], 1, n)),
                             mb.TensorSpec(shape=(1, d, 1, n + 1))],
                opset_version=getattr(ct.target, target))
    def prog(patches, positions):
        patches = mb.cast(x=patches, dtype="fp16", name="patches_fp16")
        positions = mb.cast(x=positions, dtype="fp16", name="positions_fp16")
        if scale != 1:
            positions = mb.mul(x=positions, y=np.float16(1.0 / scale), name="positions_scaled")
        x = _conv(mb, patches, w["patch_embed.weight"], w["patch_embed.bias"], "patch_embed")
        cls = mb.const(val=w["embeddings.class"], name="class_token")
        x = mb.concat(values=[cls, x], axis=3, name="tokens")
        x = mb.add(x=x, y=positions, name="positioned")
        if r:
            head = mb.slice_by_index(x=x, begin=[0, 0, 0, 0], end=[1, d, 1, 1], name="positioned_class")
            rest = mb.slice_by_index(x=x, begin=[0, 0, 0, 1], end=[1, d, 1, n + 1], name="positioned_patches")
            regs = mb.const(val=w["embeddings.registers"], name="register_tokens")
            x = mb.concat(values=[head, regs, rest], axis=3, name="with_registers")
        chunks = query_chunks(seq, query_chunk)
        for i in range(depth):
            x = block(mb, x, w, i, spec, seq, None, None, chunks, norm, mlp, layer_scale=True)
        x = _layer_norm(mb, x, w["post_norm.weight"], w["post_norm.bias"], "post_norm", eps)
        cls = mb.slice_by_index(x=x, begin=[0, 0, 0, 0], end=[1, d, 1, 1], name="class_out")
        return (mb.cast(x=x, dtype="fp32", name="last_hidden_state"),
                mb.cast(x=cls, dtype="fp32", name="pooler_output"))

    return prog


def input_shapes(spec, patches):
    """(name, shape) of each input of a bucket of `patches` patches, in order."""
    n = int(patches)
    return [("patches", [1, spec["patch_dim"], 1, n]), ("positions", [1, spec["hidden_size"], 1, n + 1])]


def output_names(spec):
    """The outputs of every bucket's function, in order."""
    return ["last_hidden_state", "pooler_output"]


def save_packages(spec, weights, buckets, path, multifunction=True, metadata=None, **kw):
    """Build, convert, compress and save this family's packages (`emit.save_packages`)."""
    import sys

    return emit.save_packages(sys.modules[__name__], spec, weights, buckets, path, multifunction, metadata, **kw)
