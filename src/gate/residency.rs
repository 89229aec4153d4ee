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

use std::collections::{BTreeMap, HashMap, HashSet};

use serde::{Deserialize, Serialize};

use crate::mlpackage::{Arg, DType, Function, Op, Package, Value};

/// Nominal M1-class Neural Engine throughput (fp16 FLOP/s) and bandwidth (B/s) for op costs.
const PEAK_FLOPS: f64 = 11e12;
const PEAK_BYTES: f64 = 60e9;

/// A rule of ANE-RULES.md as a named check.
#[derive(Clone, Copy, Debug)]
pub struct Rule {
    pub id: &'static str,
    pub name: &'static str,
    pub source: &'static str,
}

/// The rules the checker applies (ANE-RULES.md); R15 and R18 concern the
/// runtime (compute units, the first predict) and are not static.
pub const RULES: &[Rule] = &[
    Rule {
        id: "R1",
        name: "activations (B, C, 1, S): conv and layer_norm on rank-4 tensors, norms over channels",
        source: "apple/ml-ane-transformers reference/layer_norm.py",
    },
    Rule {
        id: "R2",
        name: "every Linear a 1x1 conv",
        source: "apple/ml-ane-transformers huggingface/distilbert.py",
    },
    Rule {
        id: "R3",
        name: "attention split per head, no transposes in the hot path",
        source: "apple/ml-ane-transformers reference/multihead_attention.py",
    },
    Rule {
        id: "R4",
        name: "score tensors chunked (query chunks of at most 512)",
        source: "apple/ml-stable-diffusion attention.py (SPLIT_EINSUM_V2)",
    },
    Rule {
        id: "R5",
        name: "fp16 on the ANE: fp16 compute, eps >= 1e-7, no -inf or out-of-range constants",
        source: "apple/ml-ane-transformers distilbert.py; hollance/neural-engine docs/16-bit.md",
    },
    Rule {
        id: "R6",
        name: "axis limits: last axis <= 16384, other axes <= 65536, rank <= 5",
        source: "whisper.cpp converter; hollance/neural-engine",
    },
    Rule {
        id: "R7",
        name: "conv kernel <= 13, no dilation; pooling kernel <= 13, stride <= 2; upsampling <= 2x",
        source: "hollance/neural-engine docs/unsupported-layers.md",
    },
    Rule {
        id: "R8",
        name: "no gather, scatter, control flow, band_part, recurrent ops, dynamic slices or int32 arithmetic",
        source: "hollance/neural-engine; smpanaro/more-ane-transformers NOTES.md; coremltools issue 1780",
    },
    Rule {
        id: "R10",
        name: "no high-rank permutes (rank > 5)",
        source: "a public Qwen3-VL Core ML port",
    },
    Rule {
        id: "R11",
        name: "workload large enough for the ANE (sequence > 64)",
        source: "a public Rust Core ML runtime's notes",
    },
    Rule {
        id: "R12",
        name: "weights per package <= 2 GB (macOS)",
        source: "apple/ml-stable-diffusion README; Anemll docs/convert.md",
    },
    Rule {
        id: "R13",
        name: "outputs fp16 when they feed another model",
        source: "smpanaro/more-ane-transformers NOTES.md",
    },
    Rule {
        id: "R14",
        name: "compressed weights: palettes of 1/2/4/6/8 bits or int8 with per-channel scales",
        source: "apple/ml-stable-diffusion README; coremltools opt-quantization-perf.md",
    },
    Rule {
        id: "R16",
        name: "an additive mask from the host before every softmax",
        source: "several public ports",
    },
    Rule {
        id: "R17",
        name: "no newer ops known to break ANE models (scaled_dot_product_attention)",
        source: "whisper.cpp PR 3632",
    },
];

fn rule(id: &str) -> &'static Rule {
    RULES.iter().find(|r| r.id == id).expect("known rule id")
}

/// Ops the ANE is known to run (subject to the per-op rules below).
const ANE_OPS: &[&str] = &[
    "conv",
    "conv_transpose",
    "linear",
    "matmul",
    "add",
    "sub",
    "mul",
    "real_div",
    "maximum",
    "minimum",
    "pow",
    "sqrt",
    "rsqrt",
    "exp",
    "tanh",
    "sigmoid",
    "relu",
    "leaky_relu",
    "silu",
    "gelu",
    "softmax",
    "layer_norm",
    "batch_norm",
    "instance_norm",
    "l2_norm",
    "reduce_mean",
    "reduce_sum",
    "reduce_max",
    "reduce_min",
    "reshape",
    "transpose",
    "expand_dims",
    "squeeze",
    "concat",
    "split",
    "slice_by_index",
    "cast",
    "identity",
    "clip",
    "abs",
    "erf",
    "square",
    "inverse",
    "avg_pool",
    "max_pool",
    "upsample_nearest_neighbor",
    "upsample_bilinear",
    "pad",
    "tile",
    "sin",
    "cos",
    "floor",
    "ceil",
    "round",
    "sign",
    "log",
    "elu",
    "prelu",
    "softplus",
    "const",
    "constexpr_affine_dequantize",
    "constexpr_blockwise_shift_scale",
    "constexpr_lut_to_dense",
];

/// Ops that go to the CPU (R8).
const CPU_OPS: &[&str] = &[
    "gather",
    "gather_nd",
    "gather_along_axis",
    "scatter",
    "scatter_nd",
    "scatter_along_axis",
    "cond",
    "while_loop",
    "select",
    "matrix_band_part",
    "band_part",
    "lstm",
    "rnn",
    "gru",
    "non_zero",
    "non_maximum_suppression",
    "topk",
    "argsort",
    "range_1d",
    "fill_like",
    "shape",
    "one_hot",
    "cumsum",
];

/// Newer ops known to break ANE-optimised models (R17).
const NEWER_OPS: &[&str] = &["scaled_dot_product_attention"];

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
    /// `pass`, `warn` or `fail`.
    pub status: String,
    pub detail: String,
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
        self.checks.iter().filter(|c| c.status == "fail").collect()
    }
}

/// Static facts about the values of a function.
struct Facts<'a> {
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

fn bytes_of(shape: &[usize], dtype: DType) -> f64 {
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

/// An op's constant integer input, e.g. conv dilations.
fn const_ints(pkg: &Package, op: &Op, facts: &Facts, key: &str) -> Option<Vec<i64>> {
    const_f64(pkg, op, facts, key).map(|v| v.into_iter().map(|x| x as i64).collect())
}

/// An op's constant input as f64 values (inline, or from a `const` op).
fn const_f64(pkg: &Package, op: &Op, facts: &Facts, key: &str) -> Option<Vec<f64>> {
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

/// FLOPs of one op (a rough count: what dominates its time).
fn flops(op: &Op, facts: &Facts) -> f64 {
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
fn traffic(op: &Op, facts: &Facts) -> f64 {
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

/// Predict one op: `None` on the ANE, or `(rule, reason)`.
fn place(pkg: &Package, op: &Op, facts: &Facts) -> Option<(&'static str, String)> {
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
                .get(*key)
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
fn compression(op: &Op, facts: &Facts) -> Option<(&'static str, String)> {
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

fn check(id: &str, status: &str, detail: String) -> Check {
    let r = rule(id);
    Check {
        id: r.id.into(),
        name: r.name.into(),
        source: r.source.into(),
        status: status.into(),
        detail,
    }
}

/// Function-level checks, one per rule (per-op placements are summarised in
/// the rule they came from).
fn checks(
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
            check(id, "pass", ok.into())
        } else {
            let names: Vec<String> = v
                .iter()
                .take(5)
                .map(|o| format!("`{}` ({}): {}", o.op, o.kind, o.reason))
                .collect();
            check(
                id,
                "fail",
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
            "pass",
            "every conv and layer_norm works on (B, C, 1, S) over channels".into(),
        )
    } else {
        check(
            "R1",
            "warn",
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
            "pass",
            "no `linear` ops; projections are 1x1 convs".into(),
        )
    } else {
        check(
            "R2",
            "warn",
            format!("{linears} `linear` ops: 1x1 convs map better onto the ANE"),
        )
    });

    // R3: transposes against attention heads.
    let transposes = real_ops().filter(|o| o.kind == "transpose").count();
    let softmaxes = real_ops().filter(|o| o.kind == "softmax").count();
    out.push(if softmaxes == 0 || transposes <= softmaxes / 4 + 4 {
        check("R3", "pass", format!("{transposes} transposes for {softmaxes} per-head softmaxes"))
    } else {
        check("R3", "warn", format!("{transposes} transposes for {softmaxes} softmaxes: reshapes and transposes in the attention hot path"))
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
        Some((q, k)) if q > 512 => check("R4", "warn", format!("score tensors up to {q} x {k} are not chunked to 512 queries (memory and speed, not placement){windows}")),
        Some((q, k)) => check("R4", "pass", format!("score tensors up to {q} x {k}{windows}")),
        None => check("R4", "pass", "no attention scores".into()),
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
            "pass",
            "fp16 compute, epsilons >= 1e-7, constants within fp16".into(),
        )
    } else {
        check("R5", "fail", r5.join("; "))
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
            "fail",
            format!("the sequence axis is {seq}: workloads this small stay on the CPU"),
        )
    } else {
        check("R11", "pass", format!("sequence axis {seq}"))
    });
    const LIMIT: u64 = 2_000_000_000;
    out.push(if weight_bytes > LIMIT {
        check(
            "R12",
            "fail",
            format!("{weight_bytes} bytes of weights in one package, above 2 GB: split the tower"),
        )
    } else {
        check("R12", "pass", format!("{weight_bytes} bytes of weights"))
    });
    let fp32_outs: Vec<&str> = f
        .outputs
        .iter()
        .filter(|o| o.ty.dtype == DType::F32)
        .map(|o| o.name.as_str())
        .collect();
    out.push(if fp32_outs.is_empty() {
        check("R13", "pass", "every output is fp16".into())
    } else {
        check("R13", "warn", format!("outputs {} are fp32: fine for a tower read by the host, but hand fp16 to another Core ML model", fp32_outs.join(", ")))
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
                    p.inputs.get(*k).into_iter().flatten().any(|a| match a {
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
            "pass",
            format!("{softmaxes} softmaxes, each after an additive mask from the host"),
        )
    } else {
        check(
            "R16",
            "warn",
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
