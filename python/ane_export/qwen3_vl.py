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

Inputs of a bucket of N patches:
  patches [1, 3*P*P, 1, N]  still-image patch rows, (c, py, px), first frame
  pos     [1, D, 1, N]      interpolated position embedding per token
  cos,sin [1, hd, 1, N]     rotary tables, [row freqs, col freqs] twice
  mask    [1, N, N]         0 where a query may attend a key, -1e4 elsewhere
Outputs: embeds and deepstack_{i}, each [1, out, 1, N/4].
"""

import numpy as np

from .emit import to_fp16
from . import emit

#: Additive mask value: exactly 0 after exp in fp16, and -1e4 + scores cannot overflow (R5).
MASK_VALUE = -1e4
#: LayerNorm epsilon of the Qwen3-VL vision tower (representable in fp16, R5).
LN_EPS = 1e-6


def _f16(v):
    """A scalar as an fp16 constant, rounded from fp32 as the fp16 cast pass rounds."""
    return np.float32(v).astype(np.float16)


def _conv(mb, x, w, b, name):
    """A Linear as a 1x1 conv (R2): w [out, in, 1, 1], b [out]."""
    return mb.conv(x=x, weight=w, bias=b, name=name)


def _layer_norm(mb, x, g, b, name, eps=LN_EPS):
    """LayerNorm over channels of a (B, C, 1, S) tensor."""
    return mb.layer_norm(x=x, axes=[1], gamma=g, beta=b, epsilon=_f16(eps), name=name)


def _merge(mb, x, dim, n, name, transposed=False):
    """(1, D, 1, N) -> (1, 4D, 1, N/4): 4 consecutive tokens become one row,
    channel j*D + c holding channel c of token 4m + j. `transposed` (the
    merge-order test fault) reads each 2x2 group column-major instead."""
    y = mb.reshape(x=x, shape=[1, dim, n // 4, 4], name=name + "_split")
    y = mb.transpose(x=y, perm=[0, 3, 1, 2], name=name + "_perm")  # (1, 4, D, N/4)
    if transposed:
        parts = [mb.slice_by_index(x=y, begin=[0, j, 0, 0], end=[1, j + 1, dim, n // 4], name=f"{name}_g{j}")
                 for j in range(4)]
        y = mb.concat(values=[parts[0], parts[2], parts[1], parts[3]], axis=1, name=name + "_transposed")
    return mb.reshape(x=y, shape=[1, 4 * dim, 1, n // 4], name=name + "_rows")


def _merger(mb, x, w, prefix, dim, n, postshuffle, eps=LN_EPS, transposed=False):
    if postshuffle:
        y = _merge(mb, x, dim, n, prefix, transposed)
        y = _layer_norm(mb, y, w[prefix + ".norm.weight"], w[prefix + ".norm.bias"], prefix + "_norm", eps)
    else:
        y = _layer_norm(mb, x, w[prefix + ".norm.weight"], w[prefix + ".norm.bias"], prefix + "_norm", eps)
        y = _merge(mb, y, dim, n, prefix, transposed)
    y = _conv(mb, y, w[prefix + ".linear_fc1.weight"], w[prefix + ".linear_fc1.bias"], prefix + "_fc1")
    y = mb.gelu(x=y, mode="EXACT", name=prefix + "_gelu")
    return _conv(mb, y, w[prefix + ".linear_fc2.weight"], w[prefix + ".linear_fc2.bias"], prefix + "_fc2")


#: Queries per attention chunk (ANE-RULES R4: score tensors of at most 512 x N).
QUERY_CHUNK = 512


def _mask_chunks(mb, mask, n, chunk):
    """The mask's rows for each query chunk, sliced once for every head and block."""
    if chunk <= 0 or n <= chunk:
        return [(0, n, mask)]
    return [(c, min(c + chunk, n),
             mb.slice_by_index(x=mask, begin=[0, c, 0], end=[1, min(c + chunk, n), n], name=f"mask_q{c}"))
            for c in range(0, n, chunk)]


def _attention(mb, x, w, i, spec, n, cos, sin, masks, faults=()):
    d, heads = spec["hidden_size"], spec["num_heads"]
    hd = d // heads
    p = f"blocks.{i}.attn"
    qkv = _conv(mb, x, w[p + ".qkv.weight"], w[p + ".qkv.bias"], f"b{i}_qkv")  # (1, 3D, 1, N)
    scale = _f16(hd ** -0.5)
    outs = []
    for h in range(heads):  # R3: one attention per head
        def head(part, h=h):
            start = part * d + h * hd
            return mb.slice_by_index(x=qkv, begin=[0, start, 0, 0], end=[1, start + hd, 1, n],
                                     name=f"b{i}_h{h}_{'qkv'[part]}")

        def rope(t, tag, h=h):
            lo = mb.slice_by_index(x=t, begin=[0, 0, 0, 0], end=[1, hd // 2, 1, n], name=f"b{i}_h{h}_{tag}_lo")
            hi = mb.slice_by_index(x=t, begin=[0, hd // 2, 0, 0], end=[1, hd, 1, n], name=f"b{i}_h{h}_{tag}_hi")
            rot = mb.concat(values=[mb.mul(x=hi, y=_f16(-1.0), name=f"b{i}_h{h}_{tag}_neg"), lo], axis=1,
                            name=f"b{i}_h{h}_{tag}_rot")
            return mb.add(x=mb.mul(x=t, y=cos, name=f"b{i}_h{h}_{tag}_cos"),
                          y=mb.mul(x=rot, y=sin, name=f"b{i}_h{h}_{tag}_sin"), name=f"b{i}_h{h}_{tag}_rope")

        q = mb.reshape(x=rope(head(0), "q"), shape=[1, hd, n], name=f"b{i}_h{h}_q3")
        k = mb.reshape(x=rope(head(1), "k"), shape=[1, hd, n], name=f"b{i}_h{h}_k3")
        v = mb.reshape(x=head(2), shape=[1, hd, n], name=f"b{i}_h{h}_v3")
        ctx = []
        for c0, c1, mask in masks:  # R4: query chunks, K and V whole
            t = f"b{i}_h{h}" if len(masks) == 1 else f"b{i}_h{h}_q{c0}"
            qc = q if len(masks) == 1 else mb.slice_by_index(x=q, begin=[0, 0, c0], end=[1, hd, c1], name=f"{t}_q")
            s = mb.matmul(x=qc, y=k, transpose_x=True, name=f"{t}_scores")  # (1, chunk, N)
            s = mb.mul(x=s, y=scale, name=f"{t}_scaled")
            if "no-mask" not in faults:
                s = mb.add(x=s, y=mask, name=f"{t}_masked")
            a = mb.softmax(x=s, axis=-1, name=f"{t}_probs")
            ctx.append(mb.matmul(x=v, y=a, transpose_y=True, name=f"{t}_ctx"))  # (1, hd, chunk)
        o = ctx[0] if len(ctx) == 1 else mb.concat(values=ctx, axis=2, name=f"b{i}_h{h}_ctx")
        outs.append(mb.reshape(x=o, shape=[1, hd, 1, n], name=f"b{i}_h{h}_out"))
    if "swap-heads" in faults and heads > 1:
        outs[0], outs[1] = outs[1], outs[0]
    o = mb.concat(values=outs, axis=1, name=f"b{i}_heads")
    return _conv(mb, o, w[p + ".proj.weight"], w[p + ".proj.bias"], f"b{i}_proj")


#: Deliberate defects for the gates' own tests (`ane-export build --fault`): each
#: must make one gate fail. swap-rb: red and blue swapped in the patch
#: embedding (the artifact sees BGR); no-mask: the attention mask ignored;
#: gather: an identity gather (leaves the ANE, R8); overflow: the residual
#: stream of one block scaled by 65536 and back (exact in fp32, inf in fp16).
#: Subtle ones, which the cosine gate must reject: swap-heads: heads 0 and 1
#: exchanged before the output projection in every block; ln-eps: every
#: LayerNorm's epsilon 10x too large; merge-order: 2x2 merge groups read in
#: transposed order; int8-axis: square 1x1 convs stored in int8 with
#: per-output-channel scales applied along the input channels. (The host-side
#: faults, rope-theta and pos-align, are in the manifest's host recipe.)
FAULTS = ("swap-rb", "no-mask", "gather", "overflow", "swap-heads", "ln-eps", "merge-order", "int8-axis")

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
        "mask": f"[1, {n}, {n}] additive attention mask: 0 within one frame of one image, -1e4 elsewhere",
        "embeds": f"[1, {out}, 1, {n // 4}] merged visual tokens for the language model; the first real/4 are real",
    }
    for j, i in enumerate(spec["deepstack_visual_indexes"]):
        desc[f"deepstack_{j}"] = f"[1, {out}, 1, {n // 4}] deepstack features after vision block {i}"
    return desc


class _Int8WrongAxis(dict):
    """The int8-axis test fault: each square 1x1 conv weight [C, C, 1, 1] is
    quantised to int8 with one scale per output channel (as R14 wants), but
    the scales are stored along the input-channel axis, so dequantisation
    multiplies column c by row c's scale. Read inside the program body: each
    access emits the iOS18 `constexpr_blockwise_shift_scale` op."""

    def __getitem__(self, key):
        v = dict.__getitem__(self, key)
        if not (key.endswith(".weight") and v.ndim == 4 and v.shape[0] == v.shape[1] and v.shape[2:] == (1, 1)):
            return v
        from coremltools.converters.mil import Builder as mb

        w = v.astype(np.float32)
        scale = np.maximum(np.abs(w).max(axis=(1, 2, 3)), 1e-8) / 127.0
        q = np.clip(np.round(w / scale[:, None, None, None]), -127, 127).astype(np.int8)
        return mb.constexpr_blockwise_shift_scale(data=q, scale=scale.astype(np.float16).reshape(1, -1, 1, 1),
                                                  name=key.replace(".", "_") + "_int8_wrong_axis")


def build_program(spec, weights, patches, target="macOS15", faults=(), query_chunk=QUERY_CHUNK):
    """A MIL program for one bucket of `patches` tokens.

    spec: dict with hidden_size, num_heads, depth, out_hidden_size,
    deepstack_visual_indexes, patch_dim (3*P*P), hidden_act.
    weights: dict of float32 (or float16) arrays in the ANE layout (see the
    Rust `layout`); the program holds them as fp16 constants.
    """
    import coremltools as ct
    from coremltools.converters.mil import Builder as mb

    n = int(patches)
    if n <= 0 or n % 4:
        raise ValueError(f"bucket of {n} patches: expected a positive multiple of 4")
    unknown = set(faults) - set(FAULTS)
    if unknown:
        raise ValueError(f"faults {sorted(unknown)}: expected some of {', '.join(FAULTS)}")
    d, depth = spec["hidden_size"], spec["depth"]
    hd = d // spec["num_heads"]
    act = "TANH_APPROXIMATION" if spec["hidden_act"] in ("gelu_pytorch_tanh", "gelu_new") else "EXACT"
    w = weights
    if "swap-rb" in faults:
        # Patch-embedding input channels are (c, py, px): exchange the c = 0 and c = 2 blocks.
        pe = w["patch_embed.weight"]
        k = pe.shape[1] // 3
        w = dict(w, **{"patch_embed.weight": np.concatenate([pe[:, 2 * k:], pe[:, k:2 * k], pe[:, :k]], axis=1)})
    w = to_fp16(w)
    if "int8-axis" in faults:
        w = _Int8WrongAxis(w)
    boosted = 1 if depth > 1 else 0
    eps = LN_EPS * (10 if "ln-eps" in faults else 1)
    transposed = "merge-order" in faults

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
        x = mb.add(x=x, y=pos, name="embed")
        if "gather" in faults:
            x = mb.gather(x=x, indices=np.arange(n, dtype=np.int32), axis=3, name="embed_gather")
        outputs = []
        for i in range(depth):
            b = f"blocks.{i}"
            h = _layer_norm(mb, x, w[b + ".norm1.weight"], w[b + ".norm1.bias"], f"b{i}_norm1", eps)
            x = mb.add(x=x, y=_attention(mb, h, w, i, spec, n, cos, sin, masks, faults), name=f"b{i}_res1")
            if "overflow" in faults and i == boosted:
                for j, f in enumerate((256.0, 256.0, 1 / 256.0, 1 / 256.0)):
                    x = mb.mul(x=x, y=_f16(f), name=f"b{i}_boost{j}")
            h = _layer_norm(mb, x, w[b + ".norm2.weight"], w[b + ".norm2.bias"], f"b{i}_norm2", eps)
            h = _conv(mb, h, w[b + ".mlp.linear_fc1.weight"], w[b + ".mlp.linear_fc1.bias"], f"b{i}_fc1")
            h = mb.gelu(x=h, mode=act, name=f"b{i}_gelu")
            h = _conv(mb, h, w[b + ".mlp.linear_fc2.weight"], w[b + ".mlp.linear_fc2.bias"], f"b{i}_fc2")
            x = mb.add(x=x, y=h, name=f"b{i}_res2")
            if i in spec["deepstack_visual_indexes"]:
                j = spec["deepstack_visual_indexes"].index(i)
                y = _merger(mb, x, w, f"deepstack_merger_list.{j}", d, n, True, eps, transposed)
                outputs.append((j, y))
        embeds = _merger(mb, x, w, "merger", d, n, False, eps, transposed)
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
