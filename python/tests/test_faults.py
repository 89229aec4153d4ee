"""The test faults are rewrites of a finished program: each changes exactly
what it names, the result still converts, and a fault that finds nothing
to rewrite (or an unknown one) is an error. (That each fault makes its gate
fail is tested from Rust, in tests/it/faults.rs.)"""

import numpy as np
import pytest
from ane_export import faults
from ane_export.emit import convert
from ane_export.qwen3_vl import build_program
from ane_export.vit import _f16
from test_qwen3_vl import tiny


def program(*names, chunk=16):
    spec, w = tiny()
    prog = build_program(spec, w, 40, query_chunk=chunk)
    return faults.apply(prog, names), spec, w


def ops(prog, op_type=None):
    return [op for op in prog.functions["main"].operations if op_type is None or op.op_type == op_type]


def named(prog, name):
    (op,) = [op for op in ops(prog) if op.name == name]
    return op


def test_no_fault_leaves_the_program_alone():
    clean, _, _ = program()
    spec, w = tiny()
    def layers(prog):  # constants are numbered per program built
        return [(o.op_type, o.name) for o in ops(prog) if o.op_type != "const"]

    assert layers(clean) == layers(build_program(spec, w, 40, query_chunk=16))


def test_swap_rb_exchanges_the_red_and_blue_input_blocks():
    prog, _, w = program("swap-rb")
    got = named(prog, "patch_embed").weight.val
    pe = w["patch_embed.weight"].astype(np.float16)
    k = pe.shape[1] // 3
    np.testing.assert_array_equal(got[:, :k], pe[:, 2 * k:])
    np.testing.assert_array_equal(got[:, k:2 * k], pe[:, k:2 * k])
    np.testing.assert_array_equal(got[:, 2 * k:], pe[:, :k])


def test_no_mask_removes_every_masked_add():
    clean, spec, _ = program()
    prog, _, _ = program("no-mask")
    masked = [o for o in ops(clean, "add") if o.name.endswith("_masked")]
    # Two blocks, two heads, three query chunks of 40 queries.
    assert len(masked) == spec["depth"] * spec["num_heads"] * 3
    assert not [o for o in ops(prog, "add") if o.name.endswith("_masked")]
    for o in ops(prog, "softmax"):
        assert o.x.op.op_type == "mul", "softmax reads the scaled scores"


def test_gather_follows_the_embedding():
    prog, _, _ = program("gather")
    (g,) = ops(prog, "gather")
    assert g.x.op.name == "embed"
    assert [c.op_type for c in g.x.child_ops] == ["gather"], "everything else reads the gather"
    assert sorted(c.name for c in g.outputs[0].child_ops) == ["b0_norm1", "b0_res1"]


def test_overflow_boosts_block_1_after_its_attention():
    prog, _, _ = program("overflow")
    boosts = [o for o in ops(prog, "mul") if "_boost" in o.name]
    assert [o.name for o in boosts] == [f"b1_boost{j}" for j in range(4)]
    assert boosts[0].x.op.name == "b1_res1"
    assert [float(o.y.val) for o in boosts] == [256.0, 256.0, 1 / 256.0, 1 / 256.0]
    assert {c.name for c in boosts[-1].outputs[0].child_ops} == {"b1_norm2", "b1_res2"}


def test_swap_heads_exchanges_the_first_two_heads_of_every_block():
    clean, spec, _ = program()
    prog, _, _ = program("swap-heads")
    for i in range(spec["depth"]):
        before = [v.name for v in named(clean, f"b{i}_heads").values]
        after = [v.name for v in named(prog, f"b{i}_heads").values]
        assert after == [before[1], before[0]] + before[2:]


def test_ln_eps_scales_every_layer_norm():
    clean, _, _ = program()
    prog, _, _ = program("ln-eps")
    assert len(ops(prog, "layer_norm")) == len(ops(clean, "layer_norm")) == 6
    assert {float(o.epsilon.val) for o in ops(clean, "layer_norm")} == {float(_f16(1e-6))}
    assert {float(o.epsilon.val) for o in ops(prog, "layer_norm")} == {float(_f16(1e-5))}


def test_merge_order_reorders_every_merge():
    prog, _, _ = program("merge-order")
    concats = [o for o in ops(prog, "concat") if o.name.endswith("_transposed")]
    assert sorted(o.name for o in concats) == ["deepstack_merger_list.0_transposed", "merger_transposed"]
    for c in concats:
        assert [v.op.name[-2:] for v in c.values] == ["g0", "g2", "g1", "g3"]
        assert [o.name for o in c.outputs[0].child_ops] == [c.name.replace("_transposed", "_rows")]


def test_int8_axis_stores_square_convs_with_scales_on_the_input_axis():
    clean, _, _ = program()
    prog, _, w = program("int8-axis")
    square = [o for o in ops(clean, "conv") if o.weight.val.shape[0] == o.weight.val.shape[1]]
    q = ops(prog, "constexpr_blockwise_shift_scale")
    assert len(q) == len(square) > 0
    proj = named(prog, "b0_proj").weight.op
    assert proj.op_type == "constexpr_blockwise_shift_scale"
    assert proj.data.val.dtype == np.int8 and proj.scale.val.shape == (1, 16, 1, 1)


@pytest.mark.parametrize("name", faults.FAULTS)
def test_every_fault_converts(name):
    prog, _, _ = program(name)
    convert(prog)


def test_unknown_faults_and_faults_with_nothing_to_rewrite_are_errors():
    with pytest.raises(ValueError, match="expected some of"):
        program("swap-everything")
    import coremltools as ct
    from coremltools.converters.mil import Builder as mb

    @mb.program(input_specs=[mb.TensorSpec(shape=(1, 4, 1, 8))], opset_version=ct.target.macOS15)
    def bare(x):
        return mb.relu(x=x, name="y")

    with pytest.raises(ValueError, match="merge-order: found nothing"):
        faults.apply(bare, ["merge-order"])
