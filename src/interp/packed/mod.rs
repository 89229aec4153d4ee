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
//! (`plan.rs`), and for the attention chain (in `chain.rs`)
//! by [`crate::interp::fast::rows_independent`] and the mask's rows, or by checking
//! its context's columns. Tests compare whole towers and every golden
//! program with packing on and off bit for bit.
//!
//! This file holds the classes and the gathers; `plan.rs` decides how each
//! op meets packed operands, `exec.rs` runs it so.

mod exec;
mod plan;

use std::sync::Arc;

use rustc_hash::FxHashMap;

use candle_core::{DType as CDType, Device, Tensor};
use rayon::prelude::*;

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
    // Each column's candidate, the first column with its hash, checked bit
    // for bit row by row (a row's values lie side by side; a column's lie a
    // row apart, and compared in place they miss the cache at each value).
    let mut first_of: FxHashMap<u64, usize> = FxHashMap::default();
    let cand: Vec<usize> = (0..s)
        .map(|j| *first_of.entry(hash[j]).or_insert(j))
        .collect();
    let mut like = vec![true; s];
    for v in inputs {
        for row in v.chunks_exact(s) {
            for ((ok, &c), x) in like.iter_mut().zip(&cand).zip(row) {
                *ok &= x.to_bits() == row[c].to_bits();
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
    let mut classes: Vec<u32> = Vec::with_capacity(s);
    for (j, h) in hash.iter().enumerate() {
        // Like its candidate: the candidate's class (the first of its hash).
        if like[j] && cand[j] < j {
            classes.push(classes[cand[j]]);
            continue;
        }
        // The first of its hash, or unlike it (hashes that collide): among
        // its hash's classes, checked in place.
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
    let repeats = crate::interp::with_f32(&t, |v| {
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
    let v = crate::interp::with_f32(&t, |v| {
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
        let v = crate::interp::with_f32(&t, |v| {
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
    crate::interp::with_f32(t, |v| {
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
