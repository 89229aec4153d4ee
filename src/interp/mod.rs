//! An interpreter for ML programs read from `.mlpackage`s, over candle on the CPU.
//!
//! It executes the exact bytes that ship, in one of two numeric modes:
//! [`Precision::Fp32`] computes every op in f32, whatever dtype the program
//! declares (casts to fp16 keep f32 values; stored fp16 weights are used as
//! stored); [`Precision::Fp16`] rounds inputs and every op's floating-point
//! output to fp16, as the Neural Engine stores activations, and reports the
//! first op whose output holds inf, NaN or a value beyond fp16's range. Unsupported ops are reported, with where they
//! occur, before anything runs.

mod fast;
mod fp16;
mod fuse;
mod kernels;
mod ops;
mod packed;
mod weights;

use std::collections::{BTreeMap, HashMap};

/// The interpreter's own maps and sets, keyed by value names and op
/// indices of the program it runs: hashed with FxHash, which costs a
/// fraction of SipHash per lookup (a 2B-shaped tower's function has about
/// 60,000 ops, each looked up several times per run).
pub(crate) type Map<K, V> = rustc_hash::FxHashMap<K, V>;
pub(crate) type Set<K> = rustc_hash::FxHashSet<K>;

use candle_core::{DType as CDType, Device, Tensor};
use rayon::prelude::*;

use crate::mlpackage::{Arg, DType, Function, HostData, Op, Package, Value};

pub use fast::{rows_independent_here, shortcut_work, shortcuts};
use fp16::*;
pub use fp16::{round_f16_in_place, round_to_f16};
pub use ops::SUPPORTED_OPS;
use weights::*;

crate::named::named_enum! {
    /// Numeric mode.
    #[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
    pub enum Precision {
        /// Every op in f32.
        Fp32 = "fp32",
        /// Every floating-point op output rounded to fp16.
        Fp16 = "fp16",
    }
}

/// A runtime value: a tensor (floats as f32, integers as i64, bools as u8;
/// fp16 only for the weights of [`Interpreter::stored_fp16`]) or a string.
#[derive(Clone, Debug)]
pub enum V {
    T(Tensor),
    S(String),
}

impl V {
    pub fn tensor(&self) -> Result<&Tensor, String> {
        match self {
            V::T(t) => Ok(t),
            V::S(s) => Err(format!("expected a tensor, got the string `{s}`")),
        }
    }
}

/// The first op whose fp16 output was not finite or saturated.
#[derive(Clone, Debug, serde::Serialize, serde::Deserialize)]
pub struct Overflow {
    pub op: String,
    pub kind: String,
    pub nonfinite: usize,
    pub saturated: usize,
}

/// What a run computed, against what the program asks: fewer where
/// values were carried packed (`packed.rs`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Work {
    /// Ops' output columns (their last axis): (computed, in all).
    pub columns: (u64, u64),
    /// Attention chains' query rows: (computed, in all).
    pub query_rows: (u64, u64),
}

/// What a run produced.
pub struct RunOutput {
    /// Function outputs by name, as f32 (or i64) tensors.
    pub outputs: BTreeMap<String, Tensor>,
    /// fp16 mode only: the first op that overflowed, if any.
    pub first_overflow: Option<Overflow>,
    /// Intermediate values asked for with [`Interpreter::run_capturing`], by
    /// name; in fp16 mode as f16 tensors (their values are fp16 already).
    pub captured: BTreeMap<String, Tensor>,
    /// What the interpreter computed of what the program asks (zero from
    /// Core ML).
    pub work: Work,
    /// Seconds of the prediction alone, when the executor times it apart
    /// from passing the tensors (Core ML: `predict` in its child process);
    /// `None` when there is nothing apart (the interpreter).
    pub predict_s: Option<f64>,
}

/// The values a run keeps besides the function's outputs
/// ([`Interpreter::run_capturing`]).
#[derive(Clone, Debug, Default)]
pub struct Capture {
    /// Op outputs, by name.
    pub names: Vec<String>,
    /// The columns (indices along the last axis) kept of each, in this
    /// order; every column when `None`. The cosine gate keeps the real
    /// patches' columns alone: a block's output in a 4096-patch bucket is
    /// 16 MB in f32, a 300-patch image's columns of it 1.2 MB.
    pub columns: Option<Vec<usize>>,
}

impl Capture {
    /// The values named in `names`, every column.
    pub fn names(names: &[String]) -> Self {
        Capture {
            names: names.to_vec(),
            columns: None,
        }
    }
}

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

/// What a run's attention chains keep from one chain to the next: the
/// last `v` transposed (the query chunks of one head share it) and each
/// mask's spans by name (values are SSA names: within a run, one name is one
/// value).
#[derive(Default)]
struct ChainCache {
    vt: Option<(String, Option<fast::TransposedV>)>,
    spans: Map<String, fast::MaskSpans>,
    /// Per mask name: its rows for the last packed queries that used it.
    rows: RowCache,
    /// The last chain's k by name, and its keys' largest norms.
    kmax: Option<(String, std::sync::OnceLock<Vec<f64>>)>,
}

#[derive(Default)]
struct RowCache(Map<String, PackedRows>);

/// A mask's rows for packed queries of some classes: `None` when the
/// mask's rows do not repeat as the queries' columns do.
struct PackedRows {
    classes: Vec<u32>,
    mask: Option<Tensor>,
    spans: Option<fast::MaskSpans>,
}

impl RowCache {
    /// The rows of `mask [batch or 1, queries, keys]` for queries packed
    /// over `classes` (one row per class, its first query's), if every
    /// query's row equals its class's first row bit for bit; kept per mask
    /// name while the classes stay the same.
    fn packed_rows(
        &mut self,
        name: &str,
        mask: &Tensor,
        classes: &packed::Index,
    ) -> Result<Option<Tensor>, String> {
        if let Some(r) = self.0.get(name)
            && r.classes == classes.of
        {
            return Ok(r.mask.clone());
        }
        let e = |e: candle_core::Error| e.to_string();
        let (mb, nq, nk) = mask.dims3().map_err(e)?;
        let first = &classes.first;
        let repeats = with_f32(mask, |m| {
            (0..mb * nq).into_par_iter().all(|r| {
                let (b, j) = (r / nq, r % nq);
                let f = first[classes[j] as usize] as usize;
                let (a, c) = ((b * nq + j) * nk, (b * nq + f) * nk);
                m[a..a + nk]
                    .iter()
                    .zip(&m[c..c + nk])
                    .all(|(x, y)| x.to_bits() == y.to_bits())
            })
        })
        .map_err(e)?;
        let rows = if repeats {
            let idx = Tensor::from_vec(first.clone(), first.len(), &Device::Cpu).map_err(e)?;
            Some(
                mask.index_select(&idx, 1)
                    .map_err(e)?
                    .contiguous()
                    .map_err(e)?,
            )
        } else {
            None
        };
        self.0.insert(
            name.to_string(),
            PackedRows {
                classes: classes.of.clone(),
                mask: rows.clone(),
                spans: None,
            },
        );
        Ok(rows)
    }
}

/// What an attention chain gave: its context (packed with `classes`, if
/// any), its first overflow, and how many query rows it computed.
struct ChainOut {
    ctx: Tensor,
    overflow: Option<Overflow>,
    classes: Option<packed::Classes>,
    rows: usize,
}

/// What [`chain_run`] needs besides the operands.
struct ChainArgs<'a> {
    vt: Option<&'a fast::TransposedV>,
    kmax: Option<&'a std::sync::OnceLock<Vec<f64>>>,
    spans: Option<&'a fast::MaskSpans>,
    scale: f32,
    /// (batch, hd, hdv, queries, keys).
    dims: (usize, usize, usize, usize, usize),
    fp16: bool,
    check: bool,
}

/// [`fast::attention_chain`] on tensors (contiguous f32).
fn chain_run(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    mask: Option<&Tensor>,
    a: &ChainArgs,
) -> Result<(Vec<f32>, [fast::Counts; 4]), String> {
    let (batch, hd, hdv, queries, keys) = a.dims;
    with_f32(q, |q| {
        with_f32(k, |k| {
            with_f32(v, |v| {
                let run = |mask: Option<&[f32]>| {
                    fast::attention_chain(
                        &fast::Chain {
                            q,
                            k,
                            v,
                            mask,
                            vt: a.vt,
                            kmax: a.kmax,
                            spans: a.spans,
                            scale: a.scale,
                            batch,
                            hd,
                            hdv,
                            queries,
                            keys,
                        },
                        a.fp16,
                        a.check,
                    )
                };
                match mask {
                    Some(m) => with_f32(m, |m| run(Some(m))),
                    None => Ok(run(None)),
                }
            })
        })
    })
    .and_then(|r| r)
    .and_then(|r| r)
    .and_then(|r| r)
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

/// A function of a package, checked and ready to run.
pub struct Interpreter<'p> {
    pkg: &'p Package,
    func: &'p Function,
    fuse: bool,
    /// Carry repeated columns packed (`packed.rs`).
    pack: bool,
    /// The constants kept in fp16 as stored ([`fp16_conv_weights`]).
    fp16_weights: Set<&'p str>,
    /// The schedule of runs without captures, made by the first.
    schedule: std::sync::OnceLock<Schedule<'p>>,
}

/// Where a run executes each op and when it frees each value: made once
/// per interpreter for its runs without captures (`exec --runs`), afresh
/// for a run that captures values.
struct Schedule<'p> {
    /// Attention chains by the index of their last op (fuse.rs): they run
    /// in tiles there, their other ops are skipped and what they read is
    /// read there.
    plans: Map<usize, fuse::Plan>,
    /// Per op, the index of the op it runs at (its own, or its chain's).
    runs_at: Vec<usize>,
    /// Per op, the values it reads (where it runs).
    reads: Vec<Vec<&'p str>>,
    /// Per value, the index of the last op that reads it (`usize::MAX`
    /// for function outputs): each value is freed after it, since a
    /// tower's program holds thousands of intermediates.
    last_use: Map<&'p str, usize>,
}

impl<'p> Schedule<'p> {
    fn new(func: &'p Function, keep: &Set<&str>, fuse: bool) -> Self {
        let plans = if fuse {
            fuse::plan(func, keep)
        } else {
            Map::default()
        };
        let mut runs_at: Vec<usize> = (0..func.ops.len()).collect();
        for p in plans.values() {
            for i in p.ops() {
                runs_at[i] = p.ctx;
            }
        }
        let mut reads: Vec<Vec<&str>> = vec![Vec::new(); func.ops.len()];
        let mut last_use: Map<&str, usize> = Map::default();
        for (i, op) in func.ops.iter().enumerate() {
            for a in op.inputs.values().flatten() {
                if let Arg::Var(n) = a {
                    let at = runs_at[i];
                    reads[at].push(n.as_str());
                    let e = last_use.entry(n.as_str()).or_insert(at);
                    *e = (*e).max(at);
                }
            }
        }
        for o in &func.outputs {
            last_use.insert(o.name.as_str(), usize::MAX);
        }
        Schedule {
            plans,
            runs_at,
            reads,
            last_use,
        }
    }
}

/// The `const` ops of `func` whose fp16 blob feeds nothing but `conv` ops'
/// `weight` (the ANE layout's Linears): the interpreter keeps them in fp16,
/// as the package stores them, and the 1x1 convolution widens a task's rows
/// at a time as it multiplies (`blas::sgemm_f16a`; widening is exact). Every
/// other value is f32 or i64, so an op that reads one of these is a conv.
fn fp16_conv_weights(func: &Function) -> Set<&str> {
    let mut only_conv_weight: Map<&str, bool> = Map::default();
    for op in &func.ops {
        for (key, args) in &op.inputs {
            for a in args {
                if let Arg::Var(n) = a {
                    *only_conv_weight.entry(n.as_str()).or_insert(true) &=
                        op.kind == "conv" && key == "weight";
                }
            }
        }
    }
    func.ops
        .iter()
        .filter(|o| {
            o.kind == "const" && matches!(o.attributes.get("val"), Some(Value::Blob { .. }))
        })
        .filter_map(|o| match o.outputs.as_slice() {
            [out] if out.ty.dtype == DType::F16 => Some(out.name.as_str()),
            _ => None,
        })
        .filter(|n| {
            only_conv_weight.get(n) == Some(&true) && !func.outputs.iter().any(|o| o.name == *n)
        })
        .collect()
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

impl<'p> Interpreter<'p> {
    /// Choose a function and check, before running anything, that every op is supported.
    pub fn new(pkg: &'p Package, function: Option<&str>) -> Result<Self, String> {
        let func = pkg.program.function(function)?;
        let unsupported: Vec<String> = func
            .ops
            .iter()
            .filter(|o| !SUPPORTED_OPS.contains(&o.kind.as_str()))
            .map(|o| format!("`{}` (op `{}`)", o.kind, o.label()))
            .collect();
        if !unsupported.is_empty() {
            return Err(format!(
                "function `{}` uses ops the interpreter does not support: {}",
                func.name,
                unsupported.join(", ")
            ));
        }
        check_string_params(func)?;
        Ok(Interpreter {
            pkg,
            func,
            fuse: true,
            pack: shortcuts(),
            fp16_weights: fp16_conv_weights(func),
            schedule: std::sync::OnceLock::new(),
        })
    }

    /// Run every op one by one, without running attention chains in tiles
    /// (the two give the same values up to the order of sums; tests compare them).
    pub fn without_fusion(mut self) -> Self {
        self.fuse = false;
        self.schedule = std::sync::OnceLock::new();
        self
    }

    /// Compute every column of every value, without packing repeated ones
    /// (the two give the same bits; tests compare them).
    pub fn without_packing(mut self) -> Self {
        self.pack = false;
        self
    }

    /// How many attention chains a run without captures executes in tiles.
    pub fn attention_chains(&self) -> usize {
        self.schedule().plans.len()
    }

    /// The schedule of runs without captures, made by the first use.
    fn schedule(&self) -> &Schedule<'p> {
        self.schedule
            .get_or_init(|| Schedule::new(self.func, &Set::default(), self.fuse))
    }

    pub fn function(&self) -> &Function {
        self.func
    }

    /// Run on named inputs (f32 tensors whose shapes match the declared inputs).
    pub fn run(
        &self,
        inputs: &HashMap<String, Tensor>,
        precision: Precision,
    ) -> Result<RunOutput, String> {
        self.run_capturing(inputs, precision, &Capture::default())
    }

    /// Run, and also keep the values `capture` names (op outputs), e.g.
    /// the output of each block, for reports of where drift enters.
    pub fn run_capturing(
        &self,
        inputs: &HashMap<String, Tensor>,
        precision: Precision,
        capture: &Capture,
    ) -> Result<RunOutput, String> {
        // On a thread of rayon's pool: the ops' parallel loops then start
        // where they run, instead of each waking the pool from outside and
        // waiting (a packed call's ops are small, and many).
        rayon::scope(|_| self.run_in_pool(inputs, precision, capture))
    }

    fn run_in_pool(
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

    /// Run an attention chain in tiles; in fp16 mode with `check`, also
    /// name the first of its inner ops whose output overflowed.
    ///
    /// With `q_classes`, `q` in `env` is packed over those classes: where
    /// each query row is computed alike wherever it stands
    /// ([`fast::rows_independent`]) and the mask's rows repeat as q's columns
    /// do, the chain runs on the distinct rows alone and its context comes
    /// back packed with the same classes ([`ChainOut::classes`]); otherwise,
    /// or when a stage overflows (whose counts must be the whole chain's), it
    /// runs on every row, and its context is packed only if its columns are
    /// checked to repeat as q's do.
    fn exec_chain(
        &self,
        p: &fuse::Plan,
        env: &Map<String, V>,
        precision: Precision,
        check: bool,
        cache: &mut ChainCache,
        q_classes: Option<&packed::Classes>,
    ) -> Result<ChainOut, String> {
        let ops = &self.func.ops;
        let (sc, cx) = (&ops[p.scores], &ops[p.ctx]);
        let get = |op: &Op, k: &str| -> Result<Tensor, String> {
            self.arg(op, env, k)?
                .ok_or_else(|| format!("missing input `{k}`"))?
                .tensor()?
                .to_dtype(CDType::F32)
                .and_then(|t| t.contiguous())
                .map_err(|e| e.to_string())
        };
        let (q, k, v) = (get(sc, "x")?, get(sc, "y")?, get(cx, "x")?);
        let scale = self.resolve(&p.scale, env)?;
        let scale = scale
            .tensor()?
            .flatten_all()
            .and_then(|t| t.to_dtype(CDType::F32))
            .and_then(|t| t.to_vec1::<f32>())
            .map_err(|e| e.to_string())?;
        let mask = match &p.mask {
            Some(m) => Some(
                self.resolve(m, env)?
                    .tensor()?
                    .to_dtype(CDType::F32)
                    .and_then(|t| t.contiguous())
                    .map_err(|e| e.to_string())?,
            ),
            None => None,
        };
        let ((b, hd, nqp), (_, _, nk), (_, hdv, _)) = (
            q.dims3().map_err(|e| e.to_string())?,
            k.dims3().map_err(|e| e.to_string())?,
            v.dims3().map_err(|e| e.to_string())?,
        );
        let nq = q_classes.map_or(nqp, |c| c.len());
        // The planner checked the declared shapes; every value has its declared shape.
        if k.dims() != [b, hd, nk]
            || v.dims() != [b, hdv, nk]
            || scale.len() != 1
            || q_classes.is_some_and(|c| c.width() != nqp)
            || mask
                .as_ref()
                .is_some_and(|m| m.dims() != [b, nq, nk] && m.dims() != [1, nq, nk])
        {
            return Err(format!(
                "attention chain operands q {:?}, k {:?}, v {:?}, mask {:?} do not fit",
                q.dims(),
                k.dims(),
                v.dims(),
                mask.as_ref().map(|m| m.dims().to_vec())
            ));
        }
        let fp16 = precision == Precision::Fp16;
        // Values are SSA names: within a run, one name is one value.
        let v_name = match cx.inputs.get("x").map(Vec::as_slice) {
            Some([Arg::Var(n)]) => Some(n.as_str()),
            _ => None,
        };
        let cached = matches!((&cache.vt, v_name), (Some((c, _)), Some(n)) if c == n);
        if !cached {
            let vt = with_f32(&v, |v| fast::values_transposed(v, b, hdv, nk))
                .map_err(|e| e.to_string())?;
            cache.vt = v_name.map(|n| (n.to_string(), vt));
        }
        let vt = cache.vt.as_ref().and_then(|(_, vt)| vt.as_ref());
        let mask_name = match &p.mask {
            Some(Arg::Var(name)) => Some(name.as_str()),
            _ => None,
        };
        // The distinct query rows' mask (`Some(None)` without a mask), where
        // the chain can run on the distinct rows.
        let rows = match q_classes {
            Some(c) if fast::rows_independent(vt, hdv) => match (&mask, mask_name) {
                (None, _) => Some(None),
                (Some(m), Some(name)) => cache.rows.packed_rows(name, m, c)?.map(Some),
                (Some(_), None) => None,
            },
            _ => None,
        };
        let stages = [Some(p.scores), Some(p.scaled), p.masked, Some(p.probs)];
        let overflow_of = |counts: [fast::Counts; 4]| {
            stages
                .iter()
                .zip(counts)
                .find_map(|(i, (nonfinite, saturated))| {
                    let op = &ops[(*i)?];
                    (nonfinite + saturated > 0).then(|| Overflow {
                        op: op.label().to_string(),
                        kind: op.kind.clone(),
                        nonfinite,
                        saturated,
                    })
                })
        };
        // The keys' norms, kept while the chains read the same k.
        let k_name = match sc.inputs.get("y").map(Vec::as_slice) {
            Some([Arg::Var(n)]) => Some(n.as_str()),
            _ => None,
        };
        if cache.kmax.as_ref().map(|(n, _)| Some(n.as_str())) != Some(k_name) {
            cache.kmax = k_name.map(|n| (n.to_string(), std::sync::OnceLock::new()));
        }
        let kmax = cache.kmax.as_ref().map(|(_, k)| k);
        let args = |spans, queries| ChainArgs {
            vt,
            kmax,
            spans,
            scale: scale[0],
            dims: (b, hd, hdv, queries, nk),
            fp16,
            check,
        };
        if let (Some(rows), Some(c)) = (rows, q_classes) {
            // The packed mask's spans, kept with its rows.
            let spans = match (&rows, mask_name, vt) {
                (Some(m), Some(name), Some(vt)) if vt.finite => {
                    let entry = cache.rows.0.get_mut(name).ok_or("packed rows not kept")?;
                    if entry.spans.is_none() {
                        entry.spans = Some(
                            with_f32(m, |m| fast::MaskSpans::scan(m, nk))
                                .map_err(|e| e.to_string())?,
                        );
                    }
                    entry.spans.as_ref()
                }
                _ => None,
            };
            let (ctx, counts) = chain_run(&q, &k, &v, rows.as_ref(), &args(spans, nqp))?;
            if counts.iter().all(|&(n, s)| n + s == 0) {
                // The rows not computed count among the scores in all.
                fast::count_work(1, 0, b * (nq - nqp) * nk);
                let ctx = Tensor::from_vec(ctx, (b, hdv, nqp), &Device::Cpu)
                    .map_err(|e| e.to_string())?;
                return Ok(ChainOut {
                    ctx,
                    overflow: None,
                    classes: Some(c.clone()),
                    rows: nqp,
                });
            }
        }
        // Every row: q unpacked where it came packed.
        let q = match q_classes {
            Some(c) => packed::gather_last(&q, c).map_err(|e| e.to_string())?,
            None => q,
        };
        // The mask's spans, scanned once per mask value (every head and
        // block that adds it), where its values stay f32 and keep a name.
        let spans = match (mask_name, &mask) {
            (Some(name), Some(m)) if vt.is_some_and(|vt| vt.finite) => {
                if !cache.spans.contains_key(name) {
                    let s =
                        with_f32(m, |m| fast::MaskSpans::scan(m, nk)).map_err(|e| e.to_string())?;
                    cache.spans.insert(name.to_string(), s);
                }
                cache.spans.get(name)
            }
            _ => None,
        };
        let (ctx, counts) = chain_run(&q, &k, &v, mask.as_ref(), &args(spans, nq))?;
        let ctx = Tensor::from_vec(ctx, (b, hdv, nq), &Device::Cpu).map_err(|e| e.to_string())?;
        // Rows computed one by one may still repeat as q's columns do (pad
        // rows that attend to themselves alone give their own, equal, values):
        // checked bit for bit, the context is packed again.
        if let Some(c) = q_classes
            && let Some(packed) = packed::pack_if_repeats(&ctx, c).map_err(|e| e.to_string())?
        {
            return Ok(ChainOut {
                ctx: packed,
                overflow: overflow_of(counts),
                classes: Some(c.clone()),
                rows: nq,
            });
        }
        Ok(ChainOut {
            ctx,
            overflow: overflow_of(counts),
            classes: None,
            rows: nq,
        })
    }

    /// A constant as a runtime value.
    pub fn constant(&self, v: &Value) -> Result<V, String> {
        let dev = &Device::Cpu;
        let e = |e: candle_core::Error| e.to_string();
        match v {
            Value::Immediate { ty, data } => {
                let shape = ty.shape.clone();
                Ok(match data {
                    HostData::Str(s) => V::S(s.first().cloned().unwrap_or_default()),
                    HostData::F32(f) => V::T(Tensor::from_vec(f.clone(), shape, dev).map_err(e)?),
                    HostData::F64(f) => V::T(
                        Tensor::from_vec(
                            f.iter().map(|&x| x as f32).collect::<Vec<_>>(),
                            shape,
                            dev,
                        )
                        .map_err(e)?,
                    ),
                    HostData::I64(i) => {
                        if ty.dtype.is_float() {
                            V::T(
                                Tensor::from_vec(
                                    i.iter().map(|&x| x as f32).collect::<Vec<_>>(),
                                    shape,
                                    dev,
                                )
                                .map_err(e)?,
                            )
                        } else {
                            V::T(Tensor::from_vec(i.clone(), shape, dev).map_err(e)?)
                        }
                    }
                    HostData::Bool(b) => V::T(
                        Tensor::from_vec(
                            b.iter().map(|&x| u8::from(x)).collect::<Vec<_>>(),
                            shape,
                            dev,
                        )
                        .map_err(e)?,
                    ),
                    HostData::Bytes(b) => V::T(decode(ty.dtype, b, ty.elements(), &shape)?),
                })
            }
            Value::Blob { .. } => self
                .pkg
                .decoded_blob(v, false, || self.decode_blob(v))
                .map(V::T),
        }
    }

    /// A weight blob's values: floats as f32, integers as i64.
    fn decode_blob(&self, v: &Value) -> Result<Tensor, String> {
        use crate::mlpackage::blob::BlobDtype;
        let b = self.pkg.blob(v)?;
        let ty = v.ty();
        let dtype = match b.dtype {
            BlobDtype::F16 => DType::F16,
            BlobDtype::F32 => DType::F32,
            BlobDtype::Bf16 => DType::Bf16,
            BlobDtype::I8 => DType::I8,
            BlobDtype::U8 => DType::U8,
            BlobDtype::I16 => DType::I16,
            BlobDtype::U16 => DType::U16,
            BlobDtype::I32 => DType::I32,
            BlobDtype::U32 => DType::U32,
            BlobDtype::I4 => DType::I4,
            BlobDtype::U1 => DType::U1,
            BlobDtype::U2 => DType::U2,
            BlobDtype::U3 => DType::U3,
            BlobDtype::U4 => DType::U4,
            BlobDtype::U6 => DType::U6,
        };
        decode(dtype, b.data, ty.elements(), &ty.shape)
    }

    /// A constant of [`fp16_conv_weights`]: an fp16 blob as an f16 tensor,
    /// half the memory of its f32 values (a blob stored otherwise is decoded
    /// as [`Interpreter::constant`] decodes it).
    fn stored_fp16(&self, v: &Value) -> Result<V, String> {
        if !matches!(v, Value::Blob { .. }) {
            return self.constant(v);
        }
        self.pkg
            .decoded_blob(v, true, || {
                let b = self.pkg.blob(v)?;
                let ty = v.ty();
                let n = ty.elements();
                if b.dtype != crate::mlpackage::blob::BlobDtype::F16 {
                    return self.decode_blob(v);
                }
                if b.data.len() < 2 * n {
                    return Err(format!("{} bytes for {n} F16 values", b.data.len()));
                }
                let h: Vec<half::f16> = b.data[..2 * n]
                    .chunks_exact(2)
                    .map(|c| half::f16::from_le_bytes([c[0], c[1]]))
                    .collect();
                Tensor::from_vec(h, ty.shape.as_slice(), &Device::Cpu).map_err(|e| e.to_string())
            })
            .map(V::T)
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

/// The string parameters the interpreter reads, with the values it
/// implements: anything else is refused when the interpreter is made, before
/// any op runs.
const STRING_PARAMS: &[(&str, &str, &[&str])] = &[
    (
        "gelu",
        "mode",
        &["EXACT", "TANH_APPROXIMATION", "SIGMOID_APPROXIMATION"],
    ),
    (
        "cast",
        "dtype",
        &[
            "fp16", "fp32", "fp64", "int32", "int64", "int16", "int8", "uint8", "uint16", "bool",
        ],
    ),
    (
        "conv",
        "pad_type",
        &["valid", "same", "same_lower", "custom"],
    ),
];

/// Refuse a string parameter of [`STRING_PARAMS`] (inline, or a `const`'s
/// output) whose value the interpreter does not implement, naming the op,
/// the parameter and the value.
fn check_string_params(func: &Function) -> Result<(), String> {
    let string_of = |v: &Value| match v {
        Value::Immediate {
            data: HostData::Str(s),
            ..
        } => s.first().cloned(),
        _ => None,
    };
    let consts: Map<&str, String> = func
        .ops
        .iter()
        .filter(|o| o.kind == "const")
        .filter_map(|o| {
            Some((
                o.outputs.first()?.name.as_str(),
                string_of(o.attributes.get("val")?)?,
            ))
        })
        .collect();
    for op in &func.ops {
        for &(kind, key, allowed) in STRING_PARAMS.iter().filter(|p| p.0 == op.kind) {
            let value = match op.inputs.get(key).map(Vec::as_slice) {
                Some([Arg::Const(v)]) => string_of(v),
                Some([Arg::Var(n)]) => consts.get(n.as_str()).cloned(),
                _ => op.attributes.get(key).and_then(string_of),
            };
            if let Some(v) = value
                && !allowed.contains(&v.as_str())
            {
                return Err(format!(
                    "op `{}` ({kind}): {key} `{v}` is not supported by the interpreter; supported: {}",
                    op.label(),
                    allowed.join(", ")
                ));
            }
        }
    }
    Ok(())
}

/// glibc malloc's bytes in use and the size of its heap (every arena and
/// mapped chunk), for the profile; `None` elsewhere.
fn heap_bytes() -> Option<(usize, usize)> {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        // SAFETY: mallinfo2 only reads the allocator's statistics.
        let m = unsafe { libc::mallinfo2() };
        Some((m.uordblks + m.hblkhd, m.arena + m.hblkhd))
    }
    #[cfg(not(all(target_os = "linux", target_env = "gnu")))]
    {
        None
    }
}

/// Bytes of the storages behind `tensors`, each storage counted once (views
/// share their tensor's).
fn live_bytes<'a>(tensors: impl Iterator<Item = &'a Tensor>) -> usize {
    let mut seen = Set::default();
    let mut bytes = 0usize;
    for t in tensors {
        let (s, _) = t.storage_and_layout();
        let (addr, n) = match &*s {
            candle_core::Storage::Cpu(c) => match c {
                candle_core::CpuStorage::F32(v) => (v.as_ptr() as usize, v.len() * 4),
                candle_core::CpuStorage::F16(v) => (v.as_ptr() as usize, v.len() * 2),
                candle_core::CpuStorage::I64(v) => (v.as_ptr() as usize, v.len() * 8),
                other => (
                    other as *const _ as usize,
                    t.elem_count() * t.dtype().size_in_bytes(),
                ),
            },
            _ => continue,
        };
        if seen.insert(addr) {
            bytes = bytes.saturating_add(n);
        }
    }
    bytes
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An input whose values are all fp16 values already is shared, not
    /// copied; any other is rounded as `round_f16` rounds it, bit for bit.
    #[test]
    fn exact_inputs_are_shared_and_others_rounded() {
        let mask: Vec<f32> = (0..100_000)
            .map(|i| if i % 3 == 0 { -1e4 } else { 0.0 })
            .collect();
        let t = Tensor::from_vec(mask, 100_000, &Device::Cpu).unwrap();
        let r = round_f16_shared(&t).unwrap();
        assert_eq!(storage_addr(&r), storage_addr(&t), "shared");
        let bits = |t: &Tensor| -> Vec<u32> {
            t.to_vec1::<f32>()
                .unwrap()
                .iter()
                .map(|x| x.to_bits())
                .collect()
        };
        // One inexact value anywhere (here the last) makes it a rounded copy.
        for odd in [0.1f32, 1e-8, 70000.0, -0.0, f32::NAN] {
            let mut v = vec![0.5f32; 100_000];
            v[99_999] = odd;
            let t = Tensor::from_vec(v, 100_000, &Device::Cpu).unwrap();
            let r = round_f16_shared(&t).unwrap();
            assert_eq!(bits(&r), bits(&round_f16(&t).unwrap()), "{odd}");
            assert_eq!(
                storage_addr(&r) == storage_addr(&t),
                odd == 0.0 || odd.is_nan(),
                "-0.0 and the quiet NaN round to themselves, the others not: {odd}"
            );
        }
    }

    #[test]
    fn live_bytes_counts_each_storage_once() {
        let a = Tensor::zeros((4, 8), CDType::F32, &Device::Cpu).unwrap();
        let view = a.narrow(1, 2, 3).unwrap();
        let h = Tensor::zeros(10, CDType::F16, &Device::Cpu).unwrap();
        let i = Tensor::zeros(3, CDType::I64, &Device::Cpu).unwrap();
        assert_eq!(live_bytes([&a, &view, &a.clone()].into_iter()), 4 * 8 * 4);
        assert_eq!(live_bytes([&a, &h, &i].into_iter()), 128 + 20 + 24);
        assert_eq!(live_bytes(std::iter::empty()), 0);
    }

    /// A golden program whose `gelu` mode (or `cast` dtype) is changed to a
    /// value the interpreter lacks is refused when the interpreter is made,
    /// naming the op, the parameter and the value; the unedited one is not.
    #[test]
    fn unknown_string_parameters_are_refused_before_running() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("golden/mil");
        let mut seen = 0;
        for case in std::fs::read_dir(&dir).unwrap() {
            let pkg_path = case.unwrap().path().join("model.mlpackage");
            if !pkg_path.exists() {
                continue;
            }
            let pkg = Package::open(&pkg_path).unwrap();
            let names: Vec<String> = pkg.program.functions.keys().cloned().collect();
            for fname in names {
                assert!(
                    Interpreter::new(&pkg, Some(&fname)).is_ok(),
                    "{}",
                    pkg_path.display()
                );
                for &(kind, key, _) in STRING_PARAMS {
                    let mut edited = Package::open(&pkg_path).unwrap();
                    let func = edited.program.functions.get_mut(&fname).unwrap();
                    let Some(i) = func.ops.iter().position(|o| o.kind == kind) else {
                        continue;
                    };
                    // The parameter, inline or through its const.
                    let arg = func.ops[i].inputs.get(key).and_then(|a| a.first()).cloned();
                    let bogus = Value::Immediate {
                        ty: crate::mlpackage::TensorType {
                            dtype: DType::Str,
                            shape: vec![],
                        },
                        data: HostData::Str(vec!["BOGUS".into()]),
                    };
                    match arg {
                        Some(Arg::Var(n)) => {
                            let c = func
                                .ops
                                .iter_mut()
                                .find(|o| {
                                    o.kind == "const"
                                        && o.outputs.first().is_some_and(|x| x.name == n)
                                })
                                .unwrap();
                            c.attributes.insert("val".into(), bogus);
                        }
                        _ => {
                            func.ops[i]
                                .inputs
                                .insert(key.into(), vec![Arg::Const(bogus)]);
                        }
                    }
                    let label = func.ops[i].label().to_string();
                    let e = Interpreter::new(&edited, Some(&fname)).err().unwrap();
                    assert!(
                        e.contains(&format!("op `{label}` ({kind}): {key} `BOGUS`")),
                        "{e}"
                    );
                    seen += 1;
                }
            }
        }
        assert!(seen >= 2, "only {seen} golden ops to edit");
    }

    /// The bit-level rounding equals the half crate's conversion on a sweep
    /// of the f32 bit patterns (every 509th, and the edges of fp16's range).
    #[test]
    fn rounding_matches_half() {
        let same = |x: f32| {
            let want = half::f16::from_f32(x).to_f32();
            let got = round_to_f16(x);
            assert!(
                got.to_bits() == want.to_bits() || (got.is_nan() && want.is_nan()),
                "{x:e} ({:#x}): got {got:e}, half says {want:e}",
                x.to_bits()
            );
        };
        for b in (0..=u32::MAX).step_by(509) {
            same(f32::from_bits(b));
        }
        for x in [
            65504.0,
            65519.99,
            65520.0,
            65536.0,
            6.1035156e-5,
            6.1e-5,
            5.96e-8,
            2.98e-8,
            2.9802322e-8,
            1.0 + 1.0 / 2048.0,
            1.0 + 3.0 / 2048.0,
            0.0,
            -0.0,
            f32::INFINITY,
            f32::MIN_POSITIVE,
        ] {
            same(x);
            same(-x);
        }
        // The slice rounding (F16C where the CPU has it) gives the same bits.
        let xs: Vec<f32> = (0..=u32::MAX)
            .step_by(4099)
            .map(f32::from_bits)
            .chain([65519.99, 65520.0, 2.9802322e-8, 2.98e-8, 6.1e-5, -0.0])
            .collect();
        let mut ys = xs.clone();
        round_f16_in_place(&mut ys, false);
        for (x, y) in xs.iter().zip(&ys) {
            let want = round_to_f16(*x);
            assert!(
                y.to_bits() == want.to_bits() || (y.is_nan() && want.is_nan()),
                "{x:e}: slice rounding gave {y:e}, expected {want:e}"
            );
        }
        // Counts in the same pass, in the vector body and the tail alike.
        let mut v: Vec<f32> = (0..45).map(|i| i as f32).collect();
        for (i, x) in [
            (0, f32::NAN),
            (3, f32::INFINITY),
            (9, -70000.0),
            (17, 65504.0),
            (18, -65505.0),
            (30, f32::NEG_INFINITY),
            (41, f32::NAN),
            (44, 1e6),
        ] {
            v[i] = x;
        }
        let want = count_overflow(&v);
        assert_eq!(want, (4, 3));
        let mut w = v.clone();
        assert_eq!(round_f16_in_place(&mut w, true), want);
        assert_eq!(round_f16_in_place(&mut v, false), (0, 0));
        let t = Tensor::new(&[1.0f32, 70000.0, f32::NAN, 1e-9], &Device::Cpu).unwrap();
        let (r, nonfinite, saturated) = round_f16_checked(&t, true).unwrap();
        assert_eq!((nonfinite, saturated), (1, 1));
        let v = r.to_vec1::<f32>().unwrap();
        assert_eq!(v[0], 1.0);
        assert!(v[1].is_infinite() && v[2].is_nan() && v[3] == 0.0);
    }
}
