//! Running an op as its [`Plan`] says: packed inputs, operands unpacked or
//! re-gathered for the op alone, and the attention chain with q packed.

use candle_core::Tensor;

use super::plan::{Plan, conv_columns};
use super::{Classes, Index, Packed, concat, gather_last, input_classes, slice, worth_it};
use crate::error::InterpError;
use crate::interp::{Interpreter, Map, V};
use crate::mlpackage::{Arg, Op};

/// What [`Interpreter::exec_planned`] gives: the op's outputs, the classes
/// they are packed with (if they are), and the storages of the operands
/// swapped in for the op alone.
pub(super) type Ran = (Vec<V>, Option<Classes>, Vec<usize>);

impl Interpreter<'_> {
    /// Pack the function's inputs in the ANE layout (`[B, C, 1, S]`, float)
    /// over the classes of their columns ([`input_classes`]), where all share
    /// one `S` and a quarter or more of the columns repeat.
    pub(in crate::interp) fn pack_inputs(
        &self,
        env: &mut Map<String, V>,
        packs: &mut Map<String, Packed>,
    ) -> Result<(), InterpError> {
        let e = InterpError::Candle;
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
                .ok_or_else(|| internal!("input `{}` missing", i.name))?
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
            let t = env
                .get(&i.name)
                .ok_or_else(|| internal!("input missing"))?
                .tensor()?;
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
    pub(in crate::interp) fn exec_planned(
        &self,
        op: &Op,
        plan: Plan,
        env: &mut Map<String, V>,
        packs: &Map<String, Packed>,
        unpacked: &mut Map<String, Tensor>,
        tally: &crate::interp::Tally,
    ) -> Result<Ran, InterpError> {
        let e = InterpError::Candle;
        let x_name = || -> Result<&str, InterpError> {
            match op.inputs.get("x").map(Vec::as_slice) {
                Some([Arg::Var(n)]) => Ok(n.as_str()),
                _ => Err(internal!("a packed operand `x` that is not a variable")),
            }
        };
        let tensor = |env: &Map<String, V>, n: &str| -> Result<Tensor, InterpError> {
            Ok(env
                .get(n)
                .ok_or_else(|| internal!("`{n}` missing"))?
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
                let p = packs
                    .get(x)
                    .ok_or_else(|| internal!("packed operand missing"))?;
                if let Some(d) = dims.last_mut() {
                    *d = p.width();
                }
                let t = tensor(env, x)?.reshape(dims).map_err(e)?;
                Ok((vec![V::T(t)], Some(p.classes.clone()), Vec::new()))
            }
            Plan::SliceLast { lo, hi } => {
                let x = x_name()?;
                let p = packs
                    .get(x)
                    .ok_or_else(|| internal!("packed operand missing"))?;
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
    pub(in crate::interp) fn exec_chain_packed(
        &self,
        p: &crate::interp::fuse::Plan,
        env: &mut Map<String, V>,
        packs: &Map<String, Packed>,
        unpacked: &mut Map<String, Tensor>,
        precision: crate::interp::Precision,
        check: bool,
        cache: &mut crate::interp::chain::ChainCache,
        tally: &crate::interp::Tally,
    ) -> Result<crate::interp::chain::ChainOut, InterpError> {
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
) -> Result<Vec<(String, Tensor)>, InterpError> {
    let mut swaps: Vec<(String, Tensor)> = Vec::new();
    for n in names {
        let Some(p) = packs.get(n) else { continue };
        if swaps.iter().any(|(m, _)| m == n) {
            continue;
        }
        if !unpacked.contains_key(n) {
            let t = env
                .get(n)
                .ok_or_else(|| internal!("`{n}` missing"))?
                .tensor()?;
            let t = gather_last(t, &p.classes)?;
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
    f: impl FnOnce(&Map<String, V>) -> Result<T, InterpError>,
) -> Result<(T, Vec<usize>), InterpError> {
    let storages = swaps
        .iter()
        .filter_map(|(_, t)| crate::interp::storage_addr(t))
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
