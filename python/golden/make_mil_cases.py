#!/usr/bin/env python3
"""Golden test data for the Rust interpreter of Core ML ML-program packages (golden/mil/).

Builds tiny ML programs with coremltools' MIL builder, converts and saves them as .mlpackage,
and writes for each case under golden/mil/<case>/:

  model.mlpackage/          the package as coremltools saved it (Manifest.json item identifiers
                            are rewritten to deterministic UUIDs, see `normalize_manifest`)
  inputs.safetensors        float32 inputs keyed by the program's input names
  expected.safetensors      float32 outputs keyed by output names, computed with numpy in float64
                            from the same weights the saved program holds
  expected_fp16.safetensors every floating-point value of the program (inputs, consts, op outputs)
                            as the interpreter's fp16 mode should produce it: numpy executes the
                            saved program op by op, each op's result correctly rounded to fp16 once
                            (see `fp16_reference`)
  case.json                 op types read back from the saved spec, compute precision, tolerances,
                            notes

coremltools cannot run predictions on Linux, so every expected output is a numpy reference.
Deterministic (numpy seed 0; per-case generators seeded with [0, crc32(case name)]).

Regenerate (from the repository root):

    .venv/bin/python python/golden/make_mil_cases.py
"""

from __future__ import annotations

import json
import math
import os
import shutil
import struct
import sys
import tempfile
import uuid
import zlib
from pathlib import Path

import numpy as np

os.environ.setdefault("TQDM_DISABLE", "1")

import coremltools as ct  # noqa: E402
import coremltools.optimize.coreml as cto  # noqa: E402
from coremltools.converters.mil import Builder as mb  # noqa: E402
from coremltools.proto import MIL_pb2  # noqa: E402

SEED = 0
ROOT = Path(__file__).resolve().parents[2]
OUT = ROOT / "golden" / "mil"
OPSET = ct.target.macOS15
WEIGHTS_REL = Path("Data") / "com.apple.CoreML" / "weights" / "weight.bin"
SPEC_REL = Path("Data") / "com.apple.CoreML" / "model.mlmodel"

FP32 = ct.precision.FLOAT32
FP16 = ct.precision.FLOAT16


# --------------------------------------------------------------------------
# small utilities
# --------------------------------------------------------------------------


def rng_for(case: str) -> np.random.Generator:
    return np.random.default_rng([SEED, zlib.crc32(case.encode())])


_ST_DTYPES = {np.dtype(np.float32): "F32", np.dtype(np.float16): "F16", np.dtype(np.int32): "I32",
              np.dtype(np.int64): "I64", np.dtype(np.uint8): "U8", np.dtype(np.int8): "I8"}


def save_safetensors(tensors: dict[str, np.ndarray], path: Path, metadata: dict[str, str] | None = None) -> None:
    """Byte-deterministic safetensors writer (keys sorted, header padded with spaces to a multiple
    of 8, little-endian tensors stored contiguously in key order): the same format as
    make_golden.py's writer, without needing torch/safetensors."""
    header: dict = {}
    if metadata:
        header["__metadata__"] = {k: str(metadata[k]) for k in sorted(metadata)}
    blobs, off = [], 0
    for k in sorted(tensors):
        a = np.ascontiguousarray(tensors[k]).reshape(np.shape(tensors[k]))  # keeps 0-d scalars 0-d
        a = a.astype(a.dtype.newbyteorder("<"), copy=False)
        b = a.tobytes()
        header[k] = {"dtype": _ST_DTYPES[np.dtype(a.dtype.name)], "shape": list(a.shape),
                     "data_offsets": [off, off + len(b)]}
        blobs.append(b)
        off += len(b)
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * (-len(h) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)))
        f.write(h)
        for b in blobs:
            f.write(b)


def f32(a) -> np.ndarray:
    return np.asarray(a, dtype=np.float64).astype(np.float32)


def fp16_exact(a: np.ndarray) -> np.ndarray:
    """float32 array whose values are exactly representable in fp16."""
    return np.asarray(a).astype(np.float16).astype(np.float32)


def normalize_manifest(pkg: Path, seed_name: str) -> None:
    """coremltools (libmodelpackage) names Manifest.json items with random UUIDs. Replace them with
    UUIDs derived from the case name and item path so reruns are byte-identical; everything else is
    kept, and the file is re-serialised exactly as coremltools writes it (indent 4, sorted keys,
    trailing newline; checked)."""
    path = pkg / "Manifest.json"
    text = path.read_text()
    m = json.loads(text)
    assert json.dumps(m, indent=4, sort_keys=True) + "\n" == text, "unexpected Manifest.json formatting"
    remap = {}
    for old, item in m["itemInfoEntries"].items():
        remap[old] = str(uuid.uuid5(uuid.NAMESPACE_URL, f"ane-export/golden/mil/{seed_name}/{item['path']}"))
    m["itemInfoEntries"] = {remap[k]: v for k, v in m["itemInfoEntries"].items()}
    m["rootModelIdentifier"] = remap[m["rootModelIdentifier"]]
    path.write_text(json.dumps(m, indent=4, sort_keys=True) + "\n")


DATE_KEY = "com.github.apple.coremltools.conversion_date"


def canonicalize_spec(pkg: Path) -> None:
    """coremltools serialises model.mlmodel with protobuf map entries (function map, op inputs and
    attributes) in an order that changes from process to process, and stamps the conversion date
    into description.metadata.userDefined. Drop that one metadata entry and re-serialise with
    deterministic=True (map entries sorted by key) so reruns are byte-identical. Otherwise the
    parsed message is unchanged (checked)."""
    from coremltools.proto import Model_pb2
    path = pkg / SPEC_REL
    raw = path.read_bytes()
    spec = Model_pb2.Model()
    spec.ParseFromString(raw)
    orig = Model_pb2.Model()
    orig.CopyFrom(spec)
    date = None
    if spec.description.HasField("metadata"):  # multifunction packages have no metadata
        date = spec.description.metadata.userDefined.pop(DATE_KEY, None)
    new = spec.SerializeToString(deterministic=True)
    check = Model_pb2.Model()
    check.ParseFromString(new)
    if date is not None:
        check.description.metadata.userDefined[DATE_KEY] = date
    assert check == orig
    path.write_bytes(new)


def convert_save(prog, pkg: Path, precision) -> ct.models.MLModel:
    model = ct.convert(prog, convert_to="mlprogram", minimum_deployment_target=OPSET,
                       compute_precision=precision, skip_model_load=True)
    save_model(model, pkg)
    return model


def save_model(model: ct.models.MLModel, pkg: Path) -> None:
    if pkg.exists():
        shutil.rmtree(pkg)
    model.save(str(pkg))
    normalize_manifest(pkg, pkg.parent.name)
    canonicalize_spec(pkg)


# --------------------------------------------------------------------------
# reading the saved package back (own reader: also checks the blob format facts in docs/formats.md)
# --------------------------------------------------------------------------

BLOB_DTYPES = {  # MILBlob::Blob::BlobDataType
    1: ("float16", 16), 2: ("float32", 32), 3: ("uint8", 8), 4: ("int8", 8), 5: ("bfloat16", 16),
    6: ("int16", 16), 7: ("uint16", 16), 8: ("int4", 4), 9: ("uint1", 1), 10: ("uint2", 2),
    11: ("uint4", 4), 12: ("uint3", 3), 13: ("uint6", 6), 14: ("int32", 32), 15: ("uint32", 32),
    16: ("float8e4m3fn", 8), 17: ("float8e5m2", 8),
}
_NP = {"float16": np.float16, "float32": np.float32, "uint8": np.uint8, "int8": np.int8,
       "int16": np.int16, "uint16": np.uint16, "int32": np.int32, "uint32": np.uint32}


def unpack_bits(raw: bytes, nbits: int, count: int, signed: bool) -> np.ndarray:
    """Sub-byte elements, packed LSB first (element 0 in the lowest bits of byte 0)."""
    bits = np.unpackbits(np.frombuffer(raw, np.uint8), bitorder="little")[: count * nbits]
    vals = bits.reshape(count, nbits).astype(np.int64) @ (1 << np.arange(nbits, dtype=np.int64))
    if signed:
        vals = np.where(vals >= 1 << (nbits - 1), vals - (1 << nbits), vals)
    return vals


def read_blob(weight_bin: Path, offset: int, shape: tuple[int, ...]) -> tuple[np.ndarray, dict]:
    """Read the blob whose 64-byte metadata record starts at `offset` (the blobFileValue offset)."""
    data = weight_bin.read_bytes()
    count, version = struct.unpack_from("<II", data, 0)
    assert version == 2, version
    assert data[8:64] == bytes(56), "non-zero reserved storage_header bytes"
    assert offset % 64 == 0
    sentinel, dtype_code, size, data_off, pad_bits = struct.unpack_from("<IIQQQ", data, offset)
    assert sentinel == 0xDEADBEEF, hex(sentinel)
    assert data_off == offset + 64, (offset, data_off)
    assert data_off % 64 == 0
    assert data[offset + 32: offset + 64] == bytes(32), "non-zero reserved blob_metadata bytes"
    name, nbits = BLOB_DTYPES[dtype_code]
    raw = data[data_off: data_off + size]
    n = int(np.prod(shape)) if shape else 1
    if name in _NP:
        arr = np.frombuffer(raw, _NP[name]).copy()
    elif nbits < 8:
        assert size * 8 - pad_bits == n * nbits, (size, pad_bits, n, nbits)
        arr = unpack_bits(raw, nbits, n, signed=name.startswith("int"))
        arr = arr.astype(np.int8 if name.startswith("int") else np.uint8)
    else:
        raise NotImplementedError(name)
    assert arr.size == n, (arr.size, n)
    meta = {"dtype_code": dtype_code, "dtype": name, "size_in_bytes": size, "data_offset": data_off,
            "padding_size_in_bits": pad_bits, "blob_count_in_file": count}
    return arr.reshape(shape), meta


_PROTO_NP = {"FLOAT16": np.float16, "FLOAT32": np.float32, "FLOAT64": np.float64, "INT8": np.int8,
             "UINT8": np.uint8, "INT16": np.int16, "UINT16": np.uint16, "INT32": np.int32,
             "INT64": np.int64, "UINT32": np.uint32, "BOOL": np.bool_}
_SUBBYTE = {"UINT1": (1, False), "UINT2": (2, False), "UINT3": (3, False), "UINT4": (4, False),
            "UINT6": (6, False), "INT4": (4, True)}


def tensor_shape(vt) -> tuple[int, ...]:
    return tuple(d.constant.size for d in vt.tensorType.dimensions)


def decode_value(value, pkg: Path) -> tuple[np.ndarray, str]:
    """numpy value of a MIL proto Value (immediate or blob file). Returns (array, storage kind)."""
    dt = MIL_pb2.DataType.Name(value.type.tensorType.dataType)
    shape = tensor_shape(value.type)
    if value.HasField("blobFileValue"):
        fn = value.blobFileValue.fileName
        assert fn.startswith("@model_path/"), fn
        arr, _ = read_blob(pkg / "Data" / "com.apple.CoreML" / fn[len("@model_path/"):],
                           value.blobFileValue.offset, shape)
        return arr, "blob"
    t = value.immediateValue.tensor
    kind = t.WhichOneof("value")
    if kind == "bytes":
        raw = t.bytes.values
        if dt in _SUBBYTE:
            nbits, signed = _SUBBYTE[dt]
            arr = unpack_bits(raw, nbits, int(np.prod(shape)) if shape else 1, signed)
        else:
            arr = np.frombuffer(raw, _PROTO_NP[dt])
    elif kind == "strings":
        return np.array(list(t.strings.values), dtype=object).reshape(shape), "immediate"
    else:
        arr = np.array(list(getattr(t, kind).values))
        if dt in _PROTO_NP:
            arr = arr.astype(_PROTO_NP[dt])
    return arr.reshape(shape), "immediate"


def iter_ops(block):
    for op in block.operations:
        yield op
        for b in op.blocks:
            yield from iter_ops(b)


def main_block(spec, fn: str):
    f = spec.mlProgram.functions[fn]
    return f.block_specializations[f.opset]


def const_values(spec, fn: str, pkg: Path) -> dict[str, np.ndarray]:
    """name -> value of every const op output of function `fn`."""
    out = {}
    for op in iter_ops(main_block(spec, fn)):
        if op.type == "const":
            out[op.outputs[0].name] = decode_value(op.attributes["val"], pkg)[0]
    return out


def op_inputs(op, consts: dict[str, np.ndarray], pkg: Path) -> dict[str, object]:
    """Input name -> const value (bound by name to a const op, or an inline value) or the var name."""
    res = {}
    for k, arg in sorted(op.inputs.items()):
        vals = []
        for b in arg.arguments:
            if b.WhichOneof("binding") == "value":
                vals.append(decode_value(b.value, pkg)[0])
            else:
                vals.append(consts.get(b.name, b.name))
        res[k] = vals[0] if len(vals) == 1 else vals
    return res


def describe_spec(spec, pkg: Path) -> dict:
    """Op types, per-type input/attribute names and const storage facts, read from the saved spec."""
    funcs = {}
    sigs: dict[str, dict[str, set]] = {}
    storage = {"blob": [], "immediate": []}
    for fn in sorted(spec.mlProgram.functions):
        seq = []
        for op in iter_ops(main_block(spec, fn)):
            seq.append(op.type)
            s = sigs.setdefault(op.type, {"inputs": set(), "attributes": set()})
            s["inputs"].update(op.inputs.keys())
            s["attributes"].update(op.attributes.keys())
            if op.type == "const":
                v = op.attributes["val"]
                _, kind = decode_value(v, pkg)
                storage[kind].append({"name": op.outputs[0].name,
                                      "dtype": MIL_pb2.DataType.Name(v.type.tensorType.dataType),
                                      "shape": list(tensor_shape(v.type)),
                                      **({"offset": v.blobFileValue.offset} if kind == "blob" else {})})
            for k, arg in sorted(op.inputs.items()):
                for b in arg.arguments:
                    if b.WhichOneof("binding") == "value":
                        _, kind = decode_value(b.value, pkg)
                        storage[kind].append({"name": f"{op.type}:{op.outputs[0].name}.{k} (inline binding)",
                                              "dtype": MIL_pb2.DataType.Name(b.value.type.tensorType.dataType),
                                              "shape": list(tensor_shape(b.value.type)),
                                              **({"offset": b.value.blobFileValue.offset} if kind == "blob" else {})})
        f = spec.mlProgram.functions[fn]
        funcs[fn] = {"opset": f.opset, "inputs": [i.name for i in f.inputs],
                     "outputs": list(main_block(spec, fn).outputs), "op_sequence": seq}
    all_types = sorted({t for f in funcs.values() for t in f["op_sequence"]})
    return {
        "ops": all_types,
        "functions": funcs,
        "op_params": {t: {"inputs": sorted(s["inputs"]), "attributes": sorted(s["attributes"])}
                      for t, s in sorted(sigs.items())},
        "const_storage": storage,
        "specification_version": spec.specificationVersion,
        "default_function_name": spec.description.defaultFunctionName,
    }


# --------------------------------------------------------------------------
# numpy references (float64)
# --------------------------------------------------------------------------

_erf = np.vectorize(math.erf, otypes=[np.float64])


def sigmoid(x):
    return 1.0 / (1.0 + np.exp(-x))


def gelu_exact(x):
    return 0.5 * x * (1.0 + _erf(x / math.sqrt(2.0)))


def gelu_tanh(x):
    return 0.5 * x * (1.0 + np.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x ** 3)))


def softmax(x, axis=-1):
    e = np.exp(x - x.max(axis=axis, keepdims=True))
    return e / e.sum(axis=axis, keepdims=True)


def layer_norm(x, axes, gamma, beta, eps):
    axes = tuple(axes)
    m = x.mean(axis=axes, keepdims=True)
    v = ((x - m) ** 2).mean(axis=axes, keepdims=True)
    return (x - m) / np.sqrt(v + eps) * gamma + beta


def conv2d(x, w, b=None, strides=(1, 1), pad=(0, 0, 0, 0), dilations=(1, 1), groups=1):
    """NCHW conv, w [O, C/groups, kh, kw]; pad = (top, bottom, left, right) like MIL's `pad`."""
    x = np.pad(x, ((0, 0), (0, 0), (pad[0], pad[1]), (pad[2], pad[3])))
    n, c, h, wd = x.shape
    o, cg, kh, kw = w.shape
    sh, sw = strides
    dh, dw = dilations
    oh = (h - dh * (kh - 1) - 1) // sh + 1
    ow = (wd - dw * (kw - 1) - 1) // sw + 1
    y = np.zeros((n, o, oh, ow), dtype=np.result_type(x, w))
    og = o // groups
    for g in range(groups):
        xg = x[:, g * cg:(g + 1) * cg]
        wg = w[g * og:(g + 1) * og]
        for i in range(kh):
            for j in range(kw):
                patch = xg[:, :, i * dh: i * dh + sh * (oh - 1) + 1: sh, j * dw: j * dw + sw * (ow - 1) + 1: sw]
                y[:, g * og:(g + 1) * og] += np.einsum("nchw,oc->nohw", patch, wg[:, :, i, j])
    if b is not None:
        y += np.asarray(b).reshape(1, -1, 1, 1)
    return y


def same_pad(k: int, d: int = 1, s: int = 1) -> tuple[int, int]:
    """MIL pad_type "same" for stride 1: total = d*(k-1), left = total // 2."""
    assert s == 1
    total = d * (k - 1)
    return total // 2, total - total // 2


# --------------------------------------------------------------------------
# op-by-op fp16 reference (expected_fp16.safetensors)
# --------------------------------------------------------------------------
#
# The interpreter's fp16 mode (src/interp/run.rs) emulates the Neural Engine's fp16 storage: each
# function input and each floating-point op output, consts included, is rounded to fp16; an op
# computes from its (fp16) operands and its output is rounded once. The reference below executes
# the saved program independently, with numpy, under the same rule, every op computed to at least
# float64 precision from its fp16 operands and rounded once, correctly (nearest, ties to even), to
# fp16. It is evaluated twice, in longdouble (64-bit significand; written out) and in float64, and
# the two must give the same fp16 bits everywhere: the fp16 result does not depend on the
# evaluation's own error, i.e. it is the correctly rounded value of each op on its fp16 operands.
# Without rounding, in float64, the same evaluator must reproduce the hand-written float64
# references of expected.safetensors, which checks its reading of every op.

_FLOAT_DTYPES = {"FLOAT16", "FLOAT32", "FLOAT64"}
_PI_LD = 4 * np.arctan(np.longdouble(1))


def round_fp16(a) -> np.ndarray:
    """Each value rounded to the nearest IEEE binary16 value (ties to even; beyond 65504 rounds to
    inf from 65520 on), as a value of a's own float dtype, with no intermediate rounding: the fp16
    quantum at |a| (2^(e-10) in binade 2^e, 2^-24 below 2^-14) is a power of two, so a / quantum
    is exact and np.rint rounds it to an integer ties-to-even."""
    a = np.asarray(a)
    finite = np.isfinite(a)
    v = np.where(finite, a, 0).astype(a.dtype)
    _, ex = np.frexp(v)
    e = np.maximum(ex.astype(np.int64) - 1, -14)
    q = np.ldexp(np.ones_like(v), e - 10)
    r = np.rint(v / q) * q
    r = np.where(np.abs(r) > 65504, np.copysign(np.inf, v), r)
    return np.where(finite, r, a).astype(a.dtype)


def _erf_any(x: np.ndarray) -> np.ndarray:
    """erf in x's dtype: math.erf for float64; for longdouble the series
    erf(x) = 2/sqrt(pi) exp(-x^2) sum_n 2^n x^(2n+1) / (1*3*...*(2n+1)), whose terms share x's sign
    (no cancellation), summed until a term is below 2^-70 of the sum."""
    if x.dtype == np.float64:
        return _erf(x)
    out = np.empty_like(x)
    for i, xi in np.ndenumerate(x):
        s = t = xi
        n = 0
        while abs(t) > abs(s) * np.longdouble(2.0) ** -70:
            n += 1
            t = t * 2 * xi * xi / (2 * n + 1)
            s += t
        out[i] = 2 / np.sqrt(_PI_LD) * np.exp(-xi * xi) * s
    return out


def _ints(v) -> list[int]:
    return [int(t) for t in np.asarray(v).reshape(-1)]


def _str(v) -> str:
    return str(np.asarray(v).reshape(-1)[0])


def _flag(a: dict, k: str, default: bool = False) -> bool:
    return bool(np.asarray(a[k]).reshape(-1)[0]) if k in a else default


def _axis(a: int, rank: int) -> int:
    assert -rank <= a < rank, (a, rank)
    return a % rank


def _op_conv(a, dt):
    x, w = a["x"], a["weight"]
    strides = _ints(a["strides"]) if "strides" in a else [1, 1]
    dil = _ints(a["dilations"]) if "dilations" in a else [1, 1]
    groups = _ints(a["groups"])[0] if "groups" in a else 1
    pad_type = _str(a["pad_type"]) if "pad_type" in a else "valid"
    if pad_type == "valid":
        pad = (0, 0, 0, 0)
    elif pad_type == "custom":
        pad = tuple(_ints(a["pad"]))
    elif pad_type in ("same", "same_lower"):
        # output size ceil(n / stride); the odd unit of padding goes last ("same") or first
        tot = [max((-(-n // s) - 1) * s + (k - 1) * d + 1 - n, 0)
               for n, k, s, d in zip(x.shape[2:], w.shape[2:], strides, dil)]
        lo = [t // 2 if pad_type == "same" else t - t // 2 for t in tot]
        pad = (lo[0], tot[0] - lo[0], lo[1], tot[1] - lo[1])
    else:
        raise NotImplementedError(pad_type)
    return [conv2d(x, w, a.get("bias"), strides=tuple(strides), pad=pad, dilations=tuple(dil), groups=groups)]


def _op_matmul(a, dt):
    x, y = a["x"], a["y"]
    if _flag(a, "transpose_x"):
        x = np.swapaxes(x, -1, -2)
    if _flag(a, "transpose_y"):
        y = np.swapaxes(y, -1, -2)
    return [np.matmul(x, y)]


def _op_linear(a, dt):
    y = np.matmul(a["x"], np.swapaxes(a["weight"], -1, -2))
    return [y + a["bias"] if "bias" in a else y]


def _op_softmax(a, dt):
    x = a["x"]
    ax = _ints(a["axis"])[0] if "axis" in a else -1
    e = np.exp(x - x.max(axis=ax, keepdims=True))
    return [e / e.sum(axis=ax, keepdims=True)]


def _op_layer_norm(a, dt):
    x = a["x"]
    axes = tuple(sorted(_axis(v, x.ndim) for v in _ints(a["axes"])))
    eps = a["epsilon"] if "epsilon" in a else dt(1e-5)
    pshape = [x.shape[i] if i in axes else 1 for i in range(x.ndim)]
    m = x.mean(axis=axes, keepdims=True)
    v = ((x - m) ** 2).mean(axis=axes, keepdims=True)
    y = (x - m) / np.sqrt(v + eps)
    if "gamma" in a:
        y = y * a["gamma"].reshape(pshape)
    if "beta" in a:
        y = y + a["beta"].reshape(pshape)
    return [y]


def _op_reduce(f):
    def op(a, dt):
        x = a["x"]
        axes = tuple(_axis(v, x.ndim) for v in _ints(a["axes"])) if "axes" in a else None
        return [f(x, axis=axes, keepdims=_flag(a, "keep_dims"))]
    return op


def _op_reshape(a, dt):
    x = a["x"]
    shape = [x.shape[i] if d == 0 else d for i, d in enumerate(_ints(a["shape"]))]
    return [x.reshape(shape)]


def _op_expand_dims(a, dt):
    x = a["x"]
    axes = _ints(a["axes"])
    r = x.ndim + len(axes)
    for ax in sorted(_axis(v, r) for v in axes):
        x = np.expand_dims(x, ax)
    return [x]


def _op_squeeze(a, dt):
    x = a["x"]
    axes = tuple(_axis(v, x.ndim) for v in _ints(a["axes"])) if "axes" in a else None
    return [np.squeeze(x, axis=axes)]


def _op_concat(a, dt):
    assert not _flag(a, "interleave")
    vals = a["values"]
    return [np.concatenate(vals, axis=_axis(_ints(a["axis"])[0], vals[0].ndim))]


def _op_split(a, dt):
    x = a["x"]
    ax = _axis(_ints(a["axis"])[0], x.ndim)
    if "split_sizes" in a:
        sizes = _ints(a["split_sizes"])
    else:
        n = _ints(a["num_splits"])[0]
        sizes = [x.shape[ax] // n] * n
    return np.split(x, np.cumsum(sizes)[:-1], axis=ax)


def _op_slice_by_index(a, dt):
    x = a["x"]
    r = x.ndim
    begin, end = _ints(a["begin"]), _ints(a["end"])
    stride = _ints(a["stride"]) if "stride" in a else [1] * r
    masks = {k: [bool(v) for v in _ints(a[k])] if k in a else [False] * r
             for k in ("begin_mask", "end_mask", "squeeze_mask")}
    idx = []
    for d in range(r):
        if masks["squeeze_mask"][d]:
            idx.append(begin[d])
        else:
            idx.append(slice(None if masks["begin_mask"][d] else begin[d],
                             None if masks["end_mask"][d] else end[d], stride[d]))
    return [x[tuple(idx)]]


def _op_cast(a, dt):
    assert _str(a["dtype"]) in ("fp16", "fp32"), _str(a["dtype"])
    return [a["x"]]


def _op_gelu(a, dt):
    x = a["x"]
    mode = _str(a["mode"]) if "mode" in a else "EXACT"
    if mode == "EXACT":
        return [dt(0.5) * x * (1 + _erf_any(x / np.sqrt(dt(2))))]
    if mode == "TANH_APPROXIMATION":
        return [dt(0.5) * x * (1 + np.tanh(np.sqrt(dt(2) / _PI_LD.astype(dt)) * (x + dt("0.044715") * x ** 3)))]
    raise NotImplementedError(mode)


def _op_blockwise_shift_scale(a, dt):
    data, scale = np.asarray(a["data"]).astype(dt), np.asarray(a["scale"]).astype(dt)

    def expand(p):
        for ax in range(data.ndim):
            p = p.repeat(data.shape[ax] // p.shape[ax], axis=ax)
        return p

    if "offset" in a:
        data = data - expand(np.asarray(a["offset"]).astype(dt))
    return [data * expand(scale)]


def _op_lut_to_dense(a, dt):
    idx, lut = np.asarray(a["indices"]).astype(np.int64), np.asarray(a["lut"]).astype(dt)
    assert lut.shape[-1] == 1 and all(s == 1 for s in lut.shape[:-2]), lut.shape
    return [lut.reshape(-1)[idx]]


def _unary(f):
    return lambda a, dt: [f(a["x"])]


def _binary(f):
    return lambda a, dt: [f(a["x"], a["y"])]


_REF_OPS = {
    "add": _binary(np.add), "sub": _binary(np.subtract), "mul": _binary(np.multiply),
    "real_div": _binary(np.divide), "maximum": _binary(np.maximum), "minimum": _binary(np.minimum),
    "pow": _binary(np.power),
    "abs": _unary(np.abs), "sqrt": _unary(np.sqrt), "exp": _unary(np.exp), "tanh": _unary(np.tanh),
    "relu": _unary(lambda x: np.maximum(x, 0)),
    "sigmoid": _unary(lambda x: 1 / (1 + np.exp(-x))),
    "silu": _unary(lambda x: x / (1 + np.exp(-x))),
    "rsqrt": lambda a, dt: [1 / np.sqrt(a["x"] + (a["epsilon"] if "epsilon" in a else dt(1e-12)))],
    "gelu": _op_gelu, "softmax": _op_softmax, "layer_norm": _op_layer_norm,
    "reduce_mean": _op_reduce(np.mean), "reduce_sum": _op_reduce(np.sum), "reduce_max": _op_reduce(np.max),
    "reshape": _op_reshape, "transpose": lambda a, dt: [np.transpose(a["x"], _ints(a["perm"]))],
    "expand_dims": _op_expand_dims, "squeeze": _op_squeeze, "concat": _op_concat, "split": _op_split,
    "slice_by_index": _op_slice_by_index, "cast": _op_cast,
    "conv": _op_conv, "matmul": _op_matmul, "linear": _op_linear,
    "constexpr_blockwise_shift_scale": _op_blockwise_shift_scale,
    "constexpr_lut_to_dense": _op_lut_to_dense,
}


def eval_program(spec, fn: str, pkg: Path, inputs: dict[str, np.ndarray], dt, fp16: bool) -> dict[str, np.ndarray]:
    """Execute function `fn` of the saved program with numpy in float type `dt` (np.float64 or
    np.longdouble), ops in saved order. fp16=True: each floating-point function input and op output
    (const ops included) is rounded to fp16; values bound inline to an op input (the constexpr
    ops' stored data) are operands, not op outputs, and are used as stored. Returns every
    floating-point value (inputs, const and op outputs) by name."""
    rnd = round_fp16 if fp16 else (lambda v: v)
    env: dict[str, object] = {}
    floats: dict[str, np.ndarray] = {}
    for i in spec.mlProgram.functions[fn].inputs:
        assert MIL_pb2.DataType.Name(i.type.tensorType.dataType) in _FLOAT_DTYPES
        env[i.name] = floats[i.name] = rnd(np.asarray(inputs[i.name]).astype(dt))

    def as_dt(v):
        return v.astype(dt) if v.dtype.kind == "f" else v

    for op in iter_ops(main_block(spec, fn)):
        if op.type == "const":
            outs = [as_dt(decode_value(op.attributes["val"], pkg)[0])]
        else:
            args = {}
            for k, arg in op.inputs.items():
                vals = [as_dt(decode_value(b.value, pkg)[0]) if b.WhichOneof("binding") == "value"
                        else env[b.name] for b in arg.arguments]
                args[k] = vals if k == "values" else vals[0]
            outs = _REF_OPS[op.type](args, dt)
        assert len(outs) == len(op.outputs), op.type
        for o, v in zip(op.outputs, outs):
            if MIL_pb2.DataType.Name(o.type.tensorType.dataType) in _FLOAT_DTYPES:
                v = rnd(np.asarray(v, dtype=dt))
                assert v.shape == tensor_shape(o.type), (op.type, o.name, v.shape)
                floats[o.name] = v
            env[o.name] = v
    return floats


def fp16_reference(case: str, spec, pkg: Path, inputs: dict[str, np.ndarray],
                   expected: dict[str, np.ndarray]) -> tuple[dict[str, np.ndarray], dict]:
    """The op-by-op fp16 reference of every function (keys `<name>`, or `<function>.<name>` in a
    multifunction package), after the checks described above; and facts for case.json."""
    multi = len(spec.mlProgram.functions) > 1
    out: dict[str, np.ndarray] = {}
    worst_vs_exact: dict[str, float] = {}
    for fn in sorted(spec.mlProgram.functions):
        key = (lambda n, fn=fn: f"{fn}.{n}") if multi else (lambda n: n)
        ins = {i.name: inputs[key(i.name)] for i in spec.mlProgram.functions[fn].inputs}
        outs = list(main_block(spec, fn).outputs)
        # the evaluator without rounding reproduces the hand-written float64 reference
        plain = eval_program(spec, fn, pkg, ins, np.float64, fp16=False)
        for n in outs:
            want = np.asarray(expected[key(n)], np.float64)
            assert np.allclose(plain[n], want, rtol=1e-9, atol=1e-12), (case, fn, n)
        ref = eval_program(spec, fn, pkg, ins, np.longdouble, fp16=True)
        again = eval_program(spec, fn, pkg, ins, np.float64, fp16=True)
        assert ref.keys() == again.keys()
        for n, v in ref.items():
            v64 = v.astype(np.float64)
            assert np.array_equal(v64, again[n], equal_nan=True), \
                f"{case} {fn} {n}: the fp16 result depends on the evaluation precision"
            # round_fp16 agrees with numpy's own float64 -> float16 conversion on float64 values
            assert np.array_equal(round_fp16(plain[n]), plain[n].astype(np.float16).astype(np.float64),
                                  equal_nan=True), (case, n)
            assert np.array_equal(v64, v64.astype(np.float16).astype(np.float64), equal_nan=True)
            assert np.all(np.isfinite(v64)), (case, fn, n)
            out[key(n)] = v64
        for n in outs:
            want = np.asarray(expected[key(n)], np.float64)
            worst_vs_exact[key(n)] = float(np.max(np.abs(out[key(n)] - want)))
    return out, {"max_abs_diff_expected_vs_expected_fp16": worst_vs_exact}


# --------------------------------------------------------------------------
# cases
# --------------------------------------------------------------------------

CASES: dict[str, dict] = {}
FP16_REFS: dict[str, dict[str, np.ndarray]] = {}
FP16_NOTE = ("op-by-op fp16 reference of every floating-point value (function inputs, const and op "
             "outputs, by name): each input and each op output rounded to fp16 (nearest, ties to "
             "even), every op computed exactly enough from its fp16 operands to round correctly "
             "(evaluated in longdouble and in float64 by numpy, same fp16 bits required), as the "
             "interpreter's fp16 mode rounds; values bound inline (constexpr data) are used as stored")


def write_case(case: str, pkg: Path, inputs: dict[str, np.ndarray], expected: dict[str, np.ndarray],
               precision: str, notes: str, extra: dict | None = None,
               extra_files: dict[str, dict[str, np.ndarray]] | None = None) -> dict:
    d = pkg.parent
    spec = ct.utils.load_spec(str(pkg))
    info = describe_spec(spec, pkg)
    # keys must match the saved program's inputs/outputs
    if len(info["functions"]) == 1:
        (fn, f), = info["functions"].items()
        want_in, want_out = set(f["inputs"]), set(f["outputs"])
    else:
        want_in = {f"{fn}.{n}" for fn, f in info["functions"].items() for n in f["inputs"]}
        want_out = {f"{fn}.{n}" for fn, f in info["functions"].items() for n in f["outputs"]}
    assert set(inputs) == want_in, (case, sorted(inputs), sorted(want_in))
    assert set(expected) == want_out, (case, sorted(expected), sorted(want_out))
    save_safetensors({k: f32(v) for k, v in inputs.items()}, d / "inputs.safetensors")
    save_safetensors({k: f32(v) for k, v in expected.items()}, d / "expected.safetensors")
    ref16, facts16 = fp16_reference(case, spec, pkg, inputs, expected)
    save_safetensors({k: f32(v) for k, v in ref16.items()}, d / "expected_fp16.safetensors")
    FP16_REFS[case] = ref16
    for name, t in (extra_files or {}).items():
        save_safetensors({k: f32(v) for k, v in t.items()}, d / name)
    wb = pkg / WEIGHTS_REL
    meta = {
        "case": case,
        "compute_precision": precision,
        "notes": notes,
        **info,
        "inputs": {k: list(np.shape(v)) for k, v in sorted(inputs.items())},
        "outputs": {k: list(np.shape(v)) for k, v in sorted(expected.items())},
        "weight_bin_bytes": wb.stat().st_size if wb.exists() else 0,
        "expected_fp16": FP16_NOTE,
        **facts16,
        **(extra or {}),
    }
    (d / "case.json").write_text(json.dumps(meta, indent=2, sort_keys=False) + "\n")
    CASES[case] = meta
    return meta


def case_elementwise(d: Path):
    rng = rng_for("elementwise")
    shape = (2, 3, 4)
    x = f32(rng.normal(size=shape))
    y = f32(rng.choice([-1.0, 1.0], size=shape) * rng.uniform(0.5, 2.0, size=shape))  # |y| >= 0.5

    @mb.program(input_specs=[mb.TensorSpec(shape=shape), mb.TensorSpec(shape=shape)], opset_version=OPSET)
    def prog(x, y):
        pos = mb.add(x=mb.abs(x=x, name="abs_x"), y=np.float32(0.5), name="pos")
        return (
            mb.add(x=x, y=y, name="add"),
            mb.sub(x=x, y=y, name="sub"),
            mb.mul(x=x, y=y, name="mul"),
            mb.real_div(x=x, y=y, name="real_div"),
            mb.maximum(x=x, y=y, name="maximum"),
            mb.minimum(x=x, y=y, name="minimum"),
            mb.pow(x=pos, y=y, name="pow"),
            mb.sqrt(x=pos, name="sqrt"),
            mb.rsqrt(x=pos, name="rsqrt"),
            mb.exp(x=x, name="exp"),
            mb.tanh(x=x, name="tanh"),
            mb.sigmoid(x=x, name="sigmoid"),
            mb.relu(x=x, name="relu"),
            mb.silu(x=x, name="silu"),
            mb.gelu(x=x, mode="EXACT", name="gelu_exact"),
            mb.gelu(x=x, mode="TANH_APPROXIMATION", name="gelu_tanh"),
        )

    pkg = d / "model.mlpackage"
    convert_save(prog, pkg, FP32)
    X, Y = x.astype(np.float64), y.astype(np.float64)
    P = np.abs(X) + 0.5
    exp = {
        "add": X + Y, "sub": X - Y, "mul": X * Y, "real_div": X / Y,
        "maximum": np.maximum(X, Y), "minimum": np.minimum(X, Y),
        "pow": P ** Y, "sqrt": np.sqrt(P), "rsqrt": 1.0 / np.sqrt(P + 1e-12),
        "exp": np.exp(X), "tanh": np.tanh(X), "sigmoid": sigmoid(X), "relu": np.maximum(X, 0.0),
        "silu": X * sigmoid(X), "gelu_exact": gelu_exact(X), "gelu_tanh": gelu_tanh(X),
    }
    write_case("elementwise", pkg, {"x": x, "y": y}, exp, "fp32",
               "Binary and unary elementwise ops, one named output each. pow/sqrt/rsqrt take "
               "pos = abs(x) + 0.5 (computed in the program); |y| >= 0.5. rsqrt has MIL's default "
               "epsilon 1e-12: rsqrt(x) = 1/sqrt(x + epsilon). gelu EXACT = 0.5x(1+erf(x/sqrt2)), "
               "TANH_APPROXIMATION = 0.5x(1+tanh(sqrt(2/pi)(x+0.044715x^3))). No const has >= 10 "
               "elements, so nothing goes to the blob file: coremltools then writes NO weight.bin, only an "
               "empty Data/com.apple.CoreML/weights/ directory (still listed in Manifest.json), which git "
               "does not keep, so a checkout has no weights/ directory at all.",
               extra={"tolerance": {"abs": 1e-5, "rel": 1e-5}})


def case_reductions(d: Path):
    rng = rng_for("reductions")
    shape = (2, 3, 5)
    x = f32(rng.normal(size=shape) * 2.0)
    gamma = f32(rng.uniform(0.5, 1.5, size=5))
    beta = f32(rng.normal(size=5) * 0.1)

    @mb.program(input_specs=[mb.TensorSpec(shape=shape)], opset_version=OPSET)
    def prog(x):
        return (
            mb.reduce_mean(x=x, axes=[-1], keep_dims=True, name="reduce_mean_keep"),
            mb.reduce_mean(x=x, axes=[-1], keep_dims=False, name="reduce_mean"),
            mb.reduce_sum(x=x, axes=[-1], keep_dims=True, name="reduce_sum_keep"),
            mb.reduce_sum(x=x, axes=[-1], keep_dims=False, name="reduce_sum"),
            mb.reduce_max(x=x, axes=[-1], keep_dims=True, name="reduce_max_keep"),
            mb.reduce_max(x=x, axes=[-1], keep_dims=False, name="reduce_max"),
            mb.softmax(x=x, axis=-1, name="softmax"),
            mb.layer_norm(x=x, axes=[-1], gamma=gamma, beta=beta, epsilon=1e-5, name="layer_norm"),
        )

    pkg = d / "model.mlpackage"
    convert_save(prog, pkg, FP32)
    X = x.astype(np.float64)
    exp = {
        "reduce_mean_keep": X.mean(-1, keepdims=True), "reduce_mean": X.mean(-1),
        "reduce_sum_keep": X.sum(-1, keepdims=True), "reduce_sum": X.sum(-1),
        "reduce_max_keep": X.max(-1, keepdims=True), "reduce_max": X.max(-1),
        "softmax": softmax(X, -1),
        "layer_norm": layer_norm(X, [-1], gamma.astype(np.float64), beta.astype(np.float64), 1e-5),
    }
    write_case("reductions", pkg, {"x": x}, exp, "fp32",
               "Reductions over axes [-1] with keep_dims true (`*_keep`) and false, softmax axis -1, "
               "layer_norm over axes [-1]: (x - mean) / sqrt(var + epsilon) * gamma + beta with the "
               "population variance, epsilon 1e-5. gamma/beta have 5 elements (< 10), so they are "
               "inline immediate values, not blobs; as in `elementwise` there is no weight.bin (empty "
               "weights/ directory, absent from a git checkout).",
               extra={"tolerance": {"abs": 1e-5, "rel": 1e-5}})


def case_shapes(d: Path):
    rng = rng_for("shapes")
    shape = (2, 6, 1, 4)
    x = f32(rng.normal(size=shape))
    w = f32(rng.normal(size=(4, 3)) * 0.5)    # 12 elements -> blob
    wt = f32(rng.normal(size=(3, 4)) * 0.5)   # used with transpose_y=True

    @mb.program(input_specs=[mb.TensorSpec(shape=shape)], opset_version=OPSET)
    def prog(x):
        r = mb.reshape(x=x, shape=[2, 6, 4], name="x3")
        s0, s1 = mb.split(x=x, num_splits=2, axis=1, name="split")
        return (
            mb.reshape(x=x, shape=[12, 4], name="reshape"),
            mb.transpose(x=x, perm=[0, 3, 1, 2], name="transpose"),
            mb.expand_dims(x=x, axes=[1], name="expand_dims"),
            mb.squeeze(x=x, axes=[2], name="squeeze"),
            mb.concat(values=[x, x], axis=1, name="concat"),
            s0, s1,
            mb.slice_by_index(x=x, begin=[0, 1, 0, 1], end=[2, 6, 1, 4], stride=[1, 2, 1, 2], name="slice_by_index"),
            mb.matmul(x=r, y=w, transpose_x=False, transpose_y=False, name="matmul"),
            mb.matmul(x=r, y=wt, transpose_x=False, transpose_y=True, name="matmul_ty"),
        )

    pkg = d / "model.mlpackage"
    convert_save(prog, pkg, FP32)
    spec = ct.utils.load_spec(str(pkg))
    out_names = list(main_block(spec, "main").outputs)
    X = x.astype(np.float64)
    R = X.reshape(2, 6, 4)
    sp = np.split(X, 2, axis=1)
    exp = {
        "reshape": X.reshape(12, 4), "transpose": X.transpose(0, 3, 1, 2),
        "expand_dims": X[:, None], "squeeze": X[:, :, 0, :], "concat": np.concatenate([X, X], 1),
        out_names[5]: sp[0], out_names[6]: sp[1],
        "slice_by_index": X[0:2:1, 1:6:2, 0:1:1, 1:4:2],
        "matmul": R @ w.astype(np.float64), "matmul_ty": R @ wt.astype(np.float64).T,
    }
    write_case("shapes", pkg, {"x": x}, exp, "fp32",
               "Shape ops on x [2,6,1,4]. `split` (num_splits 2, axis 1) has two outputs named "
               f"{out_names[5]!r} and {out_names[6]!r}. slice_by_index begin [0,1,0,1] end [2,6,1,4] "
               "stride [1,2,1,2] (= x[0:2, 1:6:2, 0:1, 1:4:2]). matmul: reshape(x,[2,6,4]) @ W[4,3]; "
               "matmul_ty: reshape(x,[2,6,4]) @ W2[3,4]^T (transpose_y true). Both const-weight matmuls stay "
               "`matmul` after conversion (not rewritten to `linear`); W [4,3] and W2 [3,4] have 12 "
               "elements each and are weight.bin blobs. The saved op order differs from the build order "
               "(e.g. transpose is last); execute in saved order.",
               extra={"tolerance": {"abs": 1e-5, "rel": 1e-5}})


def case_conv(d: Path):
    rng = rng_for("conv")
    x = f32(rng.normal(size=(1, 8, 1, 16)))
    x2 = f32(rng.normal(size=(16, 8)))
    w1 = f32(rng.normal(size=(12, 8, 1, 1)) * 0.3)
    b1 = f32(rng.normal(size=12) * 0.1)
    w3 = f32(rng.normal(size=(4, 8, 1, 3)) * 0.3)
    b3 = f32(rng.normal(size=4) * 0.1)
    w3v = f32(rng.normal(size=(4, 8, 1, 3)) * 0.3)
    wl = f32(rng.normal(size=(5, 8)) * 0.3)
    bl = f32(rng.normal(size=5) * 0.1)

    @mb.program(input_specs=[mb.TensorSpec(shape=(1, 8, 1, 16)), mb.TensorSpec(shape=(16, 8))],
                opset_version=OPSET)
    def prog(x, x2):
        return (
            mb.conv(x=x, weight=w1, bias=b1, name="conv1x1"),
            mb.conv(x=x, weight=w3, bias=b3, pad_type="same", strides=[1, 1], dilations=[1, 1], groups=1,
                    name="conv_same"),
            mb.conv(x=x, weight=w3v, pad_type="valid", strides=[1, 1], dilations=[1, 1], groups=1,
                    name="conv_valid"),
            mb.linear(x=x2, weight=wl, bias=bl, name="linear"),
        )

    pkg = d / "model.mlpackage"
    convert_save(prog, pkg, FP32)
    X = x.astype(np.float64)
    pl, pr = same_pad(3)
    exp = {
        "conv1x1": conv2d(X, w1.astype(np.float64), b1),
        "conv_same": conv2d(X, w3.astype(np.float64), b3, pad=(0, 0, pl, pr)),
        "conv_valid": conv2d(X, w3v.astype(np.float64)),
        "linear": x2.astype(np.float64) @ wl.astype(np.float64).T + bl,
    }
    write_case("conv", pkg, {"x": x, "x2": x2}, exp, "fp32",
               "conv in the ANE (B,C,1,S) layout: 1x1 conv with bias [12]; kernel (1,3) with "
               "pad_type 'same' (pads 1 left / 1 right along S; bias [4]) and 'valid' (no bias, output "
               "length 14); strides [1,1], dilations [1,1], groups 1. linear: x2 [16,8] @ W[5,8]^T + b[5]. "
               "Weights [12,8,1,1] (96), [4,8,1,3] (96 each), [12] and [5,8] (40) are blobs; bias [4] and "
               "[5] are inline.",
               extra={"tolerance": {"abs": 1e-5, "rel": 1e-5}})


def case_attention(d: Path):
    rng = rng_for("attention_block")
    C, S, H = 16, 8, 2
    Dh = C // H
    x = f32(rng.normal(size=(1, C, 1, S)))
    mask = np.where(np.tril(np.ones((S, S))) > 0, 0.0, -1e4)[None].astype(np.float32)  # causal
    ws = {k: f32(rng.normal(size=(C, C, 1, 1)) / math.sqrt(C)) for k in "qkvo"}
    bs = {k: f32(rng.normal(size=C) * 0.05) for k in "qkvo"}
    scale = np.float32(1.0 / math.sqrt(Dh))

    @mb.program(input_specs=[mb.TensorSpec(shape=(1, C, 1, S)), mb.TensorSpec(shape=(1, S, S))],
                opset_version=OPSET)
    def prog(x, mask):
        q = mb.conv(x=x, weight=ws["q"], bias=bs["q"], name="q")
        k = mb.conv(x=x, weight=ws["k"], bias=bs["k"], name="k")
        v = mb.conv(x=x, weight=ws["v"], bias=bs["v"], name="v")
        heads = []
        for h in range(H):
            def sl(t, n, h=h):
                s = mb.slice_by_index(x=t, begin=[0, h * Dh, 0, 0], end=[1, (h + 1) * Dh, 1, S],
                                      name=f"{n}{h}_slice")
                return mb.reshape(x=s, shape=[1, Dh, S], name=f"{n}{h}")  # [1, d, s]
            qh, kh, vh = sl(q, "q"), sl(k, "k"), sl(v, "v")
            qt = mb.transpose(x=qh, perm=[0, 2, 1], name=f"q{h}_t")  # [1, s, d]
            sc = mb.matmul(x=qt, y=kh, name=f"scores{h}")  # [1, s_q, s_k]
            sc = mb.mul(x=sc, y=scale, name=f"scaled{h}")
            sc = mb.add(x=sc, y=mask, name=f"masked{h}")
            p = mb.softmax(x=sc, axis=-1, name=f"probs{h}")
            o = mb.matmul(x=vh, y=p, transpose_y=True, name=f"ctx{h}")  # [1, d, s_q]
            heads.append(mb.reshape(x=o, shape=[1, Dh, 1, S], name=f"ctx{h}_4d"))
        cat = mb.concat(values=heads, axis=1, name="heads")
        return mb.conv(x=cat, weight=ws["o"], bias=bs["o"], name="out")

    pkg = d / "model.mlpackage"
    convert_save(prog, pkg, FP32)
    X = x.astype(np.float64)
    W = {k: ws[k].astype(np.float64) for k in ws}
    Q, K, V = (conv2d(X, W[n], bs[n]) for n in "qkv")
    outs = []
    for h in range(H):
        qh = Q[:, h * Dh:(h + 1) * Dh, 0, :]  # [1, d, s]
        kh = K[:, h * Dh:(h + 1) * Dh, 0, :]
        vh = V[:, h * Dh:(h + 1) * Dh, 0, :]
        sc = qh.transpose(0, 2, 1) @ kh * float(scale) + mask.astype(np.float64)
        p = softmax(sc, -1)
        outs.append((vh @ p.transpose(0, 2, 1))[:, :, None, :])
    out = conv2d(np.concatenate(outs, 1), W["o"], bs["o"])
    write_case("attention_block", pkg, {"x": x, "mask": mask}, {"out": out}, "fp32",
               "Miniature ANE-layout attention, x [1,16,1,8] (B,C,1,S), 2 heads of 8: 1x1 convs q/k/v "
               "(with bias), per head slice_by_index on channels -> reshape [1,8,8] (d,s) -> "
               "scores = transpose(q,[0,2,1]) @ k -> mul by 1/sqrt(8) -> add mask [1,8,8] (causal, 0 "
               "or -1e4) -> softmax(-1) -> ctx = v @ probs^T (matmul transpose_y) -> reshape [1,8,1,8]; "
               "concat heads on channels; output 1x1 conv. The converter folded each transpose into the "
               "following matmul: the saved program has matmul(x=q_h, y=k_h, transpose_x=true, "
               "transpose_y=false) and no transpose op.",
               extra={"tolerance": {"abs": 1e-5, "rel": 1e-5}})


def _block_params(rng: np.random.Generator, C: int) -> dict:
    """A padded block's weights: 1x1 convs q, k, v, o [C, C, 1, 1] with
    biases, the layer norm's gamma and beta (drawn in this order)."""
    ws = {k: f32(rng.normal(size=(C, C, 1, 1)) / math.sqrt(C)) for k in "qkvo"}
    bs = {k: f32(rng.normal(size=C) * 0.05) for k in "qkvo"}
    gamma, beta = f32(1.0 + 0.1 * rng.normal(size=C)), f32(0.1 * rng.normal(size=C))
    return {"w": ws, "b": bs, "gamma": gamma, "beta": beta}


def _mil_qkv(x, p):
    """layer_norm over channels, then the q, k, v 1x1 convs (MIL)."""
    n = mb.layer_norm(x=x, axes=[1], gamma=p["gamma"], beta=p["beta"], epsilon=1e-5, name="norm")
    return [mb.conv(x=n, weight=p["w"][k], bias=p["b"][k], name=k) for k in "qkv"]


def _mil_out(x, heads, p):
    """The heads concatenated on channels, the output conv, the residual add, GELU (MIL)."""
    cat = mb.concat(values=heads, axis=1, name="heads")
    o = mb.conv(x=cat, weight=p["w"]["o"], bias=p["b"]["o"], name="proj")
    r = mb.add(x=x, y=o, name="res")
    return mb.gelu(x=r, mode="EXACT", name="out")


def _np_qkv(X, p):
    """_mil_qkv in float64."""
    C = X.shape[1]
    N = layer_norm(X, [1], p["gamma"].astype(np.float64).reshape(1, C, 1, 1),
                   p["beta"].astype(np.float64).reshape(1, C, 1, 1), 1e-5)
    return [conv2d(N, p["w"][n].astype(np.float64), p["b"][n]) for n in "qkv"]


def _np_out(X, heads, p):
    """_mil_out in float64."""
    return gelu_exact(X + conv2d(np.concatenate(heads, 1), p["w"]["o"].astype(np.float64), p["b"]["o"]))


def case_padded_attention(d: Path):
    """A padded bucket in miniature, as the towers' programs run one: 40
    real columns of 128, the 88 pad columns equal (zero input), pad rows of
    the mask attending to themselves alone; layer norm over channels, 1x1
    convs, per-head attention in query chunks of 64 against all keys (q
    sliced on the sequence axis, the chunks' contexts concatenated on it),
    GELU. Heads of 16 channels (whole AVX-512 registers) and a sequence of
    128 (whole groups of 64 columns): the interpreter carries the pad
    columns packed through every op here (`packed.rs`)."""
    rng = rng_for("padded_attention")
    C, S, H, R, QC = 32, 128, 2, 40, 64
    Dh = C // H
    x = np.zeros((1, C, 1, S), np.float32)
    x[..., :R] = f32(rng.normal(size=(1, C, 1, R)))
    mask = np.full((1, S, S), -1e4, np.float32)
    mask[0, :R, :R] = 0.0
    for j in range(R, S):
        mask[0, j, j] = 0.0
    prm = _block_params(rng, C)
    scale = np.float32(1.0 / math.sqrt(Dh))

    @mb.program(input_specs=[mb.TensorSpec(shape=(1, C, 1, S)), mb.TensorSpec(shape=(1, S, S))],
                opset_version=OPSET)
    def prog(x, mask):
        q, k, v = _mil_qkv(x, prm)
        masks = [mb.slice_by_index(x=mask, begin=[0, c, 0], end=[1, c + QC, S], name=f"mask_q{c}")
                 for c in range(0, S, QC)]
        heads = []
        for h in range(H):
            def sl(t, n, h=h):
                s = mb.slice_by_index(x=t, begin=[0, h * Dh, 0, 0], end=[1, (h + 1) * Dh, 1, S],
                                      name=f"{n}{h}_slice")
                return mb.reshape(x=s, shape=[1, Dh, S], name=f"{n}{h}")
            qh, kh, vh = sl(q, "q"), sl(k, "k"), sl(v, "v")
            ctx = []
            for i, c in enumerate(range(0, S, QC)):
                t = f"h{h}_q{c}"
                qc = mb.slice_by_index(x=qh, begin=[0, 0, c], end=[1, Dh, c + QC], name=f"{t}_q")
                sc = mb.matmul(x=qc, y=kh, transpose_x=True, name=f"{t}_scores")
                sc = mb.mul(x=sc, y=scale, name=f"{t}_scaled")
                sc = mb.add(x=sc, y=masks[i], name=f"{t}_masked")
                p = mb.softmax(x=sc, axis=-1, name=f"{t}_probs")
                ctx.append(mb.matmul(x=vh, y=p, transpose_y=True, name=f"{t}_ctx"))
            o = mb.concat(values=ctx, axis=2, name=f"h{h}_ctx")
            heads.append(mb.reshape(x=o, shape=[1, Dh, 1, S], name=f"h{h}_out"))
        return _mil_out(x, heads, prm)

    pkg = d / "model.mlpackage"
    convert_save(prog, pkg, FP32)
    X = x.astype(np.float64)
    Q, K, V = _np_qkv(X, prm)
    outs = []
    for h in range(H):
        qh = Q[:, h * Dh:(h + 1) * Dh, 0, :]
        kh = K[:, h * Dh:(h + 1) * Dh, 0, :]
        vh = V[:, h * Dh:(h + 1) * Dh, 0, :]
        sc = qh.transpose(0, 2, 1) @ kh * float(scale) + mask.astype(np.float64)
        p = softmax(sc, -1)
        outs.append((vh @ p.transpose(0, 2, 1))[:, :, None, :])
    out = _np_out(X, outs, prm)
    write_case("padded_attention", pkg, {"x": x, "mask": mask}, {"out": out}, "fp32",
               "A padded bucket in miniature: x [1,32,1,128] (B,C,1,S) with 40 real columns and 88 "
               "equal pad columns (zero), mask [1,128,128] 0 among the real columns and on the pad "
               "diagonal, -1e4 elsewhere. layer_norm over channels, 1x1 convs q/k/v, 2 heads of 16 in "
               "query chunks of 64 (q and the mask's rows sliced, contexts concatenated on the "
               "sequence axis), output 1x1 conv, residual add, GELU (exact).",
               extra={"tolerance": {"abs": 1e-5, "rel": 1e-5}})


def case_padded_windows(d: Path):
    """Window attention over a padded bucket in miniature, as Qwen2.5-VL's
    windowed blocks run it (`vit._window_head`): 4 windows of 32 slots, 20
    real slots in window 0 and the rest pad (zero input), each pad slot
    attending to itself alone. Per head the sequence is reshaped to
    [hd, windows, slots] and transposed to [windows, hd, slots], attends
    within each window (one batched matmul, the window mask added), and goes
    back to [1, hd, 1, S]. Heads of 20 channels (a last AVX-512 register
    partly used). The interpreter carries the pad columns packed into the
    window split, packs the heads' contexts again once their columns are
    checked to repeat, and computes the three equal pad windows once."""
    rng = rng_for("padded_windows")
    C, H, W, SL, R = 40, 2, 4, 32, 20
    S, Dh = W * SL, C // H
    x = np.zeros((1, C, 1, S), np.float32)
    x[..., :R] = f32(rng.normal(size=(1, C, 1, R)))
    wmask = np.full((W, SL, SL), -1e4, np.float32)
    wmask[0, :R, :R] = 0.0
    for w in range(W):
        for j in range(R if w == 0 else 0, SL):
            wmask[w, j, j] = 0.0
    prm = _block_params(rng, C)
    scale = np.float32(1.0 / math.sqrt(Dh))

    @mb.program(input_specs=[mb.TensorSpec(shape=(1, C, 1, S)), mb.TensorSpec(shape=(W, SL, SL))],
                opset_version=OPSET)
    def prog(x, window_mask):
        q, k, v = _mil_qkv(x, prm)
        heads = []
        for h in range(H):
            def split(t, n, h=h):
                s = mb.slice_by_index(x=t, begin=[0, h * Dh, 0, 0], end=[1, (h + 1) * Dh, 1, S],
                                      name=f"{n}{h}_slice")
                s = mb.reshape(x=s, shape=[Dh, W, SL], name=f"{n}{h}_w")
                return mb.transpose(x=s, perm=[1, 0, 2], name=f"{n}{h}_wt")
            qh, kh, vh = split(q, "q"), split(k, "k"), split(v, "v")
            sc = mb.matmul(x=qh, y=kh, transpose_x=True, name=f"h{h}_scores")
            sc = mb.mul(x=sc, y=scale, name=f"h{h}_scaled")
            sc = mb.add(x=sc, y=window_mask, name=f"h{h}_masked")
            p = mb.softmax(x=sc, axis=-1, name=f"h{h}_probs")
            o = mb.matmul(x=vh, y=p, transpose_y=True, name=f"h{h}_ctx")
            o = mb.transpose(x=o, perm=[1, 0, 2], name=f"h{h}_ctx_t")
            heads.append(mb.reshape(x=o, shape=[1, Dh, 1, S], name=f"h{h}_out"))
        return _mil_out(x, heads, prm)

    pkg = d / "model.mlpackage"
    convert_save(prog, pkg, FP32)
    X = x.astype(np.float64)
    Q, K, V = _np_qkv(X, prm)
    outs = []
    for h in range(H):
        def win(t, h=h):
            return t[0, h * Dh:(h + 1) * Dh, 0, :].reshape(Dh, W, SL).transpose(1, 0, 2)
        qh, kh, vh = win(Q), win(K), win(V)
        sc = qh.transpose(0, 2, 1) @ kh * float(scale) + wmask.astype(np.float64)
        p = softmax(sc, -1)
        o = (vh @ p.transpose(0, 2, 1)).transpose(1, 0, 2).reshape(1, Dh, 1, S)
        outs.append(o)
    out = _np_out(X, outs, prm)
    write_case("padded_windows", pkg, {"x": x, "window_mask": wmask}, {"out": out}, "fp32",
               "Window attention over a padded bucket in miniature: x [1,40,1,128] (B,C,1,S), 4 windows "
               "of 32 slots, 20 real slots in window 0 and 108 equal pad slots (zero); window_mask "
               "[4,32,32] 0 among window 0's real slots and on every pad slot's diagonal, -1e4 elsewhere. "
               "layer_norm over channels, 1x1 convs q/k/v, 2 heads of 20, each reshaped to [20,4,32] and "
               "transposed to [4,20,32] (windows as the batch), attention within each window, transposed "
               "and reshaped back to [1,20,1,128]; output 1x1 conv, residual add, GELU (exact).",
               extra={"tolerance": {"abs": 1e-5, "rel": 1e-5}})


def case_fp16(d: Path):
    rng = rng_for("fp16_elementwise")
    shape = (2, 3, 16)
    # inputs and weights exactly representable in fp16, so the input casts and fp16 weight storage
    # are lossless and the only difference from the float64 reference is fp16 arithmetic.
    x = fp16_exact(rng.normal(size=shape))
    y = fp16_exact(rng.normal(size=shape))
    gamma = fp16_exact(rng.uniform(0.5, 1.5, size=16))
    beta = fp16_exact(rng.normal(size=16) * 0.1)

    @mb.program(input_specs=[mb.TensorSpec(shape=shape), mb.TensorSpec(shape=shape)], opset_version=OPSET)
    def prog(x, y):
        return (
            mb.add(x=x, y=y, name="add"),
            mb.mul(x=x, y=y, name="mul"),
            mb.exp(x=x, name="exp"),
            mb.layer_norm(x=x, axes=[-1], gamma=gamma, beta=beta, epsilon=1e-5, name="layer_norm"),
        )

    pkg = d / "model.mlpackage"
    convert_save(prog, pkg, FP16)
    spec = ct.utils.load_spec(str(pkg))
    consts = const_values(spec, "main", pkg)
    # the stored fp16 gamma/beta must equal ours exactly
    ln = next(op for op in iter_ops(main_block(spec, "main")) if op.type == "layer_norm")
    ins = op_inputs(ln, consts, pkg)
    assert ins["gamma"].dtype == np.float16 and np.array_equal(ins["gamma"].astype(np.float32), gamma)
    assert ins["beta"].dtype == np.float16 and np.array_equal(ins["beta"].astype(np.float32), beta)
    eps = float(ins["epsilon"])  # stored as an fp16 scalar: 1e-5 -> 1.0013580322265625e-05
    assert ins["epsilon"].dtype == np.float16, ins["epsilon"].dtype
    X, Y = x.astype(np.float64), y.astype(np.float64)
    G, B = gamma.astype(np.float64), beta.astype(np.float64)
    exp = {"add": X + Y, "mul": X * Y, "exp": np.exp(X), "layer_norm": layer_norm(X, [-1], G, B, eps)}
    # op-by-op fp16 reference: each op computed exactly from its fp16 operands, result rounded to fp16
    r16 = lambda a: np.asarray(a).astype(np.float16).astype(np.float64)  # noqa: E731
    exp16 = {k: r16(v) for k, v in exp.items()}
    errs = {k: float(np.max(np.abs(exp[k] - exp16[k]))) for k in exp}
    meta = write_case("fp16_elementwise", pkg, {"x": x, "y": y}, exp, "fp16",
               "compute_precision FLOAT16: the converter casts the fp32 inputs to fp16 (cast ops), runs "
               "every op in fp16 with fp16 weights (gamma/beta [16] are FLOAT16 blobs, blob dtype code 1; "
               "the epsilon becomes an inline fp16 scalar, 1e-5 -> 1.0013580322265625e-05, which the "
               "reference uses) "
               "and casts the outputs back to fp32. The fp16 ops are renamed `<name>_cast_fp16` and "
               "the final fp32 casts carry the original output names (add, mul, exp, layer_norm); the "
               "input casts are `x_to_fp16`/`y_to_fp16` with dtype 'fp16'. Inputs, gamma and beta are exactly representable in "
               "fp16, so the casts are lossless. expected.safetensors is the exact float64 result; "
               "each output is one op between lossless casts, so in expected_fp16.safetensors (the "
               "op-by-op fp16 reference, as for every case) each output is that exact result rounded once "
               "to fp16 (checked; layer_norm is one op, its internals are not rounded). A real fp16 "
               "runtime differs by more for layer_norm (see tolerance).",
               extra={"tolerance": {"abs": 2e-2, "rel": 1e-2,
                                    "note": "vs expected.safetensors; add/mul/exp are within 1 fp16 ulp"},
                      "max_abs_diff_expected_vs_fp16_rounded": errs})
    for k, v in exp16.items():
        assert np.array_equal(FP16_REFS["fp16_elementwise"][k], v), k
    return meta


def _quant_source():
    rng = rng_for("quantized")  # same weights/inputs for both variants
    x = f32(rng.normal(size=(1, 32, 1, 8)))
    w = f32(rng.normal(size=(64, 32, 1, 1)) * 0.2)
    b = f32(rng.normal(size=64) * 0.1)

    @mb.program(input_specs=[mb.TensorSpec(shape=(1, 32, 1, 8))], opset_version=OPSET)
    def prog(x):
        return mb.conv(x=x, weight=w, bias=b, name="y")

    model = ct.convert(prog, convert_to="mlprogram", minimum_deployment_target=OPSET,
                       compute_precision=FP32, skip_model_load=True)
    return x, w, b, model


def _dequant(spec, pkg: Path) -> tuple[np.ndarray, dict]:
    """Reconstruct the conv weight from the constexpr op(s) in the saved program."""
    consts = const_values(spec, "main", pkg)
    ops = list(iter_ops(main_block(spec, "main")))
    conv = next(op for op in ops if op.type == "conv")
    wname = conv.inputs["weight"].arguments[0].name
    producers = {o.name: op for op in ops for o in op.outputs}
    op = producers[wname]
    ins = op_inputs(op, consts, pkg)
    info = {"constexpr_op": op.type,
            "constexpr_inputs": {k: {"dtype": str(np.asarray(v).dtype), "shape": list(np.shape(v))}
                                 for k, v in ins.items()}}
    if op.type == "constexpr_blockwise_shift_scale":
        data = ins["data"].astype(np.float64)
        scale = ins["scale"].astype(np.float64)
        off = ins.get("offset")
        if off is not None:
            data = data - np.asarray(off, np.float64).repeat(data.shape[0] // off.shape[0], 0)
        # scale has the rank of data; each dim is data_dim / block_size
        for ax in range(data.ndim):
            scale = scale.repeat(data.shape[ax] // scale.shape[ax], axis=ax)
        wq = data * scale
        info["int8_range"] = [int(ins["data"].min()), int(ins["data"].max())]
    elif op.type == "constexpr_lut_to_dense":
        idx = ins["indices"].astype(np.int64)
        lut = ins["lut"].astype(np.float64)  # [..., 2^nbits, vector_size], leading dims: per-block
        assert lut.shape[-1] == 1, lut.shape
        lead = lut.shape[:-2]
        assert all(s == 1 for s in lead), f"only per-tensor LUT handled here, got {lut.shape}"
        wq = lut.reshape(-1)[idx]
        info["distinct_indices"] = int(len(np.unique(idx)))
        info["lut_size"] = int(lut.shape[-2])
    else:
        raise NotImplementedError(op.type)
    return wq.astype(np.float64), info


def case_quantized(d: Path, variant: str):
    x, w, b, model = _quant_source()
    if variant == "quantized_int8":
        cfg = cto.OptimizationConfig(global_config=cto.OpLinearQuantizerConfig(
            mode="linear_symmetric", dtype="int8", granularity="per_channel", weight_threshold=512))
        qmodel = cto.linear_quantize_weights(model, config=cfg)
        how = ("linear_quantize_weights(OpLinearQuantizerConfig(mode='linear_symmetric', dtype='int8', "
               "granularity='per_channel', weight_threshold=512))")
    else:
        # mode="kmeans" clusters with scikit-learn for fp32 weights of this size, and scikit-learn is
        # not in the runtime venv. mode="custom" with coremltools' own k-means LUT function forced to
        # its bundled exact 1-D k-means (kmeans1d; what mode="kmeans" itself uses for large fp16
        # weights) gives the same program structure (constexpr_lut_to_dense, 6-bit indices, 64-entry
        # LUT) without the extra dependency, and is deterministic.
        from coremltools.models.neural_network.quantization_utils import _get_kmeans_lookup_table_and_weight

        def kmeans_6bit(val):
            lut, idx = _get_kmeans_lookup_table_and_weight(6, val, force_kmeans1d=True)
            return lut.astype(val.dtype), idx.astype(np.uint8)

        cfg = cto.OptimizationConfig(global_config=cto.OpPalettizerConfig(
            mode="custom", lut_function=kmeans_6bit, weight_threshold=512))
        qmodel = cto.palettize_weights(model, config=cfg)
        how = ("palettize_weights(OpPalettizerConfig(mode='custom', lut_function=6-bit k-means via "
               "coremltools' _get_kmeans_lookup_table_and_weight(6, w, force_kmeans1d=True), "
               "weight_threshold=512)); equivalent to nbits=6, mode='kmeans', which needs scikit-learn")
    pkg = d / "model.mlpackage"
    save_model(qmodel, pkg)
    spec = ct.utils.load_spec(str(pkg))
    wq, qinfo = _dequant(spec, pkg)
    # cross-check our reconstruction with coremltools' own reader (milproto -> pymil, constexpr value)
    from coremltools.converters.mil.frontend.milproto.load import load as milproto_load
    prog = milproto_load(spec, spec.specificationVersion, str(pkg / WEIGHTS_REL.parent))
    cx = [op for op in prog.functions["main"].operations if op.op_type.startswith("constexpr_")]
    assert len(cx) == 1
    ref = cx[0].materialized_val_inference()
    assert np.array_equal(np.asarray(ref, np.float64), wq.astype(np.float32).astype(np.float64)), "dequant mismatch"
    X = x.astype(np.float64)
    y_q = conv2d(X, wq, b)
    y_f = conv2d(X, w.astype(np.float64), b)
    werr = float(np.max(np.abs(wq - w)))
    yerr = float(np.max(np.abs(y_q - y_f)))
    write_case(variant, pkg, {"x": x}, {"y": y_q}, "fp32",
               f"1x1 conv x [1,32,1,8] -> [1,64,1,8], weight [64,32,1,1] + bias [64] (bias stays a plain fp32 "
               f"const: 64 < weight_threshold). Compressed with coremltools.optimize.coreml.{how}. "
               "expected.safetensors is computed from the weight dequantised from the saved package's "
               "constexpr inputs (read back with this script's own blob reader, and checked equal to "
               "coremltools' own constexpr value inference). Comparing instead against the original float "
               "weights needs the tolerance in `tolerance_vs_float_weights`.",
               extra={"tolerance": {"abs": 1e-5, "rel": 1e-5},
                      "tolerance_vs_float_weights": {"max_abs_weight_error": werr,
                                                     "max_abs_output_error": yerr},
                      "quantization": qinfo},
               extra_files={"expected_float_weights.safetensors": {"y": y_f}})


def case_multifunction(d: Path):
    rng = rng_for("multifunction")
    w = f32(rng.normal(size=(16, 8, 1, 1)) * 0.3)
    b = f32(rng.normal(size=16) * 0.1)
    inputs, expected = {}, {}
    with tempfile.TemporaryDirectory() as td:
        paths = {}
        for S in (8, 16):
            @mb.program(input_specs=[mb.TensorSpec(shape=(1, 8, 1, S))], opset_version=OPSET)
            def prog(x):
                return mb.relu(x=mb.conv(x=x, weight=w, bias=b, name="conv"), name="y")

            model = ct.convert(prog, convert_to="mlprogram", minimum_deployment_target=OPSET,
                               compute_precision=FP32, skip_model_load=True)
            paths[S] = os.path.join(td, f"b{S}.mlpackage")
            model.save(paths[S])
            x = f32(rng.normal(size=(1, 8, 1, S)))
            inputs[f"b{S}.x"] = x
            expected[f"b{S}.y"] = np.maximum(conv2d(x.astype(np.float64), w.astype(np.float64), b), 0.0)
        desc = ct.utils.MultiFunctionDescriptor()
        desc.add_function(paths[8], src_function_name="main", target_function_name="b8")
        desc.add_function(paths[16], src_function_name="main", target_function_name="b16")
        desc.default_function_name = "b8"
        pkg = d / "model.mlpackage"
        if pkg.exists():
            shutil.rmtree(pkg)
        ct.utils.save_multifunction(desc, str(pkg))
        normalize_manifest(pkg, d.name)
        canonicalize_spec(pkg)
    spec = ct.utils.load_spec(str(pkg))
    blob_offsets = {}
    for fn in ("b8", "b16"):
        for op in iter_ops(main_block(spec, fn)):
            if op.type == "const" and op.attributes["val"].HasField("blobFileValue"):
                blob_offsets.setdefault(fn, {})[op.outputs[0].name] = op.attributes["val"].blobFileValue.offset
    fdesc = {f.name: {"inputs": [i.name for i in f.input], "outputs": [o.name for o in f.output]}
             for f in spec.description.functions}
    write_case("multifunction", pkg, inputs, expected, "fp32",
               "Multifunction package (ct.utils.save_multifunction): functions 'b8' (x [1,8,1,8]) and "
               "'b16' (x [1,8,1,16]), each relu(conv1x1(x, W[16,8,1,1], b[16])) with the same weights, "
               "default function 'b8' (ModelDescription.defaultFunctionName). Tensors are keyed "
               "'<function>.<name>'. save_multifunction deduplicates identical consts across functions, "
               "so both functions' weight consts point at the same blob offsets (see blob_offsets).",
               extra={"tolerance": {"abs": 1e-5, "rel": 1e-5}, "blob_offsets": blob_offsets,
                      "description_functions": fdesc})


# --------------------------------------------------------------------------
# README
# --------------------------------------------------------------------------


def hexdump(b: bytes) -> str:
    lines = []
    for i in range(0, len(b), 16):
        chunk = b[i:i + 16]
        hx = " ".join(chunk[j:j + 2].hex() for j in range(0, len(chunk), 2))
        lines.append(f"{i:08x}: {hx}")
    return "\n".join(lines)


def write_readme():
    L = []
    L.append("# Core ML ML-program golden cases\n")
    L.append("Generated by `python/golden/make_mil_cases.py` (from the repository root: "
             "`.venv/bin/python python/golden/make_mil_cases.py`; the runtime venv with coremltools "
             f"{ct.__version__} and numpy {np.__version__}, python {sys.version.split()[0]}). Deterministic "
             "(numpy seed 0). Rerunning it deletes and rewrites everything under `golden/mil/`.\n")
    L.append("coremltools cannot predict on Linux, so every expected output is a numpy float64 reference "
             "cast to float32, computed from the same weights as the saved program.\n")
    L.append("## Files per case (`golden/mil/<case>/`)\n")
    L.append("- `model.mlpackage/`: the package as saved by coremltools (`Manifest.json`, "
             "`Data/com.apple.CoreML/model.mlmodel`, `Data/com.apple.CoreML/weights/weight.bin`), made "
             "byte-reproducible in two ways that change no content: the Manifest's random item UUIDs are "
             "replaced by deterministic ones (uuid5 of the case name and item path, same JSON formatting), "
             "and model.mlmodel is re-serialised with protobuf's deterministic mode (map entries sorted by "
             "key; coremltools' own output orders them differently in every process) after deleting the "
             f"`{DATE_KEY}` entry from description.metadata.userDefined (the conversion day); otherwise the "
             "same message.")
    L.append("- `inputs.safetensors`: float32 inputs keyed by the program's input names "
             "(multifunction: `<function>.<input>`).")
    L.append("- `expected.safetensors`: float32 outputs keyed by the program's output names "
             "(multifunction: `<function>.<output>`).")
    L.append("- `expected_fp16.safetensors`: the op-by-op fp16 reference, for the interpreter's fp16 mode: "
             "every floating-point value of the program (function inputs, const outputs, op outputs; "
             "keyed by value name, multifunction: `<function>.<name>`), as float32 holding fp16 values. "
             "numpy executes the saved program op by op (its own reading of each op, which without "
             "rounding reproduces `expected.safetensors`), rounding each function input and each "
             "floating-point op output, consts included, once to fp16 (nearest, ties to even); each op "
             "is computed from its fp16 operands in longdouble and again in float64, and the two must "
             "give the same fp16 bits, so each value is the correctly rounded result of its op on its "
             "fp16 operands. Values bound inline to an op (constexpr data) are used as stored.")
    L.append("- `case.json`: `ops` (sorted distinct MIL op types in the saved program, read back from the "
             "saved spec), `functions.<name>.op_sequence` (op types in program order), `op_params` (input and "
             "attribute names of each op type as they appear in the proto), `const_storage` (which consts "
             "are inline immediate values and which are weight.bin blobs, with offsets), "
             "`compute_precision`, `tolerance`, `notes`.\n")
    L.append("Tolerances mean `|got - expected| <= abs + rel * |expected|` elementwise (against "
             "`expected.safetensors`). Extra reference file: "
             "`quantized_int8|palettized_6bit/expected_float_weights.safetensors` (the output with the "
             "original, uncompressed float weights).\n")
    L.append("Packages with no const of >= 10 elements (`elementwise`, `reductions`) have no weight.bin; "
             "coremltools leaves an empty `Data/com.apple.CoreML/weights/` directory, which git does not "
             "keep, so in a checkout that directory is missing although Manifest.json still lists it.\n")
    L.append("Safetensors files are written by a small byte-deterministic writer (sorted keys, header padded "
             "with spaces to a multiple of 8).\n")
    L.append("## Cases\n")
    L.append("| case | precision | inputs | outputs | op types (saved program) | weight.bin bytes |")
    L.append("|---|---|---|---|---|---|")
    for name, m in CASES.items():
        ins = ", ".join(f"`{k}` {v}" for k, v in m["inputs"].items())
        outs = ", ".join(f"`{k}` {v}" for k, v in m["outputs"].items())
        L.append(f"| `{name}` | {m['compute_precision']} | {ins} | {outs} | {', '.join(m['ops'])} | "
                 f"{m['weight_bin_bytes']} |")
    L.append("")
    for name, m in CASES.items():
        L.append(f"### `{name}`\n")
        L.append(m["notes"] + "\n")
        tol = m.get("tolerance")
        if tol:
            L.append(f"Tolerance: {json.dumps(tol)}.\n")
    L.append("## weight.bin format (checked by the script's own reader against every case)\n")
    L.append("All integers little-endian. `storage_header` (64 bytes at offset 0): u32 `count` (number of "
             "blobs), u32 `version` (= 2), 56 zero bytes. Then per blob, each starting on a 64-byte boundary: "
             "`blob_metadata` (64 bytes): u32 sentinel `0xDEADBEEF`, u32 `mil_dtype` (BlobDataType: 1 fp16, "
             "2 fp32, 3 u8, 4 i8, 5 bf16, 6 i16, 7 u16, 8 i4, 9 u1, 10 u2, 11 u4, 12 u3, 13 u6, 14 i32, "
             "15 u32, 16 fp8e4m3fn, 17 fp8e5m2), u64 `sizeInBytes`, u64 `offset` (absolute file offset of "
             "the data = metadata offset + 64), u64 `padding_size_in_bits` (sub-byte types: unused bits in "
             "the last byte), 32 reserved zero bytes; then the raw data, zero-padded to the next 64-byte "
             "boundary. Sub-byte elements are packed LSB first. A const's `blobFileValue.offset` in the "
             "proto points at its `blob_metadata` record, not at the data.\n")
    first = next((m for m in CASES.values() if m["weight_bin_bytes"] >= 192), None)
    if first:
        b = (OUT / first["case"] / "model.mlpackage" / WEIGHTS_REL).read_bytes()[:192]
        L.append(f"First 192 bytes of `{first['case']}/model.mlpackage/{WEIGHTS_REL.as_posix()}`:\n")
        L.append("```\n" + hexdump(b) + "\n```\n")
    (OUT / "README.md").write_text("\n".join(L))


def main():
    if OUT.exists():
        shutil.rmtree(OUT)
    OUT.mkdir(parents=True)
    steps = [
        ("elementwise", case_elementwise),
        ("reductions", case_reductions),
        ("shapes", case_shapes),
        ("conv", case_conv),
        ("attention_block", case_attention),
        ("padded_attention", case_padded_attention),
        ("padded_windows", case_padded_windows),
        ("fp16_elementwise", case_fp16),
        ("quantized_int8", lambda d: case_quantized(d, "quantized_int8")),
        ("palettized_6bit", lambda d: case_quantized(d, "palettized_6bit")),
        ("multifunction", case_multifunction),
    ]
    for name, fn in steps:
        d = OUT / name
        d.mkdir()
        fn(d)
        print(f"{name}: ops {CASES[name]['ops']}", file=sys.stderr)
    write_readme()
    total = sum(f.stat().st_size for f in OUT.rglob("*") if f.is_file())
    print(f"golden/mil: {total} bytes", file=sys.stderr)
    assert total < 3 * 1024 * 1024


if __name__ == "__main__":
    main()
