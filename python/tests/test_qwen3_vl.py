"""The Qwen3-VL MIL program builds, saves as a multifunction package with one
function per bucket, keeps static shapes and uses no op that leaves the ANE."""

import json

import numpy as np
import pytest
from ane_export import faults as fault_rewrites
from ane_export.emit import convert
from ane_export.qwen3_vl import build_program, save_packages

#: Ops ANE-RULES R8 sends to the CPU: never emitted.
R8_OPS = {"gather", "gather_nd", "gather_along_axis", "embedding", "cond", "while_loop", "band_part"}


def tiny():
    rng = np.random.default_rng(0)
    d, heads, inter, out, pd = 16, 2, 24, 12, 12
    spec = dict(hidden_size=d, num_heads=heads, depth=2, out_hidden_size=out, intermediate_size=inter,
                deepstack_visual_indexes=[0], patch_dim=pd, hidden_act="gelu_pytorch_tanh")

    def conv(o, i):
        return rng.standard_normal((o, i, 1, 1)).astype(np.float32) * 0.1

    w = {"patch_embed.weight": conv(d, pd), "patch_embed.bias": np.zeros(d, np.float32)}
    for i in range(2):
        b = f"blocks.{i}"
        for n in ("norm1", "norm2"):
            w[f"{b}.{n}.weight"] = np.ones(d, np.float32)
            w[f"{b}.{n}.bias"] = np.zeros(d, np.float32)
        for n, (o, ii) in {"attn.qkv": (3 * d, d), "attn.proj": (d, d), "mlp.linear_fc1": (inter, d),
                           "mlp.linear_fc2": (d, inter)}.items():
            w[f"{b}.{n}.weight"] = conv(o, ii)
            w[f"{b}.{n}.bias"] = np.zeros(o, np.float32)
    for p, norm in (("merger", d), ("deepstack_merger_list.0", 4 * d)):
        w[f"{p}.norm.weight"] = np.ones(norm, np.float32)
        w[f"{p}.norm.bias"] = np.zeros(norm, np.float32)
        w[f"{p}.linear_fc1.weight"] = conv(4 * d, 4 * d)
        w[f"{p}.linear_fc1.bias"] = np.zeros(4 * d, np.float32)
        w[f"{p}.linear_fc2.weight"] = conv(out, 4 * d)
        w[f"{p}.linear_fc2.bias"] = np.zeros(out, np.float32)
    return spec, w


def test_bucket_must_be_multiple_of_4():
    spec, w = tiny()
    with pytest.raises(ValueError, match="multiple of 4"):
        build_program(spec, w, 10)


def test_multifunction_package(tmp_path):
    """Both buckets in one package: static inputs per function, no R8 op, the
    outputs named, metadata and descriptions kept, weights stored once."""
    import coremltools as ct

    spec, w = tiny()
    path = str(tmp_path / "t.mlpackage")
    save_packages(spec, w, [("b16", 16), ("b32", 32)], path, multifunction=True,
                  metadata={"author": "ane-export tests", "user": {"bucket_patches": "16,32"}})
    manifest = json.loads((tmp_path / "t.mlpackage" / "Manifest.json").read_text())
    assert manifest["rootModelIdentifier"] in manifest["itemInfoEntries"]
    spec_pb = ct.utils.load_spec(path)
    prog = spec_pb.mlProgram
    assert sorted(prog.functions.keys()) == ["b16", "b32"]
    for name, n in (("b16", 16), ("b32", 32)):
        f = prog.functions[name]
        dims = {i.name: [d.constant.size for d in i.type.tensorType.dimensions] for i in f.inputs}
        assert dims == {"patches": [1, 12, 1, n], "pos": [1, 16, 1, n], "cos": [1, 8, 1, n],
                        "sin": [1, 8, 1, n], "mask": [1, n, n]}
        ops = {op.type for op in f.block_specializations[f.opset].operations}
        assert not ops & R8_OPS, ops & R8_OPS
        assert "conv" in ops and "layer_norm" in ops
        outs = list(f.block_specializations[f.opset].outputs)
        assert outs == ["embeds", "deepstack_0"]
    # Metadata and descriptions reach the merged package (Xcode shows them).
    meta = spec_pb.description.metadata
    assert meta.author == "ane-export tests" and meta.userDefined["bucket_patches"] == "16,32"
    assert [fd.name for fd in spec_pb.description.functions] == ["b16", "b32"]
    assert spec_pb.description.defaultFunctionName == "b16"
    for fd in spec_pb.description.functions:
        n = int(fd.name[1:])
        docs = {x.name: x.shortDescription for x in list(fd.input) + list(fd.output)}
        assert docs["mask"].startswith(f"[1, {n}, {n}]") and docs["embeds"].startswith(f"[1, 12, 1, {n // 4}]")
    # Weights are stored once for both functions.
    single = tmp_path / "one"
    save_packages(spec, w, [("b16", 16)], str(single), multifunction=False)
    blob = "Data/com.apple.CoreML/weights/weight.bin"
    both = (tmp_path / "t.mlpackage" / blob).stat().st_size
    one = (single / "b16.mlpackage" / blob).stat().st_size
    assert both <= 1.05 * one, (both, one)


@pytest.mark.parametrize("mode,op", [("int8", "constexpr_blockwise_shift_scale"), ("pal8", "constexpr_lut_to_dense")])
def test_compressed_weights(tmp_path, mode, op):
    """Compression keeps the program and adds the dequantising constexpr op."""
    import coremltools as ct

    spec, w = tiny()
    # Make one weight large enough for palettisation's 10,000-element threshold.
    rng = np.random.default_rng(1)
    spec["intermediate_size"] = 640
    for i in range(2):
        w[f"blocks.{i}.mlp.linear_fc1.weight"] = rng.standard_normal((640, 16, 1, 1)).astype(np.float32)
        w[f"blocks.{i}.mlp.linear_fc1.bias"] = np.zeros(640, np.float32)
        w[f"blocks.{i}.mlp.linear_fc2.weight"] = rng.standard_normal((16, 640, 1, 1)).astype(np.float32)
    path = str(tmp_path / "q.mlpackage")
    save_packages(spec, w, [("b16", 16)], path, multifunction=True, weights_mode=mode)
    prog = ct.utils.load_spec(path).mlProgram
    f = prog.functions["b16"]
    ops = {o.type for o in f.block_specializations[f.opset].operations}
    assert op in ops, ops


def test_older_target_needs_one_package_per_bucket(tmp_path):
    spec, w = tiny()
    with pytest.raises(ValueError, match="macOS 15"):
        save_packages(spec, w, [("b16", 16)], str(tmp_path / "x.mlpackage"), multifunction=True, target="macOS14")
    out = save_packages(spec, w, [("b16", 16)], str(tmp_path), multifunction=False, target="macOS14")
    assert out == [str(tmp_path / "b16.mlpackage")]


def test_inputs_and_outputs_are_described(tmp_path):
    import coremltools as ct

    spec, w = tiny()
    save_packages(spec, w, [("b16", 16)], str(tmp_path), multifunction=False)
    d = ct.utils.load_spec(str(tmp_path / "b16.mlpackage")).description
    docs = {f.name: f.shortDescription for f in list(d.input) + list(d.output)}
    assert set(docs) == {"patches", "pos", "cos", "sin", "mask", "embeds", "deepstack_0"}
    assert "merge-block order" in docs["patches"] and "-1e4" in docs["mask"]


def test_attention_is_chunked_over_queries():
    """R4: with 16-query chunks, a 40-patch bucket has chunks of 16, 16 and 8
    per head and block, and no score tensor longer than 16 rows."""
    spec, w = tiny()
    prog = build_program(spec, w, 40, query_chunk=16)
    ops = list(prog.functions["main"].operations)
    soft = [op for op in ops if op.op_type == "softmax"]
    assert len(soft) == spec["depth"] * spec["num_heads"] * 3
    assert sorted({tuple(op.outputs[0].shape) for op in soft}) == [(1, 8, 40), (1, 16, 40)]
    # The mask is sliced once per chunk, not per head.
    mask_slices = [op for op in ops if op.op_type == "slice_by_index" and op.name.startswith("mask_q")]
    assert len(mask_slices) == 3
    # Without chunking (or a bucket within one chunk): one softmax per head and block.
    prog = build_program(spec, w, 16, query_chunk=16)
    assert sum(op.op_type == "softmax" for op in prog.functions["main"].operations) == 4


def test_program_is_emitted_in_fp16():
    """R5: every float constant is fp16 and every op computes in fp16; only the
    input casts read fp32 and only the output casts write it."""
    spec, w = tiny()
    ops = list(build_program(spec, w, 40, query_chunk=16).functions["main"].operations)
    fp32_out = sorted(op.name for op in ops if op.outputs[0].dtype.__name__ == "fp32")
    assert fp32_out == ["deepstack_0", "embeds"]
    fp32_in = sorted(op.name for op in ops if op.op_type != "const"
                     and any(getattr(v, "dtype", None) is not None and v.dtype.__name__ == "fp32"
                             for v in op.inputs.values()))
    assert fp32_in == ["cos_fp16", "mask_fp16", "patches_fp16", "pos_fp16", "sin_fp16"]
    assert all(op.outputs[0].dtype.__name__ != "fp32" for op in ops if op.op_type == "const")


def _dataflow(model):
    """A converted model's program as a dataflow graph, independent of op
    order and of constant names (the builder names constants by global
    counters, and a moved op gets a new one): each non-constant op by the name
    of its output, with its type, each input as a variable's name or a
    constant's dtype and value, and its outputs' dtypes and shapes; and the
    function's outputs."""
    f = model._mil_program.functions["main"]

    def source(v):
        if v.op is not None and v.op.op_type == "const":
            return ("const", v.dtype.__name__, np.asarray(v.val).tobytes())
        return ("var", v.name)

    graph = {}
    for op in f.operations:
        if op.op_type == "const":
            continue
        ins = {k: tuple(source(x) for x in v) if isinstance(v, (list, tuple)) else source(v)
               for k, v in op.inputs.items()}
        graph[op.outputs[0].name] = (op.op_type, ins, tuple((v.dtype.__name__, tuple(v.shape)) for v in op.outputs))
    return graph, [v.name for v in f.outputs]


@pytest.mark.parametrize("faults", [(), ("swap-rb", "overflow"), ("gather", "no-mask")])
def test_trimmed_pipeline_converts_as_the_default_one(faults):
    """Converting through `CONVERT_PASSES` yields the program coremltools'
    default pipeline makes of the fp16 program: the same ops computing the
    same thing from the same constants, with the same dtypes and shapes."""
    spec, w = tiny()

    def program(w, chunk):
        return fault_rewrites.apply(build_program(spec, w, 40, query_chunk=chunk), faults)

    trimmed = _dataflow(convert(program(w, 16)))
    default = _dataflow(convert(program(w, 16), passes=None))
    assert len(trimmed[0]) == len(default[0]) > 100
    assert trimmed == default
    # The comparison sees a changed structure and a changed constant.
    assert _dataflow(convert(program(w, 8))) != default
    w2 = dict(w, **{"blocks.1.mlp.linear_fc2.bias": w["blocks.1.mlp.linear_fc2.bias"] + np.float32(0.5)})
    assert _dataflow(convert(program(w2, 16))) != default


def test_program_text_is_skipped_only_while_converting_without_debug_logging():
    import logging

    from ane_export.emit import _no_program_dumps

    spec, w = tiny()
    prog = build_program(spec, w, 16)
    full = str(prog)
    assert "layer_norm" in full
    with _no_program_dumps():
        assert "not formatted" in str(prog)
    assert str(prog) == full
    log = logging.getLogger("coremltools")
    level = log.level
    log.setLevel(logging.DEBUG)
    try:
        with _no_program_dumps():
            assert str(prog) == full
    finally:
        log.setLevel(level)
