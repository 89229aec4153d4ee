//! Elementwise ops: broadcasting binaries (float, and exact int32), the
//! unary functions and `cast`.

use candle_core::{DType as CDType, Device, Tensor};

use super::{Inputs, R, V, ce, f32t, one, scalar_f};
use crate::error::InterpError;

/// `add`, `sub`, `mul`, `real_div`, `maximum`, `minimum` and `pow`.
pub(super) fn binary(ins: &Inputs) -> R<Vec<V>> {
    let op = ins.op;
    let get = |k: &str| ins.get(k);
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

/// The unary functions of one float input `x` (`abs` and `square` also of int32).
pub(super) fn unary(ins: &Inputs) -> R<Vec<V>> {
    let op = ins.op;
    let get = |k: &str| ins.get(k);
    let opt = |k: &str| ins.opt(k);
    let x = || ins.x();
    let int_x = || ins.int_x();
    match op.kind.as_str() {
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
        "sigmoid" => one(kernel_unary(&x()?, crate::interp::kernels::sigmoid)?),
        "relu" => one(x()?.relu().map_err(ce)?),
        // x / (1 + e^(-x)) with the interpreter's own vectorised exp, over all cores.
        "silu" => one(kernel_unary(&x()?, crate::interp::kernels::silu)?),
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
                "EXACT" => kernel_unary(&t, crate::interp::kernels::gelu_erf)?,
                // 0.5 x (1 + tanh(u)) = x / (1 + e^(-2u)), with the
                // interpreter's own vectorised exp (within 1.25 ulp).
                "TANH_APPROXIMATION" => kernel_unary(&t, crate::interp::kernels::gelu_tanh)?,
                "SIGMOID_APPROXIMATION" => par_unary(&t, |x| x / (1.0 + (-1.702 * x).exp()))?,
                m => return Err(unsupported!("gelu mode `{m}` is not supported")),
            })
        }
        other => Err(internal!("op `{other}` is not supported")),
    }
}

/// `cast`: float casts keep f32 values, integer ones truncate to i64.
pub(super) fn cast(ins: &Inputs) -> R<Vec<V>> {
    let get = |k: &str| ins.get(k);
    let t = get("x")?.tensor()?.clone();
    let dtype = match get("dtype")? {
        V::S(s) => s,
        _ => return Err(invalid!("cast dtype must be a string")),
    };
    one(match dtype.as_str() {
        // Float casts keep f32 values; fp16 mode rounds every float output.
        "fp16" | "fp32" | "fp64" => t.to_dtype(CDType::F32),
        "int32" | "int64" | "int16" | "int8" | "uint8" | "uint16" => t
            .to_dtype(CDType::F32)
            .and_then(|f| f.to_dtype(CDType::I64)),
        "bool" => t.to_dtype(CDType::F32).and_then(|f| f.ne(0.0)),
        other => return Err(unsupported!("cast to `{other}` is not supported")),
    }
    .map_err(ce)?)
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
        let out = crate::interp::with_f32(a, |va| {
            crate::interp::with_f32(b, |vb| {
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
        let out = crate::interp::with_f32(a, |va| {
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
        let out = crate::interp::with_f32(b, |vb| {
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
                    return Err(InterpError::DivisionByZero(x));
                }
                "real_div" => x.checked_div(y),
                "maximum" => Some(x.max(y)),
                "abs" => x.checked_abs(),
                "minimum" => Some(x.min(y)),
                _ if y < 0 => {
                    return Err(invalid!(
                        "pow of int32 {x} to the negative exponent {y}: not an integer"
                    ));
                }
                _ => u32::try_from(y).ok().and_then(|e| x.checked_pow(e)),
            };
            v.filter(|v| i32::try_from(*v).is_ok())
                .ok_or_else(|| InterpError::Int32Overflow {
                    kind: kind.to_string(),
                    x,
                    y,
                })
        })
        .collect::<R<Vec<i64>>>()?;
    Tensor::from_vec(out, shape, &Device::Cpu).map_err(ce)
}

/// One of the interpreter's elementwise kernels (`src/interp/kernels.rs`) on `t`.
fn kernel_unary(t: &Tensor, kernel: fn(&[f32]) -> Vec<f32>) -> R<Tensor> {
    let y = crate::interp::with_f32(t, kernel).map_err(ce)?;
    Tensor::from_vec(y, t.dims(), &Device::Cpu).map_err(ce)
}

/// An elementwise function over all cores.
fn par_unary(t: &Tensor, f: impl Fn(f32) -> f32 + Sync) -> R<Tensor> {
    use rayon::prelude::*;
    let out = crate::interp::with_f32(t, |v| {
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
