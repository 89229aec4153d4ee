"""The ModernBERT MIL program: a multifunction package of token buckets with
static shapes and no op that leaves the ANE; its maths against a plain numpy
ModernBERT of the same weights (float64), run by the project's interpreter
(`ane-export exec`, as test_bert.py runs it), in buckets longer than the
sliding window; pad columns masked; bad specs, buckets and weights refused;
and the tiny golden checkpoint's program against transformers' outputs."""

import json
import math
import struct
import sys
from pathlib import Path

import numpy as np
import pytest
from ane_export import modernbert

sys.path.insert(0, str(Path(__file__).resolve().parent))
from test_bert import ACTS as BERT_ACTS  # noqa: E402
from test_bert import run, tokens_of  # noqa: E402
from test_qwen3_vl import R8_OPS  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
D, HEADS, DEPTH, INTER = 32, 2, 3, 40
HD = D // HEADS
#: Layer 0 full, then sliding, then full; a window of 6 (a token sees 3 either side).
TYPES = ["full_attention", "sliding_attention", "full_attention"]
ACTS = dict(BERT_ACTS, silu=lambda x: x / (1 + np.exp(-x)))


def tiny(act="gelu", norm_bias=False, attention_bias=False, mlp_bias=False, types=TYPES, seed=0):
    """A random ModernBERT in the ANE layout: weights scaled by 1/sqrt(fan_in)
    so every activation is of order 1, LayerNorms with random gammas (and
    betas with norm_bias). The thetas differ enough that a small bucket sees
    which one each layer used."""
    rng = np.random.default_rng(seed)
    spec = dict(hidden_size=D, num_heads=HEADS, depth=len(types), intermediate_size=INTER, hidden_act=act,
                norm_eps=1e-5, norm_bias=norm_bias, attention_bias=attention_bias, mlp_bias=mlp_bias,
                layer_types=list(types), rope_theta={"full_attention": 1000.0, "sliding_attention": 10.0},
                local_attention=6)

    def vec(n, mean=0.0):
        return (mean + 0.2 * rng.standard_normal(n)).astype(np.float32)

    w = {}
    for k, shape in modernbert.weight_shapes(spec).items():
        if len(shape) == 4:
            w[k] = (rng.standard_normal(shape) / math.sqrt(shape[1])).astype(np.float32)
        else:
            w[k] = vec(shape[0], 1.0 if k.endswith(".weight") else 0.0)
    return spec, w


# ---- a plain ModernBERT in numpy (float64, tokens x channels), transformers' modeling_modernbert maths


def reference(spec, weights, emb, real, act=None, window=True, swap_theta=False, rounded=True, stream_eps=None,
              taps=None):
    """ModernBERT on `emb` [N, D] whose first `real` tokens are real: pad keys
    and (in sliding layers, with `window`) keys beyond local_attention // 2
    are left out of every softmax, exactly. With `rounded`, weights are
    rounded to fp16 as the program holds them. `stream_eps`: the epsilon of
    the norms that read the stream (pre-norms, final_norm; default the
    spec's); `taps`, a dict, gets each block's MLP product (`b<i>_glu`,
    [N, I]) and residual adds (`b<i>_res1`, `b<i>_res2`, [N, D]). Returns
    last_hidden_state [N, D] (pad queries' rows: what they see of the real
    keys, or 0)."""
    w = {k: (v.astype(np.float16) if rounded else v).astype(np.float64) for k, v in weights.items()}
    f = ACTS[act or spec["hidden_act"]]
    d, heads, inter = spec["hidden_size"], spec["num_heads"], spec["intermediate_size"]
    hd, n, eps = d // heads, emb.shape[0], spec["norm_eps"]
    pos = np.arange(n)

    def lin(x, p):
        return x @ w[p + ".weight"][:, :, 0, 0].T + w.get(p + ".bias", 0.0)

    def ln(x, p, eps=eps):
        mu = x.mean(-1, keepdims=True)
        var = ((x - mu) ** 2).mean(-1, keepdims=True)
        return (x - mu) / np.sqrt(var + eps) * w[p + ".weight"] + w.get(p + ".bias", 0.0)

    taps = {} if taps is None else taps
    seps = eps if stream_eps is None else stream_eps

    def rot(u):
        return np.concatenate([-u[:, hd // 2:], u[:, :hd // 2]], 1)

    x = ln(emb.astype(np.float64), "embeddings.norm")
    for i, t in enumerate(spec["layer_types"]):
        b = f"blocks.{i}"
        theta = spec["rope_theta"][t if not swap_theta else ({*modernbert.LAYER_TYPES} - {t}).pop()]
        inv = theta ** (-np.arange(0, hd, 2) / hd)
        ang = np.concatenate([pos[:, None] * inv] * 2, 1)
        cos, sin = np.cos(ang), np.sin(ang)
        seen = np.zeros((n, n), bool)
        seen[:, :real] = True
        if t == "sliding_attention" and window:
            seen &= np.abs(pos[:, None] - pos[None, :]) <= spec["local_attention"] // 2
        qkv = lin(x if i == 0 else ln(x, b + ".attn_norm", seps), b + ".attn.qkv")
        out = []
        for h in range(heads):
            q, k, v = (qkv[:, j * d + h * hd: j * d + (h + 1) * hd] for j in range(3))
            q, k = q * cos + rot(q) * sin, k * cos + rot(k) * sin
            s = np.where(seen, q @ k.T * hd ** -0.5, -np.inf)
            p = np.exp(s - np.where(seen.any(1), s.max(1), 0)[:, None])
            out.append(p / np.maximum(p.sum(1, keepdims=True), 1e-300) @ v)
        x = taps[f"b{i}_res1"] = x + lin(np.concatenate(out, 1), b + ".attn.proj")
        y = lin(ln(x, b + ".mlp_norm", seps), b + ".mlp.wi")
        taps[f"b{i}_glu"] = f(y[:, :inter]) * y[:, inter:]
        x = taps[f"b{i}_res2"] = x + lin(taps[f"b{i}_glu"], b + ".mlp.wo")
    return ln(x, "final_norm", seps)


def inputs(n, real, seed=1, pad=None, d=D):
    """A text of `real` tokens padded to `n`: embeddings [1, D, 1, n] (pad
    columns `pad`, default random) and the mask [1, 1, n]."""
    rng = np.random.default_rng(seed)
    emb = rng.standard_normal((n, d)).astype(np.float32)
    if pad is not None:
        emb[real:] = pad
    mask = np.zeros((1, 1, n), np.float32)
    mask[..., real:] = -1e4
    return emb, {"embeddings": np.ascontiguousarray(emb.T.reshape(1, d, 1, n)), "mask": mask}


VARIANTS = {
    "gelu": dict(act="gelu"),
    "tanh-biases": dict(act="gelu_pytorch_tanh", norm_bias=True, attention_bias=True, mlp_bias=True),
    "silu-sliding0": dict(act="silu", norm_bias=True, types=["sliding_attention", "full_attention",
                                                             "sliding_attention"]),
}


@pytest.fixture(scope="module")
def packages(tmp_path_factory):
    """One multifunction package per variant (buckets of 12 and 20 tokens,
    query chunks of 8: 12 = 8 + 4 and 20 = 8 + 8 + 4; the window, 7 tokens
    wide, smaller than both), and one built with the no-mask fault."""
    d = tmp_path_factory.mktemp("modernbert")
    out = {}
    for name, kw in VARIANTS.items():
        spec, w = tiny(**kw)
        out[name] = (spec, w, modernbert.save_packages(spec, w, [("b12", 12), ("b20", 20)],
                                                       str(d / f"{name}.mlpackage"), query_chunk=8)[0])
    spec, w = tiny()
    out["no-mask"] = (spec, w, modernbert.save_packages(spec, w, [("b12", 12)], str(d / "nomask.mlpackage"),
                                                        query_chunk=8, faults=("no-mask",))[0])
    return out


@pytest.mark.parametrize("variant", list(VARIANTS))
@pytest.mark.parametrize("bucket,real", [("b12", 12), ("b12", 7), ("b20", 13), ("b20", 20)])
def test_program_is_modernbert(tmp_path, packages, variant, bucket, real):
    """fp32: the program's last_hidden_state matches numpy's ModernBERT on the
    real tokens to f32 precision. The same model without the sliding window,
    with each layer type's theta swapped, or with another activation is
    further away than the tolerance, so the check sees each of them."""
    spec, w, pkg = packages[variant]
    n = int(bucket[1:])
    emb, feeds = inputs(n, real)
    got = run(tmp_path, pkg, bucket, feeds)
    assert set(got) == {"last_hidden_state"} and got["last_hidden_state"].shape == (1, D, 1, n)
    assert np.isfinite(got["last_hidden_state"]).all()
    want = reference(spec, w, emb, real)[:real]
    tol = 2e-5
    err = np.abs(tokens_of(got["last_hidden_state"])[:real] - want).max()
    assert err < tol, f"last_hidden_state: max error {err}"
    others = [reference(spec, w, emb, real, window=False), reference(spec, w, emb, real, swap_theta=True)]
    others += [reference(spec, w, emb, real, act=a) for a in ("gelu", "gelu_new", "silu")
               if ACTS[a] is not ACTS[spec["hidden_act"]]]
    for other in others:
        assert np.abs(other[:real] - want).max() > 10 * tol


def test_fp16_emulation_stays_close(tmp_path, packages):
    """fp16 emulation (every op's output rounded to fp16): per real token,
    cosine with numpy's ModernBERT of unrounded weights >= 0.999 (the gates'
    threshold)."""
    spec, w, pkg = packages["tanh-biases"]
    emb, feeds = inputs(20, 13)
    got = tokens_of(run(tmp_path, pkg, "b20", feeds, "fp16")["last_hidden_state"])[:13]
    want = reference(spec, w, emb, 13, rounded=False)[:13]
    cos = (got * want).sum(1) / np.linalg.norm(got, axis=1) / np.linalg.norm(want, axis=1)
    assert cos.min() >= 0.999, cos


@pytest.mark.parametrize("precision", ["fp32", "fp16"])
def test_pad_columns_do_not_reach_real_tokens(tmp_path, packages, precision):
    """Whatever the pad columns hold (zeros, as the host writes, or large
    random rows), the real tokens' outputs are the same bit for bit, in the
    20-token bucket's three query chunks, sliding layers included; the pad
    columns' own outputs change. With the mask removed (the no-mask fault)
    the real tokens' outputs change."""
    rng = np.random.default_rng(5)
    pads = (np.zeros(D, np.float32), 30 * rng.standard_normal((20 - 13, D)).astype(np.float32))
    _, _, pkg = packages["gelu"]
    a, b = (tokens_of(run(tmp_path, pkg, "b20", inputs(20, 13, pad=p)[1], precision)["last_hidden_state"])
            for p in pads)
    assert np.array_equal(a[:13], b[:13])
    assert not np.allclose(a[13:], b[13:])
    _, _, broken = packages["no-mask"]
    c, d = (tokens_of(run(tmp_path, broken, "b12", inputs(12, 9, pad=p)[1], precision)["last_hidden_state"])
            for p in (pads[0], pads[1][:3]))
    assert not np.allclose(c[:9], d[:9])


# ---- the golden checkpoint: the contract's weight layout and maths against transformers


def read_safetensors(path):
    """{name: array} of a safetensors file, F32, I64 and BF16 (widened to
    float32: a bf16 value is the upper half of the float32 with its bits)."""
    data = Path(path).read_bytes()
    (n,) = struct.unpack("<Q", data[:8])
    out = {}
    for k, m in json.loads(data[8:8 + n]).items():
        if k == "__metadata__":
            continue
        s, e = m["data_offsets"]
        raw = data[8 + n + s:8 + n + e]
        if m["dtype"] == "BF16":
            a = (np.frombuffer(raw, "<u2").astype(np.uint32) << 16).view(np.float32)
        else:
            a = np.frombuffer(raw, {"F32": "<f4", "I64": "<i8"}[m["dtype"]])
        out[k] = a.reshape(m["shape"])
    return out


def golden_model(name="tiny-modernbert"):
    """(spec, ANE-layout weights, token embedding table) of a golden
    ModernBertModel checkpoint, as the contract maps its config and tensors."""
    d = ROOT / "golden" / "models" / name
    cfg = json.loads((d / "config.json").read_text())
    ck = read_safetensors(d / "model.safetensors")
    spec = dict(hidden_size=cfg["hidden_size"], num_heads=cfg["num_attention_heads"],
                depth=cfg["num_hidden_layers"], intermediate_size=cfg["intermediate_size"],
                hidden_act=cfg["hidden_activation"], norm_eps=cfg["norm_eps"], norm_bias=cfg["norm_bias"],
                attention_bias=cfg["attention_bias"], mlp_bias=cfg["mlp_bias"], layer_types=cfg["layer_types"],
                rope_theta={t: p["rope_theta"] for t, p in cfg["rope_parameters"].items()},
                local_attention=cfg["local_attention"])
    names = {"embeddings.norm": "embeddings.norm", "final_norm": "final_norm"}
    for i in range(spec["depth"]):
        for src, dst in (("attn_norm", "attn_norm"), ("mlp_norm", "mlp_norm"), ("attn.Wqkv", "attn.qkv"),
                         ("attn.Wo", "attn.proj"), ("mlp.Wi", "mlp.wi"), ("mlp.Wo", "mlp.wo")):
            names[f"blocks.{i}.{dst}"] = f"layers.{i}.{src}"
    w = {}
    for dst, src in names.items():
        for k in ("weight", "bias"):
            if f"{src}.{k}" in ck:
                a = ck[f"{src}.{k}"]
                w[f"{dst}.{k}"] = a[:, :, None, None] if a.ndim == 2 else a
    return spec, w, ck["embeddings.tok_embeddings.weight"]


@pytest.fixture(scope="module")
def golden(tmp_path_factory):
    spec, w, table = golden_model()
    path = tmp_path_factory.mktemp("modernbert-golden") / "tiny-modernbert.mlpackage"
    return spec, w, table, modernbert.save_packages(spec, w, [("b16", 16), ("b128", 128)], str(path))[0]


GOLDEN_CASES = sorted(p.stem for p in (ROOT / "golden/text/tower/tiny-modernbert").glob("*.safetensors")
                      if p.stem.rsplit("-", 1)[1] in ("16", "128"))


@pytest.mark.parametrize("case", GOLDEN_CASES)
def test_golden_checkpoint_matches_transformers(tmp_path, golden, case):
    """The tiny golden ModernBERT (window 8, full and sliding layers
    alternating, bf16 weights), its tensors written in the contract's
    layout, run in fp32 on the golden case's tokens (token embedding rows,
    pad columns 0, the key mask) in the bucket of the case's length:
    last_hidden_state within 1e-4 of transformers' on every real token.
    The 128-token cases are longer than the window; the numpy model
    without it is further away."""
    spec, w, table, pkg = golden
    g = read_safetensors(ROOT / f"golden/text/tower/tiny-modernbert/{case}.safetensors")
    ids, n = g["input_ids"], int(case.rsplit("-", 1)[1])
    real, d = len(ids), spec["hidden_size"]
    emb = np.zeros((n, d), np.float32)
    emb[:real] = table[ids]
    mask = np.zeros((1, 1, n), np.float32)
    mask[..., real:] = -1e4
    got = run(tmp_path, pkg, f"b{n}", {"embeddings": np.ascontiguousarray(emb.T.reshape(1, d, 1, n)), "mask": mask})
    err = np.abs(tokens_of(got["last_hidden_state"])[:real] - g["last_hidden_state"]).max()
    assert err < 1e-4, f"{case}: last_hidden_state off by {err}"
    if real > spec["local_attention"] // 2 + 1:
        unbounded = reference(spec, w, emb, real, window=False)[:real]
        assert np.abs(unbounded - g["last_hidden_state"]).max() > 1e-3


# ---- the package and the op graph


def test_multifunction_package(tmp_path):
    """Both buckets in one package: static inputs per function (the mask a
    row per text), no R8 op, the output named and described."""
    import coremltools as ct

    spec, w = tiny()
    path = str(tmp_path / "p.mlpackage")
    modernbert.save_packages(spec, w, [("b16", 16), ("b32", 32)], path,
                             metadata={"author": "ane-export tests", "user": {"bucket_tokens": "16,32"}})
    spec_pb = ct.utils.load_spec(path)
    prog = spec_pb.mlProgram
    assert sorted(prog.functions.keys()) == ["b16", "b32"]
    for name, n in (("b16", 16), ("b32", 32)):
        f = prog.functions[name]
        dims = {i.name: [d.constant.size for d in i.type.tensorType.dimensions] for i in f.inputs}
        assert dims == {"embeddings": [1, D, 1, n], "mask": [1, 1, n]}
        ops = {op.type for op in f.block_specializations[f.opset].operations}
        assert not ops & R8_OPS, ops & R8_OPS
        assert {"conv", "layer_norm", "softmax", "matmul", "gelu"} <= ops
        assert list(f.block_specializations[f.opset].outputs) == ["last_hidden_state"]
    assert spec_pb.description.metadata.userDefined["bucket_tokens"] == "16,32"
    for fd in spec_pb.description.functions:
        docs = {x.name: x.shortDescription for x in list(fd.input) + list(fd.output)}
        assert set(docs) == {"embeddings", "mask", "last_hidden_state"}
        assert docs["mask"].startswith(f"[1, 1, {fd.name[1:]}]") and "-1e4" in docs["mask"]


def _ops(spec, w, n, chunk=8):
    return list(modernbert.build_program(spec, w, n, query_chunk=chunk).functions["main"].operations)


def test_op_graph():
    """Per block and head, one softmax per query chunk over scores [1, chunk,
    N]. Full layers add the [1, 1, N] mask input itself; sliding layers a
    slice of the one band + mask sum, whose band is 0 exactly within
    local_attention // 2. Pre-norm: block 0 has no attn_norm; the block
    output is the second residual add; LayerNorm epsilons fp16; fp32 only at
    the casts."""
    spec, w = tiny()
    ops = _ops(spec, w, 20)
    soft = [op for op in ops if op.op_type == "softmax"]
    assert len(soft) == DEPTH * HEADS * 3
    assert sorted({tuple(op.outputs[0].shape) for op in soft}) == [(1, 4, 20), (1, 8, 20)]
    bands = [op for op in ops if op.name == "mask_band"]
    assert len(bands) == 1 and tuple(bands[0].outputs[0].shape) == (1, 20, 20)
    band = bands[0].x.val[0]
    i, j = np.indices(band.shape)
    assert np.array_equal(band == 0, np.abs(i - j) <= 3) and set(band.ravel().tolist()) == {0.0, -1e4}
    for op in soft:
        add = op.x.op
        assert add.op_type == "add" and add.name.endswith("_masked")
        block = int(add.name[1:add.name.index("_")])
        if TYPES[block] == "full_attention":
            assert add.y.name == "mask_fp16" and tuple(add.y.shape) == (1, 1, 20)
        else:
            assert add.y.op.op_type == "slice_by_index" and add.y.op.x.name == "mask_band"
    norms = [op for op in ops if op.op_type == "layer_norm"]
    assert [op.name for op in norms] == (["embed", "b0_mlp_norm"] + [n for i in range(1, DEPTH)
                                                                     for n in (f"b{i}_attn_norm", f"b{i}_mlp_norm")]
                                         + ["final_norm"])
    for op in norms:
        assert op.epsilon.val.dtype == np.float16 and op.epsilon.val == np.float16(1e-5)
        assert not op.beta.val.any()  # norm_bias false: beta 0
    assert next(op for op in ops if op.name == "b0_qkv").x.name == "embed"
    for i in range(1, DEPTH):
        prev = next(op for op in ops if op.name == f"b{i - 1}_res2").outputs[0]
        assert {c.name for c in prev.child_ops} == {f"b{i}_attn_norm", f"b{i}_res1"}
    assert next(op for op in ops if op.name == "final_norm").x.name == f"b{DEPTH - 1}_res2"
    assert all(op.bias is None for op in ops if op.op_type == "conv")
    fp32_out = sorted(op.name for op in ops if op.op_type != "const" and op.outputs[0].dtype.__name__ == "fp32")
    assert fp32_out == ["last_hidden_state"]
    # The rotary tables and the scale: fp32 constants, each cast to fp16 once.
    casts = sorted(op.name for op in ops if op.op_type == "cast" and op.x.op is not None
                   and op.x.op.op_type == "const")
    assert casts == ["attn_scale", "rope_full_cos", "rope_full_sin", "rope_sliding_cos", "rope_sliding_sin"]


def test_small_buckets_and_chunks():
    """A bucket within the window has no band (its sliding layers add the
    key mask); a bucket within one query chunk adds the whole band + mask,
    unsliced; an epsilon below fp16's reach is held as 1e-7."""
    spec, w = tiny()
    ops = _ops(spec, w, 4)
    assert not any(op.name == "mask_band" for op in ops)
    assert all(op.y.name == "mask_fp16" for op in ops if op.name.endswith("_masked"))
    ops = _ops(dict(spec, norm_eps=1e-12), w, 16, chunk=512)
    assert sum(op.op_type == "softmax" for op in ops) == DEPTH * HEADS
    sliding = [op for op in ops if op.name.endswith("_masked") and op.name.startswith("b1_")]
    assert sliding and all(op.y.name == "mask_band" for op in sliding)
    assert all(op.epsilon.val == np.float16(1e-7) for op in ops if op.op_type == "layer_norm")


def test_biases_and_activations():
    """With the bias flags, every conv has its bias and every LayerNorm its
    beta; the GLU multiplies act(in) by gate, act as named."""
    spec, w = tiny(act="silu", norm_bias=True, attention_bias=True, mlp_bias=True)
    ops = _ops(spec, w, 8)
    assert all(op.bias is not None for op in ops if op.op_type == "conv")
    assert all(op.beta.val.any() for op in ops if op.op_type == "layer_norm")
    glu = next(op for op in ops if op.name == "b0_glu")
    assert (glu.x.op.op_type, glu.x.op.x.name, glu.y.name) == ("silu", "b0_in", "b0_gate")
    for act, op_type, mode in (("gelu", "gelu", "EXACT"), ("gelu_new", "gelu", "TANH_APPROXIMATION"),
                               ("gelu_pytorch_tanh", "gelu", "TANH_APPROXIMATION"), ("relu", "relu", None)):
        spec, w = tiny(act)
        op = next(op for op in _ops(spec, w, 8) if op.name == "b0_act")
        assert op.op_type == op_type and (mode is None or op.mode.val == mode), act


# ---- refusals


@pytest.mark.parametrize("change,message", [
    ({"num_heads": 5}, "hidden_size 32 is not a multiple of num_heads 5"),
    ({"hidden_size": 30, "num_heads": 2}, "head size 15 is odd"),
    ({"hidden_act": "quick_gelu"}, "hidden_act 'quick_gelu': expected one of gelu, gelu_new"),
    ({"num_heads": 0}, "num_heads 0: expected a positive integer"),
    ({"local_attention": 0}, "local_attention 0: expected a positive integer"),
    ({"norm_eps": 0}, "norm_eps 0: expected a positive number"),
    ({"norm_bias": 1}, "norm_bias 1: expected true or false"),
    ({"layer_types": TYPES[:2]}, "layer_types .*: expected a list of depth \\(3\\)"),
    ({"layer_types": TYPES[:2] + ["global"]}, "layer_types\\[2\\] 'global': expected one of full_attention"),
    ({"rope_theta": {"full_attention": 1e4}}, "rope_theta\\['sliding_attention'\\] None: expected a positive"),
    ({"rope_theta": 1e4}, "rope_theta 10000.0: expected an object"),
])
def test_bad_spec(change, message):
    spec, w = tiny()
    with pytest.raises(ValueError, match="modernbert spec: " + message):
        modernbert.build_program(dict(spec, **change), w, 16)


def test_missing_spec_field():
    spec, w = tiny()
    del spec["local_attention"]
    with pytest.raises(ValueError, match="modernbert spec: missing local_attention"):
        modernbert.build_program(spec, w, 16)


@pytest.mark.parametrize("tokens", [0, -16, 12.5, True, "16"])
def test_bad_bucket(tokens):
    spec, w = tiny()
    with pytest.raises(ValueError, match="expected a positive whole count"):
        modernbert.build_program(spec, w, tokens)


def test_bad_weights():
    """Missing or misshapen weights, and weights the spec rules out (which
    the program would otherwise leave out silently), are named."""
    spec, w = tiny()
    cases = [
        ({k: v for k, v in w.items() if k != "blocks.2.attn_norm.weight"}, "blocks.2.attn_norm.weight missing"),
        (dict(w, **{"blocks.1.mlp.wi.weight": w["blocks.1.mlp.wi.weight"][:, :, 0, 0]}),
         r"blocks.1.mlp.wi.weight has shape \(80, 32\), expected \(80, 32, 1, 1\)"),
        (dict(w, **{"blocks.0.attn_norm.weight": np.ones(D, np.float32)}),
         "blocks.0.attn_norm.weight present but block 0 has no attn_norm"),
        (dict(w, **{"blocks.1.attn.qkv.bias": np.zeros(3 * D, np.float32)}),
         "blocks.1.attn.qkv.bias present but the spec's norm_bias, attention_bias and mlp_bias rule it out"),
        (dict(w, **{"final_norm.bias": np.zeros(D, np.float32)}), "final_norm.bias present"),
    ]
    for weights, message in cases:
        with pytest.raises(ValueError, match="modernbert weights: " + message):
            modernbert.build_program(spec, weights, 16)


def test_bad_bucket_writes_nothing(tmp_path):
    """A bad bucket among good ones is refused before any package is written."""
    spec, w = tiny()
    path = tmp_path / "x.mlpackage"
    with pytest.raises(ValueError, match="bucket of 0 tokens"):
        modernbert.save_packages(spec, w, [("b16", 16), ("b0", 0)], str(path))
    assert not path.exists() and not list(tmp_path.iterdir())


@pytest.mark.parametrize("fault", ["no-mask", "gather", "overflow", "swap-heads", "ln-eps", "int8-axis"])
def test_gate_faults_find_their_ops(fault):
    """The gates' text faults (faults.py) find the ops they rewrite by the
    shared layers' names; the image ones find nothing and say so."""
    from ane_export import faults

    spec, w = tiny()
    prog = faults.apply(modernbert.build_program(spec, w, 16), (fault,))
    prog.validate()
    for image_only in ("swap-rb", "merge-order"):
        with pytest.raises(ValueError, match="found nothing to rewrite"):
            faults.apply(modernbert.build_program(spec, w, 16), (image_only,))


def test_compression_leaves_the_tables(tmp_path):
    """int8 and palettized packages compress the weights but not the
    builder's tables (rotary cos/sin, the band; `UNCOMPRESSED`): they stay
    plain constants holding the tables' values, where a per-channel int8
    scale or a palette would round them."""
    import coremltools as ct

    spec, w, _ = golden_model()  # hd 20: tables of 2,560 values at 128 tokens, above int8's threshold (2,048)
    for mode, compressed in (("int8", "constexpr_blockwise_shift_scale"), ("pal8", "constexpr_lut_to_dense")):
        path = modernbert.save_packages(spec, w, [("b128", 128)], str(tmp_path / f"{mode}.mlpackage"),
                                        multifunction=False, target="macOS15", weights_mode=mode)
        f = ct.utils.load_spec(path[0]).mlProgram.functions["main"]
        ops = list(f.block_specializations[f.opset].operations)
        made = {o.name: op.type for op in ops for o in op.outputs}
        for name in ("rope_full_cos", "rope_full_sin", "rope_sliding_cos", "rope_sliding_sin", "mask_band_table"):
            assert made[name] == "const", (mode, name, made[name])
        assert compressed in made.values(), mode  # mlp.wi, 10,800 values, is compressed in both modes


# ---- the residual scale (docs/numerics.md; the module docstring)

#: fp16's largest finite value.
FP16_MAX = 65504.0
#: The token and channels `massive` drives past FP16_MAX.
MASSIVE_TOKEN, MASSIVE = 3, [5, 17]


def cosines(a, b):
    """Per row cosine of [N, D] arrays."""
    return (a * b).sum(1) / np.linalg.norm(a, axis=1) / np.linalg.norm(b, axis=1)


def massive(boost=1e5, n=12):
    """(spec, weights, emb [N, D]): tiny() with MLP biases and massive
    activations in one token, as trained encoders show them: its token
    embedding row holds 30 in channels MASSIVE (which then dominate it after
    the embedding norm and block 0's mlp_norm, weight 1 there), block 0's
    GeGLU unit 0 reads them with weight 10 and bias -50 (its gate a constant
    1), which fires in that token alone, and `wo` writes about `boost` into
    them through it (the unit measured in numpy's ModernBERT, wo's weight set
    to `boost` over it): the stream passes fp16's range from block 0 on
    while float32 holds it."""
    spec, w = tiny(mlp_bias=True)
    emb = np.random.default_rng(1).standard_normal((n, D)).astype(np.float32)
    emb[MASSIVE_TOKEN, MASSIVE] = 30.0
    for p in ("embeddings.norm", "blocks.0.mlp_norm"):
        w[p + ".weight"][MASSIVE] = 1.0
    wi, wib, wo = w["blocks.0.mlp.wi.weight"], w["blocks.0.mlp.wi.bias"], w["blocks.0.mlp.wo.weight"]
    wi[0], wi[INTER], wo[:, 0] = 0.0, 0.0, 0.0
    wi[0, MASSIVE], wib[0], wib[INTER] = 10.0, -50.0, 1.0
    wo[MASSIVE, 0] = 1.0
    taps = {}
    reference(spec, w, emb, n, taps=taps)
    unit = taps["b0_glu"][:, 0]
    hot, rest = unit[MASSIVE_TOKEN], np.delete(unit, MASSIVE_TOKEN)
    assert hot > 1.0 and np.abs(rest).max() < 1e-3 * hot, (hot, rest)
    wo[MASSIVE, 0] = boost / hot
    return spec, w, emb


def _feeds(emb, real):
    n, d = emb.shape
    mask = np.zeros((1, 1, n), np.float32)
    mask[..., real:] = -1e4
    return {"embeddings": np.ascontiguousarray(emb.T.reshape(1, d, 1, n)).astype(np.float32), "mask": mask}


@pytest.mark.parametrize("scale", [1, 8, 64])
def test_residual_scale_keeps_the_maths(tmp_path, scale):
    """fp32: a program built with residual_scale S computes ModernBERT with
    the pre-norms' and final_norm's epsilon weighing S^2 more: numpy's
    ModernBERT with that epsilon within 2e-5, on a 20-token bucket (sliding
    and full layers, biases everywhere); S = 1 is the unscaled program bit
    for bit. Against the unscaled program the outputs move by what that
    epsilon does (1e-5 S^2 against variances of order 1: under 1e-3 of
    their largest value at 8, 3e-2 at 64). The stream is carried divided
    by S: the residual adds of the scaled program are the unscaled ones
    over S (their fp32 values, through the interpreter's taps)."""
    spec, w = tiny(act="gelu_pytorch_tanh", norm_bias=True, attention_bias=True, mlp_bias=True)
    emb, feeds = inputs(20, 13)
    pkgs = {s: modernbert.save_packages(dict(spec, residual_scale=s) if s else spec, w, [("b20", 20)],
                                        str(tmp_path / f"s{s}.mlpackage"), query_chunk=8)[0] for s in (None, scale)}
    base, got = (run(tmp_path, pkgs[s], "b20", feeds) for s in (None, scale))
    eps = float(np.float16(spec["norm_eps"])) * scale ** 2
    want = reference(spec, w, emb, 13, stream_eps=eps)[:13]
    err = np.abs(tokens_of(got["last_hidden_state"])[:13] - want).max()
    assert err < 2e-5, err
    rel = np.abs(got["last_hidden_state"] - base["last_hidden_state"]).max() / np.abs(base["last_hidden_state"]).max()
    if scale == 1:
        assert np.array_equal(got["last_hidden_state"], base["last_hidden_state"])
    else:
        assert rel < {8: 1e-3, 64: 3e-2}[scale], rel


def test_residual_scale_weights():
    """What S changes in the program's constants: the embedding norm, every
    attn.proj and mlp.wo (weight and bias) divided by S, block 0's qkv
    weight (which reads the stream without a norm) multiplied by S, nothing
    else; the op graph is the unscaled one."""
    spec, w = tiny(norm_bias=True, attention_bias=True, mlp_bias=True)

    def consts(s):
        """The op graph (non-constant ops' names and types) and the constants, keyed by
        the op that reads them (const names are numbered per build)."""
        prog = modernbert.build_program(dict(spec, residual_scale=s), w, 12, query_chunk=8)
        ops = [op for op in prog.functions["main"].operations if op.op_type != "const"]
        return ([(op.name, op.op_type) for op in ops],
                {f"{op.name}.{k}": v.val for op in ops for k, v in op.inputs.items()
                 if not isinstance(v, (list, tuple)) and v.op is not None and v.op.op_type == "const"
                 and v.val is not None and np.size(v.val) > 1})

    (graph1, c1), (graph8, c8) = consts(1), consts(8)
    assert graph1 == graph8 and set(c1) == set(c8)
    changed = {k for k in c1 if not np.array_equal(np.asarray(c1[k]), np.asarray(c8[k]))}
    assert changed, "nothing scaled"
    ratios = {k: float(np.median(np.asarray(c8[k], np.float64)[np.asarray(c1[k]) != 0]
                                 / np.asarray(c1[k], np.float64)[np.asarray(c1[k]) != 0])) for k in changed}
    up = {k for k, r in ratios.items() if r == 8.0}
    down = {k for k, r in ratios.items() if r == 1 / 8}
    assert up | down == changed, ratios
    assert len(up) == 1 and next(iter(up)).startswith("b0_qkv"), up
    # embed gamma and beta, then per block proj and wo, weight and bias
    assert len(down) == 2 + 4 * spec["depth"], sorted(down)


def test_residual_scale_carries_massive_activations(tmp_path):
    """The point of it: a token whose channels MASSIVE block 0's MLP drives
    to about 1e5 in the stream (`massive`), past fp16's 65,504 while
    float32 holds it. Built without the residual scale, the fp16 and ane
    interpreters lose it (non-finite outputs, or cosines far from numpy's
    ModernBERT); with residual_scale 16 the stream is about 6,250, inside
    fp16 and the Neural Engine's 32,752, and every real token's cosine with
    numpy's float64 ModernBERT is >= 0.999."""
    spec, w, emb = massive()
    real = emb.shape[0]
    taps = {}
    want = reference(spec, w, emb, real, taps=taps)
    peak = max(np.abs(v).max() for k, v in taps.items() if "_res" in k)
    assert peak > 1.4 * FP16_MAX and np.abs(taps["b0_res2"][:, MASSIVE]).argmax() // 2 == MASSIVE_TOKEN
    feeds = _feeds(emb, real)
    pkgs = {s: modernbert.save_packages(dict(spec, residual_scale=s), w, [("b12", 12)],
                                        str(tmp_path / f"s{s}.mlpackage"), query_chunk=8)[0] for s in (1, 16)}
    for precision in ("fp16", "ane"):
        h = tokens_of(run(tmp_path, pkgs[1], "b12", feeds, precision)["last_hidden_state"])
        assert not (np.isfinite(h).all() and cosines(h, want).min() >= 0.99), precision  # NaN cosines too
        h = tokens_of(run(tmp_path, pkgs[16], "b12", feeds, precision)["last_hidden_state"])
        assert np.isfinite(h).all(), precision
        cos = cosines(h[:real], want[:real])
        assert cos.min() >= 0.999, (precision, cos)


@pytest.mark.parametrize("scale", [0, 3, 8192, -2, 2.5, True, "8"])
def test_bad_residual_scale(scale):
    spec, w = tiny()
    with pytest.raises(ValueError, match=f"modernbert spec: residual_scale {scale!r}: expected a power of two "
                                         "from 1 to 4096"):
        modernbert.build_program(dict(spec, residual_scale=scale), w, 16)


@pytest.mark.parametrize("case", ["plain-128", "medium-128"])
def test_massive_golden_needs_the_residual_scale(tmp_path, case):
    """tiny-modernbert-massive (golden/README-text.md: about 1e5 in channels 5
    and 17 of the stream in the [SEP] token) in the ane interpreter against
    transformers' golden last_hidden_state: built without the residual scale
    the [SEP] token is lost (non-finite, or cosine < 0.99); with 16 every
    real token's cosine is >= 0.999."""
    spec, w, table = golden_model("tiny-modernbert-massive")
    g = read_safetensors(ROOT / f"golden/text/tower/tiny-modernbert-massive/{case}.safetensors")
    ids, n, d = g["input_ids"], 128, spec["hidden_size"]
    real = len(ids)
    emb = np.zeros((n, d), np.float32)
    emb[:real] = table[ids]
    feeds = _feeds(emb, real)
    want = g["last_hidden_state"].astype(np.float64)
    for scale, ok in ((1, False), (16, True)):
        pkg = modernbert.save_packages(dict(spec, residual_scale=scale), w, [("b128", n)],
                                       str(tmp_path / f"s{scale}.mlpackage"))[0]
        h = tokens_of(run(tmp_path, pkg, "b128", feeds, "ane")["last_hidden_state"])[:real]
        good = bool(np.isfinite(h).all() and cosines(h, want).min() >= (0.999 if ok else 0.99))
        assert good == ok, (scale, cosines(h, want).min())
