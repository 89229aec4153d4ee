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
use super::{
    AneRule, Capture, Interpreter, Map, Overflow, Peak, Precision, RunOutput, Set, Tally, V, Work,
    ane_limit,
};
use crate::error::InterpError;
use crate::mlpackage::{Arg, DType, Function, Named, Op};

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
    let half = precision.rounds() && t.dtype() == CDType::F32;
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
            peaks: Vec::new(),
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
            // An input declared as integers stays integers (i64, as every
            // integer value the interpreter holds), so that integer ops
            // compute as Core ML does (`real_div` of two int32 tensors
            // truncates); one declared as bools is u8; the rest is f32.
            let t = if matches!(i.ty.dtype, DType::I8 | DType::I16 | DType::I32 | DType::I64) {
                t.to_dtype(CDType::I64)?
            } else if i.ty.dtype == DType::Bool {
                t.to_dtype(CDType::U8)?
            } else {
                t.to_dtype(CDType::F32)?
            };
            let t = if precision.rounds() && i.ty.dtype.is_float() {
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
    /// Each float op's largest `|x|` (fp16 and ane modes).
    peaks: Vec<Peak>,
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
        // Read before the operands are freed.
        let rule = self.rule(op)?;
        self.free_after(index)?;
        if outs.len() != op.outputs.len() {
            return Err(InterpError::OutputCount {
                got: outs.len(),
                declared: op.outputs.len(),
            });
        }
        for (v, decl) in outs.into_iter().zip(&op.outputs) {
            self.keep_output(
                op,
                v,
                decl,
                &out_classes,
                hint.as_ref(),
                &operand_storage,
                rule,
            )?;
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
            if let Some(t) = self.narrow_sum(op)? {
                return Ok((vec![V::T(t)], None, Vec::new()));
            }
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
        let check = self.precision.rounds() && self.first_overflow.is_none();
        let ChainOut {
            ctx,
            overflow,
            classes,
            rows: computed,
            peaks,
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
        if self.precision.rounds() {
            // The inner ops' peaks, in program order (the ctx matmul's comes
            // with its rounding).
            let ops = &it.func.ops;
            let stages = [Some(p.scores), Some(p.scaled), p.masked, Some(p.probs)];
            for (i, m) in stages.iter().zip(peaks) {
                if let Some(o) = i.map(|i| &ops[i]) {
                    let rule = AneRule::product_if(o.kind == "matmul");
                    self.peaks.push(Peak {
                        op: o.label().to_string(),
                        kind: o.kind.clone(),
                        max_abs: m,
                        limit: ane_limit(&rule),
                        input_sq_max: None,
                    });
                }
            }
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
        if self.precision.rounds() {
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
    #[allow(clippy::too_many_arguments)]
    fn keep_output(
        &mut self,
        op: &Op,
        v: V,
        decl: &Named,
        out_classes: &Option<packed::Classes>,
        hint: Option<&packed::Classes>,
        operand_storage: &[usize],
        rule: Option<(AneRule, Option<f32>)>,
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
            V::T(t) => V::T(self.rounded(op, t, decl, pack.as_ref(), operand_storage, rule)?),
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
    /// width last where it is packed) and, in fp16 and ane modes, rounded to
    /// fp16 (in ane mode then [`AneRule`]), its peak and the first overflow
    /// noted. `rule` is [`Run::rule`]'s.
    fn rounded(
        &mut self,
        op: &Op,
        t: Tensor,
        decl: &Named,
        pack: Option<&packed::Packed>,
        operand_storage: &[usize],
        rule: Option<(AneRule, Option<f32>)>,
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
        // `rule` is `Some` in fp16 and ane modes alone.
        let Some((rule, input_sq_max)) = rule else {
            return Ok(t);
        };
        if !decl.ty.dtype.is_float() || t.dtype() != CDType::F32 {
            return Ok(t);
        }
        let made = op.kind == "const" || op.kind.starts_with("constexpr_");
        let ane = (self.precision == Precision::Ane && !made).then_some(&rule);
        if exact {
            if made || !rule.slice_clamp {
                return Ok(t);
            }
            // An offset slice's values are fp16 already: its peak, and in
            // ane mode its clamp.
            let (t, seen) = match ane {
                Some(r) => ane_copy(&t, r)?,
                None => {
                    let m = with_f32(&t, max_abs)?;
                    let seen = Seen {
                        max_abs: m,
                        ..Seen::default()
                    };
                    (t, seen)
                }
            };
            self.note(op, decl, &t, (&rule, input_sq_max), pack, &seen, None)?;
            return Ok(t);
        }
        let check = !made && self.first_overflow.is_none();
        let own = !made && storage_addr(&t).is_some_and(|a| !operand_storage.contains(&a));
        // A packed value counts each column as often as
        // its class stands for columns, before rounding.
        let weighted = match (pack, check, ane) {
            (Some(p), true, None) => Some(packed::overflow_counts(&t, &p.classes.mult)?),
            _ => None,
        };
        let check = check && weighted.is_none();
        let (t, seen) = if own {
            round_f16_checked_owned(t, check, ane)
        } else {
            round_f16_seen_copy(&t, check, ane)
        }?;
        if !made {
            self.note(op, decl, &t, (&rule, input_sq_max), pack, &seen, weighted)?;
        }
        Ok(t)
    }

    /// Note an op's output `t` (rounded, in ane mode after its rule): its
    /// peak, and the first overflow if it is one: in fp16 mode, values
    /// non-finite or beyond fp16's range before rounding (`weighted` for a
    /// packed value); in ane mode, infs in `t` (counted over every column of
    /// a packed value).
    #[allow(clippy::too_many_arguments)]
    fn note(
        &mut self,
        op: &Op,
        decl: &Named,
        t: &Tensor,
        (rule, input_sq_max): (&AneRule, Option<f32>),
        pack: Option<&packed::Packed>,
        seen: &Seen,
        weighted: Option<(usize, usize)>,
    ) -> Result<(), InterpError> {
        self.peaks.push(Peak {
            op: decl.name.clone(),
            kind: op.kind.clone(),
            max_abs: seen.max_abs,
            limit: ane_limit(rule),
            input_sq_max,
        });
        if self.first_overflow.is_some() {
            return Ok(());
        }
        let (nonfinite, saturated) = match (self.precision, pack) {
            (Precision::Ane, _) if seen.infs == 0 => (0, 0),
            (Precision::Ane, Some(p)) => {
                (packed::overflow_counts(t, &p.classes.mult)?.0, seen.made)
            }
            (Precision::Ane, None) => (seen.infs, seen.made),
            _ => weighted.unwrap_or(seen.counts),
        };
        if nonfinite + saturated > 0 {
            self.first_overflow = Some(Overflow {
                op: decl.name.clone(),
                kind: op.kind.clone(),
                nonfinite,
                saturated,
            });
        }
        Ok(())
    }

    /// In fp16 and ane modes, the op's [`AneRule`] (its limit is the peak's;
    /// ane mode applies it) and, for layer_norm, the largest square of its
    /// input; read while the operands are held.
    fn rule(&self, op: &Op) -> Result<Option<(AneRule, Option<f32>)>, InterpError> {
        if !self.precision.rounds() {
            return Ok(None);
        }
        let mut r = AneRule::default();
        let mut sq = None;
        match op.kind.as_str() {
            "matmul" | "linear" => r = AneRule::PRODUCT,
            "conv" => {
                // weight [C_out, C_in / groups, kernel...]: one tap passes ([G]).
                let w = self.operand(op, "weight")?;
                let taps: usize = w.dims().iter().skip(1).product();
                r = AneRule {
                    ceiling: taps != 1,
                    ..AneRule::PRODUCT
                };
            }
            "log" => r.log_inf_zero = true,
            "slice_by_index" => {
                let dims = match op.inputs.get("x").map(Vec::as_slice) {
                    Some([Arg::Var(n)]) if self.packs.contains_key(n) => self.packs[n].dims.clone(),
                    _ => self.operand(op, "x")?.dims().to_vec(),
                };
                r.slice_clamp = self.it.slice_offset_last(op, &self.env, &dims)?;
            }
            "layer_norm" => {
                let x = self.operand(op, "x")?;
                if x.dtype() == CDType::F32 {
                    let m = with_f32(&x, max_abs)?;
                    sq = Some(m * m);
                }
            }
            _ => {}
        }
        Ok(Some((r, sq)))
    }

    /// The op's tensor input `key`, as it stands in the run (packed or not).
    fn operand(&self, op: &Op, key: &str) -> Result<Tensor, InterpError> {
        let v = self
            .it
            .arg(op, &self.env, key)?
            .ok_or_else(|| InterpError::MissingArg(key.to_string()))?;
        Ok(v.tensor()?.clone())
    }

    /// In ane mode, a float `reduce_sum` summed in fp16 ([`Interpreter::narrow_sum`]),
    /// on its operand unpacked.
    fn narrow_sum(&self, op: &Op) -> Result<Option<Tensor>, InterpError> {
        if self.precision != Precision::Ane || op.kind != "reduce_sum" {
            return Ok(None);
        }
        let x = self.operand(op, "x")?;
        if x.dtype().is_int() {
            return Ok(None);
        }
        let x = match op.inputs.get("x").map(Vec::as_slice) {
            Some([Arg::Var(n)]) if self.packs.contains_key(n) => {
                packed::gather_last(&x, &self.packs[n].classes)?
            }
            _ => x,
        };
        let x = x.to_dtype(CDType::F32)?;
        self.it.narrow_sum(op, &self.env, &x).map(Some)
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
            peaks: self.peaks,
            captured,
            work,
            predict_s: None,
            profile,
        })
    }
}
