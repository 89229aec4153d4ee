//! Ops that move values: reshape, transpose, expand_dims, squeeze, concat,
//! gather, split and slice_by_index.

use candle_core::{Device, Tensor};

use super::{Inputs, R, V, axis, boolean, ce, ints, one};
use crate::error::InterpError;

/// The moves: their outputs hold their inputs' values, rearranged.
pub(super) fn exec(ins: &Inputs) -> R<Vec<V>> {
    let op = ins.op;
    let get = |k: &str| ins.get(k);
    let opt = |k: &str| ins.opt(k);
    match op.kind.as_str() {
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
            let vals = op
                .inputs
                .get("values")
                .ok_or_else(|| InterpError::MissingArg("values".into()))?;
            let ts = vals
                .iter()
                .map(|a| ins.it.resolve(a, ins.env).and_then(|v| v.tensor().cloned()))
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
                let first = ts.first().ok_or_else(|| invalid!("concat of no values"))?;
                if ts.iter().any(|t| t.dims() != first.dims()) {
                    return Err(invalid!("concat with interleave needs inputs of one shape"));
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
                return Err(unsupported!("gather with batch_dims != 0 is not supported"));
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
                        Err(invalid!("gather index {i} out of range for axis of {n}"))
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
                _ => return Err(invalid!("split needs split_sizes or num_splits")),
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
                    return Err(invalid!("stride 0 on axis {d}"));
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
        other => Err(internal!("op `{other}` is not supported")),
    }
}

/// The shape `reshape` gives `dims` for its `shape` input. A 0 copies a
/// dimension of `dims`, matched from the right (`shape[i]` with
/// `dims[rank - (len - i)]`; one out of range is 1), as iOS17's reshape
/// defines it; where `len == rank`, as iOS15 requires of a shape with a 0,
/// this is the dimension at the same index. A -1 takes what the others leave.
pub(in crate::interp) fn reshape_dims(dims: &[usize], shape: &[i64]) -> R<Vec<usize>> {
    let total: usize = dims.iter().product();
    let (k, rank) = (shape.len(), dims.len());
    if shape.iter().filter(|&&d| d == -1).count() > 1 {
        return Err(invalid!("reshape to {shape:?}: more than one -1"));
    }
    let mut out = Vec::with_capacity(k);
    for (i, &d) in shape.iter().enumerate() {
        out.push(match d {
            0 => (rank + i).checked_sub(k).map_or(1, |j| dims[j]),
            d if d > 0 => d as usize,
            -1 => 0,
            d => return Err(invalid!("reshape to {shape:?}: dimension {d}")),
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
            return Err(invalid!(
                "reshape of {dims:?} to {shape:?}: {total} elements do not divide into {known}"
            ));
        }
        out[i] = total / known;
    }
    if out.iter().product::<usize>() != total {
        return Err(invalid!(
            "reshape of {dims:?} to {shape:?} gives {out:?}, which does not hold {total} elements"
        ));
    }
    Ok(out)
}

/// `slice_by_index`'s integer inputs for a rank-`r` operand: `begin` and
/// `end` as given (empty if absent), `stride` 1 and the masks false where
/// absent.
pub(in crate::interp) struct SliceArgs {
    pub begin: Vec<i64>,
    pub end: Vec<i64>,
    pub stride: Vec<i64>,
    pub begin_mask: Vec<bool>,
    pub end_mask: Vec<bool>,
    pub squeeze_mask: Vec<bool>,
}

impl SliceArgs {
    /// The first index the slice reads on the last axis (of length `n`), as
    /// the op computes it; `None` where the arguments do not cover it.
    pub fn last_begin(&self, n: i64) -> Option<i64> {
        let d = self.begin.len().checked_sub(1)?;
        let (s, b) = (*self.stride.get(d)?, self.begin[d]);
        let masked = *self.begin_mask.get(d)?;
        Some(if s < 0 {
            if masked {
                n - 1
            } else {
                (if b < 0 { b + n } else { b }).clamp(-1, n - 1)
            }
        } else if masked {
            0
        } else if b < 0 {
            (b + n).max(0)
        } else {
            b.min(n)
        })
    }

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
