//! What the cosine gate reads from a program besides running it: where
//! each block's output is (the taps that measure per-block drift), and the
//! constants that must equal the reference's.

use std::collections::HashMap;

use crate::mlpackage::{Function, Package};

/// Names of the values holding each block's output in a function built by
/// `ane-export build` (`b{i}_out` after a post-norm block, else `b{i}_res2`;
/// or with the fp16 pass's suffix).
pub fn block_taps(f: &Function, depth: usize) -> Vec<Option<String>> {
    (0..depth)
        .map(|i| {
            // A post-norm block's output is after its last norm (`b<i>_out`,
            // the text encoders'); a pre-norm block's is its second residual add.
            [format!("b{i}_out"), format!("b{i}_res2")]
                .iter()
                .find_map(|plain| {
                    let cast = format!("{plain}_cast_fp16");
                    f.ops
                        .iter()
                        .flat_map(|o| &o.outputs)
                        .find(|o| &o.name == plain || o.name == cast)
                        .map(|o| o.name.clone())
                })
        })
        .collect()
}

/// Constants of a program that its outputs cannot show, checked against the
/// reference's own: every `layer_norm`'s epsilon must be the reference's
/// (`LAYER_NORM_EPS`) as the program's dtype stores it. A LayerNorm epsilon
/// 10x too large changes a tower's outputs by less than fp16 rounding (the
/// docs/cli.md, "Cosine threshold and margin"), so no cosine threshold can catch
/// it. Returns one line per op that differs; empty when all agree.
pub fn constant_mismatches(pkg: &Package, f: &Function, reference_eps: f64) -> Vec<String> {
    use crate::mlpackage::{Arg, DType};
    let producer: HashMap<&str, &crate::mlpackage::Op> = f
        .ops
        .iter()
        .flat_map(|o| o.outputs.iter().map(move |n| (n.name.as_str(), o)))
        .collect();
    let mut bad = Vec::new();
    for op in f.ops.iter().filter(|o| o.kind == "layer_norm") {
        let value = match op.inputs.get("epsilon").and_then(|v| v.first()) {
            Some(Arg::Const(v)) => Some(v),
            Some(Arg::Var(n)) => producer
                .get(n.as_str())
                .filter(|p| p.kind == "const")
                .and_then(|p| p.attributes.get("val")),
            None => None,
        };
        let Some(value) = value else {
            bad.push(format!(
                "`{}` (layer_norm): epsilon is not a constant",
                op.label()
            ));
            continue;
        };
        let got = crate::gate::residency::value_f64(pkg, value).and_then(|v| v.first().copied());
        let want = match value.ty().dtype {
            DType::F16 => half::f16::from_f64(reference_eps).to_f64(),
            _ => reference_eps as f32 as f64,
        };
        if got != Some(want) {
            bad.push(format!(
                "`{}` (layer_norm): epsilon {}, the reference's is {reference_eps:e} ({want:e} as stored)",
                op.label(),
                got.map_or("unreadable".to_string(), |g| format!("{g:e}"))
            ));
        }
    }
    bad
}
