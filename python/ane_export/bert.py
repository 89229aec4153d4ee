"""The BERT encoder (BERT, RoBERTa, XLM-RoBERTa) as a static-shape MIL
program in the ANE layout.

Rust tokenizes, looks up the embedding rows and rewrites the checkpoint's
weights into this layout (issue 54's contract; the Rust `bert` family); this
module only assembles ops from `vit`'s layers (see its docstring for the ANE
rules they keep). The program is emitted in fp16: fp32 inputs cast once on
entry, outputs cast back to fp32.

The tower (transformers' `BertModel`, models/bert/modeling_bert.py;
`RobertaModel` and `XLMRobertaModel` are the same encoder, their position
ids offset past the pad token, which the host's lookup takes care of): the
sum of the word, position and token-type embedding rows (`BertEmbeddings`,
computed by the host) goes through the embedding LayerNorm, then `depth`
post-norm blocks (`BertLayer`):

    x = LayerNorm1(x + proj(attention(x)))         BertAttention, BertSelfOutput
    x = LayerNorm2(x + fc2(act(fc1(x))))           BertIntermediate, BertOutput

where attention is multi-head scaled dot-product attention with the additive
key mask, softmax(q k^T / sqrt(head_dim) + mask) v per head, and `act` the
checkpoint's `hidden_act` (gelu: exact, erf; gelu_new and gelu_pytorch_tanh:
the tanh approximation; relu). `last_hidden_state` is the last block's
output, every column of the bucket; with a pooler (`BertPooler`),
`pooler_output` is tanh(dense(first token)), the [CLS] (RoBERTa: <s>) column.

A bucket is one text of at most N tokens, padded by the host to exactly N.
Pad columns are masked as keys: the mask adds -1e4 (`vit.MASK_VALUE`, never
-inf, R5) to their scores, so after softmax (in fp16 as in fp32) they get a
probability of exactly 0 and the real columns' outputs do not depend on what
the pad columns hold. Pad columns are still computed as queries (their
outputs are finite and meaningless; the host keeps the real columns).

The mask is `[1, 1, N]`, one row broadcast over every query (and every
query chunk, head and block): BERT's padding mask is a key mask broadcast
over queries (modeling_bert's extended attention mask, `[batch, 1, 1, N]`),
a row is all a padded text needs, and it is N values rather than N^2 to
write per call. Apple's ANE encoders add their padding mask the same way,
one value per key broadcast over queries (apple/ml-ane-transformers:
`huggingface/distilbert.py`, mask (B, S, 1, 1); `reference/
multihead_attention.py`, `k_mask`); no rule of ANE-RULES.md concerns a
broadcast add, and the project's interpreter adds by numpy's broadcasting.
(The interpreter's fused attention kernel takes only masks of the scores'
shape, `[B or 1, Q, K]`: with this mask it runs the scores, mask, softmax
and context ops one by one: the same values, more slowly.)

LayerNorm epsilon: BERT's 1e-12 is 0 in fp16 (R5); the program uses
max(layer_norm_eps, 1e-7) (`MIN_LN_EPS`), the value Apple's ANE DistilBERT
uses in place of the same 1e-12 (ml-ane-transformers
`huggingface/distilbert.py`). Against a hidden state's variance (order 1)
the difference is far below fp16's resolution.

Residual scale (`spec["residual_scale"]` S, `build --residual-scale`, a
power of two from 1 to 4096; absent or 1: the program above, unchanged):
trained encoders carry massive activations, a few channels of a few tokens
reaching thousands to tens of thousands (docs/numerics.md), and in a
post-norm block they live in the sums the LayerNorms read, x + proj(...)
and x + fc2(...), which pass fp16's 65,504 (and the Neural Engine's 32,752
for a conv's output) before any norm brings them back. With S each add
computes

    x * (1/S) + sublayer(x) / S             (the sum divided by S)

the sublayer's last projection (`attn.proj`, `mlp.fc2`, weight and bias)
divided by S in the weights (`vit.residual_scaled`, exact for a power of
two) and x multiplied by 1/S by one op before the add (`b<i>_res1_in`,
`b<i>_res2_in`; the adds keep their names). The LayerNorm then gives
LN(x + f(x)) again: it normalises (x + f(x)) / S as it does x + f(x), its
epsilon weighing S^2 more against the scaled variance (for BERT's variance
of order 1 and an epsilon of 1e-7 to 1e-5, S = 64 makes it 4e-4 to 4e-2 of
it: the build takes the smallest S that fits). So the stream between
blocks, the pooler and last_hidden_state are unscaled: nothing is scaled
back, and the program's inputs do not depend on S (the embedding LayerNorm
reads the host's sums, which the stream's massive values do not reach).

Inputs of a bucket of N tokens:
  embeddings [1, D, 1, N]  word + position + token-type rows, before the embedding LayerNorm
  mask       [1, 1, N]     0 for real tokens, -1e4 for pad columns
Outputs: last_hidden_state [1, D, 1, N], pooler_output [1, D, 1, 1] (with a pooler).
"""

import numpy as np

from . import emit
from .vit import (
    ACTIVATIONS,
    QUERY_CHUNK,
    _attention,
    _conv,
    _f16,
    _layer_norm,
    fc_mlp_of,
    query_chunks,
    residual_scaled,
)

__all__ = ["MAX_RESIDUAL_SCALE", "MIN_LN_EPS", "QUERY_CHUNK", "build_program", "describe", "input_shapes",
           "output_names", "residual_scale_of", "save_packages"]

#: The smallest LayerNorm epsilon the program holds (R5; ml-ane-transformers' ANE DistilBERT uses 1e-7 for 1e-12).
MIN_LN_EPS = 1e-7

#: The largest residual scale a spec may ask for (as the Rust build's `--residual-scale`).
MAX_RESIDUAL_SCALE = 4096
#: Spec fields every build reads.
SPEC_FIELDS = ("hidden_size", "num_heads", "depth", "intermediate_size", "hidden_act", "layer_norm_eps", "pooler")


def describe(spec, tokens):
    """What each input and output of a bucket's function holds (shown in Xcode)."""
    n, d = int(tokens), spec["hidden_size"]
    out = {
        "embeddings": f"[1, {d}, 1, {n}] per token the sum of its word, position and token-type embedding rows "
                      "(before the embedding LayerNorm), channels first; one text padded to exactly this many "
                      "tokens, pad columns holding the pad token's rows",
        "mask": f"[1, 1, {n}] additive key mask: 0 for real tokens, -1e4 for pad columns, broadcast over queries",
        "last_hidden_state": f"[1, {d}, 1, {n}] the last block's output for every column (pad columns' are "
                             "meaningless)",
    }
    if spec["pooler"]:
        out["pooler_output"] = f"[1, {d}, 1, 1] tanh(pooler dense(first token of last_hidden_state))"
    return out


def check_spec(spec, tokens):
    """The bucket's token count, or ValueError naming the bad spec field or bucket."""
    missing = [k for k in SPEC_FIELDS if k not in spec]
    if missing:
        raise ValueError(f"bert spec: missing {', '.join(missing)}")
    if isinstance(tokens, bool) or not isinstance(tokens, (int, np.integer)) or tokens <= 0:
        raise ValueError(f"bucket of {tokens} tokens: expected a positive whole count")
    d, heads = spec["hidden_size"], spec["num_heads"]
    for k in ("hidden_size", "num_heads", "depth", "intermediate_size"):
        if isinstance(spec[k], bool) or not isinstance(spec[k], int) or spec[k] <= 0:
            raise ValueError(f"bert spec: {k} {spec[k]!r}: expected a positive integer")
    if d % heads:
        raise ValueError(f"bert spec: hidden_size {d} is not a multiple of num_heads {heads}")
    if spec["hidden_act"] not in ACTIVATIONS:
        raise ValueError(f"bert spec: hidden_act {spec['hidden_act']!r}: expected one of {', '.join(ACTIVATIONS)}")
    if not spec["layer_norm_eps"] > 0:
        raise ValueError(f"bert spec: layer_norm_eps {spec['layer_norm_eps']!r}: expected a positive number")
    residual_scale_of(spec, "bert")
    return int(tokens)


def residual_scale_of(spec, family):
    """The spec's `residual_scale` S (absent or null: 1), or ValueError naming
    it: a power of two from 1 to `MAX_RESIDUAL_SCALE` (whole powers of two
    scale fp16 values exactly; the Rust build chooses among the same)."""
    s = spec.get("residual_scale")
    if s is None:
        return 1
    ok = not isinstance(s, bool) and isinstance(s, (int, float, np.integer)) and s == int(s) \
        and 1 <= s <= MAX_RESIDUAL_SCALE and int(s) & (int(s) - 1) == 0
    if not ok:
        raise ValueError(f"{family} spec: residual_scale {s!r}: expected a power of two from 1 to "
                         f"{MAX_RESIDUAL_SCALE}")
    return int(s)


def _check_weights(spec, w):
    """ValueError naming the first weight that is missing or has the wrong shape."""
    d, inter = spec["hidden_size"], spec["intermediate_size"]
    want = {"embeddings.norm.weight": (d,), "embeddings.norm.bias": (d,)}
    for i in range(spec["depth"]):
        b = f"blocks.{i}"
        for k, (o, ii) in {"attn.qkv": (3 * d, d), "attn.proj": (d, d), "mlp.fc1": (inter, d),
                           "mlp.fc2": (d, inter)}.items():
            want[f"{b}.{k}.weight"] = (o, ii, 1, 1)
            want[f"{b}.{k}.bias"] = (o,)
        for k in ("norm1", "norm2"):
            want[f"{b}.{k}.weight"] = want[f"{b}.{k}.bias"] = (d,)
    if spec["pooler"]:
        want["pooler.weight"], want["pooler.bias"] = (d, d, 1, 1), (d,)
    for k, shape in want.items():
        if k not in w:
            raise ValueError(f"bert weights: {k} missing")
        if tuple(w[k].shape) != shape:
            raise ValueError(f"bert weights: {k} has shape {tuple(w[k].shape)}, expected {shape}")


def build_program(spec, weights, tokens, target="macOS15", query_chunk=QUERY_CHUNK):
    """A MIL program for one bucket of `tokens` tokens (one text).

    spec: dict with hidden_size, num_heads, depth, intermediate_size,
    hidden_act, layer_norm_eps, pooler (bool); optionally residual_scale
    (a power of two; absent or 1: unscaled; see the module docstring).
    weights: dict of float32 (or float16) arrays in the ANE layout (the
    names of issue 54's contract: `embeddings.norm`, `blocks.<i>.attn.qkv`,
    `.attn.proj`, `.norm1`, `.mlp.fc1`, `.mlp.fc2`, `.norm2`, `pooler`).
    """
    import coremltools as ct
    from coremltools.converters.mil import Builder as mb

    n = check_spec(spec, tokens)
    _check_weights(spec, weights)
    d, depth = spec["hidden_size"], spec["depth"]
    eps = max(float(spec["layer_norm_eps"]), MIN_LN_EPS)
    weights, scale = residual_scaled(weights, spec, [])
    w = emit.to_fp16(weights)
    mlp = fc_mlp_of(w, spec["hidden_act"])

    def norm(x, prefix, name):
        return _layer_norm(mb, x, w[prefix + ".weight"], w[prefix + ".bias"], name, eps)

    @mb.program(input_specs=[mb.TensorSpec(shape=(1, d, 1, n)), mb.TensorSpec(shape=(1, 1, n))],
                opset_version=getattr(ct.target, target))
    def prog(embeddings, mask):
        x = mb.cast(x=embeddings, dtype="fp16", name="embeddings_fp16")
        mask = mb.cast(x=mask, dtype="fp16", name="mask_fp16")
        # `embed`: where the gather fault (faults.py) anchors.
        x = norm(x, "embeddings.norm", "embed")
        # Every query chunk adds the same row, broadcast over its queries.
        masks = [(c0, c1, mask) for c0, c1, _ in query_chunks(n, query_chunk)]
        for i in range(depth):
            x = _block(mb, x, w, i, spec, n, masks, norm, mlp, scale)
        outs = [mb.cast(x=x, dtype="fp32", name="last_hidden_state")]
        if spec["pooler"]:
            first = mb.slice_by_index(x=x, begin=[0, 0, 0, 0], end=[1, d, 1, 1], name="first_token")
            p = _conv(mb, first, w["pooler.weight"], w["pooler.bias"], "pooler")
            outs.append(mb.cast(x=mb.tanh(x=p, name="pooler_tanh"), dtype="fp32", name="pooler_output"))
        return tuple(outs)

    return prog


def _block(mb, x, w, i, spec, n, masks, norm, mlp, scale=1):
    """Post-norm block `i`: norm1(x + attn(x)), then norm2(x + mlp(x)), the
    block's output named `b<i>_out` (what the cosine gate taps and compares
    with the reference's block output).
    The adds keep the pre-norm blocks' names (`b{i}_res1`, `b{i}_res2`), which
    the overflow fault finds. With a residual scale S (`scale` > 1, the
    sublayers' last projections already divided by S), each add reads x
    multiplied by 1/S (`b{i}_res1_in`, `b{i}_res2_in`): the sums are the
    unscaled ones divided by S, which the norms undo."""
    b = f"blocks.{i}"

    def skip(x, k):
        return x if scale == 1 else mb.mul(x=x, y=_f16(1.0 / scale), name=f"b{i}_res{k}_in")

    a = _attention(mb, x, w, i, spec, n, None, None, masks)
    x = norm(mb.add(x=skip(x, 1), y=a, name=f"b{i}_res1"), b + ".norm1", f"b{i}_norm1")
    return norm(mb.add(x=skip(x, 2), y=mlp(mb, x, i), name=f"b{i}_res2"), b + ".norm2", f"b{i}_out")


def input_shapes(spec, tokens):
    """(name, shape) of each input of a bucket of `tokens` tokens, in order."""
    n = int(tokens)
    return [("embeddings", [1, spec["hidden_size"], 1, n]), ("mask", [1, 1, n])]


def output_names(spec):
    """The outputs of every bucket's function, in order."""
    return ["last_hidden_state", "pooler_output"] if spec["pooler"] else ["last_hidden_state"]


def save_packages(spec, weights, buckets, path, multifunction=True, metadata=None, **kw):
    """Build, convert, compress and save this family's packages (`emit.save_packages`)."""
    import sys

    for _, tokens in buckets:  # every bucket checked before anything is built
        check_spec(spec, tokens)
    _check_weights(spec, weights)
    return emit.save_packages(sys.modules[__name__], spec, weights, buckets, path, multifunction, metadata, **kw)
