"""The ModernBERT encoder as a static-shape MIL program in the ANE layout.

Rust tokenizes, looks up the token embedding rows and rewrites the
checkpoint's weights into this layout (issue 54's contract, "ModernBERT";
the Rust `modernbert` family); this module only assembles ops from `vit`'s
layers (see its docstring for the ANE rules they keep). The program is
emitted in fp16: fp32 inputs cast once on entry, outputs cast back to fp32.

The tower (transformers' `ModernBertModel`, models/modernbert/
modeling_modernbert.py): the token embedding rows (computed by the host)
go through the embedding LayerNorm, then `depth` pre-norm blocks
(`ModernBertEncoderLayer`), then a final LayerNorm:

    x = x + Wo(attention(attn_norm(x)))         attn_norm: none in block 0
    x = x + mlp.Wo(act(in) * gate)              [in, gate] = mlp.Wi(mlp_norm(x))

Attention is multi-head scaled dot-product attention (scale hd^-0.5) with
rotary position embeddings on q and k over the whole head (rotate_half:
[-x2, x1]; cos/sin of cat(freqs, freqs), inv_freq = theta^(-2k/hd), at
positions 0..N-1), theta per layer type (`rope_theta["full_attention"]`,
`["sliding_attention"]`). A `sliding_attention` layer lets query i see key
j only if |i - j| <= local_attention // 2 (transformers'
`sliding_window_bidirectional_overlay`, inclusive, with `sliding_window`
= local_attention // 2); a `full_attention` layer sees every real key.
LayerNorms have no bias unless `norm_bias` (beta 0 then); Linears none
unless `attention_bias` / `mlp_bias`. `act` is `hidden_act` (gelu: exact,
erf; gelu_new and gelu_pytorch_tanh: the tanh approximation; silu; relu).

Positions are 0..N-1 in every call (the host pads at the end), so the rotary
tables and the sliding band are program constants computed here per bucket:
cos and sin [1, hd, 1, N] per layer type, and the band [1, N, N] (0 within
the window, -1e4 outside, fp16 and exact). The rotary tables and the
attention scale hd^-0.5 are float32 constants cast to fp16 once in the
program (`_exact`): on the Neural Engine they are fp16 as every weight, but
the interpreter's fp32 mode keeps them as computed, so that it computes
transformers' fp32 maths. Held as fp16 constants instead, they moved the
tiny golden checkpoint's last_hidden_state by up to 2.9e-4 in fp32 mode
(rotary tables 2.0e-4, scale 1e-4 alone; hd 20, whose hd^-0.5 fp16 does
not hold), measured against a float64 numpy model, while its bf16 weights
are exact in fp16. A program adds the
band to the key mask once ([1, N, N] + [1, 1, N]), and each sliding layer's
query chunks read slices of that sum (`vit._mask_chunks`), as the other
families read their [1, N, N] masks; full layers add the [1, 1, N] key mask
itself, broadcast over queries, as the bert family does. A bucket whose
every pair of positions is within the window (N - 1 <= local_attention //
2) has no band: its sliding layers are full ones with their own theta.

Pad columns are masked as keys (-1e4, `vit.MASK_VALUE`, never -inf, R5;
with the band, -2e4 outside the window, still finite in fp16): after
softmax they get a probability of exactly 0, so the real columns' outputs do
not depend on what the pad columns hold. A real query always sees itself,
so its row is never all masked; a pad query's may be (its output is finite
and meaningless; the host keeps the real columns).

Residual scale (`spec["residual_scale"]` S, `build --residual-scale`, a
power of two from 1 to 4096; absent or 1: unscaled): trained encoders carry
massive activations, a few channels of a few tokens of the residual stream
reaching thousands to tens of thousands (docs/numerics.md), past fp16's
65,504 or the Neural Engine's 32,752 for a conv's output. With S the
program carries the stream divided by S (`vit.residual_scaled`, exact for
a power of two): the embedding norm's weight and bias, and every block's
attention output projection `attn.proj` and MLP `mlp.wo` (weight and
bias), are divided by S. The pre-norms (`attn_norm`, `mlp_norm`) and
`final_norm` normalise x / S as they do x, their epsilon weighing S^2 more
against the scaled variance (ModernBERT's 1e-5 against a variance of order
1: 1e-5 S^2 of it, 4e-2 at S = 64; the build takes the smallest S that
fits). Block 0's attention has no norm: it reads the embedding norm's output,
x / S, so its `attn.qkv` weight is multiplied by S (its bias unchanged;
exact, and W S of order S / sqrt(D) stays far inside fp16): q, k and v are
the unscaled ones, with no op more. last_hidden_state follows `final_norm`: nothing is scaled back,
and the program's inputs do not depend on S.

LayerNorm epsilon: ModernBERT's 1e-5 is representable in fp16; a smaller
one is held as max(norm_eps, 1e-7) (`bert.MIN_LN_EPS`, R5).

Inputs of a bucket of N tokens:
  embeddings [1, D, 1, N]  token embedding rows (before the embedding LayerNorm); pad columns 0
  mask       [1, 1, N]     0 for real tokens, -1e4 for pad columns
Outputs: last_hidden_state [1, D, 1, N] (after the final LayerNorm).
"""

import numpy as np

from . import emit
from .bert import MIN_LN_EPS, residual_scale_of
from .vit import (
    MASK_VALUE,
    QUERY_CHUNK,
    _activation,
    _attention,
    _conv,
    _layer_norm,
    _mask_chunks,
    query_chunks,
    residual_scaled,
)

__all__ = ["ACTIVATIONS", "LAYER_TYPES", "QUERY_CHUNK", "band_mask", "build_program", "check_spec", "describe",
           "input_shapes", "output_names", "rotary_tables", "save_packages"]

#: The `hidden_act` names the family takes (transformers' ACT2FN names).
ACTIVATIONS = ("gelu", "gelu_new", "gelu_pytorch_tanh", "silu", "relu")
#: The attention kinds of `layer_types`.
LAYER_TYPES = ("full_attention", "sliding_attention")
#: The builder's own constants, left uncompressed in int8 and palettized
#: packages (`emit.compress`): a per-channel int8 scale or a palette would
#: round the rotary tables far beyond fp16, and the band is 0 or -1e4.
UNCOMPRESSED = tuple(f"rope_{t}_{k}_fp32" for t in ("full", "sliding") for k in ("cos", "sin")) + ("mask_band_table",)
#: Spec fields every build reads.
SPEC_FIELDS = ("hidden_size", "num_heads", "depth", "intermediate_size", "hidden_act", "norm_eps", "norm_bias",
               "attention_bias", "mlp_bias", "layer_types", "rope_theta", "local_attention")


def describe(spec, tokens):
    """What each input and output of a bucket's function holds (shown in Xcode)."""
    n, d = int(tokens), spec["hidden_size"]
    return {
        "embeddings": f"[1, {d}, 1, {n}] per token its token embedding row (before the embedding LayerNorm), "
                      "channels first; one text padded to exactly this many tokens, pad columns 0",
        "mask": f"[1, 1, {n}] additive key mask: 0 for real tokens, -1e4 for pad columns, broadcast over queries",
        "last_hidden_state": f"[1, {d}, 1, {n}] the final LayerNorm's output for every column (pad columns' are "
                             "meaningless)",
    }


def _positive_int(v):
    return not isinstance(v, bool) and isinstance(v, (int, np.integer)) and v > 0


def check_spec(spec, tokens):
    """The bucket's token count, or ValueError naming the bad spec field or bucket."""
    missing = [k for k in SPEC_FIELDS if k not in spec]
    if missing:
        raise ValueError(f"modernbert spec: missing {', '.join(missing)}")
    if not _positive_int(tokens):
        raise ValueError(f"bucket of {tokens} tokens: expected a positive whole count")
    for k in ("hidden_size", "num_heads", "depth", "intermediate_size", "local_attention"):
        if not _positive_int(spec[k]):
            raise ValueError(f"modernbert spec: {k} {spec[k]!r}: expected a positive integer")
    d, heads = spec["hidden_size"], spec["num_heads"]
    if d % heads:
        raise ValueError(f"modernbert spec: hidden_size {d} is not a multiple of num_heads {heads}")
    if (d // heads) % 2:
        raise ValueError(f"modernbert spec: head size {d // heads} is odd (rotary embeddings rotate half of it)")
    if spec["hidden_act"] not in ACTIVATIONS:
        raise ValueError(f"modernbert spec: hidden_act {spec['hidden_act']!r}: expected one of "
                         f"{', '.join(ACTIVATIONS)}")
    if isinstance(spec["norm_eps"], bool) or not isinstance(spec["norm_eps"], (int, float)) \
            or not spec["norm_eps"] > 0:
        raise ValueError(f"modernbert spec: norm_eps {spec['norm_eps']!r}: expected a positive number")
    for k in ("norm_bias", "attention_bias", "mlp_bias"):
        if not isinstance(spec[k], bool):
            raise ValueError(f"modernbert spec: {k} {spec[k]!r}: expected true or false")
    _check_layer_types(spec)
    residual_scale_of(spec, "modernbert")
    return int(tokens)


def _check_layer_types(spec):
    types, theta = spec["layer_types"], spec["rope_theta"]
    if not isinstance(types, (list, tuple)) or len(types) != spec["depth"]:
        raise ValueError(f"modernbert spec: layer_types {types!r}: expected a list of depth ({spec['depth']}) "
                         "layer types")
    for i, t in enumerate(types):
        if t not in LAYER_TYPES:
            raise ValueError(f"modernbert spec: layer_types[{i}] {t!r}: expected one of {', '.join(LAYER_TYPES)}")
    if not isinstance(theta, dict):
        raise ValueError(f"modernbert spec: rope_theta {theta!r}: expected an object of a theta per layer type")
    for t in sorted(set(types)):
        v = theta.get(t)
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not v > 0:
            raise ValueError(f"modernbert spec: rope_theta[{t!r}] {v!r}: expected a positive number")


def weight_shapes(spec):
    """{name: shape} of every weight the spec's program reads (the contract's names)."""
    d, inter = spec["hidden_size"], spec["intermediate_size"]
    want = {}

    def norm(p):
        want[p + ".weight"] = (d,)
        if spec["norm_bias"]:
            want[p + ".bias"] = (d,)

    def linear(p, o, i, bias):
        want[p + ".weight"] = (o, i, 1, 1)
        if bias:
            want[p + ".bias"] = (o,)

    norm("embeddings.norm")
    for i in range(spec["depth"]):
        b = f"blocks.{i}"
        if i:
            norm(b + ".attn_norm")
        linear(b + ".attn.qkv", 3 * d, d, spec["attention_bias"])
        linear(b + ".attn.proj", d, d, spec["attention_bias"])
        norm(b + ".mlp_norm")
        linear(b + ".mlp.wi", 2 * inter, d, spec["mlp_bias"])
        linear(b + ".mlp.wo", d, inter, spec["mlp_bias"])
    norm("final_norm")
    return want


def _check_weights(spec, w):
    """ValueError naming the first weight that is missing, has the wrong shape,
    or is present where the spec says there is none (a bias the flags rule
    out, block 0's attn_norm): the program would otherwise leave it out
    silently."""
    want = weight_shapes(spec)
    for k, shape in want.items():
        if k not in w:
            raise ValueError(f"modernbert weights: {k} missing")
        if tuple(w[k].shape) != shape:
            raise ValueError(f"modernbert weights: {k} has shape {tuple(w[k].shape)}, expected {shape}")
    for k in sorted(set(w) - set(want)):
        if k.startswith(("blocks.", "embeddings.", "final_norm.")):
            why = ("block 0 has no attn_norm" if k.startswith("blocks.0.attn_norm.") else
                   "the spec's norm_bias, attention_bias and mlp_bias rule it out" if k.endswith(".bias") else
                   "not a weight of the modernbert program")
            raise ValueError(f"modernbert weights: {k} present but {why}")


def rotary_tables(theta, head_dim, tokens):
    """(cos, sin) [1, hd, 1, N] float32 at positions 0..N-1: cat(freqs, freqs)
    per position, computed in float32 as transformers computes them
    (`ModernBertRotaryEmbedding`: inv_freq = 1 / theta^(2k / hd))."""
    hd = head_dim
    inv = (np.float32(1.0) / (np.float32(theta) ** (np.arange(0, hd, 2, dtype=np.float32) / np.float32(hd))))
    freqs = np.arange(tokens, dtype=np.float32)[:, None] * inv.astype(np.float32)[None, :]  # [N, hd/2]
    emb = np.concatenate([freqs, freqs], axis=1).T  # [hd, N]
    return (np.cos(emb).astype(np.float32).reshape(1, hd, 1, tokens),
            np.sin(emb).astype(np.float32).reshape(1, hd, 1, tokens))


def band_mask(tokens, local_attention):
    """[1, N, N]: 0 where |query - key| <= local_attention // 2, -1e4 elsewhere;
    None when every pair of the bucket's positions is within the window."""
    half = local_attention // 2
    if tokens - 1 <= half:
        return None
    pos = np.arange(tokens)
    inside = np.abs(pos[:, None] - pos[None, :]) <= half
    return np.where(inside, 0.0, MASK_VALUE).astype(np.float32)[None]


def build_program(spec, weights, tokens, target="macOS15", query_chunk=QUERY_CHUNK):
    """A MIL program for one bucket of `tokens` tokens (one text).

    spec: the contract's fields (hidden_size, num_heads, depth,
    intermediate_size, hidden_act, norm_eps, norm_bias, attention_bias,
    mlp_bias, layer_types, rope_theta, local_attention); optionally
    residual_scale (a power of two; absent or 1: unscaled; see the module
    docstring).
    weights: dict of float32 (or float16) arrays in the ANE layout
    (`weight_shapes`: `embeddings.norm`, `blocks.<i>.attn_norm` (i >= 1),
    `.attn.qkv`, `.attn.proj`, `.mlp_norm`, `.mlp.wi`, `.mlp.wo`,
    `final_norm`).
    """
    import coremltools as ct
    from coremltools.converters.mil import Builder as mb

    n = check_spec(spec, tokens)
    _check_weights(spec, weights)
    d, heads, depth = spec["hidden_size"], spec["num_heads"], spec["depth"]
    eps = max(float(spec["norm_eps"]), MIN_LN_EPS)
    weights, scale = residual_scaled(weights, spec, ["embeddings.norm.weight", "embeddings.norm.bias"],
                                     down="mlp.wo")
    if scale != 1:  # block 0's attention reads the scaled stream without a norm (module docstring)
        weights["blocks.0.attn.qkv.weight"] = weights["blocks.0.attn.qkv.weight"].astype(np.float32) * scale
    w = emit.to_fp16(weights)
    types = spec["layer_types"]
    band = band_mask(n, spec["local_attention"])

    def norm(x, prefix, name):
        g = w[prefix + ".weight"]
        return _layer_norm(mb, x, g, w.get(prefix + ".bias", np.zeros_like(g)), name, eps)

    @mb.program(input_specs=[mb.TensorSpec(shape=(1, d, 1, n)), mb.TensorSpec(shape=(1, 1, n))],
                opset_version=getattr(ct.target, target))
    def prog(embeddings, mask):
        x = mb.cast(x=embeddings, dtype="fp16", name="embeddings_fp16")
        mask = mb.cast(x=mask, dtype="fp16", name="mask_fp16")
        # `embed`: where the gather fault (faults.py) anchors.
        x = norm(x, "embeddings.norm", "embed")
        masks = {"full_attention": [(c0, c1, mask) for c0, c1, _ in query_chunks(n, query_chunk)]}
        masks["sliding_attention"] = masks["full_attention"]
        if band is not None and "sliding_attention" in types:
            banded = mb.add(x=mb.const(val=band.astype(np.float16), name="mask_band_table"), y=mask,
                            name="mask_band")  # [1, N, N], once
            masks["sliding_attention"] = _mask_chunks(mb, banded, n, query_chunk)
        rope = {}
        for t in sorted(set(types)):
            tag = t.split("_")[0]
            rope[t] = tuple(_exact(mb, v, f"rope_{tag}_{k}")
                            for k, v in zip(("cos", "sin"), rotary_tables(spec["rope_theta"][t], d // heads, n)))
        scale = _exact(mb, np.float32((d // heads) ** -0.5), "attn_scale")
        for i in range(depth):
            x = _block(mb, x, w, i, spec, n, rope[types[i]], scale, masks[types[i]], norm)
        x = norm(x, "final_norm", "final_norm")
        return mb.cast(x=x, dtype="fp32", name="last_hidden_state")

    return prog


def _exact(mb, v, name):
    """The float32 constant `v` cast to fp16 once (`name`): fp16 on the Neural
    Engine as any constant, while the interpreter's fp32 mode, whose casts
    keep f32 values, computes with `v` itself (see the module docstring)."""
    return mb.cast(x=mb.const(val=v, name=name + "_fp32"), dtype="fp16", name=name)


def _block(mb, x, w, i, spec, n, rope, scale, masks, norm):
    """Pre-norm block `i`: x + attn(attn_norm(x)) (block 0: no attn_norm), then
    x + mlp(mlp_norm(x)); the residual adds are `b<i>_res1`, `b<i>_res2`
    (the block's output, which the cosine gate taps), as in vit.block."""
    b = f"blocks.{i}"
    h = x if i == 0 else norm(x, b + ".attn_norm", f"b{i}_attn_norm")
    x = mb.add(x=x, y=_attention(mb, h, w, i, spec, n, rope[0], rope[1], masks, scale=scale), name=f"b{i}_res1")
    h = norm(x, b + ".mlp_norm", f"b{i}_mlp_norm")
    return mb.add(x=x, y=_glu_mlp(mb, h, w, i, spec), name=f"b{i}_res2")


def _glu_mlp(mb, h, w, i, spec):
    """Block `i`'s gated MLP: `wi` gives [in, gate] of I channels each, then
    wo(act(in) * gate) (`ModernBertMLP`)."""
    b, inter = f"blocks.{i}.mlp", spec["intermediate_size"]
    y = _conv(mb, h, w[b + ".wi.weight"], w.get(b + ".wi.bias"), f"b{i}_wi")
    n = y.shape[3]
    a = mb.slice_by_index(x=y, begin=[0, 0, 0, 0], end=[1, inter, 1, n], name=f"b{i}_in")
    g = mb.slice_by_index(x=y, begin=[0, inter, 0, 0], end=[1, 2 * inter, 1, n], name=f"b{i}_gate")
    y = mb.mul(x=_activation(mb, a, spec["hidden_act"], f"b{i}_act"), y=g, name=f"b{i}_glu")
    return _conv(mb, y, w[b + ".wo.weight"], w.get(b + ".wo.bias"), f"b{i}_wo")


def input_shapes(spec, tokens):
    """(name, shape) of each input of a bucket of `tokens` tokens, in order."""
    n = int(tokens)
    return [("embeddings", [1, spec["hidden_size"], 1, n]), ("mask", [1, 1, n])]


def output_names(spec):
    """The outputs of every bucket's function, in order."""
    return ["last_hidden_state"]


def save_packages(spec, weights, buckets, path, multifunction=True, metadata=None, **kw):
    """Build, convert, compress and save this family's packages (`emit.save_packages`)."""
    import sys

    for _, tokens in buckets:  # every bucket checked before anything is built
        check_spec(spec, tokens)
    _check_weights(spec, weights)
    return emit.save_packages(sys.modules[__name__], spec, weights, buckets, path, multifunction, metadata, **kw)
