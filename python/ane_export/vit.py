"""What the families' MIL builders share: the layers of a pre-norm ViT in
the ANE layout. Every activation is (B, C, 1, S) with the sequence last
(ANE-RULES R1); every Linear is a 1x1 conv (R2); attention is split per head
with K used transposed once through matmul's transpose flags (R3), in query
chunks so that no score tensor exceeds chunk x N (R4); LayerNorm runs over the
channel axis; the additive mask uses -1e4, never -inf (R5). Scalars are fp16
constants: the programs are emitted in fp16.
"""

import numpy as np

#: Additive mask value: exactly 0 after exp in fp16, and -1e4 + scores cannot overflow (R5).
MASK_VALUE = -1e4
#: LayerNorm epsilon of the Qwen3-VL vision tower (representable in fp16, R5).
LN_EPS = 1e-6


def _f16(v):
    """A scalar as an fp16 constant, rounded from fp32 as the fp16 cast pass rounds."""
    return np.float32(v).astype(np.float16)


def _conv(mb, x, w, b, name):
    """A Linear as a 1x1 conv (R2): w [out, in, 1, 1], b [out] or None (no bias)."""
    return mb.conv(x=x, weight=w, bias=b, name=name)


def _layer_norm(mb, x, g, b, name, eps=LN_EPS):
    """LayerNorm over channels of a (B, C, 1, S) tensor."""
    return mb.layer_norm(x=x, axes=[1], gamma=g, beta=b, epsilon=_f16(eps), name=name)


def _merge(mb, x, dim, n, name):
    """(1, D, 1, N) -> (1, 4D, 1, N/4): 4 consecutive tokens become one row,
    channel j*D + c holding channel c of token 4m + j."""
    y = mb.reshape(x=x, shape=[1, dim, n // 4, 4], name=name + "_split")
    y = mb.transpose(x=y, perm=[0, 3, 1, 2], name=name + "_perm")  # (1, 4, D, N/4)
    return mb.reshape(x=y, shape=[1, 4 * dim, 1, n // 4], name=name + "_rows")


def _merger(mb, x, norm, fc1, fc2, prefix, dim, n, postshuffle, eps=LN_EPS):
    """The Qwen merger: LayerNorm `norm` = (gamma, beta) before merging 4
    tokens (after, over 4D, when `postshuffle`), then fc1 = (w, b), exact
    GELU, fc2 = (w, b)."""
    if postshuffle:
        y = _merge(mb, x, dim, n, prefix)
        y = _layer_norm(mb, y, norm[0], norm[1], prefix + "_norm", eps)
    else:
        y = _layer_norm(mb, x, norm[0], norm[1], prefix + "_norm", eps)
        y = _merge(mb, y, dim, n, prefix)
    y = _conv(mb, y, fc1[0], fc1[1], prefix + "_fc1")
    y = mb.gelu(x=y, mode="EXACT", name=prefix + "_gelu")
    return _conv(mb, y, fc2[0], fc2[1], prefix + "_fc2")


#: The `hidden_act` names `_activation` knows (transformers' ACT2FN names).
ACTIVATIONS = ("gelu", "gelu_new", "gelu_pytorch_tanh", "quick_gelu", "silu", "relu")


def _activation(mb, x, act, name):
    """The MLP activation named as transformers names it (`hidden_act`)."""
    if act in ("gelu_pytorch_tanh", "gelu_new"):
        return mb.gelu(x=x, mode="TANH_APPROXIMATION", name=name)
    if act == "gelu":
        return mb.gelu(x=x, mode="EXACT", name=name)
    if act == "quick_gelu":  # x * sigmoid(1.702 x)
        s = mb.sigmoid(x=mb.mul(x=x, y=_f16(1.702), name=name + "_scale"), name=name + "_sigmoid")
        return mb.mul(x=x, y=s, name=name)
    if act == "silu":
        return mb.silu(x=x, name=name)
    if act == "relu":
        return mb.relu(x=x, name=name)
    raise ValueError(f"hidden_act {act!r}: expected one of {', '.join(ACTIVATIONS)}")


#: Queries per attention chunk (ANE-RULES R4: score tensors of at most 512 x N).
QUERY_CHUNK = 512


def query_chunks(n, chunk):
    """Query chunks of a sequence without padding: (start, end, None), no mask."""
    if chunk <= 0 or n <= chunk:
        return [(0, n, None)]
    return [(c, min(c + chunk, n), None) for c in range(0, n, chunk)]


def _mask_chunks(mb, mask, n, chunk):
    """The mask's rows for each query chunk, sliced once for every head and block."""
    if chunk <= 0 or n <= chunk:
        return [(0, n, mask)]
    return [(c, min(c + chunk, n),
             mb.slice_by_index(x=mask, begin=[0, c, 0], end=[1, min(c + chunk, n), n], name=f"mask_q{c}"))
            for c in range(0, n, chunk)]


def _attention(mb, x, w, i, spec, n, cos, sin, masks, window=None, scale=None):
    """Block `i`'s attention. Full: each head's queries in chunks (`masks`,
    from `_mask_chunks`) against all N keys. Windowed (`window` = (S,
    window_mask [N/S, S, S])): the sequence is N/S windows of S slots, each
    head attends within each window through one batched matmul of
    [N/S, S, S] scores, never N x N (R4). A projection without bias (no
    `.qkv.bias` / `.proj.bias` in `w`) is a conv without one. `scale`: what
    the scores are multiplied by (default hd^-0.5 as an fp16 constant)."""
    d, heads = spec["hidden_size"], spec["num_heads"]
    hd = d // heads
    p = f"blocks.{i}.attn"
    qkv = _conv(mb, x, w[p + ".qkv.weight"], w.get(p + ".qkv.bias"), f"b{i}_qkv")  # (1, 3D, 1, N)
    scale = _f16(hd ** -0.5) if scale is None else scale
    outs = []
    for h in range(heads):  # R3: one attention per head
        def head(part, h=h):
            start = part * d + h * hd
            return mb.slice_by_index(x=qkv, begin=[0, start, 0, 0], end=[1, start + hd, 1, n],
                                     name=f"b{i}_h{h}_{'qkv'[part]}")

        def rope(t, tag, h=h):
            if cos is None:  # a family without rotary embeddings
                return t
            lo = mb.slice_by_index(x=t, begin=[0, 0, 0, 0], end=[1, hd // 2, 1, n], name=f"b{i}_h{h}_{tag}_lo")
            hi = mb.slice_by_index(x=t, begin=[0, hd // 2, 0, 0], end=[1, hd, 1, n], name=f"b{i}_h{h}_{tag}_hi")
            rot = mb.concat(values=[mb.mul(x=hi, y=_f16(-1.0), name=f"b{i}_h{h}_{tag}_neg"), lo], axis=1,
                            name=f"b{i}_h{h}_{tag}_rot")
            return mb.add(x=mb.mul(x=t, y=cos, name=f"b{i}_h{h}_{tag}_cos"),
                          y=mb.mul(x=rot, y=sin, name=f"b{i}_h{h}_{tag}_sin"), name=f"b{i}_h{h}_{tag}_rope")

        if window is not None:
            outs.append(_window_head(mb, rope(head(0), "q"), rope(head(1), "k"), head(2), window, scale, hd, n,
                                     f"b{i}_h{h}"))
            continue
        q = mb.reshape(x=rope(head(0), "q"), shape=[1, hd, n], name=f"b{i}_h{h}_q3")
        k = mb.reshape(x=rope(head(1), "k"), shape=[1, hd, n], name=f"b{i}_h{h}_k3")
        v = mb.reshape(x=head(2), shape=[1, hd, n], name=f"b{i}_h{h}_v3")
        ctx = []
        for c0, c1, mask in masks:  # R4: query chunks, K and V whole
            t = f"b{i}_h{h}" if len(masks) == 1 else f"b{i}_h{h}_q{c0}"
            qc = q if len(masks) == 1 else mb.slice_by_index(x=q, begin=[0, 0, c0], end=[1, hd, c1], name=f"{t}_q")
            s = mb.matmul(x=qc, y=k, transpose_x=True, name=f"{t}_scores")  # (1, chunk, N)
            s = mb.mul(x=s, y=scale, name=f"{t}_scaled")
            if mask is not None:  # None: every key is real (no padding)
                s = mb.add(x=s, y=mask, name=f"{t}_masked")
            a = mb.softmax(x=s, axis=-1, name=f"{t}_probs")
            ctx.append(mb.matmul(x=v, y=a, transpose_y=True, name=f"{t}_ctx"))  # (1, hd, chunk)
        o = ctx[0] if len(ctx) == 1 else mb.concat(values=ctx, axis=2, name=f"b{i}_h{h}_ctx")
        outs.append(mb.reshape(x=o, shape=[1, hd, 1, n], name=f"b{i}_h{h}_out"))
    o = mb.concat(values=outs, axis=1, name=f"b{i}_heads")
    return _conv(mb, o, w[p + ".proj.weight"], w.get(p + ".proj.bias"), f"b{i}_proj")


def _window_head(mb, q, k, v, window, scale, hd, n, t):
    """One head's attention within windows: q, k, v [1, hd, 1, N] -> [N/S, hd, S]
    (windows as the batch), scores [N/S, S, S] plus the window mask, softmax,
    context back to [1, hd, 1, N]."""
    slots, wmask = window
    nw = n // slots

    def split(x, tag):
        x = mb.reshape(x=x, shape=[hd, nw, slots], name=f"{t}_{tag}_w")
        return mb.transpose(x=x, perm=[1, 0, 2], name=f"{t}_{tag}_wt")  # (W, hd, S)

    q, k, v = split(q, "q"), split(k, "k"), split(v, "v")
    s = mb.matmul(x=q, y=k, transpose_x=True, name=f"{t}_scores")  # (W, S, S)
    s = mb.mul(x=s, y=scale, name=f"{t}_scaled")
    s = mb.add(x=s, y=wmask, name=f"{t}_masked")
    a = mb.softmax(x=s, axis=-1, name=f"{t}_probs")
    o = mb.matmul(x=v, y=a, transpose_y=True, name=f"{t}_ctx")  # (W, hd, S)
    o = mb.transpose(x=o, perm=[1, 0, 2], name=f"{t}_ctx_t")  # (hd, W, S)
    return mb.reshape(x=o, shape=[1, hd, 1, n], name=f"{t}_out")


def check_bucket(n):
    """A bucket of `n` patches, or ValueError."""
    if n <= 0 or n % 4:
        raise ValueError(f"bucket of {n} patches: expected a positive multiple of 4")


def rms_norm_of(w, eps):
    """`norm(mb, x, prefix, name)`: the RMSNorm `<prefix>.weight` of `w` over
    channels, x * rsqrt(mean(x^2) + eps) * weight, as a LayerNorm of
    [x, -x]: that has mean 0 and variance mean(x^2), so the op keeps the
    ANE's own normalisation (no fp16 sum of squares to overflow, R5). Its
    gamma is [weight, 0]; the first C channels are the result."""

    def norm(mb, x, prefix, name):
        g = w[prefix + ".weight"]
        c = g.shape[0]
        both = mb.concat(values=[x, mb.mul(x=x, y=_f16(-1.0), name=name + "_neg")], axis=1, name=name + "_pm")
        gamma = np.concatenate([g, np.zeros_like(g)])
        y = mb.layer_norm(x=both, axes=[1], gamma=gamma, beta=np.zeros_like(gamma), epsilon=_f16(eps),
                          name=name + "_ln")
        return mb.slice_by_index(x=y, begin=[0, 0, 0, 0], end=[1, c, 1, y.shape[3]], name=name)

    return norm


def layer_norm_of(w, eps):
    """`norm(mb, x, prefix, name)`: the LayerNorm `<prefix>.weight/.bias` of `w`."""
    return lambda mb, x, prefix, name: _layer_norm(mb, x, w[prefix + ".weight"], w[prefix + ".bias"], name, eps)


def fc_mlp_of(w, act):
    """`mlp(mb, h, i)`: block `i`'s MLP `blocks.<i>.mlp.fc2(act(fc1(h)))` of `w`, with biases."""

    def mlp(mb, h, i):
        b = f"blocks.{i}.mlp"
        h = _conv(mb, h, w[b + ".fc1.weight"], w[b + ".fc1.bias"], f"b{i}_fc1")
        h = _activation(mb, h, act, f"b{i}_act")
        return _conv(mb, h, w[b + ".fc2.weight"], w[b + ".fc2.bias"], f"b{i}_fc2")

    return mlp


def swiglu_mlp_of(w, hidden):
    """`mlp(mb, h, i)`: block `i`'s SwiGLU MLP of `w`: `blocks.<i>.mlp.gate_up`
    gives [gate, up] of `hidden` channels each, then `down(silu(gate) * up)`."""

    def mlp(mb, h, i):
        b = f"blocks.{i}.mlp"
        gu = _conv(mb, h, w[b + ".gate_up.weight"], w[b + ".gate_up.bias"], f"b{i}_gate_up")
        n = gu.shape[3]
        gate = mb.slice_by_index(x=gu, begin=[0, 0, 0, 0], end=[1, hidden, 1, n], name=f"b{i}_gate")
        up = mb.slice_by_index(x=gu, begin=[0, hidden, 0, 0], end=[1, 2 * hidden, 1, n], name=f"b{i}_up")
        g = mb.mul(x=mb.silu(x=gate, name=f"b{i}_silu"), y=up, name=f"b{i}_glu")
        return _conv(mb, g, w[b + ".down.weight"], w[b + ".down.bias"], f"b{i}_down")

    return mlp


def residual_scaled(weights, spec, entry, down="mlp.fc2"):
    """(weights, S): the weights that write the residual stream divided by
    `spec["residual_scale"]` S (1: unchanged; exact for a power of two away
    from fp16's subnormals): `entry`, the names that start the stream, and
    every block's attention output projection and MLP down projection
    (`blocks.<i>.attn.proj`, `blocks.<i>.<down>`: `mlp.fc2` unless the
    family names it otherwise). The stream is then x / S throughout, which
    every LayerNorm normalises as it does x (its epsilon weighing S^2 times
    more); the caller scales what it adds to the stream itself (position
    rows) by 1/S."""
    scale = spec.get("residual_scale") or 1
    if scale == 1:
        return weights, 1
    weights = dict(weights)
    names = list(entry) + [f"blocks.{i}.{m}.{k}" for i in range(spec["depth"]) for m in ("attn.proj", down)
                           for k in ("weight", "bias")]
    for k in names:
        if k in weights:  # a projection without bias has none to scale
            weights[k] = weights[k].astype("float32") / scale
    return weights, scale


def branch_scaled(weights, spec, up, down):
    """(weights, B): an MLP's hidden layer carried divided by
    `spec["branch_scale"]` B (1: unchanged), for every block: the projection
    that makes it, `up` (weight and bias, `blocks.<i>.mlp.<up>`), divided by
    B and the `down` projection's weight multiplied by B. Call it after
    `residual_scaled`, whose 1/S on `down` (weight and bias) it keeps: the
    down projection then writes the stream at its scale, W_d * B / S and
    b_d / S. Exact for a power of two away from fp16's range limits.

    A SwiGLU MLP (`up` = its `up` projection; the gate branch keeps its
    scale, silu not being linear): down'(silu(g) * u / B) = down(silu(g) *
    u), and the product and `up`'s output, which reach the thousands in
    trained Qwen2.5-VL towers (llama.cpp #17534), are B times smaller.

    A GELU MLP (`up` = fc1, `down` = fc2): fc1 writes z = x / B, which
    exceeds fp16's range in a trained Qwen3-VL tower (unsloth-zoo #720)
    unscaled, and the activation must then be `scaled_activation`, which
    gives act(x) / B for fc2 to read: W_2 B / S * act(x) / B + b_2 / S."""
    scale = spec.get("branch_scale") or 1
    if scale == 1:
        return weights, 1
    weights = dict(weights)
    for i in range(spec["depth"]):
        b = f"blocks.{i}.mlp"
        for k in (f"{b}.{up}.weight", f"{b}.{up}.bias"):
            if k in weights:
                weights[k] = weights[k].astype("float32") / scale
        k = f"{b}.{down}.weight"
        weights[k] = weights[k].astype("float32") * scale
        top = float(np.abs(weights[k]).max(initial=0.0))
        if top > 65504:
            raise ValueError(f"branch_scale {scale}: {k} reaches {top:.6g} multiplied by it, beyond fp16's "
                             "65,504; use a smaller branch scale")
    return weights, scale


#: Where the GELU family has saturated: for x >= 16, gelu(x), its tanh form
#: and quick GELU are x, and for x <= -16 they are 0, to within 2.4e-11
#: (quick GELU's -16 sigmoid(-27.2)), far below fp16's resolution.
GELU_SATURATED = 16.0


def scaled_activation(mb, z, act, scale, name):
    """act(x) / B from z = x / B, B = `scale` a power of two, on the Neural
    Engine and exactly: the activation runs on x clipped to [-16, 16]
    (`GELU_SATURATED`), B clip(z, -16 / B, 16 / B), which is x itself there
    (a power of two scales exactly), and the part of x beyond 16, where the
    activation is the identity, is added back scaled: relu(z - 16 / B). So

        act(B clip(z)) / B + relu(z - 16 / B) = act(x) / B

    for every x (below -16 both sides are 0 to within 2.4e-11), while no
    value the program holds exceeds |z| or 16. Five ops more than `act`."""
    if scale == 1:
        return _activation(mb, z, act, name)
    c = GELU_SATURATED / scale
    zc = mb.clip(x=z, alpha=_f16(-c), beta=_f16(c), name=name + "_clip")
    a = _activation(mb, mb.mul(x=zc, y=_f16(scale), name=name + "_in"), act, name + "_act")
    a = mb.mul(x=a, y=_f16(1.0 / scale), name=name + "_scaled")
    over = mb.relu(x=mb.sub(x=z, y=_f16(c), name=name + "_excess"), name=name + "_beyond")
    return mb.add(x=a, y=over, name=name)


def block(mb, x, w, i, spec, n, cos, sin, masks, norm, mlp, window=None, layer_scale=False):
    """Pre-norm block `i`: x + attn(norm1(x)), then x + mlp(norm2(x)).
    `norm(mb, x, prefix, name)` normalises; `mlp(mb, h, i)` is the MLP.
    With `layer_scale` each branch is multiplied by its LayerScale
    (`blocks.<i>.ls1`, `.ls2`, [1, D, 1, 1]) before the residual add."""
    b = f"blocks.{i}"

    def scaled(y, k):
        return mb.mul(x=y, y=w[f"{b}.ls{k}"], name=f"b{i}_ls{k}") if layer_scale else y

    h = norm(mb, x, b + ".norm1", f"b{i}_norm1")
    x = mb.add(x=x, y=scaled(_attention(mb, h, w, i, spec, n, cos, sin, masks, window), 1), name=f"b{i}_res1")
    h = norm(mb, x, b + ".norm2", f"b{i}_norm2")
    return mb.add(x=x, y=scaled(mlp(mb, h, i), 2), name=f"b{i}_res2")
