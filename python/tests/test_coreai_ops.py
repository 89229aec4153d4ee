"""The Core AI translation against the interpreter, op form by op form.

Each case is a small ML program in the form the builders emit (fp32 inputs
cast to fp16, the op in fp16, the result cast back, as python/ane_export's
towers are written), saved as a package, translated into an `.aimodel` by
`ane_export.coreai.save_aimodel` and executed by Apple's Core AI runtime
(coreai-core, pinned), and executed by the project's interpreter
(`ane-export exec --precision fp16`). Both are compared with numpy in
float64 on the fp16-rounded inputs:

* ops that select or move values (reshape, transpose, slice, concat, casts)
  must give the interpreter's bits exactly;
* every other op must stay within a bound of the exact answer that fp16
  arithmetic allows (a few fp16 steps of the output's magnitude: `TOL16`),
  and so within twice that of the interpreter.

A disagreement is a bug in the translation, in the interpreter, or a quirk
of the runtime (docs/formats.md records the ones found). The tiny goldens'
whole towers are compared in the Rust tests (tests/it/coreai.rs).
"""

import numpy as np
import pytest
from test_interp_ops import build, rand, run

coreai = pytest.importorskip("ane_export.coreai")

#: fp16's relative step (2^-10): the bound of an fp16 output is a few of
#: these times the output's largest magnitude.
EPS16 = 2.0 ** -10
#: Steps allowed for ops that compute (sums over up to 64 terms, transcendentals).
TOL16 = 4 * EPS16


def _mb():
    from coremltools.converters.mil import Builder

    return Builder


def fp16(body):
    """`body` over fp16 copies of the inputs, its outputs cast back to fp32:
    the builders' form."""
    mb = _mb()

    def wrapped(*xs):
        ys = body(*[mb.cast(x=x, dtype="fp16") for x in xs])
        ys = ys if isinstance(ys, tuple) else (ys,)
        out = tuple(mb.cast(x=y, dtype="fp32") for y in ys)
        return out if len(out) > 1 else out[0]

    return wrapped


def run_coreai(tmp_path, pkg, inputs):
    """Translate the package's main function and run it with Core AI."""
    aim = tmp_path / f"{pkg.stem}.aimodel"
    summary = coreai.save_aimodel([(str(pkg), "main", "main")], str(aim))
    return coreai.run(str(aim), "main", inputs), summary


def compare(tmp_path, name, inputs, body, expect, exact=False, opset="iOS17", tol=TOL16):
    """Build `body` in fp16, run it both ways, compare (module doc)."""
    pkg, outputs = build(tmp_path, name, inputs, fp16(body), opset)
    r, interp = run(tmp_path, pkg, inputs, "fp16")
    assert r.returncode == 0, f"{name}: exec failed: {r.stderr}"
    got, summary = run_coreai(tmp_path, pkg, inputs)
    rounded = {k: v.astype(np.float16).astype(np.float64) for k, v in inputs.items()}
    want = expect(**rounded)
    want = want if isinstance(want, tuple) else (want,)
    assert set(got) == set(outputs), f"{name}: Core AI outputs {sorted(got)}, package {outputs}"
    for o, w in zip(outputs, want):
        g, i = got[o], interp[o]
        assert g.shape == i.shape, f"{name}: Core AI shape {g.shape}, interpreter {i.shape}"
        if exact:
            assert np.array_equal(g, i), f"{name}: Core AI differs from the interpreter"
            continue
        scale = max(float(np.abs(w).max()), 1e-6)
        err_c = float(np.abs(g - w).max()) / scale
        err_i = float(np.abs(i - w).max()) / scale
        assert err_i <= tol, f"{name}: interpreter {err_i:.2e} of the output's magnitude from numpy"
        assert err_c <= tol, f"{name}: Core AI {err_c:.2e} of the output's magnitude from numpy"
        gap = float(np.abs(g - i).max()) / scale
        assert gap <= 2 * tol, f"{name}: Core AI and the interpreter {gap:.2e} apart"
    return summary


def h(w):
    """A weight as the package stores it (fp16), in float64."""
    return np.asarray(w, np.float16).astype(np.float64)


# ---- the Linears (1x1 convolutions), norms and attention of the ANE layout

C, S = 24, 40
W = rand(32, C, 1, 1, lo=-0.3, hi=0.3)
B = rand(32, lo=-0.5, hi=0.5)


def conv1x1(x, w, b=None):
    y = np.einsum("oc,bchs->bohs", w[:, :, 0, 0], x)
    return y if b is None else y + b.reshape(1, -1, 1, 1)


def test_linear_as_conv_with_bias(tmp_path):
    mb = _mb()

    def body(x):
        return mb.conv(x=x, weight=W.astype(np.float16), bias=B.astype(np.float16), strides=[1, 1],
                       pad_type="valid", dilations=[1, 1], groups=1)

    s = compare(tmp_path, "conv", {"x": rand(1, C, 1, S)}, body, lambda x: conv1x1(x, h(W), h(B)))
    assert s["functions"]["main"]["ops"]["coreai.conv2d"] == 1


def test_conv_without_bias_grouped(tmp_path):
    mb = _mb()
    w = rand(C, C // 4, 1, 1, lo=-0.5, hi=0.5)

    def body(x):
        return mb.conv(x=x, weight=w.astype(np.float16), strides=[1, 1], pad_type="valid", groups=4)

    def want(x):
        g = C // 4
        return np.concatenate([conv1x1(x[:, i * g:(i + 1) * g], h(w)[i * g:(i + 1) * g]) for i in range(4)], 1)

    compare(tmp_path, "conv_groups", {"x": rand(1, C, 1, S)}, body, want)


def test_int8_weights(tmp_path):
    """`--weights int8`: int8 data with per-channel fp16 scales (iOS18's
    constexpr_blockwise_shift_scale) feeding the conv."""
    mb = _mb()
    q = np.random.default_rng(1).integers(-127, 128, (32, C, 1, 1)).astype(np.int8)
    sc = (np.random.default_rng(2).random((32, 1, 1, 1)) * 0.01 + 0.002).astype(np.float16)

    def body(x):
        w = mb.constexpr_blockwise_shift_scale(data=q, scale=sc)
        return mb.conv(x=x, weight=w, strides=[1, 1], pad_type="valid")

    s = compare(tmp_path, "int8", {"x": rand(1, C, 1, S)}, body,
                lambda x: conv1x1(x, q.astype(np.float64) * h(sc)), opset="iOS18")
    assert s["functions"]["main"]["ops"]["coreai.blockwise_shift_scale"] == 1


@pytest.mark.parametrize("bits", [6, 8])
def test_palettised_weights(tmp_path, bits):
    """`--weights pal6|pal8`: a per-tensor palette (iOS18's constexpr_lut_to_dense)."""
    from coremltools.converters.mil.mil import types

    mb = _mb()
    rng = np.random.default_rng(bits)
    idx = rng.integers(0, 2 ** bits, (32, C, 1, 1)).astype(np.uint8)
    lut = rng.uniform(-0.3, 0.3, (1, 1, 1, 1, 2 ** bits, 1)).astype(np.float16)
    stored = idx.astype(types.np_uint6_dtype) if bits == 6 else idx

    def body(x):
        w = mb.constexpr_lut_to_dense(indices=stored, lut=lut)
        return mb.conv(x=x, weight=w, strides=[1, 1], pad_type="valid")

    dense = h(lut[0, 0, 0, 0, :, 0])[idx]
    s = compare(tmp_path, f"pal{bits}", {"x": rand(1, C, 1, S)}, body, lambda x: conv1x1(x, dense),
                opset="iOS18")
    assert s["functions"]["main"]["ops"]["coreai.lut_to_dense"] == 1


@pytest.mark.parametrize("eps", [1e-5, 1e-6])
def test_layer_norm_over_channels(tmp_path, eps):
    mb = _mb()
    g, b = rand(C, lo=0.5, hi=1.5), rand(C, lo=-0.5, hi=0.5)

    def body(x):
        return mb.layer_norm(x=x, axes=[1], gamma=g.astype(np.float16), beta=b.astype(np.float16),
                             epsilon=np.float16(eps))

    def want(x):
        mu = x.mean(1, keepdims=True)
        var = ((x - mu) ** 2).mean(1, keepdims=True)
        return (x - mu) / np.sqrt(var + eps) * h(g).reshape(1, -1, 1, 1) + h(b).reshape(1, -1, 1, 1)

    compare(tmp_path, "layer_norm", {"x": rand(1, C, 1, S)}, body, want)


@pytest.mark.parametrize("scale", [1e-3, 30.0, 6000.0])
def test_layer_norm_of_massive_and_flat_columns(tmp_path, scale):
    """Columns whose centred values square past fp16's range (a tower's
    massive activations: 6000^2 overflows), tiny ones, and a flat column
    (every value equal: nothing to divide by), each normalised as numpy
    does; the plain composition (x - mean)^2 gives inf or 0 there."""
    mb = _mb()
    g, b = rand(C, lo=0.5, hi=1.5), rand(C, lo=-0.5, hi=0.5)
    x = rand(1, C, 1, S) * scale
    x[0, :, 0, 3] = 7.0
    x[0, 5, 0, 4] = 9.0 * scale

    def body(x):
        return mb.layer_norm(x=x, axes=[1], gamma=g.astype(np.float16), beta=b.astype(np.float16),
                             epsilon=np.float16(1e-5))

    def want(x):
        mu = x.mean(1, keepdims=True)
        var = ((x - mu) ** 2).mean(1, keepdims=True)
        return (x - mu) / np.sqrt(var + 1e-5) * h(g).reshape(1, -1, 1, 1) + h(b).reshape(1, -1, 1, 1)

    # fp16 inputs of 6000 carry 2^-11 relative rounding into the centred values.
    compare(tmp_path, f"layer_norm_{scale}", {"x": x}, body, want, tol=8 * EPS16)


@pytest.mark.parametrize("batch", [1, 2])
@pytest.mark.parametrize("tx,ty", [(False, True), (True, False), (False, False), (True, True)])
def test_matmul_with_transposes(tmp_path, tx, ty, batch):
    """The attention products as the builders write them, one head at a
    time (batch 1: scores q^T k over a head's channels, then v p^T), which
    the translation makes 1x1 convolutions, and batched (batch_matmul)."""
    mb = _mb()
    a = rand(batch, 16, S) if tx else rand(batch, S, 16)
    b = rand(batch, 36, 16) if ty else rand(batch, 16, 36)

    def body(x, y):
        return mb.matmul(x=x, y=y, transpose_x=tx, transpose_y=ty)

    def want(x, y):
        x = np.swapaxes(x, -1, -2) if tx else x
        y = np.swapaxes(y, -1, -2) if ty else y
        return x @ y

    s = compare(tmp_path, f"matmul_{tx}_{ty}_{batch}", {"x": a, "y": b}, body, want)
    ops = s["functions"]["main"]["ops"]
    assert ("coreai.conv2d" in ops) == (batch == 1), ops


def test_matmul_broadcasting_batch(tmp_path):
    mb = _mb()

    def body(x, y):
        return mb.matmul(x=x, y=y)

    compare(tmp_path, "matmul_bcast", {"x": rand(1, 3, S, 8), "y": rand(1, 1, 8, 12)}, body,
            lambda x, y: x @ y)


def test_softmax_last_axis(tmp_path):
    mb = _mb()

    def softmax(x):
        e = np.exp(x - x.max(-1, keepdims=True))
        return e / e.sum(-1, keepdims=True)

    compare(tmp_path, "softmax", {"x": rand(2, S, S, lo=-6, hi=6)}, lambda x: mb.softmax(x=x, axis=-1), softmax)


# ---- activations and the element-wise ops


def _gelu_exact(x):
    from math import erf

    return 0.5 * x * (1 + np.vectorize(erf)(x / np.sqrt(2)))


UNARY = {
    "gelu_exact": (lambda mb, x: mb.gelu(x=x, mode="EXACT"), _gelu_exact),
    "gelu_tanh": (lambda mb, x: mb.gelu(x=x, mode="TANH_APPROXIMATION"),
                  lambda x: 0.5 * x * (1 + np.tanh(np.sqrt(2 / np.pi) * (x + 0.044715 * x ** 3)))),
    "silu": (lambda mb, x: mb.silu(x=x), lambda x: x / (1 + np.exp(-x))),
    "sigmoid": (lambda mb, x: mb.sigmoid(x=x), lambda x: 1 / (1 + np.exp(-x))),
    "relu": (lambda mb, x: mb.relu(x=x), lambda x: np.maximum(x, 0)),
    "clip": (lambda mb, x: mb.clip(x=x, alpha=np.float16(-2.0), beta=np.float16(2.5)), lambda x: np.clip(x, -2, 2.5)),
    "abs": (lambda mb, x: mb.abs(x=x), lambda x: np.abs(x)),
}


@pytest.mark.parametrize("name", list(UNARY))
def test_activation(tmp_path, name):
    mb = _mb()
    op, f = UNARY[name]
    compare(tmp_path, name, {"x": rand(1, C, 1, S, lo=-6, hi=6)}, lambda x: op(mb, x), f)


@pytest.mark.parametrize("op,f", [("add", np.add), ("sub", np.subtract), ("mul", np.multiply)])
def test_binary_broadcasting_and_scalars(tmp_path, op, f):
    mb = _mb()
    k = np.float16(0.2886)

    def body(x, y):
        z = getattr(mb, op)(x=x, y=y)
        return getattr(mb, op)(x=z, y=k)

    compare(tmp_path, op, {"x": rand(1, C, 1, S), "y": rand(1, 1, 1, S)}, body,
            lambda x, y: f(f(x, y), float(k)))


# ---- data movement: bit for bit


def test_reshape_transpose_slice_concat(tmp_path):
    mb = _mb()

    def body(x):
        r = mb.reshape(x=x, shape=[1, 4, 6, S])
        t = mb.transpose(x=r, perm=[0, 3, 1, 2])
        s1 = mb.slice_by_index(x=t, begin=[0, 8, 0, 0], end=[1, 24, 4, 6])
        s2 = mb.slice_by_index(x=t, begin=[0, 0, 0, 0], end=[1, 16, 4, 6])
        return mb.concat(values=[s1, s2], axis=3), mb.concat(values=[s1, s2, s1], axis=1)

    def want(x):
        t = x.reshape(1, 4, 6, S).transpose(0, 3, 1, 2)
        s1, s2 = t[:, 8:24], t[:, 0:16]
        return np.concatenate([s1, s2], 3), np.concatenate([s1, s2, s1], 1)

    compare(tmp_path, "movement", {"x": rand(1, C, 1, S)}, body, want, exact=True)


def test_an_op_without_a_translation_is_named(tmp_path):
    mb = _mb()
    pkg, _ = build(tmp_path, "topk", {"x": rand(1, 8)}, fp16(lambda x: mb.topk(x=x, k=2)[0]))
    with pytest.raises(ValueError, match="topk"):
        coreai.save_aimodel([(str(pkg), "main", "main")], str(tmp_path / "t.aimodel"))
    assert not (tmp_path / "t.aimodel").exists()
