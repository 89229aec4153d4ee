"""The Qwen2.5-VL vision tower as a static-shape MIL program in the ANE layout.

Rust rewrites the checkpoint's weights into this layout and passes them as
numpy arrays; this module only assembles ops from `vit`'s layers (see its
docstring for the ANE rules they keep). The program is emitted in fp16: fp32
inputs cast once on entry, outputs cast back to fp32.

The tower (transformers' `Qwen2_5_VisionTransformerPretrainedModel`): patch
embedding without bias, `depth` pre-norm blocks (RMSNorm eps 1e-6, 2D
rotary attention, RMSNorm, SwiGLU MLP down(act(gate(x)) * up(x)) with
biases), merger (`ln_q` RMSNorm, 2x2 merge, `mlp.0`, exact GELU, `mlp.2`).

Window attention with static shapes (see the Rust `export::qwen2_5_vl`): the
host lays the sequence out in windows of S slots (S = 64 for window_size
112 and patch 14), real merge units first, pads after. Blocks not in
`fullatt_block_indexes` attend within each window: [N/S, S, S] scores in one
batched matmul per head. The others attend over the whole frame through the
[N, N] mask, in query chunks (R4). The merger's tokens are in slot order; the
runtime keeps the real ones in merge-block order.

Residual-stream scaling (`build --residual-scale S`, `spec["residual_scale"]`):
the program carries the stream divided by a power of two S, so that massive
activations stay within fp16 (`vit.residual_scaled`): the patch embedding
(no bias) and every block's attention output projection and MLP
`down_proj` (weight and bias) are divided by S. Every norm is an RMSNorm,
built as a LayerNorm of [x, -x] (`vit.rms_norm_of`), and gives the same
result for x / S (up to its epsilon, below); the merger starts with one
(`ln_q`), so `embeds` needs no rescale on the host.

Branch scaling (`build --branch-scale B`, `spec["branch_scale"]`): the
SwiGLU product is carried divided by a power of two B as well
(`vit.branch_scaled`). With g = gate(h), u = up(h) and the down
projection (W_d, b_d), the program computes
    u'   = up(h) / B                        (`up_proj` weight and bias / B)
    glu' = silu(g) * u' = silu(g) * u / B
    out  = (W_d * B / S) glu' + b_d / S = (W_d (silu(g) * u) + b_d) / S,
the down projection's contribution at the stream's scale, exact for powers
of two away from fp16's subnormals. The gate projection is not scaled:
silu(g / B) != silu(g) / B.

Epsilon: an RMSNorm of x / S with epsilon eps equals one of x with S^2 eps;
the epsilon (1e-6) is not divided by S^2, since 1e-6 is already below
fp16's normal range and 1e-6 / S^2 is not representable. The effect is
a factor sqrt(v / (v + S^2 eps)), about 1 - S^2 eps / (2 v), on a token's
output (v its mean square, unscaled). On the tiny goldens (real tokens' v from
0.11 up) that is at most 1.8% on the smallest token at S = 64 (3e-3 to
6e-3 relative on the interpreted stream, the gate's lowest cosine moved by
at most 6.4e-5) and under 1e-4 at S = 4 (tests/it/qwen_remedy.rs); a
trained 2B tower's stream is larger (v of order 1 and above), so smaller,
though not measured here. Take the smallest S that keeps the stream in
range.

Inputs of a bucket of N slots:
  patches     [1, 3*P*P, 1, N]  patch rows, (c, py, px), first frame; pad slots zero
  cos,sin     [1, hd, 1, N]     rotary tables, [row freqs, col freqs] twice
  mask        [1, N, N]         full attention: 0 between real slots of a frame
  window_mask [N/S, S, S]       window attention: 0 between real slots of a window
Output: embeds [1, out, 1, N/4], one token per 4 slots.
"""

from . import emit
from .vit import (
    LN_EPS,
    QUERY_CHUNK,
    _activation,
    _conv,
    _mask_chunks,
    _merge,
    block,
    branch_scaled,
    check_bucket,
    residual_scaled,
    rms_norm_of,
)


def describe(spec, patches):
    """What each input and output of a bucket's function holds (shown in Xcode)."""
    n, d, s = int(patches), spec["hidden_size"], spec["window_slots"]
    hd = d // spec["num_heads"]
    return {
        "patches": f"[1, {spec['patch_dim']}, 1, {n}] normalised patch rows, one temporal frame, (c, py, px) "
                   f"per channel, laid out in windows of {s} slots (real merge units first); pad slots zero",
        "cos": f"[1, {hd}, 1, {n}] rotary cos of [row freqs, col freqs] twice; 1 on pad slots",
        "sin": f"[1, {hd}, 1, {n}] rotary sin, same layout; 0 on pad slots",
        "mask": f"[1, {n}, {n}] additive mask of the full-attention blocks: 0 between real slots of one frame, "
                "-1e4 elsewhere; a pad slot attends to the first pad slot alone",
        "window_mask": f"[{n // s}, {s}, {s}] additive mask of the windowed blocks: 0 between real slots of one "
                       "window, -1e4 elsewhere; a pad slot attends to its window's first pad slot alone",
        "embeds": f"[1, {spec['out_hidden_size']}, 1, {n // 4}] merged visual tokens, one per 4 slots (slot order); "
                  "the host keeps the real ones",
    }


def build_program(spec, weights, patches, target="macOS15", query_chunk=QUERY_CHUNK):
    """A MIL program for one bucket of `patches` slots.

    spec: dict with hidden_size, num_heads, depth, out_hidden_size,
    intermediate_size, patch_dim (3*P*P), hidden_act, window_slots (S),
    fullatt_block_indexes; optionally residual_scale and branch_scale
    (powers of two; absent or 1: unscaled).
    weights: dict of float32 (or float16) arrays in the ANE layout (see the
    Rust `export::qwen2_5_vl::layout`); the program holds them as fp16 constants.
    """
    import coremltools as ct
    from coremltools.converters.mil import Builder as mb

    n = int(patches)
    check_bucket(n)
    s = int(spec["window_slots"])
    if n % s:
        raise ValueError(f"bucket of {n} slots: expected a multiple of the window's {s} slots")
    d, depth = spec["hidden_size"], spec["depth"]
    weights, _ = residual_scaled(weights, spec, ["patch_embed.weight"], down="mlp.down_proj")
    weights, _ = branch_scaled(weights, spec, "up_proj", "down_proj")
    w = emit.to_fp16(weights)
    norm = rms_norm_of(w, LN_EPS)

    def mlp(mb, h, i):
        b = f"blocks.{i}.mlp"
        g = _conv(mb, h, w[b + ".gate_proj.weight"], w[b + ".gate_proj.bias"], f"b{i}_gate")
        g = _activation(mb, g, spec["hidden_act"], f"b{i}_act")
        u = _conv(mb, h, w[b + ".up_proj.weight"], w[b + ".up_proj.bias"], f"b{i}_up")
        return _conv(mb, mb.mul(x=g, y=u, name=f"b{i}_glu"), w[b + ".down_proj.weight"], w[b + ".down_proj.bias"],
                     f"b{i}_down")

    windowed = has_windows(spec)
    specs = [mb.TensorSpec(shape=tuple(shape)) for _, shape in input_shapes(spec, n)]

    def body(patches, cos, sin, mask, window_mask=None):
        patches, cos, sin, mask = (mb.cast(x=v, dtype="fp16", name=f"{v.name}_fp16")
                                   for v in (patches, cos, sin, mask))
        if window_mask is not None:
            window_mask = mb.cast(x=window_mask, dtype="fp16", name="window_mask_fp16")
        masks = _mask_chunks(mb, mask, n, query_chunk)
        x = _conv(mb, patches, w["patch_embed.weight"], None, "patch_embed")
        for i in range(depth):
            window = None if i in spec["fullatt_block_indexes"] else (s, window_mask)
            x = block(mb, x, w, i, spec, n, cos, sin, masks, norm, mlp, window)
        y = norm(mb, x, "merger.ln_q", "merger_norm")
        y = _merge(mb, y, d, n, "merger")
        y = _conv(mb, y, w["merger.mlp.0.weight"], w["merger.mlp.0.bias"], "merger_fc1")
        y = mb.gelu(x=y, mode="EXACT", name="merger_gelu")
        y = _conv(mb, y, w["merger.mlp.2.weight"], w["merger.mlp.2.bias"], "merger_fc2")
        return (mb.cast(x=y, dtype="fp32", name="embeds"),)

    # A tower whose every block attends over the whole image has no window mask input.
    if windowed:
        @mb.program(input_specs=specs, opset_version=getattr(ct.target, target))
        def prog(patches, cos, sin, mask, window_mask):
            return body(patches, cos, sin, mask, window_mask)
    else:
        @mb.program(input_specs=specs, opset_version=getattr(ct.target, target))
        def prog(patches, cos, sin, mask):
            return body(patches, cos, sin, mask)

    return prog


def has_windows(spec):
    """Whether some block attends within windows (else there is no `window_mask` input)."""
    return any(i not in spec["fullatt_block_indexes"] for i in range(spec["depth"]))


def input_shapes(spec, patches):
    """(name, shape) of each input of a bucket of `patches` slots, in order."""
    n, d, s = int(patches), spec["hidden_size"], int(spec["window_slots"])
    hd = d // spec["num_heads"]
    shapes = [("patches", [1, spec["patch_dim"], 1, n]), ("cos", [1, hd, 1, n]), ("sin", [1, hd, 1, n]),
              ("mask", [1, n, n])]
    return shapes + [("window_mask", [n // s, s, s])] if has_windows(spec) else shapes


def output_names(spec):
    """The outputs of every bucket's function, in order."""
    return ["embeds"]


def save_packages(spec, weights, buckets, path, multifunction=True, metadata=None, **kw):
    """Build, convert, compress and save this family's packages (`emit.save_packages`)."""
    import sys

    return emit.save_packages(sys.modules[__name__], spec, weights, buckets, path, multifunction, metadata, **kw)
