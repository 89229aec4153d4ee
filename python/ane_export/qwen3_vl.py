"""The Qwen3-VL vision tower as a static-shape MIL program in the ANE layout.

Rust rewrites the checkpoint's weights into this layout and passes them as
numpy arrays; this module only assembles ops. Every activation is
(B, C, 1, S) with the sequence last (ANE-RULES R1); every Linear is a 1x1
conv (R2); attention is split per head with K used transposed once through
matmul's transpose flags (R3), in query chunks of at most 512 against all
keys so that no score tensor exceeds 512 x N (R4); LayerNorm runs over the channel axis; the
additive mask uses -1e4, never -inf (R5); the position table, RoPE cos/sin
and the mask are host-computed inputs, and patchify happens on the host
(R8, R10): there is no gather, no control flow and no dynamic shape (R9).

The program is emitted in fp16 (R5): every weight is an fp16 constant and
every op computes in fp16; the inputs are declared fp32 and cast once on
entry, the outputs cast back to fp32, exactly the program coremltools'
`add_fp16_cast` pass would make. Emitting it so lets the conversion skip that
pass and the default pipeline's other rewrites, which find nothing to do in
a program built this way but cost minutes on a 2B tower (`emit.CONVERT_PASSES`).

Residual-stream scaling (`build --residual-scale S`, `spec["residual_scale"]`):
the program carries the stream divided by a power of two S, so that massive
activations stay within fp16 (`vit.residual_scaled`): the patch embedding
(weight and bias) and every block's attention output projection and MLP
`linear_fc2` (weight and bias) are divided by S, and the `pos` input is
multiplied by 1/S in the program (`pos_scaled`) before it joins the stream.
The host's `pos` could carry the scale instead (the host table, divided by
S at build time, interpolates linearly to pos / S exactly), saving that one
elementwise op per call; it is done in the program so that the package's
inputs do not depend on the scale: every host (the runtime, the gates,
`ane-export exec` users' own) feeds a scaled artifact what it feeds an
unscaled one. Every LayerNorm gives the same result for x / S up to its
epsilon, which then weighs S^2 times more (the measured cost:
docs/numerics.md, "The remedy in each family"): take the smallest S that
keeps the stream in range. The merger starts with its LayerNorm and each
deepstack merger merges 4 tokens (a reshape, scale-free) before its own,
so `embeds` and every `deepstack_<j>` need no rescale on the host.

Branch scaling (`build --branch-scale B`, `spec["branch_scale"]`): the
MLP's hidden layer carried divided by B (`vit.branch_scaled`):
linear_fc1 (weight and bias) divided by B, linear_fc2's weight multiplied by
B (and divided by S), and the GELU computed exactly on the scaled values
(`vit.scaled_activation`: the activation of x clipped to [-16, 16], where it
has saturated, plus the part of x beyond, five elementwise ops more per
block). For a tower whose fc1 output leaves the Neural Engine's range
(unsloth-zoo #720 reports one beyond 65,504), which the residual scale
does not reach.

Inputs of a bucket of N patches:
  patches [1, 3*P*P, 1, N]  still-image patch rows, (c, py, px), first frame
  pos     [1, D, 1, N]      interpolated position embedding per token
  cos,sin [1, hd, 1, N]     rotary tables, [row freqs, col freqs] twice
  mask    [1, N, N]         0 where a query may attend a key, -1e4 elsewhere
Outputs: embeds and deepstack_{i}, each [1, out, 1, N/4].
"""

import numpy as np

from . import emit
from .vit import (
    LN_EPS,
    QUERY_CHUNK,
    _conv,
    _mask_chunks,
    block,
    branch_scaled,
    check_bucket,
    layer_norm_of,
    residual_scaled,
    scaled_activation,
)
from .vit import _merger as _vit_merger


def _merger(mb, x, w, prefix, dim, n, postshuffle):
    """Qwen3-VL's merger and deepstack mergers (`<prefix>.norm`, `.linear_fc1`, `.linear_fc2`)."""
    return _vit_merger(mb, x, (w[prefix + ".norm.weight"], w[prefix + ".norm.bias"]),
                       (w[prefix + ".linear_fc1.weight"], w[prefix + ".linear_fc1.bias"]),
                       (w[prefix + ".linear_fc2.weight"], w[prefix + ".linear_fc2.bias"]),
                       prefix, dim, n, postshuffle, LN_EPS)


def describe(spec, patches):
    """What each input and output of a bucket's function holds (shown in Xcode)."""
    n, d = int(patches), spec["hidden_size"]
    hd = d // spec["num_heads"]
    out = spec["out_hidden_size"]
    desc = {
        "patches": f"[1, {spec['patch_dim']}, 1, {n}] normalised patch rows, one temporal frame, (c, py, px) "
                   "per channel; rows in 2x2 merge-block order; pad rows zero",
        "pos": f"[1, {d}, 1, {n}] learned position table interpolated bilinearly (align_corners) per token",
        "cos": f"[1, {hd}, 1, {n}] rotary cos of [row freqs, col freqs] twice; 1 on pad rows",
        "sin": f"[1, {hd}, 1, {n}] rotary sin, same layout; 0 on pad rows",
        "mask": f"[1, {n}, {n}] additive attention mask: 0 within one frame of one image, -1e4 elsewhere; "
                "a pad row attends to the first pad slot alone",
        "embeds": f"[1, {out}, 1, {n // 4}] merged visual tokens for the language model; the first real/4 are real",
    }
    for j, i in enumerate(spec["deepstack_visual_indexes"]):
        desc[f"deepstack_{j}"] = f"[1, {out}, 1, {n // 4}] deepstack features after vision block {i}"
    return desc


def build_program(spec, weights, patches, target="macOS15", query_chunk=QUERY_CHUNK):
    """A MIL program for one bucket of `patches` tokens.

    spec: dict with hidden_size, num_heads, depth, out_hidden_size,
    deepstack_visual_indexes, patch_dim (3*P*P), hidden_act; optionally
    residual_scale (a power of two; absent or 1: unscaled).
    weights: dict of float32 (or float16) arrays in the ANE layout (see the
    Rust `layout`); the program holds them as fp16 constants.
    """
    import coremltools as ct
    from coremltools.converters.mil import Builder as mb

    n = int(patches)
    check_bucket(n)
    d, depth = spec["hidden_size"], spec["depth"]
    hd = d // spec["num_heads"]
    weights, scale = residual_scaled(weights, spec, ["patch_embed.weight", "patch_embed.bias"],
                                     down="mlp.linear_fc2")
    weights, branch = branch_scaled(weights, spec, "linear_fc1", "linear_fc2")
    w = emit.to_fp16(weights)
    norm = layer_norm_of(w, LN_EPS)

    def mlp(mb, h, i):
        b = f"blocks.{i}.mlp"
        h = _conv(mb, h, w[b + ".linear_fc1.weight"], w[b + ".linear_fc1.bias"], f"b{i}_fc1")
        h = scaled_activation(mb, h, spec["hidden_act"], branch, f"b{i}_gelu")
        return _conv(mb, h, w[b + ".linear_fc2.weight"], w[b + ".linear_fc2.bias"], f"b{i}_fc2")

    @mb.program(
        input_specs=[
            mb.TensorSpec(shape=(1, spec["patch_dim"], 1, n)),
            mb.TensorSpec(shape=(1, d, 1, n)),
            mb.TensorSpec(shape=(1, hd, 1, n)),
            mb.TensorSpec(shape=(1, hd, 1, n)),
            mb.TensorSpec(shape=(1, n, n)),
        ],
        opset_version=getattr(ct.target, target),
    )
    def prog(patches, pos, cos, sin, mask):
        patches, pos, cos, sin, mask = (mb.cast(x=v, dtype="fp16", name=f"{v.name}_fp16")
                                        for v in (patches, pos, cos, sin, mask))
        masks = _mask_chunks(mb, mask, n, query_chunk)
        x = _conv(mb, patches, w["patch_embed.weight"], w["patch_embed.bias"], "patch_embed")
        if scale != 1:
            pos = mb.mul(x=pos, y=np.float16(1.0 / scale), name="pos_scaled")
        x = mb.add(x=x, y=pos, name="embed")
        outputs = []
        for i in range(depth):
            x = block(mb, x, w, i, spec, n, cos, sin, masks, norm, mlp)
            if i in spec["deepstack_visual_indexes"]:
                j = spec["deepstack_visual_indexes"].index(i)
                y = _merger(mb, x, w, f"deepstack_merger_list.{j}", d, n, True)
                outputs.append((j, y))
        embeds = _merger(mb, x, w, "merger", d, n, False)
        named = [mb.cast(x=embeds, dtype="fp32", name="embeds")]
        for j, y in sorted(outputs, key=lambda t: t[0]):
            named.append(mb.cast(x=y, dtype="fp32", name=f"deepstack_{j}"))
        return tuple(named)

    return prog


def input_shapes(spec, patches):
    """(name, shape) of each input of a bucket of `patches` patches, in order."""
    n, d = int(patches), spec["hidden_size"]
    hd = d // spec["num_heads"]
    return [("patches", [1, spec["patch_dim"], 1, n]), ("pos", [1, d, 1, n]), ("cos", [1, hd, 1, n]),
            ("sin", [1, hd, 1, n]), ("mask", [1, n, n])]


def output_names(spec):
    """The outputs of every bucket's function, in order."""
    return ["embeds"] + [f"deepstack_{j}" for j in range(len(spec["deepstack_visual_indexes"]))]


def save_packages(spec, weights, buckets, path, multifunction=True, metadata=None, **kw):
    """Build, convert, compress and save this family's packages (`emit.save_packages`)."""
    import sys

    return emit.save_packages(sys.modules[__name__], spec, weights, buckets, path, multifunction, metadata, **kw)
