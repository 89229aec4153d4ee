"""The Qwen builders' fp16 remedy: with `residual_scale` S the weights that
write the residual stream are the unscaled program's divided by S (and
Qwen3-VL's `pos` input multiplied by 1/S before it joins the stream); with
`branch_scale` B, Qwen2.5-VL's `up` projection is divided by B and its down
projection's weight multiplied by B; nothing else changes. (That the
programs then compute the same outputs is tested in Rust, tests/it/
qwen_remedy.rs, by running them in the interpreter.)"""

import numpy as np
import pytest
from ane_export import qwen2_5_vl, qwen2_vl, qwen3_vl

D, HEADS, INTER, OUT, PD = 16, 2, 24, 12, 12


def _weights(mlp, merger_norms, patch_bias):
    """Random weights of a 2-block tower: `mlp` {name: (out, in)} per block,
    `merger_norms` {prefix: (norm names, width)}."""
    rng = np.random.default_rng(0)

    def conv(o, i):
        return rng.standard_normal((o, i, 1, 1)).astype(np.float32) * 0.1

    def vec(n):
        return rng.standard_normal(n).astype(np.float32) * 0.1

    w = {"patch_embed.weight": conv(D, PD)}
    if patch_bias:
        w["patch_embed.bias"] = vec(D)
    for i in range(2):
        b = f"blocks.{i}"
        for n in ("norm1", "norm2"):
            w[f"{b}.{n}.weight"] = np.ones(D, np.float32)
            w[f"{b}.{n}.bias"] = np.zeros(D, np.float32)
        for n, (o, ii) in {"attn.qkv": (3 * D, D), "attn.proj": (D, D), **mlp}.items():
            w[f"{b}.{n}.weight"] = conv(o, ii)
            w[f"{b}.{n}.bias"] = vec(o)
    for p, (norm, fc1, fc2, width) in merger_norms.items():
        w[f"{p}.{norm}.weight"] = np.ones(width, np.float32)
        w[f"{p}.{norm}.bias"] = np.zeros(width, np.float32)
        w[f"{p}.{fc1}.weight"] = conv(4 * D, 4 * D)
        w[f"{p}.{fc1}.bias"] = vec(4 * D)
        w[f"{p}.{fc2}.weight"] = conv(OUT, 4 * D)
        w[f"{p}.{fc2}.bias"] = vec(OUT)
    # In fp16, as the build passes them: dividing an fp16 weight by S then
    # rounds as the build's does (below 2^-14 S it becomes subnormal).
    return {k: v.astype(np.float16) for k, v in w.items()}


def qwen3():
    spec = dict(hidden_size=D, num_heads=HEADS, depth=2, out_hidden_size=OUT, intermediate_size=INTER,
                deepstack_visual_indexes=[0], patch_dim=PD, hidden_act="gelu_pytorch_tanh")
    mlp = {"mlp.linear_fc1": (INTER, D), "mlp.linear_fc2": (D, INTER)}
    mergers = {"merger": ("norm", "linear_fc1", "linear_fc2", D),
               "deepstack_merger_list.0": ("norm", "linear_fc1", "linear_fc2", 4 * D)}
    return qwen3_vl, spec, _weights(mlp, mergers, True), "linear_fc2"


def qwen25():
    spec = dict(hidden_size=D, num_heads=HEADS, depth=2, out_hidden_size=OUT, intermediate_size=INTER,
                patch_dim=PD, hidden_act="silu", window_slots=16, fullatt_block_indexes=[1])
    mlp = {"mlp.gate_proj": (INTER, D), "mlp.up_proj": (INTER, D), "mlp.down_proj": (D, INTER)}
    w = _weights(mlp, {"merger": ("ln_q", "mlp.0", "mlp.2", D)}, False)
    return qwen2_5_vl, spec, w, "down_proj"


def qwen2():
    spec = dict(hidden_size=D, num_heads=HEADS, depth=2, out_hidden_size=OUT, intermediate_size=INTER,
                patch_dim=PD, hidden_act="quick_gelu")
    mlp = {"mlp.fc1": (INTER, D), "mlp.fc2": (D, INTER)}
    return qwen2_vl, spec, _weights(mlp, {"merger": ("ln_q", "mlp.0", "mlp.2", D)}, False), "fc2"


def consts(prog):
    """{op name: {input name: value}} of the constant inputs of every op of `main`."""
    out = {}
    for op in prog.functions["main"].operations:
        vals = {k: v.val for k, v in op.inputs.items() if getattr(v, "val", None) is not None
                and isinstance(v.val, np.ndarray)}
        if vals:
            out[op.name] = vals
    return out


def _scaled_ops(down):
    """The conv ops whose weights carry 1/S, by their MIL names."""
    fc2 = {"linear_fc2": "fc2", "fc2": "fc2", "down_proj": "down"}[down]
    return {"patch_embed"} | {f"b{i}_{n}" for i in range(2) for n in ("proj", fc2)}


@pytest.mark.parametrize("family", [qwen3, qwen25, qwen2])
def test_residual_scale_divides_what_writes_the_stream(family):
    module, spec, w, down = family()
    plain = consts(module.build_program(spec, w, 64))
    scaled = consts(module.build_program(dict(spec, residual_scale=64), w, 64))
    divided = _scaled_ops(down)
    assert divided <= plain.keys()
    assert plain.keys() == scaled.keys()
    for op, vals in plain.items():
        for k, v in vals.items():
            want = v / np.float16(64) if op in divided and k in ("weight", "bias") else v
            np.testing.assert_array_equal(scaled[op][k], want, err_msg=f"{op}.{k}")
    ops = [op.name for op in module.build_program(dict(spec, residual_scale=64), w, 64)
           .functions["main"].operations]
    # Qwen3-VL's position rows join the stream at 1/S; the others have none.
    assert ("pos_scaled" in ops) == (module is qwen3_vl)
    if module is qwen3_vl:
        (op,) = [o for o in module.build_program(dict(spec, residual_scale=64), w, 64)
                 .functions["main"].operations if o.name == "pos_scaled"]
        assert op.inputs["y"].val == np.float16(1 / 64)


def test_branch_scale_divides_up_and_multiplies_down():
    module, spec, w, _ = qwen25()
    plain = consts(module.build_program(spec, w, 64))
    for s, b in ((1, 8), (64, 8), (4, 64)):
        got = consts(module.build_program(dict(spec, residual_scale=s, branch_scale=b), w, 64))
        for op, vals in plain.items():
            for k, v in vals.items():
                want = v
                if op.endswith("_up") and k in ("weight", "bias"):
                    want = v / np.float16(b)
                elif op.endswith("_down") and k == "weight":
                    want = v * np.float16(b) / np.float16(s)
                elif (op.endswith("_down") or op.endswith("_proj") or op == "patch_embed") and k in ("weight", "bias"):
                    want = v / np.float16(s)
                np.testing.assert_array_equal(got[op][k], want, err_msg=f"S={s} B={b} {op}.{k}")


def test_branch_scale_beyond_fp16_is_refused():
    module, spec, w, _ = qwen25()
    w = dict(w)
    w["blocks.1.mlp.down_proj.weight"] = w["blocks.1.mlp.down_proj.weight"] * 0 + 20.0
    with pytest.raises(ValueError, match="branch_scale 4096: blocks.1.mlp.down_proj.weight reaches"):
        module.build_program(dict(spec, branch_scale=4096), w, 64)
