"""The SigLIP2 vision tower (NaFlex) as a static-shape MIL program in the ANE layout.

Rust rewrites the checkpoint's weights into this layout and passes them as
numpy arrays (see the Rust `export::siglip2::layout`); this module only
assembles ops from `vit`'s layers and SigLIP's pooling head (see `vit`'s
docstring for the ANE rules they keep). The program is emitted in fp16:
fp32 inputs cast once on entry, outputs cast back to fp32.

The tower (transformers' `Siglip2VisionTransformer`) is SigLIP's with a
Linear patch embedding over (py, px, c) rows and a padded sequence: a bucket
is a patch budget; one image's h x w patches fill the first columns, the
rest is padding. Patch embedding with bias, the position rows added (an
input: the host resizes the checkpoint's table to the image's grid; pad
columns hold its first row), `depth` pre-norm blocks whose attention adds the
mask (pad keys -1e4 for every query, R5), `post_layernorm`:
`last_hidden_state`. With the head: the probe attends over the real tokens
(the mask's first row), then `h + mlp(layernorm(h))`: `pooler_output`.

`residual_scale` (`build --residual-scale`) scales the residual stream as
SigLIP's program does (`siglip.residual_scaled`).

Inputs of a bucket of N patches:
  patches   [1, 3*P*P, 1, N]  normalised patch rows, (py, px, c); pad columns 0
  positions [1, D, 1, N]      the table resized to the image's grid
  mask      [1, N, N]         0 where the key is a patch, -1e4 where it is padding
Outputs: last_hidden_state [1, D, 1, N], pooler_output [1, D, 1, 1] (with the head).
"""

from . import emit, siglip
from .vit import QUERY_CHUNK

__all__ = ["QUERY_CHUNK", "build_program", "describe", "input_shapes", "output_names", "save_packages"]


def describe(spec, patches):
    """What each input and output of a bucket's function holds (shown in Xcode)."""
    n, d = int(patches), spec["hidden_size"]
    out = {
        "patches": f"[1, {spec['patch_dim']}, 1, {n}] normalised patch rows in raster order, (py, px, c) per "
                   "channel; one image's patches first, then zero columns",
        "positions": f"[1, {d}, 1, {n}] the position table resized to the image's grid (bilinear, antialiased); "
                     "pad columns repeat the first row",
        "mask": f"[1, {n}, {n}] additive attention mask: 0 where the key is a patch, -1e4 where it is padding",
        "last_hidden_state": f"[1, {d}, 1, {n}] every column after post_layernorm; the image's tokens first",
    }
    if spec.get("use_head"):
        out["pooler_output"] = f"[1, {d}, 1, 1] the attention-pooling head's output over the image's tokens"
    return out


def build_program(spec, weights, patches, target="macOS15", query_chunk=QUERY_CHUNK):
    """A MIL program for one bucket of `patches` slots (one image and its
    padding): SigLIP's program with the `mask` input (`siglip.build_program`,
    `padded=True`).

    spec: dict with hidden_size, num_heads, depth, intermediate_size,
    patch_dim (3*P*P), hidden_act, layer_norm_eps, use_head.
    weights: dict of float32 (or float16) arrays in the ANE layout.
    """
    return siglip.build_program(spec, weights, patches, target, query_chunk, padded=True)


def input_shapes(spec, patches):
    """(name, shape) of each input of a bucket of `patches` slots, in order."""
    n = int(patches)
    return [("patches", [1, spec["patch_dim"], 1, n]), ("positions", [1, spec["hidden_size"], 1, n]),
            ("mask", [1, n, n])]


def output_names(spec):
    """The outputs of every bucket's function, in order."""
    return ["last_hidden_state"] + (["pooler_output"] if spec.get("use_head") else [])


def save_packages(spec, weights, buckets, path, multifunction=True, metadata=None, **kw):
    """Build, convert, compress and save this family's packages (`emit.save_packages`)."""
    import sys

    return emit.save_packages(sys.modules[__name__], spec, weights, buckets, path, multifunction, metadata, **kw)
