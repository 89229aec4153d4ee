"""The BERT MIL program: a multifunction package of token buckets with
static shapes and no op that leaves the ANE; its maths against a plain numpy
post-norm BERT of the same weights, run by the project's interpreter
(`ane-export exec`, as test_interp_ops.py runs it: the release binary, or
ANE_EXPORT_BIN; a missing binary fails the numeric tests); pad columns
masked; bad specs and buckets refused."""

import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from ane_export import bert

sys.path.insert(0, str(Path(__file__).resolve().parent))
from test_interp_ops import BIN, load_st, save_st  # noqa: E402
from test_qwen3_vl import R8_OPS  # noqa: E402

D, HEADS, DEPTH, INTER = 32, 2, 2, 48
#: The program's smallest LayerNorm epsilon (the blocks' epsilon of every tiny() BERT, whose is 1e-12).
MIN_EPS = bert.MIN_LN_EPS


def tiny(act="gelu", pooler=True, seed=0):
    """A random 2-block BERT in the ANE layout: weights scaled by
    1/sqrt(fan_in) so every activation is of order 1, LayerNorms with random
    gammas and betas; epsilon 1e-12 as BERT's."""
    rng = np.random.default_rng(seed)
    spec = dict(hidden_size=D, num_heads=HEADS, depth=DEPTH, intermediate_size=INTER, hidden_act=act,
                layer_norm_eps=1e-12, pooler=pooler)

    def conv(o, i):
        return (rng.standard_normal((o, i, 1, 1)) / math.sqrt(i)).astype(np.float32)

    def vec(n, mean=0.0):
        return (mean + 0.2 * rng.standard_normal(n)).astype(np.float32)

    w = {"embeddings.norm.weight": vec(D, 1.0), "embeddings.norm.bias": vec(D)}
    for i in range(DEPTH):
        b = f"blocks.{i}"
        for n, (o, ii) in {"attn.qkv": (3 * D, D), "attn.proj": (D, D), "mlp.fc1": (INTER, D),
                           "mlp.fc2": (D, INTER)}.items():
            w[f"{b}.{n}.weight"] = conv(o, ii)
            w[f"{b}.{n}.bias"] = vec(o)
        for n in ("norm1", "norm2"):
            w[f"{b}.{n}.weight"] = vec(D, 1.0)
            w[f"{b}.{n}.bias"] = vec(D)
    if pooler:
        w["pooler.weight"] = conv(D, D)
        w["pooler.bias"] = vec(D)
    return spec, w


# ---- a plain post-norm BERT in numpy (float64, tokens x channels), transformers' modeling_bert maths

_erf = np.vectorize(math.erf)
ACTS = {
    "gelu": lambda x: 0.5 * x * (1 + _erf(x / math.sqrt(2))),
    "gelu_new": lambda x: 0.5 * x * (1 + np.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x ** 3))),
    "relu": lambda x: np.maximum(x, 0),
}
ACTS["gelu_pytorch_tanh"] = ACTS["gelu_new"]


def reference(spec, weights, emb, real, act=None, block_eps=None, taps=None):
    """BERT on `emb` [N, D] whose first `real` tokens are real: the pad
    tokens are left out of every softmax (transformers' mask, exactly).
    Weights are rounded to fp16 as the program holds them. `block_eps`: the
    blocks' LayerNorms' epsilon (default the spec's); `taps`, a dict, gets
    each block's MLP activation (`b<i>_act`, [N, I]) and residual sums
    (`b<i>_res1`, `b<i>_res2`, [N, D]). Returns (last_hidden_state [N, D],
    pooler_output [D] or None)."""
    w = {k: v.astype(np.float16).astype(np.float64) for k, v in weights.items()}
    f = ACTS[act or spec["hidden_act"]]
    eps, hd = spec["layer_norm_eps"], D // HEADS
    taps = {} if taps is None else taps

    def lin(x, p):
        return x @ w[p + ".weight"][:, :, 0, 0].T + w[p + ".bias"]

    def ln(x, p, eps=eps):
        mu = x.mean(-1, keepdims=True)
        var = ((x - mu) ** 2).mean(-1, keepdims=True)
        return (x - mu) / np.sqrt(var + eps) * w[p + ".weight"] + w[p + ".bias"]

    def tap(name, v):
        taps[name] = v
        return v

    beps = eps if block_eps is None else block_eps

    x = ln(emb.astype(np.float64), "embeddings.norm")
    for i in range(spec["depth"]):
        b = f"blocks.{i}"
        qkv = lin(x, b + ".attn.qkv")
        heads = []
        for h in range(HEADS):
            q, k, v = (qkv[:, j * D + h * hd: j * D + (h + 1) * hd] for j in range(3))
            s = q @ k[:real].T / math.sqrt(hd)
            p = np.exp(s - s.max(-1, keepdims=True))
            heads.append(p / p.sum(-1, keepdims=True) @ v[:real])
        x = ln(tap(f"b{i}_res1", x + lin(np.concatenate(heads, 1), b + ".attn.proj")), b + ".norm1", beps)
        a = tap(f"b{i}_act", f(lin(x, b + ".mlp.fc1")))
        x = ln(tap(f"b{i}_res2", x + lin(a, b + ".mlp.fc2")), b + ".norm2", beps)
    pooled = np.tanh(lin(x[:1], "pooler"))[0] if spec["pooler"] else None
    return x, pooled


# ---- running the program with the interpreter


def inputs(n, real, seed=1, pad=None):
    """A text of `real` tokens padded to `n`: embeddings [1, D, 1, n] (pad
    columns `pad` [D, n - real], default random) and the mask [1, 1, n]."""
    rng = np.random.default_rng(seed)
    emb = rng.standard_normal((n, D)).astype(np.float32)
    if pad is not None:
        emb[real:] = pad
    mask = np.zeros((1, 1, n), np.float32)
    mask[..., real:] = -1e4
    return emb, {"embeddings": np.ascontiguousarray(emb.T.reshape(1, D, 1, n)), "mask": mask}


def run(tmp_path, pkg, function, feeds, precision="fp32"):
    """The package's `function` on `feeds` through `ane-export exec`: {output: array}."""
    assert BIN.is_file(), f"{BIN}: build it first (cargo build --release, or make test)"
    tag = f"{function}-{precision}-{len(list(tmp_path.iterdir()))}"
    inp, out = tmp_path / f"{tag}-in.safetensors", tmp_path / f"{tag}-out.safetensors"
    save_st(inp, feeds)
    r = subprocess.run([str(BIN), "exec", str(pkg), "--function", function, "--inputs", str(inp), "--out",
                        str(out), "--precision", precision], capture_output=True, text=True)
    assert r.returncode == 0, f"exec failed: {r.stderr}"
    return load_st(out)


def tokens_of(y):
    """[1, D, 1, N] -> [N, D]."""
    return y[0, :, 0, :].T.astype(np.float64)


@pytest.fixture(scope="module")
def packages(tmp_path_factory):
    """One multifunction package per activation (buckets of 12 and 20 tokens,
    query chunks of 8: 12 = 8 + 4 and 20 = 8 + 8 + 4), and one built with
    the no-mask fault, which the pad test must catch."""
    d = tmp_path_factory.mktemp("bert")
    out = {}
    for act in ("gelu", "gelu_new", "relu"):
        spec, w = tiny(act)
        out[act] = (spec, w, bert.save_packages(spec, w, [("b12", 12), ("b20", 20)], str(d / f"{act}.mlpackage"),
                                                query_chunk=8)[0])
    spec, w = tiny("gelu")
    out["no-mask"] = (spec, w, bert.save_packages(spec, w, [("b12", 12)], str(d / "nomask.mlpackage"),
                                                  query_chunk=8, faults=("no-mask",))[0])
    return out


@pytest.mark.parametrize("act", ["gelu", "gelu_new", "relu"])
@pytest.mark.parametrize("bucket,real", [("b12", 12), ("b12", 7), ("b20", 13)])
def test_program_is_bert(tmp_path, packages, act, bucket, real):
    """fp32: the program's outputs match numpy's BERT on the real tokens to
    f32 precision; the other activations' BERTs are further away than the
    tolerance, so the check sees which activation the program used."""
    spec, w, pkg = packages[act]
    n = int(bucket[1:])
    emb, feeds = inputs(n, real)
    got = run(tmp_path, pkg, bucket, feeds)
    assert set(got) == {"last_hidden_state", "pooler_output"}
    assert got["last_hidden_state"].shape == (1, D, 1, n) and got["pooler_output"].shape == (1, D, 1, 1)
    hidden, pooled = reference(spec, w, emb, real)
    tol = 2e-5
    err = np.abs(tokens_of(got["last_hidden_state"])[:real] - hidden[:real]).max()
    assert err < tol, f"last_hidden_state: max error {err}"
    err = np.abs(got["pooler_output"][0, :, 0, 0] - pooled).max()
    assert err < tol, f"pooler_output: max error {err}"
    assert np.isfinite(got["last_hidden_state"]).all()
    for other in {"gelu", "gelu_new", "relu"} - {act}:
        h2, _ = reference(spec, w, emb, real, act=other)
        assert np.abs(h2[:real] - hidden[:real]).max() > 10 * tol, other


def test_fp16_emulation_stays_close(tmp_path, packages):
    """fp16 emulation (every op's output rounded to fp16): per real token,
    cosine with numpy's BERT >= 0.999 (the gates' threshold)."""
    spec, w, pkg = packages["gelu"]
    emb, feeds = inputs(20, 13)
    got = tokens_of(run(tmp_path, pkg, "b20", feeds, "fp16")["last_hidden_state"])[:13]
    want = reference(spec, w, emb, 13)[0][:13]
    cos = (got * want).sum(1) / np.linalg.norm(got, axis=1) / np.linalg.norm(want, axis=1)
    assert cos.min() >= 0.999, cos


@pytest.mark.parametrize("precision", ["fp32", "fp16"])
def test_pad_columns_do_not_reach_real_tokens(tmp_path, packages, precision):
    """Whatever the pad columns hold (zeros, or large random rows), the real
    tokens' outputs and the pooler's are the same bit for bit (a pad key's
    probability is exactly 0); the pad columns' own outputs change. With the
    mask removed (the no-mask fault) the real tokens' outputs change."""
    spec, w, pkg = packages["gelu"]
    real, n = 9, 12
    rng = np.random.default_rng(5)
    outs = []
    for pad in (np.zeros(D, np.float32), 30 * rng.standard_normal((n - real, D)).astype(np.float32)):
        _, feeds = inputs(n, real, pad=pad)
        outs.append(run(tmp_path, pkg, "b12", feeds, precision))
    a, b = (tokens_of(o["last_hidden_state"]) for o in outs)
    assert np.array_equal(a[:real], b[:real])
    assert np.array_equal(outs[0]["pooler_output"], outs[1]["pooler_output"])
    assert not np.allclose(a[real:], b[real:])
    _, _, broken = packages["no-mask"]
    c, d = (tokens_of(run(tmp_path, broken, "b12", inputs(n, real, pad=pad)[1], precision)["last_hidden_state"])
            for pad in (np.zeros(D, np.float32), 30 * rng.standard_normal((n - real, D)).astype(np.float32)))
    assert not np.allclose(c[:real], d[:real])


# ---- the package and the op graph


def test_multifunction_package(tmp_path):
    """Both buckets in one package: static inputs per function (the mask a
    row per text), no R8 op, the outputs named and described; pooler_output
    only with a pooler."""
    import coremltools as ct

    for pooler in (True, False):
        spec, w = tiny(pooler=pooler)
        path = str(tmp_path / f"p{int(pooler)}.mlpackage")
        bert.save_packages(spec, w, [("b16", 16), ("b32", 32)], path,
                           metadata={"author": "ane-export tests", "user": {"bucket_tokens": "16,32"}})
        spec_pb = ct.utils.load_spec(path)
        prog = spec_pb.mlProgram
        assert sorted(prog.functions.keys()) == ["b16", "b32"]
        want_outs = ["last_hidden_state", "pooler_output"] if pooler else ["last_hidden_state"]
        for name, n in (("b16", 16), ("b32", 32)):
            f = prog.functions[name]
            dims = {i.name: [d.constant.size for d in i.type.tensorType.dimensions] for i in f.inputs}
            assert dims == {"embeddings": [1, D, 1, n], "mask": [1, 1, n]}
            ops = {op.type for op in f.block_specializations[f.opset].operations}
            assert not ops & R8_OPS, ops & R8_OPS
            assert {"conv", "layer_norm", "softmax", "matmul"} <= ops
            assert ("tanh" in ops) == pooler
            assert list(f.block_specializations[f.opset].outputs) == want_outs
        assert spec_pb.description.metadata.userDefined["bucket_tokens"] == "16,32"
        for fd in spec_pb.description.functions:
            docs = {x.name: x.shortDescription for x in list(fd.input) + list(fd.output)}
            assert set(docs) == {"embeddings", "mask"} | set(want_outs)
            n = int(fd.name[1:])
            assert docs["mask"].startswith(f"[1, 1, {n}]") and "-1e4" in docs["mask"]


def test_op_graph():
    """Per block and head, one softmax per query chunk over scores [1, chunk,
    N], each after an add of the [1, 1, N] mask input itself (no slice of
    it); post-norm: each LayerNorm reads a residual add; LayerNorm epsilons
    are at least 1e-7 in fp16 (BERT's 1e-12 would be 0); fp32 only at the
    casts."""
    spec, w = tiny()
    ops = list(bert.build_program(spec, w, 20, query_chunk=8).functions["main"].operations)
    soft = [op for op in ops if op.op_type == "softmax"]
    assert len(soft) == DEPTH * HEADS * 3
    assert sorted({tuple(op.outputs[0].shape) for op in soft}) == [(1, 4, 20), (1, 8, 20)]
    for op in soft:
        add = op.x.op
        assert add.op_type == "add" and add.name.endswith("_masked")
        assert add.y.name == "mask_fp16" and tuple(add.y.shape) == (1, 1, 20)
    norms = [op for op in ops if op.op_type == "layer_norm"]
    assert [op.name for op in norms] == ["embed"] + [n for i in range(DEPTH) for n in (f"b{i}_norm1", f"b{i}_out")]
    for op in norms[1:]:
        assert op.x.op.op_type == "add" and op.x.op.name.endswith(("_res1", "_res2"))
        assert float(op.epsilon.val) >= 1e-7 and op.epsilon.val.dtype == np.float16
    # Each block reads the previous block's last LayerNorm: its qkv conv and its first residual add.
    for i in range(1, DEPTH):
        prev = next(op for op in ops if op.name == f"b{i - 1}_out").outputs[0]
        assert {c.name for c in prev.child_ops} >= {f"b{i}_qkv", f"b{i}_res1"}
    fp32_out = sorted(op.name for op in ops if op.op_type != "const" and op.outputs[0].dtype.__name__ == "fp32")
    assert fp32_out == ["last_hidden_state", "pooler_output"]
    # One bucket within one chunk: one softmax per head and block.
    ops = bert.build_program(spec, w, 8, query_chunk=8).functions["main"].operations
    assert sum(op.op_type == "softmax" for op in ops) == DEPTH * HEADS


def test_activation_ops():
    """gelu is the exact (erf) GELU, gelu_new and gelu_pytorch_tanh the tanh approximation, relu relu."""
    for act, op_type, mode in (("gelu", "gelu", "EXACT"), ("gelu_new", "gelu", "TANH_APPROXIMATION"),
                               ("gelu_pytorch_tanh", "gelu", "TANH_APPROXIMATION"), ("relu", "relu", None)):
        spec, w = tiny(act)
        ops = [op for op in bert.build_program(spec, w, 8).functions["main"].operations if op.name == "b0_act"]
        assert len(ops) == 1 and ops[0].op_type == op_type, act
        if mode:
            assert ops[0].mode.val == mode, act


# ---- refusals


@pytest.mark.parametrize("change,message", [
    ({"num_heads": 5}, "hidden_size 32 is not a multiple of num_heads 5"),
    ({"hidden_act": "swish"}, "hidden_act 'swish': expected one of gelu, gelu_new"),
    ({"num_heads": 0}, "num_heads 0: expected a positive integer"),
    ({"depth": 1.5}, "depth 1.5: expected a positive integer"),
    ({"layer_norm_eps": 0}, "layer_norm_eps 0: expected a positive number"),
])
def test_bad_spec(change, message):
    spec, w = tiny()
    with pytest.raises(ValueError, match=message):
        bert.build_program(dict(spec, **change), w, 16)


def test_missing_spec_field():
    spec, w = tiny()
    del spec["pooler"]
    with pytest.raises(ValueError, match="bert spec: missing pooler"):
        bert.build_program(spec, w, 16)


@pytest.mark.parametrize("tokens", [0, -16, 12.5, True, "16"])
def test_bad_bucket(tokens):
    spec, w = tiny()
    with pytest.raises(ValueError, match="expected a positive whole count"):
        bert.build_program(spec, w, tokens)


def test_bad_weights():
    spec, w = tiny()
    with pytest.raises(ValueError, match="pooler.weight missing"):
        bert.build_program(spec, {k: v for k, v in w.items() if not k.startswith("pooler")}, 16)
    bert.build_program(dict(spec, pooler=False), {k: v for k, v in w.items() if not k.startswith("pooler")}, 16)
    w["blocks.1.mlp.fc1.weight"] = w["blocks.1.mlp.fc1.weight"][:, :, 0, 0]
    with pytest.raises(ValueError, match=r"blocks.1.mlp.fc1.weight has shape \(48, 32\), expected \(48, 32, 1, 1\)"):
        bert.build_program(spec, w, 16)


def test_bad_bucket_writes_nothing(tmp_path):
    """A bad bucket among good ones is refused before any package is written."""
    spec, w = tiny()
    path = tmp_path / "x.mlpackage"
    with pytest.raises(ValueError, match="bucket of 0 tokens"):
        bert.save_packages(spec, w, [("b16", 16), ("b0", 0)], str(path))
    assert not path.exists() and not list(tmp_path.iterdir())


@pytest.mark.parametrize("fault", ["no-mask", "gather", "overflow", "swap-heads", "ln-eps", "int8-axis"])
def test_gate_faults_find_their_ops(fault):
    """The gates' test faults (faults.py) that concern a text encoder find
    the ops they rewrite by the shared layers' names (`embed`, `b{i}_res1`,
    `b{i}_heads`, `*_masked`); the image ones find nothing and say so."""
    from ane_export import faults

    spec, w = tiny()
    prog = faults.apply(bert.build_program(spec, w, 16), (fault,))
    prog.validate()
    for image_only in ("swap-rb", "merge-order"):
        with pytest.raises(ValueError, match="found nothing to rewrite"):
            faults.apply(bert.build_program(spec, w, 16), (image_only,))


# ---- the residual scale (docs/numerics.md; the module docstring)

#: fp16's largest finite value.
FP16_MAX = 65504.0
#: The token and channels the massive checkpoint drives past FP16_MAX.
MASSIVE_TOKEN, MASSIVE = 3, [5, 17]


def feeds_of(emb, real):
    """The program's inputs for embeddings `emb` [N, D] whose first `real` tokens are real."""
    n = emb.shape[0]
    mask = np.zeros((1, 1, n), np.float32)
    mask[..., real:] = -1e4
    return {"embeddings": np.ascontiguousarray(emb.T.reshape(1, D, 1, n)).astype(np.float32), "mask": mask}


def cosines(a, b):
    """Per row cosine of [N, D] arrays."""
    return (a * b).sum(1) / np.linalg.norm(a, axis=1) / np.linalg.norm(b, axis=1)


def massive(boost=1e5, n=12):
    """(spec, weights, emb [N, D]): tiny() with massive activations in one
    token, as trained encoders show them: its embedding row holds 30 in
    channels MASSIVE (which then dominate it after the embedding LayerNorm
    and norm1, weight 1 and bias 0 there), block 0's hidden unit 0 reads them
    with weight 10 and bias -40, which fires in that token alone, and fc2
    writes about `boost` into them through it (the unit's activation measured
    in numpy's BERT, fc2's weight set to `boost` over it): the sum norm2
    reads passes fp16's range while float32 holds it."""
    spec, w = tiny()
    emb = np.random.default_rng(1).standard_normal((n, D)).astype(np.float32)
    emb[MASSIVE_TOKEN, MASSIVE] = 30.0
    for p in ("embeddings.norm", "blocks.0.norm1"):
        w[p + ".weight"][MASSIVE], w[p + ".bias"][MASSIVE] = 1.0, 0.0
    fc1, fc2 = w["blocks.0.mlp.fc1.weight"], w["blocks.0.mlp.fc2.weight"]
    fc1[0], fc2[:, 0] = 0.0, 0.0
    fc1[0, MASSIVE], w["blocks.0.mlp.fc1.bias"][0] = 10.0, -40.0
    fc2[MASSIVE, 0] = 1.0
    taps = {}
    reference(spec, w, emb, n, taps=taps)
    act = taps["b0_act"][:, 0]
    hot, rest = act[MASSIVE_TOKEN], np.delete(act, MASSIVE_TOKEN)
    assert hot > 1.0 and np.abs(rest).max() < 1e-3 * hot, (hot, rest)
    fc2[MASSIVE, 0] = boost / hot
    return spec, w, emb


@pytest.mark.parametrize("scale", [1, 8, 64])
def test_residual_scale_keeps_the_maths(tmp_path, scale):
    """fp32: a program built with residual_scale S computes BERT with the
    blocks' LayerNorm epsilon weighing S^2 more (numpy's BERT with that
    epsilon within 2e-5), which moves its outputs from the unscaled
    program's by under 2e-5 of their largest value at S <= 8 (the epsilon's
    fp16 1.2e-7 times 64) and under 1e-3 at 64; S = 1 is the unscaled program
    bit for bit. The scaled program reads x by one mul before each add and
    its adds hold the sums divided by S (the outputs do not: they follow the
    norms)."""
    spec, w = tiny()
    emb, feeds = inputs(12, 9)
    pkgs = {s: bert.save_packages(dict(spec, residual_scale=s) if s else spec, w, [("b12", 12)],
                                  str(tmp_path / f"s{s}.mlpackage"))[0] for s in (None, scale)}
    base, got = (run(tmp_path, pkgs[s], "b12", feeds) for s in (None, scale))
    eps = float(np.float16(MIN_EPS)) * scale ** 2
    hidden, pooled = reference(spec, w, emb, 9, block_eps=eps)
    assert np.abs(tokens_of(got["last_hidden_state"])[:9] - hidden[:9]).max() < 2e-5
    assert np.abs(got["pooler_output"][0, :, 0, 0] - pooled).max() < 2e-5
    for k in ("last_hidden_state", "pooler_output"):
        rel = np.abs(got[k] - base[k]).max() / np.abs(base[k]).max()
        if scale == 1:
            assert np.array_equal(got[k], base[k]), k
        else:
            assert rel < (2e-5 if scale <= 8 else 1e-3), (k, rel)
    ops = {op.name: op for op in bert.build_program(dict(spec, residual_scale=scale), w, 12).functions["main"]
           .operations}
    for i in range(DEPTH):
        for k in (1, 2):
            assert (f"b{i}_res{k}_in" in ops) == (scale != 1)
            if scale != 1:
                assert ops[f"b{i}_res{k}"].x.op is ops[f"b{i}_res{k}_in"]


def test_residual_scale_carries_massive_activations(tmp_path):
    """The point of it: a token whose channels MASSIVE block 0's MLP drives
    to about 1e5 (`massive`), past fp16's 65,504 in the sum norm2 reads
    (and in fc2's output) while float32 holds it. Built without the residual
    scale, the fp16 and ane interpreters lose every token (non-finite
    outputs, or cosines far from numpy's BERT); with residual_scale 16 the
    sums are about 6,250, inside fp16 and the Neural Engine's 32,752, and
    every real token's cosine with numpy's float64 BERT is >= 0.999, the
    pooler's too."""
    spec, w, emb = massive()
    n = real = emb.shape[0]
    taps = {}
    hidden, pooled = reference(spec, w, emb, real, taps=taps)
    peak = max(np.abs(v).max() for k, v in taps.items() if "_res" in k)
    assert peak > 1.4 * FP16_MAX and np.abs(taps["b0_res2"][:, MASSIVE]).argmax() // 2 == MASSIVE_TOKEN
    feeds = feeds_of(emb, real)
    pkgs = {s: bert.save_packages(dict(spec, residual_scale=s), w, [("b12", 12)],
                                  str(tmp_path / f"s{s}.mlpackage"))[0] for s in (1, 16)}
    for precision in ("fp16", "ane"):
        bad = run(tmp_path, pkgs[1], "b12", feeds, precision)
        h = tokens_of(bad["last_hidden_state"])
        assert not (np.isfinite(h).all() and cosines(h, hidden).min() >= 0.99), precision  # NaN cosines too
        good = run(tmp_path, pkgs[16], "b12", feeds, precision)
        h, p = tokens_of(good["last_hidden_state"]), good["pooler_output"][0, :, 0, 0]
        assert np.isfinite(h).all() and np.isfinite(p).all(), precision
        cos = cosines(h[:real], hidden[:real])
        assert cos.min() >= 0.999, (precision, cos)
        assert cosines(p[None], pooled[None])[0] >= 0.999, precision
    assert n == real


@pytest.mark.parametrize("scale", [0, 3, 8192, -2, 2.5, True, "8"])
def test_bad_residual_scale(scale):
    spec, w = tiny()
    with pytest.raises(ValueError, match=f"bert spec: residual_scale {scale!r}: expected a power of two from 1 "
                                         "to 4096"):
        bert.build_program(dict(spec, residual_scale=scale), w, 16)
