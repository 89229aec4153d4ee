//! The fp16 remedy of the Qwen-VL families (`build --residual-scale`,
//! `--branch-scale`) on their golden tiny checkpoints (`tiny-a`: Qwen3-VL,
//! `tiny-q25`: Qwen2.5-VL, `tiny-q2`: Qwen2-VL): the scaled program's
//! residual stream is the unscaled one divided by S, op by op, its outputs
//! (after the mergers' norms) are unchanged, and the gates accept it as
//! they accept the unscaled build; and on the goldens with planted massive
//! activations (`tiny-a-massive32k`, ...), the ANE mode rejects the naive
//! build and accepts the calibrated one.

use std::collections::BTreeMap;
use std::path::Path;

use ane_export::family::Model;
use ane_export::interp::{Capture, Interpreter, Precision};
use ane_export::mlpackage::Package;
use candle_core::Tensor;
use serde_json::Value;

use crate::common::{
    build_model, gate_report, golden, golden_batch, golden_images, host_input_tensors, run,
};
use crate::encoders::{lowest_cosine, rel_err, values};

/// The images the tests run (a call of one image each).
const IMAGES: [&str; 3] = ["square.png", "tiny.png", "wide.jpg"];

/// The bucket the tests build.
const BUCKET: (&str, usize) = ("b1024", 1024);

/// Values of a run, by op or output name ([`run_bucket`]).
type Values = BTreeMap<String, Vec<f32>>;

/// The interpreter's run of the bucket of `pkg` on `image`: its outputs and
/// the values of the ops `names`, each as f32 values of its real columns
/// (the real patches' slots, or the real merged tokens' columns).
fn run_bucket(
    pkg: &Package,
    ck: &Model,
    image: &str,
    precision: Precision,
    names: &[String],
) -> BTreeMap<String, Vec<f32>> {
    let b = golden_batch(ck, &[image]);
    let (inputs, ins) = host_input_tensors(ck, &b, BUCKET.1);
    let run = Interpreter::new(pkg, Some(BUCKET.0))
        .unwrap()
        .run_capturing(&ins, precision, &Capture::names(names))
        .unwrap();
    assert!(run.first_overflow.is_none(), "{:?}", run.first_overflow);
    // Real columns only: a pad slot's stream is near zero, where the
    // norms' epsilon (weighing S^2 more at scale S) changes it most, and
    // nothing real reads it.
    let patches: Vec<usize> = (0..inputs.real).map(|r| inputs.slot(r)).collect();
    let tokens = inputs.token_columns(4);
    let real = |t: &Tensor| {
        let cols = *t.dims().last().unwrap();
        let v = values(&t.to_dtype(candle_core::DType::F32).unwrap());
        let keep = if cols == BUCKET.1 { &patches } else { &tokens };
        assert!(cols == BUCKET.1 || cols == BUCKET.1 / 4, "{cols} columns");
        (0..v.len() / cols)
            .flat_map(|ch| keep.iter().map(move |&c| ch * cols + c))
            .map(|i| v[i])
            .collect::<Vec<f32>>()
    };
    run.captured
        .iter()
        .chain(&run.outputs)
        .map(|(k, v)| (k.clone(), real(v)))
        .collect()
}

/// The ops that hold the residual stream: where it starts (`entry`), and
/// each block's two residual adds.
fn stream_ops(entry: &str, depth: usize) -> Vec<String> {
    std::iter::once(entry.to_string())
        .chain((0..depth).flat_map(|i| [format!("b{i}_res1"), format!("b{i}_res2")]))
        .collect()
}

fn manifest(art: &Path) -> Value {
    serde_json::from_str(&std::fs::read_to_string(art.join("manifest.json")).unwrap()).unwrap()
}

/// The gate over [`IMAGES`] (VQA skipped): exit 0, the residency and
/// cosine gates passing, no case overflowing; its lowest token cosine.
fn gate_passes(art: &Path, what: &str) -> f64 {
    let imgs = golden_images(&IMAGES);
    let o = run(
        "ane-export",
        &[
            "gate",
            art.to_str().unwrap(),
            "--images",
            imgs.path().to_str().unwrap(),
            "--skip",
            "vqa",
        ],
    );
    let text = String::from_utf8_lossy(&o.stdout);
    assert_eq!(o.status.code(), Some(0), "{what}: {text}");
    let r = gate_report(art);
    assert_eq!(r["gates"]["residency"]["status"], "pass", "{what}");
    assert_eq!(r["gates"]["cosine"]["status"], "pass", "{what}");
    let cases = r["gates"]["cosine"]["cases"].as_array().unwrap();
    assert!(
        cases.iter().all(|c| c["first_overflow"].is_null()),
        "{what}"
    );
    lowest_cosine(&r)
}

/// `--residual-scale` on each Qwen family: the manifest records it and no
/// `host.output_scale` (every output follows a merger's norm). In the
/// interpreter's fp32 mode at S = 4 the stream (the entry and every
/// residual add) is the unscaled program's divided by 4 and the outputs
/// are the unscaled ones, to within 1e-4 (the norms' epsilon, 1e-6, then
/// weighs 16e-6 against real tokens' stream variances of 0.11 and up on
/// these goldens). At S = 64 it weighs 4.1e-3, a per-token factor of up to
/// 1.8% on the smallest token's normalised stream: measured 3e-3 to 6e-3
/// relative on the stream and outputs (bound 2e-2); the gate still accepts
/// the build, its lowest cosine within 2e-4 of the unscaled build's
/// (measured 2e-5 to 6.4e-5).
#[test]
fn a_residual_scale_carries_the_qwen_streams_divided_and_keeps_their_outputs() {
    let t = tempfile::tempdir().unwrap();
    for (model, entry) in [
        ("tiny-a", "embed"),
        ("tiny-q25", "patch_embed"),
        ("tiny-q2", "patch_embed"),
    ] {
        let path = golden(&format!("models/{model}"));
        let ck = Model::open(&path).unwrap();
        let names = stream_ops(entry, ck.vision.depth());
        let plain = build_model(&path, t.path(), &format!("{model}-s1"), &[BUCKET.0], &[]);
        let p1 = Package::open(&plain.join(format!("{model}-s1.mlpackage"))).unwrap();
        let a = run_bucket(&p1, &ck, "square.png", Precision::Fp32, &names);
        for (s, bound) in [(4u32, 1e-4), (64, 2e-2)] {
            let name = format!("{model}-s{s}");
            let scaled = build_model(
                &path,
                t.path(),
                &name,
                &[BUCKET.0],
                &["--residual-scale", &s.to_string()],
            );
            let m = manifest(&scaled);
            crate::common::assert_schema("manifest", &m);
            assert_eq!(m["residual_scale"], s, "{name}");
            assert!(m["host"].get("output_scale").is_none(), "{name}");
            assert!(m.get("branch_scale").is_none(), "{name}");
            let pkg = Package::open(&scaled.join(format!("{name}.mlpackage"))).unwrap();
            let b = run_bucket(&pkg, &ck, "square.png", Precision::Fp32, &names);
            for n in &names {
                let back: Vec<f32> = b[n].iter().map(|v| v * s as f32).collect();
                let err = rel_err(&back, &a[n]);
                println!("{name} fp32 {n} x {s}: {err:.2e}");
                assert!(err <= bound, "{name} {n}: {err:.2e}");
            }
            for o in ck.vision.output_names() {
                let err = rel_err(&b[&o], &a[&o]);
                println!("{name} fp32 output {o}: {err:.2e}");
                assert!(err <= bound, "{name} {o}: {err:.2e}");
            }
            if s == 64 {
                let (c1, c64) = (gate_passes(&plain, model), gate_passes(&scaled, &name));
                println!("{model}: lowest cosine {c1:.6} unscaled, {c64:.6} at S=64");
                assert!((c1 - c64).abs() <= 2e-4, "{model}: {c1} vs {c64}");
            }
        }
    }
}

/// `--branch-scale 8` on Qwen2.5-VL (alone, and with `--residual-scale
/// 4`): the manifest records it; in fp32 mode every block's SwiGLU
/// product (`b<i>_glu`) and `up` projection are the unscaled ones divided
/// by 8, the stream is unchanged (divided by 4 with the residual scale)
/// and so are the outputs (within 1e-5 alone, 1e-4 with the residual
/// scale's epsilon); in fp16 mode the output stays within fp16 rounding of
/// the unscaled program's (measured: identical, scaling by a power of two
/// being exact in fp16 away from subnormals), and the gate accepts it.
#[test]
fn a_branch_scale_divides_the_swiglu_product_and_keeps_the_output() {
    let t = tempfile::tempdir().unwrap();
    let path = golden("models/tiny-q25");
    let ck = Model::open(&path).unwrap();
    let depth = ck.vision.depth();
    let mut names = stream_ops("patch_embed", depth);
    for i in 0..depth {
        names.extend([format!("b{i}_glu"), format!("b{i}_up")]);
    }
    let plain = build_model(&path, t.path(), "q25", &[BUCKET.0], &[]);
    let p1 = Package::open(&plain.join("q25.mlpackage")).unwrap();
    let a = run_bucket(&p1, &ck, "tall.png", Precision::Fp32, &names);
    let a16 = run_bucket(&p1, &ck, "tall.png", Precision::Fp16, &[]);
    for (name, s, extra) in [
        ("q25-b8", 1.0f32, vec!["--branch-scale", "8"]),
        (
            "q25-s4-b8",
            4.0,
            vec!["--residual-scale", "4", "--branch-scale", "8"],
        ),
    ] {
        let factor = |n: &str| {
            if n.ends_with("_glu") || n.ends_with("_up") {
                8.0
            } else {
                s
            }
        };
        let bound = if s == 1.0 { 1e-5 } else { 1e-4 };
        branch_scaled_matches(
            &path,
            t.path(),
            &ck,
            name,
            &extra,
            &names,
            (&a, &a16),
            factor,
            bound,
        );
    }
}

/// `--branch-scale 8` on the GELU MLPs (Qwen3-VL's `tiny-a`, Qwen2-VL's
/// `tiny-q2`): in fp32 mode every block's fc1 output is the unscaled one
/// divided by 8 and the activation, computed on the scaled values
/// (`vit.scaled_activation`), hands fc2 what it hands it unscaled: the
/// stream and the outputs match the unscaled program's within 1e-4; in
/// fp16 mode the outputs stay within 2e-3 of the unscaled fp16 run; the
/// gate accepts it.
#[test]
fn a_branch_scale_divides_the_gelu_mlps_hidden_layer_and_keeps_the_output() {
    let t = tempfile::tempdir().unwrap();
    for (model, tag) in [("tiny-a", "a"), ("tiny-q2", "q2")] {
        let path = golden(&format!("models/{model}"));
        let ck = Model::open(&path).unwrap();
        let depth = ck.vision.depth();
        let mut names = stream_ops("patch_embed", depth);
        for i in 0..depth {
            names.push(format!("b{i}_fc1"));
        }
        let plain = build_model(
            &path,
            t.path(),
            tag,
            &[BUCKET.0],
            &["--residual-scale", "1"],
        );
        let p1 = Package::open(&plain.join(format!("{tag}.mlpackage"))).unwrap();
        let a = run_bucket(&p1, &ck, "tall.png", Precision::Fp32, &names);
        let a16 = run_bucket(&p1, &ck, "tall.png", Precision::Fp16, &[]);
        let name = format!("{tag}-b8");
        let extra = ["--residual-scale", "1", "--branch-scale", "8"];
        let factor = |n: &str| if n.ends_with("_fc1") { 8.0 } else { 1.0 };
        branch_scaled_matches(
            &path,
            t.path(),
            &ck,
            &name,
            &extra,
            &names,
            (&a, &a16),
            factor,
            1e-4,
        );
    }
}

/// The checkpoint at `path` built into `dir/name` with `extra` (a branch
/// scale of 8), against the unscaled program's runs on tall.png,
/// `unscaled` = (fp32 values of the ops `names` and outputs, fp16
/// outputs): the manifest records the scale; each op's values times
/// `factor(op)` are within `bound` of the unscaled ones; `embeds` is within
/// 1e-4 in fp32 and 2e-3 in fp16; and the gate passes.
#[allow(clippy::too_many_arguments)]
fn branch_scaled_matches(
    path: &Path,
    dir: &Path,
    ck: &Model,
    name: &str,
    extra: &[&str],
    names: &[String],
    unscaled: (&Values, &Values),
    factor: impl Fn(&str) -> f32,
    bound: f64,
) {
    let (a, a16) = unscaled;
    let art = build_model(path, dir, name, &[BUCKET.0], extra);
    let m = manifest(&art);
    crate::common::assert_schema("manifest", &m);
    assert_eq!(m["branch_scale"], 8, "{name}");
    let pkg = Package::open(&art.join(format!("{name}.mlpackage"))).unwrap();
    let b = run_bucket(&pkg, ck, "tall.png", Precision::Fp32, names);
    for n in names {
        let k = factor(n);
        let back: Vec<f32> = b[n].iter().map(|v| v * k).collect();
        let err = rel_err(&back, &a[n]);
        println!("{name} fp32 {n} x {k}: {err:.2e}");
        assert!(err <= bound, "{name} {n}: {err:.2e}");
    }
    let err = rel_err(&b["embeds"], &a["embeds"]);
    println!("{name} fp32 embeds: {err:.2e}");
    assert!(err <= 1e-4, "{name} embeds: {err:.2e}");
    let b16 = run_bucket(&pkg, ck, "tall.png", Precision::Fp16, &[]);
    let err = rel_err(&b16["embeds"], &a16["embeds"]);
    println!("{name} fp16 embeds against the unscaled fp16 run: {err:.2e}");
    assert!(err <= 2e-3, "{name} fp16 embeds: {err:.2e}");
    let c = gate_passes(&art, name);
    println!("{name}: lowest cosine {c:.6}");
}

/// The Qwen goldens with planted massive activations
/// (`python/golden/make_golden_qwen_massive.py`): `<base>-massive32k`, whose
/// stream (and the down projection that writes it) reaches about 45,000,
/// under fp16's 65,504 but past the Neural Engine's 32,752 for conv
/// outputs; `<base>-massive`, about 98,000, past fp16's range. Built
/// without the remedy (`--residual-scale 1`), the gate's ane mode rejects
/// both, naming the op past its limit and the remedy; the fp16 mode (an
/// idealised fp16 machine) accepts the 32k one and rejects the other. Built
/// as a user builds them, the calibration chooses the smallest power of two
/// that brings the stream's peak 4x under 32,752 (8 and 16), and the gate
/// accepts them on every golden and stress image in ane mode with a min
/// token cosine of at least 0.999 against the reference (which matches
/// transformers to 1e-4 on them: `parity::tower_matches_transformers`).
#[test]
fn planted_massive_activations_are_rejected_naive_and_accepted_calibrated() {
    let t = tempfile::tempdir().unwrap();
    let one = golden_images(&["square.png"]);
    let one = one.path().to_str().unwrap().to_string();
    for (model, over_fp16, scale, writer) in [
        ("tiny-a-massive32k", false, 8, "b1_fc2"),
        ("tiny-a-massive", true, 16, "b1_fc2"),
        ("tiny-q25-massive32k", false, 8, "b1_down"),
        ("tiny-q25-massive", true, 16, "b1_down"),
        ("tiny-q2-massive32k", false, 8, "b0_fc2"),
        ("tiny-q2-massive", true, 16, "b0_fc2"),
    ] {
        let path = golden(&format!("models/{model}"));
        let naive = build_model(
            &path,
            t.path(),
            &format!("{model}-naive"),
            &[BUCKET.0],
            &["--residual-scale", "1"],
        );
        let gate = |art: &Path, extra: &[&str]| {
            let mut args = vec!["gate", art.to_str().unwrap(), "--skip", "vqa"];
            args.extend(extra);
            let o = run("ane-export", &args);
            (o, gate_report(art))
        };
        let (_, r) = gate(&naive, &["--images", &one]);
        let c = &r["gates"]["cosine"];
        assert_eq!(c["status"], "fail", "{model}: {}", c["message"]);
        let msg = c["message"].as_str().unwrap();
        assert!(
            msg.contains(&format!("op `{writer}` (conv) became infinite")),
            "{model}: {msg}"
        );
        assert!(
            msg.contains("remedy: build again without --residual-scale 1"),
            "{model}: {msg}"
        );
        assert_eq!(c["headroom"]["ops"][0]["op"], writer, "{model}");
        assert_eq!(c["headroom"]["ops"][0]["case"], "square.png", "{model}");
        let (_, r) = gate(&naive, &["--images", &one, "--precision", "fp16"]);
        let c = &r["gates"]["cosine"];
        let want = if over_fp16 { "fail" } else { "pass" };
        assert_eq!(c["status"], want, "{model} in fp16 mode: {}", c["message"]);
        assert_eq!(c["headroom"]["limits"], "fp16");

        let built = build_model(&path, t.path(), model, &[BUCKET.0], &[]);
        let m: Value =
            serde_json::from_str(&std::fs::read_to_string(built.join("manifest.json")).unwrap())
                .unwrap();
        crate::common::assert_schema("manifest", &m);
        assert_eq!(m["residual_scale"], scale, "{model}: {}", m["calibration"]);
        let (o, r) = gate(&built, &[]);
        let c = &r["gates"]["cosine"];
        assert_eq!(c["status"], "pass", "{model}: {}", c["message"]);
        assert!(o.status.code() != Some(2), "{model}");
        let cases = c["cases"].as_array().unwrap();
        assert!(cases.len() >= 16, "{model}: golden and stress images");
        assert!(lowest_cosine(&r) >= 0.999, "{model}: {}", lowest_cosine(&r));
        // The writer's peak, scaled, keeps its margin under the ceiling.
        let w = c["headroom"]["ops"]
            .as_array()
            .unwrap()
            .iter()
            .find(|o| o["op"] == writer)
            .unwrap();
        assert!(w["margin"].as_f64().unwrap() >= 2.0, "{model}: {w}");
        println!(
            "{model}: residual scale {scale}, lowest cosine {:.6}, {writer} {w}",
            lowest_cosine(&r)
        );
    }
}
