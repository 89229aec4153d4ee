//! A run of a function: its inputs checked and rounded, each op executed
//! where the schedule places it (attention chains in tiles, packed values
//! where their columns repeat), fp16 rounding and overflow checks, values
//! freed after their last read, and the outputs and captured values
//! gathered.

use std::collections::{BTreeMap, HashMap};
use std::time::Instant;

use candle_core::{DType as CDType, Tensor};

use super::chain::{ChainCache, ChainOut};
use super::fp16::*;
use super::packed;
use super::profile::Profiler;
use super::program::Schedule;
use super::{Capture, Interpreter, Map, Overflow, Precision, RunOutput, Set, Tally, V, Work};
use crate::error::InterpError;
use crate::mlpackage::{DType, Function, Named, Op};

/// A captured value as a run returns it: the columns `columns` of its last
/// axis (all when `None`), taken through `pack` where it is packed; in fp16
/// mode its f32 values as f16, which holds them exactly (every op's output
/// is rounded to fp16 already) in half the memory.
fn captured_value(
    v: V,
    pack: Option<&packed::Packed>,
    columns: Option<&[usize]>,
    precision: Precision,
) -> Result<Tensor, InterpError> {
    let t = match v {
        V::T(t) => t,
        V::S(s) => return Err(InterpError::NotATensor(s)),
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
                    return Err(InterpError::CaptureColumn { column: c, len });
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
    .map_err(InterpError::from)
}

/// A value as the program sees it: unpacked where it is packed.
fn unpack_value(v: V, pack: Option<&packed::Packed>) -> Result<V, InterpError> {
    match (v, pack) {
        (V::T(t), Some(p)) => packed::gather_last(&t, &p.classes)
            .map(V::T)
            .map_err(InterpError::from),
        (v, _) => Ok(v),
    }
}

/// Errors of the interpreter name the function and the op.
fn at(func: &Function, op: &Op, error: InterpError) -> InterpError {
    InterpError::At {
        function: func.name.clone(),
        op: op.label().to_string(),
        kind: op.kind.clone(),
        error: Box::new(error),
    }
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
    /// Run on the calling thread of rayon's pool
    /// ([`Interpreter::run_capturing`]).
    pub(super) fn run_in_pool(
        &self,
        inputs: &HashMap<String, Tensor>,
        precision: Precision,
        capture: &Capture,
    ) -> Result<RunOutput, InterpError> {
        let func = self.func;
        let t_setup = Instant::now();
        let mut env = self.checked_inputs(inputs, precision)?;
        // Values whose repeated columns are carried once (packed.rs), by name.
        let mut packs: Map<String, packed::Packed> = Map::default();
        if self.pack {
            self.pack_inputs(&mut env, &mut packs)?;
        }
        let keep: Set<&str> = capture.names.iter().map(String::as_str).collect();
        // A run without captures follows the schedule made for the first.
        let fresh;
        let schedule = if capture.names.is_empty() {
            self.schedule()
        } else {
            fresh = Schedule::new(func, &keep, self.fuse);
            &fresh
        };
        let mut run = Run {
            it: self,
            precision,
            capture,
            keep,
            schedule,
            env,
            packs,
            unpacked: Map::default(),
            hints: Map::default(),
            captured: BTreeMap::new(),
            first_overflow: None,
            chain_cache: ChainCache::default(),
            work: Work::default(),
            tally: Tally::default(),
            profile: self.settings.profile.then(|| Profiler::new(func, t_setup)),
        };
        for (index, op) in func.ops.iter().enumerate() {
            if schedule.runs_at[index] == index {
                run.step(index, op).map_err(|m| at(func, op, m))?;
            }
        }
        run.finish()
    }

    /// The function's inputs from `inputs`, each checked against its
    /// declaration, as f32 (rounded to fp16 in fp16 mode where it is a
    /// float).
    fn checked_inputs(
        &self,
        inputs: &HashMap<String, Tensor>,
        precision: Precision,
    ) -> Result<Map<String, V>, InterpError> {
        let func = self.func;
        let mut env: Map<String, V> = Map::default();
        for i in &func.inputs {
            let t = inputs
                .get(&i.name)
                .ok_or_else(|| InterpError::MissingInput {
                    function: func.name.clone(),
                    name: i.name.clone(),
                    dtype: format!("{:?}", i.ty.dtype),
                    shape: i.ty.shape.clone(),
                })?;
            if t.dims() != i.ty.shape.as_slice() {
                return Err(InterpError::InputShape {
                    name: i.name.clone(),
                    expected: i.ty.shape.clone(),
                    got: t.dims().to_vec(),
                });
            }
            let t = t.to_dtype(CDType::F32)?;
            let t = if precision == Precision::Fp16 && i.ty.dtype.is_float() {
                round_f16_shared(&t)?
            } else {
                t
            };
            env.insert(i.name.clone(), V::T(t));
        }
        Ok(env)
    }
}

/// One run as it goes: the values it holds and what it has gathered.
struct Run<'r, 'p> {
    it: &'r Interpreter<'p>,
    precision: Precision,
    capture: &'r Capture,
    /// The values `capture` names.
    keep: Set<&'r str>,
    schedule: &'r Schedule<'p>,
    /// The values computed and not yet freed, by name.
    env: Map<String, V>,
    /// Values whose repeated columns are carried once (packed.rs), by name.
    packs: Map<String, packed::Packed>,
    /// Packed values unpacked for ops that mix columns, kept while the
    /// packed value lives.
    unpacked: Map<String, Tensor>,
    /// Whole values computed from packed ones, by name: the classes
    /// their packed ancestors had. A value of such descent whose last
    /// axis has those classes' length again (Qwen2.5-VL's window
    /// attention, back from `[windows, hd, slots]` to `[1, hd, 1, S]`)
    /// is packed again if its columns are checked to repeat as they say.
    hints: Map<String, packed::Classes>,
    /// Captured values, which leave `env` after their last read
    /// ([`captured_value`]).
    captured: BTreeMap<String, Tensor>,
    first_overflow: Option<Overflow>,
    /// What the run's attention chains share (the last chain's V
    /// transposed: a head's query chunks run one after another against the
    /// same V).
    chain_cache: ChainCache,
    work: Work,
    /// What the kernels' shortcuts computed.
    tally: Tally,
    /// The profile being taken, with [`super::Settings::profile`].
    profile: Option<Profiler<'p>>,
}

/// What an op gave: its outputs, the classes they are packed with (if
/// they are), and the storages of operands swapped in for the op alone.
type Outputs = (Vec<V>, Option<packed::Classes>, Vec<usize>);

impl Run<'_, '_> {
    /// Run the op at `index` (or the attention chain that ends there), free
    /// what it read last, and keep its outputs.
    fn step(&mut self, index: usize, op: &Op) -> Result<(), InterpError> {
        let t_op = Instant::now();
        let (outs, out_classes, temp_storage) = self.execute(index, op)?;
        let hint = self.hint(index, &out_classes);
        if let Some(p) = &mut self.profile {
            let kind = if self.schedule.plans.contains_key(&index) {
                "(attention chain)".to_string()
            } else {
                op.kind.clone()
            };
            p.add(kind, t_op);
        }
        let t_round = Instant::now();
        let operand_storage = self.operand_storage(index, temp_storage);
        self.free_after(index)?;
        if outs.len() != op.outputs.len() {
            return Err(InterpError::OutputCount {
                got: outs.len(),
                declared: op.outputs.len(),
            });
        }
        for (v, decl) in outs.into_iter().zip(&op.outputs) {
            self.keep_output(op, v, decl, &out_classes, hint.as_ref(), &operand_storage)?;
        }
        if let Some(p) = &mut self.profile {
            p.add("(fp16 rounding and checks)".into(), t_round);
            p.after_op(
                &self.env,
                self.unpacked.values().chain(self.captured.values()),
            );
        }
        Ok(())
    }

    /// The op's outputs: its attention chain's context where one ends at
    /// `index`, else the op run on whole or packed operands.
    fn execute(&mut self, index: usize, op: &Op) -> Result<Outputs, InterpError> {
        let it = self.it;
        let Some(p) = self.schedule.plans.get(&index) else {
            if self.packs.is_empty() {
                return Ok((it.exec(op, &self.env, &self.tally)?, None, Vec::new()));
            }
            let plan = it.pack_plan(op, &self.env, &self.packs)?;
            return it.exec_planned(
                op,
                plan,
                &mut self.env,
                &self.packs,
                &mut self.unpacked,
                &self.tally,
            );
        };
        let check = self.precision == Precision::Fp16 && self.first_overflow.is_none();
        let ChainOut {
            ctx,
            overflow,
            classes,
            rows: computed,
        } = it.exec_chain_packed(
            p,
            &mut self.env,
            &self.packs,
            &mut self.unpacked,
            self.precision,
            check,
            &mut self.chain_cache,
            &self.tally,
        )?;
        if self.first_overflow.is_none() {
            self.first_overflow = overflow;
        }
        let rows = op.outputs.first().and_then(|o| o.ty.shape.last()).copied();
        let rows = rows.unwrap_or(0) as u64;
        self.work.query_rows.0 += computed as u64;
        self.work.query_rows.1 += rows;
        Ok((vec![V::T(ctx)], classes, Vec::new()))
    }

    /// Outputs left whole, of packed (or hinted) operands: their hint.
    fn hint(&self, index: usize, out_classes: &Option<packed::Classes>) -> Option<packed::Classes> {
        match out_classes {
            None if !self.packs.is_empty() || !self.hints.is_empty() => {
                self.schedule.reads[index].iter().find_map(|n| {
                    self.packs
                        .get(*n)
                        .map(|p| p.classes.clone())
                        .or_else(|| self.hints.get(*n).cloned())
                })
            }
            _ => None,
        }
    }

    /// The storages the op's operands live in: an output in none of
    /// them (nor a constant's, which the interpreter caches) is the
    /// op's own, and is rounded in place.
    fn operand_storage(&self, index: usize, temp_storage: Vec<usize>) -> Vec<usize> {
        if self.precision == Precision::Fp16 {
            self.schedule.reads[index]
                .iter()
                .filter_map(|n| match self.env.get(*n) {
                    Some(V::T(t)) => storage_addr(t),
                    _ => None,
                })
                .chain(temp_storage)
                .collect()
        } else {
            Vec::new()
        }
    }

    /// Free the values the op at `index` read last (captured ones go to
    /// `captured`).
    fn free_after(&mut self, index: usize) -> Result<(), InterpError> {
        let schedule = self.schedule;
        for n in &schedule.reads[index] {
            if schedule.last_use.get(n) == Some(&index)
                && let Some(v) = self.env.remove(*n)
            {
                self.unpacked.remove(*n);
                self.hints.remove(*n);
                let pack = self.packs.remove(*n);
                if self.keep.contains(n) {
                    let v = self.capture_value(v, pack.as_ref())?;
                    self.captured.insert(n.to_string(), v);
                }
            }
        }
        Ok(())
    }

    /// A captured value as the run returns it ([`captured_value`]).
    fn capture_value(&self, v: V, pack: Option<&packed::Packed>) -> Result<Tensor, InterpError> {
        captured_value(v, pack, self.capture.columns.as_deref(), self.precision)
    }

    /// Keep the op's output `v`, declared `decl`: checked against its
    /// declared shape, rounded to fp16 (and checked) in fp16 mode, packed
    /// again where its hint's columns repeat, and dropped at once where
    /// nothing reads it.
    fn keep_output(
        &mut self,
        op: &Op,
        v: V,
        decl: &Named,
        out_classes: &Option<packed::Classes>,
        hint: Option<&packed::Classes>,
        operand_storage: &[usize],
    ) -> Result<(), InterpError> {
        // A packed output: its declared shape with the classes' width last.
        let pack = match (out_classes, &v) {
            (Some(c), V::T(_)) => Some(packed::Packed {
                dims: decl.ty.shape.clone(),
                classes: c.clone(),
            }),
            _ => None,
        };
        if op.kind != "const" && !op.kind.starts_with("constexpr_") {
            let all = decl.ty.shape.last().copied().unwrap_or(1);
            let computed = pack.as_ref().map_or(all, |p| p.width());
            self.work.columns.0 += computed as u64;
            self.work.columns.1 += all as u64;
        }
        let v = match v {
            V::T(t) => V::T(self.rounded(op, t, decl, pack.as_ref(), operand_storage)?),
            s => s,
        };
        // A whole output of packed descent: packed again where its
        // columns repeat as its hint says (checked bit for bit),
        // else the hint passes on while the last axis differs.
        let (v, pack, pass_on) = match (v, pack, hint) {
            (V::T(t), None, Some(c)) if t.dims().last() == Some(&c.len()) => {
                match packed::pack_if_repeats(&t, c)? {
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
        if self.schedule.last_use.contains_key(decl.name.as_str()) {
            if let Some(c) = pass_on {
                self.hints.insert(decl.name.clone(), c);
            }
            self.env.insert(decl.name.clone(), v);
            if let Some(p) = pack {
                self.packs.insert(decl.name.clone(), p);
            }
        } else if self.keep.contains(decl.name.as_str()) {
            let v = self.capture_value(v, pack.as_ref())?;
            self.captured.insert(decl.name.clone(), v);
        }
        Ok(())
    }

    /// An output tensor checked against its declared shape (with `pack`'s
    /// width last where it is packed) and, in fp16 mode, rounded to fp16,
    /// the first overflow noted.
    fn rounded(
        &mut self,
        op: &Op,
        t: Tensor,
        decl: &Named,
        pack: Option<&packed::Packed>,
        operand_storage: &[usize],
    ) -> Result<Tensor, InterpError> {
        let want = match pack {
            Some(p) if p.dims.last() == Some(&p.classes.len()) => {
                let mut d = p.dims.clone();
                *d.last_mut().unwrap_or(&mut 0) = p.width();
                d
            }
            Some(p) => {
                return Err(internal!(
                    "output `{}` is declared {:?}, packed over {} columns",
                    decl.name,
                    p.dims,
                    p.classes.len()
                ));
            }
            None => decl.ty.shape.clone(),
        };
        if t.dims() != want.as_slice() {
            return Err(InterpError::OutputShape {
                name: decl.name.clone(),
                got: t.dims().to_vec(),
                declared: decl.ty.shape.clone(),
            });
        }
        // fp16 constants and moved values are exact already (every
        // value in `env` is rounded): no rounding, nothing to check.
        let exact = (op.kind == "const" && decl.ty.dtype == DType::F16)
            || MOVES.contains(&op.kind.as_str());
        if self.precision != Precision::Fp16
            || !decl.ty.dtype.is_float()
            || t.dtype() != CDType::F32
            || exact
        {
            return Ok(t);
        }
        let check = op.kind != "const"
            && !op.kind.starts_with("constexpr_")
            && self.first_overflow.is_none();
        let own = op.kind != "const"
            && !op.kind.starts_with("constexpr_")
            && storage_addr(&t).is_some_and(|a| !operand_storage.contains(&a));
        // A packed value counts each column as often as
        // its class stands for columns, before rounding.
        let weighted = match (pack, check) {
            (Some(p), true) => Some(packed::overflow_counts(&t, &p.classes.mult)?),
            _ => None,
        };
        let check = check && weighted.is_none();
        let (t, nonfinite, saturated) = if own {
            round_f16_checked_owned(t, check)
        } else {
            round_f16_checked(&t, check)
        }?;
        let (nonfinite, saturated) = weighted.unwrap_or((nonfinite, saturated));
        if nonfinite + saturated > 0 {
            self.first_overflow = Some(Overflow {
                op: decl.name.clone(),
                kind: op.kind.clone(),
                nonfinite,
                saturated,
            });
        }
        Ok(t)
    }

    /// The run's outputs (unpacked), and the captured values still held.
    fn finish(self) -> Result<RunOutput, InterpError> {
        let profile = self.profile.map(|p| p.finish(self.it.pkg.decoded_bytes()));
        let mut work = self.work;
        (work.conv_columns, work.scores) = self.tally.counts();
        let mut outputs = BTreeMap::new();
        let mut captured = self.captured;
        for o in &self.it.func.outputs {
            let v = self
                .env
                .get(&o.name)
                .ok_or_else(|| InterpError::OutputNotComputed(o.name.clone()))?;
            let v = unpack_value(v.clone(), self.packs.get(&o.name))?;
            outputs.insert(o.name.clone(), v.tensor()?.clone());
        }
        for c in &self.capture.names {
            if !captured.contains_key(c) {
                // A function output (still in `env`), or never computed.
                let v = self
                    .env
                    .get(c)
                    .ok_or_else(|| InterpError::NotComputed(c.clone()))?;
                let v = captured_value(
                    v.clone(),
                    self.packs.get(c),
                    self.capture.columns.as_deref(),
                    self.precision,
                )?;
                captured.insert(c.clone(), v);
            }
        }
        Ok(RunOutput {
            outputs,
            first_overflow: self.first_overflow,
            captured,
            work,
            predict_s: None,
            profile,
        })
    }
}
