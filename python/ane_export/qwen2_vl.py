"""The Qwen2-VL vision tower as a static-shape MIL program in the ANE layout.

Rust rewrites the checkpoint's weights into this layout and passes them as
numpy arrays; this module only assembles ops from `vit`'s layers (see its
docstring for the ANE rules they keep). The program is emitted in fp16: fp32
inputs cast once on entry, outputs cast back to fp32.

The tower (transformers' `Qwen2VisionTransformerPretrainedModel`): patch
embedding without bias, `depth` pre-norm blocks (LayerNorm eps 1e-6, 2D
rotary attention, MLP fc1 - `hidden_act` (quick GELU) - fc2), merger
(`ln_q` LayerNorm, 2x2 merge, `mlp.0`, exact GELU, `mlp.2`). No position
table, no deepstack.

Residual-stream scaling (`build --residual-scale S`, `spec["residual_scale"]`):
the program carries the stream divided by a power of two S, so that massive
activations stay within fp16 (`vit.residual_scaled`): the patch embedding
(no bias) and every block's attention output projection and MLP `fc2`
(weight and bias) are divided by S. Every LayerNorm gives the same result
for x / S up to its epsilon, which then weighs S^2 times more (the
measured cost: docs/numerics.md, "The remedy in each family"): take the
smallest S that keeps the stream in range. The merger starts with a norm
(`ln_q`), so `embeds` needs no rescale on the host.

Branch scaling (`build --branch-scale B`): fc1 divided by B, fc2's weight
multiplied by B, quick GELU computed exactly on the scaled values
(`vit.branch_scaled`, `vit.scaled_activation`), as for Qwen3-VL.

Inputs of a bucket of N patches:
  patches [1, 3*P*P, 1, N]  still-image patch rows, (c, py, px), first frame
  cos,sin [1, hd, 1, N]     rotary tables, [row freqs, col freqs] twice
  mask    [1, N, N]         0 where a query may attend a key, -1e4 elsewhere
Output: embeds [1, out, 1, N/4].
"""

from . import emit
from .vit import (
    LN_EPS,
    QUERY_CHUNK,
    _conv,
    _mask_chunks,
    _merger,
    block,
    branch_scaled,
    check_bucket,
    layer_norm_of,
    residual_scaled,
    scaled_activation,
)


def describe(spec, patches):
    """What each input and output of a bucket's function holds (shown in Xcode)."""
    n, d = int(patches), spec["hidden_size"]
    hd = d // spec["num_heads"]
    return {
        "patches": f"[1, {spec['patch_dim']}, 1, {n}] normalised patch rows, one temporal frame, (c, py, px) "
                   "per channel; rows in 2x2 merge-block order; pad rows zero",
        "cos": f"[1, {hd}, 1, {n}] rotary cos of [row freqs, col freqs] twice; 1 on pad rows",
        "sin": f"[1, {hd}, 1, {n}] rotary sin, same layout; 0 on pad rows",
        "mask": f"[1, {n}, {n}] additive attention mask: 0 within one frame of one image, -1e4 elsewhere; "
                "a pad row attends to the first pad slot alone",
        "embeds": f"[1, {spec['out_hidden_size']}, 1, {n // 4}] merged visual tokens for the language model; "
                  "the first real/4 are real",
    }


def build_program(spec, weights, patches, target="macOS15", query_chunk=QUERY_CHUNK):
    """A MIL program for one bucket of `patches` tokens.

    spec: dict with hidden_size (embed_dim), num_heads, depth,
    out_hidden_size, intermediate_size, patch_dim (3*P*P), hidden_act;
    optionally residual_scale (a power of two; absent or 1: unscaled).
    weights: dict of float32 (or float16) arrays in the ANE layout (see the
    Rust `export::qwen2_vl::layout`); the program holds them as fp16 constants.
    """
    import coremltools as ct
    from coremltools.converters.mil import Builder as mb

    n = int(patches)
    check_bucket(n)
    d, depth = spec["hidden_size"], spec["depth"]
    hd = d // spec["num_heads"]
    weights, _ = residual_scaled(weights, spec, ["patch_embed.weight"])
    weights, branch = branch_scaled(weights, spec, "fc1", "fc2")
    w = emit.to_fp16(weights)
    norm = layer_norm_of(w, LN_EPS)

    def mlp(mb, h, i):
        b = f"blocks.{i}.mlp"
        h = _conv(mb, h, w[b + ".fc1.weight"], w[b + ".fc1.bias"], f"b{i}_fc1")
        h = scaled_activation(mb, h, spec["hidden_act"], branch, f"b{i}_act")
        return _conv(mb, h, w[b + ".fc2.weight"], w[b + ".fc2.bias"], f"b{i}_fc2")

    @mb.program(
        input_specs=[
            mb.TensorSpec(shape=(1, spec["patch_dim"], 1, n)),
            mb.TensorSpec(shape=(1, hd, 1, n)),
            mb.TensorSpec(shape=(1, hd, 1, n)),
            mb.TensorSpec(shape=(1, n, n)),
        ],
        opset_version=getattr(ct.target, target),
    )
    def prog(patches, cos, sin, mask):
        patches, cos, sin, mask = (mb.cast(x=v, dtype="fp16", name=f"{v.name}_fp16")
                                   for v in (patches, cos, sin, mask))
        masks = _mask_chunks(mb, mask, n, query_chunk)
        x = _conv(mb, patches, w["patch_embed.weight"], None, "patch_embed")
        for i in range(depth):
            x = block(mb, x, w, i, spec, n, cos, sin, masks, norm, mlp)
        embeds = _merger(mb, x, (w["merger.ln_q.weight"], w["merger.ln_q.bias"]),
                         (w["merger.mlp.0.weight"], w["merger.mlp.0.bias"]),
                         (w["merger.mlp.2.weight"], w["merger.mlp.2.bias"]),
                         "merger", d, n, False, LN_EPS)
        return (mb.cast(x=embeds, dtype="fp32", name="embeds"),)

    return prog


def input_shapes(spec, patches):
    """(name, shape) of each input of a bucket of `patches` patches, in order."""
    n, d = int(patches), spec["hidden_size"]
    hd = d // spec["num_heads"]
    return [("patches", [1, spec["patch_dim"], 1, n]), ("cos", [1, hd, 1, n]), ("sin", [1, hd, 1, n]),
            ("mask", [1, n, n])]


def output_names(spec):
    """The outputs of every bucket's function, in order."""
    return ["embeds"]


def save_packages(spec, weights, buckets, path, multifunction=True, metadata=None, **kw):
    """Build, convert, compress and save this family's packages (`emit.save_packages`)."""
    import sys

    return emit.save_packages(sys.modules[__name__], spec, weights, buckets, path, multifunction, metadata, **kw)
