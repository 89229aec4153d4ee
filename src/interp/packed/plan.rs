//! How an op meets packed operands ([`Plan`]): on the packed columns
//! where its result column depends on that column alone, computed the same
//! way wherever it stands; unpacked first otherwise.

use std::sync::Arc;

use candle_core::DType as CDType;

use super::{Classes, Index, Packed, coarser, refine, worth_it};
use crate::error::InterpError;
use crate::interp::{Interpreter, Map, V};
use crate::mlpackage::{Arg, Op};

/// An op's integer input by name, if it has it.
type IntsOf<'a> = dyn Fn(&str) -> Result<Option<Vec<i64>>, InterpError> + 'a;

/// How an op meets packed operands.
pub(in crate::interp) enum Plan {
    /// No operand is packed.
    Whole,
    /// The op mixes columns (or its operands' columns cannot be matched):
    /// its packed operands are unpacked first, its outputs are whole.
    Unpack,
    /// The op runs on the packed columns, each output packed with
    /// `classes`; the operands named are first re-gathered to those classes
    /// (with the columns given). `pointwise_conv`: a 1x1 convolution,
    /// whose columns go through BLAS in whole groups (see [`conv_columns`]).
    Columns {
        classes: Classes,
        regather: Vec<(String, Vec<u32>)>,
        pointwise_conv: bool,
    },
    /// A reshape that keeps the last axis: the packed tensor reshaped.
    Reshape { dims: Vec<usize> },
    /// A slice of the last axis alone, `lo..hi`.
    SliceLast { lo: usize, hi: usize },
    /// A concat along the last axis (whole operands beside packed ones,
    /// each of their columns its own class).
    ConcatLast,
}

/// Elementwise ops of one float input `x`.
const UNARY: &[&str] = &[
    "sqrt", "rsqrt", "exp", "tanh", "sigmoid", "relu", "silu", "gelu", "abs", "log", "square",
    "erf", "inverse", "clip", "cast", "identity",
];
/// Broadcasting binaries.
const BINARY: &[&str] = &["add", "sub", "mul", "real_div", "maximum", "minimum", "pow"];

/// The columns a 1x1 convolution of a packed value multiplies: its `width`
/// distinct ones, the last repeated up to a multiple of
/// [`crate::interp::fast::COLUMN_GROUP`], so that every column goes through BLAS in
/// a whole group, as every column of the unpacked product does (which
/// needs the unpacked length to be such a multiple too).
pub(super) fn conv_columns(width: usize) -> Vec<u32> {
    let n = width.next_multiple_of(crate::interp::fast::COLUMN_GROUP);
    (0..n).map(|j| j.min(width - 1) as u32).collect()
}

fn norm_axis(a: i64, rank: usize) -> Option<usize> {
    let r = rank as i64;
    let x = if a < 0 { a + r } else { a };
    (0..r).contains(&x).then_some(x as usize)
}

impl Interpreter<'_> {
    /// How `op` runs given which values are packed.
    pub(in crate::interp) fn pack_plan(
        &self,
        op: &Op,
        env: &Map<String, V>,
        packed: &Map<String, Packed>,
    ) -> Result<Plan, InterpError> {
        let vars: Vec<(&str, &str)> = op
            .inputs
            .iter()
            .flat_map(|(k, args)| {
                args.iter().filter_map(move |a| match a {
                    Arg::Var(n) => Some((k.as_str(), n.as_str())),
                    Arg::Const(_) => None,
                })
            })
            .collect();
        let on: Vec<(&str, &Packed)> = vars
            .iter()
            .filter_map(|&(k, n)| packed.get(n).map(|p| (k, p)))
            .collect();
        let Some(&(_, first)) = on.first() else {
            return Ok(Plan::Whole);
        };
        let kind = op.kind.as_str();
        let data: &[&str] = if kind == "concat" {
            &["values"]
        } else if BINARY.contains(&kind) {
            &["x", "y"]
        } else if UNARY.contains(&kind)
            || matches!(
                kind,
                "conv"
                    | "softmax"
                    | "layer_norm"
                    | "reduce_mean"
                    | "reduce_sum"
                    | "reduce_max"
                    | "reshape"
                    | "transpose"
                    | "expand_dims"
                    | "squeeze"
                    | "split"
                    | "slice_by_index"
                    | "gather"
            )
        {
            &["x"]
        } else {
            return Ok(Plan::Unpack);
        };
        if on.iter().any(|(k, _)| !data.contains(k)) {
            return Ok(Plan::Unpack);
        }
        let (rank, s) = (first.dims.len(), first.dims[first.dims.len() - 1]);
        if on.iter().any(|(_, p)| p.dims.last() != Some(&s)) {
            return Ok(Plan::Unpack);
        }
        let arg_ints = |k: &str| -> Result<Option<Vec<i64>>, InterpError> {
            self.arg(op, env, k)?
                .map(|v| {
                    let t = v.tensor()?.to_dtype(CDType::I64)?;
                    t.flatten_all()
                        .and_then(|f| f.to_vec1::<i64>())
                        .map_err(InterpError::from)
                })
                .transpose()
        };
        // A concat's axis, and whether it interleaves. One along the last
        // axis lays whole operands beside packed ones (each column its own
        // class).
        let (concat_axis, interleave) = if kind == "concat" {
            (
                arg_ints("axis")?.map_or(0, |v| v.first().copied().unwrap_or(0)),
                arg_ints("interleave")?.is_some_and(|v| v.first().is_some_and(|&b| b != 0)),
            )
        } else {
            (0, false)
        };
        let concat_last =
            kind == "concat" && !interleave && norm_axis(concat_axis, rank) == Some(rank - 1);
        // Whole operands among the data: a binary's may broadcast along the
        // last axis (a last axis of 1, or a scalar); any other is unpacked.
        for key in data {
            for a in op.inputs.get(key).map(Vec::as_slice).unwrap_or_default() {
                if let Arg::Var(n) = a
                    && packed.contains_key(n)
                {
                    continue;
                }
                let t = self.resolve(a, env)?;
                let broadcasts = t
                    .tensor()
                    .is_ok_and(|t| t.rank() == 0 || t.dims().last() == Some(&1));
                if !(BINARY.contains(&kind) && broadcasts || concat_last) {
                    return Ok(Plan::Unpack);
                }
            }
        }
        let last_among = |axes: &[i64], rank: usize| {
            axes.iter()
                .any(|&a| norm_axis(a, rank).is_none_or(|a| a + 1 == rank))
        };
        let columns = || -> Plan {
            let same = on.iter().all(|(_, p)| {
                Arc::ptr_eq(&p.classes, &first.classes) || p.classes == first.classes
            });
            if same {
                return Plan::Columns {
                    classes: first.classes.clone(),
                    regather: Vec::new(),
                    pointwise_conv: false,
                };
            }
            // The classes the op runs on, and per packed operand the column
            // each of them takes. Mostly one operand's classes refine the
            // others' (a block's stream against the inputs' cos and sin),
            // found in one pass; otherwise their common refinement.
            let finest = on.iter().find_map(|(_, f)| {
                let maps: Option<Vec<Vec<u32>>> = on
                    .iter()
                    .map(|(_, c)| coarser(&f.classes, &c.classes))
                    .collect();
                maps.map(|m| (f.classes.clone(), m))
            });
            let (classes, cols) = match finest {
                Some(found) => found,
                None => {
                    let indices: Vec<&[u32]> = on.iter().map(|(_, p)| &p.classes[..]).collect();
                    let (refined, cols) = refine(&indices);
                    if !worth_it(&refined) {
                        return Plan::Unpack;
                    }
                    (Index::new(refined), cols)
                }
            };
            let mut regather: Vec<(String, Vec<u32>)> = Vec::new();
            let names = vars.iter().filter(|(_, n)| packed.contains_key(*n));
            for ((_, n), ((_, p), c)) in names.zip(on.iter().zip(cols)) {
                if p.classes != classes && !regather.iter().any(|(m, _)| m == n) {
                    regather.push((n.to_string(), c));
                }
            }
            Plan::Columns {
                classes,
                regather,
                pointwise_conv: false,
            }
        };
        Ok(match kind {
            "softmax" => {
                let ax = arg_ints("axis")?.map_or(-1, |v| v.first().copied().unwrap_or(-1));
                if last_among(&[ax], rank) {
                    Plan::Unpack
                } else {
                    columns()
                }
            }
            "layer_norm" => {
                let axes = arg_ints("axes")?.unwrap_or_else(|| vec![-1]);
                if last_among(&axes, rank) {
                    Plan::Unpack
                } else {
                    columns()
                }
            }
            "reduce_mean" | "reduce_sum" | "reduce_max" => match arg_ints("axes")? {
                Some(axes) if !last_among(&axes, rank) => columns(),
                _ => Plan::Unpack,
            },
            "squeeze" => match arg_ints("axes")? {
                Some(axes) if !last_among(&axes, rank) => columns(),
                _ => Plan::Unpack,
            },
            "expand_dims" => {
                let axes = arg_ints("axes")?.unwrap_or_default();
                if last_among(&axes, rank + axes.len()) {
                    Plan::Unpack
                } else {
                    columns()
                }
            }
            "transpose" => {
                let perm = arg_ints("perm")?.unwrap_or_default();
                if perm.len() == rank
                    && perm.last().and_then(|&a| norm_axis(a, rank)) == Some(rank - 1)
                {
                    columns()
                } else {
                    Plan::Unpack
                }
            }
            "split" | "gather" => {
                let ax = arg_ints("axis")?.map_or(0, |v| v.first().copied().unwrap_or(0));
                if last_among(&[ax], rank) {
                    Plan::Unpack
                } else {
                    columns()
                }
            }
            "reshape" => {
                let shape = arg_ints("shape")?.unwrap_or_default();
                match crate::interp::ops::reshape_dims(&first.dims, &shape) {
                    Ok(dims) if dims.last() == Some(&s) => Plan::Reshape { dims },
                    _ => Plan::Unpack,
                }
            }
            "concat" => {
                if concat_last {
                    Plan::ConcatLast
                } else if interleave || last_among(&[concat_axis], rank) {
                    Plan::Unpack
                } else {
                    columns()
                }
            }
            "slice_by_index" => match slice_plan(&first.dims, &arg_ints)? {
                Some(None) => columns(),
                Some(Some((lo, hi))) => Plan::SliceLast { lo, hi },
                None => Plan::Unpack,
            },
            "conv" => {
                let fits = rank == 4
                    && first.dims[2] == 1
                    && s.is_multiple_of(crate::interp::fast::COLUMN_GROUP)
                    && crate::blas::columns_independent()
                    && self.conv_is_pointwise(op, env)?;
                match (fits, columns()) {
                    (
                        true,
                        Plan::Columns {
                            classes, regather, ..
                        },
                    ) => Plan::Columns {
                        classes,
                        regather,
                        pointwise_conv: true,
                    },
                    _ => Plan::Unpack,
                }
            }
            _ => columns(),
        })
    }
}

/// A `slice_by_index` of a packed value: `Some(None)` when the last axis
/// stays whole (the op runs on the columns), `Some(Some((lo, hi)))` for a
/// slice of the last axis alone, `None` otherwise (unpacked).
fn slice_plan(
    dims: &[usize],
    arg_ints: &IntsOf<'_>,
) -> Result<Option<Option<(usize, usize)>>, InterpError> {
    let r = dims.len();
    let a = crate::interp::ops::SliceArgs::read(arg_ints, r)?;
    let (begin, end, stride) = (a.begin, a.end, a.stride);
    let (bm, em, sm) = (a.begin_mask, a.end_mask, a.squeeze_mask);
    if [
        begin.len(),
        end.len(),
        stride.len(),
        bm.len(),
        em.len(),
        sm.len(),
    ]
    .iter()
    .any(|&l| l != r)
    {
        return Ok(None);
    }
    // Each axis's (begin, end) with stride 1, or None.
    let range = |d: usize| -> Option<(usize, usize)> {
        let n = dims[d] as i64;
        if stride[d] != 1 || sm[d] {
            return None;
        }
        let norm = |v: i64| if v < 0 { (v + n).max(0) } else { v.min(n) };
        let b = if bm[d] { 0 } else { norm(begin[d]) };
        let e = if em[d] { n } else { norm(end[d]) };
        Some((b as usize, e.max(b) as usize))
    };
    let s = dims[r - 1];
    let whole = |d: usize| range(d) == Some((0, dims[d]));
    Ok(match range(r - 1) {
        Some((0, e)) if e == s => Some(None),
        Some((lo, hi)) if (0..r - 1).all(whole) && hi > lo => Some(Some((lo, hi))),
        _ => None,
    })
}
