//! Function-level checks, one per rule, that are not placements (numerics,
//! size, masks, advice), with status `pass`, `warn` or `fail`.

use super::*;

pub(super) fn check(id: &str, status: CheckStatus, detail: String) -> Check {
    let r = rule(id);
    Check {
        id: r.id.into(),
        name: r.name.into(),
        source: r.source.into(),
        status,
        detail,
    }
}

/// Function-level checks, one per rule (per-op placements are summarised in
/// the rule they came from).
pub(super) fn checks(
    pkg: &Package,
    f: &Function,
    facts: &Facts,
    off: &[OffAne],
    weight_bytes: u64,
    seq: usize,
) -> Vec<Check> {
    let mut out = Vec::new();
    let offs = |id: &str| -> Vec<&OffAne> { off.iter().filter(|o| o.rule == id).collect() };
    let summarise = |id: &str, ok: &str| -> Check {
        let v = offs(id);
        if v.is_empty() {
            check(id, CheckStatus::Pass, ok.into())
        } else {
            let names: Vec<String> = v
                .iter()
                .take(5)
                .map(|o| format!("`{}` ({}): {}", o.op, o.kind, o.reason))
                .collect();
            check(
                id,
                CheckStatus::Fail,
                format!("{} ops off the ANE, e.g. {}", v.len(), names.join("; ")),
            )
        }
    };
    let real_ops = || {
        f.ops
            .iter()
            .filter(|o| o.kind != "const" && !o.kind.starts_with("constexpr_"))
    };

    // R1: conv and layer_norm on rank-4 (B, C, 1, S), norms over axis 1.
    let bad_layout: Vec<String> = real_ops()
        .filter(|o| matches!(o.kind.as_str(), "conv" | "layer_norm"))
        .filter(|o| {
            let rank4 = o.outputs.first().is_some_and(|x| x.ty.shape.len() == 4);
            let axes_ok = o.kind != "layer_norm"
                || const_ints(pkg, o, facts, "axes").is_some_and(|a| a == [1] || a == [-3]);
            !(rank4 && axes_ok)
        })
        .map(|o| format!("`{}` ({})", o.label(), o.kind))
        .collect();
    out.push(if bad_layout.is_empty() {
        check(
            "R1",
            CheckStatus::Pass,
            "every conv and layer_norm works on (B, C, 1, S) over channels".into(),
        )
    } else {
        check(
            "R1",
            CheckStatus::Warn,
            format!(
                "{} ops outside the layout, e.g. {}",
                bad_layout.len(),
                bad_layout[..bad_layout.len().min(5)].join(", ")
            ),
        )
    });

    // R2: linear ops.
    let linears = real_ops().filter(|o| o.kind == "linear").count();
    out.push(if linears == 0 {
        check(
            "R2",
            CheckStatus::Pass,
            "no `linear` ops; projections are 1x1 convs".into(),
        )
    } else {
        check(
            "R2",
            CheckStatus::Warn,
            format!("{linears} `linear` ops: 1x1 convs map better onto the ANE"),
        )
    });

    // R3: transposes against attention heads.
    let transposes = real_ops().filter(|o| o.kind == "transpose").count();
    let softmaxes = real_ops().filter(|o| o.kind == "softmax").count();
    out.push(if softmaxes == 0 || transposes <= softmaxes / 4 + 4 {
        check("R3", CheckStatus::Pass, format!("{transposes} transposes for {softmaxes} per-head softmaxes"))
    } else {
        check("R3", CheckStatus::Warn, format!("{transposes} transposes for {softmaxes} softmaxes: reshapes and transposes in the attention hot path"))
    });

    // R4: the largest softmax (score) tensor.
    let largest = real_ops()
        .filter(|o| o.kind == "softmax")
        .filter_map(|o| o.outputs.first())
        .filter(|o| o.ty.shape.len() >= 2)
        .map(|o| {
            let s = &o.ty.shape;
            (s[s.len() - 2], s[s.len() - 1])
        })
        .max_by_key(|&(q, k)| q * k);
    // Batched score tensors [windows, q, k]: attention within windows.
    let windowed = real_ops()
        .filter(|o| o.kind == "softmax")
        .filter_map(|o| o.outputs.first())
        .filter(|o| o.ty.shape.len() >= 3)
        .filter_map(|o| {
            let s = &o.ty.shape;
            let batch: usize = s[..s.len() - 2].iter().product();
            (batch > 1).then(|| (batch, s[s.len() - 2], s[s.len() - 1]))
        })
        .max_by_key(|&(b, q, k)| b * q * k);
    let windows = windowed.map_or(String::new(), |(b, q, k)| {
        format!("; within windows: {b} windows of {q} x {k}")
    });
    out.push(match largest {
        Some((q, k)) if q > 512 => check("R4", CheckStatus::Warn, format!("score tensors up to {q} x {k} are not chunked to 512 queries (memory and speed, not placement){windows}")),
        Some((q, k)) => check("R4", CheckStatus::Pass, format!("score tensors up to {q} x {k}{windows}")),
        None => check("R4", CheckStatus::Pass, "no attention scores".into()),
    });

    // R5: fp32 compute (placements), small epsilons and constants fp16 cannot hold.
    let mut r5: Vec<String> = offs("R5")
        .iter()
        .take(3)
        .map(|o| format!("`{}`: {}", o.op, o.reason))
        .collect();
    for o in real_ops() {
        if matches!(
            o.kind.as_str(),
            "layer_norm" | "batch_norm" | "instance_norm" | "rsqrt" | "inverse" | "l2_norm"
        ) && let Some(eps) = const_f64(pkg, o, facts, "epsilon")
            // An fp16 program holds an epsilon below 6e-8 as 0 (1e-12 underflows): 0 counts.
            && eps.iter().any(|&e| e < 1e-7)
        {
            r5.push(format!(
                "`{}` ({}) has epsilon {:e}, which underflows in fp16",
                o.label(),
                o.kind,
                eps[0]
            ));
        }
    }
    for o in f.ops.iter().filter(|o| o.kind == "const") {
        if let Some(v) = o.attributes.get("val")
            && matches!(v, Value::Immediate { .. })
            && v.ty().dtype.is_float()
            && let Some(x) = value_f64(pkg, v)
            && x.iter().any(|&x| !x.is_finite() || x.abs() > 65504.0)
        {
            r5.push(format!(
                "constant `{}` holds a value fp16 cannot represent (inf or beyond 65504)",
                o.label()
            ));
        }
    }
    out.push(if r5.is_empty() {
        check(
            "R5",
            CheckStatus::Pass,
            "fp16 compute, epsilons >= 1e-7, constants within fp16".into(),
        )
    } else {
        check("R5", CheckStatus::Fail, r5.join("; "))
    });

    out.push(summarise(
        "R6",
        "every tensor within the ANE's rank and axis limits",
    ));
    out.push(summarise(
        "R7",
        "conv, pooling and upsampling within the ANE's kernels",
    ));
    out.push(summarise(
        "R8",
        "no gather, control flow, dynamic slices or int32 arithmetic",
    ));
    out.push(summarise("R10", "no permutes above rank 5"));
    out.push(if seq <= 64 {
        check(
            "R11",
            CheckStatus::Fail,
            format!("the sequence axis is {seq}: workloads this small stay on the CPU"),
        )
    } else {
        check("R11", CheckStatus::Pass, format!("sequence axis {seq}"))
    });
    const LIMIT: u64 = 2_000_000_000;
    out.push(if weight_bytes > LIMIT {
        check(
            "R12",
            CheckStatus::Fail,
            format!("{weight_bytes} bytes of weights in one package, above 2 GB: split the tower"),
        )
    } else {
        check(
            "R12",
            CheckStatus::Pass,
            format!("{weight_bytes} bytes of weights"),
        )
    });
    let fp32_outs: Vec<&str> = f
        .outputs
        .iter()
        .filter(|o| o.ty.dtype == DType::F32)
        .map(|o| o.name.as_str())
        .collect();
    out.push(if fp32_outs.is_empty() {
        check("R13", CheckStatus::Pass, "every output is fp16".into())
    } else {
        check("R13", CheckStatus::Warn, format!("outputs {} are fp32: fine for a tower read by the host, but hand fp16 to another Core ML model", fp32_outs.join(", ")))
    });
    out.push(summarise(
        "R14",
        "weights uncompressed or compressed in ANE-supported forms",
    ));

    // R16: each softmax's input is `add(scores, mask)` with the mask from the host.
    let unmasked: Vec<String> = real_ops()
        .filter(|o| o.kind == "softmax")
        .filter(|o| {
            let Some(Arg::Var(x)) = o.inputs.get("x").and_then(|a| a.first()) else {
                return true;
            };
            let Some(p) = facts.producer.get(x.as_str()) else {
                return true;
            };
            !(p.kind == "add"
                && ["x", "y"].iter().any(|k| {
                    p.inputs.get(k).into_iter().flatten().any(|a| match a {
                        Arg::Var(n) => facts.derives_from_input(n, 4),
                        Arg::Const(_) => false,
                    })
                }))
        })
        .map(|o| format!("`{}`", o.label()))
        .collect();
    out.push(if unmasked.is_empty() {
        check(
            "R16",
            CheckStatus::Pass,
            format!("{softmaxes} softmaxes, each after an additive mask from the host"),
        )
    } else {
        check(
            "R16",
            CheckStatus::Warn,
            format!(
                "{} of {softmaxes} softmaxes take no host mask (padded keys are attended), e.g. {}",
                unmasked.len(),
                unmasked[..unmasked.len().min(3)].join(", ")
            ),
        )
    });
    out.push(summarise("R17", "no newer ops known to break ANE models"));
    out
}
