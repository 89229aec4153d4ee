//! What weights the fraction: an op's estimated time on an M1-class Neural
//! Engine, `max(flops / PEAK_FLOPS, bytes / PEAK_BYTES)`.

use super::*;

/// Nominal M1-class Neural Engine throughput (fp16 FLOP/s) and bandwidth (B/s) for op costs.
pub(super) const PEAK_FLOPS: f64 = 11e12;
pub(super) const PEAK_BYTES: f64 = 60e9;

pub(super) fn bytes_of(shape: &[usize], dtype: DType) -> f64 {
    let n: f64 = shape.iter().map(|&d| d as f64).product();
    // On the ANE floating-point data is fp16.
    let b = match dtype {
        DType::F16 | DType::F32 | DType::F64 | DType::Bf16 | DType::I16 | DType::U16 => 2.0,
        DType::I32 | DType::U32 => 4.0,
        DType::I64 | DType::U64 => 8.0,
        _ => 1.0,
    };
    n * b
}

/// FLOPs of one op (a rough count: what dominates its time).
pub(super) fn flops(op: &Op, facts: &Facts) -> f64 {
    let out: f64 = op
        .outputs
        .first()
        .map(|o| o.ty.shape.iter().map(|&d| d as f64).product())
        .unwrap_or(0.0);
    let in_dim = |key: &str, axis_from_end: usize| -> f64 {
        facts
            .input_ty(op, key)
            .and_then(|(s, _)| s.len().checked_sub(axis_from_end).map(|i| s[i] as f64))
            .unwrap_or(1.0)
    };
    match op.kind.as_str() {
        "conv" | "conv_transpose" => {
            // weight [out, in/groups, kh, kw]: 2 * in/groups * kh * kw per output.
            let w = facts.input_ty(op, "weight");
            let per: f64 = w
                .map(|(s, _)| s.iter().skip(1).map(|&d| d as f64).product())
                .unwrap_or(1.0);
            2.0 * out * per
        }
        "linear" => 2.0 * out * in_dim("x", 1),
        "matmul" => {
            // K: the contracted axis of x (last, or second to last if transposed).
            let tx = op.inputs.contains_key("transpose_x");
            let k = in_dim("x", 1).max(if tx { in_dim("x", 2) } else { 0.0 });
            2.0 * out * k
        }
        "softmax" | "layer_norm" | "batch_norm" | "instance_norm" | "gelu" => 8.0 * out,
        "reshape" | "transpose" | "expand_dims" | "squeeze" | "concat" | "split"
        | "slice_by_index" | "identity" | "const" => 0.0,
        _ => out,
    }
}

/// Bytes an op reads and writes.
pub(super) fn traffic(op: &Op, facts: &Facts) -> f64 {
    let ins: f64 = op
        .inputs
        .values()
        .flatten()
        .filter_map(|a| facts.ty(a))
        .map(|(s, d)| bytes_of(s, d))
        .sum();
    let outs: f64 = op
        .outputs
        .iter()
        .map(|o| bytes_of(&o.ty.shape, o.ty.dtype))
        .sum();
    ins + outs
}
