//! An interpreter for ML programs read from `.mlpackage`s, over candle on the CPU.
//!
//! It executes the exact bytes that ship, in one of two numeric modes:
//! [`Precision::Fp32`] computes every op in f32, whatever dtype the program
//! declares (casts to fp16 keep f32 values; stored fp16 weights are used as
//! stored); [`Precision::Fp16`] rounds inputs and every op's floating-point
//! output to fp16, as the Neural Engine stores activations, and reports the
//! first op whose output holds inf, NaN or a value beyond fp16's range;
//! [`Precision::Ane`] adds the Neural Engine's measured behaviours
//! ([`AneRule`], `docs/numerics.md`). Unsupported ops are reported, with where they
//! occur, before anything runs. Its errors are an [`InterpError`]
//! (`src/error/interp.rs`); one inside an op comes in
//! [`InterpError::At`], which names the function and the op.
//!
//! How it runs is given when it is built ([`Settings`], resolved by the
//! caller: the CLI reads `ANE_EXPORT_SHORTCUTS` and `ANE_EXPORT_PROFILE`);
//! what a run did comes back with its outputs ([`RunOutput::work`],
//! [`RunOutput::profile`]). The library reads no environment and prints
//! nothing.
//!
//! Files by job: `program.rs` (a function checked and scheduled), `run.rs`
//! (a run, op by op), `ops/` (the op set), `chain.rs` and `fuse.rs` (the
//! attention chains run in tiles), `fast/` and `kernels.rs` (the CPU
//! kernels), `packed.rs` (repeated columns carried once), `fp16.rs` (the
//! fp16 emulation), `weights.rs` (decoding constants), `profile.rs`.

/// [`InterpError::Invalid`] with a `format!` message.
macro_rules! invalid {
    ($($t:tt)*) => {
        $crate::error::InterpError::Invalid(format!($($t)*))
    };
}

/// [`InterpError::Unsupported`] with a `format!` message.
macro_rules! unsupported {
    ($($t:tt)*) => {
        $crate::error::InterpError::Unsupported(format!($($t)*))
    };
}

/// [`InterpError::Internal`] with a `format!` message.
macro_rules! internal {
    ($($t:tt)*) => {
        $crate::error::InterpError::Internal(format!($($t)*))
    };
}

#[cfg(test)]
mod ane_tests;
mod chain;
mod fast;
mod fp16;
mod fuse;
mod kernels;
mod ops;
mod packed;
mod profile;
mod program;
mod run;
mod weights;

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

/// The interpreter's own maps and sets, keyed by value names and op
/// indices of the program it runs: hashed with FxHash, which costs a
/// fraction of SipHash per lookup (a 2B-shaped tower's function has about
/// 60,000 ops, each looked up several times per run).
pub(crate) type Map<K, V> = rustc_hash::FxHashMap<K, V>;
pub(crate) type Set<K> = rustc_hash::FxHashSet<K>;

use candle_core::Tensor;

pub use crate::error::InterpError;
pub use fast::{attention_path, rows_independent_here};
pub(crate) use fp16::max_abs;
use fp16::*;
pub use fp16::{AneRule, round_f16_in_place, round_to_f16};
pub use ops::SUPPORTED_OPS;
pub use profile::{Heap, Profile};
pub use program::Interpreter;

/// How an interpreter runs, given when it is built
/// ([`Interpreter::with_settings`]) and resolved by its caller before any
/// work: the CLI reads them from the environment, once, at its start.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Settings {
    /// Take the exact shortcuts: repeated columns of a 1x1 convolution
    /// computed once, dead keys and equal batches of an attention chain
    /// skipped, packed columns carried through the program. They change no
    /// bit; off (`ANE_EXPORT_SHORTCUTS=0`) computes every column, key and
    /// batch, to check that.
    pub shortcuts: bool,
    /// Measure each run: seconds per op kind and the bytes its values held
    /// ([`RunOutput::profile`]; `ANE_EXPORT_PROFILE=1`).
    pub profile: bool,
}

impl Default for Settings {
    /// Shortcuts on, no profile.
    fn default() -> Self {
        Settings {
            shortcuts: true,
            profile: false,
        }
    }
}

crate::named::named_enum! {
    /// Numeric mode.
    #[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
    pub enum Precision {
        /// Every op in f32.
        Fp32 = "fp32",
        /// Every floating-point op output rounded to fp16.
        Fp16 = "fp16",
        /// fp16, plus the Neural Engine's published numerics (matmul and
        /// conv ceilings, narrow reduce_sum, offset-slice clamp, no NaN).
        Ane = "ane",
    }
}

impl Precision {
    /// Whether op outputs are rounded to fp16 (fp16 and ane).
    pub fn rounds(self) -> bool {
        matches!(self, Precision::Fp16 | Precision::Ane)
    }
}

/// The largest `|x|` one float op produced in a run (after rounding, and in
/// ane mode after [`AneRule`]): its headroom is `limit / max_abs`.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Peak {
    /// The op's output name (an attention chain's inner ops included).
    pub op: String,
    pub kind: String,
    /// inf where the output holds an inf (or a NaN, in fp16 mode).
    pub max_abs: f32,
    /// [`ane_limit`] of the op.
    pub limit: f32,
    /// layer_norm only: the largest square of its input, `input_max_abs^2`
    /// (information: how the ANE computes a norm's statistics is not
    /// published).
    pub input_sq_max: Option<f32>,
}

/// The largest `|x|` an op's output can hold on the Neural Engine: 32,752
/// for matmul, linear and conv (the next fp16 value, 32,768, comes back
/// inf; [G] "Saturation hazard", [A] docs/numeric-cliffs.md), 4,094 for a
/// slice with a nonzero begin on the last axis ([A] "Width-offset slice
/// saturation"), fp16's 65,504 otherwise. A conv of one tap (one input
/// channel per group, a 1x1 kernel) passes values past the ceiling ([G]).
/// `rule` is [`AneRule::of`] the op.
pub fn ane_limit(rule: &AneRule) -> f32 {
    if rule.slice_clamp {
        4094.0
    } else if rule.ceiling {
        32752.0
    } else {
        65504.0
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
    pub fn tensor(&self) -> Result<&Tensor, InterpError> {
        match self {
            V::T(t) => Ok(t),
            V::S(s) => Err(InterpError::NotATensor(s.clone())),
        }
    }
}

/// The first op whose fp16 output was not finite or saturated. In ane
/// mode: the first op whose output holds an inf after [`AneRule`] (NaN
/// becomes +0 there): `nonfinite` counts the infs of its output, `saturated`
/// those the rule's ceilings made (over the carried columns of a packed
/// value).
#[derive(Clone, Debug, serde::Serialize, serde::Deserialize)]
pub struct Overflow {
    pub op: String,
    pub kind: String,
    pub nonfinite: usize,
    pub saturated: usize,
}

/// What a run computed, against what the program asks: fewer where
/// values were carried packed (`packed.rs`) and where the shortcuts of the
/// 1x1 convolutions and attention chains ran (`fast/`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Work {
    /// Ops' output columns (their last axis): (computed, in all).
    pub columns: (u64, u64),
    /// Attention chains' query rows: (computed, in all).
    pub query_rows: (u64, u64),
    /// The 1x1 convolutions' columns: (computed, in all).
    pub conv_columns: (u64, u64),
    /// The attention chains' scores: (computed, in all).
    pub scores: (u64, u64),
}

impl std::ops::AddAssign for Work {
    fn add_assign(&mut self, o: Work) {
        let add = |a: &mut (u64, u64), b: (u64, u64)| {
            a.0 += b.0;
            a.1 += b.1;
        };
        add(&mut self.columns, o.columns);
        add(&mut self.query_rows, o.query_rows);
        add(&mut self.conv_columns, o.conv_columns);
        add(&mut self.scores, o.scores);
    }
}

/// A run's counts of what its kernels' shortcuts computed, added to by the
/// tasks of its ops ([`Work::conv_columns`], [`Work::scores`]).
#[derive(Default)]
pub(crate) struct Tally {
    conv_columns: [AtomicU64; 2],
    scores: [AtomicU64; 2],
}

impl Tally {
    /// `computed` of `all` 1x1 convolution columns.
    pub(crate) fn conv_columns(&self, computed: usize, all: usize) {
        self.conv_columns[0].fetch_add(computed as u64, Relaxed);
        self.conv_columns[1].fetch_add(all as u64, Relaxed);
    }

    /// `computed` of `all` attention scores.
    pub(crate) fn scores(&self, computed: usize, all: usize) {
        self.scores[0].fetch_add(computed as u64, Relaxed);
        self.scores[1].fetch_add(all as u64, Relaxed);
    }

    /// The counts as (computed, in all): the convolutions', the scores'.
    fn counts(&self) -> ((u64, u64), (u64, u64)) {
        let pair = |c: &[AtomicU64; 2]| (c[0].load(Relaxed), c[1].load(Relaxed));
        (pair(&self.conv_columns), pair(&self.scores))
    }
}

/// What a run produced.
pub struct RunOutput {
    /// Function outputs by name, as f32 (or i64) tensors.
    pub outputs: BTreeMap<String, Tensor>,
    /// fp16 and ane modes only: the first op that overflowed, if any.
    pub first_overflow: Option<Overflow>,
    /// fp16 and ane modes: each float op's largest `|x|`, in program order
    /// (ops that only move values left out, but for the offset slices of
    /// [`ane_limit`]); empty in fp32 mode and from Core ML.
    pub peaks: Vec<Peak>,
    /// Intermediate values asked for with [`Interpreter::run_capturing`], by
    /// name; in fp16 and ane modes as f16 tensors (their values are fp16 already).
    pub captured: BTreeMap<String, Tensor>,
    /// What the interpreter computed of what the program asks (zero from
    /// Core ML).
    pub work: Work,
    /// Seconds of the prediction alone, when the executor times it apart
    /// from passing the tensors (Core ML: `predict` in its child process);
    /// `None` when there is nothing apart (the interpreter).
    pub predict_s: Option<f64>,
    /// The run's profile, where [`Settings::profile`] asked for one.
    pub profile: Option<Profile>,
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
