//! Ops over an axis: softmax, layer norm and the reductions.

use candle_core::{Device, Tensor};

use super::{Inputs, R, V, axis, boolean, ce, f32t, ints, one, scalar_f};
use crate::error::InterpError;

/// `softmax`, `layer_norm`, `reduce_mean`, `reduce_sum` and `reduce_max`.
pub(super) fn exec(ins: &Inputs) -> R<Vec<V>> {
    let op = ins.op;
    let opt = |k: &str| ins.opt(k);
    let x = || ins.x();
    let int_x = || ins.int_x();
    match op.kind.as_str() {
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
                let y = crate::interp::with_f32(&t, |v| crate::interp::fast::softmax_rows(v, len))
                    .map_err(ce)?;
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
                            return Err(invalid!(
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
                let y = crate::interp::with_f32(&t, |v| {
                    crate::interp::fast::layer_norm_axis(v, split, g.as_deref(), b.as_deref(), eps)
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
                return Err(unsupported!(
                    "reduce_mean of an integer tensor: its rounding is not implemented"
                ));
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
                return Err(InterpError::Int32ReduceOverflow {
                    kind: op.kind.clone(),
                    value: v,
                });
            }
            if !keep {
                for &a in axes.iter().rev() {
                    y = y.squeeze(a).map_err(ce)?;
                }
            }
            one(y)
        }
        other => Err(internal!("op `{other}` is not supported")),
    }
}

/// `reduce_sum` of `x` accumulated in fp16, one value after another, each
/// partial sum rounded (ane mode): ANEForge measures reduce_sum summing
/// narrow where matmul sums wide ([A] docs/developer/numerics.md "The
/// reduce_sum trap"; docs/numeric-cliffs.md "Integer reduction exactness":
/// exact to 2048, 2049 reads back 2050). The order of the sum over several
/// axes is not published: here the reduced values in row-major order.
pub(super) fn narrow_sum(ins: &Inputs, x: &Tensor) -> R<Tensor> {
    use rayon::prelude::*;
    let keep = ins
        .opt("keep_dims")?
        .map(|v| boolean(&v))
        .transpose()?
        .unwrap_or(false);
    let rank = x.rank();
    let mut axes = match ins.opt("axes")? {
        Some(v) => ints(&v)?
            .iter()
            .map(|&a| axis(a, rank))
            .collect::<R<Vec<_>>>()?,
        None => (0..rank).collect(),
    };
    axes.sort_unstable();
    axes.dedup();
    let dims = x.dims();
    let kept: Vec<usize> = (0..rank).filter(|d| !axes.contains(d)).collect();
    let order: Vec<usize> = kept.iter().chain(&axes).copied().collect();
    let inner: usize = axes.iter().map(|&a| dims[a]).product();
    let v = x
        .permute(order)
        .and_then(|t| t.flatten_all())
        .and_then(|t| t.to_vec1::<f32>())
        .map_err(ce)?;
    let out: Vec<f32> = if inner == 0 {
        vec![0.0; kept.iter().map(|&d| dims[d]).product()]
    } else {
        v.par_chunks(inner)
            .map(|row| {
                row.iter()
                    .fold(0f32, |s, &x| crate::interp::round_to_f16(s + x))
            })
            .collect()
    };
    let shape: Vec<usize> = (0..rank)
        .filter_map(|d| match (axes.contains(&d), keep) {
            (false, _) => Some(dims[d]),
            (true, true) => Some(1),
            (true, false) => None,
        })
        .collect();
    Tensor::from_vec(out, shape, &Device::Cpu).map_err(ce)
}
