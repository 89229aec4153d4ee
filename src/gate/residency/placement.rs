//! Per-op placement: the rule that sends an op off the Neural Engine, if any
//! (R1 to R10, R14, R17).

use super::*;

/// Predict one op: `None` on the ANE, or `(rule, reason)`.
pub(super) fn place(pkg: &Package, op: &Op, facts: &Facts) -> Option<(&'static str, String)> {
    let k = op.kind.as_str();
    if NEWER_OPS.contains(&k) {
        return Some((
            "R17",
            format!("`{k}` is a newer op known to break ANE-optimised models"),
        ));
    }
    if CPU_OPS.contains(&k) {
        return Some(("R8", format!("`{k}` runs on the CPU")));
    }
    // Before the known-op test: a weight decompression the ANE does not take
    // (e.g. `constexpr_sparse_to_dense`) is an R14 finding, not an unknown op.
    if k.starts_with("constexpr_") {
        return compression(op, facts);
    }
    if !ANE_OPS.contains(&k) {
        return Some((
            "R8",
            format!("`{k}` is not known to run on the Neural Engine"),
        ));
    }
    if k == "const" {
        return None;
    }
    // R6 and R10: ranks and axis sizes of everything the op touches.
    let tys: Vec<(&[usize], DType)> = op
        .inputs
        .values()
        .flatten()
        .filter(|a| !facts.is_const(a))
        .filter_map(|a| facts.ty(a))
        .chain(
            op.outputs
                .iter()
                .map(|o| (o.ty.shape.as_slice(), o.ty.dtype)),
        )
        .collect();
    if let Some((s, _)) = tys.iter().find(|(s, _)| s.len() > 5) {
        let id = if k == "transpose" { "R10" } else { "R6" };
        return Some((id, format!("rank {} ({s:?}) is above 5", s.len())));
    }
    for (s, _) in &tys {
        if let Some((&last, rest)) = s.split_last() {
            if last > 16_384 {
                return Some(("R6", format!("last axis {last} of {s:?} is above 16384")));
            }
            if let Some(&big) = rest.iter().find(|&&d| d > 65_536) {
                return Some(("R6", format!("axis {big} of {s:?} is above 65536")));
            }
        }
    }
    // R5: the ANE computes in fp16. Casts at the function's edges are the
    // input/output conversion; an op computing in fp32 elsewhere is not on the ANE.
    let fp32_out = op.outputs.iter().any(|o| o.ty.dtype == DType::F32);
    if k == "cast" {
        let from_input = op.inputs.get("x").into_iter().flatten().any(|a| match a {
            Arg::Var(n) => facts.inputs.contains(n.as_str()),
            Arg::Const(_) => false,
        });
        let to_output = op
            .outputs
            .iter()
            .any(|o| facts.outputs.contains(o.name.as_str()));
        if fp32_out && !to_output && !from_input {
            return Some((
                "R5",
                "casts to fp32 inside the program: the ANE computes in fp16".into(),
            ));
        }
    } else if fp32_out {
        return Some((
            "R5",
            format!("`{k}` computes in fp32: the ANE computes in fp16"),
        ));
    }
    if op.outputs.iter().any(|o| o.ty.dtype == DType::I32) && k != "cast" {
        return Some(("R8", format!("`{k}` does int32 arithmetic")));
    }
    // R8: slices with offsets computed at run time.
    if k == "slice_by_index"
        && ["begin", "end"].iter().any(|key| {
            op.inputs
                .get(key)
                .into_iter()
                .flatten()
                .any(|a| !facts.is_const(a))
        })
    {
        return Some((
            "R8",
            "slice offsets computed at run time (dynamic slice)".into(),
        ));
    }
    // R7: kernels, dilations, pooling and upsampling.
    match k {
        "conv" | "conv_transpose" => {
            let w = facts.input_ty(op, "weight");
            if let Some((s, _)) = w
                && s.iter().skip(2).any(|&d| d > 13)
            {
                return Some(("R7", format!("conv kernel {:?} is wider than 13", &s[2..])));
            }
            if let Some(d) = const_ints(pkg, op, facts, "dilations")
                && d.iter().any(|&x| x > 1)
            {
                return Some(("R7", format!("dilated conv {d:?}")));
            }
        }
        "avg_pool" | "max_pool" => {
            let kern = const_ints(pkg, op, facts, "kernel_sizes").unwrap_or_default();
            let strides = const_ints(pkg, op, facts, "strides").unwrap_or_default();
            if kern.iter().any(|&x| x > 13) || strides.iter().any(|&x| x > 2) {
                return Some((
                    "R7",
                    format!("pooling kernel {kern:?}, strides {strides:?}"),
                ));
            }
        }
        "upsample_nearest_neighbor" | "upsample_bilinear" => {
            // Scale factors are floats (2.5x is above 2x): not truncated to integers.
            for key in ["scale_factor_height", "scale_factor_width"] {
                if let Some(v) = const_f64(pkg, op, facts, key)
                    && v.iter().any(|&x| x > 2.0)
                {
                    return Some(("R7", format!("upsampling by {v:?}, above 2x")));
                }
            }
        }
        _ => {}
    }
    None
}

/// R14: constexpr decompression that stays on the ANE.
pub(super) fn compression(op: &Op, facts: &Facts) -> Option<(&'static str, String)> {
    let k = op.kind.as_str();
    match k {
        "constexpr_lut_to_dense" => {
            // iOS16 form: attribute `lut` [2^nbits]; iOS18: input `lut` [..., 2^nbits, 1].
            let lut = op
                .attributes
                .get("lut")
                .map(|v| v.ty().shape.clone())
                .or_else(|| facts.input_ty(op, "lut").map(|(s, _)| s.to_vec()));
            let entries = lut.and_then(|s| {
                if s.len() == 1 {
                    s.first().copied()
                } else {
                    s.len().checked_sub(2).map(|i| s[i])
                }
            });
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
            let data = facts.input_ty(op, "data");
            let scale = facts.input_ty(op, "scale");
            let (Some((d, _)), Some((s, _))) = (data, scale) else {
                return Some(("R14", "quantised weight without data or scale".into()));
            };
            // Per channel: each scale axis is 1 or spans the whole data axis.
            let blocked: Vec<usize> = d
                .iter()
                .zip(s)
                .enumerate()
                .filter(|(_, (dd, ss))| **ss != 1 && **ss != **dd)
                .map(|(i, _)| i)
                .collect();
            let channels = s.iter().filter(|&&x| x != 1).count();
            if !blocked.is_empty() || channels > 1 {
                Some((
                    "R14",
                    format!(
                        "int8 with per-block scales {s:?} for data {d:?}: only per-channel scales stay on the ANE"
                    ),
                ))
            } else {
                None
            }
        }
        "constexpr_affine_dequantize" => None,
        _ => Some(("R14", format!("`{k}` is not a compression the ANE takes"))),
    }
}
