"""The interpreter against Core ML's op semantics, op by op.

Each case builds a small program with coremltools' MIL builder (the op under
test, its attributes and input forms, at the opset that writes them), saves
it as an ML program package, executes it with `ane-export exec` (the
project's interpreter, the executor of every Linux gate) and compares with
numpy:

* fp32: the interpreter's output against numpy in float64, within a
  relative tolerance of a few f32 ulps of the output's magnitude;
* fp16 emulation (`--precision fp16`, every op's output rounded to fp16):
  against numpy on the fp16-rounded inputs, in float64, rounded once to
  fp16 (the correctly rounded answer). Ops that only select, move or
  compute one correctly rounded IEEE operation must match bit for bit;
  the others (transcendentals, sums) may be one fp16 step away, where the
  exact value lies next to a rounding boundary.

The binary is the release build (`cargo build --release`; `make test` runs
the Rust tests, which build it, before these): set ANE_EXPORT_BIN to use
another. A missing binary fails the tests rather than skipping them.
"""

import json
import math
import os
import struct
import subprocess
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(os.environ.get("ANE_EXPORT_BIN", ROOT / "target" / "release" / "ane-export"))

F = np.float32
RNG = np.random.default_rng(20261201)


# ---- safetensors, the exec command's file format (f32 only here)


def save_st(path, tensors):
    header, blobs, off = {}, [], 0
    for name, a in tensors.items():
        a = np.ascontiguousarray(a)
        dtype = "I32" if a.dtype == np.int32 else "F32"
        a = a if dtype == "I32" else a.astype(np.float32)
        b = a.tobytes()
        header[name] = {"dtype": dtype, "shape": list(a.shape), "data_offsets": [off, off + len(b)]}
        blobs.append(b)
        off += len(b)
    h = json.dumps(header).encode()
    h += b" " * (-len(h) % 8)
    Path(path).write_bytes(struct.pack("<Q", len(h)) + h + b"".join(blobs))


def load_st(path):
    data = Path(path).read_bytes()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + n])
    out = {}
    for name, m in header.items():
        if name == "__metadata__":
            continue
        assert m["dtype"] == "F32", (name, m["dtype"])
        s, e = m["data_offsets"]
        out[name] = np.frombuffer(data[8 + n + s:8 + n + e], dtype=np.float32).reshape(m["shape"])
    return out


# ---- building and running one case


def build(tmp_path, name, inputs, body, opset="iOS17"):
    """Save a program `body(*input_vars) -> var or tuple` over fp32 inputs
    named as `inputs`; returns the package and its output names in order."""
    import coremltools as ct
    from coremltools.converters.mil import Builder as mb

    names = list(inputs)
    ns = {"body": body}
    exec(f"def prog({', '.join(names)}):\n    return body({', '.join(names)})", ns)
    specs = [mb.TensorSpec(shape=a.shape) for a in inputs.values()]
    prog = mb.program(input_specs=specs, opset_version=getattr(ct.target, opset))(ns["prog"])
    model = ct.convert(prog, convert_to="mlprogram", minimum_deployment_target=getattr(ct.target, opset),
                       compute_precision=ct.precision.FLOAT32, pass_pipeline=ct.PassPipeline([], "none"),
                       skip_model_load=True)
    path = tmp_path / f"{name}.mlpackage"
    model.save(str(path))
    return path, [o.name for o in model.get_spec().description.output]


def run(tmp_path, pkg, inputs, precision):
    inp = tmp_path / f"{pkg.stem}-in.safetensors"
    out = tmp_path / f"{pkg.stem}-{precision}.safetensors"
    save_st(inp, inputs)
    assert BIN.is_file(), f"{BIN}: build it first (cargo build --release, or make test)"
    r = subprocess.run([str(BIN), "exec", str(pkg), "--inputs", str(inp), "--out", str(out),
                        "--precision", precision], capture_output=True, text=True)
    return r, (load_st(out) if r.returncode == 0 else None)


def fp16_steps(got, want):
    """Distance in fp16 grid steps between two fp16-representable arrays."""
    g = got.astype(np.float16)
    assert np.array_equal(g.astype(np.float32), got, equal_nan=True), "not fp16 values"
    gi = g.view(np.int16).astype(np.int64)
    wi = want.astype(np.float16).view(np.int16).astype(np.int64)
    # Map sign-magnitude to a monotone integer line.
    gi = np.where(gi < 0, -(gi & 0x7FFF), gi)
    wi = np.where(wi < 0, -(wi & 0x7FFF), wi)
    return np.abs(gi - wi)


#: Whether the expectation being computed is fp16 emulation's: constants
#: the program holds (weights, gammas) are then rounded to fp16 as the
#: interpreter rounds them (`c`).
_FP16 = False


def c(w):
    """A constant of the program, as the current expectation sees it."""
    w = np.asarray(w, dtype=np.float64)
    return w.astype(np.float16).astype(np.float64) if _FP16 else w


def check(tmp_path, name, inputs, body, expect, opset="iOS17", exact16=False, fp16=True, rtol=2e-6):
    """Build, run in fp32 and fp16, and compare with `expect(**inputs)` (numpy, float64)."""
    global _FP16
    pkg, outputs = build(tmp_path, name, inputs, body, opset)
    r, out = run(tmp_path, pkg, inputs, "fp32")
    assert r.returncode == 0, f"{name}: exec failed: {r.stderr}"
    want = expect(**{k: v.astype(np.float64) for k, v in inputs.items()})
    want = want if isinstance(want, tuple) else (want,)
    got = [out[k] for k in outputs]
    assert len(got) == len(want), f"{name}: outputs {outputs}"
    for g, w in zip(got, want):
        w = np.asarray(w)
        assert g.shape == w.shape, f"{name}: shape {g.shape}, numpy {w.shape}"
        scale = max(np.abs(w).max(), 1e-30) if w.size else 1.0
        err = np.abs(g - w).max() if w.size else 0.0
        assert err <= rtol * scale + 1e-30, f"{name} fp32: max error {err} (scale {scale})"
    if not fp16:
        return
    r, out = run(tmp_path, pkg, inputs, "fp16")
    assert r.returncode == 0, f"{name}: exec fp16 failed: {r.stderr}"
    rounded = {k: v.astype(np.float16).astype(np.float64) for k, v in inputs.items()}
    _FP16 = True
    try:
        want16 = expect(**rounded)
    finally:
        _FP16 = False
    want16 = want16 if isinstance(want16, tuple) else (want16,)
    got = [out[k] for k in outputs]
    for g, w in zip(got, want16):
        w = np.asarray(w)
        if not w.size:
            continue
        steps = fp16_steps(g, w)
        allowed = 0 if exact16 else 1
        assert steps.max() <= allowed, (
            f"{name} fp16: {int(steps.max())} fp16 steps from the correctly rounded answer "
            f"(allowed {allowed}) at {np.unravel_index(steps.argmax(), steps.shape)}")


def rand(*shape, lo=-2.0, hi=2.0):
    return RNG.uniform(lo, hi, size=shape).astype(F)


def mb():
    from coremltools.converters.mil import Builder

    return Builder


# ---- elementwise binaries: ranks 1 to 5, broadcasting, scalars

BINARY = {
    "add": np.add,
    "sub": np.subtract,
    "mul": np.multiply,
    "real_div": np.divide,
    "maximum": np.maximum,
    "minimum": np.minimum,
}
SHAPES = [
    ((7,), (7,)),
    ((3, 5), (1, 5)),
    ((2, 3, 4), (3, 1)),
    ((2, 1, 4, 5), (1, 3, 1, 5)),
    ((2, 3, 2, 4, 3), (1, 3, 1, 4, 1)),
    ((2, 3, 2, 4, 3), (1,)),
]


@pytest.mark.parametrize("op", list(BINARY))
@pytest.mark.parametrize("shapes", SHAPES, ids=lambda s: f"{len(s[0])}d")
def test_binary(tmp_path, op, shapes):
    a, b = rand(*shapes[0]), rand(*shapes[1], lo=0.5, hi=2.0)
    check(tmp_path, f"{op}_{len(shapes[0])}", {"x": a, "y": b},
          lambda x, y: getattr(mb(), op)(x=x, y=y), lambda x, y: BINARY[op](x, y), exact16=True)


@pytest.mark.parametrize("shapes", SHAPES, ids=lambda s: f"{len(s[0])}d")
def test_pow(tmp_path, shapes):
    check(tmp_path, "pow", {"x": rand(*shapes[0], lo=0.5, hi=2), "y": rand(*shapes[1], lo=-2, hi=2)},
          lambda x, y: mb().pow(x=x, y=y), lambda x, y: np.power(x, y))


def test_pow_int32(tmp_path):
    x = RNG.integers(-9, 10, size=(2, 3, 4)).astype(F)
    y = RNG.integers(0, 5, size=(3, 1)).astype(F)

    def body(x, y):
        m = mb()
        return m.cast(x=m.pow(x=m.cast(x=x, dtype="int32"), y=m.cast(x=y, dtype="int32")), dtype="fp32")

    check(tmp_path, "pow_int32", {"x": x, "y": y}, body, lambda x, y: np.power(x, y), fp16=False)


@pytest.mark.parametrize("precision", ["fp32", "fp16", "ane"])
def test_real_div_of_int32_inputs_truncates(tmp_path, precision):
    """A function whose inputs are declared int32 (as coremltools' own op
    tests declare them) divides them in integers: 10 / 11 is 0, -7 / 2 is
    -3 (the interpreter once took every input as f32 and gave 0.909)."""
    import coremltools as ct
    from coremltools.converters.mil import Builder as m

    x = np.array([10, -7, 7, 100, -100, 9], dtype=np.int32)
    y = np.array([11, 2, -2, 7, 7, 3], dtype=np.int32)

    int32 = ct.converters.mil.mil.types.int32

    @m.program(input_specs=[m.TensorSpec(shape=x.shape, dtype=int32), m.TensorSpec(shape=y.shape, dtype=int32)],
               opset_version=ct.target.iOS17)
    def prog(x, y):
        return m.cast(x=m.real_div(x=x, y=y), dtype="fp32")

    model = ct.convert(prog, convert_to="mlprogram", minimum_deployment_target=ct.target.iOS17,
                       compute_precision=ct.precision.FLOAT32, pass_pipeline=ct.PassPipeline([], "none"),
                       skip_model_load=True)
    pkg = tmp_path / "real_div_int_inputs.mlpackage"
    model.save(str(pkg))
    out_name = model.get_spec().description.output[0].name
    r, out = run(tmp_path, pkg, {"x": x, "y": y}, precision)
    assert r.returncode == 0, r.stderr
    np.testing.assert_array_equal(out[out_name], np.trunc(x / y).astype(np.float32))


def test_real_div_on_int32_truncates(tmp_path):
    """Core ML divides int32 by int32 in integers (10 / 11 is 0, -7 / 2 is -3)."""
    x = np.array([10, -7, 7, 100, -100, 9], dtype=F)
    y = np.array([11, 2, -2, 7, 7, 3], dtype=F)

    def body(x, y):
        m = mb()
        q = m.real_div(x=m.cast(x=x, dtype="int32"), y=m.cast(x=y, dtype="int32"))
        return m.cast(x=q, dtype="fp32")

    check(tmp_path, "real_div_int32", {"x": x, "y": y}, body, lambda x, y: np.trunc(x / y), fp16=False)


@pytest.mark.parametrize("op", list(BINARY))
def test_binary_int32(tmp_path, op):
    """int32 operands (made by casts, as converters make them): integer results."""
    x = RNG.integers(-50, 50, size=(2, 3, 4)).astype(F)
    y = RNG.integers(1, 9, size=(3, 1)).astype(F) * RNG.choice([-1, 1], size=(3, 1)).astype(F)

    def body(x, y):
        m = mb()
        r = getattr(m, op)(x=m.cast(x=x, dtype="int32"), y=m.cast(x=y, dtype="int32"))
        return m.cast(x=r, dtype="fp32")

    want = (lambda x, y: np.trunc(x / y)) if op == "real_div" else (lambda x, y: BINARY[op](x, y))
    check(tmp_path, f"{op}_int32", {"x": x, "y": y}, body, want, fp16=False)


def _i32(v):
    return np.array([v], dtype=np.int32)


def test_int32_arithmetic_is_exact_beyond_f32(tmp_path):
    """int32 results beyond 2^24, where f32 would round, are exact; each is
    brought back below 2^24 inside the program, so the fp32 output holds it."""
    x = np.array([0, 1, 2, 3, -5, 999], dtype=F)

    def body(x):
        m = mb()
        xi = m.cast(x=x, dtype="int32")
        add = m.sub(x=m.add(x=xi, y=_i32(16777217)), y=_i32(16777216))
        mul = m.sub(x=m.mul(x=m.add(x=xi, y=_i32(4096)), y=_i32(4097)), y=_i32(4096 * 4097))
        div = m.sub(x=m.real_div(x=m.add(x=xi, y=_i32(2 ** 30)), y=_i32(3)), y=_i32(2 ** 30 // 3))
        mx = m.sub(x=m.maximum(x=m.add(x=xi, y=_i32(2 ** 28 + 1)), y=_i32(2 ** 28 + 2)), y=_i32(2 ** 28))
        return tuple(m.cast(x=v, dtype="fp32") for v in (add, mul, div, mx))

    def want(x):
        xs = [int(v) for v in x]
        return (np.array([v + 1 for v in xs], float), np.array([v * 4097 for v in xs], float),
                np.array([int((v + 2 ** 30) / 3) - 2 ** 30 // 3 for v in xs], float),
                np.array([max(v + 2 ** 28 + 1, 2 ** 28 + 2) - 2 ** 28 for v in xs], float))

    check(tmp_path, "int32_exact", {"x": x}, body, want, fp16=False, rtol=0)


@pytest.mark.parametrize("op,y,message", [
    ("add", 1, "outside int32's range"),
    ("mul", 2, "outside int32's range"),
    ("real_div", 0, "by 0"),
    ("pow", -1, "negative exponent"),
])
def test_int32_results_core_ml_may_not_give_are_refused(tmp_path, op, y, message):
    """A result beyond int32, a division by zero or a negative exponent is an
    error naming the op, not a wrapped or float value."""
    def body(x):
        m = mb()
        big = m.add(x=m.cast(x=x, dtype="int32"), y=_i32(2 ** 31 - 2))
        return m.cast(x=getattr(m, op)(x=big, y=_i32(y)), dtype="fp32")

    inputs = {"x": np.array([1.0], dtype=F)}
    pkg, _ = build(tmp_path, f"refuse_{op}", inputs, body)
    r, _ = run(tmp_path, pkg, inputs, "fp32")
    assert r.returncode == 2, (r.returncode, r.stderr)
    assert op in r.stderr and message in r.stderr, r.stderr


INT32_OPS = [
    ("reshape", lambda m, t: m.reshape(x=t, shape=[4, -1]), lambda x: x.reshape(4, -1)),
    ("transpose", lambda m, t: m.transpose(x=t, perm=[2, 0, 1]), lambda x: np.transpose(x, (2, 0, 1))),
    ("concat", lambda m, t: m.concat(values=[t, t], axis=1, interleave=True),
     lambda x: np.stack([x, x], axis=2).reshape(2, 12, 5)),
    ("slice", lambda m, t: m.slice_by_index(x=t, begin=[0, 5, 0], end=[2, 0, 5], stride=[1, -2, 2]),
     lambda x: x[0:2, 5:0:-2, 0:5:2]),
    ("gather", lambda m, t: m.gather(x=t, indices=np.array([5, 0, -1], dtype=np.int32), axis=1),
     lambda x: np.take(x, [5, 0, -1], axis=1)),
    ("expand_squeeze", lambda m, t: m.squeeze(x=m.expand_dims(x=t, axes=[1]), axes=[1]), lambda x: x),
    ("split", lambda m, t: m.split(x=t, split_sizes=[2, 3], axis=-1), lambda x: (x[..., :2], x[..., 2:])),
    ("abs", lambda m, t: m.abs(x=t), lambda x: np.abs(x)),
    ("square", lambda m, t: m.square(x=t), lambda x: x * x),
    ("reduce_sum", lambda m, t: m.reduce_sum(x=t, axes=[0, 2], keep_dims=True),
     lambda x: x.sum(axis=(0, 2), keepdims=True)),
    ("reduce_max", lambda m, t: m.reduce_max(x=t, axes=[-1]), lambda x: x.max(axis=-1)),
]


@pytest.mark.parametrize("name,op,want", INT32_OPS, ids=[o[0] for o in INT32_OPS])
def test_int32_tensors(tmp_path, name, op, want):
    """Ops that take int32 keep it: exact integers (the data movement ops on
    values up to 2^24, which the fp32 input and output hold exactly)."""
    big = name not in ("square", "reduce_sum")
    x = RNG.integers(-2 ** 24 if big else -2000, 2 ** 24 if big else 2000, size=(2, 6, 5)).astype(F)

    def body(x):
        m = mb()
        y = op(m, m.cast(x=x, dtype="int32"))
        ys = y if isinstance(y, (list, tuple)) else (y,)
        return tuple(m.cast(x=v, dtype="fp32") for v in ys)

    check(tmp_path, f"int32_{name}", {"x": x}, body, want, fp16=False, rtol=0)


def test_integer_reduce_mean_is_refused(tmp_path):
    inputs = {"x": np.array([1.0, 2.0], dtype=F)}
    pkg, _ = build(tmp_path, "int_mean", inputs,
                   lambda x: mb().cast(x=mb().reduce_mean(x=mb().cast(x=x, dtype="int32"), axes=[0]),
                                       dtype="fp32"))
    r, _ = run(tmp_path, pkg, inputs, "fp32")
    assert r.returncode == 2 and "reduce_mean" in r.stderr and "integer" in r.stderr, r.stderr


def test_float_only_op_refuses_an_integer_input(tmp_path):
    """coremltools' builder never writes an int32 `x` into `exp`; a program
    edited to do so is refused when the op runs, naming the op."""
    import coremltools as ct

    inputs = {"x": np.array([1.0, 2.0], dtype=F)}

    def body(x):
        m = mb()
        xi = m.cast(x=x, dtype="int32", name="xi")
        return m.add(x=m.exp(x=x, name="e"), y=m.cast(x=m.abs(x=xi), dtype="fp32"))

    pkg, _ = build(tmp_path, "float_only", inputs, body)
    model = ct.models.MLModel(str(pkg), skip_model_load=True)
    spec = model.get_spec()
    fn = spec.mlProgram.functions["main"]
    (exp_op,) = [o for o in fn.block_specializations[fn.opset].operations if o.type == "exp"]
    exp_op.inputs["x"].arguments[0].name = "xi"
    edited = tmp_path / "edited.mlpackage"
    ct.models.MLModel(spec, weights_dir=model.weights_dir, skip_model_load=True).save(str(edited))
    r, _ = run(tmp_path, edited, inputs, "fp32")
    assert r.returncode == 2 and "`exp`" in r.stderr and "fp16 and fp32 only" in r.stderr, r.stderr


# ---- elementwise unaries and their attributes


def _gelu(mode):
    def f(x):
        if mode == "EXACT":
            return 0.5 * x * (1 + np.vectorize(math.erf)(x / math.sqrt(2)))
        if mode == "TANH_APPROXIMATION":
            return 0.5 * x * (1 + np.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x ** 3)))
        return x / (1 + np.exp(-1.702 * x))

    return f


UNARY = [
    ("sqrt", {}, lambda x: np.sqrt(x), (0.1, 4), True),
    ("rsqrt", {"epsilon": 0.5}, lambda x: 1 / np.sqrt(x + 0.5), (0.1, 4), False),
    ("exp", {}, np.exp, (-4, 4), False),
    ("tanh", {}, np.tanh, (-3, 3), False),
    ("sigmoid", {}, lambda x: 1 / (1 + np.exp(-x)), (-4, 4), False),
    ("relu", {}, lambda x: np.maximum(x, 0), (-2, 2), True),
    ("silu", {}, lambda x: x / (1 + np.exp(-x)), (-4, 4), False),
    ("abs", {}, np.abs, (-2, 2), True),
    ("log", {}, np.log, (0.1, 4), False),
    ("log", {"epsilon": 1.0}, lambda x: np.log(x + 1.0), (0.1, 4), False),
    ("square", {}, lambda x: x * x, (-2, 2), True),
    ("erf", {}, np.vectorize(math.erf), (-2, 2), False),
    ("inverse", {"epsilon": 0.25}, lambda x: 1 / (x + 0.25), (0.1, 4), False),
    ("clip", {"alpha": -0.5, "beta": 0.75}, lambda x: np.clip(x, -0.5, 0.75), (-2, 2), True),
    ("gelu", {"mode": "EXACT"}, _gelu("EXACT"), (-3, 3), False),
    ("gelu", {"mode": "TANH_APPROXIMATION"}, _gelu("TANH_APPROXIMATION"), (-3, 3), False),
    ("gelu", {"mode": "SIGMOID_APPROXIMATION"}, _gelu("SIGMOID_APPROXIMATION"), (-3, 3), False),
]


@pytest.mark.parametrize("op,attrs,f,rng,exact", UNARY,
                         ids=[f"{u[0]}-{'-'.join(f'{k}={v}' for k, v in u[1].items())}" for u in UNARY])
def test_unary(tmp_path, op, attrs, f, rng, exact):
    x = rand(2, 3, 5, lo=rng[0], hi=rng[1])
    check(tmp_path, op, {"x": x}, lambda x: getattr(mb(), op)(x=x, **attrs), lambda x: f(x), exact16=exact)


RANKS = [(7,), (3, 5), (2, 3, 4), (2, 1, 3, 4), (2, 3, 1, 2, 3)]


@pytest.mark.parametrize("shape", RANKS, ids=lambda s: f"{len(s)}d")
def test_ranks_1_to_5(tmp_path, shape):
    """Elementwise, softmax, reductions, layer_norm, concat and slicing on
    every rank from 1 to 5 (one program each rank)."""
    x = rand(*shape)
    r = len(shape)

    def body(x):
        m = mb()
        return (m.gelu(x=x, mode="EXACT"), m.relu(x=x), m.softmax(x=x, axis=0),
                m.reduce_sum(x=x, axes=[-1], keep_dims=True), m.layer_norm(x=x, axes=[r - 1], epsilon=1e-5),
                m.concat(values=[x, x], axis=r - 1),
                m.slice_by_index(x=x, begin=[0] * r, end=list(shape), stride=[1] * (r - 1) + [-1],
                                 begin_mask=[True] * r, end_mask=[True] * r))

    def want(x):
        e = np.exp(x - x.max(axis=0, keepdims=True))
        m = x.mean(axis=-1, keepdims=True)
        v = ((x - m) ** 2).mean(axis=-1, keepdims=True)
        return (_gelu("EXACT")(x), np.maximum(x, 0), e / e.sum(axis=0, keepdims=True), x.sum(axis=-1, keepdims=True),
                (x - m) / np.sqrt(v + 1e-5), np.concatenate([x, x], axis=-1), x[..., ::-1])

    check(tmp_path, f"ranks{r}", {"x": x}, body, want, rtol=1e-5)


# ---- reductions, softmax, layer_norm


@pytest.mark.parametrize("op,f", [("reduce_sum", np.sum), ("reduce_mean", np.mean), ("reduce_max", np.max)])
@pytest.mark.parametrize("axes,keep", [(None, False), ([0], False), ([-1, 1], True), ([2], True)])
def test_reductions(tmp_path, op, f, axes, keep):
    x = rand(2, 3, 4, 5)
    kw = {"keep_dims": keep} if axes is None else {"axes": axes, "keep_dims": keep}
    ax = None if axes is None else tuple(axes)
    check(tmp_path, op, {"x": x}, lambda x: getattr(mb(), op)(x=x, **kw),
          lambda x: f(x, axis=ax, keepdims=keep), exact16=(op == "reduce_max"))


@pytest.mark.parametrize("axis", [-1, 0, 2])
def test_softmax(tmp_path, axis):
    x = rand(3, 4, 6, lo=-4, hi=4)

    def sm(x):
        e = np.exp(x - x.max(axis=axis, keepdims=True))
        return e / e.sum(axis=axis, keepdims=True)

    check(tmp_path, "softmax", {"x": x}, lambda x: mb().softmax(x=x, axis=axis), sm)


@pytest.mark.parametrize("axes,affine", [([1], True), ([-1], False), ([2, 3], True)])
def test_layer_norm(tmp_path, axes, affine):
    x = rand(2, 6, 3, 4)
    shape = [x.shape[a] for a in axes]
    g, b = rand(*shape, lo=0.5, hi=1.5), rand(*shape)
    kw = {"gamma": g, "beta": b} if affine else {}

    def ln(x):
        ax = tuple(axes)
        m = x.mean(axis=ax, keepdims=True)
        v = ((x - m) ** 2).mean(axis=ax, keepdims=True)
        y = (x - m) / np.sqrt(v + 1e-5)
        if affine:
            bs = [1] * x.ndim
            for a in axes:
                bs[a] = x.shape[a]
            y = y * c(g).reshape(bs) + c(b).reshape(bs)
        return y

    check(tmp_path, "layer_norm", {"x": x}, lambda x: mb().layer_norm(x=x, axes=axes, epsilon=1e-5, **kw), ln,
          rtol=1e-5)


# ---- shapes and data movement


@pytest.mark.parametrize("shape,opset,want", [
    ([6, 4], "iOS15", (6, 4)),
    ([-1, 8], "iOS15", (3, 8)),
    ([0, 0, -1], "iOS15", (2, 3, 4)),
    ([0, -1, 2], "iOS15", (2, 6, 2)),
    ([1, 0, -1, 0], "iOS17", (1, 2, 3, 4)),
    ([0, 0, 4], "iOS17", (2, 3, 4)),
])
def test_reshape(tmp_path, shape, opset, want):
    x = rand(2, 3, 4)
    check(tmp_path, "reshape", {"x": x}, lambda x: mb().reshape(x=x, shape=shape),
          lambda x: x.reshape(want), opset=opset, exact16=True)


def test_transpose_rank5(tmp_path):
    check(tmp_path, "transpose", {"x": rand(2, 3, 4, 1, 5)}, lambda x: mb().transpose(x=x, perm=[4, 0, 2, 3, 1]),
          lambda x: np.transpose(x, (4, 0, 2, 3, 1)), exact16=True)


def test_expand_dims_and_squeeze(tmp_path):
    def body(x):
        m = mb()
        return m.squeeze(x=m.expand_dims(x=x, axes=[0, -1]), axes=[0])

    check(tmp_path, "expand_squeeze", {"x": rand(3, 4)}, body, lambda x: x[:, :, None], exact16=True)


@pytest.mark.parametrize("axis,interleave", [(-1, False), (0, False), (1, True)])
def test_concat(tmp_path, axis, interleave):
    a, b = rand(2, 3, 4), rand(2, 3, 4)

    def want(x, y):
        if not interleave:
            return np.concatenate([x, y], axis=axis)
        s = list(x.shape)
        s[axis] *= 2
        return np.stack([x, y], axis=axis + 1).reshape(s)

    check(tmp_path, "concat", {"x": a, "y": b},
          lambda x, y: mb().concat(values=[x, y], axis=axis, interleave=interleave), want, exact16=True)


def test_split(tmp_path):
    def body(x):
        m = mb()
        p = m.split(x=x, split_sizes=[1, 3, 2], axis=-1)
        q = m.split(x=x, num_splits=2, axis=0)
        return (*p, *q)

    check(tmp_path, "split", {"x": rand(4, 3, 6)}, body,
          lambda x: (x[..., :1], x[..., 1:4], x[..., 4:], x[:2], x[2:]), exact16=True)


@pytest.mark.parametrize("begin,end,stride,masks,want", [
    ([0, 1, 0], [2, 3, 6], [1, 1, 2], {}, lambda x: x[0:2, 1:3, 0:6:2]),
    ([1, 0, -1], [2, 3, 0], [1, 1, -1], {"end_mask": [False, False, True]}, lambda x: x[1:2, 0:3, ::-1]),
    ([0, 2, 5], [2, 0, 1], [1, -1, -2], {}, lambda x: x[0:2, 2:0:-1, 5:1:-2]),
    ([0, 1, 0], [0, 2, 0], [1, 1, 1], {"begin_mask": [True, False, True], "end_mask": [True, False, True],
                                        "squeeze_mask": [False, True, False]}, lambda x: x[:, 1, :]),
], ids=["strided", "reverse-last", "negative-strides", "squeeze"])
def test_slice_by_index(tmp_path, begin, end, stride, masks, want):
    check(tmp_path, "slice", {"x": rand(2, 3, 6)},
          lambda x: mb().slice_by_index(x=x, begin=begin, end=end, stride=stride, **masks), want, exact16=True)


def test_gather(tmp_path):
    idx = np.array([2, 0, 1, 2], dtype=np.int32)
    check(tmp_path, "gather", {"x": rand(3, 4, 2)}, lambda x: mb().gather(x=x, indices=idx, axis=0),
          lambda x: np.take(x, idx, axis=0), exact16=True)


def test_cast_to_int32_truncates(tmp_path):
    x = np.array([1.7, -1.7, 2.5, -0.4, 3.0], dtype=F)
    check(tmp_path, "cast", {"x": x}, lambda x: mb().cast(x=mb().cast(x=x, dtype="int32"), dtype="fp32"),
          lambda x: np.trunc(x), fp16=False)


# ---- linear, matmul, conv


def test_linear(tmp_path):
    w, b = rand(5, 4), rand(5)
    check(tmp_path, "linear", {"x": rand(2, 3, 4)}, lambda x: mb().linear(x=x, weight=w, bias=b),
          lambda x: x @ c(w).T + c(b))


@pytest.mark.parametrize("xs,ys,tx,ty", [
    ((3, 4), (4, 5), False, False),
    ((2, 4, 3), (2, 4, 5), True, False),
    ((2, 3, 4), (1, 5, 4), False, True),
    ((2, 1, 3, 3, 4), (1, 2, 1, 4, 5), False, False),
    ((2, 2, 3, 4, 5), (2, 1, 3, 5, 3), False, False),
], ids=["2d", "3d-tx", "3d-bcast-ty", "5d-bcast", "5d"])
def test_matmul(tmp_path, xs, ys, tx, ty):
    def want(x, y):
        a = np.swapaxes(x, -1, -2) if tx else x
        b = np.swapaxes(y, -1, -2) if ty else y
        return np.matmul(a, b)

    check(tmp_path, "matmul", {"x": rand(*xs), "y": rand(*ys)},
          lambda x, y: mb().matmul(x=x, y=y, transpose_x=tx, transpose_y=ty), want, rtol=4e-6)


def conv_nd(x, w, b, strides, dilations, pads, groups):
    """Cross-correlation, NC[spatial], pads as (before, after) per spatial axis."""
    n, cin = x.shape[:2]
    cout, cpg = w.shape[:2]
    k = w.shape[2:]
    x = np.pad(x, [(0, 0), (0, 0)] + list(pads))
    sp = x.shape[2:]
    out_sp = [(sp[i] - dilations[i] * (k[i] - 1) - 1) // strides[i] + 1 for i in range(len(k))]
    y = np.zeros((n, cout, *out_sp))
    opg = cout // groups
    for o in np.ndindex(*out_sp):
        for kk in np.ndindex(*k):
            idx = tuple(o[i] * strides[i] + kk[i] * dilations[i] for i in range(len(k)))
            patch = x[(slice(None), slice(None)) + idx]  # (n, cin)
            for g in range(groups):
                y[(slice(None), slice(g * opg, (g + 1) * opg)) + o] += (
                    patch[:, g * cpg:(g + 1) * cpg] @ w[(slice(g * opg, (g + 1) * opg), slice(None)) + kk].T)
    if b is not None:
        y += b.reshape((1, -1) + (1,) * len(k))
    return y


@pytest.mark.parametrize("spatial,k,strides,dilations,pad_type,groups", [
    ((6, 7), (3, 3), [1, 1], [1, 1], "valid", 1),
    ((6, 7), (3, 2), [2, 1], [1, 1], "valid", 1),
    ((7, 9), (3, 3), [1, 2], [2, 1], "same", 1),
    ((6, 8), (2, 3), [2, 2], [1, 1], "custom", 2),
    ((7, 8), (2, 3), [2, 3], [1, 1], "same_lower", 1),
    ((9,), (3,), [2], [1], "valid", 1),
    ((4, 5, 6), (2, 3, 2), [1, 2, 1], [1, 1, 2], "valid", 1),
], ids=["2d", "2d-strides", "2d-dilated-same", "2d-custom-groups", "2d-same-lower", "1d", "3d"])
def test_conv(tmp_path, spatial, k, strides, dilations, pad_type, groups):
    cin, cout = 4, 6
    x = rand(1, cin, *spatial)
    w = rand(cout, cin // groups, *k, lo=-0.5, hi=0.5)
    b = rand(cout)
    nd = len(k)
    if pad_type == "valid":
        pads = [(0, 0)] * nd
        kw = {}
    elif pad_type == "custom":
        pads = [(1, 0), (0, 2)][:nd]
        kw = {"pad": [p for pair in pads for p in pair]}
    else:  # same: output = ceil(in / stride), the odd padding after (same_lower: before)
        pads = []
        for i in range(nd):
            eff = dilations[i] * (k[i] - 1) + 1
            out = -(-spatial[i] // strides[i])
            total = max((out - 1) * strides[i] + eff - spatial[i], 0)
            lo = total // 2 if pad_type == "same" else total - total // 2
            pads.append((lo, total - lo))
        assert pad_type == "same" or any(p[0] != p[1] for p in pads), "the case must have odd padding"
        kw = {}
    check(tmp_path, "conv", {"x": x},
          lambda x: mb().conv(x=x, weight=w, bias=b, strides=strides, dilations=dilations, pad_type=pad_type,
                              groups=groups, **kw),
          lambda x: conv_nd(x, c(w), c(b), strides, dilations, pads, groups),
          rtol=4e-6)


# ---- compressed weights: every opset form coremltools writes


def test_constexpr_affine_dequantize_ios16(tmp_path):
    """iOS16's op keeps quantized_data, zero_point, scale and axis as attributes."""
    q = RNG.integers(0, 255, size=(4, 3), dtype=np.uint8)
    zp = np.array([128, 120, 130, 127], dtype=np.uint8)
    sc = np.array([0.01, 0.02, 0.015, 0.03], dtype=F)

    def body(x):
        m = mb()
        w = m.constexpr_affine_dequantize(quantized_data=q, zero_point=zp, scale=sc, axis=0)
        return m.add(x=x, y=w)

    deq = (q.astype(np.float64) - zp[:, None]) * sc.astype(np.float64)[:, None]
    check(tmp_path, "affine", {"x": rand(4, 3)}, body, lambda x: x + c(deq), opset="iOS16", rtol=4e-6)


def test_constexpr_lut_to_dense_ios16(tmp_path):
    """iOS16's op keeps lut, indices and shape as attributes (2-bit indices packed)."""
    lut = np.array([-1.0, -0.25, 0.5, 1.5], dtype=F)
    idx = RNG.integers(0, 4, size=12)
    packed = np.packbits(np.array([[(i >> b) & 1 for b in range(2)] for i in idx]).ravel(), bitorder="little")

    def body(x):
        m = mb()
        w = m.constexpr_lut_to_dense(lut=lut, indices=packed, shape=np.array([3, 4], dtype=np.uint32))
        return m.add(x=x, y=w)

    check(tmp_path, "lut16", {"x": rand(3, 4)}, body, lambda x: x + c(lut[idx].reshape(3, 4)), opset="iOS16",
          exact16=True)


def test_constexpr_blockwise_shift_scale_ios18(tmp_path):
    q = RNG.integers(-127, 128, size=(4, 6), dtype=np.int8)
    sc = RNG.uniform(0.01, 0.05, size=(4, 2)).astype(F)

    def body(x):
        m = mb()
        w = m.constexpr_blockwise_shift_scale(data=q, scale=sc)
        return m.add(x=x, y=w)

    deq = q.astype(np.float64) * np.repeat(sc.astype(np.float64), 3, axis=1)
    check(tmp_path, "blockwise", {"x": rand(4, 6)}, body, lambda x: x + c(deq), opset="iOS18", rtol=4e-6)


def test_constexpr_lut_to_dense_ios18_vector_palette(tmp_path):
    """iOS18's vector palettes: each index picks a vector of `vector_size` values along an axis."""
    # indices [4, 2] (uint2) -> lut [1, 1, 4, 3] (one palette of 4 entries, vectors of 3 along axis 1)
    idx = RNG.integers(0, 4, size=(4, 2)).astype(np.uint8)
    lut = RNG.uniform(-1, 1, size=(1, 1, 4, 3)).astype(F)

    def body(x):
        from coremltools.converters.mil.mil import types

        m = mb()
        w = m.constexpr_lut_to_dense(indices=idx.astype(types.np_uint2_dtype), lut=lut, vector_axis=1)
        return m.add(x=x, y=w)

    dense = np.zeros((4, 6))
    for r in range(4):
        for j in range(2):
            dense[r, j * 3:(j + 1) * 3] = lut[0, 0, idx[r, j]]
    check(tmp_path, "lut18v", {"x": rand(4, 6)}, body, lambda x: x + c(dense), opset="iOS18", exact16=True)


@pytest.mark.parametrize("nbits", [1, 2, 3, 4, 6, 8])
def test_constexpr_lut_to_dense_ios18_scalar_palettes(tmp_path, nbits):
    """iOS18's scalar palettes of every width, one palette per group of 2 rows."""
    from coremltools.converters.mil.mil import types

    idx = RNG.integers(0, 2 ** nbits, size=(4, 6)).astype(np.uint8)
    lut = RNG.uniform(-1, 1, size=(2, 1, 2 ** nbits, 1)).astype(F)
    dtype = np.uint8 if nbits == 8 else getattr(types, f"np_uint{nbits}_dtype")

    def body(x):
        m = mb()
        return m.add(x=x, y=m.constexpr_lut_to_dense(indices=idx.astype(dtype), lut=lut))

    dense = np.array([[lut[r // 2, 0, idx[r, j], 0] for j in range(6)] for r in range(4)])
    check(tmp_path, f"lut18_{nbits}", {"x": rand(4, 6)}, body, lambda x: x + c(dense), opset="iOS18",
          exact16=True)


@pytest.mark.parametrize("dtype", ["int8", "uint8", "int4", "uint4"])
def test_constexpr_blockwise_shift_scale_offset(tmp_path, dtype):
    """scale * (data - offset), blocks of 3 columns and 2 rows, offset of data's type."""
    from coremltools.converters.mil.mil import types

    lo, hi = {"int8": (-128, 128), "uint8": (0, 256), "int4": (-8, 8), "uint4": (0, 16)}[dtype]
    npt = getattr(np, dtype) if dtype.endswith("8") else getattr(types, f"np_{dtype}_dtype")
    q = RNG.integers(lo, hi, size=(4, 6))
    off = RNG.integers(lo, hi, size=(2, 2))
    sc = RNG.uniform(0.01, 0.05, size=(2, 2)).astype(F)

    def body(x):
        m = mb()
        w = m.constexpr_blockwise_shift_scale(data=q.astype(npt), scale=sc, offset=off.astype(npt))
        return m.add(x=x, y=w)

    up = lambda a: np.repeat(np.repeat(a.astype(np.float64), 2, axis=0), 3, axis=1)  # noqa: E731
    deq = (q - up(off)) * up(sc)
    check(tmp_path, f"blockwise_{dtype}", {"x": rand(4, 6)}, body, lambda x: x + c(deq), opset="iOS18", rtol=4e-6)


OPSETS = ["iOS15", "iOS16", "iOS17", "iOS18"]


@pytest.mark.parametrize("opset", OPSETS)
def test_every_opset(tmp_path, opset):
    """The ops a vision tower is made of, written at each opset the
    interpreter reads (each op's own output compared, so fp16 stays one step)."""
    x, y = rand(2, 3, 4), rand(2, 4, 3)
    w, b = rand(5, 4), rand(5)
    cw = rand(3, 2, 2, 2, lo=-0.5, hi=0.5)

    def body(x, y):
        m = mb()
        return (m.linear(x=x, weight=w, bias=b), m.matmul(x=x, y=y), m.gelu(x=x, mode="TANH_APPROXIMATION"),
                m.softmax(x=x, axis=-1), m.layer_norm(x=x, axes=[-1], epsilon=1e-6),
                m.reshape(x=x, shape=[2, -1]), m.transpose(x=x, perm=[2, 0, 1]),
                m.conv(x=m.expand_dims(x=x, axes=[0]), weight=cw, strides=[1, 2], pad_type="valid"),
                m.real_div(x=x, y=m.add(x=m.mul(x=x, y=x), y=1.0)))

    def want(x, y):
        e = np.exp(x - x.max(axis=-1, keepdims=True))
        mu = x.mean(axis=-1, keepdims=True)
        v = ((x - mu) ** 2).mean(axis=-1, keepdims=True)
        sq = x * x
        if _FP16:
            sq = sq.astype(np.float16).astype(np.float64)
        den = sq + 1.0
        if _FP16:
            den = den.astype(np.float16).astype(np.float64)
        return (x @ c(w).T + c(b), x @ y, _gelu("TANH_APPROXIMATION")(x), e / e.sum(axis=-1, keepdims=True),
                (x - mu) / np.sqrt(v + 1e-6), x.reshape(2, 12), np.transpose(x, (2, 0, 1)),
                conv_nd(x[None], c(cw), None, [1, 2], [1, 1], [(0, 0), (0, 0)], 1), x / den)

    check(tmp_path, f"opset_{opset}", {"x": x, "y": y}, body, want, opset=opset, rtol=1e-5)


@pytest.mark.parametrize("groups,stride,bias", [(1, 1, False), (2, 2, True), (4, 1, True), (2, 3, False)])
def test_conv1d_of_fp16_inputs_and_weights(tmp_path, groups, stride, bias):
    """A 1-D conv whose input is declared fp16 and whose weights and bias are
    fp16 constants (the forms coremltools' own op tests give): the fp32 mode
    computes on the fp16 values in f32, within f32 rounding of float64 numpy
    (coremltools' suite had reported up to 5e-4 here, the size of fp16
    rounding: its expectations, not this product); the fp16 and ane modes
    give that result rounded to fp16, within one fp16 step."""
    import coremltools as ct
    from coremltools.converters.mil import Builder as m

    rng = np.random.default_rng(groups * 10 + stride)
    cin, cout, k, n = 8, 12, 3, 17
    x = rng.standard_normal((1, cin, n)).astype(np.float16)
    w = rng.standard_normal((cout, cin // groups, k)).astype(np.float16)
    b = rng.standard_normal((cout,)).astype(np.float16) if bias else None

    @m.program(input_specs=[m.TensorSpec(shape=x.shape, dtype=ct.converters.mil.mil.types.fp16)],
               opset_version=ct.target.iOS17)
    def prog(x):
        y = m.conv(x=x, weight=w, bias=b, strides=[stride], groups=groups, pad_type="valid") if bias else \
            m.conv(x=x, weight=w, strides=[stride], groups=groups, pad_type="valid")
        return m.cast(x=y, dtype="fp32")

    model = ct.convert(prog, convert_to="mlprogram", minimum_deployment_target=ct.target.iOS17,
                       compute_precision=ct.precision.FLOAT32, pass_pipeline=ct.PassPipeline([], "none"),
                       skip_model_load=True)
    pkg = tmp_path / f"conv1d_fp16_{groups}_{stride}_{int(bias)}.mlpackage"
    model.save(str(pkg))
    out_name = model.get_spec().description.output[0].name
    X, W = x.astype(np.float64), w.astype(np.float64)
    t = (n - k) // stride + 1
    per = cout // groups
    want = np.zeros((1, cout, t))
    for o in range(cout):
        g = o // per
        xs = X[0, g * (cin // groups):(g + 1) * (cin // groups)]
        for i in range(t):
            want[0, o, i] = (xs[:, i * stride:i * stride + k] * W[o]).sum()
    if bias:
        want += b.astype(np.float64)[None, :, None]
    r, out = run(tmp_path, pkg, {"x": x.astype(np.float32)}, "fp32")
    assert r.returncode == 0, r.stderr
    got = out[out_name]
    assert np.abs(got - want).max() <= 4 * np.finfo(np.float32).eps * max(np.abs(want).max(), 1.0)
    for precision in ("fp16", "ane"):
        r, out = run(tmp_path, pkg, {"x": x.astype(np.float32)}, precision)
        assert r.returncode == 0, r.stderr
        assert fp16_steps(out[out_name], want).max() <= 1, precision


@pytest.mark.parametrize("act", ["gelu_pytorch_tanh", "gelu", "quick_gelu"])
@pytest.mark.parametrize("scale", [2, 64])
def test_scaled_activation_is_the_activation_scaled(tmp_path, act, scale):
    """`vit.scaled_activation` (a GELU MLP's branch scale, `build
    --branch-scale`): from z = x / B it gives act(x) / B for every x, small,
    negative, and far beyond 16 where the activation has saturated, while no
    value it holds exceeds max(|z|, 16)."""
    from ane_export.vit import scaled_activation

    near = np.concatenate([np.linspace(-40, 40, 161), [-17.0, -16.0, 15.5, 16.0, 17.0]])
    far = np.array([-60000.0, -3000.0, -100.0, 100.0, 3000.0, 60000.0])

    def body(z):
        m = mb()
        y = scaled_activation(m, m.cast(x=z, dtype="fp16"), act, scale, "act")  # as the builders emit it
        return m.cast(x=y, dtype="fp32")

    def want(z):
        xx = z * scale
        if act == "gelu_pytorch_tanh":
            a = 0.5 * xx * (1 + np.tanh(np.sqrt(2 / np.pi) * (xx + 0.044715 * xx ** 3)))
        elif act == "gelu":
            a = 0.5 * xx * (1 + np.vectorize(math.erf)(xx / np.sqrt(2)))
        else:
            a = xx / (1 + np.exp(-float(np.float16(1.702)) * xx))  # the builders' fp16 constant
        return a / scale

    # Each range against its own magnitude: near 0 to within 1e-5 of 20 / B.
    for tag, x in (("near", near), ("far", far)):
        z = (x / scale).astype(np.float32)
        with np.errstate(over="ignore"):
            check(tmp_path, f"scaled_{act}_{scale}_{tag}", {"z": z[None, :]}, body, want, fp16=False, rtol=1e-5)
