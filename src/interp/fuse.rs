//! Finding the attention chains the interpreter runs in tiles
//! ([`super::fast::attention_chain_seen`]):
//!
//! ```text
//! scores = matmul(x=q, y=k, transpose_x=true, transpose_y=false)   [B, Q, K]
//! scaled = mul(scores, s)          s a constant scalar, either side
//! masked = add(scaled, mask)       optional; mask [B or 1, Q, K], either side
//! probs  = softmax(masked, axis=-1)
//! ctx    = matmul(x=v, y=probs, transpose_x=false, transpose_y=true)  [B, V, Q]
//! ```
//!
//! Every intermediate must be read by the next op of the chain alone and be
//! neither a function output nor a captured value; otherwise the ops run
//! one by one. The chain runs where its last op stands, so its inputs are
//! kept alive until then.

use super::{Map, Set};

use crate::mlpackage::{Arg, Function, HostData, Op, Value};

/// One attention chain, by op index.
#[derive(Clone, Debug)]
pub struct Plan {
    pub scores: usize,
    pub scaled: usize,
    pub masked: Option<usize>,
    pub probs: usize,
    pub ctx: usize,
    /// The mul's and the add's other operand.
    pub scale: Arg,
    pub mask: Option<Arg>,
}

impl Plan {
    /// The chain's ops in program order (the inner ones first).
    pub fn ops(&self) -> impl Iterator<Item = usize> + '_ {
        [
            Some(self.scores),
            Some(self.scaled),
            self.masked,
            Some(self.probs),
            Some(self.ctx),
        ]
        .into_iter()
        .flatten()
    }
}

/// The single `Arg::Var` of input `key`, if it is one.
fn var<'a>(op: &'a Op, key: &str) -> Option<&'a str> {
    match op.inputs.get(key).map(Vec::as_slice) {
        Some([Arg::Var(n)]) => Some(n),
        _ => None,
    }
}

fn single<'a>(op: &'a Op, key: &str) -> Option<&'a Arg> {
    match op.inputs.get(key).map(Vec::as_slice) {
        Some([a]) => Some(a),
        _ => None,
    }
}

/// A constant's value, through `const` ops.
fn constant<'a>(a: &'a Arg, consts: &Map<&str, &'a Value>) -> Option<&'a Value> {
    match a {
        Arg::Const(v) => Some(v),
        Arg::Var(n) => consts.get(n.as_str()).copied(),
    }
}

fn const_bool(a: Option<&Arg>, consts: &Map<&str, &Value>) -> Option<bool> {
    let Some(a) = a else {
        return Some(false); // MIL's default
    };
    match constant(a, consts)? {
        Value::Immediate {
            data: HostData::Bool(b),
            ..
        } => b.first().copied(),
        _ => None,
    }
}

fn is_scalar(a: &Arg, consts: &Map<&str, &Value>) -> bool {
    constant(a, consts).is_some_and(|v| v.ty().elements() == 1)
}

/// Every attention chain of `func` that can run fused, keyed by the index of
/// its last op (`ctx`).
pub fn plan(func: &Function, keep: &Set<&str>) -> Map<usize, Plan> {
    let mut consts: Map<&str, &Value> = Map::default();
    let mut producer: Map<&str, usize> = Map::default();
    let mut readers: Map<&str, Vec<usize>> = Map::default();
    for (i, op) in func.ops.iter().enumerate() {
        if op.kind == "const"
            && let (Some(o), Some(v)) = (op.outputs.first(), op.attributes.get("val"))
        {
            consts.insert(o.name.as_str(), v);
        }
        for o in &op.outputs {
            producer.insert(o.name.as_str(), i);
        }
        for a in op.inputs.values().flatten() {
            if let Arg::Var(n) = a {
                readers.entry(n.as_str()).or_default().push(i);
            }
        }
    }
    let outputs: Set<&str> = func.outputs.iter().map(|o| o.name.as_str()).collect();
    // The declared shape of an argument (every value's shape is static).
    let shape_of = |a: &Arg| -> Option<Vec<usize>> {
        match a {
            Arg::Var(n) => producer
                .get(n.as_str())
                .and_then(|&p| func.ops[p].outputs.iter().find(|o| &o.name == n))
                .map(|o| o.ty.shape.clone())
                .or_else(|| {
                    func.inputs
                        .iter()
                        .find(|x| &x.name == n)
                        .map(|x| x.ty.shape.clone())
                }),
            Arg::Const(v) => Some(v.ty().shape.clone()),
        }
    };
    // The op that alone reads op i's single output, if that output may stay internal.
    let next = |i: usize| -> Option<(usize, &str)> {
        let op = &func.ops[i];
        let [o] = op.outputs.as_slice() else {
            return None;
        };
        let n = o.name.as_str();
        if outputs.contains(n) || keep.contains(n) {
            return None;
        }
        match readers.get(n).map(Vec::as_slice) {
            Some([r]) => Some((*r, n)),
            _ => None,
        }
    };
    // The other operand of a binary op whose `x` or `y` is `name`.
    let other = |op: &Op, name: &str| -> Option<Arg> {
        match (single(op, "x"), single(op, "y")) {
            (Some(Arg::Var(x)), Some(y)) if x == name => Some(y.clone()),
            (Some(x), Some(Arg::Var(y))) if y == name => Some(x.clone()),
            _ => None,
        }
    };
    let mut plans = Map::default();
    for (i, op) in func.ops.iter().enumerate() {
        if op.kind != "matmul"
            || const_bool(single(op, "transpose_x"), &consts) != Some(true)
            || const_bool(single(op, "transpose_y"), &consts) != Some(false)
            || op.outputs.first().is_none_or(|o| o.ty.shape.len() != 3)
        {
            continue;
        }
        let Some((scaled, scores_name)) = next(i) else {
            continue;
        };
        let mul = &func.ops[scaled];
        let Some(scale) = other(mul, scores_name) else {
            continue;
        };
        if mul.kind != "mul" || !is_scalar(&scale, &consts) {
            continue;
        }
        let Some((mut j, mut name)) = next(scaled) else {
            continue;
        };
        let (mut masked, mut mask) = (None, None);
        if func.ops[j].kind == "add" {
            let Some(m) = other(&func.ops[j], name) else {
                continue;
            };
            // The mask has the scores' shape, or broadcasts over the batch only.
            let shape = &func.ops[i].outputs[0].ty.shape;
            let mshape = shape_of(&m);
            let fits = mshape.is_some_and(|ms| {
                ms.len() == 3 && ms[1..] == shape[1..] && (ms[0] == shape[0] || ms[0] == 1)
            });
            if !fits {
                continue;
            }
            masked = Some(j);
            mask = Some(m);
            let Some(n) = next(j) else {
                continue;
            };
            (j, name) = n;
        }
        let sm = &func.ops[j];
        let last_axis = sm
            .inputs
            .get("axis")
            .and_then(|a| a.first())
            .and_then(|a| constant(a, &consts))
            .and_then(|v| match v {
                Value::Immediate {
                    data: HostData::I64(x),
                    ..
                } => x.first().copied(),
                _ => None,
            });
        if sm.kind != "softmax"
            || var(sm, "x") != Some(name)
            || !matches!(last_axis, Some(-1) | Some(2))
        {
            continue;
        }
        let probs = j;
        let Some((ctx, probs_name)) = next(probs) else {
            continue;
        };
        let c = &func.ops[ctx];
        if c.kind != "matmul"
            || var(c, "y") != Some(probs_name)
            || var(c, "x").is_none()
            || const_bool(single(c, "transpose_x"), &consts) != Some(false)
            || const_bool(single(c, "transpose_y"), &consts) != Some(true)
        {
            continue;
        }
        // q [B, hd, Q], k [B, hd, K], v [B, V, K]: the shapes the kernel takes.
        let (Some(q), Some(k), Some(v)) = (
            single(op, "x").and_then(&shape_of),
            single(op, "y").and_then(&shape_of),
            single(c, "x").and_then(&shape_of),
        ) else {
            continue;
        };
        let s = &op.outputs[0].ty.shape;
        let fits = q.len() == 3
            && k.len() == 3
            && v.len() == 3
            && q[0] == s[0]
            && k[0] == s[0]
            && v[0] == s[0]
            && q[1] == k[1]
            && q[2] == s[1]
            && k[2] == s[2]
            && v[2] == s[2];
        if !fits {
            continue;
        }
        plans.insert(
            ctx,
            Plan {
                scores: i,
                scaled,
                masked,
                probs,
                ctx,
                scale,
                mask,
            },
        );
    }
    plans
}
