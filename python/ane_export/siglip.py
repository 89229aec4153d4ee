"""The SigLIP vision tower as a static-shape MIL program in the ANE layout.

Rust rewrites the checkpoint's weights into this layout and passes them as
numpy arrays (see the Rust `export::siglip::layout`); this module only
assembles ops from `vit`'s layers (see its docstring for the ANE rules they
keep). The program is emitted in fp16: fp32 inputs cast once on entry,
outputs cast back to fp32.

The tower (transformers' `SiglipVisionTransformer`): patch embedding with
bias, the position rows added (an input: the host resamples the
checkpoint's table to the bucket's grid; no class token), `depth` pre-norm blocks
(LayerNorm, attention without rotary, LayerNorm, MLP fc1 - `hidden_act`
(tanh GELU) - fc2), `post_layernorm` over every token: `last_hidden_state`.
With the head: a learned probe attends over the tokens (one query, per head,
R3), the output projection, then `h + mlp(layernorm(h))`: `pooler_output`.

A bucket is one image of exactly N patches (a square resolution), so the
sequence has no padding and attention no mask.

With `residual_scale` S in the spec (`build --residual-scale`), the program
carries the residual stream divided by S, so that massive activations stay
within fp16 (`residual_scaled`): the patch embedding and every block's
attention output projection and MLP down projection are divided by S
(exact for a power of two, away from fp16's subnormals), and the position
rows are multiplied by 1/S on entry. LayerNorm gives the same result for
x / S (its epsilon then weighs S^2 times more against the variance), and
`post_layernorm` comes before both outputs, so nothing is scaled back.

Inputs of a bucket of N patches:
  patches   [1, 3*P*P, 1, N]  normalised patch rows in raster order, (c, py, px)
  positions [1, D, 1, N]      position rows of the bucket's grid
Outputs: last_hidden_state [1, D, 1, N], pooler_output [1, D, 1, 1] (with the head).
"""

import numpy as np

from . import emit, vit
from .vit import (
    QUERY_CHUNK,
    _activation,
    _conv,
    _f16,
    _layer_norm,
    _mask_chunks,
    block,
    fc_mlp_of,
    layer_norm_of,
    query_chunks,
)

__all__ = ["QUERY_CHUNK", "build_program", "describe", "input_shapes", "output_names", "save_packages"]


def describe(spec, patches):
    """What each input and output of a bucket's function holds (shown in Xcode)."""
    n, d = int(patches), spec["hidden_size"]
    out = {
        "patches": f"[1, {spec['patch_dim']}, 1, {n}] normalised patch rows in raster order, (c, py, px) per "
                   "channel; one image of exactly this many patches",
        "positions": f"[1, {d}, 1, {n}] position rows of this bucket's grid (the checkpoint's table, resampled "
                     "by the host for other sides than its image_size)",
        "last_hidden_state": f"[1, {d}, 1, {n}] every token after post_layernorm",
    }
    if spec.get("use_head"):
        out["pooler_output"] = f"[1, {d}, 1, 1] the attention-pooling head's output"
    return out


def residual_scaled(weights, spec):
    """`vit.residual_scaled` for SigLIP's and SigLIP2's programs, whose
    stream starts at the patch embedding."""
    return vit.residual_scaled(weights, spec, ["patch_embed.weight", "patch_embed.bias"])


def _pool(mb, x, w, spec, n, eps, mask=None):
    """The attention-pooling head over x [1, D, 1, N]: the probe's query
    against every token's key and value, per head (`mask` [1, 1, N], when
    given, added to the scores: SigLIP2's pad keys), then out_proj and
    `h + mlp(layernorm(h))`: [1, D, 1, 1]."""
    d, heads = spec["hidden_size"], spec["num_heads"]
    hd = d // heads
    q = _conv(mb, mb.const(val=w["head.probe"], name="head_probe"), w["head.attn.q.weight"],
              w["head.attn.q.bias"], "head_q")  # (1, D, 1, 1)
    kv = _conv(mb, x, w["head.attn.kv.weight"], w["head.attn.kv.bias"], "head_kv")  # (1, 2D, 1, N)
    scale = _f16(hd ** -0.5)
    outs = []
    for h in range(heads):  # R3: one attention per head
        t = f"head_h{h}"
        qh = mb.reshape(x=mb.slice_by_index(x=q, begin=[0, h * hd, 0, 0], end=[1, (h + 1) * hd, 1, 1],
                                            name=f"{t}_q"), shape=[1, hd, 1], name=f"{t}_q3")
        kh = mb.reshape(x=mb.slice_by_index(x=kv, begin=[0, h * hd, 0, 0], end=[1, (h + 1) * hd, 1, n],
                                            name=f"{t}_k"), shape=[1, hd, n], name=f"{t}_k3")
        vh = mb.reshape(x=mb.slice_by_index(x=kv, begin=[0, d + h * hd, 0, 0], end=[1, d + (h + 1) * hd, 1, n],
                                            name=f"{t}_v"), shape=[1, hd, n], name=f"{t}_v3")
        s = mb.matmul(x=qh, y=kh, transpose_x=True, name=f"{t}_scores")  # (1, 1, N)
        s = mb.mul(x=s, y=scale, name=f"{t}_scaled")
        if mask is not None:
            s = mb.add(x=s, y=mask, name=f"{t}_masked")
        a = mb.softmax(x=s, axis=-1, name=f"{t}_probs")
        o = mb.matmul(x=vh, y=a, transpose_y=True, name=f"{t}_ctx")  # (1, hd, 1)
        outs.append(mb.reshape(x=o, shape=[1, hd, 1, 1], name=f"{t}_out"))
    o = mb.concat(values=outs, axis=1, name="head_heads")
    h = _conv(mb, o, w["head.attn.proj.weight"], w["head.attn.proj.bias"], "head_proj")
    m = _layer_norm(mb, h, w["head.norm.weight"], w["head.norm.bias"], "head_norm", eps)
    m = _conv(mb, m, w["head.mlp.fc1.weight"], w["head.mlp.fc1.bias"], "head_fc1")
    m = _activation(mb, m, spec["hidden_act"], "head_act")
    m = _conv(mb, m, w["head.mlp.fc2.weight"], w["head.mlp.fc2.bias"], "head_fc2")
    return mb.add(x=h, y=m, name="head_res")


def build_program(spec, weights, patches, target="macOS15", query_chunk=QUERY_CHUNK, padded=False):
    """A MIL program for one bucket of `patches` patches (one image).

    spec: dict with hidden_size, num_heads, depth, intermediate_size,
    patch_dim (3*P*P), hidden_act, layer_norm_eps, use_head.
    weights: dict of float32 (or float16) arrays in the ANE layout.
    padded: SigLIP2's bucket (`siglip2.py`): a third input, the additive
    `mask [1, N, N]`, which every block's attention adds and whose first row
    the pooling head adds.
    """
    import coremltools as ct
    from coremltools.converters.mil import Builder as mb

    n = int(patches)
    if n <= 0:
        raise ValueError(f"bucket of {n} patches: expected a positive count")
    d, depth, eps = spec["hidden_size"], spec["depth"], spec["layer_norm_eps"]
    weights, scale = residual_scaled(weights, spec)
    w = emit.to_fp16(weights)
    norm = layer_norm_of(w, eps)

    mlp = fc_mlp_of(w, spec["hidden_act"])

    def tower(patches, positions, mask):
        patches = mb.cast(x=patches, dtype="fp16", name="patches_fp16")
        positions = mb.cast(x=positions, dtype="fp16", name="positions_fp16")
        if mask is not None:
            mask = mb.cast(x=mask, dtype="fp16", name="mask_fp16")
        if scale != 1:
            positions = mb.mul(x=positions, y=np.float16(1.0 / scale), name="positions_scaled")
        x = _conv(mb, patches, w["patch_embed.weight"], w["patch_embed.bias"], "patch_embed")
        x = mb.add(x=x, y=positions, name="positioned")
        chunks = query_chunks(n, query_chunk) if mask is None else _mask_chunks(mb, mask, n, query_chunk)
        for i in range(depth):
            x = block(mb, x, w, i, spec, n, None, None, chunks, norm, mlp)
        x = _layer_norm(mb, x, w["post_norm.weight"], w["post_norm.bias"], "post_norm", eps)
        outs = [mb.cast(x=x, dtype="fp32", name="last_hidden_state")]
        if spec.get("use_head"):
            row = None if mask is None else mb.slice_by_index(x=mask, begin=[0, 0, 0], end=[1, 1, n],
                                                              name="head_mask")
            outs.append(mb.cast(x=_pool(mb, x, w, spec, n, eps, row), dtype="fp32", name="pooler_output"))
        return tuple(outs)

    specs = [mb.TensorSpec(shape=(1, spec["patch_dim"], 1, n)), mb.TensorSpec(shape=(1, d, 1, n))]
    version = getattr(ct.target, target)
    if padded:
        @mb.program(input_specs=specs + [mb.TensorSpec(shape=(1, n, n))], opset_version=version)
        def prog(patches, positions, mask):
            return tower(patches, positions, mask)
    else:
        @mb.program(input_specs=specs, opset_version=version)
        def prog(patches, positions):
            return tower(patches, positions, None)

    return prog


def input_shapes(spec, patches):
    """(name, shape) of each input of a bucket of `patches` patches, in order."""
    n = int(patches)
    return [("patches", [1, spec["patch_dim"], 1, n]), ("positions", [1, spec["hidden_size"], 1, n])]


def output_names(spec):
    """The outputs of every bucket's function, in order."""
    return ["last_hidden_state"] + (["pooler_output"] if spec.get("use_head") else [])


def save_packages(spec, weights, buckets, path, multifunction=True, metadata=None, **kw):
    """Build, convert, compress and save this family's packages (`emit.save_packages`)."""
    import sys

    return emit.save_packages(sys.modules[__name__], spec, weights, buckets, path, multifunction, metadata, **kw)
