//! Packed columns: a bucket's pad slots carried through the program once.
//!
//! A tower's program keeps the sequence on the last axis (`[1, C, 1, S]`,
//! ANE-RULES R1), and a padded call fills its pad slots with one value per
//! input (zero patches, one position row, cos 1, sin 0). Every op that
//! works on each column alone (elementwise ops, norms over channels, the
//! 1x1 convolutions, moves that keep the last axis) then gives equal
//! columns equal outputs. The interpreter keeps such a value *packed*: its
//! distinct columns only, with a [`Classes`] index saying which of them each
//! of the `S` columns is. An op that mixes columns first unpacks its packed
//! operands ([`gather_last`] by the classes); operands with different
//! classes are re-gathered to their common refinement.
//!
//! Nothing about the values is assumed. The classes come from the function
//! inputs' bits ([`input_classes`]), and an op keeps a value packed only
//! where its result column depends on that column alone, computed the same
//! way wherever the column stands: checked per op kind here
//! ([`Interpreter::pack_plan`]), and for the attention chain (in `mod.rs`)
//! by [`super::fast::rows_independent`] and the mask's rows, or by checking
//! its context's columns. Tests compare whole towers and every golden
//! program with packing on and off bit for bit.

use std::sync::Arc;

use rustc_hash::FxHashMap;

use super::Map;

use candle_core::{DType as CDType, Device, Tensor};
use rayon::prelude::*;

use super::{Interpreter, V};
use crate::mlpackage::{Arg, Op};

/// For each of a value's `S` last-axis columns, the packed column that holds
/// it. Canonical: classes are numbered in the order of their first column,
/// and every class is used, so equal partitions have equal indices.
pub type Classes = Arc<Index>;

/// A canonical class index ([`Classes`]) with what the interpreter asks of
/// it often, computed once.
#[derive(Debug, PartialEq, Eq)]
pub struct Index {
    /// Per column, its class.
    pub of: Vec<u32>,
    /// Per class, its first column.
    pub first: Vec<u32>,
    /// Per class, how many columns it stands for.
    pub mult: Vec<u32>,
}

impl Index {
    pub fn new(of: Vec<u32>) -> Classes {
        let w = width(&of);
        let (mut first, mut mult) = (vec![u32::MAX; w], vec![0u32; w]);
        for (j, &c) in of.iter().enumerate() {
            if first[c as usize] == u32::MAX {
                first[c as usize] = j as u32;
            }
            mult[c as usize] += 1;
        }
        Arc::new(Index { of, first, mult })
    }

    /// How many distinct columns a value packed with it holds.
    pub fn width(&self) -> usize {
        self.first.len()
    }
}

impl std::ops::Deref for Index {
    type Target = [u32];
    fn deref(&self) -> &[u32] {
        &self.of
    }
}

/// A packed value's full shape and its classes (the tensor itself, in the
/// interpreter's environment, has as many columns last as there are classes).
#[derive(Clone, Debug)]
pub struct Packed {
    pub dims: Vec<usize>,
    pub classes: Classes,
}

impl Packed {
    /// How many distinct columns the value holds.
    pub fn width(&self) -> usize {
        self.classes.width()
    }
}

/// The number of classes of a canonical index.
pub fn width(classes: &[u32]) -> usize {
    classes.iter().max().map_or(0, |&m| m as usize + 1)
}

/// Keep a value packed only when at least a quarter of its columns repeat.
pub fn worth_it(classes: &[u32]) -> bool {
    width(classes) * 4 <= classes.len() * 3
}

/// The classes of the `s` columns shared by `inputs` (each contiguous f32,
/// `[rows, s]` with the columns last): two columns are one class when they
/// are equal bit for bit in every row of every input. `None` when fewer
/// than a quarter of the columns repeat.
pub fn input_classes(inputs: &[&[f32]], s: usize) -> Option<Vec<u32>> {
    if s < 2 || inputs.iter().any(|v| v.is_empty() || v.len() % s != 0) {
        return None;
    }
    // A hash of each column over every row, then each column checked bit
    // for bit against the first column of its hash's classes.
    let mut hash = vec![0xcbf2_9ce4_8422_2325u64; s];
    for v in inputs {
        for row in v.chunks_exact(s) {
            for (h, x) in hash.iter_mut().zip(row) {
                *h = (*h ^ u64::from(x.to_bits())).wrapping_mul(0x0100_0000_01b3);
            }
        }
    }
    let same = |a: usize, b: usize| {
        inputs.iter().all(|v| {
            v.chunks_exact(s)
                .all(|row| row[a].to_bits() == row[b].to_bits())
        })
    };
    let mut first: Vec<usize> = Vec::new();
    let mut by_hash: FxHashMap<u64, Vec<u32>> = FxHashMap::default();
    let mut classes = Vec::with_capacity(s);
    for (j, h) in hash.iter().enumerate() {
        let known = by_hash.entry(*h).or_default();
        let class = match known.iter().find(|&&c| same(first[c as usize], j)) {
            Some(&c) => c,
            None => {
                let c = first.len() as u32;
                first.push(j);
                known.push(c);
                c
            }
        };
        classes.push(class);
    }
    worth_it(&classes).then_some(classes)
}

/// The common refinement of several indices over the same columns: one
/// class per distinct tuple of their classes. Returns it and, per index,
/// the column of that index each new class takes.
pub fn refine(indices: &[&[u32]]) -> (Vec<u32>, Vec<Vec<u32>>) {
    let s = indices.first().map_or(0, |i| i.len());
    let mut classes: Vec<u32> = vec![0; s];
    // Pairwise: the refinement so far with the next index, each new class
    // remembering the class it came from in both.
    let mut so_far: Vec<Vec<u32>> = Vec::new();
    for (n, next) in indices.iter().enumerate() {
        let mut seen: FxHashMap<u64, u32> =
            FxHashMap::with_capacity_and_hasher(s, Default::default());
        let mut origin: Vec<(u32, u32)> = Vec::new();
        for (j, &b) in next.iter().enumerate() {
            let a = if n == 0 { 0 } else { classes[j] };
            let key = (u64::from(a) << 32) | u64::from(b);
            let id = *seen.entry(key).or_insert_with(|| {
                origin.push((a, b));
                origin.len() as u32 - 1
            });
            classes[j] = id;
        }
        // Each earlier index's column per new class, then this index's.
        so_far = so_far
            .into_iter()
            .map(|c| origin.iter().map(|&(a, _)| c[a as usize]).collect())
            .collect();
        so_far.push(origin.iter().map(|&(_, b)| b).collect());
    }
    (classes, so_far)
}

/// Where `fine` refines `coarse` (each of its classes lies within one of
/// `coarse`'s): per class of `fine`, that class of `coarse`.
pub fn coarser(fine: &Index, coarse: &Index) -> Option<Vec<u32>> {
    if fine.len() != coarse.len() {
        return None;
    }
    let mut map = vec![u32::MAX; fine.width()];
    for (&f, &c) in fine.iter().zip(coarse.iter()) {
        let m = &mut map[f as usize];
        if *m == u32::MAX {
            *m = c;
        } else if *m != c {
            return None;
        }
    }
    Some(map)
}

/// Columns `lo..hi` of an index: the new (canonical) index and the packed
/// columns it keeps, in order.
pub fn slice(classes: &[u32], lo: usize, hi: usize) -> (Vec<u32>, Vec<u32>) {
    let mut renum: FxHashMap<u32, u32> = FxHashMap::default();
    let mut keep = Vec::new();
    let out = classes[lo..hi]
        .iter()
        .map(|&c| {
            *renum.entry(c).or_insert_with(|| {
                keep.push(c);
                keep.len() as u32 - 1
            })
        })
        .collect();
    (out, keep)
}

/// Indices laid end to end (a concat along the last axis of values packed
/// with them, their packed columns laid end to end too): canonical when
/// each is.
pub fn concat(indices: &[&[u32]]) -> Vec<u32> {
    let mut out = Vec::with_capacity(indices.iter().map(|i| i.len()).sum());
    let mut offset = 0u32;
    for i in indices {
        out.extend(i.iter().map(|&c| c + offset));
        offset += width(i) as u32;
    }
    out
}

/// `t` packed over `classes` (its last axis `classes.len()` long) if each
/// column equals its class's first column bit for bit; `None` otherwise.
pub fn pack_if_repeats(t: &Tensor, classes: &Index) -> candle_core::Result<Option<Tensor>> {
    let len = classes.len();
    if t.dims().last() != Some(&len) || t.dtype() != CDType::F32 {
        return Ok(None);
    }
    let first = &classes.first;
    let t = t.contiguous()?;
    let repeats = super::with_f32(&t, |v| {
        v.par_chunks(len).all(|row| {
            row.iter()
                .zip(classes.iter())
                .all(|(x, &c)| x.to_bits() == row[first[c as usize] as usize].to_bits())
        })
    })?;
    if repeats {
        gather_last(&t, first).map(Some)
    } else {
        Ok(None)
    }
}

/// The length of `t`'s last axis and the shape of its columns `cols`,
/// each checked to be on that axis.
fn gathered_dims(t: &Tensor, cols: &[u32]) -> candle_core::Result<(usize, Vec<usize>)> {
    let dims = t.dims();
    let Some((&len, lead)) = dims.split_last() else {
        candle_core::bail!("gathering columns of a scalar");
    };
    if let Some(&c) = cols.iter().find(|&&c| c as usize >= len) {
        candle_core::bail!("column {c} of a last axis of {len}");
    }
    let mut out_dims = lead.to_vec();
    out_dims.push(cols.len());
    Ok((len, out_dims))
}

/// The columns `cols` of the f32 tensor `t` along its last axis, in order
/// (repeats allowed), as f16: one pass, for values rounded to fp16 already
/// (the conversion is then exact). F16C converts 8 values at a time where
/// the CPU has it (`half`'s slice conversion).
pub fn gather_last_f16(t: &Tensor, cols: &[u32]) -> candle_core::Result<Tensor> {
    use half::slice::HalfFloatSliceExt;
    let (len, out_dims) = gathered_dims(t, cols)?;
    if t.dtype() != CDType::F32 {
        candle_core::bail!("f16 columns of a {:?} tensor", t.dtype());
    }
    let t = t.contiguous()?;
    let v = super::with_f32(&t, |v| {
        let mut out = vec![half::f16::ZERO; v.len() / len.max(1) * cols.len()];
        if !cols.is_empty() {
            out.par_chunks_mut(cols.len())
                .zip(v.par_chunks(len))
                .for_each_init(Vec::new, |row32, (o, row)| {
                    row32.clear();
                    row32.extend(cols.iter().map(|&c| row[c as usize]));
                    o.convert_from_f32_slice(row32);
                });
        }
        out
    })?;
    Tensor::from_vec(v, out_dims, &Device::Cpu)
}

/// The columns `cols` of `t` along its last axis, in order (repeats allowed).
pub fn gather_last(t: &Tensor, cols: &[u32]) -> candle_core::Result<Tensor> {
    let (len, out_dims) = gathered_dims(t, cols)?;
    if t.dtype() == CDType::F32 {
        let t = t.contiguous()?;
        let v = super::with_f32(&t, |v| {
            let mut out = vec![0f32; v.len() / len.max(1) * cols.len()];
            if !cols.is_empty() {
                out.par_chunks_mut(cols.len())
                    .zip(v.par_chunks(len))
                    .for_each(|(o, row)| {
                        for (o, &c) in o.iter_mut().zip(cols) {
                            *o = row[c as usize];
                        }
                    });
            }
            out
        })?;
        return Tensor::from_vec(v, out_dims, &Device::Cpu);
    }
    let n = cols.len();
    let idx = Tensor::from_vec(cols.to_vec(), n, &Device::Cpu)?;
    t.contiguous()?.index_select(&idx, out_dims.len() - 1)
}

/// (non-finite, finite beyond fp16's range) values of a packed f32 value,
/// each counted as many times as its column's class stands for columns: the
/// counts of the unpacked value.
pub fn overflow_counts(t: &Tensor, mult: &[u32]) -> candle_core::Result<(usize, usize)> {
    let w = mult.len().max(1);
    super::with_f32(t, |v| {
        v.par_chunks(w)
            .map(|row| {
                let mut c = (0usize, 0usize);
                for (x, &m) in row.iter().zip(mult) {
                    if !x.is_finite() {
                        c.0 += m as usize;
                    } else if x.abs() > 65504.0 {
                        c.1 += m as usize;
                    }
                }
                c
            })
            .reduce(|| (0, 0), |a, b| (a.0 + b.0, a.1 + b.1))
    })
}

/// What [`Interpreter::exec_planned`] gives: the op's outputs, the classes
/// they are packed with (if they are), and the storages of the operands
/// swapped in for the op alone.
pub(super) type Ran = (Vec<V>, Option<Classes>, Vec<usize>);

/// An op's integer input by name, if it has it.
type IntsOf<'a> = dyn Fn(&str) -> Result<Option<Vec<i64>>, String> + 'a;

/// How an op meets packed operands.
pub(super) enum Plan {
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
/// [`super::fast::COLUMN_GROUP`], so that every column goes through BLAS in
/// a whole group, as every column of the unpacked product does (which
/// needs the unpacked length to be such a multiple too).
pub(super) fn conv_columns(width: usize) -> Vec<u32> {
    let n = width.next_multiple_of(super::fast::COLUMN_GROUP);
    (0..n).map(|j| j.min(width - 1) as u32).collect()
}

fn norm_axis(a: i64, rank: usize) -> Option<usize> {
    let r = rank as i64;
    let x = if a < 0 { a + r } else { a };
    (0..r).contains(&x).then_some(x as usize)
}

impl Interpreter<'_> {
    /// How `op` runs given which values are packed.
    pub(super) fn pack_plan(
        &self,
        op: &Op,
        env: &Map<String, V>,
        packed: &Map<String, Packed>,
    ) -> Result<Plan, String> {
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
        let arg_ints = |k: &str| -> Result<Option<Vec<i64>>, String> {
            self.arg(op, env, k)?
                .map(|v| {
                    let t = v
                        .tensor()?
                        .to_dtype(CDType::I64)
                        .map_err(|e| e.to_string())?;
                    t.flatten_all()
                        .and_then(|f| f.to_vec1::<i64>())
                        .map_err(|e| e.to_string())
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
                match super::ops::reshape_dims(&first.dims, &shape) {
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
                    && s.is_multiple_of(super::fast::COLUMN_GROUP)
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

impl Interpreter<'_> {
    /// Pack the function's inputs in the ANE layout (`[B, C, 1, S]`, float)
    /// over the classes of their columns ([`input_classes`]), where all share
    /// one `S` and a quarter or more of the columns repeat.
    pub(super) fn pack_inputs(
        &self,
        env: &mut Map<String, V>,
        packs: &mut Map<String, Packed>,
    ) -> Result<(), String> {
        let e = |e: candle_core::Error| e.to_string();
        let layout: Vec<&crate::mlpackage::Named> = self
            .func
            .inputs
            .iter()
            .filter(|i| i.ty.dtype.is_float() && i.ty.shape.len() == 4 && i.ty.shape[2] == 1)
            .collect();
        let Some(s) = layout.first().map(|i| i.ty.shape[3]) else {
            return Ok(());
        };
        if layout.iter().any(|i| i.ty.shape[3] != s) {
            return Ok(());
        }
        let mut values: Vec<Vec<f32>> = Vec::new();
        for i in &layout {
            let t = env
                .get(&i.name)
                .ok_or_else(|| format!("input `{}` missing", i.name))?
                .tensor()?;
            values.push(
                t.flatten_all()
                    .and_then(|f| f.to_vec1::<f32>())
                    .map_err(e)?,
            );
        }
        let slices: Vec<&[f32]> = values.iter().map(Vec::as_slice).collect();
        let Some(classes) = input_classes(&slices, s) else {
            return Ok(());
        };
        let classes = Index::new(classes);
        for i in layout {
            let t = env.get(&i.name).ok_or("input missing")?.tensor()?;
            let t = gather_last(t, &classes.first).map_err(e)?;
            env.insert(i.name.clone(), V::T(t));
            packs.insert(
                i.name.clone(),
                Packed {
                    dims: i.ty.shape.clone(),
                    classes: classes.clone(),
                },
            );
        }
        Ok(())
    }

    /// Run `op` as `plan` says. Returns its outputs, the classes they are
    /// packed with (if they are), and the storages of the operands swapped
    /// into `env` for the op alone (an output sharing one is not the op's own).
    pub(super) fn exec_planned(
        &self,
        op: &Op,
        plan: Plan,
        env: &mut Map<String, V>,
        packs: &Map<String, Packed>,
        unpacked: &mut Map<String, Tensor>,
        tally: &super::Tally,
    ) -> Result<Ran, String> {
        let e = |e: candle_core::Error| e.to_string();
        let x_name = || -> Result<&str, String> {
            match op.inputs.get("x").map(Vec::as_slice) {
                Some([Arg::Var(n)]) => Ok(n.as_str()),
                _ => Err("a packed operand `x` that is not a variable".into()),
            }
        };
        let tensor = |env: &Map<String, V>, n: &str| -> Result<Tensor, String> {
            Ok(env
                .get(n)
                .ok_or_else(|| format!("`{n}` missing"))?
                .tensor()?
                .clone())
        };
        match plan {
            Plan::Whole => Ok((self.exec(op, env, tally)?, None, Vec::new())),
            Plan::Unpack => {
                let names = op.inputs.values().flatten().filter_map(|a| match a {
                    Arg::Var(n) => Some(n),
                    Arg::Const(_) => None,
                });
                let swaps = unpacked_swaps(names, env, packs, unpacked)?;
                swapped(env, swaps, |env| self.exec(op, env, tally)).map(|(o, st)| (o, None, st))
            }
            Plan::Columns {
                classes,
                regather,
                pointwise_conv,
            } => {
                let mut swaps: Vec<(String, Tensor)> = Vec::new();
                for (n, cols) in &regather {
                    swaps.push((n.clone(), gather_last(&tensor(env, n)?, cols).map_err(e)?));
                }
                let width = classes.width();
                if pointwise_conv {
                    let x = x_name()?;
                    let cur = match swaps.iter().position(|(n, _)| n == x) {
                        Some(i) => swaps.remove(i).1,
                        None => tensor(env, x)?,
                    };
                    let cols = conv_columns(width);
                    tally.conv_columns(0, classes.len() - cols.len().min(classes.len()));
                    swaps.push((x.to_string(), gather_last(&cur, &cols).map_err(e)?));
                }
                let (mut outs, st) = swapped(env, swaps, |env| self.exec(op, env, tally))?;
                if pointwise_conv && let Some(V::T(t)) = outs.first_mut() {
                    let r = t.rank();
                    *t = t
                        .narrow(r - 1, 0, width)
                        .and_then(|t| t.contiguous())
                        .map_err(e)?;
                }
                Ok((outs, Some(classes), st))
            }
            Plan::Reshape { mut dims } => {
                let x = x_name()?;
                let p = packs.get(x).ok_or("packed operand missing")?;
                if let Some(d) = dims.last_mut() {
                    *d = p.width();
                }
                let t = tensor(env, x)?.reshape(dims).map_err(e)?;
                Ok((vec![V::T(t)], Some(p.classes.clone()), Vec::new()))
            }
            Plan::SliceLast { lo, hi } => {
                let x = x_name()?;
                let p = packs.get(x).ok_or("packed operand missing")?;
                // Packed whatever the share of repeats: the slice is one
                // part of a value (a query chunk) whose parts are laid end to
                // end again.
                let (classes, keep) = slice(&p.classes, lo, hi);
                let t = gather_last(&tensor(env, x)?, &keep).map_err(e)?;
                Ok((vec![V::T(t)], Some(Index::new(classes)), Vec::new()))
            }
            Plan::ConcatLast => {
                let mut parts = Vec::new();
                let mut classes: Vec<Classes> = Vec::new();
                for a in op
                    .inputs
                    .get("values")
                    .map(Vec::as_slice)
                    .unwrap_or_default()
                {
                    let t = self.resolve(a, env)?.tensor()?.clone();
                    classes.push(match a {
                        Arg::Var(n) if packs.contains_key(n) => packs[n].classes.clone(),
                        // A whole operand: each column its own class.
                        _ => Index::new((0..t.dims().last().map_or(1, |&l| l) as u32).collect()),
                    });
                    parts.push(t);
                }
                let indices: Vec<&[u32]> = classes.iter().map(|c| &c[..]).collect();
                let r = parts.first().map_or(1, Tensor::rank);
                let t = Tensor::cat(&parts, r - 1).map_err(e)?;
                // Packed when enough of its columns still repeat.
                let classes = concat(&indices);
                if worth_it(&classes) {
                    Ok((vec![V::T(t)], Some(Index::new(classes)), Vec::new()))
                } else {
                    let t = gather_last(&t, &classes).map_err(e)?;
                    Ok((vec![V::T(t)], None, Vec::new()))
                }
            }
        }
    }

    /// An attention chain whose operands may be packed: k, v and the mask
    /// are unpacked (kept while they live), q is passed packed to
    /// [`Interpreter::exec_chain`].
    #[allow(clippy::too_many_arguments)]
    pub(super) fn exec_chain_packed(
        &self,
        p: &super::fuse::Plan,
        env: &mut Map<String, V>,
        packs: &Map<String, Packed>,
        unpacked: &mut Map<String, Tensor>,
        precision: super::Precision,
        check: bool,
        cache: &mut super::chain::ChainCache,
        tally: &super::Tally,
    ) -> Result<super::chain::ChainOut, String> {
        let ops = &self.func.ops;
        let var = |op: &Op, k: &str| match op.inputs.get(k).map(Vec::as_slice) {
            Some([Arg::Var(n)]) => Some(n.clone()),
            _ => None,
        };
        let q = var(&ops[p.scores], "x");
        let others: Vec<String> = [var(&ops[p.scores], "y"), var(&ops[p.ctx], "x")]
            .into_iter()
            .flatten()
            .chain(match &p.mask {
                Some(Arg::Var(n)) => Some(n.clone()),
                _ => None,
            })
            .collect();
        // q packed, and not also read as k, v or the mask.
        let q_classes = q
            .as_ref()
            .filter(|q| !others.contains(q))
            .and_then(|q| packs.get(q))
            .map(|p| p.classes.clone());
        let names = others
            .iter()
            .chain(q.iter().filter(|_| q_classes.is_none()));
        let swaps = unpacked_swaps(names, env, packs, unpacked)?;
        let (r, _) = swapped(env, swaps, |env| {
            self.exec_chain(p, env, precision, check, cache, q_classes.as_ref(), tally)
        })?;
        Ok(r)
    }
}

/// The packed values among `names`, unpacked (each once, kept in
/// `unpacked` while it lives), to stand in `env` for their packed selves.
fn unpacked_swaps<'a>(
    names: impl Iterator<Item = &'a String>,
    env: &Map<String, V>,
    packs: &Map<String, Packed>,
    unpacked: &mut Map<String, Tensor>,
) -> Result<Vec<(String, Tensor)>, String> {
    let mut swaps: Vec<(String, Tensor)> = Vec::new();
    for n in names {
        let Some(p) = packs.get(n) else { continue };
        if swaps.iter().any(|(m, _)| m == n) {
            continue;
        }
        if !unpacked.contains_key(n) {
            let t = env
                .get(n)
                .ok_or_else(|| format!("`{n}` missing"))?
                .tensor()?;
            let t = gather_last(t, &p.classes).map_err(|e| e.to_string())?;
            unpacked.insert(n.clone(), t);
        }
        swaps.push((n.clone(), unpacked[n].clone()));
    }
    Ok(swaps)
}

/// Run `f` with the values `swaps` names standing in `env` for their own,
/// then put those back. Returns what `f` did and the stand-ins' storages.
fn swapped<T>(
    env: &mut Map<String, V>,
    swaps: Vec<(String, Tensor)>,
    f: impl FnOnce(&Map<String, V>) -> Result<T, String>,
) -> Result<(T, Vec<usize>), String> {
    let storages = swaps
        .iter()
        .filter_map(|(_, t)| super::storage_addr(t))
        .collect();
    let mut saved = Vec::with_capacity(swaps.len());
    for (n, t) in swaps {
        if let Some(old) = env.insert(n.clone(), V::T(t)) {
            saved.push((n, old));
        }
    }
    let r = f(env);
    for (n, old) in saved {
        env.insert(n, old);
    }
    r.map(|r| (r, storages))
}

/// A `slice_by_index` of a packed value: `Some(None)` when the last axis
/// stays whole (the op runs on the columns), `Some(Some((lo, hi)))` for a
/// slice of the last axis alone, `None` otherwise (unpacked).
fn slice_plan(
    dims: &[usize],
    arg_ints: &IntsOf<'_>,
) -> Result<Option<Option<(usize, usize)>>, String> {
    let r = dims.len();
    let a = super::ops::SliceArgs::read(arg_ints, r)?;
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn classes_are_canonical_and_checked_bit_for_bit() {
        // Columns: 0 a, 1 b, 2 pad, 3 pad, 4 b again, 5 pad, 6 -0.0 (not +0.0), 7 +0.0.
        let s = 8;
        let x = [
            1.0, 2.0, 0.0, 0.0, 2.0, 0.0, -0.0, 0.0, //
            3.0, 4.0, 9.0, 9.0, 4.0, 9.0, 9.0, 9.0,
        ];
        let y = [5.0, 6.0, 1.0, 1.0, 6.0, 1.0, 1.0, 1.0];
        let c = input_classes(&[&x, &y], s).unwrap();
        assert_eq!(c, [0, 1, 2, 2, 1, 2, 3, 2]);
        // A second input that splits column 5 from the other pads.
        let y2 = [5.0, 6.0, 1.0, 1.0, 6.0, 7.0, 1.0, 1.0];
        assert_eq!(
            input_classes(&[&x, &y2], s).unwrap(),
            [0, 1, 2, 2, 1, 3, 4, 2]
        );
        // Nothing repeats: not packed.
        let z: Vec<f32> = (0..s).map(|i| i as f32).collect();
        assert!(input_classes(&[&z], s).is_none());
    }

    #[test]
    fn refine_slice_concat_keep_the_columns() {
        let a = [0u32, 1, 1, 1, 2, 1];
        let b = [0u32, 0, 1, 1, 2, 1];
        let (r, cols) = refine(&[&a, &b]);
        assert_eq!(r, [0, 1, 2, 2, 3, 2]);
        assert_eq!(cols, [vec![0, 1, 1, 2], vec![0, 0, 1, 2]]);
        let (s, keep) = slice(&a, 2, 6);
        assert_eq!((s, keep), (vec![0, 0, 1, 0], vec![1, 2]));
        assert_eq!(concat(&[&[0, 1, 1], &[0, 0, 1]]), [0, 1, 1, 2, 2, 3]);
        let ia = Index::new(a.to_vec());
        assert_eq!(
            (ia.first.as_slice(), ia.mult.as_slice()),
            (&[0, 1, 4][..], &[1, 4, 1][..])
        );
        // Every value, unpacked through a refinement, is what it was.
        let t = Tensor::new(&[[10f32, 11., 12.], [20., 21., 22.]], &Device::Cpu).unwrap();
        let full = gather_last(&t, &a).unwrap();
        let via = gather_last(&gather_last(&t, &cols[0]).unwrap(), &r).unwrap();
        assert_eq!(
            full.to_vec2::<f32>().unwrap(),
            via.to_vec2::<f32>().unwrap()
        );
        assert_eq!(
            full.to_vec2::<f32>().unwrap()[1],
            [20., 21., 21., 21., 22., 21.]
        );
        let c = overflow_counts(
            &Tensor::new(&[1f32, f32::NAN, 7e4], &Device::Cpu).unwrap(),
            &[3, 2, 5],
        )
        .unwrap();
        assert_eq!(c, (2, 5));
    }
}
