//! Residency of a Core AI program, predicted: the static rules the MIL
//! checker applies, applied to the ops the translation emitted (`python -m
//! ane_export.coreai ops`: each op's name and its operands' and results'
//! dtypes and shapes). Each `coreai.*` op takes the rules of the MIL op it
//! translates ([`MIL_OF`]); an op this table does not know is predicted off
//! the Neural Engine and fails the gate, named. Core AI on Linux gives no
//! placement at all, so this is a prediction like the package's; on a Mac
//! the compiled bundle's Neural Engine regions are counted by `make
//! mac-check`.

use serde::Deserialize;

use super::checks::check;
use super::cost::{PEAK_BYTES, PEAK_FLOPS};
use super::*;

/// The MIL op whose rules each Core AI op takes (the translation's table,
/// docs/formats.md, read backwards; ops it does not emit map to the MIL op
/// of the same function). The names are the dialect's (`coreai.slice`);
/// a `coreai.decomposable.` op takes the rules of the op without that
/// prefix ([`mil_of`]). `coreai.constant` is a constant, like MIL's `const`.
pub const MIL_OF: &[(&str, &str)] = &[
    ("coreai.constant", "const"),
    ("coreai.conv2d", "conv"),
    ("coreai.conv_transpose2d", "conv_transpose"),
    ("coreai.batch_matmul", "matmul"),
    ("coreai.broadcasting_batch_matmul", "matmul"),
    ("coreai.add", "add"),
    ("coreai.broadcasting_add", "add"),
    ("coreai.sub", "sub"),
    ("coreai.broadcasting_sub", "sub"),
    ("coreai.mul", "mul"),
    ("coreai.broadcasting_mul", "mul"),
    ("coreai.divide", "real_div"),
    ("coreai.broadcasting_divide", "real_div"),
    ("coreai.maximum", "maximum"),
    ("coreai.broadcasting_maximum", "maximum"),
    ("coreai.minimum", "minimum"),
    ("coreai.broadcasting_minimum", "minimum"),
    ("coreai.pow", "pow"),
    ("coreai.broadcasting_pow", "pow"),
    ("coreai.sqrt", "sqrt"),
    ("coreai.rsqrt", "rsqrt"),
    ("coreai.exp", "exp"),
    ("coreai.log", "log"),
    ("coreai.sin", "sin"),
    ("coreai.cos", "cos"),
    ("coreai.round", "round"),
    ("coreai.tanh", "tanh"),
    ("coreai.sigmoid", "sigmoid"),
    ("coreai.relu", "relu"),
    ("coreai.silu", "silu"),
    ("coreai.gelu", "gelu"),
    ("coreai.erf", "erf"),
    ("coreai.abs", "abs"),
    ("coreai.softmax", "softmax"),
    ("coreai.reduce_mean", "reduce_mean"),
    ("coreai.reduce_sum", "reduce_sum"),
    ("coreai.reduce_max", "reduce_max"),
    ("coreai.reduce_min", "reduce_min"),
    ("coreai.reshape", "reshape"),
    ("coreai.transpose", "transpose"),
    ("coreai.expand_dims", "expand_dims"),
    ("coreai.shrink_dims", "squeeze"),
    ("coreai.concat", "concat"),
    ("coreai.split", "split"),
    ("coreai.slice", "slice_by_index"),
    ("coreai.tile", "tile"),
    ("coreai.broadcast_to", "tile"),
    ("coreai.pad", "pad"),
    ("coreai.cast", "cast"),
    ("coreai.max_pool_2d", "max_pool"),
    (
        "coreai.blockwise_shift_scale",
        "constexpr_blockwise_shift_scale",
    ),
    ("coreai.lut_to_dense", "constexpr_lut_to_dense"),
    ("coreai.where", "select"),
    ("coreai.broadcasting_where", "select"),
    ("coreai.gather_nd", "gather_nd"),
    ("coreai.gather_along_axis", "gather_along_axis"),
    ("coreai.scatter_nd", "scatter_nd"),
    ("coreai.scatter_along_axis", "scatter_along_axis"),
    ("coreai.argsort", "argsort"),
    ("coreai.non_zero", "non_zero"),
    ("coreai.if", "cond"),
    ("coreai.while", "while_loop"),
];

/// The MIL op whose rules the Core AI op `op` takes, if the table knows it.
pub fn mil_of(op: &str) -> Option<&'static str> {
    let plain = op.replacen("coreai.decomposable.", "coreai.", 1);
    MIL_OF.iter().find(|(c, _)| *c == plain).map(|(_, m)| *m)
}

/// One value's type as the op listing gives it.
#[derive(Clone, Debug, Deserialize)]
pub struct CoreAiType {
    pub dtype: String,
    pub shape: Vec<usize>,
}

/// One op of a Core AI function.
#[derive(Clone, Debug, Deserialize)]
pub struct CoreAiOp {
    pub op: String,
    #[serde(default)]
    pub results: Vec<CoreAiType>,
    #[serde(default)]
    pub operands: Vec<CoreAiType>,
}

/// What `python -m ane_export.coreai ops` writes.
#[derive(Clone, Debug, Deserialize)]
pub struct CoreAiOps {
    pub functions: BTreeMap<String, Vec<CoreAiOp>>,
}

/// Bytes per element of a Core AI dtype on the ANE (floats are fp16 there).
fn width(dtype: &str) -> f64 {
    match dtype {
        "f16" | "bf16" | "f32" | "f64" | "si16" | "ui16" | "i16" => 2.0,
        "si32" | "ui32" | "i32" => 4.0,
        "si64" | "ui64" | "i64" => 8.0,
        _ => 1.0,
    }
}

fn elements(shape: &[usize]) -> f64 {
    shape.iter().map(|&d| d as f64).product()
}

/// The op's estimated time, as the MIL checker weighs it
/// ([`super::cost`]): `max(flops / PEAK_FLOPS, bytes / PEAK_BYTES)`.
fn cost(op: &CoreAiOp, mil: &str) -> f64 {
    let out = op.results.first().map_or(0.0, |r| elements(&r.shape));
    let flops = match mil {
        // weight [out, in/groups, kh, kw]: 2 * in/groups * kh * kw per output.
        "conv" => {
            2.0 * out
                * op.operands
                    .get(1)
                    .map_or(1.0, |w| w.shape.iter().skip(1).map(|&d| d as f64).product())
        }
        // K: the first operand's last axis.
        "matmul" => {
            2.0 * out
                * op.operands
                    .first()
                    .and_then(|x| x.shape.last())
                    .map_or(1.0, |&k| k as f64)
        }
        "softmax" | "gelu" => 8.0 * out,
        "reshape" | "transpose" | "expand_dims" | "squeeze" | "concat" | "split"
        | "slice_by_index" | "const" => 0.0,
        _ => out,
    };
    let bytes: f64 = op
        .operands
        .iter()
        .chain(&op.results)
        .map(|t| elements(&t.shape) * width(&t.dtype))
        .sum();
    if mil.starts_with("constexpr_") {
        // Decompressed once at load: a token cost, as for the package.
        return op
            .results
            .iter()
            .map(|t| elements(&t.shape) * width(&t.dtype))
            .sum::<f64>()
            / PEAK_BYTES;
    }
    (flops / PEAK_FLOPS).max(bytes / PEAK_BYTES)
}

/// Predict one op: `None` on the ANE, or `(rule, reason)`, by the rules
/// of the MIL op `mil` it translates.
fn place(op: &CoreAiOp, mil: &str) -> Option<(&'static str, String)> {
    let k = op.op.as_str();
    if NEWER_OPS.contains(&mil) {
        return Some(("R17", format!("`{k}` ({mil}) is known to break ANE models")));
    }
    if CPU_OPS.contains(&mil) {
        return Some(("R8", format!("`{k}` ({mil}) runs on the CPU")));
    }
    if let Some(why) = compression(op, mil) {
        return Some(why);
    }
    let tys = op.operands.iter().chain(&op.results);
    for t in tys.clone() {
        let s = &t.shape;
        if s.len() > 5 {
            let id = if mil == "transpose" { "R10" } else { "R6" };
            return Some((id, format!("rank {} ({s:?}) is above 5", s.len())));
        }
        if let Some((&last, rest)) = s.split_last() {
            if last > 16_384 {
                return Some(("R6", format!("last axis {last} of {s:?} is above 16384")));
            }
            if let Some(&big) = rest.iter().find(|&&d| d > 65_536) {
                return Some(("R6", format!("axis {big} of {s:?} is above 65536")));
            }
        }
    }
    // R5: the ANE computes in fp16 (casts at the function's outputs are
    // spared by the caller).
    if op
        .results
        .iter()
        .any(|r| r.dtype == "f32" || r.dtype == "f64")
    {
        return Some((
            "R5",
            format!("`{k}` computes in fp32: the ANE computes in fp16"),
        ));
    }
    if mil != "cast" && op.results.iter().any(|r| width(&r.dtype) == 4.0) {
        return Some(("R8", format!("`{k}` does int32 arithmetic")));
    }
    if mil == "conv"
        && let Some(w) = op.operands.get(1)
        && w.shape.iter().skip(2).any(|&d| d > 13)
    {
        return Some((
            "R7",
            format!("conv kernel {:?} is wider than 13", &w.shape[2..]),
        ));
    }
    None
}

/// R14 for the decompressions: an 8-, 6-, 4-, 2- or 1-bit palette
/// (`lut_to_dense`'s table is `[..., 2^bits, V]`), and int8 with at most
/// one scale axis (`blockwise_shift_scale`'s scale divides its data).
fn compression(op: &CoreAiOp, mil: &str) -> Option<(&'static str, String)> {
    match mil {
        "constexpr_lut_to_dense" => {
            let entries = op
                .operands
                .get(1)
                .and_then(|l| l.shape.len().checked_sub(2).map(|i| l.shape[i]));
            match entries {
                Some(n) if [2, 4, 16, 64, 256].contains(&n) => None,
                Some(n) => Some((
                    "R14",
                    format!("palette of {n} entries: the ANE takes 1, 2, 4, 6 or 8 bits"),
                )),
                None => Some(("R14", "palette without a readable lookup table".into())),
            }
        }
        "constexpr_blockwise_shift_scale" => {
            let (Some(d), Some(s)) = (op.operands.first(), op.operands.get(1)) else {
                return Some(("R14", "quantised weight without data or scale".into()));
            };
            let blocked = d
                .shape
                .iter()
                .zip(&s.shape)
                .any(|(dd, ss)| *ss != 1 && ss != dd);
            let channels = s.shape.iter().filter(|&&x| x != 1).count();
            (blocked || channels > 1).then(|| {
                (
                    "R14",
                    format!(
                        "int8 with per-block scales {:?} for data {:?}: only per-channel scales stay on the ANE",
                        s.shape, d.shape
                    ),
                )
            })
        }
        _ => None,
    }
}

/// Whether the cast `op` is one of the outputs' casts to fp32 still
/// unclaimed in `edges` (their shapes), claiming it.
fn edge(op: &CoreAiOp, edges: &mut Vec<&Vec<usize>>) -> bool {
    let [r] = op.results.as_slice() else {
        return false;
    };
    match edges.iter().position(|s| **s == r.shape) {
        Some(i) if r.dtype == "f32" => {
            edges.swap_remove(i);
            true
        }
        _ => false,
    }
}

/// Predict the Core AI function `function` from its ops; `seq` is the
/// bucket's sequence axis (R11) and `outputs` the shapes of its outputs,
/// both from the package's function, whose signature the program shares.
///
/// The listing does not name values, so the casts of the outputs back to
/// fp32 (the conversion at the function's edge, which the package's
/// checker spares as well) are told by their shape: one cast to fp32 per
/// output, of that output's shape, counts as the edge; any other cast to
/// fp32 is fp32 compute (R5).
pub fn predict_coreai(
    function: &str,
    ops: &[CoreAiOp],
    seq: usize,
    outputs: &[Vec<usize>],
) -> Prediction {
    let mut edges: Vec<&Vec<usize>> = outputs.iter().collect();
    let mut by_type: BTreeMap<String, ByType> = BTreeMap::new();
    let mut off = Vec::new();
    let mut unknown: Vec<String> = Vec::new();
    let (mut total, mut on, mut count) = (0.0f64, 0.0f64, 0usize);
    for (i, op) in ops.iter().enumerate() {
        let mil = mil_of(&op.op);
        if mil == Some("const") {
            continue;
        }
        count += 1;
        let (cost, placement) = match mil {
            None => {
                if !unknown.contains(&op.op) {
                    unknown.push(op.op.clone());
                }
                (
                    0.0,
                    Some((
                        "R8",
                        format!("`{}` is not known to the residency rules", op.op),
                    )),
                )
            }
            Some(m) if seq <= 64 => (
                cost(op, m),
                Some((
                    "R11",
                    format!("the sequence axis is {seq}: workloads this small stay on the CPU"),
                )),
            ),
            Some("cast") if edge(op, &mut edges) => (cost(op, "cast"), None),
            Some(m) => (cost(op, m), place(op, m)),
        };
        let e = by_type.entry(op.op.clone()).or_insert_with(|| ByType {
            op: op.op.clone(),
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
                op: format!("{}#{i}", op.op),
                kind: op.op.clone(),
                rule: id.to_string(),
                reason,
                cost,
            }),
        }
    }
    let fraction = if total > 0.0 {
        on / total
    } else if off.is_empty() {
        1.0
    } else {
        0.0
    };
    let known = if unknown.is_empty() {
        check(
            "R8",
            CheckStatus::Pass,
            "every Core AI op is one the rules know (the MIL op it translates)".into(),
        )
    } else {
        check(
            "R8",
            CheckStatus::Fail,
            format!(
                "Core AI ops the residency rules do not know: {}",
                unknown.join(", ")
            ),
        )
    };
    let mut checks = vec![known];
    for id in ["R5", "R6", "R7", "R14"] {
        let v: Vec<String> = off
            .iter()
            .filter(|o| o.rule == id)
            .take(5)
            .map(|o| format!("`{}`: {}", o.op, o.reason))
            .collect();
        checks.push(if v.is_empty() {
            check(id, CheckStatus::Pass, "no Core AI op breaks it".into())
        } else {
            let n = off.iter().filter(|o| o.rule == id).count();
            check(
                id,
                CheckStatus::Fail,
                format!("{n} Core AI ops off the ANE, e.g. {}", v.join("; ")),
            )
        });
    }
    Prediction {
        function: function.to_string(),
        fraction,
        ops: count,
        ops_off_ane: off.len(),
        by_type: by_type.into_values().collect(),
        off_ane: off,
        checks,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ty(dtype: &str, shape: &[usize]) -> CoreAiType {
        CoreAiType {
            dtype: dtype.into(),
            shape: shape.to_vec(),
        }
    }

    fn op(name: &str, operands: Vec<CoreAiType>, results: Vec<CoreAiType>) -> CoreAiOp {
        CoreAiOp {
            op: name.into(),
            results,
            operands,
        }
    }

    /// A 1x1 conv over 64 channels of a 1024-column bucket, and a softmax.
    fn block(dtype: &str) -> Vec<CoreAiOp> {
        let x = ty(dtype, &[1, 64, 1, 1024]);
        vec![
            op("coreai.constant", vec![], vec![ty(dtype, &[64, 64, 1, 1])]),
            op(
                "coreai.conv2d",
                vec![x.clone(), ty(dtype, &[64, 64, 1, 1])],
                vec![x.clone()],
            ),
            op("coreai.softmax", vec![x.clone()], vec![x]),
        ]
    }

    #[test]
    fn fp16_ops_the_rules_know_are_on_the_ane() {
        let p = predict_coreai("b1024", &block("f16"), 1024, &[]);
        assert_eq!((p.ops, p.ops_off_ane, p.fraction), (2, 0, 1.0));
        assert!(p.failed_checks().is_empty(), "{:?}", p.checks);
    }

    #[test]
    fn decomposable_ops_take_the_rules_of_their_plain_form() {
        assert_eq!(mil_of("coreai.decomposable.broadcasting_add"), Some("add"));
        assert_eq!(mil_of("coreai.slice"), Some("slice_by_index"));
        assert_eq!(mil_of("coreai.decomposable.broadcasting_equal"), None);
    }

    #[test]
    fn fp32_compute_is_off_the_ane() {
        let p = predict_coreai("b1024", &block("f32"), 1024, &[]);
        assert_eq!(p.ops_off_ane, 2);
        assert_eq!(p.fraction, 0.0);
        assert!(p.off_ane.iter().all(|o| o.rule == "R5"), "{:?}", p.off_ane);
        assert!(p.failed_checks().iter().any(|c| c.id == "R5"));
    }

    #[test]
    fn only_the_casts_of_the_outputs_to_fp32_are_spared() {
        let h = ty("f16", &[1, 64, 1, 1024]);
        let f = ty("f32", &[1, 64, 1, 1024]);
        let mut ops = block("f16");
        ops.push(op("coreai.cast", vec![h.clone()], vec![f.clone()]));
        let p = predict_coreai("b1024", &ops, 1024, &[vec![1, 64, 1, 1024]]);
        assert_eq!(p.ops_off_ane, 0, "{:?}", p.off_ane);
        // A second cast of that shape is fp32 compute: one output, one edge.
        ops.push(op("coreai.cast", vec![h], vec![f]));
        let p = predict_coreai("b1024", &ops, 1024, &[vec![1, 64, 1, 1024]]);
        assert_eq!(p.ops_off_ane, 1);
        assert_eq!(p.off_ane[0].rule, "R5");
    }

    #[test]
    fn an_op_the_rules_do_not_know_fails_and_is_named() {
        let mut ops = block("f16");
        ops.push(op(
            "coreai.mystery",
            vec![ty("f16", &[1, 64, 1, 1024])],
            vec![ty("f16", &[1, 64, 1, 1024])],
        ));
        let p = predict_coreai("b1024", &ops, 1024, &[]);
        let failed = p.failed_checks();
        assert!(
            failed
                .iter()
                .any(|c| c.id == "R8" && c.detail.contains("coreai.mystery")),
            "{failed:?}"
        );
        assert_eq!(p.off_ane[0].kind, "coreai.mystery");
    }

    #[test]
    fn size_kernel_and_palette_limits_apply() {
        let wide = ty("f16", &[1, 64, 1, 16_385]);
        let p = predict_coreai(
            "b",
            &[op("coreai.softmax", vec![wide.clone()], vec![wide])],
            16_385,
            &[],
        );
        assert_eq!(p.off_ane[0].rule, "R6");
        let x = ty("f16", &[1, 8, 1, 1024]);
        let p = predict_coreai(
            "b",
            &[
                op(
                    "coreai.conv2d",
                    vec![x.clone(), ty("f16", &[8, 8, 1, 15])],
                    vec![x.clone()],
                ),
                op(
                    "coreai.lut_to_dense",
                    vec![ty("ui8", &[8, 8]), ty("f16", &[1, 1, 32, 1])],
                    vec![ty("f16", &[8, 8])],
                ),
                op(
                    "coreai.lut_to_dense",
                    vec![ty("ui8", &[8, 8]), ty("f16", &[1, 1, 256, 1])],
                    vec![ty("f16", &[8, 8])],
                ),
            ],
            1024,
            &[],
        );
        let rules: Vec<&str> = p.off_ane.iter().map(|o| o.rule.as_str()).collect();
        assert_eq!(rules, ["R7", "R14"], "{:?}", p.off_ane);
        // A bucket of 64 columns or fewer stays on the CPU (R11).
        let p = predict_coreai("b", &block("f16"), 64, &[]);
        assert_eq!(p.ops_off_ane, 2);
        assert!(p.off_ane.iter().all(|o| o.rule == "R11"));
    }
}
