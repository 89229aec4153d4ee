//! A run of a function: its inputs checked and rounded, each op executed
//! where the schedule places it (attention chains in tiles, packed values
//! where their columns repeat), fp16 rounding and overflow checks, values
//! freed after their last read, and the outputs and captured values
//! gathered.

use std::collections::{BTreeMap, HashMap};

use candle_core::{DType as CDType, Tensor};

use super::chain::{ChainCache, ChainOut};
use super::fp16::*;
use super::profile::{heap_bytes, live_bytes};
use super::program::Schedule;
use super::{Capture, Interpreter, Map, Overflow, Precision, RunOutput, Set, V, Work};
use super::{fast, packed};
use crate::mlpackage::{DType, Function, Op};

/// A captured value as a run returns it: the columns `columns` of its last
/// axis (all when `None`), taken through `pack` where it is packed; in fp16
/// mode its f32 values as f16, which holds them exactly (every op's output
/// is rounded to fp16 already) in half the memory.
fn captured_value(
    v: V,
    pack: Option<&packed::Packed>,
    columns: Option<&[usize]>,
    precision: Precision,
) -> Result<Tensor, String> {
    let t = match v {
        V::T(t) => t,
        V::S(s) => return Err(format!("expected a tensor, got the string `{s}`")),
    };
    let cols: Option<Vec<u32>> = match (columns, pack) {
        (None, None) => None,
        (None, Some(p)) => Some(p.classes.to_vec()),
        (Some(c), p) => {
            let len = p.map_or_else(
                || t.dims().last().copied().unwrap_or(0),
                |p| p.classes.len(),
            );
            let mut v = Vec::with_capacity(c.len());
            for &c in c {
                if c >= len {
                    return Err(format!("captured column {c} of a last axis of {len}"));
                }
                v.push(p.map_or(c as u32, |p| p.classes[c]));
            }
            Some(v)
        }
    };
    let half = precision == Precision::Fp16 && t.dtype() == CDType::F32;
    match (cols, half) {
        (None, false) => Ok(t),
        (None, true) => f16_of(&t),
        (Some(c), false) => packed::gather_last(&t, &c),
        (Some(c), true) => packed::gather_last_f16(&t, &c),
    }
    .map_err(|e| e.to_string())
}

/// A value as the program sees it: unpacked where it is packed.
fn unpack_value(v: V, pack: Option<&packed::Packed>) -> Result<V, String> {
    match (v, pack) {
        (V::T(t), Some(p)) => packed::gather_last(&t, &p.classes)
            .map(V::T)
            .map_err(|e| e.to_string()),
        (v, _) => Ok(v),
    }
}

/// Errors of the interpreter name the function and the op.
fn at(func: &Function, op: &Op, m: impl std::fmt::Display) -> String {
    format!(
        "function `{}`, op `{}` ({}): {m}",
        func.name,
        op.label(),
        op.kind
    )
}

/// Ops that only move values: their outputs are as exact as their inputs.
const MOVES: &[&str] = &[
    "reshape",
    "transpose",
    "slice_by_index",
    "concat",
    "split",
    "squeeze",
    "expand_dims",
    "identity",
    "gather",
];

impl Interpreter<'_> {
    pub(super) fn run_in_pool(
        &self,
        inputs: &HashMap<String, Tensor>,
        precision: Precision,
        capture: &Capture,
    ) -> Result<RunOutput, String> {
        let func = self.func;
        let t_setup = std::time::Instant::now();
        let mut env: Map<String, V> = Map::default();
        for i in &func.inputs {
            let t = inputs.get(&i.name).ok_or_else(|| {
                format!(
                    "function `{}` needs input `{}` {:?} {:?}",
                    func.name, i.name, i.ty.dtype, i.ty.shape
                )
            })?;
            if t.dims() != i.ty.shape.as_slice() {
                return Err(format!(
                    "input `{}` has shape {:?}, the function expects {:?}",
                    i.name,
                    t.dims(),
                    i.ty.shape
                ));
            }
            let t = t.to_dtype(CDType::F32).map_err(|e| e.to_string())?;
            let t = if precision == Precision::Fp16 && i.ty.dtype.is_float() {
                round_f16_shared(&t).map_err(|e| e.to_string())?
            } else {
                t
            };
            env.insert(i.name.clone(), V::T(t));
        }
        // Values whose repeated columns are carried once (packed.rs), by name.
        let mut packs: Map<String, packed::Packed> = Map::default();
        if self.pack {
            self.pack_inputs(&mut env, &mut packs)?;
        }
        // Packed values unpacked for ops that mix columns, kept while the
        // packed value lives.
        let mut unpacked: Map<String, Tensor> = Map::default();
        // Whole values computed from packed ones, by name: the classes
        // their packed ancestors had. A value of such descent whose last
        // axis has those classes' length again (Qwen2.5-VL's window
        // attention, back from `[windows, hd, slots]` to `[1, hd, 1, S]`)
        // is packed again if its columns are checked to repeat as they say.
        let mut hints: Map<String, packed::Classes> = Map::default();
        let mut work = Work::default();
        let keep: Set<&str> = capture.names.iter().map(String::as_str).collect();
        // A run without captures follows the schedule made for the first.
        let fresh;
        let schedule = if capture.names.is_empty() {
            self.schedule()
        } else {
            fresh = Schedule::new(func, &keep, self.fuse);
            &fresh
        };
        let Schedule {
            plans,
            runs_at,
            reads,
            last_use,
        } = schedule;
        // Captured values leave `env` after their last read, into `captured`
        // ([`captured_value`]).
        let mut captured: BTreeMap<String, Tensor> = BTreeMap::new();
        let capture_value = |v: V, pack: Option<&packed::Packed>| {
            captured_value(v, pack, capture.columns.as_deref(), precision)
        };
        let mut first_overflow = None;
        // The last chain's V transposed, by value name: a head's query
        // chunks run one after another against the same V.
        let mut chain_cache = ChainCache::default();
        // ANE_EXPORT_PROFILE=1: seconds per op kind (and in fp16 rounding) on stderr.
        let profile = std::env::var_os("ANE_EXPORT_PROFILE").is_some_and(|v| v == "1");
        let mut prof: BTreeMap<String, (usize, f64)> = BTreeMap::new();
        // With the profile: the most bytes the run's values held at once
        // after an op, weights and other constants aside.
        let constants: Set<&str> = if profile {
            func.ops
                .iter()
                .filter(|o| o.kind == "const" || o.kind.starts_with("constexpr_"))
                .flat_map(|o| o.outputs.iter().map(|d| d.name.as_str()))
                .collect()
        } else {
            Set::default()
        };
        let mut peak_live = 0usize;
        if profile {
            prof.insert(
                "(setup: inputs, schedule)".into(),
                (1, t_setup.elapsed().as_secs_f64()),
            );
        }
        let t_loop = std::time::Instant::now();
        let mut peak_heap_used = 0usize;
        let heap_at_start = if profile {
            heap_bytes().map_or(0, |h| h.0)
        } else {
            0
        };
        for (index, op) in func.ops.iter().enumerate() {
            if runs_at[index] != index {
                continue;
            }
            let t_op = std::time::Instant::now();
            // Outputs packed with these classes, if any; the storages of
            // operands swapped in for the op alone.
            let mut out_classes: Option<packed::Classes> = None;
            let mut temp_storage: Vec<usize> = Vec::new();
            let outs = match plans.get(&index) {
                Some(p) => {
                    let check = precision == Precision::Fp16 && first_overflow.is_none();
                    let ChainOut {
                        ctx,
                        overflow,
                        classes,
                        rows: computed,
                    } = self
                        .exec_chain_packed(
                            p,
                            &mut env,
                            &packs,
                            &mut unpacked,
                            precision,
                            check,
                            &mut chain_cache,
                        )
                        .map_err(|m| at(func, op, m))?;
                    if first_overflow.is_none() {
                        first_overflow = overflow;
                    }
                    let rows = op.outputs.first().and_then(|o| o.ty.shape.last()).copied();
                    let rows = rows.unwrap_or(0) as u64;
                    work.query_rows.0 += computed as u64;
                    work.query_rows.1 += rows;
                    out_classes = classes;
                    vec![V::T(ctx)]
                }
                None if packs.is_empty() => self.exec(op, &env).map_err(|m| at(func, op, m))?,
                None => {
                    let plan = self
                        .pack_plan(op, &env, &packs)
                        .map_err(|m| at(func, op, m))?;
                    let (outs, classes, temps) = self
                        .exec_planned(op, plan, &mut env, &packs, &mut unpacked)
                        .map_err(|m| at(func, op, m))?;
                    out_classes = classes;
                    temp_storage = temps;
                    outs
                }
            };
            // Outputs left whole, of packed (or hinted) operands: their hint.
            let hint = match out_classes {
                None if !packs.is_empty() || !hints.is_empty() => {
                    reads[index].iter().find_map(|n| {
                        packs
                            .get(*n)
                            .map(|p| p.classes.clone())
                            .or_else(|| hints.get(*n).cloned())
                    })
                }
                _ => None,
            };
            if profile {
                let kind = if plans.contains_key(&index) {
                    "(attention chain)".to_string()
                } else {
                    op.kind.clone()
                };
                let e = prof.entry(kind).or_default();
                e.0 += 1;
                e.1 += t_op.elapsed().as_secs_f64();
            }
            let t_round = std::time::Instant::now();
            // The storages the op's operands live in: an output in none of
            // them (nor a constant's, which the interpreter caches) is the
            // op's own, and is rounded in place.
            let operand_storage: Vec<usize> = if precision == Precision::Fp16 {
                reads[index]
                    .iter()
                    .filter_map(|n| match env.get(*n) {
                        Some(V::T(t)) => storage_addr(t),
                        _ => None,
                    })
                    .chain(temp_storage)
                    .collect()
            } else {
                Vec::new()
            };
            for n in &reads[index] {
                if last_use.get(n) == Some(&index)
                    && let Some(v) = env.remove(*n)
                {
                    unpacked.remove(*n);
                    hints.remove(*n);
                    let pack = packs.remove(*n);
                    if keep.contains(n) {
                        let v = capture_value(v, pack.as_ref()).map_err(|m| at(func, op, m))?;
                        captured.insert(n.to_string(), v);
                    }
                }
            }
            if outs.len() != op.outputs.len() {
                return Err(at(
                    func,
                    op,
                    format!(
                        "produced {} outputs, declared {}",
                        outs.len(),
                        op.outputs.len()
                    ),
                ));
            }
            for (v, decl) in outs.into_iter().zip(&op.outputs) {
                // A packed output: its declared shape with the classes' width last.
                let pack = match (&out_classes, &v) {
                    (Some(c), V::T(_)) => Some(packed::Packed {
                        dims: decl.ty.shape.clone(),
                        classes: c.clone(),
                    }),
                    _ => None,
                };
                if op.kind != "const" && !op.kind.starts_with("constexpr_") {
                    let all = decl.ty.shape.last().copied().unwrap_or(1);
                    let computed = pack.as_ref().map_or(all, |p| p.width());
                    fast::count_work(2, computed, all);
                    work.columns.0 += computed as u64;
                    work.columns.1 += all as u64;
                }
                let v = match v {
                    V::T(t) => {
                        let want = match &pack {
                            Some(p) if p.dims.last() == Some(&p.classes.len()) => {
                                let mut d = p.dims.clone();
                                *d.last_mut().unwrap_or(&mut 0) = p.width();
                                d
                            }
                            Some(p) => {
                                return Err(at(
                                    func,
                                    op,
                                    format!(
                                        "output `{}` is declared {:?}, packed over {} columns",
                                        decl.name,
                                        p.dims,
                                        p.classes.len()
                                    ),
                                ));
                            }
                            None => decl.ty.shape.clone(),
                        };
                        if t.dims() != want.as_slice() {
                            return Err(at(
                                func,
                                op,
                                format!(
                                    "output `{}` has shape {:?}, declared {:?}",
                                    decl.name,
                                    t.dims(),
                                    decl.ty.shape
                                ),
                            ));
                        }
                        // fp16 constants and moved values are exact already (every
                        // value in `env` is rounded): no rounding, nothing to check.
                        let exact = (op.kind == "const" && decl.ty.dtype == DType::F16)
                            || MOVES.contains(&op.kind.as_str());
                        let t = if precision == Precision::Fp16
                            && decl.ty.dtype.is_float()
                            && t.dtype() == CDType::F32
                            && !exact
                        {
                            let check = op.kind != "const"
                                && !op.kind.starts_with("constexpr_")
                                && first_overflow.is_none();
                            let own = op.kind != "const"
                                && !op.kind.starts_with("constexpr_")
                                && storage_addr(&t).is_some_and(|a| !operand_storage.contains(&a));
                            // A packed value counts each column as often as
                            // its class stands for columns, before rounding.
                            let weighted = match (&pack, check) {
                                (Some(p), true) => Some(
                                    packed::overflow_counts(&t, &p.classes.mult)
                                        .map_err(|e| at(func, op, e))?,
                                ),
                                _ => None,
                            };
                            let check = check && weighted.is_none();
                            let (t, nonfinite, saturated) = if own {
                                round_f16_checked_owned(t, check)
                            } else {
                                round_f16_checked(&t, check)
                            }
                            .map_err(|e| at(func, op, e))?;
                            let (nonfinite, saturated) = weighted.unwrap_or((nonfinite, saturated));
                            if nonfinite + saturated > 0 {
                                first_overflow = Some(Overflow {
                                    op: decl.name.clone(),
                                    kind: op.kind.clone(),
                                    nonfinite,
                                    saturated,
                                });
                            }
                            t
                        } else {
                            t
                        };
                        V::T(t)
                    }
                    s => s,
                };
                // A whole output of packed descent: packed again where its
                // columns repeat as its hint says (checked bit for bit),
                // else the hint passes on while the last axis differs.
                let (v, pack, pass_on) = match (v, pack, &hint) {
                    (V::T(t), None, Some(c)) if t.dims().last() == Some(&c.len()) => {
                        match packed::pack_if_repeats(&t, c).map_err(|e| at(func, op, e))? {
                            Some(p) => (
                                V::T(p),
                                Some(packed::Packed {
                                    dims: decl.ty.shape.clone(),
                                    classes: c.clone(),
                                }),
                                None,
                            ),
                            None => (V::T(t), None, None),
                        }
                    }
                    (v @ V::T(_), None, Some(c)) => (v, None, Some(c.clone())),
                    (v, pack, _) => (v, pack, None),
                };
                // A value nothing reads and that is not a function output is dropped at once.
                if last_use.contains_key(decl.name.as_str()) {
                    if let Some(c) = pass_on {
                        hints.insert(decl.name.clone(), c);
                    }
                    env.insert(decl.name.clone(), v);
                    if let Some(p) = pack {
                        packs.insert(decl.name.clone(), p);
                    }
                } else if keep.contains(decl.name.as_str()) {
                    let v = capture_value(v, pack.as_ref()).map_err(|m| at(func, op, m))?;
                    captured.insert(decl.name.clone(), v);
                }
            }
            if profile {
                let e = prof.entry("(fp16 rounding and checks)".into()).or_default();
                e.0 += 1;
                e.1 += t_round.elapsed().as_secs_f64();
                let live = live_bytes(env.iter().filter_map(|(n, v)| match v {
                    V::T(t) if !constants.contains(n.as_str()) => Some(t),
                    _ => None,
                }))
                .saturating_add(live_bytes(unpacked.values().chain(captured.values())));
                peak_live = peak_live.max(live);
                if let Some((used, _)) = heap_bytes() {
                    peak_heap_used = peak_heap_used.max(used);
                }
            }
        }
        if profile {
            eprintln!(
                "profile: live values at most {:.1} MB (inputs, intermediates, unpacked and captured values; the program's constants excluded); decoded constants {:.1} MB",
                peak_live as f64 / 1048576.0,
                self.pkg.decoded_bytes() as f64 / 1048576.0
            );
            if let Some((used, size)) = heap_bytes() {
                eprintln!(
                    "profile: malloc's heap: {:.1} MB in use as the run started, at most {:.1} MB between ops, {:.1} MB now, {:.1} MB its size (the most it held at once, transients within ops included, as freed memory is kept)",
                    heap_at_start as f64 / 1048576.0,
                    peak_heap_used as f64 / 1048576.0,
                    used as f64 / 1048576.0,
                    size as f64 / 1048576.0
                );
            }
            let in_ops: f64 = prof
                .iter()
                .filter(|(k, _)| !k.starts_with("(setup"))
                .map(|(_, v)| v.1)
                .sum();
            prof.insert(
                "(between ops, profile included)".into(),
                (1, t_loop.elapsed().as_secs_f64() - in_ops),
            );
            let mut rows: Vec<_> = prof.into_iter().collect();
            rows.sort_by(|a, b| b.1.1.total_cmp(&a.1.1));
            for (k, (n, s)) in rows {
                eprintln!("profile: {k:<32} {n:>6} ops {s:>9.3} s");
            }
        }
        let mut outputs = BTreeMap::new();
        for o in &func.outputs {
            let v = env
                .get(&o.name)
                .ok_or_else(|| format!("output `{}` was never computed", o.name))?;
            let v = unpack_value(v.clone(), packs.get(&o.name))?;
            outputs.insert(o.name.clone(), v.tensor()?.clone());
        }
        for c in &capture.names {
            if !captured.contains_key(c) {
                // A function output (still in `env`), or never computed.
                let v = env
                    .get(c)
                    .ok_or_else(|| format!("value `{c}` was never computed"))?;
                captured.insert(c.clone(), capture_value(v.clone(), packs.get(c))?);
            }
        }
        Ok(RunOutput {
            outputs,
            first_overflow,
            captured,
            work,
            predict_s: None,
        })
    }
}
