//! Qwen2.5-VL and Qwen2-VL end to end on their golden tiny checkpoints
//! (`golden/models/tiny-q25`, `tiny-q2`, made by `make golden-qwen2`):
//! the built program, executed by the interpreter on the host's inputs,
//! matches the family's reference tower (window attention with edge windows
//! and several images in one call); the residency and cosine gates pass and
//! reject faults of the windowed path; `ane-run embed` writes the real
//! tokens in the reference's order; bad configs and checkpoints are refused.

use std::path::Path;

use ane_export::family::Model;
use ane_export::interp::Precision;
use ane_export::mlpackage::Package;

use candle_core::{Device, Tensor};
use serde_json::Value;

use crate::common::{
    assert_fails, build_model, copy_model, gate_report, golden, golden_batch, golden_images,
    interpret_bucket, read_all, run, token_cosines,
};

/// The smallest cosine over real tokens between the interpreter's run of
/// `function` (a bucket of `slots`) on `images` and the reference tower.
fn min_cosine(
    pkg: &Package,
    ck: &Model,
    function: &str,
    slots: usize,
    images: &[&str],
    precision: Precision,
) -> f64 {
    let b = golden_batch(ck, images);
    let (got, columns) = interpret_bucket(pkg, ck, function, slots, &b, precision);
    let ours: Vec<f32> = got["embeds"].flatten_all().unwrap().to_vec1().unwrap();
    let tower = ane_export::family::reference_tower(ck).unwrap();
    let pv = Tensor::from_slice(&b.pixel_values, (b.rows(), b.row_len), &Device::Cpu).unwrap();
    let want: Vec<f32> = tower.forward(&pv, &b.grid_thw, false).unwrap().outputs[0]
        .flatten_all()
        .unwrap()
        .to_vec1()
        .unwrap();
    assert_eq!(columns.len(), b.rows() / 4);
    let (worst, _) = token_cosines(&ours, &columns, &want, ck.vision.out_hidden_size());
    println!(
        "{} {function} {images:?} {precision:?}: min cos {worst:.6}",
        ck.vision.family().name()
    );
    worst
}

/// Qwen2.5-VL: the host lays every window out in 64 slots; the windowed
/// blocks attend within windows, the full ones over the image.
#[test]
fn qwen2_5_vl_builds_and_matches_its_reference() {
    let t = tempfile::tempdir().unwrap();
    let model = golden("models/tiny-q25");
    let art = build_model(&model, t.path(), "q25", &["b1024", "b4096"], &[]);
    let m: Value =
        serde_json::from_str(&std::fs::read_to_string(art.join("manifest.json")).unwrap()).unwrap();
    assert_eq!(m["family"], "qwen2_5_vl");
    // The manifest says what a bucket's `patches` counts.
    assert!(
        m["buckets"][0]["capacity"]
            .as_str()
            .unwrap()
            .contains("every attention window of an image takes 64")
    );
    // Inputs of a bucket of 1024 slots: 16 windows of 64.
    let inputs = &m["buckets"][0]["inputs"];
    assert_eq!(inputs[4]["name"], "window_mask");
    assert_eq!(inputs[4]["shape"], serde_json::json!([16, 64, 64]));

    let pkg = Package::open(&art.join("q25.mlpackage")).unwrap();
    let ck = Model::open(&model).unwrap();
    // square: 11 x 11 merge units in 3 x 3 windows, the edge ones 3 units wide (576 slots).
    assert_eq!(crate::common::pixels(&ck).slots(&[[1, 22, 22]]), 9 * 64);
    assert!(min_cosine(&pkg, &ck, "b1024", 1024, &["square.png"], Precision::Fp32) >= 0.9999);
    // Three images in one call: windows never cross an image (1280 slots).
    let multi = ["square.png", "tiny.png", "tall.png"];
    assert!(min_cosine(&pkg, &ck, "b4096", 4096, &multi, Precision::Fp32) >= 0.9999);
    assert!(min_cosine(&pkg, &ck, "b1024", 1024, &["square.png"], Precision::Fp16) >= 0.995);
}

#[test]
fn qwen2_vl_builds_and_matches_its_reference() {
    let t = tempfile::tempdir().unwrap();
    let model = golden("models/tiny-q2");
    let art = build_model(&model, t.path(), "q2", &["b1024"], &[]);
    let pkg = Package::open(&art.join("q2.mlpackage")).unwrap();
    let ck = Model::open(&model).unwrap();
    assert_eq!(ck.vision.family().name(), "qwen2_vl");
    assert!(min_cosine(&pkg, &ck, "b1024", 1024, &["square.png"], Precision::Fp32) >= 0.9999);
    let multi = ["square.png", "tiny.png", "tall.png"];
    assert!(min_cosine(&pkg, &ck, "b1024", 1024, &multi, Precision::Fp32) >= 0.9999);
    assert!(min_cosine(&pkg, &ck, "b1024", 1024, &["tall.png"], Precision::Fp16) >= 0.995);
}

fn gate(art: &Path, imgs: &Path) -> (std::process::Output, Value) {
    let o = run(
        "ane-export",
        &[
            "gate",
            art.to_str().unwrap(),
            "--images",
            imgs.to_str().unwrap(),
            "--skip",
            "vqa",
        ],
    );
    let text = String::from_utf8_lossy(&o.stderr);
    assert!(!text.contains("panicked"), "{text}");
    let r = gate_report(art);
    (o, r)
}

/// The residency and cosine gates pass both families' artifacts at the
/// default thresholds (VQA skipped: the run is recorded as incomplete), and
/// reject Qwen2.5-VL artifacts whose windowed path is broken.
#[test]
fn gates_pass_both_families_and_reject_windowed_faults() {
    let t = tempfile::tempdir().unwrap();
    let imgs = golden_images(&["square.png", "tiny.png", "wide.jpg"]);
    for model in ["tiny-q25", "tiny-q2"] {
        let art = build_model(
            &golden(&format!("models/{model}")),
            t.path(),
            model,
            &["b1024"],
            &[],
        );
        let (o, r) = gate(&art, imgs.path());
        let text = String::from_utf8_lossy(&o.stdout);
        assert_eq!(o.status.code(), Some(0), "{model}: {text}");
        assert_eq!(r["gates"]["residency"]["status"], "pass", "{model}");
        assert_eq!(r["gates"]["cosine"]["status"], "pass", "{model}");
        let cases = r["gates"]["cosine"]["cases"].as_array().unwrap();
        assert!(
            cases.iter().filter(|c| c["status"] == "pass").count() >= 3,
            "{model}: {text}"
        );
        for c in cases.iter().filter(|c| c["status"] == "pass") {
            let outs = c["outputs"].as_array().unwrap();
            assert_eq!(outs.len(), 1);
            assert_eq!(outs[0]["name"], "embeds");
        }
    }
    // ln-eps: the RMSNorms are layer_norms of [x, -x], whose epsilon the gate checks.
    for fault in ["no-mask", "swap-heads", "merge-order", "ln-eps"] {
        let art = build_model(
            &golden("models/tiny-q25"),
            t.path(),
            &format!("q25-{fault}"),
            &["b1024"],
            &["--fault", fault],
        );
        let (o, r) = gate(&art, imgs.path());
        assert_eq!(o.status.code(), Some(1), "{fault}");
        assert_eq!(r["gates"]["cosine"]["status"], "fail", "{fault}");
    }
}

/// `ane-run embed` on a Qwen2.5-VL artifact: the real tokens only, in the
/// order the reference (and transformers) return them, not slot order
/// (a token out of place would give a cosine near 0 for its row).
#[test]
fn embed_writes_qwen2_5_vl_tokens_in_reference_order() {
    let t = tempfile::tempdir().unwrap();
    let model = golden("models/tiny-q25");
    let art = build_model(&model, t.path(), "q25", &["b1024"], &[]);
    let img = golden("images/square.png");
    let out = t.path().join("emb");
    let o = run(
        "ane-run",
        &[
            "embed",
            "--artifact",
            art.to_str().unwrap(),
            "--allow-unaccepted",
            img.to_str().unwrap(),
            "--out",
            out.to_str().unwrap(),
        ],
    );
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let (got, _) = read_all(&out.join("square.safetensors"));
    let r = t.path().join("ref.safetensors");
    let o = run(
        "ane-export",
        &[
            "reference",
            "--model",
            model.to_str().unwrap(),
            "--image",
            img.to_str().unwrap(),
            "--out",
            r.to_str().unwrap(),
        ],
    );
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let (want, _) = read_all(&r);
    assert_eq!(got["embeds"].shape, vec![121, 44]);
    assert_eq!(got["embeds"].shape, want["embeds"].shape);
    let worst = got["embeds"]
        .f32
        .chunks(44)
        .zip(want["embeds"].f32.chunks(44))
        .map(|(a, b)| {
            let dot: f64 = a
                .iter()
                .zip(b)
                .map(|(x, y)| f64::from(*x) * f64::from(*y))
                .sum();
            let n = |v: &[f32]| v.iter().map(|x| f64::from(*x).powi(2)).sum::<f64>().sqrt();
            dot / (n(a) * n(b))
        })
        .fold(1f64, f64::min);
    // The interpreter rounds every op to fp16, as the Neural Engine does.
    assert!(worst >= 0.995, "min cosine {worst}");
}

fn edit_config(dir: &Path, f: impl FnOnce(&mut Value)) {
    let p = dir.join("config.json");
    let mut v: Value = serde_json::from_str(&std::fs::read_to_string(&p).unwrap()).unwrap();
    f(&mut v);
    std::fs::write(p, serde_json::to_string(&v).unwrap()).unwrap();
}

/// Build a mutated copy of a golden model: exit 2 naming what is wrong, and
/// no artifact left behind.
fn build_fails(model: &str, mutate: impl FnOnce(&Path), needles: &[&str]) {
    let m = copy_model(model);
    mutate(m.path());
    let out = m.path().join("art");
    let o = run(
        "ane-export",
        &[
            "build",
            "--model",
            m.path().to_str().unwrap(),
            "--out",
            out.to_str().unwrap(),
        ],
    );
    assert_fails(&o, needles);
    assert!(!out.exists(), "no artifact may be left behind");
}

#[test]
fn bad_qwen2_5_vl_configs_and_checkpoints_are_refused() {
    build_fails(
        "tiny-q25",
        |d| edit_config(d, |v| v["vision_config"]["window_size"] = 100.into()),
        &["config.json", "vision_config.window_size", "multiple of"],
    );
    build_fails(
        "tiny-q25",
        |d| {
            edit_config(d, |v| {
                v["vision_config"]["fullatt_block_indexes"] = serde_json::json!([1, 4])
            })
        },
        &[
            "config.json",
            "vision_config.fullatt_block_indexes",
            "block 4",
            "depth 4",
        ],
    );
    // A checkpoint without the merger's last Linear.
    build_fails(
        "tiny-q25",
        |d| crate::common::drop_tensor(&d.join("model.safetensors"), "visual.merger.mlp.2.weight"),
        &["visual.merger.mlp.2.weight"],
    );
    // Buckets that are not whole windows.
    let m = copy_model("tiny-q25");
    let buckets = m.path().join("buckets.yaml");
    std::fs::write(&buckets, "buckets:\n  - {name: b1000, patches: 1000}\n").unwrap();
    let out = m.path().join("art");
    let o = run(
        "ane-export",
        &[
            "build",
            "--model",
            m.path().to_str().unwrap(),
            "--out",
            out.to_str().unwrap(),
            "--buckets",
            buckets.to_str().unwrap(),
        ],
    );
    assert_fails(&o, &["bucket b1000", "64 slots"]);
    assert!(!out.exists());
}

/// What windows save, as the residency gate's cost model and R4 check see
/// it: the same tower built with every block attending over the whole
/// image (`fullatt_block_indexes` all blocks) has attention matmuls that
/// cost more at b4096, and only the windowed build reports window scores.
#[test]
fn the_residency_gate_sees_what_windows_save() {
    let t = tempfile::tempdir().unwrap();
    let imgs = golden_images(&["tiny.png"]);
    let full = copy_model("tiny-q25");
    edit_config(full.path(), |v| {
        v["vision_config"]["fullatt_block_indexes"] = serde_json::json!([0, 1, 2, 3])
    });
    let mut matmul = Vec::new();
    for (name, model) in [
        ("windowed", golden("models/tiny-q25")),
        ("full", full.path().to_path_buf()),
    ] {
        let art = build_model(&model, t.path(), name, &["b4096"], &[]);
        let o = run(
            "ane-export",
            &[
                "gate",
                art.to_str().unwrap(),
                "--images",
                imgs.path().to_str().unwrap(),
                "--skip",
                "cosine",
                "--skip",
                "vqa",
            ],
        );
        assert_eq!(
            o.status.code(),
            Some(0),
            "{}",
            String::from_utf8_lossy(&o.stdout)
        );
        let r: Value = gate_report(&art);
        let b = &r["gates"]["residency"]["buckets"][0];
        let cost = b["by_type"]
            .as_array()
            .unwrap()
            .iter()
            .find(|x| x["op"] == "matmul")
            .unwrap()["cost"]
            .as_f64()
            .unwrap();
        let r4 = b["checks"]
            .as_array()
            .unwrap()
            .iter()
            .find(|c| c["id"] == "R4")
            .unwrap()["detail"]
            .to_string();
        println!("{name}: matmul cost {cost:.3e}, R4 {r4}");
        assert_eq!(
            r4.contains("64 windows of 64 x 64"),
            name == "windowed",
            "{r4}"
        );
        matmul.push(cost);
    }
    // Two of four blocks windowed: their scores are 64 x 64 per window instead of 4096 x 4096.
    assert!(
        matmul[0] < 0.6 * matmul[1],
        "windowed {} vs full {}",
        matmul[0],
        matmul[1]
    );
}

/// The trained tiny Qwen2.5-VL VLM (`golden/tiny-vlm-q25`, `make
/// golden-vlm-q25`): all three gates pass on its artifact, which is then
/// accepted; its language model answers the golden questions from the
/// artifact's embeddings as well as from the reference's, and well above
/// chance (easy-vqa's answers are a handful of shapes, colours and yes/no).
#[test]
fn the_trained_qwen2_5_vl_vlm_passes_all_three_gates() {
    let t = tempfile::tempdir().unwrap();
    let art = build_model(
        &golden("tiny-vlm-q25"),
        t.path(),
        "vlm",
        &["b1024", "b4096"],
        &[],
    );
    let imgs = golden_images(&["tiny.png", "wide.jpg"]);
    let o = run(
        "ane-export",
        &[
            "gate",
            art.to_str().unwrap(),
            "--images",
            imgs.path().to_str().unwrap(),
        ],
    );
    let text = String::from_utf8_lossy(&o.stdout);
    assert_eq!(
        o.status.code(),
        Some(0),
        "{text}{}",
        String::from_utf8_lossy(&o.stderr)
    );
    let r: Value = gate_report(&art);
    for g in ["residency", "cosine", "vqa"] {
        assert_eq!(r["gates"][g]["status"], "pass", "{g}: {text}");
    }
    // An accepted Qwen2.5-VL artifact: its report and acceptance record
    // (bucket `capacity`, window slots) as docs/schemas/ describe them.
    crate::common::assert_schema("report", &r);
    let manifest: Value =
        serde_json::from_str(&std::fs::read_to_string(art.join("manifest.json")).unwrap()).unwrap();
    crate::common::assert_schema("manifest", &manifest);
    let v = &r["gates"]["vqa"];
    let (a, rf) = (
        v["accuracy_artifact"].as_f64().unwrap(),
        v["accuracy_reference"].as_f64().unwrap(),
    );
    println!(
        "tiny-vlm-q25: accuracy {a:.3} from the artifact, {rf:.3} from the reference, agreement {}",
        v["agreement"]
    );
    assert!(a >= 0.6 && rf >= 0.6, "accuracy {a} / {rf}");
    assert_eq!(
        ane_export::artifact::Artifact::open(&art)
            .unwrap()
            .acceptance(),
        ane_export::artifact::Acceptance::Accepted
    );
}

/// What the cosine gate's joined runs rest on (`CosineRun::joined`): for
/// the Qwen-VL families, the reference's call of several images gives,
/// output by output and block by block, each image's call alone one after
/// another, to fp32 rounding (BLAS may sum in another order over more
/// rows, which moves the last bits of some values). The encoders' is
/// `encoder_references_run_many_images_as_each_alone`.
#[test]
fn the_reference_runs_images_of_one_call_as_each_alone() {
    let images = ["square.png", "rgba.png", "tiny.png"];
    for name in ["tiny-a", "tiny-q25", "tiny-q2"] {
        let ck = Model::open(&golden(&format!("models/{name}"))).unwrap();
        let tower = ane_export::family::reference_tower(&ck).unwrap();
        let forward = |images: &[&str]| {
            let b = golden_batch(&ck, images);
            let pv =
                Tensor::from_slice(&b.pixel_values, (b.rows(), b.row_len), &Device::Cpu).unwrap();
            let out = tower.forward(&pv, &b.grid_thw, true).unwrap();
            let flat = |t: &Tensor| -> Vec<f32> {
                t.to_dtype(candle_core::DType::F32)
                    .unwrap()
                    .flatten_all()
                    .unwrap()
                    .to_vec1()
                    .unwrap()
            };
            let outputs: Vec<Vec<f32>> = out.outputs.iter().map(flat).collect();
            let blocks: Vec<Vec<f32>> = out.block_outputs.iter().map(flat).collect();
            (outputs, blocks)
        };
        let together = forward(&images);
        let alone: Vec<_> = images.iter().map(|i| forward(&[i])).collect();
        assert!(!together.1.is_empty(), "{name}: no block outputs");
        for (what, side) in [("output", 0), ("block", 1)] {
            let pick = |r: &(Vec<Vec<f32>>, Vec<Vec<f32>>)| {
                if side == 0 { r.0.clone() } else { r.1.clone() }
            };
            for (k, whole) in pick(&together).iter().enumerate() {
                let joined: Vec<f32> = alone.iter().flat_map(|a| pick(a)[k].clone()).collect();
                assert_eq!(whole.len(), joined.len(), "{name} {what} {k}");
                let scale = whole.iter().fold(1f32, |m, v| m.max(v.abs()));
                let worst = whole
                    .iter()
                    .zip(&joined)
                    .fold(0f32, |m, (a, b)| m.max((a - b).abs()));
                assert!(
                    worst <= 1e-5 * scale,
                    "{name} {what} {k}: differs by {worst} (values up to {scale})"
                );
            }
        }
    }
}
