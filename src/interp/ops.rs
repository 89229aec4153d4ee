//! The MIL operations the interpreter executes, with MIL's semantics
//! (coremltools' `mil/ops/defs`): broadcasting binaries, reductions over
//! `axes` with `keep_dims`, `layer_norm` over `axes`, `conv` with
//! `pad_type` valid/same/same_lower/custom, exact int32 arithmetic, and the
//! constexpr ops that dequantise compressed weights.

use super::Map;

use candle_core::{DType as CDType, Device, Tensor};

use super::{Interpreter, V};
use crate::mlpackage::Op;

/// Every op type the interpreter runs.
pub const SUPPORTED_OPS: &[&str] = &[
    "const",
    "add",
    "sub",
    "mul",
    "real_div",
    "maximum",
    "minimum",
    "pow",
    "sqrt",
    "rsqrt",
    "exp",
    "tanh",
    "sigmoid",
    "relu",
    "silu",
    "gelu",
    "abs",
    "log",
    "square",
    "erf",
    "inverse",
    "clip",
    "softmax",
    "layer_norm",
    "reduce_mean",
    "reduce_sum",
    "reduce_max",
    "reshape",
    "transpose",
    "expand_dims",
    "squeeze",
    "concat",
    "split",
    "slice_by_index",
    "gather",
    "cast",
    "conv",
    "linear",
    "matmul",
    "identity",
    "constexpr_affine_dequantize",
    "constexpr_blockwise_shift_scale",
    "constexpr_lut_to_dense",
];

type R<T> = Result<T, String>;

fn ce(e: candle_core::Error) -> String {
    e.to_string()
}

fn ints(v: &V) -> R<Vec<i64>> {
    let t = v.tensor()?;
    let t = if t.dtype() == CDType::I64 {
        t.clone()
    } else {
        t.to_dtype(CDType::F32)
            .map_err(ce)?
            .to_dtype(CDType::I64)
            .map_err(ce)?
    };
    t.flatten_all().and_then(|f| f.to_vec1::<i64>()).map_err(ce)
}

fn scalar_f(v: &V) -> R<f32> {
    let t = v.tensor()?.to_dtype(CDType::F32).map_err(ce)?;
    t.flatten_all()
        .and_then(|f| f.to_vec1::<f32>())
        .map_err(ce)?
        .first()
        .copied()
        .ok_or_else(|| "empty scalar".into())
}

fn boolean(v: &V) -> R<bool> {
    Ok(ints(v)?.first().copied().unwrap_or(0) != 0)
}

/// Normalise a possibly negative axis.
fn axis(a: i64, rank: usize) -> R<usize> {
    let r = rank as i64;
    let x = if a < 0 { a + r } else { a };
    if (0..r.max(1)).contains(&x) {
        Ok(x as usize)
    } else {
        Err(format!("axis {a} out of range for rank {rank}"))
    }
}

fn f32t(v: &V) -> R<Tensor> {
    v.tensor()?.to_dtype(CDType::F32).map_err(ce)
}

/// `a op b` over all cores when both have the same shape, or `b` (or `a`) is
/// a single value: the attention scores' scale and mask are this large.
/// Other broadcasts go through candle.
fn par_binary(a: &Tensor, b: &Tensor, kind: &str) -> R<Option<Tensor>> {
    // One monomorphised loop per op, so that the compiler inlines and
    // vectorises it (IEEE addition, subtraction and multiplication round
    // each result alike in any lane).
    match kind {
        "add" => par_binary_with(a, b, |x, y| x + y),
        "sub" => par_binary_with(a, b, |x, y| x - y),
        _ => par_binary_with(a, b, |x, y| x * y),
    }
}

/// [`par_binary`] of one op `f`.
fn par_binary_with<F: Fn(f32, f32) -> f32 + Sync + Copy>(
    a: &Tensor,
    b: &Tensor,
    f: F,
) -> R<Option<Tensor>> {
    use rayon::prelude::*;
    const CHUNK: usize = 1 << 14;
    let scalar = |t: &Tensor| t.flatten_all().and_then(|f| f.to_vec1::<f32>()).map_err(ce);
    let map = |v: &[f32], g: &(dyn Fn(&mut [f32], &[f32]) + Sync)| -> Vec<f32> {
        let mut o = vec![0f32; v.len()];
        o.par_chunks_mut(CHUNK)
            .zip(v.par_chunks(CHUNK))
            .for_each(|(o, x)| g(o, x));
        o
    };
    let (shape, out) = if a.dims() == b.dims() {
        let out = super::with_f32(a, |va| {
            super::with_f32(b, |vb| {
                let mut o = vec![0f32; va.len()];
                o.par_chunks_mut(CHUNK)
                    .zip(va.par_chunks(CHUNK).zip(vb.par_chunks(CHUNK)))
                    .for_each(|(o, (x, y))| {
                        for ((o, &x), &y) in o.iter_mut().zip(x).zip(y) {
                            *o = f(x, y);
                        }
                    });
                o
            })
        })
        .and_then(|r| r)
        .map_err(ce)?;
        (a.dims().to_vec(), out)
    } else if b.elem_count() == 1 && b.rank() <= a.rank() {
        let y = scalar(b)?[0];
        let out = super::with_f32(a, |va| {
            map(va, &|o, x| {
                for (o, &x) in o.iter_mut().zip(x) {
                    *o = f(x, y);
                }
            })
        })
        .map_err(ce)?;
        (a.dims().to_vec(), out)
    } else if a.elem_count() == 1 && a.rank() <= b.rank() {
        let x = scalar(a)?[0];
        let out = super::with_f32(b, |vb| {
            map(vb, &|o, y| {
                for (o, &y) in o.iter_mut().zip(y) {
                    *o = f(x, y);
                }
            })
        })
        .map_err(ce)?;
        (b.dims().to_vec(), out)
    } else {
        return Ok(None);
    };
    Tensor::from_vec(out, shape, &Device::Cpu)
        .map(Some)
        .map_err(ce)
}

/// `a op b` on two integer tensors (int32 in Core ML), broadcast, computed
/// exactly in integers: `real_div` truncates toward zero as Core ML's int32
/// divide does. A result outside int32's range, a division by zero or a
/// negative exponent is refused, naming the op and the operands, rather than
/// given a value Core ML may not give. `abs` (of `a`, `b` unused) shares it.
fn int32_binary(a: &Tensor, b: &Tensor, kind: &str) -> R<Tensor> {
    let shape = a
        .shape()
        .broadcast_shape_binary_op(b.shape(), "int32 binary")
        .map_err(ce)?;
    let flat = |t: &Tensor| {
        t.broadcast_as(shape.clone())
            .and_then(|t| t.contiguous())
            .and_then(|t| t.flatten_all())
            .and_then(|t| t.to_vec1::<i64>())
            .map_err(ce)
    };
    let (va, vb) = (flat(a)?, flat(b)?);
    let out = va
        .iter()
        .zip(&vb)
        .map(|(&x, &y)| {
            let v = match kind {
                "add" => x.checked_add(y),
                "sub" => x.checked_sub(y),
                "mul" => x.checked_mul(y),
                "real_div" if y == 0 => {
                    return Err(format!("real_div of int32 {x} by 0"));
                }
                "real_div" => x.checked_div(y),
                "maximum" => Some(x.max(y)),
                "abs" => x.checked_abs(),
                "minimum" => Some(x.min(y)),
                _ if y < 0 => {
                    return Err(format!(
                        "pow of int32 {x} to the negative exponent {y}: not an integer"
                    ));
                }
                _ => u32::try_from(y).ok().and_then(|e| x.checked_pow(e)),
            };
            v.filter(|v| i32::try_from(*v).is_ok()).ok_or_else(|| {
                format!("{kind} of int32 {x} and {y}: the result is outside int32's range")
            })
        })
        .collect::<R<Vec<i64>>>()?;
    Tensor::from_vec(out, shape, &Device::Cpu).map_err(ce)
}

/// One of the interpreter's elementwise kernels (`src/interp/kernels.rs`) on `t`.
fn kernel_unary(t: &Tensor, kernel: fn(&[f32]) -> Vec<f32>) -> R<Tensor> {
    let y = super::with_f32(t, kernel).map_err(ce)?;
    Tensor::from_vec(y, t.dims(), &Device::Cpu).map_err(ce)
}

/// An elementwise function over all cores.
fn par_unary(t: &Tensor, f: impl Fn(f32) -> f32 + Sync) -> R<Tensor> {
    use rayon::prelude::*;
    let out = super::with_f32(t, |v| {
        let mut o = vec![0f32; v.len()];
        o.par_chunks_mut(1 << 14)
            .zip(v.par_chunks(1 << 14))
            .for_each(|(o, x)| {
                for (o, &x) in o.iter_mut().zip(x) {
                    *o = f(x);
                }
            });
        o
    })
    .map_err(ce)?;
    Tensor::from_vec(out, t.dims(), &Device::Cpu).map_err(ce)
}

/// The shape `reshape` gives `dims` for its `shape` input. A 0 copies a
/// dimension of `dims`, matched from the right (`shape[i]` with
/// `dims[rank - (len - i)]`; one out of range is 1), as iOS17's reshape
/// defines it; where `len == rank`, as iOS15 requires of a shape with a 0,
/// this is the dimension at the same index. A -1 takes what the others leave.
pub(super) fn reshape_dims(dims: &[usize], shape: &[i64]) -> R<Vec<usize>> {
    let total: usize = dims.iter().product();
    let (k, rank) = (shape.len(), dims.len());
    if shape.iter().filter(|&&d| d == -1).count() > 1 {
        return Err(format!("reshape to {shape:?}: more than one -1"));
    }
    let mut out = Vec::with_capacity(k);
    for (i, &d) in shape.iter().enumerate() {
        out.push(match d {
            0 => (rank + i).checked_sub(k).map_or(1, |j| dims[j]),
            d if d > 0 => d as usize,
            -1 => 0,
            d => return Err(format!("reshape to {shape:?}: dimension {d}")),
        });
    }
    if let Some(i) = shape.iter().position(|&d| d == -1) {
        let known: usize = out
            .iter()
            .enumerate()
            .filter(|&(j, _)| j != i)
            .map(|(_, &d)| d)
            .product();
        if known == 0 || !total.is_multiple_of(known) {
            return Err(format!(
                "reshape of {dims:?} to {shape:?}: {total} elements do not divide into {known}"
            ));
        }
        out[i] = total / known;
    }
    if out.iter().product::<usize>() != total {
        return Err(format!(
            "reshape of {dims:?} to {shape:?} gives {out:?}, which does not hold {total} elements"
        ));
    }
    Ok(out)
}

/// iOS16's `constexpr_lut_to_dense`: `lut` of 2^nbits entries, `packed`
/// holding the indices as nbits-bit fields packed from the least significant
/// bit up, `shape` the output's.
fn lut_ios16(lut: &Tensor, packed: &Tensor, shape: &[i64]) -> R<Tensor> {
    let lv = lut
        .flatten_all()
        .and_then(|f| f.to_vec1::<f32>())
        .map_err(ce)?;
    let bytes = packed
        .flatten_all()
        .and_then(|f| f.to_vec1::<i64>())
        .map_err(ce)?;
    let nbits = lv.len().trailing_zeros() as usize;
    if !lv.len().is_power_of_two() || !(1..=8).contains(&nbits) {
        return Err(format!(
            "lut of {} entries: expected 2, 4, ..., 256",
            lv.len()
        ));
    }
    let dims: Vec<usize> = shape.iter().map(|&d| d.max(0) as usize).collect();
    let n: usize = dims.iter().product();
    if bytes.len() * 8 < n * nbits {
        return Err(format!(
            "{} bytes of indices hold fewer than the {n} entries of shape {dims:?}",
            bytes.len()
        ));
    }
    let bit = |i: usize| (bytes[i / 8] >> (i % 8)) & 1;
    let out: Vec<f32> = (0..n)
        .map(|e| {
            let k = (0..nbits).fold(0usize, |k, b| k | (bit(e * nbits + b) as usize) << b);
            lv[k]
        })
        .collect();
    Tensor::from_vec(out, dims, &Device::Cpu).map_err(ce)
}

/// iOS18's `constexpr_lut_to_dense` with vector palettes: `lut` is
/// `[blocks per axis of idx..., palette, vs]`; the output has idx's shape
/// with axis `va` `vs` times longer, entry `(.., c, ..)` of idx writing
/// its vector at `(.., c * vs + e, ..)`.
fn lut_vectors(lut: &Tensor, idx: &Tensor, va: usize) -> R<Tensor> {
    let r = idx.rank();
    let (ld, dims) = (lut.dims().to_vec(), idx.dims().to_vec());
    let (palette, vs) = (ld[r], ld[r + 1]);
    let lv = lut
        .flatten_all()
        .and_then(|f| f.to_vec1::<f32>())
        .map_err(ce)?;
    let iv = idx
        .flatten_all()
        .and_then(|f| f.to_vec1::<i64>())
        .map_err(ce)?;
    let blocks: Vec<usize> = (0..r).map(|d| dims[d] / ld[d].max(1)).collect();
    let mut out_dims = dims.clone();
    out_dims[va] *= vs;
    let mut out = vec![0f32; iv.len() * vs];
    let mut coord = vec![0usize; r];
    for &i in &iv {
        let k = usize::try_from(i)
            .ok()
            .filter(|&k| k < palette)
            .ok_or_else(|| format!("palette index {i} out of range"))?;
        let mut li = 0usize;
        for d in 0..r {
            li = li * ld[d] + coord[d] / blocks[d].max(1);
        }
        for e in 0..vs {
            let mut o = 0usize;
            for d in 0..r {
                let c = if d == va { coord[d] * vs + e } else { coord[d] };
                o = o * out_dims[d] + c;
            }
            out[o] = lv[(li * palette + k) * vs + e];
        }
        for d in (0..r).rev() {
            coord[d] += 1;
            if coord[d] < dims[d] {
                break;
            }
            coord[d] = 0;
        }
    }
    Tensor::from_vec(out, out_dims, &Device::Cpu).map_err(ce)
}

/// `slice_by_index`'s integer inputs for a rank-`r` operand: `begin` and
/// `end` as given (empty if absent), `stride` 1 and the masks false where
/// absent.
pub(super) struct SliceArgs {
    pub begin: Vec<i64>,
    pub end: Vec<i64>,
    pub stride: Vec<i64>,
    pub begin_mask: Vec<bool>,
    pub end_mask: Vec<bool>,
    pub squeeze_mask: Vec<bool>,
}

impl SliceArgs {
    /// Read them with `ints_of`, which gives an input's integers if the op has it.
    pub fn read(ints_of: &dyn Fn(&str) -> R<Option<Vec<i64>>>, r: usize) -> R<Self> {
        let flag = |k: &str| -> R<Vec<bool>> {
            Ok(ints_of(k)?
                .map(|v| v.iter().map(|&b| b != 0).collect())
                .unwrap_or_else(|| vec![false; r]))
        };
        Ok(SliceArgs {
            begin: ints_of("begin")?.unwrap_or_default(),
            end: ints_of("end")?.unwrap_or_default(),
            stride: ints_of("stride")?.unwrap_or_else(|| vec![1; r]),
            begin_mask: flag("begin_mask")?,
            end_mask: flag("end_mask")?,
            squeeze_mask: flag("squeeze_mask")?,
        })
    }
}

/// `a @ b` over broadcast batch dimensions of any rank: both sides are
/// broadcast to one batch shape, made contiguous and run as one 3-D batched
/// product (candle's own broadcasting product refuses the strides of some
/// rank-5 operands).
fn batched_matmul(a: &Tensor, b: &Tensor) -> R<Tensor> {
    if a.rank() < 2 || b.rank() < 2 {
        return Err(format!(
            "matmul of ranks {} and {} after promotion",
            a.rank(),
            b.rank()
        ));
    }
    let (ad, bd) = (a.dims(), b.dims());
    let (m, k) = (ad[ad.len() - 2], ad[ad.len() - 1]);
    let (k2, n) = (bd[bd.len() - 2], bd[bd.len() - 1]);
    if k != k2 {
        return Err(format!(
            "matmul of {ad:?} and {bd:?}: inner dimensions differ"
        ));
    }
    let (ab, bb) = (&ad[..ad.len() - 2], &bd[..bd.len() - 2]);
    let rank = ab.len().max(bb.len());
    let mut batch = Vec::with_capacity(rank);
    for i in 0..rank {
        let x = if i + ab.len() >= rank {
            ab[i + ab.len() - rank]
        } else {
            1
        };
        let y = if i + bb.len() >= rank {
            bb[i + bb.len() - rank]
        } else {
            1
        };
        batch.push(match (x, y) {
            (x, y) if x == y => x,
            (1, y) => y,
            (x, 1) => x,
            _ => {
                return Err(format!(
                    "matmul of {ad:?} and {bd:?}: batch dimensions do not broadcast"
                ));
            }
        });
    }
    let count: usize = batch.iter().product();
    let side = |t: &Tensor, r: usize, c: usize| -> R<Tensor> {
        let mut full = batch.clone();
        full.extend([r, c]);
        t.broadcast_as(full)
            .and_then(|t| t.contiguous())
            .and_then(|t| t.reshape((count, r, c)))
            .map_err(ce)
    };
    let y = side(a, m, k)?.matmul(&side(b, k, n)?).map_err(ce)?;
    let mut out = batch;
    out.extend([m, n]);
    y.reshape(out).map_err(ce)
}

impl Interpreter<'_> {
    pub(super) fn exec(&self, op: &Op, env: &Map<String, V>) -> R<Vec<V>> {
        let get = |k: &str| -> R<V> {
            self.arg(op, env, k)?
                .ok_or_else(|| format!("missing input `{k}`"))
        };
        let opt = |k: &str| -> R<Option<V>> { self.arg(op, env, k) };
        // The float input `x` of an op Core ML defines on floats only; the
        // ops that also take int32 (abs, square, reductions) look first.
        let x = || {
            let v = get("x")?;
            if v.tensor()?.dtype().is_int() {
                return Err(format!(
                    "an integer `x`: Core ML defines `{}` on fp16 and fp32 only",
                    op.kind
                ));
            }
            f32t(&v)
        };
        let int_x = || -> R<Option<Tensor>> {
            let v = get("x")?;
            let t = v.tensor()?;
            Ok(t.dtype().is_int().then(|| t.clone()))
        };
        let one = |t: Tensor| Ok(vec![V::T(t)]);
        match op.kind.as_str() {
            "const" => {
                let v = op.attributes.get("val").ok_or("const without `val`")?;
                let stored = op
                    .outputs
                    .first()
                    .is_some_and(|o| self.fp16_weights.contains(o.name.as_str()));
                Ok(vec![if stored {
                    self.stored_fp16(v)?
                } else {
                    self.constant(v)?
                }])
            }
            "identity" => Ok(vec![get("x")?]),
            "add" | "sub" | "mul" | "real_div" | "maximum" | "minimum" | "pow" => {
                let (xv, yv) = (get("x")?, get("y")?);
                let int = |v: &V| v.tensor().is_ok_and(|t| t.dtype().is_int());
                if int(&xv) && int(&yv) {
                    return one(int32_binary(xv.tensor()?, yv.tensor()?, &op.kind)?);
                }
                let (a, b) = (f32t(&xv)?, f32t(&yv)?);
                if matches!(op.kind.as_str(), "add" | "sub" | "mul")
                    && let Some(t) = par_binary(&a, &b, op.kind.as_str())?
                {
                    return one(t);
                }
                let t = match op.kind.as_str() {
                    "add" => a.broadcast_add(&b),
                    "sub" => a.broadcast_sub(&b),
                    "mul" => a.broadcast_mul(&b),
                    "real_div" => a.broadcast_div(&b),
                    "maximum" => a.broadcast_maximum(&b),
                    "minimum" => a.broadcast_minimum(&b),
                    _ => a.broadcast_pow(&b),
                }
                .map_err(ce)?;
                one(t)
            }
            "sqrt" => one(x()?.sqrt().map_err(ce)?),
            "rsqrt" => {
                let eps = opt("epsilon")?
                    .map(|v| scalar_f(&v))
                    .transpose()?
                    .unwrap_or(1e-12);
                one((x()? + f64::from(eps))
                    .and_then(|t| t.sqrt())
                    .and_then(|t| t.recip())
                    .map_err(ce)?)
            }
            "exp" => one(x()?.exp().map_err(ce)?),
            "abs" | "square" => {
                let abs = op.kind == "abs";
                match int_x()? {
                    Some(t) => one(int32_binary(&t, &t, if abs { "abs" } else { "mul" })?),
                    None if abs => one(x()?.abs().map_err(ce)?),
                    None => one(x()?.sqr().map_err(ce)?),
                }
            }
            "log" => {
                // log(x + epsilon); coremltools' default epsilon is 1e-45.
                let eps = opt("epsilon")?
                    .map(|v| scalar_f(&v))
                    .transpose()?
                    .unwrap_or(1e-45);
                one((x()? + f64::from(eps)).and_then(|t| t.log()).map_err(ce)?)
            }
            "erf" => one(x()?.erf().map_err(ce)?),
            "inverse" => {
                let eps = opt("epsilon")?
                    .map(|v| scalar_f(&v))
                    .transpose()?
                    .unwrap_or(1e-4);
                one((x()? + f64::from(eps))
                    .and_then(|t| t.recip())
                    .map_err(ce)?)
            }
            "clip" => {
                let (lo, hi) = (scalar_f(&get("alpha")?)?, scalar_f(&get("beta")?)?);
                one(x()?.clamp(lo, hi).map_err(ce)?)
            }
            "tanh" => one(x()?.tanh().map_err(ce)?),
            // 1 / (1 + e^(-x)) with the interpreter's own vectorised exp, over all cores.
            "sigmoid" => one(kernel_unary(&x()?, super::kernels::sigmoid)?),
            "relu" => one(x()?.relu().map_err(ce)?),
            // x / (1 + e^(-x)) with the interpreter's own vectorised exp, over all cores.
            "silu" => one(kernel_unary(&x()?, super::kernels::silu)?),
            "gelu" => {
                let mode = match opt("mode")? {
                    Some(V::S(s)) => s,
                    _ => "EXACT".to_string(),
                };
                let t = x()?;
                // MIL's definitions, in f32, over all cores.
                one(match mode.as_str() {
                    // 0.5 x (1 + erf(x / sqrt 2)), with erfc where erf nears -1
                    // (within 16 ulp of the exact function of the f32 x / sqrt 2).
                    "EXACT" => kernel_unary(&t, super::kernels::gelu_erf)?,
                    // 0.5 x (1 + tanh(u)) = x / (1 + e^(-2u)), with the
                    // interpreter's own vectorised exp (within 1.25 ulp).
                    "TANH_APPROXIMATION" => kernel_unary(&t, super::kernels::gelu_tanh)?,
                    "SIGMOID_APPROXIMATION" => par_unary(&t, |x| x / (1.0 + (-1.702 * x).exp()))?,
                    m => return Err(format!("gelu mode `{m}` is not supported")),
                })
            }
            "softmax" => {
                let t = x()?;
                let ax = axis(
                    opt("axis")?
                        .map(|v| ints(&v))
                        .transpose()?
                        .and_then(|v| v.first().copied())
                        .unwrap_or(-1),
                    t.rank(),
                )?;
                if ax + 1 == t.rank() {
                    // The last axis: rows in parallel (the kernel attention chains use).
                    let len = t.dims()[ax];
                    let y =
                        super::with_f32(&t, |v| super::fast::softmax_rows(v, len)).map_err(ce)?;
                    return one(Tensor::from_vec(y, t.dims(), &Device::Cpu).map_err(ce)?);
                }
                let m = t.max_keepdim(ax).map_err(ce)?;
                let e = t.broadcast_sub(&m).and_then(|d| d.exp()).map_err(ce)?;
                let s = e.sum_keepdim(ax).map_err(ce)?;
                one(e.broadcast_div(&s).map_err(ce)?)
            }
            "layer_norm" => {
                let t = x()?;
                let axes = match opt("axes")? {
                    Some(v) => ints(&v)?,
                    None => vec![-1],
                };
                let eps = opt("epsilon")?
                    .map(|v| scalar_f(&v))
                    .transpose()?
                    .unwrap_or(1e-5);
                let mut axes = axes
                    .iter()
                    .map(|&a| axis(a, t.rank()))
                    .collect::<R<Vec<_>>>()?;
                axes.sort_unstable();
                if let [a] = axes[..] {
                    // One axis: the kernel, over [outer, axis, inner].
                    let dims = t.dims();
                    let split = (
                        dims[..a].iter().product(),
                        dims[a],
                        dims[a + 1..].iter().product(),
                    );
                    let param = |v: Option<V>| -> R<Option<Vec<f32>>> {
                        v.map(|v| {
                            let p = f32t(&v)?;
                            if p.elem_count() != dims[a] {
                                return Err(format!(
                                    "gamma/beta of {} values for an axis of {}",
                                    p.elem_count(),
                                    dims[a]
                                ));
                            }
                            p.flatten_all().and_then(|f| f.to_vec1::<f32>()).map_err(ce)
                        })
                        .transpose()
                    };
                    let (g, b) = (param(opt("gamma")?)?, param(opt("beta")?)?);
                    let y = super::with_f32(&t, |v| {
                        super::fast::layer_norm_axis(v, split, g.as_deref(), b.as_deref(), eps)
                    })
                    .map_err(ce)?;
                    return one(Tensor::from_vec(y, dims, &Device::Cpu).map_err(ce)?);
                }
                let mean = t.mean_keepdim(axes.clone()).map_err(ce)?;
                let d = t.broadcast_sub(&mean).map_err(ce)?;
                let var = d
                    .sqr()
                    .and_then(|s| s.mean_keepdim(axes.clone()))
                    .map_err(ce)?;
                let mut y = d
                    .broadcast_div(&(var + f64::from(eps)).and_then(|v| v.sqrt()).map_err(ce)?)
                    .map_err(ce)?;
                // gamma/beta have the shape of the normalised axes.
                let param_shape: Vec<usize> = (0..t.rank())
                    .map(|i| if axes.contains(&i) { t.dims()[i] } else { 1 })
                    .collect();
                if let Some(g) = opt("gamma")? {
                    y = y
                        .broadcast_mul(&f32t(&g)?.reshape(param_shape.clone()).map_err(ce)?)
                        .map_err(ce)?;
                }
                if let Some(b) = opt("beta")? {
                    y = y
                        .broadcast_add(&f32t(&b)?.reshape(param_shape).map_err(ce)?)
                        .map_err(ce)?;
                }
                one(y)
            }
            "reduce_mean" | "reduce_sum" | "reduce_max" => {
                let int = int_x()?;
                if int.is_some() && op.kind == "reduce_mean" {
                    return Err(
                        "reduce_mean of an integer tensor: its rounding is not implemented".into(),
                    );
                }
                let t = match int {
                    Some(t) => t,
                    None => x()?,
                };
                let is_int = t.dtype().is_int();
                let keep = opt("keep_dims")?
                    .map(|v| boolean(&v))
                    .transpose()?
                    .unwrap_or(false);
                let mut axes = match opt("axes")? {
                    Some(v) => ints(&v)?
                        .iter()
                        .map(|&a| axis(a, t.rank()))
                        .collect::<R<Vec<_>>>()?,
                    None => (0..t.rank()).collect(),
                };
                axes.sort_unstable();
                let mut y = t;
                for &a in axes.iter().rev() {
                    y = match op.kind.as_str() {
                        "reduce_mean" => y.mean_keepdim(a),
                        "reduce_sum" => y.sum_keepdim(a),
                        _ => y.max_keepdim(a),
                    }
                    .map_err(ce)?;
                }
                if is_int
                    && let Some(v) = y
                        .flatten_all()
                        .and_then(|f| f.to_vec1::<i64>())
                        .map_err(ce)?
                        .into_iter()
                        .find(|v| i32::try_from(*v).is_err())
                {
                    return Err(format!(
                        "{} of an int32 tensor: the result {v} is outside int32's range",
                        op.kind
                    ));
                }
                if !keep {
                    for &a in axes.iter().rev() {
                        y = y.squeeze(a).map_err(ce)?;
                    }
                }
                one(y)
            }
            "reshape" => {
                let t = get("x")?.tensor()?.clone();
                let shape = ints(&get("shape")?)?;
                one(t.reshape(reshape_dims(t.dims(), &shape)?).map_err(ce)?)
            }
            "transpose" => {
                let t = get("x")?.tensor()?.clone();
                let perm = ints(&get("perm")?)?
                    .iter()
                    .map(|&a| axis(a, t.rank()))
                    .collect::<R<Vec<_>>>()?;
                one(t.permute(perm).and_then(|p| p.contiguous()).map_err(ce)?)
            }
            "expand_dims" => {
                let mut t = get("x")?.tensor()?.clone();
                let out_rank = t.rank() + ints(&get("axes")?)?.len();
                let mut axes = ints(&get("axes")?)?
                    .iter()
                    .map(|&a| axis(a, out_rank))
                    .collect::<R<Vec<_>>>()?;
                axes.sort_unstable();
                for a in axes {
                    t = t.unsqueeze(a).map_err(ce)?;
                }
                one(t)
            }
            "squeeze" => {
                let t = get("x")?.tensor()?.clone();
                let mut axes = match opt("axes")? {
                    Some(v) => ints(&v)?
                        .iter()
                        .map(|&a| axis(a, t.rank()))
                        .collect::<R<Vec<_>>>()?,
                    None => (0..t.rank()).filter(|&i| t.dims()[i] == 1).collect(),
                };
                axes.sort_unstable();
                let mut y = t;
                for &a in axes.iter().rev() {
                    y = y.squeeze(a).map_err(ce)?;
                }
                one(y)
            }
            "concat" => {
                let vals = op.inputs.get("values").ok_or("missing input `values`")?;
                let ts = vals
                    .iter()
                    .map(|a| self.resolve(a, env).and_then(|v| v.tensor().cloned()))
                    .collect::<R<Vec<_>>>()?;
                let ax = axis(
                    ints(&get("axis")?)?.first().copied().unwrap_or(0),
                    ts.first().map_or(1, Tensor::rank),
                )?;
                if opt("interleave")?
                    .map(|v| boolean(&v))
                    .transpose()?
                    .unwrap_or(false)
                {
                    // Slices taken in turn from each input along `axis`:
                    // out[.., i * k + j, ..] = values[j][.., i, ..].
                    let first = ts.first().ok_or("concat of no values")?;
                    if ts.iter().any(|t| t.dims() != first.dims()) {
                        return Err("concat with interleave needs inputs of one shape".into());
                    }
                    let mut dims = first.dims().to_vec();
                    dims[ax] *= ts.len();
                    return one(Tensor::stack(&ts, ax + 1)
                        .and_then(|t| t.reshape(dims))
                        .map_err(ce)?);
                }
                one(Tensor::cat(&ts, ax).map_err(ce)?)
            }
            "gather" => {
                // out = x.shape[:axis] + indices.shape + x.shape[axis+1:]; negative indices wrap.
                let t = get("x")?.tensor()?.clone();
                if opt("batch_dims")?
                    .map(|v| ints(&v))
                    .transpose()?
                    .and_then(|v| v.first().copied())
                    .unwrap_or(0)
                    != 0
                {
                    return Err("gather with batch_dims != 0 is not supported".into());
                }
                let iv = get("indices")?;
                let ishape = iv.tensor()?.dims().to_vec();
                let ax = axis(
                    opt("axis")?
                        .map(|v| ints(&v))
                        .transpose()?
                        .and_then(|v| v.first().copied())
                        .unwrap_or(0),
                    t.rank(),
                )?;
                let n = t.dims()[ax] as i64;
                let idx = ints(&iv)?
                    .into_iter()
                    .map(|i| {
                        let j = if i < 0 { i + n } else { i };
                        if (0..n).contains(&j) {
                            Ok(j as u32)
                        } else {
                            Err(format!("gather index {i} out of range for axis of {n}"))
                        }
                    })
                    .collect::<R<Vec<u32>>>()?;
                let len = idx.len();
                let idx = Tensor::from_vec(idx, len, &Device::Cpu).map_err(ce)?;
                let y = t.index_select(&idx, ax).map_err(ce)?;
                let mut shape = t.dims()[..ax].to_vec();
                shape.extend(ishape);
                shape.extend(&t.dims()[ax + 1..]);
                one(y.reshape(shape).map_err(ce)?)
            }
            "split" => {
                let t = get("x")?.tensor()?.clone();
                let ax = axis(ints(&get("axis")?)?.first().copied().unwrap_or(0), t.rank())?;
                let sizes: Vec<usize> = match (opt("split_sizes")?, opt("num_splits")?) {
                    (Some(s), _) => ints(&s)?.iter().map(|&v| v as usize).collect(),
                    (None, Some(n)) => {
                        let n = ints(&n)?.first().copied().unwrap_or(1).max(1) as usize;
                        vec![t.dims()[ax] / n; n]
                    }
                    _ => return Err("split needs split_sizes or num_splits".into()),
                };
                let mut start = 0;
                let mut out = Vec::new();
                for s in sizes {
                    out.push(V::T(
                        t.narrow(ax, start, s)
                            .and_then(|p| p.contiguous())
                            .map_err(ce)?,
                    ));
                    start += s;
                }
                Ok(out)
            }
            "slice_by_index" => {
                let t = get("x")?.tensor()?.clone();
                let r = t.rank();
                get("begin")?;
                get("end")?;
                let SliceArgs {
                    begin,
                    end,
                    stride,
                    begin_mask: bm,
                    end_mask: em,
                    squeeze_mask: sm,
                } = SliceArgs::read(&|k| opt(k)?.map(|v| ints(&v)).transpose(), r)?;
                let mut y = t;
                for d in 0..r {
                    let n = y.dims()[d] as i64;
                    let s = stride[d];
                    // numpy's (and MIL's) rules: a negative stride walks down
                    // from `begin` (default n - 1) to just above `end`
                    // (default: past the start).
                    let (b, len) = if s > 0 {
                        let norm = |v: i64| if v < 0 { (v + n).max(0) } else { v.min(n) };
                        let b = if bm[d] { 0 } else { norm(begin[d]) };
                        let e = if em[d] { n } else { norm(end[d]) };
                        (b, ((e - b).max(0) + s - 1) / s)
                    } else if s < 0 {
                        let norm = |v: i64| (if v < 0 { v + n } else { v }).clamp(-1, n - 1);
                        let b = if bm[d] { n - 1 } else { norm(begin[d]) };
                        let e = if em[d] { -1 } else { norm(end[d]) };
                        (b, ((b - e).max(0) - s - 1) / -s)
                    } else {
                        return Err(format!("stride 0 on axis {d}"));
                    };
                    if s == 1 {
                        y = y.narrow(d, b as usize, len as usize).map_err(ce)?;
                    } else {
                        let idx: Vec<u32> = (0..len).map(|i| (b + i * s) as u32).collect();
                        let idx = Tensor::from_vec(idx, len as usize, &Device::Cpu).map_err(ce)?;
                        y = y
                            .contiguous()
                            .and_then(|c| c.index_select(&idx, d))
                            .map_err(ce)?;
                    }
                }
                for d in (0..r).rev() {
                    if sm[d] {
                        y = y.squeeze(d).map_err(ce)?;
                    }
                }
                one(y.contiguous().map_err(ce)?)
            }
            "cast" => {
                let t = get("x")?.tensor()?.clone();
                let dtype = match get("dtype")? {
                    V::S(s) => s,
                    _ => return Err("cast dtype must be a string".into()),
                };
                one(match dtype.as_str() {
                    // Float casts keep f32 values; fp16 mode rounds every float output.
                    "fp16" | "fp32" | "fp64" => t.to_dtype(CDType::F32),
                    "int32" | "int64" | "int16" | "int8" | "uint8" | "uint16" => t
                        .to_dtype(CDType::F32)
                        .and_then(|f| f.to_dtype(CDType::I64)),
                    "bool" => t.to_dtype(CDType::F32).and_then(|f| f.ne(0.0)),
                    other => return Err(format!("cast to `{other}` is not supported")),
                }
                .map_err(ce)?)
            }
            "linear" => {
                let t = x()?;
                let w = f32t(&get("weight")?)?;
                let mut y = t.broadcast_matmul(&w.t().map_err(ce)?).map_err(ce)?;
                if let Some(b) = opt("bias")? {
                    y = y.broadcast_add(&f32t(&b)?).map_err(ce)?;
                }
                one(y)
            }
            "matmul" => {
                let mut a = f32t(&get("x")?)?;
                let mut b = f32t(&get("y")?)?;
                if opt("transpose_x")?
                    .map(|v| boolean(&v))
                    .transpose()?
                    .unwrap_or(false)
                {
                    a = a.t().map_err(ce)?;
                }
                if opt("transpose_y")?
                    .map(|v| boolean(&v))
                    .transpose()?
                    .unwrap_or(false)
                {
                    b = b.t().map_err(ce)?;
                }
                let (a1, b1) = (a.rank() == 1, b.rank() == 1);
                let a = if a1 { a.unsqueeze(0).map_err(ce)? } else { a };
                let b = if b1 { b.unsqueeze(1).map_err(ce)? } else { b };
                let mut y = batched_matmul(&a, &b)?;
                if a1 {
                    y = y.squeeze(y.rank() - 2).map_err(ce)?;
                }
                if b1 {
                    y = y.squeeze(y.rank() - 1).map_err(ce)?;
                }
                one(y)
            }
            "conv" => self.conv(op, env).map(|t| vec![V::T(t)]),
            "constexpr_affine_dequantize" => {
                let q = f32t(&get("quantized_data")?)?;
                let zp = f32t(&get("zero_point")?)?;
                let scale = f32t(&get("scale")?)?;
                let ax = axis(ints(&get("axis")?)?.first().copied().unwrap_or(0), q.rank())?;
                let shape: Vec<usize> = (0..q.rank())
                    .map(|i| if i == ax { q.dims()[i] } else { 1 })
                    .collect();
                let fit = |p: Tensor| {
                    if p.elem_count() == 1 {
                        p.reshape(vec![1; q.rank()])
                    } else {
                        p.reshape(shape.clone())
                    }
                };
                one(q
                    .broadcast_sub(&fit(zp).map_err(ce)?)
                    .and_then(|d| d.broadcast_mul(&fit(scale)?))
                    .map_err(ce)?)
            }
            "constexpr_blockwise_shift_scale" => {
                let data = f32t(&get("data")?)?;
                let scale = f32t(&get("scale")?)?;
                let off = opt("offset")?.map(|v| f32t(&v)).transpose()?;
                let expand = |p: &Tensor| -> R<Tensor> {
                    // Each scale entry covers a block of data along each axis.
                    let mut p = p.clone();
                    for d in 0..data.rank() {
                        let block = data.dims()[d] / p.dims()[d].max(1);
                        if block > 1 {
                            let idx: Vec<u32> =
                                (0..data.dims()[d]).map(|i| (i / block) as u32).collect();
                            let idx =
                                Tensor::from_vec(idx, data.dims()[d], &Device::Cpu).map_err(ce)?;
                            p = p.index_select(&idx, d).map_err(ce)?;
                        }
                    }
                    Ok(p)
                };
                let mut y = data.clone();
                if let Some(o) = off {
                    y = y.sub(&expand(&o)?).map_err(ce)?;
                }
                one(y.mul(&expand(&scale)?).map_err(ce)?)
            }
            "constexpr_lut_to_dense" => {
                let idx = get("indices")?
                    .tensor()?
                    .to_dtype(CDType::I64)
                    .map_err(ce)?;
                let lut = f32t(&get("lut")?)?;
                if let Some(shape) = opt("shape")? {
                    // iOS16: one palette of 2^nbits entries, the indices
                    // packed LSB first into bytes, and the output's shape.
                    return one(lut_ios16(&lut, &idx, &ints(&shape)?)?);
                }
                // iOS18: lut [block counts per axis of indices..., palette,
                // vector_size]; a vector palette (vector_size > 1) writes
                // each entry's values along `vector_axis`.
                let r = idx.rank();
                if lut.rank() != r + 2 {
                    return Err(format!(
                        "lut of shape {:?} for indices of rank {r}: expected rank {}",
                        lut.dims(),
                        r + 2
                    ));
                }
                let vs = lut.dims()[r + 1];
                if vs > 1 {
                    let va = match opt("vector_axis")? {
                        Some(v) => axis(ints(&v)?.first().copied().unwrap_or(0), r)?,
                        None => return Err("a vector palette needs `vector_axis`".into()),
                    };
                    return one(lut_vectors(&lut, &idx, va)?);
                }
                let dims = idx.dims().to_vec();
                let iv = idx
                    .flatten_all()
                    .and_then(|f| f.to_vec1::<i64>())
                    .map_err(ce)?;
                let lv = lut
                    .flatten_all()
                    .and_then(|f| f.to_vec1::<f32>())
                    .map_err(ce)?;
                let palette = lut.dims()[r];
                let blocks: Vec<usize> = (0..r).map(|d| dims[d] / lut.dims()[d].max(1)).collect();
                let mut out = Vec::with_capacity(iv.len());
                let mut coord = vec![0usize; r];
                for &i in &iv {
                    let mut li = 0usize;
                    for d in 0..r {
                        li = li * lut.dims()[d] + coord[d] / blocks[d].max(1);
                    }
                    let k = usize::try_from(i)
                        .ok()
                        .filter(|&k| k < palette)
                        .ok_or_else(|| format!("palette index {i} out of range"))?;
                    out.push(lv[li * palette + k]);
                    for d in (0..r).rev() {
                        coord[d] += 1;
                        if coord[d] < dims[d] {
                            break;
                        }
                        coord[d] = 0;
                    }
                }
                one(Tensor::from_vec(out, dims, &Device::Cpu).map_err(ce)?)
            }
            other => Err(format!("op `{other}` is not supported")),
        }
    }

    /// `conv` for rank-4 inputs (N, C, H, W) with valid, same or custom padding.
    /// Whether a rank-4 `conv` is a 1x1 convolution with unit strides, no
    /// padding and one group: a matrix product over channels, column by
    /// column ([`super::fast::conv1x1`]).
    pub(super) fn conv_is_pointwise(&self, op: &Op, env: &Map<String, V>) -> R<bool> {
        let get = |k: &str| -> R<Option<V>> { self.arg(op, env, k) };
        let w = get("weight")?.ok_or("missing input `weight`")?;
        let wd = w.tensor()?.dims().to_vec();
        let ones = |k: &str| -> R<bool> {
            Ok(get(k)?
                .map(|v| ints(&v))
                .transpose()?
                .is_none_or(|v| v.iter().all(|&x| x == 1)))
        };
        let pads_zero = match get("pad_type")? {
            None => true,
            Some(V::S(s)) if matches!(s.as_str(), "valid" | "same" | "same_lower") => true,
            Some(V::S(s)) if s == "custom" => get("pad")?
                .map(|v| ints(&v))
                .transpose()?
                .is_none_or(|p| p.iter().all(|&v| v == 0)),
            _ => false,
        };
        Ok(wd.len() == 4
            && wd[2] == 1
            && wd[3] == 1
            && ones("strides")?
            && ones("groups")?
            && pads_zero)
    }

    fn conv(&self, op: &Op, env: &Map<String, V>) -> R<Tensor> {
        let get = |k: &str| -> R<Option<V>> { self.arg(op, env, k) };
        let x = f32t(&get("x")?.ok_or("missing input `x`")?)?;
        // Weights stay fp16 when the interpreter keeps them as stored
        // (`fp16_conv_weights`); the 1x1 product widens them as it goes,
        // every other path takes them as f32.
        let w = get("weight")?
            .ok_or("missing input `weight`")?
            .tensor()?
            .clone();
        let w32 = || f32t(&V::T(w.clone()));
        if x.rank() != w.rank() || !(3..=5).contains(&x.rank()) {
            return Err(format!(
                "conv on rank {} input with rank {} weight: expected 1-D, 2-D or 3-D convolution \
                 (input and weight of one rank, 3 to 5)",
                x.rank(),
                w.rank()
            ));
        }
        if x.rank() != 4 {
            return self.conv_nd(op, env, &x, &w32()?);
        }
        let pair = |k: &str| -> R<[usize; 2]> {
            Ok(match get(k)? {
                Some(v) => {
                    let v = ints(&v)?;
                    [
                        v.first().copied().unwrap_or(1) as usize,
                        v.get(1).copied().unwrap_or(1) as usize,
                    ]
                }
                None => [1, 1],
            })
        };
        let strides = pair("strides")?;
        let dil = pair("dilations")?;
        let groups = get("groups")?
            .map(|v| ints(&v))
            .transpose()?
            .and_then(|v| v.first().copied())
            .unwrap_or(1) as usize;
        let pad_type = match get("pad_type")? {
            Some(V::S(s)) => s,
            _ => "valid".into(),
        };
        if strides[0] != strides[1] || dil[0] != dil[1] {
            // Per-axis strides or dilations: the general path.
            return self.conv_nd(op, env, &x, &w32()?);
        }
        let (kh, kw) = (w.dims()[2], w.dims()[3]);
        // A 1x1 conv with unit stride and no padding is a matrix product over
        // channels: [O, C] x [C, H*W] (the ANE layout's Linear, R2).
        let pads_zero = match pad_type.as_str() {
            "valid" | "same" | "same_lower" => true,
            "custom" => get("pad")?
                .map(|v| ints(&v))
                .transpose()?
                .is_none_or(|p| p.iter().all(|&v| v == 0)),
            _ => false,
        };
        if (kh, kw) == (1, 1) && strides == [1, 1] && groups == 1 && pads_zero {
            let (n, c, h, wd) = x.dims4().map_err(ce)?;
            let o = w.dims()[0];
            if w.dims()[1] != c {
                return Err(format!(
                    "weight {:?} does not fit an input of {c} channels",
                    w.dims()
                ));
            }
            let bias = get("bias")?
                .map(|b| {
                    let b = f32t(&b)?;
                    if b.elem_count() != o {
                        return Err(format!("bias of {} values for {o} outputs", b.elem_count()));
                    }
                    b.flatten_all().and_then(|f| f.to_vec1::<f32>()).map_err(ce)
                })
                .transpose()?;
            let y = super::with_f32(&x, |xv| {
                let conv = |wv: super::fast::ConvWeights<'_>| {
                    super::fast::conv1x1(xv, (n, c, h * wd), wv, o, bias.as_deref())
                };
                match super::with_f16(&w, |wv| conv(super::fast::ConvWeights::F16(wv))) {
                    Some(y) => Ok(y),
                    None => super::with_f32(&w, |wv| conv(super::fast::ConvWeights::F32(wv))),
                }
            })
            .and_then(|r| r)
            .map_err(ce)?;
            return Tensor::from_vec(y, (n, o, h, wd), &Device::Cpu).map_err(ce);
        }
        let (h, wd) = (x.dims()[2], x.dims()[3]);
        // [top, bottom, left, right]
        let pads: [usize; 4] = match pad_type.as_str() {
            "valid" => [0; 4],
            "custom" => {
                let p = ints(&get("pad")?.ok_or("custom padding needs `pad`")?)?;
                if p.len() != 4 || p.iter().any(|&v| v < 0) {
                    return Err(format!("pad {p:?}: expected 4 non-negative values"));
                }
                [p[0] as usize, p[1] as usize, p[2] as usize, p[3] as usize]
            }
            "same" | "same_lower" => {
                let total = |n: usize, k: usize, s: usize, d: usize| {
                    let out = n.div_ceil(s);
                    ((out - 1) * s + (k - 1) * d + 1).saturating_sub(n)
                };
                let (th, tw) = (
                    total(h, kh, strides[0], dil[0]),
                    total(wd, kw, strides[1], dil[1]),
                );
                if pad_type == "same" {
                    [th / 2, th - th / 2, tw / 2, tw - tw / 2]
                } else {
                    [th - th / 2, th / 2, tw - tw / 2, tw / 2]
                }
            }
            other => return Err(format!("pad_type `{other}` is not supported")),
        };
        let x = x
            .pad_with_zeros(2, pads[0], pads[1])
            .and_then(|t| t.pad_with_zeros(3, pads[2], pads[3]))
            .map_err(ce)?;
        let mut y = x
            .conv2d(&w32()?, 0, strides[0], dil[0], groups)
            .map_err(ce)?;
        if let Some(b) = get("bias")? {
            let b = f32t(&b)?;
            y = y
                .broadcast_add(&b.reshape((1, b.elem_count(), 1, 1)).map_err(ce)?)
                .map_err(ce)?;
        }
        Ok(y)
    }

    /// `conv` over 1, 2 or 3 spatial axes with per-axis strides, dilations
    /// and padding (valid, same, same_lower, custom), as an explicit
    /// gather of each output's window and a product with the weights per
    /// group. The general path: the tower's convs take the faster ones.
    fn conv_nd(&self, op: &Op, env: &Map<String, V>, x: &Tensor, w: &Tensor) -> R<Tensor> {
        let get = |k: &str| -> R<Option<V>> { self.arg(op, env, k) };
        let nd = x.rank() - 2;
        let (xd, wd) = (x.dims().to_vec(), w.dims().to_vec());
        let per_axis = |k: &str| -> R<Vec<usize>> {
            match get(k)? {
                Some(v) => {
                    let v = ints(&v)?;
                    if v.len() != nd || v.iter().any(|&s| s < 1) {
                        return Err(format!("{k} {v:?}: expected {nd} positive values"));
                    }
                    Ok(v.iter().map(|&s| s as usize).collect())
                }
                None => Ok(vec![1; nd]),
            }
        };
        let (strides, dil) = (per_axis("strides")?, per_axis("dilations")?);
        let groups = get("groups")?
            .map(|v| ints(&v))
            .transpose()?
            .and_then(|v| v.first().copied())
            .unwrap_or(1)
            .max(1) as usize;
        let (n, c, o) = (xd[0], xd[1], wd[0]);
        if c % groups != 0 || o % groups != 0 || wd[1] * groups != c {
            return Err(format!(
                "weight {wd:?} with {groups} groups does not fit an input of {c} channels"
            ));
        }
        let k: Vec<usize> = wd[2..].to_vec();
        let pad_type = match get("pad_type")? {
            Some(V::S(s)) => s,
            _ => "valid".into(),
        };
        // (before, after) per spatial axis.
        let pads: Vec<(usize, usize)> = match pad_type.as_str() {
            "valid" => vec![(0, 0); nd],
            "custom" => {
                let p = ints(&get("pad")?.ok_or("custom padding needs `pad`")?)?;
                if p.len() != 2 * nd || p.iter().any(|&v| v < 0) {
                    return Err(format!(
                        "pad {p:?}: expected {} non-negative values",
                        2 * nd
                    ));
                }
                (0..nd)
                    .map(|i| (p[2 * i] as usize, p[2 * i + 1] as usize))
                    .collect()
            }
            "same" | "same_lower" => (0..nd)
                .map(|i| {
                    let out = xd[2 + i].div_ceil(strides[i]);
                    let t = ((out - 1) * strides[i] + (k[i] - 1) * dil[i] + 1)
                        .saturating_sub(xd[2 + i]);
                    if pad_type == "same" {
                        (t / 2, t - t / 2)
                    } else {
                        (t - t / 2, t / 2)
                    }
                })
                .collect(),
            other => return Err(format!("pad_type `{other}` is not supported")),
        };
        let mut xp = x.clone();
        for (i, &(b, a)) in pads.iter().enumerate() {
            xp = xp.pad_with_zeros(2 + i, b, a).map_err(ce)?;
        }
        let sp: Vec<usize> = xp.dims()[2..].to_vec();
        let mut out_sp = Vec::with_capacity(nd);
        for i in 0..nd {
            let span = (k[i] - 1) * dil[i] + 1;
            if sp[i] < span {
                return Err(format!(
                    "conv window of {span} on axis {} of {} (padded): no output",
                    2 + i,
                    sp[i]
                ));
            }
            out_sp.push((sp[i] - span) / strides[i] + 1);
        }
        let xv = xp
            .flatten_all()
            .and_then(|f| f.to_vec1::<f32>())
            .map_err(ce)?;
        let wv = w
            .flatten_all()
            .and_then(|f| f.to_vec1::<f32>())
            .map_err(ce)?;
        let (cg, og) = (c / groups, o / groups);
        let ksize: usize = k.iter().product();
        let osize: usize = out_sp.iter().product();
        let isize: usize = sp.iter().product();
        // Row-major offsets of an index within a shape.
        let offset = |idx: &[usize], shape: &[usize]| {
            idx.iter()
                .zip(shape)
                .fold(0usize, |acc, (&i, &s)| acc * s + i)
        };
        let unravel = |mut f: usize, shape: &[usize]| {
            let mut v = vec![0usize; shape.len()];
            for d in (0..shape.len()).rev() {
                v[d] = f % shape[d];
                f /= shape[d];
            }
            v
        };
        let mut y = vec![0f32; n * o * osize];
        let mut col = vec![0f32; cg * ksize];
        let mut pos = vec![0usize; nd];
        for b in 0..n {
            for op_i in 0..osize {
                let oi = unravel(op_i, &out_sp);
                for g in 0..groups {
                    for ci in 0..cg {
                        for kk in 0..ksize {
                            let ki = unravel(kk, &k);
                            for d in 0..nd {
                                pos[d] = oi[d] * strides[d] + ki[d] * dil[d];
                            }
                            col[ci * ksize + kk] =
                                xv[(b * c + g * cg + ci) * isize + offset(&pos, &sp)];
                        }
                    }
                    for oc in 0..og {
                        let wrow = &wv[(g * og + oc) * cg * ksize..(g * og + oc + 1) * cg * ksize];
                        let acc: f32 = wrow.iter().zip(&col).map(|(a, b)| a * b).sum();
                        y[(b * o + g * og + oc) * osize + op_i] = acc;
                    }
                }
            }
        }
        let mut shape = vec![n, o];
        shape.extend(&out_sp);
        let mut y = Tensor::from_vec(y, shape, &Device::Cpu).map_err(ce)?;
        if let Some(bias) = get("bias")? {
            let bias = f32t(&bias)?;
            let mut bs = vec![1usize, bias.elem_count()];
            bs.extend(vec![1; nd]);
            y = y
                .broadcast_add(&bias.reshape(bs).map_err(ce)?)
                .map_err(ce)?;
        }
        Ok(y)
    }
}
