//! The MIL interpreter against numpy on small programs built with
//! coremltools' MIL builder (`golden/mil/`, made by
//! `python/golden/make_mil_cases.py`), and the package reader's refusals.

use std::collections::HashMap;
use std::path::Path;

use ane_export::interp::{Interpreter, Precision};
use ane_export::mlpackage::Package;
use candle_core::{Device, Tensor};
use serde_json::Value;

use crate::common::{assert_fails, golden, read_all, run};

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

/// An fp16 overflow is reported at the first op that produced it.
#[test]
fn fp16_names_first_overflowing_op() {
    let dir = golden("mil/elementwise");
    let pkg = Package::open(&dir.join("model.mlpackage")).unwrap();
    let interp = Interpreter::new(&pkg, None).unwrap();
    let mut ins = HashMap::new();
    for i in &interp.function().inputs {
        // exp(20) = 4.9e8 is far beyond fp16's 65504.
        ins.insert(
            i.name.clone(),
            (Tensor::ones(i.ty.shape.clone(), candle_core::DType::F32, &Device::Cpu).unwrap()
                * 20.0)
                .unwrap(),
        );
    }
    let out = interp.run(&ins, Precision::Fp16).unwrap();
    let o = out.first_overflow.expect("an overflow");
    assert!(o.nonfinite + o.saturated > 0);
    let first_bad = interp
        .function()
        .ops
        .iter()
        .position(|op| op.label() == o.op)
        .expect("the op exists");
    assert!(first_bad > 0, "{o:?}");
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
    for (precision, tol) in [(Precision::Fp32, 1e-6), (Precision::Fp16, 4e-3)] {
        let a = fused.run(&ins, precision).unwrap();
        let b = plain.run(&ins, precision).unwrap();
        let d = max_diff(&a.outputs["out"], &b.outputs["out"]);
        assert!(d <= tol, "{precision:?}: fused and op-by-op differ by {d}");
        assert!(a.first_overflow.is_none() && b.first_overflow.is_none());
    }
    // Capturing the scores of head 0: that head runs op by op, head 1 fused.
    let c = fused
        .run_capturing(&ins, Precision::Fp32, &["scores0".to_string()])
        .unwrap();
    assert_eq!(c.captured["scores0"].dims(), &[1, 8, 8]);
    let b = plain.run(&ins, Precision::Fp32).unwrap();
    assert!(max_diff(&c.outputs["out"], &b.outputs["out"]) <= 1e-6);
}

/// An fp16 overflow inside a fused chain is reported at the same op as
/// when the chain runs op by op.
#[test]
fn fp16_overflow_inside_a_chain_names_the_same_op() {
    let pkg = Package::open(&golden("mil/attention_block").join("model.mlpackage")).unwrap();
    let fused = Interpreter::new(&pkg, None).unwrap();
    let plain = Interpreter::new(&pkg, None).unwrap().without_fusion();
    // x scaled by 150: q and k stay within fp16, their products do not.
    let ins = attention_inputs(&pkg, 150.0);
    let a = fused.run(&ins, Precision::Fp16).unwrap();
    let b = plain.run(&ins, Precision::Fp16).unwrap();
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
