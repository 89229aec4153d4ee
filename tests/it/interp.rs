//! The MIL interpreter against numpy on small programs built with
//! coremltools' MIL builder (`golden/mil/`, made by
//! `python/golden/make_mil_cases.py`), in fp32 and, op by op, in fp16
//! against numpy's correctly rounded fp16 reference; and the package
//! reader's refusals.

use std::collections::HashMap;
use std::path::Path;

use ane_export::interp::{Capture, Interpreter, Precision};
use ane_export::mlpackage::Package;
use candle_core::{Device, Tensor};
use serde_json::Value;

use crate::common::{T, assert_fails, golden, read_all, run};

fn cases() -> Vec<std::path::PathBuf> {
    let mut v: Vec<_> = std::fs::read_dir(golden("mil"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.join("case.json").is_file())
        .collect();
    v.sort();
    assert!(v.len() >= 9, "golden MIL cases missing");
    v
}

/// Run every function of a case and compare each output with numpy's, as
/// `|ours - expected| <= abs + rel * |expected|` with the case's tolerance.
fn check_case(dir: &Path, precision: Precision) -> usize {
    let case: Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("case.json")).unwrap()).unwrap();
    let (abs, rel) = (
        case["tolerance"]["abs"].as_f64().unwrap() as f32,
        case["tolerance"]["rel"].as_f64().unwrap() as f32,
    );
    let pkg = Package::open(&dir.join("model.mlpackage")).unwrap();
    let (inputs, _) = read_all(&dir.join("inputs.safetensors"));
    let (expected, _) = read_all(&dir.join("expected.safetensors"));
    let multi = pkg.program.functions.len() > 1;
    let mut checked = 0;
    for fname in pkg.program.functions.keys() {
        let interp = Interpreter::new(&pkg, Some(fname))
            .unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
        let key = |n: &str| {
            if multi {
                format!("{fname}.{n}")
            } else {
                n.to_string()
            }
        };
        let mut ins = HashMap::new();
        for i in &interp.function().inputs {
            let t = &inputs[&key(&i.name)];
            ins.insert(
                i.name.clone(),
                Tensor::from_vec(t.f32.clone(), t.shape.clone(), &Device::Cpu).unwrap(),
            );
        }
        let out = interp
            .run(&ins, precision)
            .unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
        for (name, t) in &out.outputs {
            let want = &expected[&key(name)];
            assert_eq!(t.dims(), want.shape.as_slice(), "{} {name}", dir.display());
            let got = t.flatten_all().unwrap().to_vec1::<f32>().unwrap();
            let worst = got
                .iter()
                .zip(&want.f32)
                .map(|(g, w)| (g - w).abs() - (abs + rel * w.abs()))
                .fold(f32::MIN, f32::max);
            println!(
                "mil {:18} {fname:5} {name:14} {precision:?} worst margin {worst:+.2e}",
                dir.file_name().unwrap().to_string_lossy()
            );
            if precision == Precision::Fp32 {
                assert!(
                    worst <= 0.0,
                    "{} {fname}/{name}: outside tolerance by {worst}",
                    dir.display()
                );
            }
            checked += 1;
        }
    }
    checked
}

#[test]
fn every_case_matches_numpy_in_fp32() {
    let n: usize = cases().iter().map(|c| check_case(c, Precision::Fp32)).sum();
    assert!(n >= 40, "only {n} outputs checked");
}

/// fp16 emulation runs every case, stays close to fp32 where values are
/// moderate, and reports no overflow on these small programs.
#[test]
fn fp16_emulation_runs_and_rounds() {
    let dir = golden("mil/conv");
    let pkg = Package::open(&dir.join("model.mlpackage")).unwrap();
    let interp = Interpreter::new(&pkg, None).unwrap();
    let (inputs, _) = read_all(&dir.join("inputs.safetensors"));
    let ins: HashMap<String, Tensor> = interp
        .function()
        .inputs
        .iter()
        .map(|i| {
            (
                i.name.clone(),
                Tensor::from_vec(
                    inputs[&i.name].f32.clone(),
                    inputs[&i.name].shape.clone(),
                    &Device::Cpu,
                )
                .unwrap(),
            )
        })
        .collect();
    let a = interp.run(&ins, Precision::Fp32).unwrap();
    let b = interp.run(&ins, Precision::Fp16).unwrap();
    assert!(b.first_overflow.is_none());
    for (name, t) in &b.outputs {
        let v = t.flatten_all().unwrap().to_vec1::<f32>().unwrap();
        // Every value is representable in fp16.
        assert!(
            v.iter().all(|&x| half::f16::from_f32(x).to_f32() == x),
            "{name}"
        );
        let w = a.outputs[name]
            .flatten_all()
            .unwrap()
            .to_vec1::<f32>()
            .unwrap();
        let scale = w.iter().fold(0f32, |m, x| m.max(x.abs()));
        let err = v
            .iter()
            .zip(&w)
            .fold(0f32, |m, (x, y)| m.max((x - y).abs()));
        assert!(err <= 4e-3 * scale.max(1.0), "{name}: fp16 drift {err}");
    }
    for c in cases() {
        check_case(&c, Precision::Fp16);
    }
}

/// fp16 steps an op's output may lie from numpy's reference, which is the
/// op's exact result on the same fp16 operands rounded once to fp16
/// (nearest, ties to even). The interpreter computes each op in f32 and
/// rounds that to fp16, so:
///
/// - 0 steps (bit-exact) for the ops that are correctly rounded that way:
///   add, sub, mul, real_div and sqrt of fp16 operands give the correctly
///   rounded f32 result, and rounding it again to fp16 gives the correctly
///   rounded fp16 result, because double rounding through a format of
///   p >= 2p'+2 bits is innocuous for these five operations (Figueroa 1995;
///   f32 has 24 bits, fp16 11: 24 >= 24). maximum, minimum, abs, relu and
///   reduce_max select a value; the moves (reshape, transpose, expand_dims,
///   squeeze, concat, split, slice_by_index) copy values; a cast between
///   float types, a const and a palette entry (constexpr_lut_to_dense) are
///   one rounding of a stored value.
/// - 1 step for the ops the interpreter evaluates in f32 through more than
///   one rounding or in an order of its own: sums (reduce_sum, reduce_mean,
///   matmul, linear, conv), softmax and layer_norm, the f32 kernels of exp,
///   tanh, sigmoid, silu, gelu and pow (a few f32 ulps), rsqrt (sqrt, then
///   the reciprocal) and constexpr_blockwise_shift_scale (int8 data times
///   an f32 scale, rounded to f32 before fp16). Their f32 error is a few
///   2^-24 relative, far below one fp16 step (2^-10 relative), but when the
///   exact value lies that close to a point halfway between two fp16
///   values, the two sides round to neighbours: one step apart, never two.
///   (A sum that cancels to far below its terms could differ by more; none
///   in these cases does, and if one did the failure would name the op.)
///
/// An op type not listed has no tolerance decided: the test stops there.
fn fp16_steps_allowed(kind: &str) -> u32 {
    match kind {
        "const"
        | "cast"
        | "add"
        | "sub"
        | "mul"
        | "real_div"
        | "sqrt"
        | "maximum"
        | "minimum"
        | "abs"
        | "relu"
        | "reduce_max"
        | "reshape"
        | "transpose"
        | "expand_dims"
        | "squeeze"
        | "concat"
        | "split"
        | "slice_by_index"
        | "constexpr_lut_to_dense" => 0,
        "pow"
        | "rsqrt"
        | "exp"
        | "tanh"
        | "sigmoid"
        | "silu"
        | "gelu"
        | "softmax"
        | "layer_norm"
        | "reduce_sum"
        | "reduce_mean"
        | "matmul"
        | "linear"
        | "conv"
        | "constexpr_blockwise_shift_scale" => 1,
        other => panic!("no fp16 tolerance decided for op type `{other}`"),
    }
}

/// Distance of two fp16 values (held in f32) along the fp16 grid: 0 when
/// equal (+0 and -0 alike), 1 for neighbours; `u32::MAX` when `got` is not
/// an fp16 value at all (a value that was never rounded).
fn fp16_steps(got: f32, want: f32) -> u32 {
    let exact = |x: f32| half::f16::from_f32(x).to_f32().to_bits() == x.to_bits();
    assert!(exact(want), "reference value {want:e} is not an fp16 value");
    if !exact(got) {
        return u32::MAX;
    }
    let ord = |x: f32| {
        let b = i32::from(half::f16::from_f32(x).to_bits());
        if b & 0x8000 != 0 { -(b & 0x7fff) } else { b }
    };
    ord(got).abs_diff(ord(want))
}

/// Compare one value with the reference; a failure is described in `bad`.
/// Returns the largest distance in fp16 steps.
fn compare_fp16(
    what: &str,
    got: &Tensor,
    want: &crate::common::T,
    allowed: u32,
    bad: &mut Vec<String>,
) -> u32 {
    assert_eq!(got.dims(), want.shape.as_slice(), "{what}");
    let got = ane_export::tensor_file::f32_values(got).unwrap();
    let steps: Vec<u32> = got
        .iter()
        .zip(&want.f32)
        .map(|(&g, &w)| fp16_steps(g, w))
        .collect();
    let worst = steps.iter().copied().max().unwrap_or(0);
    if worst > allowed {
        let i = steps.iter().position(|&s| s > allowed).unwrap();
        let n = steps.iter().filter(|&&s| s > allowed).count();
        bad.push(format!(
            "{what}: {n} of {} values beyond {allowed} fp16 steps, first at [{i}]: got {:e}, \
             numpy {:e} ({})",
            got.len(),
            got[i],
            want.f32[i],
            if steps[i] == u32::MAX {
                "not an fp16 value".to_string()
            } else {
                format!("{} steps", steps[i])
            }
        ));
    }
    worst
}

fn tensor_of(t: &crate::common::T) -> Tensor {
    Tensor::from_vec(t.f32.clone(), t.shape.clone(), &Device::Cpu).unwrap()
}

/// What [`check_case_fp16`] checked.
#[derive(Default)]
struct Fp16Counts {
    /// Ops run alone on the reference's operands.
    alone: usize,
    /// Of those, ops one fp16 step off somewhere (allowed for their type).
    alone_one_step: Vec<String>,
    /// Ops of the whole-function run whose operands equal the reference's.
    in_run: usize,
    /// Ops of the whole-function run fed an (allowed) difference from upstream.
    inherited: usize,
}

/// Check a case's fp16 emulation against `expected_fp16.safetensors` (see
/// [`fp16_emulation_matches_numpy_op_by_op`]); failures go to `bad`.
fn check_case_fp16(dir: &Path, bad: &mut Vec<String>) -> Fp16Counts {
    use ane_export::mlpackage::{Arg, Function, Named};
    let case = dir.file_name().unwrap().to_string_lossy().to_string();
    let (reference, _) = read_all(&dir.join("expected_fp16.safetensors"));
    let mut pkg = Package::open(&dir.join("model.mlpackage")).unwrap();
    let multi = pkg.program.functions.len() > 1;
    let fnames: Vec<String> = pkg.program.functions.keys().cloned().collect();
    let key = |f: &str, n: &str| {
        if multi {
            format!("{f}.{n}")
        } else {
            n.to_string()
        }
    };
    let refv = |f: &str, n: &str| {
        reference
            .get(&key(f, n))
            .unwrap_or_else(|| panic!("{case}: no `{}` in expected_fp16", key(f, n)))
    };
    // Each op with floating-point outputs becomes a function of its own:
    // the consts it reads, then the op; its other operands are inputs.
    let mut alone: Vec<(String, String, usize)> = Vec::new();
    for fname in &fnames {
        let f = pkg.program.functions[fname].clone();
        let mut made_by: HashMap<&str, (Option<usize>, &Named)> = HashMap::new();
        for i in &f.inputs {
            made_by.insert(i.name.as_str(), (None, i));
        }
        for (j, op) in f.ops.iter().enumerate() {
            for o in &op.outputs {
                made_by.insert(o.name.as_str(), (Some(j), o));
            }
        }
        for (i, op) in f.ops.iter().enumerate() {
            if !op.outputs.iter().all(|o| o.ty.dtype.is_float()) {
                assert_eq!(
                    op.kind,
                    "const",
                    "{case}: op `{}` has non-float outputs",
                    op.label()
                );
                continue;
            }
            let (mut inputs, mut ops): (Vec<Named>, Vec<_>) = (Vec::new(), Vec::new());
            for a in op.inputs.values().flatten() {
                let Arg::Var(n) = a else { continue };
                match made_by[n.as_str()] {
                    (Some(j), _) if f.ops[j].kind == "const" => {
                        if !ops.contains(&j) {
                            ops.push(j);
                        }
                    }
                    (_, decl) => {
                        assert!(
                            decl.ty.dtype.is_float(),
                            "{case}: `{n}` is not a float value"
                        );
                        if !inputs.iter().any(|d| d.name == *n) {
                            inputs.push(decl.clone());
                        }
                    }
                }
            }
            let mut ops: Vec<_> = ops.into_iter().map(|j| f.ops[j].clone()).collect();
            ops.push(op.clone());
            let name = format!("{fname}#op{i}");
            pkg.program.functions.insert(
                name.clone(),
                Function {
                    name: name.clone(),
                    opset: f.opset.clone(),
                    inputs,
                    ops,
                    outputs: op.outputs.clone(),
                },
            );
            alone.push((name, fname.clone(), i));
        }
    }
    let pkg = pkg;
    let mut counts = Fp16Counts::default();
    for (name, fname, i) in &alone {
        let op = &pkg.program.functions[fname].ops[*i];
        let interp = Interpreter::new(&pkg, Some(name)).unwrap();
        let ins: HashMap<String, Tensor> = interp
            .function()
            .inputs
            .iter()
            .map(|d| (d.name.clone(), tensor_of(refv(fname, &d.name))))
            .collect();
        let out = interp
            .run(&ins, Precision::Fp16)
            .unwrap_or_else(|e| panic!("{case}: {e}"));
        let allowed = fp16_steps_allowed(&op.kind);
        let mut worst = 0;
        for o in &op.outputs {
            let what = format!("{case} {fname} op `{}` ({}) alone", o.name, op.kind);
            worst = worst.max(compare_fp16(
                &what,
                &out.outputs[&o.name],
                refv(fname, &o.name),
                allowed,
                bad,
            ));
        }
        counts.alone += 1;
        if worst == 1 {
            counts
                .alone_one_step
                .push(format!("{} ({})", op.label(), op.kind));
        }
    }
    // The whole function, op by op, from the case's inputs, every value kept.
    let (inputs, _) = read_all(&dir.join("inputs.safetensors"));
    for fname in &fnames {
        let interp = Interpreter::new(&pkg, Some(fname))
            .unwrap()
            .without_fusion();
        let f = interp.function();
        let ins: HashMap<String, Tensor> = f
            .inputs
            .iter()
            .map(|d| (d.name.clone(), tensor_of(&inputs[&key(fname, &d.name)])))
            .collect();
        let names: Vec<String> = f
            .inputs
            .iter()
            .chain(f.ops.iter().flat_map(|o| &o.outputs))
            .filter(|d| d.ty.dtype.is_float())
            .map(|d| d.name.clone())
            .collect();
        let run = interp
            .run_capturing(&ins, Precision::Fp16, &Capture::names(&names))
            .unwrap_or_else(|e| panic!("{case}: {e}"));
        assert!(
            run.first_overflow.is_none(),
            "{case}: {:?}",
            run.first_overflow
        );
        let same = |n: &str| {
            // Floats are captured in fp16 mode as f16 tensors: their values are fp16.
            let dtype = run.captured[n].dtype();
            assert!(
                dtype.is_int() || dtype == candle_core::DType::F16,
                "{n}: {dtype:?}"
            );
            let got = ane_export::tensor_file::f32_values(&run.captured[n]).unwrap();
            got.iter()
                .zip(&refv(fname, n).f32)
                .all(|(g, w)| g.to_bits() == w.to_bits())
        };
        // The inputs are rounded to fp16 exactly as numpy rounds them.
        for d in &f.inputs {
            let what = format!("{case} {fname} input `{}`", d.name);
            compare_fp16(&what, &run.captured[&d.name], refv(fname, &d.name), 0, bad);
        }
        for op in &f.ops {
            let floats: Vec<&Named> = op
                .outputs
                .iter()
                .filter(|o| o.ty.dtype.is_float())
                .collect();
            if floats.is_empty() {
                continue;
            }
            // Non-float operands (axes, shapes, modes) are consts of the program.
            let fed_exactly = op.inputs.values().flatten().all(|a| match a {
                Arg::Var(n) => !run.captured.contains_key(n) || same(n),
                Arg::Const(_) => true,
            });
            // An op fed a difference allowed upstream is not held to its own
            // tolerance here (it was checked alone above), but it must have
            // been rounded.
            let allowed = if fed_exactly {
                fp16_steps_allowed(&op.kind)
            } else {
                u32::MAX - 1
            };
            for o in floats {
                let what = format!("{case} {fname} op `{}` ({}) in the run", o.name, op.kind);
                compare_fp16(
                    &what,
                    &run.captured[&o.name],
                    refv(fname, &o.name),
                    allowed,
                    bad,
                );
            }
            if fed_exactly {
                counts.in_run += 1;
            } else {
                counts.inherited += 1;
            }
        }
    }
    counts
}

/// The fp16 emulation against an independent answer: numpy's op-by-op fp16
/// reference of every golden case (`expected_fp16.safetensors`: every value
/// of the program, each op evaluated exactly enough from its fp16 operands
/// and rounded once to fp16; see `python/golden/make_mil_cases.py`), within
/// the fp16 steps [`fp16_steps_allowed`] allows each op type: 0 for the ops
/// that are correctly rounded in f32-then-fp16, 1 for the others.
///
/// Each op is checked alone: it runs as a function of its own on the
/// reference's fp16 operands, so nothing upstream can excuse or explain a
/// difference. Then each function runs whole, op by op, from the case's
/// inputs with every value kept: the inputs must round exactly as numpy's,
/// and each op whose operands equal the reference's bit for bit must again
/// be within its tolerance. An op fed a one-step difference from upstream
/// (allowed there) would differ for that reason alone, so in the run it is
/// only required to hold fp16 values; such ops are counted.
#[test]
fn fp16_emulation_matches_numpy_op_by_op() {
    let mut bad = Vec::new();
    let mut total = Fp16Counts::default();
    for c in cases() {
        let n = check_case_fp16(&c, &mut bad);
        println!(
            "fp16 {:18} {:3} ops alone (one step off somewhere: {:?}), in the run {:3} fed exactly, {} fed an upstream step",
            c.file_name().unwrap().to_string_lossy(),
            n.alone,
            n.alone_one_step,
            n.in_run,
            n.inherited
        );
        total.alone += n.alone;
        total.in_run += n.in_run;
        total.inherited += n.inherited;
    }
    assert!(
        bad.is_empty(),
        "{} disagreements with numpy's fp16 reference:\n{}",
        bad.len(),
        bad.join("\n")
    );
    assert!(total.alone >= 100, "only {} ops checked", total.alone);
    assert_eq!(total.in_run + total.inherited, total.alone);
}

/// An fp16 overflow is reported at the first op that produced it.
#[test]
fn fp16_names_first_overflowing_op() {
    let dir = golden("mil/elementwise");
    let pkg = Package::open(&dir.join("model.mlpackage")).unwrap();
    let interp = Interpreter::new(&pkg, None).unwrap();
    let mut ins = HashMap::new();
    for i in &interp.function().inputs {
        // x = y = 20. In the saved order (abs, add, add, sub, mul, real_div,
        // maximum, minimum, pow, sqrt, rsqrt, exp, ...) everything before
        // pow stays within fp16 (at most x * y = 400), and pow(|x| + 0.5,
        // y) = 20.5^20 = 1.7e26 is beyond 65504 in all 24 values (finite in
        // f32, so saturated, not non-finite); exp(20) = 4.9e8 comes later.
        ins.insert(
            i.name.clone(),
            (Tensor::ones(i.ty.shape.clone(), candle_core::DType::F32, &Device::Cpu).unwrap()
                * 20.0)
                .unwrap(),
        );
    }
    let out = interp.run(&ins, Precision::Fp16).unwrap();
    let o = out.first_overflow.expect("an overflow");
    assert_eq!(
        (o.op.as_str(), o.kind.as_str(), o.nonfinite, o.saturated),
        ("pow", "pow", 0, 24),
        "{o:?}"
    );
}

#[test]
fn exec_and_inspect_cli() {
    let t = tempfile::tempdir().unwrap();
    let dir = golden("mil/multifunction");
    let pkg = dir.join("model.mlpackage");
    let o = run("ane-export", &["inspect", pkg.to_str().unwrap(), "--json"]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let j: Value = serde_json::from_slice(&o.stdout).unwrap();
    let names: Vec<&str> = j["functions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| f["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["b16", "b8"]);
    assert_eq!(
        j["functions"][0]["inputs"][0]["shape"],
        serde_json::json!([1, 8, 1, 16])
    );
    assert_eq!(j["functions"][0]["op_histogram"]["conv"], 1);

    // exec needs inputs named as the function's; write them from the golden file.
    let (inputs, _) = read_all(&dir.join("inputs.safetensors"));
    let (expected, _) = read_all(&dir.join("expected.safetensors"));
    let inp = t.path().join("in.safetensors");
    ane_export::tensor_file::write(
        &inp,
        vec![(
            "x".into(),
            ane_export::tensor_file::OwnedTensor::f32(
                inputs["b16.x"].shape.clone(),
                &inputs["b16.x"].f32,
            ),
        )],
        None,
    )
    .unwrap();
    let out = t.path().join("out.safetensors");
    let args = [
        "exec",
        pkg.to_str().unwrap(),
        "--function",
        "b16",
        "--inputs",
        inp.to_str().unwrap(),
        "--out",
        out.to_str().unwrap(),
    ];
    let o = run("ane-export", &args);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let (got, _) = read_all(&out);
    let err = got["y"]
        .f32
        .iter()
        .zip(&expected["b16.y"].f32)
        .fold(0f32, |m, (a, b)| m.max((a - b).abs()));
    assert!(err < 1e-5, "{err}");
    // --runs 3: three timed runs (the later ones with the decoded weights kept), same outputs.
    let mut again = args.to_vec();
    again.extend(["--runs", "3"]);
    let o = run("ane-export", &again);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let err = String::from_utf8_lossy(&o.stderr);
    let line = err
        .lines()
        .find(|l| l.starts_with("exec: seconds per run: "))
        .unwrap_or_else(|| panic!("no per-run line in {err}"));
    assert_eq!(line.split(", ").count(), 3, "{line}");
    let (got2, _) = read_all(&out);
    assert_eq!(got2["y"].f32, got["y"].f32);
    // The binaries open the pinned OpenBLAS with the environment's
    // OPENBLAS_* variables hidden (a machine's OPENBLAS_CORETYPE for an
    // older system build does not choose its kernels); ANE_EXPORT_BLAS_CORETYPE
    // does, and ANE_EXPORT_BLAS=gemm runs the gemm crate instead.
    #[cfg(all(target_os = "linux", target_arch = "x86_64"))]
    {
        let kernels = |env: &[(&str, Option<&str>)]| {
            let o = crate::common::run_env("ane-export", &args, env);
            let err = String::from_utf8_lossy(&o.stderr).to_string();
            assert!(o.status.success(), "{err}");
            let line = err
                .lines()
                .find(|l| l.starts_with("exec: function"))
                .map(str::to_string);
            line.unwrap_or_else(|| panic!("no exec line in {err}"))
        };
        let own = kernels(&[
            ("OPENBLAS_CORETYPE", None),
            ("ANE_EXPORT_BLAS_CORETYPE", None),
        ]);
        assert!(own.contains("(libscipy_openblas.so)"), "{own}");
        assert!(!own.to_lowercase().contains("kernels nehalem"), "{own}");
        let hidden = kernels(&[
            ("OPENBLAS_CORETYPE", Some("Nehalem")),
            ("ANE_EXPORT_BLAS_CORETYPE", None),
        ]);
        let products = |l: &str| l[l.find("matrix products: ").expect(l)..].to_string();
        assert_eq!(products(&hidden), products(&own));
        // Nehalem's kernels (SSE4.2) run on any x86-64 CPU CI has.
        let chosen = kernels(&[("ANE_EXPORT_BLAS_CORETYPE", Some("Nehalem"))]);
        assert!(chosen.contains("kernels Nehalem; "), "{chosen}");
        // Nehalem's kernels do not compute columns alike: the convolutions
        // run on the exact kernel where the CPU has AVX2 and FMA.
        if std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("fma")
        {
            assert!(
                chosen
                    .contains("; 1x1 convolutions: the exact kernel (AVX2, every column alike); "),
                "{chosen}"
            );
            // The attention chains take their AVX2 (or AVX-512) path, or
            // the portable one where ANE_EXPORT_SIMD asks.
            assert!(own.ends_with(" (dead keys skipped, rows alike)"), "{own}");
            let none = kernels(&[("ANE_EXPORT_SIMD", Some("none"))]);
            assert!(
                none.ends_with("; attention chains: portable stages, gemm's product"),
                "{none}"
            );
            // ANE_EXPORT_CPU=avx2 runs as an AVX2 CPU would: OpenBLAS's
            // Haswell kernels (unless ANE_EXPORT_BLAS_CORETYPE names
            // others), the exact kernel, the chains' AVX2 path.
            let avx2 = kernels(&[
                ("ANE_EXPORT_CPU", Some("avx2")),
                ("ANE_EXPORT_BLAS_CORETYPE", None),
            ]);
            assert!(
                avx2.contains("kernels Haswell; 1x1 convolutions: the exact kernel")
                    && avx2.ends_with("; attention chains: AVX2 (dead keys skipped, rows alike)"),
                "{avx2}"
            );
            let named = kernels(&[
                ("ANE_EXPORT_CPU", Some("avx2")),
                ("ANE_EXPORT_BLAS_CORETYPE", Some("Nehalem")),
            ]);
            assert!(named.contains("kernels Nehalem; "), "{named}");
            // `--version` names the widest vector path that runs.
            let version = |env: &[(&str, Option<&str>)]| {
                let o = crate::common::run_env("ane-export", &["--version"], env);
                String::from_utf8_lossy(&o.stdout).to_string()
            };
            let wide = std::arch::is_x86_feature_detected!("avx512f");
            let own = version(&[("ANE_EXPORT_CPU", None)]);
            let want = if wide {
                "\nvector paths: AVX-512"
            } else {
                "\nvector paths: AVX2"
            };
            assert!(own.contains(want), "{own}");
            let capped = version(&[("ANE_EXPORT_CPU", Some("avx2"))]);
            assert!(capped.contains("\nvector paths: AVX2"), "{capped}");
            assert_eq!(capped.contains("on a CPU with AVX-512"), wide, "{capped}");
        }
        // A value the setting does not take stops the binary before any work.
        let _ = std::fs::remove_file(&out);
        let o = crate::common::run_env("ane-export", &args, &[("ANE_EXPORT_CPU", Some("avx512"))]);
        assert_fails(
            &o,
            &["ANE_EXPORT_CPU=avx512", "the one value it takes is avx2"],
        );
        assert!(!out.exists(), "nothing written");
        let o = crate::common::run_env("ane-run", &["--version"], &[("ANE_EXPORT_CPU", Some("x"))]);
        assert_fails(&o, &["ANE_EXPORT_CPU=x", "the one value it takes is avx2"]);
        let crate_ = kernels(&[("ANE_EXPORT_BLAS", Some("gemm"))]);
        assert!(
            crate_.contains(
                "matrix products: the gemm crate, kernels the gemm crate; \
                 1x1 convolutions: the matrix products' library; attention chains: "
            ),
            "{crate_}"
        );
    }
    let mut zero = args.to_vec();
    zero.extend(["--runs", "0"]);
    assert_eq!(run("ane-export", &zero).status.code(), Some(2));
    // Without --function, a multifunction package runs its default function (b8): wrong shape here.
    let o = run(
        "ane-export",
        &[
            "exec",
            pkg.to_str().unwrap(),
            "--inputs",
            inp.to_str().unwrap(),
            "--out",
            out.to_str().unwrap(),
        ],
    );
    assert_fails(&o, &["input `x` has shape [1, 8, 1, 16]", "[1, 8, 1, 8]"]);
    let o = run(
        "ane-export",
        &[
            "exec",
            pkg.to_str().unwrap(),
            "--function",
            "b5",
            "--inputs",
            inp.to_str().unwrap(),
            "--out",
            out.to_str().unwrap(),
        ],
    );
    assert_fails(&o, &["no function `b5`", "b16, b8"]);
}

/// Copy a golden package to a temp dir for mutation.
fn copy_pkg(case: &str) -> tempfile::TempDir {
    let t = tempfile::tempdir().unwrap();
    let src = golden(&format!("mil/{case}/model.mlpackage"));
    let dst = t.path().join("model.mlpackage");
    copy_dir(&src, &dst);
    t
}

fn copy_dir(src: &Path, dst: &Path) {
    std::fs::create_dir_all(dst).unwrap();
    for e in std::fs::read_dir(src).unwrap() {
        let p = e.unwrap().path();
        let d = dst.join(p.file_name().unwrap());
        if p.is_dir() {
            copy_dir(&p, &d);
        } else {
            std::fs::copy(&p, &d).unwrap();
        }
    }
}

fn inspect_fails(pkg: &Path, needles: &[&str]) {
    let o = run("ane-export", &["inspect", pkg.to_str().unwrap()]);
    assert_fails(&o, needles);
}

#[test]
fn malformed_packages_are_refused() {
    // Protobuf garbage.
    let t = copy_pkg("conv");
    let pkg = t.path().join("model.mlpackage");
    std::fs::write(
        pkg.join("Data/com.apple.CoreML/model.mlmodel"),
        b"\xff\xff\xff\xffgarbage",
    )
    .unwrap();
    inspect_fails(&pkg, &["model.mlmodel", "not a Core ML model protobuf"]);

    // Path traversal and absolute paths in Manifest.json.
    for bad in ["../../etc/passwd", "/etc/passwd"] {
        let t = copy_pkg("conv");
        let pkg = t.path().join("model.mlpackage");
        let m = pkg.join("Manifest.json");
        let mut v: Value = serde_json::from_str(&std::fs::read_to_string(&m).unwrap()).unwrap();
        let root = v["rootModelIdentifier"].as_str().unwrap().to_string();
        v["itemInfoEntries"][&root]["path"] = bad.into();
        std::fs::write(&m, v.to_string()).unwrap();
        inspect_fails(&pkg, &["Manifest.json", bad]);
    }

    // A symbolic link out of the package.
    let t = copy_pkg("conv");
    let pkg = t.path().join("model.mlpackage");
    let model = pkg.join("Data/com.apple.CoreML/model.mlmodel");
    let outside = t.path().join("outside.mlmodel");
    std::fs::rename(&model, &outside).unwrap();
    std::os::unix::fs::symlink(&outside, &model).unwrap();
    inspect_fails(&pkg, &["symbolic link"]);

    // Weight offsets out of range: truncate the weight file.
    let t = copy_pkg("conv");
    let pkg = t.path().join("model.mlpackage");
    let w = pkg.join("Data/com.apple.CoreML/weights/weight.bin");
    let bytes = std::fs::read(&w).unwrap();
    std::fs::write(&w, &bytes[..bytes.len() - 64]).unwrap();
    inspect_fails(&pkg, &["weight", "past the end"]);

    // A blob metadata record whose size disagrees with the declared type.
    let t = copy_pkg("conv");
    let pkg = t.path().join("model.mlpackage");
    let w = pkg.join("Data/com.apple.CoreML/weights/weight.bin");
    let mut bytes = std::fs::read(&w).unwrap();
    let size = u64::from_le_bytes(bytes[72..80].try_into().unwrap());
    bytes[72..80].copy_from_slice(&(size - 4).to_le_bytes());
    std::fs::write(&w, &bytes).unwrap();
    inspect_fails(&pkg, &["blob at offset 64", "needs"]);

    // Not a package at all.
    inspect_fails(
        &t.path().join("nope.mlpackage"),
        &["not an .mlpackage directory"],
    );
}

fn attention_inputs(pkg: &Package, gain: f32) -> HashMap<String, Tensor> {
    let dir = golden("mil/attention_block");
    let (inputs, _) = read_all(&dir.join("inputs.safetensors"));
    let f = pkg.program.function(None).unwrap();
    f.inputs
        .iter()
        .map(|i| {
            let t = &inputs[&i.name];
            let g = if i.name == "x" { gain } else { 1.0 };
            let v: Vec<f32> = t.f32.iter().map(|x| x * g).collect();
            (
                i.name.clone(),
                Tensor::from_vec(v, t.shape.clone(), &Device::Cpu).unwrap(),
            )
        })
        .collect()
}

fn max_diff(a: &Tensor, b: &Tensor) -> f32 {
    let (a, b) = (
        a.flatten_all().unwrap().to_vec1::<f32>().unwrap(),
        b.flatten_all().unwrap().to_vec1::<f32>().unwrap(),
    );
    a.iter()
        .zip(&b)
        .fold(0f32, |m, (x, y)| m.max((x - y).abs()))
}

/// The attention chains (matmul, mul, add, softmax, matmul) run in tiles
/// give what the ops give one by one, in both numeric modes; a captured
/// intermediate keeps its chain op by op.
#[test]
fn attention_chains_run_fused_as_op_by_op() {
    let pkg = Package::open(&golden("mil/attention_block").join("model.mlpackage")).unwrap();
    let fused = Interpreter::new(&pkg, None).unwrap();
    let plain = Interpreter::new(&pkg, None).unwrap().without_fusion();
    assert_eq!(fused.attention_chains(), 2, "one chain per head");
    assert_eq!(plain.attention_chains(), 0);
    let ins = attention_inputs(&pkg, 1.0);
    for (precision, tol) in [
        (Precision::Fp32, 1e-6),
        (Precision::Fp16, 4e-3),
        (Precision::Ane, 4e-3),
    ] {
        let a = fused.run(&ins, precision).unwrap();
        let b = plain.run(&ins, precision).unwrap();
        let d = max_diff(&a.outputs["out"], &b.outputs["out"]);
        assert!(d <= tol, "{precision:?}: fused and op-by-op differ by {d}");
        assert!(a.first_overflow.is_none() && b.first_overflow.is_none());
        // The chains' inner ops have their peaks fused as op by op, by name.
        let names = |o: &ane_export::interp::RunOutput| {
            let mut v: Vec<(String, String, f32)> = o
                .peaks
                .iter()
                .map(|p| (p.op.clone(), p.kind.clone(), p.limit))
                .collect();
            v.sort_by(|x, y| x.0.cmp(&y.0));
            v
        };
        assert_eq!(names(&a), names(&b), "{precision:?}");
        if precision != Precision::Fp32 {
            assert!(
                names(&a)
                    .iter()
                    .any(|(n, k, l)| n.starts_with("scores") && k == "matmul" && *l == 32752.0),
                "{:?}",
                names(&a)
            );
        }
        for p in a.peaks.iter().filter(|p| p.kind == "softmax") {
            let q = b.peaks.iter().find(|q| q.op == p.op).unwrap();
            assert!((p.max_abs - q.max_abs).abs() <= tol, "{p:?} {q:?}");
        }
    }
    // Capturing the scores of head 0: that head runs op by op, head 1 fused.
    let c = fused
        .run_capturing(
            &ins,
            Precision::Fp32,
            &Capture::names(&["scores0".to_string()]),
        )
        .unwrap();
    assert_eq!(c.captured["scores0"].dims(), &[1, 8, 8]);
    let b = plain.run(&ins, Precision::Fp32).unwrap();
    assert!(max_diff(&c.outputs["out"], &b.outputs["out"]) <= 1e-6);
    // Runs without captures keep the schedule the first made (chains
    // fused), whatever a capturing run did in between: the same bits.
    let again = fused.run(&ins, Precision::Fp32).unwrap();
    let first = Interpreter::new(&pkg, None)
        .unwrap()
        .run(&ins, Precision::Fp32)
        .unwrap();
    let bits = |t: &candle_core::Tensor| -> Vec<u32> {
        let v = t.flatten_all().unwrap().to_vec1::<f32>().unwrap();
        v.iter().map(|x| x.to_bits()).collect()
    };
    assert_eq!(bits(&again.outputs["out"]), bits(&first.outputs["out"]));
    assert_eq!(fused.attention_chains(), 2);
}

/// An fp16 overflow inside a fused chain is reported at the same op as
/// when the chain runs op by op.
#[test]
fn fp16_overflow_inside_a_chain_names_the_same_op() {
    let pkg = Package::open(&golden("mil/attention_block").join("model.mlpackage")).unwrap();
    let fused = Interpreter::new(&pkg, None).unwrap();
    let plain = Interpreter::new(&pkg, None).unwrap().without_fusion();
    // x scaled by 150: q and k stay within fp16, their products do not.
    // In ane mode the scores' matmul meets its ceiling at 32,768.
    for (precision, gain) in [
        (Precision::Fp16, 150.0),
        (Precision::Ane, 150.0),
        (Precision::Ane, 110.0),
    ] {
        let ins = attention_inputs(&pkg, gain);
        let a = fused.run(&ins, precision).unwrap();
        let b = plain.run(&ins, precision).unwrap();
        let (a, b) = (a.first_overflow.unwrap(), b.first_overflow.unwrap());
        assert_eq!(
            (a.op.as_str(), a.kind.as_str()),
            (b.op.as_str(), b.kind.as_str())
        );
        assert!(
            a.op.starts_with("scores") || a.op.starts_with("scaled"),
            "expected the overflow in a chain, got {a:?}"
        );
        assert_eq!((a.nonfinite, a.saturated), (b.nonfinite, b.saturated));
    }
}

/// Every output of `a` and `b`, bit for bit, and their first fp16 overflow.
fn same_run(a: &ane_export::interp::RunOutput, b: &ane_export::interp::RunOutput, what: &str) {
    assert_eq!(
        a.outputs.keys().collect::<Vec<_>>(),
        b.outputs.keys().collect::<Vec<_>>()
    );
    for (name, t) in &a.outputs {
        let bits = |t: &Tensor| {
            let v = t.flatten_all().unwrap().to_vec1::<f32>().unwrap();
            v.iter().map(|x| x.to_bits()).collect::<Vec<_>>()
        };
        assert_eq!(t.dims(), b.outputs[name].dims(), "{what} {name}");
        assert!(
            bits(t) == bits(&b.outputs[name]),
            "{what}: `{name}` differs"
        );
    }
    let key = |o: &Option<ane_export::interp::Overflow>| {
        o.as_ref()
            .map(|o| (o.op.clone(), o.kind.clone(), o.nonfinite, o.saturated))
    };
    assert_eq!(key(&a.first_overflow), key(&b.first_overflow), "{what}");
    // Each op's peak alike: a packed value's carried columns hold its
    // largest |x|.
    assert_eq!(a.peaks, b.peaks, "{what}");
}

/// A case's inputs as tensors, by name.
fn tensors(inputs: &HashMap<String, T>) -> HashMap<String, Tensor> {
    inputs
        .iter()
        .map(|(k, t)| {
            (
                k.clone(),
                Tensor::from_vec(t.f32.clone(), t.shape.clone(), &Device::Cpu).unwrap(),
            )
        })
        .collect()
}

/// Values whose last-axis columns repeat (a bucket's pad slots) are
/// carried packed, their distinct columns once: every output, and the first
/// fp16 overflow with its counts, is bit for bit what computing every
/// column gives. Every golden program runs on inputs whose second half of
/// columns repeats one column, in fp32 and fp16, at ordinary scale and
/// scaled until fp16 overflows; `padded_attention`, a padded bucket in
/// miniature, must carry its pad columns packed through its 1x1
/// convolutions and attention chains (where the BLAS kernels compute equal
/// columns alike).
#[test]
fn packed_columns_change_no_bit() {
    let mut packed_cases = Vec::new();
    for dir in cases() {
        let name = dir.file_name().unwrap().to_string_lossy().to_string();
        let pkg = Package::open(&dir.join("model.mlpackage")).unwrap();
        let (inputs, _) = read_all(&dir.join("inputs.safetensors"));
        let multi = pkg.program.functions.len() > 1;
        for fname in pkg.program.functions.keys() {
            let packing = Interpreter::new(&pkg, Some(fname)).unwrap();
            let whole = Interpreter::new(&pkg, Some(fname))
                .unwrap()
                .without_packing();
            for gain in [1.0f32, 3000.0] {
                let mut ins = HashMap::new();
                for i in &packing.function().inputs {
                    let key = if multi {
                        format!("{fname}.{}", i.name)
                    } else {
                        i.name.clone()
                    };
                    let t = &inputs[&key];
                    let mut v = t.f32.clone();
                    if let [_, _, 1, s] = t.shape[..]
                        && s >= 2
                    {
                        // Columns s/2.. repeat column s/2, as pad slots do.
                        for row in v.chunks_exact_mut(s) {
                            let pad = row[s / 2];
                            row[s / 2..].fill(pad);
                            row.iter_mut().for_each(|x| *x *= gain);
                        }
                    }
                    ins.insert(
                        i.name.clone(),
                        Tensor::from_vec(v, t.shape.clone(), &Device::Cpu).unwrap(),
                    );
                }
                for precision in [Precision::Fp32, Precision::Fp16, Precision::Ane] {
                    let what = format!("{name} {fname} gain {gain} {precision:?}");
                    let a = packing.run(&ins, precision).unwrap();
                    let b = whole.run(&ins, precision).unwrap();
                    same_run(&a, &b, &what);
                    assert_eq!(b.work.columns.0, b.work.columns.1, "{what}");
                    if a.work.columns.0 < a.work.columns.1 {
                        packed_cases.push(what);
                    }
                }
            }
        }
    }
    println!("packed: {packed_cases:?}");
    assert!(
        packed_cases.iter().any(|c| c.starts_with("shapes")),
        "{packed_cases:?}"
    );
    // The padded tower in miniature: conv, chains and all carried packed.
    let pkg = Package::open(&golden("mil/padded_attention/model.mlpackage")).unwrap();
    let (inputs, _) = read_all(&golden("mil/padded_attention/inputs.safetensors"));
    let ins = tensors(&inputs);
    let packing = Interpreter::new(&pkg, None).unwrap();
    let whole = Interpreter::new(&pkg, None).unwrap().without_packing();
    // As made, each pad row attends to itself alone: the chains compute
    // every row and find the pad rows' contexts equal. With pad rows that
    // attend to the real keys (as SigLIP2's key padding does), each chain
    // computes the distinct rows alone.
    let mut rows_alike = ins.clone();
    let mut m = inputs["mask"].f32.clone();
    let (s, real) = (128, 40);
    for j in real..s {
        m[j * s..(j + 1) * s].fill(-1e4);
        m[j * s..j * s + real].fill(0.0);
    }
    rows_alike.insert(
        "mask".into(),
        Tensor::from_vec(m, (1, s, s), &Device::Cpu).unwrap(),
    );
    let kernels = ane_export::blas::kernel();
    let independent = ane_export::blas::columns_independent_kernel(&kernels);
    let mut overflowed = 0;
    for (what, ins) in [("self-attending pads", &ins), ("pads alike", &rows_alike)] {
        // The mask scaled beyond fp16's range: the chains' masked scores
        // overflow, and the counts must be the whole chains'.
        let mut loud = ins.clone();
        loud.insert("mask".into(), (&ins["mask"] * 100.0).unwrap());
        for (precision, ins) in [
            (Precision::Fp32, ins),
            (Precision::Fp16, ins),
            (Precision::Fp16, &loud),
            (Precision::Ane, ins),
            (Precision::Ane, &loud),
        ] {
            let a = packing.run(ins, precision).unwrap();
            let b = whole.run(ins, precision).unwrap();
            same_run(&a, &b, &format!("padded_attention, {what}, {precision:?}"));
            if let Some(o) = &a.first_overflow {
                assert!(o.op.ends_with("_masked"), "{o:?}");
                overflowed += 1;
                continue;
            }
            let share = |(x, y): (u64, u64)| x as f64 / y as f64;
            let (cols, rows) = (share(a.work.columns), share(a.work.query_rows));
            println!(
                "padded_attention, {what}, {precision:?}: computed {cols:.3} of the columns, {rows:.3} of the query rows"
            );
            assert_eq!(b.work.query_rows.0, b.work.query_rows.1);
            if independent {
                // 41 distinct columns of 128 (apart from the mask's slices).
                assert!(cols < 0.6, "{what}, {precision:?}: {cols}");
                if what == "pads alike" && ane_export::interp::rows_independent_here() {
                    // Each chain's distinct rows: 40 and 1 of 64, then 1.
                    assert!(rows < 0.4, "{what}, {precision:?}: {rows}");
                }
            }
        }
    }
    assert_eq!(overflowed, 4, "the scaled runs should overflow fp16");
}

/// A capture of some columns (the cosine gate's real rows) holds, of every
/// value, those columns of the whole value in the order asked, bit for bit,
/// whether the value was carried packed or not; in fp16 mode as f16. A
/// column beyond the value's last axis is refused by number.
#[test]
fn captured_columns_are_the_whole_values_columns() {
    let pkg = Package::open(&golden("mil/padded_attention/model.mlpackage")).unwrap();
    let (inputs, _) = read_all(&golden("mil/padded_attention/inputs.safetensors"));
    let ins = tensors(&inputs);
    let packing = Interpreter::new(&pkg, None).unwrap();
    let whole = Interpreter::new(&pkg, None).unwrap().without_packing();
    let s = 128;
    // Every float value whose last axis is the sequence's.
    let names: Vec<String> = packing
        .function()
        .ops
        .iter()
        .flat_map(|o| &o.outputs)
        .filter(|d| d.ty.dtype.is_float() && d.ty.shape.last() == Some(&s))
        .map(|d| d.name.clone())
        .collect();
    assert!(names.len() > 10, "{names:?}");
    // Real columns and pad columns, out of order and repeated.
    let cols = vec![39usize, 0, 5, 40, 127, 3, 64, 0];
    for precision in [Precision::Fp32, Precision::Fp16] {
        let all = whole
            .run_capturing(&ins, precision, &Capture::names(&names))
            .unwrap();
        let some = packing
            .run_capturing(
                &ins,
                precision,
                &Capture {
                    names: names.clone(),
                    columns: Some(cols.clone()),
                },
            )
            .unwrap();
        same_run(&all, &some, &format!("{precision:?}"));
        for n in &names {
            let (a, b) = (&all.captured[n], &some.captured[n]);
            let want = if precision == Precision::Fp16 {
                candle_core::DType::F16
            } else {
                candle_core::DType::F32
            };
            assert_eq!((a.dtype(), b.dtype()), (want, want), "{n}");
            let mut dims = a.dims().to_vec();
            *dims.last_mut().unwrap() = cols.len();
            assert_eq!(b.dims(), &dims[..], "{n}");
            let f = |t: &Tensor| {
                t.to_dtype(candle_core::DType::F32)
                    .unwrap()
                    .flatten_all()
                    .unwrap()
                    .to_vec1::<f32>()
                    .unwrap()
            };
            let (a, b) = (f(a), f(b));
            for (ra, rb) in a.chunks_exact(s).zip(b.chunks_exact(cols.len())) {
                let picked: Vec<u32> = cols.iter().map(|&c| ra[c].to_bits()).collect();
                let got: Vec<u32> = rb.iter().map(|x| x.to_bits()).collect();
                assert_eq!(picked, got, "{n} {precision:?}");
            }
        }
    }
    let Err(e) = packing.run_capturing(
        &ins,
        Precision::Fp16,
        &Capture {
            names: names[..1].to_vec(),
            columns: Some(vec![0, s]),
        },
    ) else {
        panic!("a column beyond the last axis was captured");
    };
    // The error names the op that captured (InterpError::At) around the cause.
    assert!(
        matches!(
            e.innermost(),
            ane_export::interp::InterpError::CaptureColumn {
                column: 128,
                len: 128
            }
        ),
        "{e:?}"
    );
    assert!(
        e.to_string().contains("column 128 of a last axis of 128"),
        "{e}"
    );
}

/// Qwen2.5-VL's window attention on a padded bucket (`padded_windows`): the
/// pad columns stay packed up to the window split, the heads' contexts are
/// packed again once their columns are checked to repeat (each pad slot
/// attends to itself alone), and everything after runs packed; every bit
/// and the first fp16 overflow are those of the whole run.
#[test]
fn packed_columns_pass_through_windows() {
    let dir = golden("mil/padded_windows");
    let pkg = Package::open(&dir.join("model.mlpackage")).unwrap();
    let (inputs, _) = read_all(&dir.join("inputs.safetensors"));
    let ins = tensors(&inputs);
    // The mask scaled beyond fp16's range: the masked scores overflow.
    let mut loud = ins.clone();
    loud.insert("window_mask".into(), (&ins["window_mask"] * 100.0).unwrap());
    let packing = Interpreter::new(&pkg, None).unwrap();
    let whole = Interpreter::new(&pkg, None).unwrap().without_packing();
    let independent = ane_export::blas::columns_independent_kernel(&ane_export::blas::kernel())
        && ane_export::interp::rows_independent_here();
    let mut overflowed = 0;
    for (precision, ins) in [
        (Precision::Fp32, &ins),
        (Precision::Fp16, &ins),
        (Precision::Fp16, &loud),
    ] {
        let a = packing.run(ins, precision).unwrap();
        let b = whole.run(ins, precision).unwrap();
        same_run(&a, &b, &format!("padded_windows, {precision:?}"));
        assert_eq!(b.work.columns.0, b.work.columns.1);
        if let Some(o) = &a.first_overflow {
            assert!(o.op.ends_with("_masked"), "{o:?}");
            overflowed += 1;
            continue;
        }
        let cols = a.work.columns.0 as f64 / a.work.columns.1 as f64;
        println!("padded_windows, {precision:?}: computed {cols:.3} of the columns");
        if independent {
            // 21 distinct columns of 128 outside the windows, the window
            // ops' own columns all computed: 0.415. Were the contexts not
            // packed again, the six ops after them (the heads' reshapes and
            // concat, the projection, the residual add, GELU) would compute
            // all 128 columns: 0.582 (measured with the re-packing off).
            assert!(cols < 0.5, "{precision:?}: {cols}");
        }
    }
    assert_eq!(overflowed, 1, "the scaled run should overflow fp16");
}
