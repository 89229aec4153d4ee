"""The CLIP vision tower as a static-shape MIL program in the ANE layout.

Rust rewrites the checkpoint's weights into this layout and passes them as
numpy arrays (see the Rust `export::clip::layout`); this module only
assembles ops from `vit`'s layers (see its docstring for the ANE rules they
keep). The program is emitted in fp16: fp32 inputs cast once on entry,
outputs cast back to fp32.

The tower (transformers' `CLIPVisionTransformer`): patch embedding without
bias, the class embedding prepended, the position rows added (an input: the
host resamples the checkpoint's table to the bucket's grid), `pre_layrnorm`,
`depth` pre-norm blocks (LayerNorm, attention without rotary, LayerNorm, MLP
fc1 - `hidden_act` (quick GELU) - fc2); `last_hidden_state` is the blocks'
output; `pooler_output` the class token after `post_layernorm`;
`image_embeds` its projection, when the checkpoint has one.

A bucket is one image of exactly N patches (a square resolution), so the
sequence of N + 1 tokens has no padding and attention no mask.

With `residual_scale` S in the spec (`build --residual-scale`), the stream
is carried divided by S (`vit.residual_scaled`: `pre_layrnorm`'s gamma and
beta, where the stream starts, and every block's output and down
projections). `pooler_output` and `image_embeds` follow `post_layernorm`
and are unchanged; `last_hidden_state` is the stream itself, so it leaves
the program divided by S, and the host multiplies it back in f32 (the
manifest's `host.output_scale`), where values beyond fp16's range are fine.

Inputs of a bucket of N patches:
  patches   [1, 3*P*P, 1, N]  normalised patch rows in raster order, (c, py, px)
  positions [1, D, 1, N+1]    position rows of the class token and the bucket's grid
Outputs: last_hidden_state [1, D, 1, N+1], pooler_output [1, D, 1, 1],
image_embeds [1, projection_dim, 1, 1] (with a projection).
"""

from . import emit
from .vit import QUERY_CHUNK, _conv, _layer_norm, block, fc_mlp_of, layer_norm_of, query_chunks, residual_scaled

__all__ = ["QUERY_CHUNK", "build_program", "describe", "input_shapes", "output_names", "save_packages"]


def describe(spec, patches):
    """What each input and output of a bucket's function holds (shown in Xcode)."""
    n, d = int(patches), spec["hidden_size"]
    out = {
        "patches": f"[1, {spec['patch_dim']}, 1, {n}] normalised patch rows in raster order, (c, py, px) per "
                   "channel; one image of exactly this many patches",
        "positions": f"[1, {d}, 1, {n + 1}] position rows of the class token and this bucket's grid (the "
                     "checkpoint's table, resampled by the host for other sides than its image_size)",
        "last_hidden_state": f"[1, {d}, 1, {n + 1}] the last block's output, class token first (not normalised)"
                             + (f"; divided by {spec['residual_scale']}, which the host multiplies back"
                                if spec.get("residual_scale") else ""),
        "pooler_output": f"[1, {d}, 1, 1] the class token after post_layernorm",
    }
    if spec.get("projection_dim"):
        out["image_embeds"] = f"[1, {spec['projection_dim']}, 1, 1] pooler_output through visual_projection"
    return out


def build_program(spec, weights, patches, target="macOS15", query_chunk=QUERY_CHUNK):
    """A MIL program for one bucket of `patches` patches (one image).

    spec: dict with hidden_size, num_heads, depth, intermediate_size,
    patch_dim (3*P*P), hidden_act, layer_norm_eps, projection_dim (or None).
    weights: dict of float32 (or float16) arrays in the ANE layout.
    """
    import coremltools as ct
    from coremltools.converters.mil import Builder as mb

    n = int(patches)
    if n <= 0:
        raise ValueError(f"bucket of {n} patches: expected a positive count")
    seq = n + 1
    d, depth, eps = spec["hidden_size"], spec["depth"], spec["layer_norm_eps"]
    # The stream starts at pre_layrnorm: its gamma and beta carry the scale.
    weights, scale = residual_scaled(weights, spec, ["pre_norm.weight", "pre_norm.bias"])
    w = emit.to_fp16(weights)
    norm = layer_norm_of(w, eps)

    mlp = fc_mlp_of(w, spec["hidden_act"])

    @mb.program(input_specs=[mb.TensorSpec(shape=(1, spec["patch_dim"], 1, n)),
                             mb.TensorSpec(shape=(1, d, 1, seq))],
                opset_version=getattr(ct.target, target))
    def prog(patches, positions):
        patches = mb.cast(x=patches, dtype="fp16", name="patches_fp16")
        positions = mb.cast(x=positions, dtype="fp16", name="positions_fp16")
        x = _conv(mb, patches, w["patch_embed.weight"], None, "patch_embed")
        cls = mb.const(val=w["embeddings.class"], name="class_embedding")
        x = mb.concat(values=[cls, x], axis=3, name="tokens")
        x = mb.add(x=x, y=positions, name="positioned")
        x = _layer_norm(mb, x, w["pre_norm.weight"], w["pre_norm.bias"], "pre_norm", eps)
        chunks = query_chunks(seq, query_chunk)
        for i in range(depth):
            x = block(mb, x, w, i, spec, seq, None, None, chunks, norm, mlp)
        outs = [mb.cast(x=x, dtype="fp32", name="last_hidden_state")]
        cls = mb.slice_by_index(x=x, begin=[0, 0, 0, 0], end=[1, d, 1, 1], name="class_token")
        pooled = _layer_norm(mb, cls, w["post_norm.weight"], w["post_norm.bias"], "post_norm", eps)
        outs.append(mb.cast(x=pooled, dtype="fp32", name="pooler_output"))
        if spec.get("projection_dim"):
            e = _conv(mb, pooled, w["projection.weight"], None, "projection")
            outs.append(mb.cast(x=e, dtype="fp32", name="image_embeds"))
        return tuple(outs)

    return prog


def input_shapes(spec, patches):
    """(name, shape) of each input of a bucket of `patches` patches, in order."""
    n = int(patches)
    return [("patches", [1, spec["patch_dim"], 1, n]), ("positions", [1, spec["hidden_size"], 1, n + 1])]


def output_names(spec):
    """The outputs of every bucket's function, in order."""
    names = ["last_hidden_state", "pooler_output"]
    if spec.get("projection_dim"):
        names.append("image_embeds")
    return names


def save_packages(spec, weights, buckets, path, multifunction=True, metadata=None, **kw):
    """Build, convert, compress and save this family's packages (`emit.save_packages`)."""
    import sys

    return emit.save_packages(sys.modules[__name__], spec, weights, buckets, path, multifunction, metadata, **kw)
