//! The residency gate's static checker: predicts, from a saved ML program,
//! which ops run on the Neural Engine.
//!
//! Apple publishes no list of what the ANE runs; the rules come from
//! ANE-RULES.md, each with its public source, and every figure this module
//! produces is a **prediction** (on a Mac, `MLComputePlan` measures instead).
//!
//! Each op gets a placement (ANE, or off with the rule that sent it away) and
//! a cost: an estimated time on an M1-class Neural Engine from its FLOPs and
//! the bytes it moves, `max(flops / 11e12, bytes / 60e9)` seconds, used only
//! to weight the fraction (`const` ops cost nothing). Function-level checks
//! add findings that are not placements (numerics, size, advice) with status
//! `pass`, `warn` or `fail`.

mod checks;
pub mod coreai;
mod cost;
mod placement;
mod rules;

use std::collections::{BTreeMap, HashMap, HashSet};

use serde::{Deserialize, Serialize};

use self::checks::*;
use self::cost::*;
use self::placement::*;
use self::rules::*;
pub use self::rules::{RULES, Rule};
use crate::mlpackage::{Arg, DType, Function, Op, Package, Value};
use crate::named::named_enum;

/// Where one op is predicted to run.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct OffAne {
    pub op: String,
    #[serde(rename = "type")]
    pub kind: String,
    pub rule: String,
    pub reason: String,
    pub cost: f64,
}

/// Cost and placement per op type.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct ByType {
    pub op: String,
    pub count: usize,
    pub on_ane: usize,
    pub cost: f64,
    pub cost_on_ane: f64,
}

/// One named check.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Check {
    pub id: String,
    pub name: String,
    pub source: String,
    pub status: CheckStatus,
    pub detail: String,
}

named_enum! {
    /// A check's outcome: a `warn` is advice and fails nothing.
    #[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
    #[serde(rename_all = "lowercase")]
    pub enum CheckStatus {
        Pass = "pass",
        Warn = "warn",
        Fail = "fail",
    }
}

/// The static checker's result for one function.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Prediction {
    pub function: String,
    /// Cost-weighted fraction of the function predicted on the ANE.
    pub fraction: f64,
    pub ops: usize,
    pub ops_off_ane: usize,
    pub by_type: Vec<ByType>,
    pub off_ane: Vec<OffAne>,
    pub checks: Vec<Check>,
}

impl Prediction {
    /// Checks that failed (a failed check fails the gate whatever the fraction).
    pub fn failed_checks(&self) -> Vec<&Check> {
        self.checks
            .iter()
            .filter(|c| c.status == CheckStatus::Fail)
            .collect()
    }
}

/// Static facts about the values of a function.
pub(super) struct Facts<'a> {
    /// Outputs of `const` and `constexpr_*` ops.
    consts: HashSet<&'a str>,
    /// Which op produced each value.
    producer: HashMap<&'a str, &'a Op>,
    inputs: HashSet<&'a str>,
    outputs: HashSet<&'a str>,
    shapes: HashMap<&'a str, (&'a [usize], DType)>,
}

impl<'a> Facts<'a> {
    fn new(f: &'a Function) -> Self {
        let mut consts = HashSet::new();
        let mut producer = HashMap::new();
        let mut shapes = HashMap::new();
        for i in &f.inputs {
            shapes.insert(i.name.as_str(), (i.ty.shape.as_slice(), i.ty.dtype));
        }
        for op in &f.ops {
            for o in &op.outputs {
                producer.insert(o.name.as_str(), op);
                shapes.insert(o.name.as_str(), (o.ty.shape.as_slice(), o.ty.dtype));
                if op.kind == "const" || op.kind.starts_with("constexpr_") {
                    consts.insert(o.name.as_str());
                }
            }
        }
        Facts {
            consts,
            producer,
            inputs: f.inputs.iter().map(|i| i.name.as_str()).collect(),
            outputs: f.outputs.iter().map(|o| o.name.as_str()).collect(),
            shapes,
        }
    }

    fn is_const(&self, a: &Arg) -> bool {
        match a {
            Arg::Const(_) => true,
            Arg::Var(n) => self.consts.contains(n.as_str()),
        }
    }

    /// Shape and dtype of an argument.
    fn ty(&self, a: &'a Arg) -> Option<(&'a [usize], DType)> {
        match a {
            Arg::Const(v) => Some((v.ty().shape.as_slice(), v.ty().dtype)),
            Arg::Var(n) => self.shapes.get(n.as_str()).copied(),
        }
    }

    /// Shape and dtype of an op's (first) argument `key`.
    fn input_ty(&self, op: &'a Op, key: &str) -> Option<(&'a [usize], DType)> {
        op.inputs
            .get(key)
            .and_then(|a| a.first())
            .and_then(|a| self.ty(a))
    }

    /// Whether a value derives from a function input through casts, reshapes
    /// and the like (for the mask check).
    fn derives_from_input(&self, name: &str, depth: usize) -> bool {
        if self.inputs.contains(name) {
            return true;
        }
        if depth == 0 {
            return false;
        }
        let Some(op) = self.producer.get(name) else {
            return false;
        };
        matches!(
            op.kind.as_str(),
            "cast" | "reshape" | "expand_dims" | "squeeze" | "identity" | "slice_by_index" | "mul"
        ) && op.inputs.get("x").into_iter().flatten().any(|a| match a {
            Arg::Var(n) => self.derives_from_input(n, depth - 1),
            Arg::Const(_) => false,
        })
    }
}

/// An op's constant integer input, e.g. conv dilations.
pub(super) fn const_ints(pkg: &Package, op: &Op, facts: &Facts, key: &str) -> Option<Vec<i64>> {
    const_f64(pkg, op, facts, key).map(|v| v.into_iter().map(|x| x as i64).collect())
}

/// An op's constant input as f64 values (inline, or from a `const` op).
pub(super) fn const_f64(pkg: &Package, op: &Op, facts: &Facts, key: &str) -> Option<Vec<f64>> {
    let v = match op.inputs.get(key)?.first()? {
        Arg::Const(v) => v,
        Arg::Var(n) => {
            let p = facts.producer.get(n.as_str())?;
            if p.kind != "const" {
                return None;
            }
            p.attributes.get("val")?
        }
    };
    value_f64(pkg, v)
}

/// A small constant's values as f64 (immediates; fp16/fp32 blobs).
pub(crate) fn value_f64(pkg: &Package, v: &Value) -> Option<Vec<f64>> {
    use crate::mlpackage::HostData as H;
    match v {
        Value::Immediate { data, ty } => Some(match data {
            H::F32(x) => x.iter().map(|&v| v as f64).collect(),
            H::F64(x) => x.clone(),
            H::I64(x) => x.iter().map(|&v| v as f64).collect(),
            H::Bool(x) => x.iter().map(|&v| v as u8 as f64).collect(),
            H::Bytes(b) if ty.dtype == DType::F16 => b
                .chunks_exact(2)
                .map(|c| half::f16::from_le_bytes([c[0], c[1]]).to_f64())
                .collect(),
            H::Bytes(b) if matches!(ty.dtype, DType::I8) => {
                b.iter().map(|&v| v as i8 as f64).collect()
            }
            H::Bytes(b) if matches!(ty.dtype, DType::U8) => b.iter().map(|&v| v as f64).collect(),
            _ => return None,
        }),
        Value::Blob { ty, .. } => {
            let blob = pkg.blob(v).ok()?;
            match ty.dtype {
                DType::F16 => Some(
                    blob.data
                        .chunks_exact(2)
                        .map(|c| half::f16::from_le_bytes([c[0], c[1]]).to_f64())
                        .collect(),
                ),
                DType::F32 => Some(
                    blob.data
                        .chunks_exact(4)
                        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]) as f64)
                        .collect(),
                ),
                _ => None,
            }
        }
    }
}

/// Predict every op of a function and run the function-level checks.
/// `package_weight_bytes` is the size of the package's weights (R12).
pub fn predict(pkg: &Package, f: &Function, package_weight_bytes: u64) -> Prediction {
    let facts = Facts::new(f);
    let seq = f
        .inputs
        .iter()
        .filter_map(|i| i.ty.shape.last().copied())
        .max()
        .unwrap_or(0);
    let tiny = seq <= 64;
    let mut by_type: BTreeMap<String, ByType> = BTreeMap::new();
    let mut off = Vec::new();
    let (mut total, mut on) = (0.0f64, 0.0f64);
    let mut ops = 0usize;
    for op in &f.ops {
        if op.kind == "const" {
            continue;
        }
        ops += 1;
        let cost = if op.kind.starts_with("constexpr_") {
            // Decompressed once at load: a token cost, so placement still counts.
            op.outputs
                .iter()
                .map(|o| bytes_of(&o.ty.shape, o.ty.dtype))
                .sum::<f64>()
                / PEAK_BYTES
        } else {
            (flops(op, &facts) / PEAK_FLOPS).max(traffic(op, &facts) / PEAK_BYTES)
        };
        let placement = if tiny {
            Some((
                "R11",
                format!("the sequence axis is {seq}: workloads this small stay on the CPU"),
            ))
        } else {
            place(pkg, op, &facts)
        };
        let e = by_type.entry(op.kind.clone()).or_insert_with(|| ByType {
            op: op.kind.clone(),
            ..ByType::default()
        });
        e.count += 1;
        e.cost += cost;
        total += cost;
        match placement {
            None => {
                e.on_ane += 1;
                e.cost_on_ane += cost;
                on += cost;
            }
            Some((id, reason)) => off.push(OffAne {
                op: op.label().to_string(),
                kind: op.kind.clone(),
                rule: id.to_string(),
                reason,
                cost,
            }),
        }
    }
    let fraction = if total > 0.0 { on / total } else { 1.0 };
    let checks = checks(pkg, f, &facts, &off, package_weight_bytes, seq);
    Prediction {
        function: f.name.clone(),
        fraction,
        ops,
        ops_off_ane: off.len(),
        by_type: by_type.into_values().collect(),
        off_ane: off,
        checks,
    }
}
