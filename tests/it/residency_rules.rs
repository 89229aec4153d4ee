//! The static residency checker (`src/gate/residency/`), rule by rule.
//!
//! For every rule in `residency::RULES` a tiny ML program breaks it and a
//! minimal counterpart keeps it (`golden/residency/<case>/model.mlpackage`,
//! made by `python/golden/make_residency_cases.py`; the cases are listed in
//! `golden/residency/README.md`). Per-op rules are asserted on the exact set
//! of ops placed off the ANE, each with its rule id (ops are named by their
//! first output); function-level rules on the status and detail of the check
//! with that id.

use std::collections::BTreeMap;
use std::path::PathBuf;

use ane_export::gate::residency::{Check, Prediction, RULES, predict};
use ane_export::mlpackage::{Arg, Package};

fn package(case: &str) -> Package {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("golden/residency")
        .join(case)
        .join("model.mlpackage");
    Package::open(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// One case: the checker's prediction and the program's ops (name -> type).
struct Case {
    name: &'static str,
    ops: BTreeMap<String, String>,
    p: Prediction,
}

/// Predict a case with the package's real weight size (as `gate` does).
fn case(name: &'static str) -> Case {
    let pkg = package(name);
    let bytes = pkg.weight_bytes().values().sum();
    case_with_bytes(name, &pkg, bytes)
}

fn case_with_bytes(name: &'static str, pkg: &Package, weight_bytes: u64) -> Case {
    let f = pkg.program.function(None).unwrap();
    let ops = f
        .ops
        .iter()
        .filter(|o| o.kind != "const")
        .map(|o| (o.label().to_string(), o.kind.clone()))
        .collect();
    let p = predict(pkg, f, weight_bytes);
    Case { name, ops, p }
}

impl Case {
    /// Ops placed off the ANE: name -> rule id.
    fn off(&self) -> BTreeMap<&str, &str> {
        let m: BTreeMap<&str, &str> = self
            .p
            .off_ane
            .iter()
            .map(|o| (o.op.as_str(), o.rule.as_str()))
            .collect();
        assert_eq!(
            m.len(),
            self.p.off_ane.len(),
            "{}: an op placed twice",
            self.name
        );
        m
    }

    /// The reason the checker gives for one op placed off the ANE.
    fn reason(&self, op: &str) -> &str {
        let o = self.p.off_ane.iter().find(|o| o.op == op);
        &o.unwrap_or_else(|| panic!("{}: `{op}` not off the ANE", self.name))
            .reason
    }

    /// Exactly these ops are off the ANE, each by exactly this rule.
    fn expect_off(&self, want: &[(&str, &str)]) {
        for (op, _) in want {
            self.expect_op(op);
        }
        let want: BTreeMap<&str, &str> = want.iter().copied().collect();
        assert_eq!(self.off(), want, "{}: {:#?}", self.name, self.p.off_ane);
        assert_eq!(self.p.ops_off_ane, want.len(), "{}", self.name);
        if want.is_empty() {
            assert_eq!(self.p.fraction, 1.0, "{}", self.name);
        } else {
            assert!(self.p.fraction < 1.0, "{}: {}", self.name, self.p.fraction);
        }
    }

    /// These ops exist in the program and are predicted on the ANE.
    fn expect_on_ane(&self, names: &[&str]) {
        for op in names {
            self.expect_op(op);
            assert!(
                !self.off().contains_key(op),
                "{}: `{op}` off the ANE: {}",
                self.name,
                self.reason(op)
            );
        }
    }

    /// The program holds an op of this name (so that "not flagged" means something).
    fn expect_op(&self, op: &str) {
        assert!(
            self.ops.contains_key(op),
            "{}: no op `{op}` in the program: {:?}",
            self.name,
            self.ops
        );
    }

    fn check(&self, id: &str) -> &Check {
        let v: Vec<&Check> = self.p.checks.iter().filter(|c| c.id == id).collect();
        assert_eq!(v.len(), 1, "{}: checks with id {id}: {v:?}", self.name);
        v[0]
    }

    /// The check `id` has this status and its detail contains every `needles`.
    fn expect_check(&self, id: &str, status: &str, needles: &[&str]) {
        let c = self.check(id);
        assert_eq!(
            c.status.to_string(),
            status,
            "{}: {id}: {}",
            self.name,
            c.detail
        );
        for n in needles {
            assert!(
                c.detail.contains(n),
                "{}: {id} detail lacks {n:?}: {}",
                self.name,
                c.detail
            );
        }
    }
}

// Every rule the checker lists has exactly one function-level check.
#[test]
fn every_rule_has_one_check_in_rule_order() {
    let c = case("r11_ok");
    let ids: Vec<&str> = c.p.checks.iter().map(|c| c.id.as_str()).collect();
    let rules: Vec<&str> = RULES.iter().map(|r| r.id).collect();
    assert_eq!(ids, rules);
    assert_eq!(
        rules,
        [
            "R1", "R2", "R3", "R4", "R5", "R6", "R7", "R8", "R10", "R11", "R12", "R13", "R14",
            "R16", "R17"
        ]
    );
}

// R1: function-level advice (warn); layout breaks are not placements.
#[test]
fn r1_warns_on_layer_norm_over_the_sequence_and_rank3_conv() {
    let c = case("r1_break");
    c.expect_check(
        "R1",
        "warn",
        &[
            "2 ops outside the layout",
            "`ln_over_seq` (layer_norm)",
            "`conv_rank3` (conv)",
        ],
    );
    c.expect_off(&[]);
    c.expect_on_ane(&["ln_over_seq", "conv_rank3"]);
}

#[test]
fn r1_passes_channels_first_rank4() {
    let c = case("r1_ok");
    c.expect_check("R1", "pass", &[]);
    c.expect_off(&[]);
    c.expect_on_ane(&["ln_channels", "ln_channels_neg", "conv_rank4"]);
}

// R2: function-level advice (warn).
#[test]
fn r2_warns_on_a_linear_op() {
    let c = case("r2_break");
    assert_eq!(c.ops["proj_linear"], "linear");
    c.expect_check("R2", "warn", &["1 `linear` ops"]);
    c.expect_off(&[]);
}

#[test]
fn r2_passes_a_1x1_conv() {
    let c = case("r2_ok");
    assert_eq!(c.ops["proj_conv"], "conv");
    c.expect_check("R2", "pass", &[]);
    c.expect_off(&[]);
}

// R3: function-level (warn) above softmaxes / 4 + 4 transposes.
#[test]
fn r3_warns_on_five_transposes_for_one_softmax() {
    let c = case("r3_break");
    c.expect_check("R3", "warn", &["5 transposes for 1 softmaxes"]);
    c.expect_on_ane(&["t1", "t5", "probs"]);
}

#[test]
fn r3_passes_four_transposes_for_one_softmax() {
    let c = case("r3_ok");
    c.expect_check("R3", "pass", &["4 transposes for 1"]);
    c.expect_on_ane(&["t1", "t4", "probs"]);
}

// R4: function-level (warn, not a placement) above 512 queries.
#[test]
fn r4_warns_on_513_queries() {
    let c = case("r4_break");
    c.expect_check("R4", "warn", &["513 x 128"]);
    c.expect_off(&[]);
    c.expect_on_ane(&["probs"]);
}

#[test]
fn r4_passes_512_queries() {
    let c = case("r4_ok");
    c.expect_check("R4", "pass", &["512 x 128"]);
    c.expect_off(&[]);
}

// R5: placements (fp32 compute) plus function-level findings (epsilons, constants).
#[test]
fn r5_places_an_fp32_op_off_the_ane() {
    let c = case("r5_break_fp32_op");
    c.expect_off(&[("relu_fp32", "R5")]);
    assert!(c.reason("relu_fp32").contains("computes in fp32"));
    c.expect_on_ane(&["relu_fp16"]);
    c.expect_check("R5", "fail", &["`relu_fp32`"]);
}

#[test]
fn r5_places_a_cast_to_fp32_inside_the_program_off_the_ane() {
    let c = case("r5_break_cast");
    c.expect_off(&[("mid_fp32", "R5")]);
    assert!(
        c.reason("mid_fp32")
            .contains("casts to fp32 inside the program")
    );
    c.expect_on_ane(&["relu", "back_fp16"]);
    c.expect_check("R5", "fail", &["`mid_fp32`"]);
}

#[test]
fn r5_fails_on_epsilons_below_1e_7_including_one_that_underflowed_to_0() {
    let c = case("r5_break_epsilon");
    c.expect_off(&[]);
    c.expect_check(
        "R5",
        "fail",
        &[
            "`ln_eps_underflow` (layer_norm) has epsilon 0e0",
            "`ln_eps_subnormal` (layer_norm) has epsilon 5.96",
        ],
    );
}

#[test]
fn r5_fails_on_an_inf_constant() {
    let c = case("r5_break_inf");
    c.expect_off(&[]);
    c.expect_on_ane(&["add_neg_inf"]);
    // The constant is the add's `y`, whatever coremltools named it.
    let pkg = package("r5_break_inf");
    let f = pkg.program.function(None).unwrap();
    let add = f.ops.iter().find(|o| o.label() == "add_neg_inf").unwrap();
    let Some(Arg::Var(y)) = add.inputs["y"].first() else {
        panic!("add's y is not a const op: {:?}", add.inputs["y"]);
    };
    c.expect_check(
        "R5",
        "fail",
        &[&format!(
            "constant `{y}` holds a value fp16 cannot represent"
        )],
    );
}

#[test]
fn r5_passes_fp16_with_edge_casts_eps_1e_7_and_minus_1e4() {
    let c = case("r5_ok");
    c.expect_off(&[]);
    c.expect_on_ane(&["x_fp16", "ln", "add_mask_value", "out_fp32"]);
    c.expect_check("R5", "pass", &[]);
}

// R6: placements.
#[test]
fn r6_places_axes_above_the_limits_off_the_ane() {
    let c = case("r6_break_axes");
    c.expect_off(&[("relu_last_16385", "R6"), ("relu_axis_65537", "R6")]);
    assert!(c.reason("relu_last_16385").contains("last axis 16385"));
    assert!(c.reason("relu_axis_65537").contains("axis 65537"));
    c.expect_check("R6", "fail", &["2 ops off the ANE"]);
}

#[test]
fn r6_places_a_rank_6_op_off_the_ane() {
    let c = case("r6_break_rank");
    c.expect_off(&[("relu_rank6", "R6")]);
    assert!(c.reason("relu_rank6").contains("rank 6"));
    c.expect_check("R6", "fail", &["`relu_rank6` (relu)"]);
    c.expect_check("R10", "pass", &[]);
}

#[test]
fn r6_passes_axes_and_rank_at_the_limits() {
    let c = case("r6_ok");
    c.expect_off(&[]);
    c.expect_on_ane(&["relu_last_16384", "relu_axis_65536", "relu_rank5"]);
    c.expect_check("R6", "pass", &[]);
}

// R7: placements.
#[test]
fn r7_places_wide_dilated_pooling_and_upsampling_ops_off_the_ane() {
    let c = case("r7_break");
    c.expect_off(&[
        ("conv_k14", "R7"),
        ("conv_dilated", "R7"),
        ("pool_k14", "R7"),
        ("pool_s3", "R7"),
        ("up_3x", "R7"),
        ("up_2_5x", "R7"),
    ]);
    assert!(c.reason("conv_k14").contains("wider than 13"));
    assert!(c.reason("conv_dilated").contains("dilated"));
    assert!(c.reason("up_2_5x").contains("above 2x"));
    c.expect_check("R7", "fail", &["6 ops off the ANE"]);
}

#[test]
fn r7_passes_kernels_strides_and_scales_at_the_limits() {
    let c = case("r7_ok");
    c.expect_off(&[]);
    c.expect_on_ane(&[
        "conv_k13",
        "conv_undilated",
        "pool_k13_s2",
        "up_2x",
        "up_bilinear_2x",
    ]);
    c.expect_check("R7", "pass", &[]);
}

// R8: placements.
#[test]
fn r8_places_gather_dynamic_slice_int32_unknown_and_band_part_off_the_ane() {
    let c = case("r8_break");
    c.expect_off(&[
        ("gather_rows", "R8"),
        ("dyn_slice", "R8"),
        ("int_add", "R8"),
        ("reduce_prod", "R8"),
        ("band", "R8"),
    ]);
    assert!(c.reason("gather_rows").contains("runs on the CPU"));
    assert!(c.reason("dyn_slice").contains("dynamic slice"));
    assert!(c.reason("int_add").contains("int32 arithmetic"));
    assert!(
        c.reason("reduce_prod")
            .contains("not known to run on the Neural Engine")
    );
    c.expect_on_ane(&["x_2d"]);
    c.expect_check("R8", "fail", &["5 ops off the ANE"]);
}

#[test]
fn r8_passes_static_slice_fp16_add_and_reduce_sum() {
    let c = case("r8_ok");
    c.expect_off(&[]);
    c.expect_on_ane(&["static_slice", "fp16_add", "reduce_sum"]);
    c.expect_check("R8", "pass", &[]);
}

// R10: placements (a transpose above rank 5; other rank-6 ops are R6).
#[test]
fn r10_places_a_rank_6_transpose_off_the_ane() {
    let c = case("r10_break");
    c.expect_off(&[("patchify_perm", "R10")]);
    c.expect_check("R10", "fail", &["`patchify_perm` (transpose)"]);
    c.expect_check("R6", "pass", &[]);
}

#[test]
fn r10_passes_a_rank_5_transpose() {
    let c = case("r10_ok");
    c.expect_off(&[]);
    c.expect_on_ane(&["perm_rank5"]);
    c.expect_check("R10", "pass", &[]);
}

// R11: every op of a tiny function is placed off, and the check fails.
#[test]
fn r11_places_everything_off_at_sequence_64() {
    let c = case("r11_break");
    c.expect_off(&[("relu", "R11")]);
    c.expect_check("R11", "fail", &["the sequence axis is 64"]);
}

#[test]
fn r11_passes_at_sequence_65() {
    let c = case("r11_ok");
    c.expect_off(&[]);
    c.expect_on_ane(&["relu"]);
    c.expect_check("R11", "pass", &["sequence axis 65"]);
}

// R12: function-level, from the package's weight size (an argument of `predict`).
#[test]
fn r12_fails_above_2_gb_of_weights_and_passes_at_2_gb() {
    let pkg = package("r7_ok");
    let real: u64 = pkg.weight_bytes().values().sum();
    assert!(real > 0, "r7_ok holds conv weights");
    let c = case_with_bytes("r7_ok", &pkg, real);
    c.expect_check("R12", "pass", &[&format!("{real} bytes of weights")]);
    let c = case_with_bytes("r7_ok", &pkg, 2_000_000_000);
    c.expect_check("R12", "pass", &[]);
    let c = case_with_bytes("r7_ok", &pkg, 2_000_000_001);
    c.expect_check(
        "R12",
        "fail",
        &["2000000001 bytes of weights", "above 2 GB"],
    );
    // Not a placement.
    c.expect_off(&[]);
}

// R13: function-level (warn) on fp32 outputs.
#[test]
fn r13_warns_on_an_fp32_output() {
    let c = case("r13_break");
    c.expect_check("R13", "warn", &["outputs out_fp32 are fp32"]);
    // The cast to the output is the output conversion, not an R5 placement.
    c.expect_off(&[]);
    c.expect_on_ane(&["relu", "out_fp32"]);
}

#[test]
fn r13_passes_an_fp16_output() {
    let c = case("r13_ok");
    c.expect_check("R13", "pass", &[]);
    c.expect_on_ane(&["out_fp16"]);
}

// R14: placements of the constexpr decompression ops.
#[test]
fn r14_places_a_3_bit_palette_per_block_int8_and_sparse_weights_off_the_ane() {
    let c = case("r14_break");
    c.expect_off(&[("w_pal3", "R14"), ("w_block", "R14"), ("w_sparse", "R14")]);
    assert!(c.reason("w_pal3").contains("palette of 8 entries"));
    assert!(
        c.reason("w_block")
            .contains("per-block scales [16, 2, 1, 1]")
    );
    assert!(
        c.reason("w_sparse")
            .contains("not a compression the ANE takes")
    );
    c.expect_on_ane(&["conv_pal3", "conv_block", "conv_sparse"]);
    c.expect_check("R14", "fail", &["3 ops off the ANE"]);
}

#[test]
fn r14_passes_a_4_bit_palette_and_per_channel_int8() {
    let c = case("r14_ok");
    c.expect_off(&[]);
    c.expect_on_ane(&["w_pal4", "w_chan", "conv_pal4", "conv_chan"]);
    c.expect_check("R14", "pass", &[]);
}

// R16: function-level (warn) on softmaxes without a host mask.
#[test]
fn r16_warns_on_softmaxes_without_a_host_mask() {
    let c = case("r16_break");
    c.expect_check(
        "R16",
        "warn",
        &["2 of 2 softmaxes", "`probs_unmasked`", "`probs_const_mask`"],
    );
    c.expect_off(&[]);
}

#[test]
fn r16_passes_softmaxes_after_a_host_mask() {
    let c = case("r16_ok");
    c.expect_check("R16", "pass", &["2 softmaxes"]);
    c.expect_on_ane(&["probs_masked", "probs_masked_expanded"]);
}

// R17: placements.
#[test]
fn r17_places_scaled_dot_product_attention_off_the_ane() {
    let c = case("r17_break");
    c.expect_off(&[("sdpa", "R17")]);
    c.expect_check("R17", "fail", &["`sdpa` (scaled_dot_product_attention)"]);
}

#[test]
fn r17_passes_attention_as_matmul_softmax_matmul() {
    let c = case("r17_ok");
    c.expect_off(&[]);
    c.expect_on_ane(&["scores", "probs", "ctx"]);
    c.expect_check("R17", "pass", &[]);
}
