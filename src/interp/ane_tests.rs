//! Ane mode against the published measurements it models
//! (`docs/numerics.md`, "The ANE precision mode"), on small programs built
//! here: each test sets values on both sides of a measured cliff.

use std::collections::HashMap;

use candle_core::{Device, Tensor};

use super::{AneRule, Interpreter, Peak, Precision, RunOutput, Settings, ane_limit};
use crate::mlpackage::{
    Arg, DType, Function, HostData, Named, Op, Package, TensorType, Value, program::Fields,
};

fn ty(dtype: DType, shape: &[usize]) -> TensorType {
    TensorType {
        dtype,
        shape: shape.to_vec(),
    }
}

fn named(name: &str, shape: &[usize]) -> Named {
    Named {
        name: name.into(),
        ty: ty(DType::F32, shape),
    }
}

fn var(n: &str) -> Arg {
    Arg::Var(n.into())
}

fn ints(v: &[i64]) -> Arg {
    Arg::Const(Value::Immediate {
        ty: ty(DType::I32, &[v.len()]),
        data: HostData::I64(v.to_vec()),
    })
}

fn floats(v: &[f32], shape: &[usize]) -> Arg {
    Arg::Const(Value::Immediate {
        ty: ty(DType::F32, shape),
        data: HostData::F32(v.to_vec()),
    })
}

fn boolean(b: bool) -> Arg {
    Arg::Const(Value::Immediate {
        ty: ty(DType::Bool, &[]),
        data: HostData::Bool(vec![b]),
    })
}

/// An op of `kind` reading `inputs`, giving `out` of `shape`.
fn op(kind: &str, inputs: Vec<(&str, Arg)>, out: &str, shape: &[usize]) -> Op {
    Op {
        kind: kind.into(),
        inputs: inputs
            .into_iter()
            .map(|(k, a)| (k.to_string(), vec![a]))
            .collect(),
        outputs: vec![named(out, shape)],
        attributes: Fields::from_iter([]),
    }
}

/// A golden package (for its weights, of which these programs use none)
/// holding the function `main` alone.
fn package(inputs: &[(&str, &[usize])], ops: Vec<Op>) -> Package {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("golden/mil/reductions/model.mlpackage");
    let mut pkg = Package::open(&path).unwrap();
    let outputs = ops.iter().map(|o| o.outputs[0].clone()).collect();
    let f = Function {
        name: "main".into(),
        opset: "CoreML7".into(),
        inputs: inputs.iter().map(|(n, s)| named(n, s)).collect(),
        ops,
        outputs,
    };
    pkg.program.functions.clear();
    pkg.program.functions.insert("main".into(), f);
    pkg.program.description.default_function = "main".into();
    pkg
}

fn run(pkg: &Package, inputs: &[(&str, Vec<f32>, &[usize])], precision: Precision) -> RunOutput {
    let ins: HashMap<String, Tensor> = inputs
        .iter()
        .map(|(n, v, s)| {
            let t = Tensor::from_vec(v.clone(), *s, &Device::Cpu).unwrap();
            (n.to_string(), t)
        })
        .collect();
    Interpreter::new(pkg, Some("main"))
        .unwrap()
        .run(&ins, precision)
        .unwrap()
}

fn values(o: &RunOutput, name: &str) -> Vec<f32> {
    o.outputs[name].flatten_all().unwrap().to_vec1().unwrap()
}

fn peak<'a>(o: &'a RunOutput, name: &str) -> &'a Peak {
    o.peaks
        .iter()
        .find(|p| p.op == name)
        .unwrap_or_else(|| panic!("no peak for `{name}` in {:?}", o.peaks))
}

/// A sum of 16,384 ones is exact through a matmul (wide accumulation) and
/// stops at 2048 through reduce_sum (fp16 accumulation: 2048 + 1 rounds to
/// 2048) in ane mode; fp16 mode sums both in f32.
#[test]
fn reduce_sum_accumulates_in_fp16_and_matmul_wide() {
    let n = 16_384;
    let pkg = package(
        &[("x", &[1, n])],
        vec![
            op(
                "matmul",
                vec![("x", var("x")), ("y", floats(&vec![1.0; n], &[n, 1]))],
                "dot",
                &[1, 1],
            ),
            op(
                "reduce_sum",
                vec![
                    ("x", var("x")),
                    ("axes", ints(&[-1])),
                    ("keep_dims", boolean(true)),
                ],
                "sum",
                &[1, 1],
            ),
        ],
    );
    let ins = [("x", vec![1.0; n], &[1, n][..])];
    let ane = run(&pkg, &ins, Precision::Ane);
    assert_eq!(values(&ane, "dot"), [16384.0]);
    assert_eq!(values(&ane, "sum"), [2048.0]);
    let fp16 = run(&pkg, &ins, Precision::Fp16);
    assert_eq!(values(&fp16, "sum"), [16384.0]);
    // Over both axes (row-major): 2048 ones, a 0 and a 2 give 2050, exact;
    // the ones alone would stop at 2048.
    let pkg = package(
        &[("x", &[2, 1025])],
        vec![op(
            "reduce_sum",
            vec![("x", var("x")), ("keep_dims", boolean(false))],
            "sum",
            &[],
        )],
    );
    let mut v = vec![1.0; 2050];
    v[2049] = 2.0;
    v[2048] = 0.0;
    let ane = run(&pkg, &[("x", v, &[2, 1025])], Precision::Ane);
    assert_eq!(values_scalar(&ane, "sum"), 2050.0);
}

fn values_scalar(o: &RunOutput, name: &str) -> f32 {
    o.outputs[name]
        .to_dtype(candle_core::DType::F32)
        .unwrap()
        .to_vec0()
        .unwrap()
}

/// A matmul whose output is 32,752 stays finite, one that rounds to 32,768
/// is inf, and names the op in the overflow report; an add of the same
/// values stays finite; fp16 mode lets all through.
#[test]
fn matmul_ceiling_at_32768_and_add_passes() {
    let pkg = package(
        &[("x", &[2, 2])],
        vec![
            op(
                "matmul",
                vec![("x", var("x")), ("y", floats(&[1.0, 1.0], &[2, 1]))],
                "mm",
                &[2, 1],
            ),
            op(
                "add",
                vec![("x", var("x")), ("y", var("x"))],
                "twice",
                &[2, 2],
            ),
        ],
    );
    let ins = [("x", vec![16376.0, 16376.0, 16384.0, 16384.0], &[2, 2][..])];
    let ane = run(&pkg, &ins, Precision::Ane);
    assert_eq!(values(&ane, "mm"), [32752.0, f32::INFINITY]);
    assert_eq!(values(&ane, "twice"), [32752.0, 32752.0, 32768.0, 32768.0]);
    let o = ane.first_overflow.as_ref().unwrap();
    assert_eq!((o.op.as_str(), o.kind.as_str()), ("mm", "matmul"));
    assert_eq!((o.nonfinite, o.saturated), (1, 1));
    let fp16 = run(&pkg, &ins, Precision::Fp16);
    assert_eq!(values(&fp16, "mm"), [32752.0, 32768.0]);
    assert!(fp16.first_overflow.is_none());
    // The peaks: the matmul's against 32,752, the add's against fp16's range.
    let (mm, add) = (peak(&ane, "mm"), peak(&ane, "twice"));
    assert_eq!(
        (mm.kind.as_str(), mm.max_abs, mm.limit),
        ("matmul", f32::INFINITY, 32752.0)
    );
    assert_eq!((add.max_abs, add.limit), (32768.0, 65504.0));
    assert_eq!(peak(&fp16, "mm").max_abs, 32768.0);
}

/// A conv of one tap (one input channel, 1x1 kernel) passes 60,000 ([G]);
/// one of two taps is held to the ceiling.
#[test]
fn conv_of_one_tap_passes_the_ceiling() {
    let conv = |name: &str, cin: usize| {
        op(
            "conv",
            vec![
                ("x", var(if cin == 1 { "x1" } else { "x2" })),
                ("weight", floats(&vec![1.0; cin], &[1, cin, 1, 1])),
                (
                    "pad_type",
                    Arg::Const(Value::Immediate {
                        ty: ty(DType::Str, &[]),
                        data: HostData::Str(vec!["valid".into()]),
                    }),
                ),
            ],
            name,
            &[1, 1, 1, 1],
        )
    };
    let pkg = package(
        &[("x1", &[1, 1, 1, 1]), ("x2", &[1, 2, 1, 1])],
        vec![conv("one", 1), conv("two", 2)],
    );
    let ins = [
        ("x1", vec![60000.0], &[1, 1, 1, 1][..]),
        ("x2", vec![30000.0, 30000.0], &[1, 2, 1, 1][..]),
    ];
    let ane = run(&pkg, &ins, Precision::Ane);
    assert_eq!(values(&ane, "one"), [60000.0f32].map(super::round_to_f16));
    assert_eq!(values(&ane, "two"), [f32::INFINITY]);
    assert_eq!(
        (peak(&ane, "one").limit, peak(&ane, "two").limit),
        (65504.0, 32752.0)
    );
    let fp16 = run(&pkg, &ins, Precision::Fp16);
    assert_eq!(values(&fp16, "two"), [60000.0f32].map(super::round_to_f16));
}

/// A slice from a nonzero begin on the last axis turns 4,095 into inf and
/// keeps 4,094; from begin 0, or offset on another axis, 5,000 passes.
/// (4,095 is no fp16 value: inputs round it to 4,096, the next after 4,094.)
#[test]
fn last_axis_offset_slice_clamps_past_4094() {
    let slice = |name: &str, begin: &[i64], end: &[i64], shape: &[usize]| {
        op(
            "slice_by_index",
            vec![("x", var("x")), ("begin", ints(begin)), ("end", ints(end))],
            name,
            shape,
        )
    };
    let pkg = package(
        &[("x", &[2, 4])],
        vec![
            slice("offset", &[0, 1], &[2, 3], &[2, 2]),
            slice("front", &[0, 0], &[2, 2], &[2, 2]),
            slice("rows", &[1, 0], &[2, 4], &[1, 4]),
        ],
    );
    let x = vec![5000.0, 4094.0, 4095.0, 1.0, 5000.0, -4095.0, -4094.0, 2.0];
    let ins = [("x", x, &[2, 4][..])];
    let ane = run(&pkg, &ins, Precision::Ane);
    assert_eq!(
        values(&ane, "offset"),
        [4094.0, f32::INFINITY, f32::NEG_INFINITY, -4094.0]
    );
    assert_eq!(values(&ane, "front"), [5000.0, 4094.0, 5000.0, -4096.0]);
    assert_eq!(values(&ane, "rows"), [5000.0, -4096.0, -4094.0, 2.0]);
    let o = ane.first_overflow.as_ref().unwrap();
    assert_eq!((o.op.as_str(), o.nonfinite, o.saturated), ("offset", 2, 2));
    let fp16 = run(&pkg, &ins, Precision::Fp16);
    assert_eq!(values(&fp16, "offset"), [4094.0, 4096.0, -4096.0, -4094.0]);
    // The offset slice's peak is reported in both modes, against 4,094;
    // the other moves have none.
    assert_eq!(
        (peak(&fp16, "offset").max_abs, peak(&fp16, "offset").limit),
        (4096.0, 4094.0)
    );
    assert!(
        fp16.peaks.iter().all(|p| p.op == "offset"),
        "{:?}",
        fp16.peaks
    );
}

/// A matmul output in fp16's subnormal range is flushed to +0; the same
/// value through a mul (the elementwise path) is kept.
#[test]
fn matmul_subnormals_flush_to_zero() {
    let pkg = package(
        &[("x", &[1, 1])],
        vec![
            op(
                "matmul",
                vec![("x", var("x")), ("y", floats(&[0.5], &[1, 1]))],
                "mm",
                &[1, 1],
            ),
            op(
                "mul",
                vec![("x", var("x")), ("y", floats(&[0.5], &[]))],
                "half",
                &[1, 1],
            ),
        ],
    );
    let tiny = 2f32.powi(-20);
    for x in [tiny, -tiny] {
        let ins = [("x", vec![x], &[1, 1][..])];
        let ane = run(&pkg, &ins, Precision::Ane);
        let mm = values(&ane, "mm")[0];
        assert_eq!(mm.to_bits(), 0, "+0 for {x:e}");
        assert_eq!(values(&ane, "half"), [x / 2.0]);
        assert_eq!(values(&run(&pkg, &ins, Precision::Fp16), "mm"), [x / 2.0]);
    }
}

/// No op gives NaN in ane mode: inf - inf, 0 * inf and sqrt(-1) give +0,
/// log(+inf) gives 0; exp past 11.09 is inf as fp16 rounds it.
#[test]
fn nan_becomes_zero() {
    let s = &[1, 2][..];
    let pkg = package(
        &[("x", s)],
        vec![
            op("sub", vec![("x", var("x")), ("y", var("x"))], "diff", s),
            op(
                "mul",
                vec![("x", var("x")), ("y", floats(&[0.0], &[]))],
                "zero",
                s,
            ),
            op("sqrt", vec![("x", var("x"))], "root", s),
            op("log", vec![("x", var("x"))], "log", s),
            op("exp", vec![("x", var("x"))], "exp", s),
        ],
    );
    // 1e6 is inf in fp16; -4 has no square root.
    let ins = [("x", vec![1e6, -4.0], s)];
    let ane = run(&pkg, &ins, Precision::Ane);
    for name in ["diff", "zero", "root"] {
        let v = values(&ane, name);
        assert!(v.iter().all(|x| !x.is_nan()), "{name}: {v:?}");
    }
    assert_eq!(values(&ane, "diff")[0].to_bits(), 0);
    assert_eq!(values(&ane, "zero")[0].to_bits(), 0);
    assert_eq!(values(&ane, "root")[1].to_bits(), 0);
    assert_eq!(values(&ane, "log")[0], 0.0);
    let fp16 = run(&pkg, &ins, Precision::Fp16);
    assert!(values(&fp16, "diff")[0].is_nan() && values(&fp16, "log")[0].is_infinite());
    let exp = |x: f32| {
        let o = run(&pkg, &[("x", vec![x, 0.0], s)], Precision::Ane);
        values(&o, "exp")[0]
    };
    assert!(exp(11.08).is_finite() && exp(11.1).is_infinite());
}

/// The limits callers read: matmul/linear/conv 32,752 (conv of one tap
/// excepted), offset slice 4,094, everything else 65,504.
#[test]
fn limits_follow_the_rules() {
    let r = |ceiling, slice_clamp| AneRule {
        ceiling,
        slice_clamp,
        ..AneRule::default()
    };
    assert_eq!(ane_limit(&r(true, false)), 32752.0);
    assert_eq!(ane_limit(&r(false, true)), 4094.0);
    assert_eq!(ane_limit(&r(false, false)), 65504.0);
}

/// The golden programs in ane mode: with and without the shortcuts (packed
/// columns, repeated conv columns, dead keys) and with and without fused
/// attention chains where the kernels sum alike, the same outputs, first
/// overflow and peaks; at a gain that overflows too. The chains' inner ops
/// have peaks of their own, named, with the matmul's limit.
#[test]
fn ane_mode_shortcuts_change_no_bit() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("golden/mil");
    let mut chains = 0;
    for case in [
        "attention_block",
        "padded_attention",
        "padded_windows",
        "conv",
        "reductions",
    ] {
        let pkg = Package::open(&root.join(case).join("model.mlpackage")).unwrap();
        let inputs = candle_core::safetensors::load(
            root.join(case).join("inputs.safetensors"),
            &Device::Cpu,
        )
        .unwrap();
        let fast = Interpreter::new(&pkg, None).unwrap();
        let off = Settings {
            shortcuts: false,
            ..Settings::default()
        };
        let slow = Interpreter::with_settings(&pkg, None, off).unwrap();
        for gain in [1.0f32, 300.0] {
            let ins: HashMap<String, Tensor> = inputs
                .iter()
                .map(|(k, t)| {
                    let g = if k == "x" { gain } else { 1.0 };
                    let t = t.to_dtype(candle_core::DType::F32).unwrap();
                    (k.clone(), (t * f64::from(g)).unwrap())
                })
                .collect();
            let a = fast.run(&ins, Precision::Ane).unwrap();
            let b = slow.run(&ins, Precision::Ane).unwrap();
            let what = format!("{case} gain {gain}");
            for (name, t) in &a.outputs {
                let bits = |t: &Tensor| -> Vec<u32> {
                    let v: Vec<f32> = t.flatten_all().unwrap().to_vec1().unwrap();
                    v.iter().map(|x| x.to_bits()).collect()
                };
                assert!(
                    bits(t) == bits(&b.outputs[name]),
                    "{what}: `{name}` differs"
                );
                assert!(
                    bits(t).iter().all(|&x| !f32::from_bits(x).is_nan()),
                    "{what}: NaN"
                );
            }
            let key = |o: &RunOutput| {
                o.first_overflow
                    .as_ref()
                    .map(|o| (o.op.clone(), o.nonfinite, o.saturated))
            };
            assert_eq!(key(&a), key(&b), "{what}");
            assert_eq!(a.peaks, b.peaks, "{what}");
            let inner: Vec<&Peak> = a
                .peaks
                .iter()
                .filter(|p| p.kind == "softmax" || p.op.contains("scores"))
                .collect();
            // layer_norm's input square, as information.
            for p in a.peaks.iter().filter(|p| p.kind == "layer_norm") {
                assert!(p.input_sq_max.is_some_and(|s| s > 0.0), "{what}: {p:?}");
            }
            if fast.attention_chains() > 0 {
                chains += 1;
                assert!(
                    inner
                        .iter()
                        .any(|p| p.kind == "matmul" && p.limit == 32752.0),
                    "{what}: {inner:?}"
                );
            }
        }
    }
    assert!(chains >= 4, "{chains}");
}
