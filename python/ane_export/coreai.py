"""Core AI: the `.aimodel` format, written from the package's MIL program and
executed by Apple's Core AI runtime.

`save_aimodel` translates the ML program of a written `.mlpackage`, op by op,
into a Core AI program (`coreai.authoring`, coreai-core pinned in
requirements-runtime.txt): one graph per bucket named like the bucket, the
same inputs, outputs, shapes and dtypes, the same ANE layout (BC1S
activations, Linears as 1x1 convolutions), the weights stored once (Core AI
stores identical constants once, measured: docs/formats.md). The program the
builders emit is the one definition of both formats: nothing here knows a
family, only MIL ops.

The Rust side runs the executor in a child process, as it runs Core ML's,

    python -m ane_export.coreai serve AIMODEL
    python -m ane_export.coreai ops AIMODEL OUT.json

`serve` speaks the protocol of `ane_export.coreml serve` (that module's doc),
so one Rust child type drives both. `ops` lists every graph's Core AI ops
with their operand and result types, for the residency rules.

Where Core AI lacks a MIL op (layer_norm, a conv's bias, matmul's transpose
flags), the translation composes it from Core AI ops that compute the same
function; docs/formats.md lists each.
"""

from __future__ import annotations

import inspect
import json
import os
import sys
from typing import Annotated

#: The coreai-core the translation and the executor are written against:
#: `save_aimodel` uses its authoring API, the executor its runtime.
PINNED = {"coreai-core": "1.0.0b3"}


def check_environment():
    """Raise naming the package if coreai-core is missing or not the pinned
    version (the translation depends on its op set)."""
    from . import environment

    return environment.check_environment(PINNED)


# ---------------------------------------------------------------- translation


def _load_program(pkg):
    """The MIL program of the package at `pkg`, constants as numpy arrays."""
    import logging

    logging.getLogger("coremltools").setLevel(logging.ERROR)
    import coremltools as ct
    from coremltools.converters.mil.frontend.milproto.load import load as mil_load

    spec = ct.utils.load_spec(pkg)
    if spec.WhichOneof("Type") != "mlProgram":
        raise ValueError(f"{pkg}: not an ML program")
    weights = os.path.join(pkg, "Data", "com.apple.CoreML", "weights")
    return mil_load(spec, specification_version=spec.specificationVersion, file_weights_dir=weights)


def _np_dtype(mil_dtype):
    import numpy as np
    from coremltools.converters.mil.mil import types

    table = {types.fp16: np.float16, types.fp32: np.float32, types.int32: np.int32,
             types.int8: np.int8, types.uint8: np.uint8, types.int16: np.int16,
             types.bool: np.bool_}
    if mil_dtype not in table:
        raise ValueError(f"no Core AI dtype for MIL dtype {types.builtin_to_string(mil_dtype)}")
    return table[mil_dtype]


class _Untranslatable(ValueError):
    pass


class _Translator:
    """Translate one MIL function's ops inside a Core AI graph being built."""

    def __init__(self, fn_name):
        import coreai.authoring as A
        import numpy as np

        self.A, self.np, self.fn = A, np, fn_name
        self.values = {}

    # Values: a MIL var is a Core AI Value or a numpy constant.
    def get(self, var):
        if var.name in self.values:
            return self.values[var.name]
        if var.val is not None:
            return self._const(var)
        raise _Untranslatable(f"{self.fn}: value `{var.name}` is used before it is made")

    def _const(self, var):
        np = self.np
        v = var.val
        if isinstance(v, (str, bytes)):
            return v
        try:
            return np.asarray(v, dtype=_np_dtype(var.dtype))
        except ValueError:
            # Sub-byte data (a palette's uint6 indices): only a constexpr op
            # reads it, from the MIL value itself.
            return np.asarray(v)

    def param(self, op, name, default=None):
        v = op.inputs.get(name)
        if v is None:
            return default
        if v.val is None:
            raise _Untranslatable(f"{self.fn}: op `{op.name}` ({op.op_type}): `{name}` is not a constant")
        return v.val

    def shape(self, var):
        return tuple(int(d) for d in var.shape)

    def _i32(self, xs):
        return self.np.asarray(xs, dtype=self.np.int32)

    def _perm(self, xs):
        """A permutation: Core AI's transpose takes it as unsigned integers."""
        return self.np.asarray([int(x) for x in xs], dtype=self.np.uint32)

    def _bcast(self, x, like_rank):
        """A numpy scalar or low-rank constant as an array of `like_rank` dims."""
        np = self.np
        if isinstance(x, np.ndarray) and x.ndim < like_rank:
            return x.reshape((1,) * (like_rank - x.ndim) + x.shape)
        return x

    def run(self, op):
        method = getattr(self, "op_" + op.op_type, None)
        if method is None:
            raise _Untranslatable(
                f"{self.fn}: MIL op `{op.op_type}` (`{op.name}`) has no Core AI translation")
        out = method(op)
        outs = out if isinstance(out, list) else [out]
        if len(outs) != len(op.outputs):
            raise _Untranslatable(f"{self.fn}: op `{op.name}` gave {len(outs)} values for {len(op.outputs)}")
        for var, val in zip(op.outputs, outs):
            self.values[var.name] = val

    # --- constants
    def op_const(self, op):
        return self._const(op.outputs[0])

    def op_constexpr_blockwise_shift_scale(self, op):
        np = self.np
        data = np.asarray(op.inputs["data"].val)
        scale = np.asarray(op.inputs["scale"].val)
        off = op.inputs.get("offset")
        # out = scale * (data - offset1) + offset2 (Core AI); MIL's is scale * (data - offset).
        off1 = np.zeros(scale.shape, data.dtype) if off is None else np.asarray(off.val, data.dtype)
        off2 = np.zeros(scale.shape, scale.dtype)
        return self.A.blockwise_shift_scale(data, scale, off1, off2)

    def op_constexpr_lut_to_dense(self, op):
        """MIL (iOS18): indices of the dense shape, lut [blocks..., 2^bits,
        vector]; vector_axis only for vector palettes (not emitted: refused).
        Core AI's lut_to_dense takes the same layout, with indices whose width
        must match the palette's size (2, 4 or 8 bits; it has no uint6). The
        indices are stored as 8 bits, and a smaller palette (pal6's 64
        entries) padded to 256 with zeros no index selects: exact, the indices
        taking 8/6 of their MIL size. (4-bit palettes computed wrong results
        on the Linux runtime, issue 52's measurement: not used.)"""
        np = self.np
        from coreai.authoring.constant import constant

        if op.inputs.get("vector_axis") is not None:
            raise _Untranslatable(f"{self.fn}: `{op.name}`: vector palettes are not translated")
        idx = np.asarray(op.inputs["indices"].val).astype(np.uint8)
        lut = np.asarray(op.inputs["lut"].val)
        if lut.shape[-2] != 256:
            pad = [(0, 0)] * lut.ndim
            pad[-2] = (0, 256 - lut.shape[-2])
            lut = np.pad(lut, pad)
        return self.A.lut_to_dense(constant(idx, dtype=self.A.uint8), lut, np.array(0, np.int16))

    # --- data movement
    def op_cast(self, op):
        dt = self.param(op, "dtype")
        table = {"fp16": self.np.float16, "fp32": self.np.float32, "int32": self.np.int32}
        if dt not in table:
            raise _Untranslatable(f"{self.fn}: `{op.name}`: cast to {dt}")
        return self.A.cast(self.get(op.inputs["x"]), table[dt])

    def op_identity(self, op):
        return self.get(op.inputs["x"])

    def op_reshape(self, op):
        return self.A.reshape(self.get(op.inputs["x"]), self._i32(self.shape(op.outputs[0])))

    def op_transpose(self, op):
        return self.A.transpose(self.get(op.inputs["x"]), self._perm(self.param(op, "perm")))

    def op_expand_dims(self, op):
        return self.A.reshape(self.get(op.inputs["x"]), self._i32(self.shape(op.outputs[0])))

    op_squeeze = op_expand_dims

    def op_concat(self, op):
        if bool(self.param(op, "interleave", False)):
            raise _Untranslatable(f"{self.fn}: `{op.name}`: interleaved concat")
        vals = [self.get(v) for v in op.inputs["values"]]
        rank = len(op.outputs[0].shape)
        axis = int(self.param(op, "axis")) % rank
        return self.A.concat(self.np.array(axis, self.np.int32), vals)

    def op_slice_by_index(self, op):
        x = op.inputs["x"]
        shape = self.shape(x)
        rank = len(shape)
        begin = list(self.param(op, "begin"))
        end = list(self.param(op, "end"))
        stride = list(self.param(op, "stride", [1] * rank))
        bm = list(self.param(op, "begin_mask", [False] * rank))
        em = list(self.param(op, "end_mask", [False] * rank))
        sq = list(self.param(op, "squeeze_mask", [False] * rank))
        starts, ends = [], []
        for i in range(rank):
            if stride[i] != 1:
                raise _Untranslatable(f"{self.fn}: `{op.name}`: slice stride {stride[i]}")
            b = 0 if bm[i] else int(begin[i])
            e = shape[i] if em[i] else int(end[i])
            b = b + shape[i] if b < 0 else b
            e = e + shape[i] if e < 0 else e
            if sq[i]:
                e = b + 1
            starts.append(b)
            ends.append(e)
        y = self.A.slice_(self.get(x), self._i32(starts), self._i32(ends), self._i32(stride))
        if any(sq):
            y = self.A.reshape(y, self._i32(self.shape(op.outputs[0])))
        return y

    def op_split(self, op):
        x = op.inputs["x"]
        shape = self.shape(x)
        axis = int(self.param(op, "axis")) % len(shape)
        outs, at = [], 0
        for o in op.outputs:
            n = self.shape(o)[axis]
            starts = [0] * len(shape)
            ends = list(shape)
            starts[axis], ends[axis] = at, at + n
            outs.append(self.A.slice_(self.get(x), self._i32(starts), self._i32(ends),
                                      self._i32([1] * len(shape))))
            at += n
        return outs

    # --- element-wise
    def _binary(self, op, name):
        """An element-wise op: Core AI's same-shape op where both operands
        have the output's shape (the broadcasting form lowers to extra
        broadcast ops on the runtime), else the broadcasting one."""
        x, y = op.inputs["x"], op.inputs["y"]
        so = self.shape(op.outputs[0])
        rank = len(so)
        a = self._bcast(self.get(x), rank)
        b = self._bcast(self.get(y), rank)
        if self.shape(x) == so and self.shape(y) == so and name in _SAME_SHAPE:
            return getattr(self.A, _SAME_SHAPE[name])(a, b)
        return getattr(self.A, name)(a, b)

    def op_add(self, op):
        return self._binary(op, "broadcasting_add")

    def op_sub(self, op):
        return self._binary(op, "broadcasting_sub")

    def op_mul(self, op):
        return self._binary(op, "broadcasting_mul")

    def op_real_div(self, op):
        return self._binary(op, "broadcasting_divide")

    def op_maximum(self, op):
        return self._binary(op, "broadcasting_maximum")

    def op_minimum(self, op):
        return self._binary(op, "broadcasting_minimum")

    def op_pow(self, op):
        return self._binary(op, "broadcasting_pow")

    def _unary(self, op, name):
        return getattr(self.A, name)(self.get(op.inputs["x"]))

    def op_relu(self, op):
        return self._unary(op, "relu")

    def op_sigmoid(self, op):
        return self._unary(op, "sigmoid")

    def op_silu(self, op):
        return self._unary(op, "silu")

    def op_tanh(self, op):
        return self._unary(op, "tanh")

    def op_erf(self, op):
        return self._unary(op, "erf")

    def op_exp(self, op):
        return self._unary(op, "exp")

    def op_sqrt(self, op):
        return self._unary(op, "sqrt")

    def op_abs(self, op):
        return self._unary(op, "abs_")

    def op_square(self, op):
        x = self.get(op.inputs["x"])
        return self.A.mul(x, x)

    def _with_epsilon(self, op):
        x = op.inputs["x"]
        eps = self.np.asarray(self.param(op, "epsilon", 1e-4), dtype=_np_dtype(x.dtype))
        rank = len(self.shape(x))
        return self.A.broadcasting_add(self.get(x), eps.reshape((1,) * rank))

    def op_rsqrt(self, op):
        return self.A.rsqrt(self._with_epsilon(op))

    def op_inverse(self, op):
        x = op.inputs["x"]
        one = self.np.ones((1,) * len(self.shape(x)), _np_dtype(x.dtype))
        return self.A.broadcasting_divide(one, self._with_epsilon(op))

    def op_log(self, op):
        return self.A.log(self._with_epsilon(op)) if "epsilon" in op.inputs else self._unary(op, "log")

    def op_clip(self, op):
        x = op.inputs["x"]
        dt = _np_dtype(x.dtype)
        rank = len(self.shape(x))
        lo = self.np.asarray(self.param(op, "alpha"), dt).reshape((1,) * rank)
        hi = self.np.asarray(self.param(op, "beta"), dt).reshape((1,) * rank)
        return self.A.broadcasting_minimum(self.A.broadcasting_maximum(self.get(x), lo), hi)

    def op_gelu(self, op):
        mode = self.param(op, "mode", "EXACT")
        approx = {"EXACT": "none", "TANH_APPROXIMATION": "tanh", "SIGMOID_APPROXIMATION": "sigmoid"}
        if mode not in approx:
            raise _Untranslatable(f"{self.fn}: `{op.name}`: gelu mode {mode}")
        return self.A.gelu(self.get(op.inputs["x"]), approximate=approx[mode])

    def op_softmax(self, op):
        x = op.inputs["x"]
        axis = int(self.param(op, "axis", -1)) % len(self.shape(x))
        return self.A.softmax(self.get(x), self.np.array(axis, self.np.int32))

    # --- reductions and norms
    def _reduce(self, op, name):
        x = op.inputs["x"]
        rank = len(self.shape(x))
        axes = self.param(op, "axes")
        axes = list(range(rank)) if axes is None else sorted(int(a) % rank for a in axes)
        y = getattr(self.A, name)(self.get(x), self._i32(axes))
        if not bool(self.param(op, "keep_dims", False)):
            y = self.A.reshape(y, self._i32(self.shape(op.outputs[0])))
        return y

    def op_reduce_mean(self, op):
        return self._reduce(op, "reduce_mean")

    def op_reduce_sum(self, op):
        return self._reduce(op, "reduce_sum")

    def op_reduce_max(self, op):
        return self._reduce(op, "reduce_max")

    def op_layer_norm(self, op):
        """MIL's layer_norm, (x - mean) / sqrt(var + eps) * gamma + beta over
        `axes`, composed from Core AI ops (it has no normalisation op), in
        fp16 as the program computes, with two measured hazards avoided:

        - the means are 1x1 convolutions with weights 1/C where the axis is
          the channels of (1, C, 1, S), the builders' form: a conv
          accumulates wide, where the Linux runtime's fp16 reduce_mean, like
          the Neural Engine's reduce_sum (ANEForge, docs/numerics.md),
          accumulates in fp16 (with reduce_mean tiny-siglip2's task gate
          flipped 4 colour predictions of 150 against the interpreter's 2);
        - the centred values are divided by their largest magnitude per
          column before squaring: (x - mean)^2 overflows fp16 past 256, which
          a tower's massive activations reach (tiny-a-massive32k's mergers fell
          to cosine 0.89). With m = max(max|x - mean|, 2^-8) and u = (x -
          mean) / m, the result u / sqrt(mean(u^2) + eps / m^2) is the same
          function, every square at most 1.
        """
        A, np = self.A, self.np
        x = op.inputs["x"]
        shape = self.shape(x)
        rank = len(shape)
        dt = _np_dtype(x.dtype)
        axes = sorted(int(a) % rank for a in self.param(op, "axes"))
        ax = self._i32(axes)
        ones = (1,) * rank
        v = self.get(x)
        if axes == [1] and rank == 4:
            w = np.full((1, shape[1], 1, 1), 1.0 / shape[1], dt)
            one = self._i32([1, 1])

            def mean(t):
                return A.conv2d(t, w, one, one, np.array(1, np.int32))
        else:
            def mean(t):
                return A.reduce_mean(t, ax)
        d = A.broadcasting_sub(v, mean(v))
        floor = np.asarray(2.0 ** -8, dt).reshape(ones)
        m = A.broadcasting_maximum(A.reduce_max(A.abs_(d), ax), floor)
        u = A.broadcasting_divide(d, m)
        eps = np.asarray(self.param(op, "epsilon", 1e-5), dt).reshape(ones)
        var = A.add(mean(A.mul(u, u)), A.broadcasting_divide(eps, A.mul(m, m)))
        y = A.broadcasting_mul(u, A.rsqrt(var))
        pshape = tuple(shape[i] if i in axes else 1 for i in range(rank))
        g, b = op.inputs.get("gamma"), op.inputs.get("beta")
        if g is not None:
            y = A.broadcasting_mul(y, self._param_tensor(g, pshape))
        if b is not None:
            y = A.broadcasting_add(y, self._param_tensor(b, pshape))
        return y

    def _param_tensor(self, var, shape):
        v = self.get(var)
        if isinstance(v, self.np.ndarray):
            return v.reshape(shape)
        return self.A.reshape(v, self._i32(shape))

    # --- products
    def op_matmul(self, op):
        """MIL's matmul. A product whose batch dimensions are all 1 (the
        builders' attention, one head at a time) becomes a 1x1 `conv2d`
        whose weight is the left operand: A (M, K) times B (K, N) is the
        convolution of B as (1, K, 1, N) by A as (M, K, 1, 1), giving
        (1, M, 1, N); a transpose flag costs one `transpose` of that operand.
        Why not `batch_matmul`: on the Linux runtime (coreai-core 1.0.0b3) it
        accumulates in fp16 and runs at 0.05 GFLOP/s, 100 to 250 times slower
        than the convolution, which accumulates wide as the Neural Engine's
        matmul and conv do (measured: docs/formats.md). Other batch shapes
        keep `batch_matmul`."""
        A, np = self.A, self.np
        x, y = op.inputs["x"], op.inputs["y"]
        sx, sy, so = self.shape(x), self.shape(y), self.shape(op.outputs[0])
        if len(sx) < 2 or len(sy) < 2:
            raise _Untranslatable(f"{self.fn}: `{op.name}`: matmul of a rank-1 operand")
        tx = bool(self.param(op, "transpose_x", False))
        ty = bool(self.param(op, "transpose_y", False))
        a, b = self.get(x), self.get(y)
        if all(d == 1 for d in sx[:-2] + sy[:-2]) and not isinstance(a, np.ndarray):
            m, n = so[-2], so[-1]
            k = sx[-2] if tx else sx[-1]
            # C = A B directly, or as (B^T A^T)^T: whichever transposes less.
            direct = (m * k if tx else 0) + (k * n if ty else 0)
            flipped = (0 if ty else k * n) + (0 if tx else m * k) + m * n
            if direct <= flipped:
                return A.reshape(self._conv_product(a, b, m, k, n, tx, ty), self._i32(so))
            ct = self._conv_product(b, a, n, k, m, not ty, not tx)
            return A.reshape(A.transpose(A.reshape(ct, self._i32([n, m])), self._perm([1, 0])),
                             self._i32(so))
        ra, rb = len(sx), len(sy)
        if tx:
            a = A.transpose(a, self._perm(list(range(ra - 2)) + [ra - 1, ra - 2]))
        if ty:
            b = A.transpose(b, self._perm(list(range(rb - 2)) + [rb - 1, rb - 2]))
        same = ra == rb and sx[:-2] == sy[:-2]
        return A.batch_matmul(a, b) if same else A.broadcasting_batch_matmul(a, b)

    def _conv_product(self, a, b, m, k, n, ta, tb):
        """A (M, K) times B (K, N) as a 1x1 conv2d, (1, M, 1, N): B as the
        input (1, K, 1, N), A as the weight (M, K, 1, 1). `ta`/`tb`: the
        operand is stored transposed ((K, M) / (N, K)), and is transposed."""
        A, np = self.A, self.np
        if ta:
            a = A.transpose(A.reshape(a, self._i32([k, m])), self._perm([1, 0]))
        if tb:
            b = A.transpose(A.reshape(b, self._i32([n, k])), self._perm([1, 0]))
        one = self._i32([1, 1])
        return A.conv2d(A.reshape(b, self._i32([1, k, 1, n])), A.reshape(a, self._i32([m, k, 1, 1])),
                        one, one, np.array(1, np.int32))

    def op_conv(self, op):
        """MIL's conv: Core AI's conv2d (no padding, no bias) plus the bias
        added; only unpadded 2-D convolutions are emitted by the builders."""
        A, np = self.A, self.np
        x, w = op.inputs["x"], op.inputs["weight"]
        if len(self.shape(x)) != 4:
            raise _Untranslatable(f"{self.fn}: `{op.name}`: conv of rank {len(self.shape(x))}")
        pad_type = self.param(op, "pad_type", "valid")
        pad = np.asarray(self.param(op, "pad", [0, 0, 0, 0]))
        kernel = self.shape(w)[2:]
        if not (pad_type == "valid" or (pad_type == "custom" and not pad.any())
                or (pad_type == "same" and all(k == 1 for k in kernel))):
            raise _Untranslatable(f"{self.fn}: `{op.name}`: padded conv ({pad_type}, {pad.tolist()})")
        strides = self._i32(self.param(op, "strides", [1, 1]))
        dil = self._i32(self.param(op, "dilations", [1, 1]))
        groups = np.array(int(self.param(op, "groups", 1)), np.int32)
        y = A.conv2d(self.get(x), self.get(w), strides, dil, groups)
        bias = op.inputs.get("bias")
        if bias is not None:
            cout = self.shape(op.outputs[0])[1]
            y = A.broadcasting_add(y, self._param_tensor(bias, (1, cout, 1, 1)))
        return y

    def op_linear(self, op):
        A = self.A
        x, w = op.inputs["x"], op.inputs["weight"]
        rx = len(self.shape(x))
        wt = A.transpose(self.get(w), self._perm([1, 0])) if not isinstance(self.get(w), self.np.ndarray) \
            else self.np.ascontiguousarray(self.get(w).T)
        y = A.broadcasting_batch_matmul(self.get(x), self._bcast(wt, rx) if isinstance(wt, self.np.ndarray) else wt)
        b = op.inputs.get("bias")
        if b is not None:
            y = A.broadcasting_add(y, self._bcast(self.get(b), rx))
        return y


#: Core AI's same-shape forms of the broadcasting element-wise ops.
_SAME_SHAPE = {"broadcasting_add": "add", "broadcasting_sub": "sub", "broadcasting_mul": "mul",
               "broadcasting_divide": "divide", "broadcasting_maximum": "maximum",
               "broadcasting_minimum": "minimum"}


def _tensor_type(var, name):
    from coreai.authoring import TensorType

    return TensorType(tuple(int(d) for d in var.shape), _np_dtype(var.dtype), name=name)


def _graph_fn(mil_fn, fn_name, counts):
    """A Python function whose annotated signature is the MIL function's, and
    whose body translates its ops (coreai.authoring's `graph` reads the
    signature)."""
    from coreai.authoring import Value

    in_names = list(mil_fn.inputs)
    params = [inspect.Parameter(n, inspect.Parameter.POSITIONAL_OR_KEYWORD,
                                annotation=Annotated[Value, _tensor_type(mil_fn.inputs[n], n)])
              for n in in_names]
    outs = list(mil_fn.outputs)
    out_types = [Annotated[Value, _tensor_type(v, v.name)] for v in outs]
    ret = out_types[0] if len(out_types) == 1 else tuple.__class_getitem__(tuple(out_types))

    def body(*args):
        t = _Translator(fn_name)
        for n, a in zip(in_names, args):
            t.values[n] = a
        for op in mil_fn.operations:
            if op.op_type != "const":
                counts[op.op_type] = counts.get(op.op_type, 0) + 1
            t.run(op)
        vals = [t.get(v) for v in outs]
        return vals[0] if len(vals) == 1 else tuple(vals)

    body.__signature__ = inspect.Signature(params, return_annotation=ret)
    body.__annotations__ = {p.name: p.annotation for p in params} | {"return": ret}
    body.__name__ = fn_name
    return body


def save_aimodel(sources, out):
    """Translate MIL functions into one `.aimodel` at `out` (which must not
    exist). `sources`: `(mlpackage, function_in_package, name_in_aimodel)`
    each; one Core AI graph per entry, named `name_in_aimodel`. Returns a
    summary: the coreai-core version, and per graph the MIL ops translated and
    the Core AI ops written."""
    from pathlib import Path

    from coreai.authoring import AIProgram, Module, graph

    check_environment()
    out = Path(out)
    if out.exists():
        raise FileExistsError(f"{out}: already exists")
    programs, mil_counts = {}, {}
    m = Module.create()
    with m:
        for pkg, function, name in sources:
            if pkg not in programs:
                programs[pkg] = _load_program(pkg)
            funcs = programs[pkg].functions
            if function not in funcs:
                raise ValueError(f"{pkg}: no function {function!r} ({', '.join(funcs)})")
            counts = mil_counts.setdefault(name, {})
            graph(_graph_fn(funcs[function], name, counts), provided_name=name)
    AIProgram(m).save_asset(out)
    ops = list_ops(out)
    return {
        "coreai_core": PINNED["coreai-core"],
        "functions": {
            name: {"mil_ops": mil_counts[name], "ops": _count(ops.get(name, []))}
            for _, _, name in sources
        },
    }


def _count(rows):
    c = {}
    for r in rows:
        c[r["op"]] = c.get(r["op"], 0) + 1
    return dict(sorted(c.items()))


# ------------------------------------------------------------ reading programs


_IR_DTYPES = {"f16": "f16", "f32": "f32", "i32": "i32", "i16": "i16", "i8": "i8", "ui8": "u8",
              "i1": "bool", "si32": "i32", "si16": "i16", "si8": "i8", "i64": "i64", "si64": "i64"}


def _type_row(t):
    """`{"dtype", "shape"}` of an MLIR tensor type (its text form)."""
    s = str(t)
    if not s.startswith("tensor<"):
        return {"dtype": s, "shape": []}
    body = s[len("tensor<"):-1].split(",")[0]
    parts = body.split("x")
    dims = [int(p) for p in parts[:-1] if p.lstrip("-").isdigit()]
    return {"dtype": _IR_DTYPES.get(parts[-1], parts[-1]), "shape": dims}


def _asset(path):
    """The `.aimodel` at `path`, loaded; checked first to be one, since
    coreai-core 1.0.0b3 crashes (SIGSEGV) loading a path that is not."""
    from pathlib import Path

    from coreai.authoring import AIModelAsset

    p = Path(path)
    if not (p / "main.mlirb").is_file():
        raise ValueError(f"{p}: not a Core AI asset (expected a directory with main.mlirb)")
    return AIModelAsset.load(p)


def list_ops(path):
    """Every graph's ops in the `.aimodel` at `path`, in order, as written
    (before the runtime lowers them): the op's name, and its operands' and
    results' dtypes and shapes. Constants and the graphs' returns are left
    out (weights and plumbing, not computations). Reads the program's MLIR
    module (coreai-core's `AIProgram._module`, pinned: no public reader of a
    program's ops exists in 1.0.0b3)."""
    module = _asset(path).program._module._mlir_module  # noqa: SLF001
    graphs = {}
    for fop in module.body.operations:
        attrs = fop.attributes
        name = str(attrs["sym_name"]).strip('"') if "sym_name" in attrs else str(fop.name)
        rows = []
        for region in fop.regions:
            for block in region.blocks:
                for o in block.operations:
                    kind = o.operation.name
                    if kind in _NOT_COMPUTING:
                        continue
                    rows.append({
                        "op": kind,
                        "operands": [_type_row(v.type) for v in o.operands],
                        "results": [_type_row(v.type) for v in o.results],
                    })
        graphs[name] = rows
    return graphs


#: Ops of a graph that compute nothing: constants and the graph's return.
_NOT_COMPUTING = ("coreai.constant", "coreai.output")


# ------------------------------------------------------------------ execution


class _Loaded:
    """One function of an `.aimodel` loaded by the runtime, with `predict`
    as `ane_export.coreml.serve` calls it."""

    def __init__(self, host, function):
        self.host, self.f = host, host.model.load_function(function)
        desc = self.f.desc
        self.dtypes = {n: desc.input_descriptor(n).dtype for n in desc.input_names}

    def predict(self, feed):
        from coreai.runtime import NDArray

        np = self.host.np
        missing = set(self.dtypes) - set(feed)
        if missing:
            raise KeyError(f"missing inputs {sorted(missing)}")
        args = {}
        for n, dt in self.dtypes.items():
            want = np.float16 if "16" in str(dt) else np.float32
            args[n] = NDArray(np.ascontiguousarray(feed[n], dtype=want))
        out = self.host.loop.run_until_complete(self.f(args))
        res = {k: np.array(v.numpy(), dtype=np.float32) for k, v in out.items()}
        del out, args
        return res


def _placement():
    """The runtime's device choice: the Neural Engine preferred on macOS (the
    gates judge the program where it ships; not run here), nothing on Linux,
    where the runtime has the CPU alone and refuses the option."""
    if sys.platform != "darwin":
        return {}
    from coreai.runtime import ComputeUnitKind, SpecializationOptions

    kind = ComputeUnitKind.neural_engine()
    return {"specialization_options": SpecializationOptions.from_preferred_compute_unit_kind(kind)}


class _Host:
    """The runtime's executable `.aimodel`, entered once and kept."""

    def __init__(self, path):
        import asyncio

        import numpy as np

        self.np = np
        asset = _asset(path)
        self.loop = asyncio.new_event_loop()
        self.cm = asset.executable(**_placement())
        self.model = self.loop.run_until_complete(self.cm.__aenter__())
        self.loaded = []

    def load(self, function):
        if function not in self.model.function_names:
            raise KeyError(f"no function {function!r} (has {', '.join(self.model.function_names)})")
        f = _Loaded(self, function)
        self.loaded.append(f)
        return f

    def close(self):
        """Release the functions before the model (the runtime can abort
        at exit otherwise, measured with coreai-core 1.0.0b3)."""
        import gc

        for f in self.loaded:
            f.f = None
        self.loaded.clear()
        gc.collect()
        self.loop.run_until_complete(self.cm.__aexit__(None, None, None))
        self.model = None
        gc.collect()


def run(path, function, feed):
    """Run one function of the `.aimodel` at `path` on named numpy inputs;
    every output as f32."""
    host = _Host(path)
    try:
        return host.load(function).predict(feed)
    finally:
        host.close()


def _serve_main(path):
    from .coreml import serve

    replies = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    host = _Host(path)
    try:
        serve(path, None, sys.stdin, replies, load=lambda _p, function, _u: host.load(function))
    finally:
        host.close()
        replies.flush()
        sys.stderr.flush()
        # The runtime's Swift side may still abort at interpreter exit.
        os._exit(0)


def main(argv=None):
    import argparse

    ap = argparse.ArgumentParser(prog="python -m ane_export.coreai")
    sub = ap.add_subparsers(dest="cmd", required=True)
    v = sub.add_parser("serve")
    v.add_argument("aimodel")
    v.add_argument("--compute-units", default=None, help="accepted and ignored: no device choice on Linux")
    o = sub.add_parser("ops")
    o.add_argument("aimodel")
    o.add_argument("out")
    a = ap.parse_args(argv)
    try:
        check_environment()
        if a.cmd == "serve":
            _serve_main(a.aimodel)
        else:
            text = json.dumps({"functions": list_ops(a.aimodel)})
            tmp = f"{a.out}.tmp-{os.getpid()}"
            with open(tmp, "w") as f:
                f.write(text)
            os.replace(tmp, a.out)
    except Exception as e:  # reported to the Rust side on stderr, exit 2
        print(f"error: {type(e).__name__}: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
