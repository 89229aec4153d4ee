//! The rules the checker applies, each with its public source
//! (docs/ane-rules.md), and the op sets they name.

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

pub(super) fn rule(id: &str) -> &'static Rule {
    RULES.iter().find(|r| r.id == id).expect("known rule id")
}

/// Ops the ANE is known to run (subject to the per-op rules below).
pub(super) const ANE_OPS: &[&str] = &[
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
pub(super) const CPU_OPS: &[&str] = &[
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
pub(super) const NEWER_OPS: &[&str] = &["scaled_dot_product_attention"];
