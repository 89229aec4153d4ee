#!/usr/bin/env python3
"""Tiny ML programs for the static residency checker's rule tests (golden/residency/).

src/gate/residency/ predicts, rule by rule (ANE-RULES.md), which ops of a saved ML program
leave the Neural Engine and which function-level checks pass, warn or fail. For each rule it
applies, this script writes a program that breaks it (`<rule>_break*`) and a minimal
counterpart that keeps it (`<rule>_ok`), as golden/residency/<case>/model.mlpackage;
tests/residency_rules.rs opens them and asserts, op by op (ops are named by their first
output), what the checker says.

Every program is built with coremltools' MIL builder and converted with an EMPTY pass
pipeline and compute_precision FLOAT32, so the saved program holds exactly the ops, names and
dtypes written here (no fusion, no constant folding, no fp16 cast pass). Programs are fp16 end
to end (fp16 inputs and outputs, fp16 constants), as the exporter emits them, unless a case
says otherwise, and every function has an input whose last axis is above 64 so that R11 (tiny
workloads) does not take over the placements, except in the R11 cases.

Core ML refuses tensors of rank > 5 at conversion (coremltools' early rank check), so the two
rank-6 cases (`r6_break_rank`, `r10_break`) are converted with that one check switched off:
they hold what another producer could write, which is what R6/R10 guard against.

Deterministic: no random data the tests depend on (weights are seeded), Manifest.json item
UUIDs made deterministic and model.mlmodel re-serialised deterministically (as
make_mil_cases.py does). Packages without blobs have no weights/ directory (git would not keep
the empty one coremltools writes).

Regenerate (from the repository root; `make golden-residency`):

    .venv/bin/python python/golden/make_residency_cases.py
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import sys
import uuid
from pathlib import Path

import numpy as np

os.environ.setdefault("TQDM_DISABLE", "1")

import coremltools as ct  # noqa: E402
from coremltools.converters.mil import Builder as mb  # noqa: E402
from coremltools.converters.mil.mil import types  # noqa: E402
from coremltools.converters.mil.mil.program import Program  # noqa: E402
from coremltools.converters.mil.mil.types.type_mapping import np_uint1_dtype, np_uint3_dtype, np_uint4_dtype  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
OUT = ROOT / "golden" / "residency"
OPSET = ct.target.macOS15
SPEC_REL = Path("Data") / "com.apple.CoreML" / "model.mlmodel"
WEIGHTS_DIR_REL = Path("Data") / "com.apple.CoreML" / "weights"
DATE_KEY = "com.github.apple.coremltools.conversion_date"

F16 = types.fp16
F32 = types.fp32
I32 = types.int32

#: (B, C, 1, S) activation used by most cases: S = 128 > 64 (R11).
X = (1, 8, 1, 128)


def spec(shape, dtype=F16):
    return mb.TensorSpec(shape=shape, dtype=dtype)


def h(v):
    """A scalar as an fp16 constant (as the exporter's _f16 makes them)."""
    return np.float32(v).astype(np.float16)


def w16(rng, shape):
    return (rng.normal(size=shape) * 0.1).astype(np.float16)


# --------------------------------------------------------------------------
# saving
# --------------------------------------------------------------------------


@contextlib.contextmanager
def allow_rank_above_5():
    """coremltools refuses rank > 5 tensors before serialising; switch that check off."""
    saved = Program._check_invalid_tensor_rank
    Program._check_invalid_tensor_rank = lambda self: None
    try:
        yield
    finally:
        Program._check_invalid_tensor_rank = saved


def normalize_manifest(pkg: Path, case: str) -> None:
    path = pkg / "Manifest.json"
    text = path.read_text()
    m = json.loads(text)
    assert json.dumps(m, indent=4, sort_keys=True) + "\n" == text, "unexpected Manifest.json formatting"
    remap = {old: str(uuid.uuid5(uuid.NAMESPACE_URL, f"ane-export/golden/residency/{case}/{item['path']}"))
             for old, item in m["itemInfoEntries"].items()}
    m["itemInfoEntries"] = {remap[k]: v for k, v in m["itemInfoEntries"].items()}
    m["rootModelIdentifier"] = remap[m["rootModelIdentifier"]]
    path.write_text(json.dumps(m, indent=4, sort_keys=True) + "\n")


def canonicalize_spec(pkg: Path):
    """Drop the conversion date and re-serialise with sorted map entries; returns the spec."""
    from coremltools.proto import Model_pb2
    path = pkg / SPEC_REL
    s = Model_pb2.Model()
    s.ParseFromString(path.read_bytes())
    if s.description.HasField("metadata"):
        s.description.metadata.userDefined.pop(DATE_KEY, None)
    path.write_bytes(s.SerializeToString(deterministic=True))
    return s


def ops_of(s) -> list[tuple[str, str, str]]:
    """(first output name, op type, output dtype) of every op of the saved main function."""
    from coremltools.proto import MIL_pb2
    f = s.mlProgram.functions["main"]
    block = f.block_specializations[f.opset]
    out = []
    for op in block.operations:
        o = op.outputs[0]
        dt = MIL_pb2.DataType.Name(o.type.tensorType.dataType).lower()
        out.append((o.name, op.type, dt))
    return out


CASES: dict[str, dict] = {}


def save(case: str, prog, expect: str, rank_above_5: bool = False) -> None:
    d = OUT / case
    d.mkdir(parents=True)
    pkg = d / "model.mlpackage"
    with allow_rank_above_5() if rank_above_5 else contextlib.nullcontext():
        model = ct.convert(prog, convert_to="mlprogram", minimum_deployment_target=OPSET,
                           compute_precision=ct.precision.FLOAT32, pass_pipeline=ct.PassPipeline.EMPTY,
                           skip_model_load=True)
    model.save(str(pkg))
    normalize_manifest(pkg, case)
    s = canonicalize_spec(pkg)
    wdir = pkg / WEIGHTS_DIR_REL
    if wdir.is_dir() and not any(wdir.iterdir()):
        wdir.rmdir()
    size = sum(f.stat().st_size for f in pkg.rglob("*") if f.is_file())
    CASES[case] = {"ops": ops_of(s), "expect": expect, "bytes": size,
                   "inputs": [(i.name, list(i.type.multiArrayType.shape)) for i in s.description.input]}


def program(*specs):
    return mb.program(input_specs=list(specs), opset_version=OPSET)


# --------------------------------------------------------------------------
# the cases, rule by rule
# --------------------------------------------------------------------------


def r1():
    rng = np.random.default_rng([0, 1])

    @program(spec(X))
    def brk(x):
        ln = mb.layer_norm(x=x, axes=[-1], epsilon=h(1e-5), name="ln_over_seq")
        x3 = mb.reshape(x=x, shape=[1, 8, 128], name="x_rank3")
        c = mb.conv(x=x3, weight=w16(rng, (8, 8, 1)), name="conv_rank3")
        return ln, c

    save("r1_break", brk, "R1 warns, naming `ln_over_seq` (layer_norm over the sequence axis) and "
         "`conv_rank3` (a conv1d on a rank-3 tensor); both stay on the ANE (R1 is advice, not a placement).")

    @program(spec(X))
    def ok(x):
        ln = mb.layer_norm(x=x, axes=[1], epsilon=h(1e-5), name="ln_channels")
        ln2 = mb.layer_norm(x=x, axes=[-3], epsilon=h(1e-5), name="ln_channels_neg")
        c = mb.conv(x=x, weight=w16(rng, (8, 8, 1, 1)), name="conv_rank4")
        return ln, ln2, c

    save("r1_ok", ok, "R1 passes: layer_norms over channels (axes [1] and [-3]) and a conv on (B, C, 1, S).")


def r2():
    rng = np.random.default_rng([0, 2])

    @program(spec((1, 4, 128)))
    def brk(x):
        return mb.linear(x=x, weight=w16(rng, (8, 128)), name="proj_linear")

    save("r2_break", brk, "R2 warns: one `linear` op (`proj_linear`), which stays on the ANE.")

    @program(spec(X))
    def ok(x):
        return mb.conv(x=x, weight=w16(rng, (16, 8, 1, 1)), name="proj_conv")

    save("r2_ok", ok, "R2 passes: the projection is a 1x1 conv (`proj_conv`).")


def r3():
    def transposes_then_softmax(n):
        @program(spec((1, 8, 128)))
        def p(x):
            t = x
            for i in range(n):
                t = mb.transpose(x=t, perm=[0, 2, 1], name=f"t{i + 1}")
            return mb.softmax(x=t, axis=-1, name="probs")
        return p

    save("r3_break", transposes_then_softmax(5),
         "R3 warns: 5 transposes (`t1`..`t5`) for 1 softmax, one more than the checker tolerates "
         "(softmaxes / 4 + 4).")
    save("r3_ok", transposes_then_softmax(4), "R3 passes: 4 transposes for 1 softmax (the limit).")


def r4():
    def scores(q):
        @program(spec((1, q, 128)), spec((1, 1, 128)))
        def p(s, mask):
            return mb.softmax(x=mb.add(x=s, y=mask, name="masked"), axis=-1, name="probs")
        return p

    save("r4_break", scores(513), "R4 warns: a 513 x 128 score tensor (`probs`), above 512 queries.")
    save("r4_ok", scores(512), "R4 passes: a 512 x 128 score tensor (one chunk).")


def r5():
    @program(spec(X), spec(X, F32))
    def fp32_op(x, x32):
        return mb.relu(x=x, name="relu_fp16"), mb.relu(x=x32, name="relu_fp32")

    save("r5_break_fp32_op", fp32_op, "`relu_fp32` computes in fp32: placed off the ANE by R5; R5 fails.")

    @program(spec(X))
    def fp32_cast(x):
        r = mb.relu(x=x, name="relu")
        up = mb.cast(x=r, dtype="fp32", name="mid_fp32")
        return mb.cast(x=up, dtype="fp16", name="back_fp16")

    save("r5_break_cast", fp32_cast, "`mid_fp32` casts to fp32 inside the program (neither from an input "
         "nor to an output): off the ANE by R5; `back_fp16` stays; R5 fails.")

    @program(spec(X))
    def eps(x):
        a = mb.layer_norm(x=x, axes=[1], epsilon=h(1e-12), name="ln_eps_underflow")
        b = mb.layer_norm(x=x, axes=[1], epsilon=h(6e-8), name="ln_eps_subnormal")
        return a, b

    save("r5_break_epsilon", eps, "fp16 epsilons below 1e-7: `ln_eps_underflow` has 1e-12, which is 0 in "
         "fp16, `ln_eps_subnormal` 6e-8 (5.96e-8 in fp16). R5 fails naming both; no op is placed off.")

    @program(spec(X))
    def inf_const(x):
        return mb.add(x=x, y=np.float16(-np.inf), name="add_neg_inf")

    save("r5_break_inf", inf_const, "an inline fp16 constant -inf (a -inf mask value) feeds `add_neg_inf`: "
         "R5 fails naming the constant; the add stays on the ANE.")

    @program(spec(X, F32))
    def ok(x32):
        x = mb.cast(x=x32, dtype="fp16", name="x_fp16")
        y = mb.layer_norm(x=x, axes=[1], epsilon=h(1e-7), name="ln")
        y = mb.add(x=y, y=h(-1e4), name="add_mask_value")
        return mb.cast(x=y, dtype="fp32", name="out_fp32")

    save("r5_ok", ok, "R5 passes: fp32 only at the edges (`x_fp16` casts the input, `out_fp32` the output), "
         "epsilon 1e-7 (1.19e-7 in fp16), the constant -1e4.")


def r6():
    @program(spec((1, 1, 1, 16385)), spec((1, 65537, 1, 128)))
    def axes(x, y):
        return mb.relu(x=x, name="relu_last_16385"), mb.relu(x=y, name="relu_axis_65537")

    save("r6_break_axes", axes, "`relu_last_16385` (last axis 16385 > 16384) and `relu_axis_65537` "
         "(axis 65537 > 65536): both off the ANE by R6.")

    @program(spec((1, 2, 2, 2, 2, 128)))
    def rank(x):
        return mb.relu(x=x, name="relu_rank6")

    save("r6_break_rank", rank, "`relu_rank6` on a rank-6 tensor: off by R6 (not R10: not a transpose). "
         "Converted with coremltools' rank check switched off.", rank_above_5=True)

    @program(spec((1, 1, 1, 16384)), spec((1, 65536, 1, 128)), spec((1, 2, 2, 2, 128)))
    def ok(x, y, z):
        return (mb.relu(x=x, name="relu_last_16384"), mb.relu(x=y, name="relu_axis_65536"),
                mb.relu(x=z, name="relu_rank5"))

    save("r6_ok", ok, "R6 passes: last axis 16384, another axis 65536, rank 5 (each at the limit).")


def r7():
    rng = np.random.default_rng([0, 7])

    @program(spec(X))
    def brk(x):
        return (
            mb.conv(x=x, weight=w16(rng, (8, 8, 1, 14)), name="conv_k14"),
            mb.conv(x=x, weight=w16(rng, (8, 8, 1, 3)), dilations=[1, 2], name="conv_dilated"),
            mb.max_pool(x=x, kernel_sizes=[1, 14], strides=[1, 1], pad_type="valid", name="pool_k14"),
            mb.avg_pool(x=x, kernel_sizes=[1, 3], strides=[1, 3], pad_type="valid", name="pool_s3"),
            mb.upsample_nearest_neighbor(x=x, scale_factor_height=1, scale_factor_width=3, name="up_3x"),
            mb.upsample_bilinear(x=x, scale_factor_height=1.0, scale_factor_width=2.5, name="up_2_5x"),
        )

    save("r7_break", brk, "Off the ANE by R7: `conv_k14` (kernel 14), `conv_dilated` (dilations [1, 2]), "
         "`pool_k14` (max_pool kernel 14), `pool_s3` (avg_pool stride 3), `up_3x` (nearest 3x), "
         "`up_2_5x` (bilinear 2.5x).")

    @program(spec(X))
    def ok(x):
        return (
            mb.conv(x=x, weight=w16(rng, (8, 8, 1, 13)), name="conv_k13"),
            mb.conv(x=x, weight=w16(rng, (8, 8, 1, 3)), dilations=[1, 1], name="conv_undilated"),
            mb.max_pool(x=x, kernel_sizes=[1, 13], strides=[1, 2], pad_type="valid", name="pool_k13_s2"),
            mb.upsample_nearest_neighbor(x=x, scale_factor_height=1, scale_factor_width=2, name="up_2x"),
            mb.upsample_bilinear(x=x, scale_factor_height=1.0, scale_factor_width=2.0, name="up_bilinear_2x"),
        )

    save("r7_ok", ok, "R7 passes: kernel 13, dilation 1, pooling kernel 13 stride 2, upsampling 2x.")


def r8():
    @program(spec(X), spec((4,), I32), spec((1, 128), I32), spec((1, 128), I32))
    def brk(x, row, a, b):
        return (
            mb.gather(x=x, indices=np.array([0, 2, 4, 6], np.int32), axis=1, name="gather_rows"),
            # x[:, row] with `row` a run-time index (what torch's select converts to)
            mb.slice_by_index(x=x, begin=row, end=np.zeros(4, np.int32), begin_mask=[True, False, True, True],
                              end_mask=[True, True, True, True], squeeze_mask=[False, True, False, False],
                              name="dyn_slice"),
            mb.add(x=a, y=b, name="int_add"),
            mb.reduce_prod(x=x, axes=[1], keep_dims=True, name="reduce_prod"),
            mb.band_part(x=mb.reshape(x=x, shape=[8, 128], name="x_2d"), lower=0, upper=-1, name="band"),
        )

    save("r8_break", brk, "Off the ANE by R8: `gather_rows` (gather), `dyn_slice` (slice_by_index whose begin "
         "is a run-time input), `int_add` (int32 arithmetic), `reduce_prod` (an op the checker does not know "
         "on the ANE), `band` (band_part). `x_2d` stays.")

    @program(spec(X), spec((1, 128)), spec((1, 128)))
    def ok(x, a, b):
        return (
            mb.slice_by_index(x=x, begin=[0, 2, 0, 0], end=[1, 6, 1, 128], name="static_slice"),
            mb.add(x=a, y=b, name="fp16_add"),
            mb.reduce_sum(x=x, axes=[1], keep_dims=True, name="reduce_sum"),
        )

    save("r8_ok", ok, "R8 passes: a slice with constant bounds, an fp16 add, reduce_sum.")


def r10():
    @program(spec((1, 2, 2, 2, 2, 128)))
    def brk(x):
        return mb.transpose(x=x, perm=[0, 2, 1, 3, 4, 5], name="patchify_perm")

    save("r10_break", brk, "`patchify_perm`, a rank-6 transpose: off by R10 (not R6). Converted with "
         "coremltools' rank check switched off.", rank_above_5=True)

    @program(spec((1, 2, 2, 2, 128)))
    def ok(x):
        return mb.transpose(x=x, perm=[0, 2, 1, 3, 4], name="perm_rank5")

    save("r10_ok", ok, "R10 passes: a rank-5 transpose (`perm_rank5`).")


def r11():
    def seq(s):
        @program(spec((1, 8, 1, s)))
        def p(x):
            return mb.relu(x=x, name="relu")
        return p

    save("r11_break", seq(64), "sequence axis 64: every op (`relu`) off the ANE by R11; R11 fails.")
    save("r11_ok", seq(65), "sequence axis 65: R11 passes, `relu` on the ANE.")


def r13():
    @program(spec(X))
    def brk(x):
        return mb.cast(x=mb.relu(x=x, name="relu"), dtype="fp32", name="out_fp32")

    save("r13_break", brk, "R13 warns: output `out_fp32` is fp32 (the cast to an output is not an R5 placement).")

    @program(spec(X))
    def ok(x):
        return mb.relu(x=x, name="out_fp16")

    save("r13_ok", ok, "R13 passes: output `out_fp16` is fp16.")


def r14():
    rng = np.random.default_rng([0, 14])
    shape = (16, 8, 1, 1)

    def lut(bits):
        n = 2 ** bits
        return np.linspace(-0.5, 0.5, n).astype(np.float16).reshape(1, 1, 1, 1, n, 1)

    mask = np.zeros(shape, bool)
    mask[::2] = True

    @program(spec(X))
    def brk(x):
        w_pal3 = mb.constexpr_lut_to_dense(indices=rng.integers(0, 8, size=shape).astype(np_uint3_dtype),
                                           lut=lut(3), name="w_pal3")
        w_block = mb.constexpr_blockwise_shift_scale(data=rng.integers(-127, 128, size=shape).astype(np.int8),
                                                     scale=np.full((16, 2, 1, 1), 0.01, np.float16),
                                                     name="w_block")
        w_sparse = mb.constexpr_sparse_to_dense(nonzero_data=w16(rng, (int(mask.sum()),)),
                                                mask=mask.astype(np_uint1_dtype), name="w_sparse")
        return (mb.conv(x=x, weight=w_pal3, name="conv_pal3"), mb.conv(x=x, weight=w_block, name="conv_block"),
                mb.conv(x=x, weight=w_sparse, name="conv_sparse"))

    save("r14_break", brk, "Off the ANE by R14: `w_pal3` (a 3-bit palette of 8 entries), `w_block` "
         "(int8 with per-block scales [16, 2, 1, 1] for data [16, 8, 1, 1]), `w_sparse` "
         "(constexpr_sparse_to_dense, not a compression the ANE takes). The convs stay.")

    @program(spec(X))
    def ok(x):
        w_pal4 = mb.constexpr_lut_to_dense(indices=rng.integers(0, 16, size=shape).astype(np_uint4_dtype),
                                           lut=lut(4), name="w_pal4")
        w_chan = mb.constexpr_blockwise_shift_scale(data=rng.integers(-127, 128, size=shape).astype(np.int8),
                                                    scale=np.full((16, 1, 1, 1), 0.01, np.float16),
                                                    name="w_chan")
        return mb.conv(x=x, weight=w_pal4, name="conv_pal4"), mb.conv(x=x, weight=w_chan, name="conv_chan")

    save("r14_ok", ok, "R14 passes: a 4-bit palette (`w_pal4`) and int8 with per-channel scales "
         "[16, 1, 1, 1] (`w_chan`).")


def r16():
    def scores(q, k):
        """(B, S, S) attention scores from per-head (B, d, S) queries and keys, as in the tower."""
        return mb.matmul(x=q, y=k, transpose_x=True, name="scores")

    qk = (1, 8, 128)

    @program(spec(qk), spec(qk))
    def brk(q, k):
        s = scores(q, k)
        a = mb.softmax(x=s, axis=-1, name="probs_unmasked")
        m = mb.add(x=s, y=np.full((1, 1, 128), -1e4, np.float16), name="const_masked")
        b = mb.softmax(x=m, axis=-1, name="probs_const_mask")
        return a, b

    save("r16_break", brk, "R16 warns naming `probs_unmasked` (no add before it) and `probs_const_mask` "
         "(its mask is a constant, not from the host).")

    @program(spec(qk), spec(qk), spec((1, 1, 128)), spec((128, 128)))
    def ok(q, k, mask, mask2d):
        s = scores(q, k)
        a = mb.softmax(x=mb.add(x=s, y=mask, name="masked"), axis=-1, name="probs_masked")
        m = mb.expand_dims(x=mask2d, axes=[0], name="mask_3d")
        b = mb.softmax(x=mb.add(x=m, y=s, name="masked_2"), axis=-1, name="probs_masked_expanded")
        return a, b

    save("r16_ok", ok, "R16 passes: each softmax after an add of a host mask (directly, and through "
         "expand_dims, as the add's `x`).")


def r17():
    qkv = (1, 2, 128, 80)  # (B, heads, S, head dim 80 > 64)

    @program(spec(qkv))
    def brk(x):
        return mb.scaled_dot_product_attention(query=x, key=x, value=x, name="sdpa")

    save("r17_break", brk, "`sdpa` (iOS18 scaled_dot_product_attention): off the ANE by R17.")

    @program(spec(qkv))
    def ok(x):
        s = mb.matmul(x=x, y=x, transpose_y=True, name="scores")
        p = mb.softmax(x=s, axis=-1, name="probs")
        return mb.matmul(x=p, y=x, name="ctx")

    save("r17_ok", ok, "R17 passes: the same attention as matmul, softmax, matmul.")


# --------------------------------------------------------------------------
# README
# --------------------------------------------------------------------------


def write_readme():
    L = ["# Residency rule cases\n",
         "Generated by `python/golden/make_residency_cases.py` (`make golden-residency`, i.e. "
         "`.venv/bin/python python/golden/make_residency_cases.py` from the repository root; coremltools "
         f"{ct.__version__}, numpy {np.__version__}, python {sys.version.split()[0]}). Rerunning it deletes "
         "and rewrites everything under `golden/residency/`.\n",
         "One tiny ML program per case, `<case>/model.mlpackage`, for `tests/residency_rules.rs`, which runs "
         "the static residency checker (`src/gate/residency/`) on each: for every rule the checker applies, "
         "a program that breaks it (`r<N>_break*`) and a minimal counterpart that keeps it (`r<N>_ok`). R12 "
         "(weights per package) takes the package size as an argument and is tested with `r7_ok`'s real weight "
         "bytes and with sizes around the 2 GB limit.\n",
         "Built with coremltools' MIL builder and converted with an EMPTY pass pipeline and compute precision "
         "FLOAT32, so each saved program holds exactly the ops, names and dtypes the script writes (fp16 "
         "unless a case says otherwise). Ops are named by their first output, as the checker reports them. "
         "Every function has an input whose last axis is above 64, so R11 does not take over, except in "
         "`r11_break`. Core ML refuses tensors above rank 5 at conversion; `r6_break_rank` and `r10_break` "
         "are converted with that check switched off. Manifest item UUIDs are deterministic and model.mlmodel "
         "is re-serialised deterministically without the conversion date; packages without blobs have no "
         "weights/ directory.\n",
         "| case | inputs | ops (name: type, output dtype) | what the checker must say | bytes |",
         "|---|---|---|---|---|"]
    for name, c in CASES.items():
        ins = ", ".join(f"`{n}` {s}" for n, s in c["inputs"])
        ops = ", ".join(f"`{n}`: {t} {d}" for n, t, d in c["ops"] if t != "const")
        L.append(f"| `{name}` | {ins} | {ops} | {c['expect']} | {c['bytes']} |")
    L.append("")
    (OUT / "README.md").write_text("\n".join(L))


def main():
    if OUT.exists():
        shutil.rmtree(OUT)
    OUT.mkdir(parents=True)
    for make in (r1, r2, r3, r4, r5, r6, r7, r8, r10, r11, r13, r14, r16, r17):
        make()
    write_readme()
    total = sum(f.stat().st_size for f in OUT.rglob("*") if f.is_file())
    print(f"golden/residency: {len(CASES)} cases, {total} bytes", file=sys.stderr)
    assert total < 512 * 1024


if __name__ == "__main__":
    main()
