//! The encoder families, CLIP, SigLIP and DINOv2, end to end on their
//! golden tiny checkpoints (`golden/models/tiny-clip`: a `CLIPModel` with
//! its text tower and projection; `tiny-clip-vision`: a `CLIPVisionModel`;
//! `tiny-siglip`: a `SiglipModel` with the pooling head;
//! `tiny-siglip-nohead`: a `SiglipVisionModel` without it, whose image size
//! is not a multiple of its patch; `tiny-dinov2`: a `Dinov2Model` with
//! SwiGLU; `tiny-dinov2-reg`: a `Dinov2WithRegistersModel`;
//! `tiny-dinov2-massive`, `tiny-clip-massive` and `tiny-siglip-massive`:
//! massive activations; made
//! by `make golden-encoders` with transformers):
//! preprocessing bit-exact with both of
//! transformers' backends, the reference within 1e-4 of transformers, the
//! built program (executed by the interpreter) against the reference, the
//! gates, `ane-run embed` writing transformers' output names, and bad
//! configs, checkpoints and buckets refused.

use std::path::Path;

use ane_export::family::Model;
use ane_export::interp::Precision;
use ane_export::mlpackage::Package;
use ane_export::preprocess::{DecodeLimits, ResizeKernel, preprocess_file};
use candle_core::{Device, Tensor};
use serde_json::Value;

use crate::common::{
    T, assert_fails, build_model, copy_model, golden, golden_images, interpret_bucket, read_all,
    run,
};

/// The largest |a - b| over the largest |b|.
pub(crate) fn rel_err(a: &[f32], b: &[f32]) -> f64 {
    assert_eq!(a.len(), b.len());
    let max = b.iter().fold(0f64, |m, v| m.max(v.abs() as f64));
    let d = a
        .iter()
        .zip(b)
        .fold(0f64, |m, (x, y)| m.max((x - y).abs() as f64));
    d / max
}

pub(crate) fn values(t: &Tensor) -> Vec<f32> {
    t.flatten_all().unwrap().to_vec1().unwrap()
}

/// A golden f32 tensor as a candle tensor.
pub(crate) fn tensor(t: &T) -> Tensor {
    Tensor::from_slice(&t.f32, t.shape.as_slice(), &Device::Cpu).unwrap()
}

#[test]
fn encoder_preprocessing_is_bit_exact_with_both_backends() {
    let mut n = 0;
    for (model, dir, grid) in [
        ("tiny-clip", "preprocess-clip", 10),
        ("tiny-siglip", "preprocess-siglip", 10),
        ("tiny-dinov2", "preprocess-dinov2", 8),
    ] {
        let ck = Model::open(&golden(&format!("models/{model}"))).unwrap();
        for e in std::fs::read_dir(golden(dir)).unwrap() {
            let p = e.unwrap().path();
            let (want, meta) = read_all(&p);
            let image = golden(&format!("images/{}", meta["image"]));
            for (key, kernel) in [
                ("tv", ResizeKernel::Torchvision),
                ("pil", ResizeKernel::Pil),
            ] {
                let mut pre = ck.image_processor().unwrap().clone();
                pre.kernel = kernel;
                let got = preprocess_file(&image, &pre, DecodeLimits::default())
                    .unwrap()
                    .batch;
                assert_eq!(got.grid_thw, vec![[1, grid, grid]]);
                let want = &want[key].f32;
                assert_eq!(got.pixel_values.len(), want.len());
                let bad = got
                    .pixel_values
                    .iter()
                    .zip(want)
                    .filter(|(a, b)| a.to_bits() != b.to_bits())
                    .count();
                assert_eq!(
                    bad, 0,
                    "{model} {} {key}: {bad} values differ",
                    meta["image"]
                );
                n += 1;
            }
        }
    }
    assert_eq!(n, 36, "3 families, 6 images, 2 backends");
}

#[test]
fn encoder_references_match_transformers() {
    for (model, outputs) in [
        (
            "tiny-clip",
            &["last_hidden_state", "pooler_output", "image_embeds"][..],
        ),
        (
            "tiny-clip-vision",
            &["last_hidden_state", "pooler_output"][..],
        ),
        ("tiny-siglip", &["last_hidden_state", "pooler_output"][..]),
        ("tiny-siglip-nohead", &["last_hidden_state"][..]),
        ("tiny-dinov2", &["last_hidden_state", "pooler_output"][..]),
        (
            "tiny-dinov2-reg",
            &["last_hidden_state", "pooler_output"][..],
        ),
        (
            "tiny-dinov2-massive",
            &["last_hidden_state", "pooler_output"][..],
        ),
        (
            "tiny-clip-massive",
            &["last_hidden_state", "pooler_output"][..],
        ),
        (
            "tiny-siglip-massive",
            &["last_hidden_state", "pooler_output"][..],
        ),
    ] {
        let ck = Model::open(&golden(&format!("models/{model}"))).unwrap();
        let specs = ck.vision.outputs(0);
        assert_eq!(
            specs.iter().map(|s| s.name.as_str()).collect::<Vec<_>>(),
            outputs
        );
        let tower = ane_export::family::reference_tower(&ck).unwrap();
        for e in std::fs::read_dir(golden(&format!("tower/{model}"))).unwrap() {
            let (t, _) = read_all(&e.unwrap().path());
            let pv = tensor(&t["pixel_values"]);
            // DINOv2's goldens are at two grids, neither the position table's.
            let g = ((pv.dims()[0]) as f64).sqrt() as usize;
            let out = tower.forward(&pv, &[[1, g, g]], true).unwrap();
            assert_eq!(out.outputs.len(), outputs.len());
            assert_eq!(out.block_outputs.len(), ck.vision.depth());
            for (name, got) in outputs.iter().zip(&out.outputs) {
                let want = &t[*name];
                assert_eq!(got.dims(), want.shape.as_slice(), "{model} {name}");
                let err = rel_err(&values(got), &want.f32);
                println!("{model} {name}: relative error {err:.2e}");
                assert!(err <= 1e-4, "{model} {name}: relative error {err:.2e}");
            }
        }
    }
}

/// Many images in one call, more than one pass of
/// [`PASS_TOKENS`](ane_export::reference::vit::PASS_TOKENS) and at several
/// grids (DINOv2's and SigLIP2's goldens), give what each image gives alone:
/// every output and every block's states, row for row. A pass whose images
/// attended to each other, or rows put back in the wrong order, would not.
#[test]
fn encoder_references_run_many_images_as_each_alone() {
    use ane_export::reference::vit::PASS_TOKENS;
    for model in [
        "tiny-clip",
        "tiny-siglip",
        "tiny-siglip-nohead",
        "tiny-dinov2-reg",
        "tiny-siglip2",
    ] {
        let ck = Model::open(&golden(&format!("models/{model}"))).unwrap();
        let tower = ane_export::family::reference_tower(&ck).unwrap();
        let mut images: Vec<(Tensor, [usize; 3])> = Vec::new();
        let mut files: Vec<_> = std::fs::read_dir(golden(&format!("tower/{model}")))
            .unwrap()
            .map(|e| e.unwrap().path())
            .collect();
        files.sort();
        for p in &files {
            let (t, _) = read_all(p);
            let pv = tensor(&t["pixel_values"]);
            let g = match t.get("spatial_shapes") {
                // NaFlex: transformers' padded rows, the image's first.
                Some(s) => [1, s.i64[0] as usize, s.i64[1] as usize],
                None => {
                    let g = (pv.dims()[0] as f64).sqrt() as usize;
                    [1, g, g]
                }
            };
            images.push((pv.narrow(0, 0, g[1] * g[2]).unwrap(), g));
        }
        let grids: std::collections::BTreeSet<_> = images.iter().map(|i| i.1).collect();
        let alone: Vec<_> = images
            .iter()
            .map(|(pv, g)| tower.forward(pv, &[*g], true).unwrap())
            .collect();
        // Tokens per image: the rows of its first output.
        let tokens: Vec<usize> = alone.iter().map(|o| o.outputs[0].dims()[0]).collect();
        let (mut call, mut total) = (Vec::new(), 0);
        while total <= 2 * PASS_TOKENS {
            let i = call.len() % images.len();
            call.push(i);
            total += tokens[i];
        }
        let pv: Vec<&Tensor> = call.iter().map(|&i| &images[i].0).collect();
        let grid: Vec<[usize; 3]> = call.iter().map(|&i| images[i].1).collect();
        let together = tower
            .forward(&Tensor::cat(&pv, 0).unwrap(), &grid, true)
            .unwrap();
        let expect = |pick: &dyn Fn(&ane_export::reference::TowerOutput) -> Vec<Tensor>| {
            (0..pick(&alone[0]).len())
                .map(|k| {
                    let parts: Vec<Tensor> =
                        call.iter().map(|&i| pick(&alone[i])[k].clone()).collect();
                    Tensor::cat(&parts, 0).unwrap()
                })
                .collect::<Vec<_>>()
        };
        let outputs = expect(&|o| o.outputs.clone());
        let blocks = expect(&|o| o.block_outputs.clone());
        assert_eq!(together.outputs.len(), outputs.len(), "{model}");
        assert_eq!(together.block_outputs.len(), ck.vision.depth(), "{model}");
        for (what, got, want) in [
            ("output", &together.outputs, &outputs),
            ("block", &together.block_outputs, &blocks),
        ] {
            for (k, (g, w)) in got.iter().zip(want.iter()).enumerate() {
                assert_eq!(g.dims(), w.dims(), "{model} {what} {k}");
                let err = rel_err(&values(g), &values(w));
                assert!(err <= 1e-5, "{model} {what} {k}: relative error {err:.2e}");
            }
        }
        println!(
            "{model}: {} images at {} grids, {total} tokens, as each alone",
            call.len(),
            grids.len()
        );
        if model == "tiny-dinov2-reg" || model == "tiny-siglip2" {
            assert!(grids.len() > 1, "{model}: {grids:?}");
        }
    }
}

#[test]
fn clip_builds_and_matches_its_reference() {
    let t = tempfile::tempdir().unwrap();
    let model = golden("models/tiny-clip");
    // The default buckets.yaml counts patches (Qwen-VL): a CLIP build takes
    // its processor's size instead.
    let art = build_model(&model, t.path(), "clip", &[], &[]);
    let m: Value =
        serde_json::from_str(&std::fs::read_to_string(art.join("manifest.json")).unwrap()).unwrap();
    assert_eq!(m["family"], "clip");
    assert_eq!(m["buckets"][0]["name"], "b140");
    assert_eq!(m["buckets"][0]["patches"], 100);
    assert_eq!(
        m["preprocessing"]["fixed"]["crop"],
        serde_json::json!([140, 140])
    );
    let outs: Vec<(String, Value)> = m["buckets"][0]["outputs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|o| (o["name"].as_str().unwrap().to_string(), o["shape"].clone()))
        .collect();
    assert_eq!(
        outs,
        vec![
            (
                "last_hidden_state".into(),
                serde_json::json!([1, 60, 1, 101])
            ),
            ("pooler_output".into(), serde_json::json!([1, 60, 1, 1])),
            ("image_embeds".into(), serde_json::json!([1, 36, 1, 1])),
        ]
    );

    let pkg = Package::open(&art.join("clip.mlpackage")).unwrap();
    let ck = Model::open(&model).unwrap();
    let tower = ane_export::family::reference_tower(&ck).unwrap();
    for image in ["square.png", "tall.png"] {
        let b = preprocess_file(
            &golden(&format!("images/{image}")),
            ck.image_processor().unwrap(),
            DecodeLimits::default(),
        )
        .unwrap()
        .batch;
        let pv = Tensor::from_slice(&b.pixel_values, (b.rows(), b.row_len), &Device::Cpu).unwrap();
        let want = tower.forward(&pv, &b.grid_thw, false).unwrap().outputs;
        for precision in [Precision::Fp32, Precision::Fp16] {
            let (got, _) = interpret_bucket(&pkg, &ck, "b140", 100, &b, precision);
            for (spec, w) in ck.vision.outputs(100).iter().zip(&want) {
                // The package's [1, width, 1, cols] against the reference's [cols, width].
                let g = values(&got[&spec.name]);
                let w = values(&w.t().unwrap().contiguous().unwrap());
                let err = rel_err(&g, &w);
                let bound = if precision == Precision::Fp32 {
                    1e-4
                } else {
                    2e-2
                };
                println!(
                    "{image} {precision:?} {}: relative error {err:.2e}",
                    spec.name
                );
                assert!(
                    err <= bound,
                    "{image} {precision:?} {}: {err:.2e}",
                    spec.name
                );
            }
        }
    }
}

#[test]
fn clip_embed_writes_transformers_names() {
    let t = tempfile::tempdir().unwrap();
    let art = build_model(&golden("models/tiny-clip"), t.path(), "clip", &[], &[]);
    let imgs = golden_images(&["square.png", "tall.png"]);
    let out = t.path().join("emb");
    let o = run(
        "ane-run",
        &[
            "embed",
            "--artifact",
            art.to_str().unwrap(),
            imgs.path().to_str().unwrap(),
            "--out",
            out.to_str().unwrap(),
            "--allow-unaccepted",
        ],
    );
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let (got, meta) = read_all(&out.join("tall.safetensors"));
    assert_eq!(meta["bucket"], "b140");
    assert_eq!(got["last_hidden_state"].shape, [101, 60]);
    assert_eq!(got["pooler_output"].shape, [1, 60]);
    assert_eq!(got["image_embeds"].shape, [1, 36]);
    // Against the reference on the same image (the interpreter, fp32).
    let r = t.path().join("ref.safetensors");
    let o = run(
        "ane-export",
        &[
            "reference",
            "--model",
            golden("models/tiny-clip").to_str().unwrap(),
            "--image",
            imgs.path().join("tall.png").to_str().unwrap(),
            "--out",
            r.to_str().unwrap(),
        ],
    );
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let (want, _) = read_all(&r);
    for name in ["last_hidden_state", "pooler_output", "image_embeds"] {
        let err = rel_err(&got[name].f32, &want[name].f32);
        assert!(err <= 1e-4, "{name}: {err:.2e}");
    }
}

pub(crate) fn edit_config(dir: &Path, f: impl FnOnce(&mut Value)) {
    let p = dir.join("config.json");
    let mut v: Value = serde_json::from_str(&std::fs::read_to_string(&p).unwrap()).unwrap();
    f(&mut v);
    std::fs::write(&p, serde_json::to_string_pretty(&v).unwrap()).unwrap();
}

/// Build a copy of golden model `model` changed by `mutate`: exit 2 naming
/// `needles`, nothing at `--out`.
pub(crate) fn build_fails(
    model: &str,
    mutate: impl FnOnce(&Path),
    extra: &[&str],
    needles: &[&str],
) {
    let m = copy_model(model);
    mutate(m.path());
    let t = tempfile::tempdir().unwrap();
    let out = t.path().join("a");
    let mut args = vec![
        "build",
        "--model",
        m.path().to_str().unwrap(),
        "--out",
        out.to_str().unwrap(),
    ];
    args.extend(extra);
    let o = run("ane-export", &args);
    assert_fails(&o, needles);
    assert!(!out.exists(), "nothing at --out");
}

#[test]
fn bad_clip_configs_checkpoints_and_buckets_are_refused() {
    // image_size not a multiple of patch_size.
    build_fails(
        "tiny-clip",
        |d| edit_config(d, |v| v["vision_config"]["image_size"] = 150.into()),
        &[],
        &["vision_config.image_size", "150", "patch_size 14"],
    );
    // A position table of another length than image_size gives.
    build_fails(
        "tiny-clip",
        |d| edit_config(d, |v| v["vision_config"]["image_size"] = 126.into()),
        &[],
        &["embeddings.position_embedding.weight"],
    );
    // A bucket of another resolution, and one given in patches.
    let t = tempfile::tempdir().unwrap();
    let yaml = t.path().join("b.yaml");
    std::fs::write(&yaml, "buckets:\n  - name: b150\n    pixels: 150\n").unwrap();
    build_fails(
        "tiny-clip",
        |_| {},
        &["--buckets", yaml.to_str().unwrap()],
        &["b150", "150 pixels", "patch size 14"],
    );
    std::fs::write(
        &yaml,
        "buckets:\n  - name: b140\n    pixels: 140\n  - name: b1024\n    patches: 1024\n",
    )
    .unwrap();
    build_fails(
        "tiny-clip",
        |_| {},
        &["--buckets", yaml.to_str().unwrap()],
        &["b1024", "pixels"],
    );
    // A missing tensor.
    build_fails(
        "tiny-clip",
        |d| {
            crate::common::drop_tensor(
                &d.join("model.safetensors"),
                "vision_model.post_layernorm.weight",
            )
        },
        &[],
        &["post_layernorm.weight"],
    );
}

/// `ane-export gate` on a CLIP artifact with the golden images and labels.
pub(crate) fn gate(art: &Path, extra: &[&str]) -> (std::process::Output, Value) {
    let mut args = vec!["gate", art.to_str().unwrap()];
    args.extend(extra);
    let o = run("ane-export", &args);
    let text = String::from_utf8_lossy(&o.stderr);
    assert!(!text.contains("panicked"), "{text}");
    (o, crate::common::gate_report(art))
}

/// The three gates that apply to an encoder pass the tiny CLIP and accept
/// it (VQA does not apply: no language model); the accepted artifact then
/// loads without `--allow-unaccepted`. A colour swap fails the task gate
/// as well as the cosine gate; skipping the task gate never accepts.
#[test]
fn clip_passes_residency_cosine_and_task_gates() {
    let t = tempfile::tempdir().unwrap();
    let art = build_model(&golden("models/tiny-clip"), t.path(), "clip", &[], &[]);
    let (o, r) = gate(&art, &[]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    crate::common::assert_schema("report", &r);
    let g = &r["gates"];
    assert_eq!(g["residency"]["status"], "pass");
    assert_eq!(g["cosine"]["status"], "pass");
    assert_eq!(g["vqa"]["status"], "not_applicable");
    assert_eq!(g["task"]["status"], "pass", "{}", g["task"]["message"]);
    assert_eq!(g["task"]["pooled"], "pooler_output");
    assert_eq!(
        (
            g["task"]["train_images"].as_u64(),
            g["task"]["test_images"].as_u64()
        ),
        (Some(300), Some(150))
    );
    let tasks: Vec<&str> = g["task"]["tasks"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["task"].as_str().unwrap())
        .collect();
    assert_eq!(tasks, ["color", "shape"]);
    // The probe learns colour from the reference's embeddings (8 classes: chance is 12.5%).
    assert!(
        g["task"]["tasks"][0]["accuracy_reference"]
            .as_f64()
            .unwrap()
            > 0.6
    );
    assert!(g["task"]["retrieval"]["top1_agreement"].as_f64().unwrap() > 0.9);
    assert_eq!(r["accepted"], true);
    let m: Value =
        serde_json::from_str(&std::fs::read_to_string(art.join("manifest.json")).unwrap()).unwrap();
    crate::common::assert_schema("manifest", &m);
    assert_eq!(m["gates"]["task"]["status"], "pass");
    let out = t.path().join("emb");
    let o = run(
        "ane-run",
        &[
            "embed",
            "--artifact",
            art.to_str().unwrap(),
            golden("images/square.png").to_str().unwrap(),
            "--out",
            out.to_str().unwrap(),
        ],
    );
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));

    // Skipping the task gate records the skip and leaves the artifact unaccepted.
    let (o, r) = gate(&art, &["--skip", "task"]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert_eq!(r["gates"]["task"]["status"], "skipped");
    assert_eq!(r["accepted"], false);

    // Red and blue swapped in the patch embedding.
    let bad = build_model(
        &golden("models/tiny-clip"),
        t.path(),
        "rb",
        &[],
        &["--fault", "swap-rb"],
    );
    let (o, r) = gate(&bad, &[]);
    assert_eq!(
        o.status.code(),
        Some(1),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
    assert_eq!(r["gates"]["task"]["status"], "fail");
    assert!(r["gates"]["task"]["agreement"].as_f64().unwrap() < 0.98);
    assert_eq!(r["gates"]["cosine"]["status"], "fail");
    assert_eq!(r["accepted"], false);
}

/// A label file the task gate cannot use stops the gate with exit 2,
/// naming the file and line (or the image).
#[test]
fn bad_task_labels_are_exit_2_naming_the_file_and_line() {
    let t = tempfile::tempdir().unwrap();
    let art = build_model(&golden("models/tiny-clip"), t.path(), "clip", &[], &[]);
    let labels = t.path().join("labels.jsonl");
    let cases: [(&str, &[&str]); 4] = [
        (
            "{\"image\": \"a.png\", \"split\": \"dev\", \"labels\": {\"x\": \"1\"}}\n",
            &["labels.jsonl", "line 1"],
        ),
        (
            "{\"image\": \"a.png\", \"split\": \"train\", \"labels\": {\"x\": \"1\"}}\n",
            &["labels.jsonl", "no test images"],
        ),
        (
            "{\"image\": \"a.png\", \"split\": \"train\", \"labels\": {\"x\": \"1\"}}\n{\"image\": \"b.png\", \"split\": \"test\", \"labels\": {\"y\": \"1\"}}\n",
            &["labels.jsonl", "line 2", "same tasks"],
        ),
        (
            "{\"image\": \"a.png\", \"split\": \"train\", \"labels\": {\"x\": \"1\"}}\n{\"image\": \"b.png\", \"split\": \"test\", \"labels\": {\"x\": \"2\"}}\n",
            &["labels.jsonl", "task `x`", "one class"],
        ),
    ];
    for (text, needles) in cases {
        std::fs::write(&labels, text).unwrap();
        let o = run(
            "ane-export",
            &[
                "gate",
                art.to_str().unwrap(),
                "--task",
                labels.to_str().unwrap(),
            ],
        );
        assert_fails(&o, needles);
    }
    // A missing image is named.
    std::fs::write(
        &labels,
        "{\"image\": \"a.png\", \"split\": \"train\", \"labels\": {\"x\": \"1\"}}\n{\"image\": \"b.png\", \"split\": \"train\", \"labels\": {\"x\": \"2\"}}\n{\"image\": \"c.png\", \"split\": \"test\", \"labels\": {\"x\": \"2\"}}\n",
    )
    .unwrap();
    let o = run(
        "ane-export",
        &[
            "gate",
            art.to_str().unwrap(),
            "--task",
            labels.to_str().unwrap(),
        ],
    );
    assert_fails(&o, &["a.png"]);
}

/// SigLIP with and without its pooling head: the built program (executed by
/// the interpreter) against the reference, and the gates that apply (the
/// task gate reads `pooler_output`, or the mean of `last_hidden_state`
/// without the head) passing and accepting.
#[test]
fn siglip_builds_matches_its_reference_and_passes_its_gates() {
    let t = tempfile::tempdir().unwrap();
    for (model, bucket, outputs, pooled) in [
        ("tiny-siglip", "b160", 2, "pooler_output"),
        ("tiny-siglip-nohead", "b126", 1, "mean of last_hidden_state"),
    ] {
        let path = golden(&format!("models/{model}"));
        let art = build_model(&path, t.path(), model, &[], &[]);
        let m: Value =
            serde_json::from_str(&std::fs::read_to_string(art.join("manifest.json")).unwrap())
                .unwrap();
        crate::common::assert_schema("manifest", &m);
        assert_eq!(m["family"], "siglip");
        assert_eq!(m["buckets"][0]["name"], bucket);
        assert_eq!(m["buckets"][0]["patches"], 100);
        assert_eq!(
            m["buckets"][0]["outputs"].as_array().unwrap().len(),
            outputs
        );
        let pkg = Package::open(&art.join(format!("{model}.mlpackage"))).unwrap();
        let ck = Model::open(&path).unwrap();
        let tower = ane_export::family::reference_tower(&ck).unwrap();
        let b = preprocess_file(
            &golden("images/tall.png"),
            ck.image_processor().unwrap(),
            DecodeLimits::default(),
        )
        .unwrap()
        .batch;
        assert_eq!(b.grid_thw, vec![[1, 10, 10]]);
        let pv = Tensor::from_slice(&b.pixel_values, (b.rows(), b.row_len), &Device::Cpu).unwrap();
        let want = tower.forward(&pv, &b.grid_thw, false).unwrap().outputs;
        for precision in [Precision::Fp32, Precision::Fp16] {
            let (got, _) = interpret_bucket(&pkg, &ck, bucket, 100, &b, precision);
            for (spec, w) in ck.vision.outputs(100).iter().zip(&want) {
                let g = values(&got[&spec.name]);
                let w = values(&w.t().unwrap().contiguous().unwrap());
                let err = rel_err(&g, &w);
                let bound = if precision == Precision::Fp32 {
                    1e-4
                } else {
                    2e-2
                };
                println!(
                    "{model} {precision:?} {}: relative error {err:.2e}",
                    spec.name
                );
                assert!(
                    err <= bound,
                    "{model} {precision:?} {}: {err:.2e}",
                    spec.name
                );
            }
        }
        let (o, r) = gate(&art, &[]);
        assert!(
            o.status.success(),
            "{model}: {}",
            String::from_utf8_lossy(&o.stderr)
        );
        crate::common::assert_schema("report", &r);
        assert_eq!(r["gates"]["vqa"]["status"], "not_applicable");
        assert_eq!(
            r["gates"]["task"]["status"], "pass",
            "{}",
            r["gates"]["task"]["message"]
        );
        assert_eq!(r["gates"]["task"]["pooled"], pooled);
        assert_eq!(r["accepted"], true, "{model}");
    }
}

/// Without `--task` and without the golden labels (in the tool's home or the
/// working directory),
/// the task gate is `not_run` (exit 2, not accepted) and says why.
#[test]
fn the_task_gate_without_labels_is_not_run() {
    let t = tempfile::tempdir().unwrap();
    let art = build_model(&golden("models/tiny-clip"), t.path(), "clip", &[], &[]);
    let o = std::process::Command::new(env!("CARGO_BIN_EXE_ane-export"))
        .args([
            "gate",
            art.to_str().unwrap(),
            "--images",
            golden("images").to_str().unwrap(),
        ])
        .current_dir(t.path())
        // A home without the golden sets (an incomplete installation).
        .env("ANE_EXPORT_HOME", t.path())
        .output()
        .unwrap();
    assert_eq!(
        o.status.code(),
        Some(2),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
    let r = crate::common::gate_report(&art);
    assert_eq!(r["gates"]["task"]["status"], "not_run");
    assert!(
        r["gates"]["task"]["message"]
            .as_str()
            .unwrap()
            .contains("no labelled images")
    );
    assert_eq!(r["gates"]["cosine"]["status"], "pass");
    assert_eq!(r["accepted"], false);
}

/// Several resolutions in one package, the host resampling the position
/// table to each bucket's grid: DINOv2 with and without registers (the
/// processor's 8 x 8 grid and a second one; the table is 7 x 7, so it is
/// resampled for both, growing and shrinking), CLIP and SigLIP (their own
/// 10 x 10 and an 8 x 8 grid, as transformers' `interpolate_pos_encoding`
/// gives). Each package is executed by the interpreter against
/// transformers' own outputs at both sides, in fp32 and with fp16
/// rounding; the manifest records the resampling.
#[test]
fn encoder_resolutions_share_one_package_and_match_transformers() {
    let t = tempfile::tempdir().unwrap();
    for (model, sides, patch, recipe) in [
        ("tiny-dinov2", [112, 84], 14, "bicubic"),
        ("tiny-dinov2-reg", [96, 60], 12, "bicubic_antialias"),
        ("tiny-clip", [140, 112], 14, "bicubic"),
        ("tiny-siglip", [160, 128], 16, "bicubic"),
    ] {
        let path = golden(&format!("models/{model}"));
        let yaml = t.path().join(format!("{model}.yaml"));
        std::fs::write(
            &yaml,
            format!(
                "buckets:\n  - name: b{0}\n    pixels: {0}\n  - name: b{1}\n    pixels: {1}\n",
                sides[0], sides[1]
            ),
        )
        .unwrap();
        let art = build_model(
            &path,
            t.path(),
            model,
            &[],
            &["--buckets", yaml.to_str().unwrap()],
        );
        let m: Value =
            serde_json::from_str(&std::fs::read_to_string(art.join("manifest.json")).unwrap())
                .unwrap();
        crate::common::assert_schema("manifest", &m);
        assert_eq!(m["host"]["pos_interpolation"], recipe);
        let pkg = Package::open(&art.join(format!("{model}.mlpackage"))).unwrap();
        let ck = Model::open(&path).unwrap();
        let r = ck.vision.outputs(0)[0].cols; // 1 + registers
        for (k, side) in sides.iter().enumerate() {
            let g = side / patch;
            assert_eq!(m["buckets"][k]["patches"], g * g);
            for stem in ["square", "tall"] {
                let file = if k == 0 {
                    format!("tower/{model}/{stem}.safetensors")
                } else {
                    format!("tower/{model}/{stem}-{side}.safetensors")
                };
                let (want, _) = read_all(&golden(&file));
                let pv = &want["pixel_values"];
                let b = ane_export::preprocess::PixelBatch {
                    pixel_values: pv.f32.clone(),
                    row_len: pv.shape[1],
                    grid_thw: vec![[1, g, g]],
                };
                for precision in [Precision::Fp32, Precision::Fp16] {
                    let (got, _) =
                        interpret_bucket(&pkg, &ck, &format!("b{side}"), g * g, &b, precision);
                    for spec in ck.vision.outputs(g * g) {
                        let w = &want[&spec.name];
                        assert_eq!(w.shape, [spec.cols, spec.width]);
                        assert_eq!(
                            spec.cols,
                            if spec.name == "last_hidden_state" {
                                r + g * g
                            } else {
                                1
                            }
                        );
                        let wt = Tensor::from_slice(&w.f32, w.shape.as_slice(), &Device::Cpu)
                            .unwrap()
                            .t()
                            .unwrap()
                            .contiguous()
                            .unwrap();
                        let err = rel_err(&values(&got[&spec.name]), &values(&wt));
                        let bound = if precision == Precision::Fp32 {
                            1e-4
                        } else {
                            2e-2
                        };
                        println!(
                            "{model} b{side} {stem} {precision:?} {}: {err:.2e}",
                            spec.name
                        );
                        assert!(
                            err <= bound,
                            "{model} b{side} {stem} {precision:?} {}: {err:.2e}",
                            spec.name
                        );
                    }
                }
            }
        }
    }
}

/// The gates that apply to DINOv2 pass both tiny checkpoints at their
/// processor's size and accept them; `ane-run embed` writes transformers'
/// names. `--fault pos-align` (antialiasing toggled in the host's
/// resampling) lowers the cosine gate's lowest cosine: the gate measures
/// the mistake (whether it fails depends on the bucket's threshold).
#[test]
fn dinov2_passes_its_gates_and_measures_a_resampling_mistake() {
    let t = tempfile::tempdir().unwrap();
    for (model, bucket, tokens) in [("tiny-dinov2", "b112", 65), ("tiny-dinov2-reg", "b96", 68)] {
        let path = golden(&format!("models/{model}"));
        let art = build_model(&path, t.path(), model, &[], &[]);
        let (o, r) = gate(&art, &[]);
        assert!(
            o.status.success(),
            "{model}: {}",
            String::from_utf8_lossy(&o.stderr)
        );
        crate::common::assert_schema("report", &r);
        let g = &r["gates"];
        assert_eq!(g["residency"]["status"], "pass");
        assert_eq!(g["cosine"]["status"], "pass");
        assert_eq!(g["vqa"]["status"], "not_applicable");
        assert_eq!(g["task"]["status"], "pass", "{}", g["task"]["message"]);
        assert_eq!(g["task"]["pooled"], "pooler_output");
        assert_eq!(r["accepted"], true, "{model}");
        let good = lowest_cosine(&r);

        let (got, meta) = embed_tall(&art, &t.path().join(format!("{model}-emb")));
        assert_eq!(meta["bucket"], bucket);
        assert_eq!(got["last_hidden_state"].shape[0], tokens);
        assert_eq!(got["pooler_output"].shape[0], 1);

        let bad = build_model(
            &path,
            t.path(),
            &format!("{model}-pos"),
            &[],
            &["--fault", "pos-align"],
        );
        let (_, r) = gate(&bad, &["--skip", "task"]);
        let worse = lowest_cosine(&r);
        println!("{model}: lowest cosine {good:.6} built right, {worse:.6} with pos-align");
        assert!(
            1.0 - worse > 10.0 * (1.0 - good),
            "{model}: pos-align {worse} against {good}"
        );
    }
}

/// `ane-run embed` of the golden `tall.png` with artifact `art` into
/// `out`: its outputs and metadata.
pub(crate) fn embed_tall(
    art: &Path,
    out: &Path,
) -> (
    std::collections::HashMap<String, T>,
    std::collections::HashMap<String, String>,
) {
    let o = run(
        "ane-run",
        &[
            "embed",
            "--artifact",
            art.to_str().unwrap(),
            golden("images/tall.png").to_str().unwrap(),
            "--out",
            out.to_str().unwrap(),
        ],
    );
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    read_all(&out.join("tall.safetensors"))
}

/// The lowest cosine of any output of any case the cosine gate ran.
pub(crate) fn lowest_cosine(report: &Value) -> f64 {
    report["gates"]["cosine"]["cases"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|c| c["status"] != "skipped")
        .flat_map(|c| c["outputs"].as_array().unwrap())
        .map(|o| o["min_cos"].as_f64().unwrap())
        .fold(1.0, f64::min)
}

/// Bad DINOv2 configs, checkpoints and buckets: exit 2 naming the field,
/// tensor or bucket, nothing at `--out`.
#[test]
fn bad_dinov2_configs_checkpoints_and_buckets_are_refused() {
    let fails = |mutate: &dyn Fn(&Path), extra: &[&str], needles: &[&str]| {
        build_fails("tiny-dinov2", mutate, extra, needles)
    };
    fails(
        &|d| edit_config(d, |v| v["image_size"] = 100.into()),
        &[],
        &["`image_size`", "100", "patch_size 14"],
    );
    // A table of another length than image_size gives (8 x 8 + 1 rows, the checkpoint has 7 x 7 + 1).
    fails(
        &|d| edit_config(d, |v| v["image_size"] = 112.into()),
        &[],
        &["embeddings.position_embeddings"],
    );
    fails(
        &|d| edit_config(d, |v| v["use_swiglu_ffn"] = false.into()),
        &[],
        &["mlp.fc1.weight"],
    );
    fails(
        &|d| {
            crate::common::drop_tensor(
                &d.join("model.safetensors"),
                "encoder.layer.1.layer_scale2.lambda1",
            )
        },
        &[],
        &["encoder.layer.1.layer_scale2.lambda1"],
    );
    let t = tempfile::tempdir().unwrap();
    let yaml = t.path().join("b.yaml");
    std::fs::write(&yaml, "buckets:\n  - name: b100\n    pixels: 100\n").unwrap();
    fails(
        &|_| {},
        &["--buckets", yaml.to_str().unwrap()],
        &["b100", "100 pixels", "patch size 14"],
    );
    std::fs::write(
        &yaml,
        "buckets:\n  - name: b112\n    pixels: 112\n  - name: b1024\n    patches: 1024\n",
    )
    .unwrap();
    fails(
        &|_| {},
        &["--buckets", yaml.to_str().unwrap()],
        &["b1024", "pixels"],
    );
}

/// Massive activations (`tiny-dinov2-massive`: its register tokens' residual
/// stream reaches 69,943 in two channels, beyond fp16's 65,504): the naive
/// fp16 program overflows and the cosine gate names the first op that does
/// (`b0_res2`, the residual add of block 0, 6 values saturated: 3 registers
/// x 2 channels) and rejects the artifact; built with the scale the build
/// chooses from the stream's peak on the calibration images, nothing
/// overflows, and every gate passes and accepts it. A scale that is not a
/// power of two, or a branch scale for a family without a SwiGLU branch to
/// scale, is refused (exit 2, nothing built).
#[test]
fn massive_activations_overflow_fp16_and_a_residual_scale_keeps_them_in_range() {
    let t = tempfile::tempdir().unwrap();
    let path = golden("models/tiny-dinov2-massive");
    let (naive, _, _) = naive_then_scaled(&path, t.path(), "b0_res2");
    let cosine = &naive["gates"]["cosine"];
    // ane mode: the infs of the op's output (none made by a ceiling: an add).
    assert_eq!(cosine["cases"][0]["first_overflow"]["nonfinite"], 6);
    assert_eq!(cosine["cases"][0]["drift_enters"], "block 0");

    build_fails(
        "tiny-dinov2-massive",
        |_| {},
        &["--residual-scale", "3"],
        &["--residual-scale 3", "power of two"],
    );
    build_fails(
        "tiny-q25",
        |_| {},
        &["--branch-scale", "6"],
        &["--branch-scale 6", "power of two"],
    );
    build_fails(
        "tiny-dinov2-massive",
        |_| {},
        &["--branch-scale", "8"],
        &[
            "--branch-scale 8",
            "dinov2",
            "qwen3_vl",
            "qwen2_5_vl",
            "qwen2_vl",
        ],
    );
}

/// `ane-export reference --pixel-values` takes transformers' own
/// `pixel_values [B, 3, H, W]` for a fixed-resolution encoder: a 6 x 8
/// DINOv2 grid (not square: the table resampled to it) and a SigLIP image
/// of 126 pixels at patch 12 (the last 6 dropped), each within 1e-4 of
/// transformers' outputs (`golden/pixel-values/`). A 4-D tensor for a
/// Qwen-VL model is refused naming the tensor.
#[test]
fn reference_reads_transformers_pixel_values() {
    let t = tempfile::tempdir().unwrap();
    for (model, tokens) in [("tiny-dinov2", 49), ("tiny-siglip-nohead", 100)] {
        let input = golden(&format!("pixel-values/{model}.safetensors"));
        let out = t.path().join(format!("{model}.safetensors"));
        let o = run(
            "ane-export",
            &[
                "reference",
                "--model",
                golden(&format!("models/{model}")).to_str().unwrap(),
                "--pixel-values",
                input.to_str().unwrap(),
                "--out",
                out.to_str().unwrap(),
            ],
        );
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        let (got, _) = read_all(&out);
        let (want, _) = read_all(&input);
        for name in ["last_hidden_state", "pooler_output"] {
            let Some(w) = want.get(name) else { continue };
            assert_eq!(got[name].shape, w.shape, "{model} {name}");
            let err = rel_err(&got[name].f32, &w.f32);
            println!("{model} {name}: relative error {err:.2e}");
            assert!(err <= 1e-4, "{model} {name}: {err:.2e}");
        }
        assert_eq!(got["last_hidden_state"].shape[0], tokens);
    }
    let o = run(
        "ane-export",
        &[
            "reference",
            "--model",
            golden("tiny-vlm").to_str().unwrap(),
            "--pixel-values",
            golden("pixel-values/tiny-dinov2.safetensors")
                .to_str()
                .unwrap(),
            "--out",
            t.path().join("x.safetensors").to_str().unwrap(),
        ],
    );
    assert_fails(&o, &["pixel_values", "[B, 3, H, W]", "grid_thw"]);
}

/// `build --residual-scale 4` on CLIP, SigLIP and SigLIP2 (where the stream
/// starts, CLIP's `pre_layrnorm` or the patch embedding, and every
/// attention output and MLP down projection divided by 4, the position rows
/// by 4 on entry): the manifest records it, the interpreter still gives the
/// reference's outputs (SigLIP's come after `post_layernorm`; CLIP's
/// `last_hidden_state` is the stream itself, which the host multiplies back,
/// `host.output_scale`) and the gates pass. No golden CLIP or SigLIP has
/// massive activations yet, so this shows the scaling is exact, not that it
/// is needed.
#[test]
fn a_residual_scale_keeps_clip_siglip_and_siglip2_outputs() {
    let t = tempfile::tempdir().unwrap();
    for (model, sizes) in [
        ("tiny-clip", None),
        ("tiny-siglip", None),
        ("tiny-siglip2", Some(144)),
    ] {
        let path = golden(&format!("models/{model}"));
        let mut extra = vec!["--residual-scale", "4"];
        let yaml;
        if let Some(n) = sizes {
            yaml = crate::naflex::buckets_file(t.path(), &[n]);
            extra.extend(["--buckets", yaml.to_str().unwrap()]);
        }
        let art = build_model(&path, t.path(), &format!("{model}-s4"), &[], &extra);
        let m: Value =
            serde_json::from_str(&std::fs::read_to_string(art.join("manifest.json")).unwrap())
                .unwrap();
        assert_eq!(m["residual_scale"], 4);
        let clip = model == "tiny-clip";
        assert_eq!(
            m["host"].get("output_scale"),
            clip.then_some(&Value::from(4))
        );
        let bucket = m["buckets"][0]["name"].as_str().unwrap().to_string();
        let slots = m["buckets"][0]["patches"].as_u64().unwrap() as usize;
        let pkg = Package::open(&art.join(format!("{model}-s4.mlpackage"))).unwrap();
        let ck = Model::open(&path).unwrap();
        let tower = ane_export::family::reference_tower(&ck).unwrap();
        let mut pre = ck.image_processor().unwrap().clone();
        if pre.max_num_patches.is_some() {
            pre.max_num_patches = Some(slots);
        }
        let b = preprocess_file(&golden("images/tall.png"), &pre, DecodeLimits::default())
            .unwrap()
            .batch;
        let real = b.rows();
        let pv = candle_core::Tensor::from_slice(
            &b.pixel_values,
            (real, b.row_len),
            &candle_core::Device::Cpu,
        )
        .unwrap();
        let want = tower.forward(&pv, &b.grid_thw, false).unwrap().outputs;
        for precision in [Precision::Fp32, Precision::Fp16] {
            let (got, columns) = interpret_bucket(&pkg, &ck, &bucket, slots, &b, precision);
            for (spec, w) in ck.vision.outputs(slots).iter().zip(&want) {
                let out = values(&got[&spec.name]);
                let cols: Vec<usize> = if spec.padded {
                    columns.clone()
                } else {
                    (0..spec.cols).collect()
                };
                // The program's own output: the stream, still divided by 4.
                let k = if ck.vision.residual_outputs().contains(&spec.name.as_str()) {
                    4.0
                } else {
                    1.0
                };
                let rows: Vec<f32> = cols
                    .iter()
                    .flat_map(|&c| (0..spec.width).map(move |k| (k, c)))
                    .map(|(j, c)| out[j * spec.cols + c] * k)
                    .collect();
                let err = rel_err(&rows, &values(w));
                let bound = if precision == Precision::Fp32 {
                    1e-4
                } else {
                    2e-2
                };
                println!("{model} S=4 {precision:?} {}: {err:.2e}", spec.name);
                assert!(
                    err <= bound,
                    "{model} S=4 {precision:?} {}: {err:.2e}",
                    spec.name
                );
            }
        }
        let (o, r) = gate(&art, &[]);
        assert!(
            o.status.success(),
            "{model}: {}",
            String::from_utf8_lossy(&o.stderr)
        );
        assert_eq!(r["accepted"], true);
        assert!(lowest_cosine(&r) > 0.9999, "{model}: {}", lowest_cosine(&r));
        if clip {
            // The runtime scales the stream back: `ane-run embed` against the reference.
            let (got, _) = embed_tall(&art, &t.path().join("clip-s4-emb"));
            let err = rel_err(&got["last_hidden_state"].f32, &values(&want[0]));
            println!("tiny-clip S=4 embed last_hidden_state: {err:.2e}");
            assert!(err <= 1e-4, "embed last_hidden_state: {err:.2e}");
        }
    }
}

/// `golden/models/tiny-clip-massive`: one patch token's residual stream
/// reaches about 80,000 in two channels, and CLIP returns that stream as
/// `last_hidden_state`. The naive fp16 program saturates at block 0's down
/// projection, which the cosine gate names while rejecting the artifact.
/// Built with the scale the build chooses, the program carries the stream
/// divided by it, the host multiplies `last_hidden_state` back in f32 (`host.output_scale`),
/// every gate passes, and `ane-run embed` writes values beyond fp16's range
/// that match the reference.
#[test]
fn massive_clip_needs_its_stream_scaled_and_scaled_back() {
    let t = tempfile::tempdir().unwrap();
    let path = golden("models/tiny-clip-massive");
    let (_, scaled, m) = naive_then_scaled(&path, t.path(), "b0_fc2");
    assert_eq!(m["host"]["output_scale"], m["residual_scale"]);
    let (got, _) = embed_tall(&scaled, &t.path().join("emb"));
    let want = reference_tall(&path, t.path());
    let h = &got["last_hidden_state"].f32;
    let top = h.iter().fold(0f32, |m, v| m.max(v.abs()));
    assert!(
        top > 65_504.0,
        "the stream comes back beyond fp16's range: {top}"
    );
    // The error grows as S^2, each LayerNorm's epsilon weighing S^2 times
    // more against the scaled variance (docs/numerics.md): measured 4.5e-5
    // at S = 2 (which the ANE mode now rejects: the down projection writes
    // 40,000, past 32,752), 2.2e-4 at 4, 3.8e-3 at the calibrated 16.
    for name in ["last_hidden_state", "pooler_output"] {
        let err = rel_err(&got[name].f32, &want[name].f32);
        println!("tiny-clip-massive embed {name}: {err:.2e} (largest |value| {top})");
        assert!(err <= 1e-2, "{name}: {err:.2e}");
    }
    let two = build_model(&path, t.path(), "two", &[], &["--residual-scale", "4"]);
    let (o, _) = gate(&two, &[]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let (got, _) = embed_tall(&two, &t.path().join("emb2"));
    for name in ["last_hidden_state", "pooler_output"] {
        let err = rel_err(&got[name].f32, &want[name].f32);
        println!("tiny-clip-massive at scale 4, embed {name}: {err:.2e}");
        assert!(err <= 5e-4, "{name}: {err:.2e}");
    }
}

/// `golden/models/tiny-siglip-massive`: one patch token's stream reaches
/// about 70,000 in two channels (its position row holds 40,000 there, block
/// 0's MLP adds the rest). The naive program saturates at block 0's
/// residual add and is rejected; with the scale the build chooses every
/// gate passes. Both outputs follow `post_layernorm`, so nothing is scaled back
/// (`host.output_scale` absent).
#[test]
fn massive_siglip_overflows_and_a_residual_scale_passes() {
    let t = tempfile::tempdir().unwrap();
    let path = golden("models/tiny-siglip-massive");
    let (naive, _, m) = naive_then_scaled(&path, t.path(), "b0_res2");
    assert_eq!(
        naive["gates"]["cosine"]["cases"][0]["first_overflow"]["nonfinite"],
        2
    );
    assert!(m["host"].get("output_scale").is_none());
}

/// A massive golden built naively (`--residual-scale 1`) and with the
/// scale the build chooses: the naive artifact's gate report (exit 1: the
/// cosine gate fails and rejects it, its first case's first overflow at
/// `op`), then the scaled artifact's path and manifest (its calibration:
/// the planted stream past fp16's range, the smallest power of two that
/// brings it 4x under the Neural Engine's 32,752; its gate: every case
/// free of overflow, cosine and task passing, accepted).
fn naive_then_scaled(path: &Path, dir: &Path, op: &str) -> (Value, std::path::PathBuf, Value) {
    let naive = build_model(path, dir, "naive", &[], &["--residual-scale", "1"]);
    let (o, naive_report) = gate(&naive, &[]);
    assert_eq!(
        o.status.code(),
        Some(1),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
    let cosine = &naive_report["gates"]["cosine"];
    assert_eq!(cosine["status"], "fail");
    assert_eq!(cosine["cases"][0]["first_overflow"]["op"], op);
    assert_eq!(naive_report["accepted"], false);

    let scaled = build_model(path, dir, "scaled", &[], &[]);
    let m: Value =
        serde_json::from_str(&std::fs::read_to_string(scaled.join("manifest.json")).unwrap())
            .unwrap();
    crate::common::assert_schema("manifest", &m);
    let c = &m["calibration"];
    let (peak, s) = (
        c["stream_peak"].as_f64().unwrap(),
        c["residual_scale"].as_f64().unwrap(),
    );
    assert_eq!(m["residual_scale"], c["residual_scale"]);
    assert!(peak > 65_504.0, "{c}");
    assert!(
        peak / s <= 32_752.0 / 4.0 && peak / (s / 2.0) > 32_752.0 / 4.0,
        "{c}"
    );
    let (o, r) = gate(&scaled, &[]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let cases = r["gates"]["cosine"]["cases"].as_array().unwrap();
    assert!(cases.iter().all(|c| c["first_overflow"].is_null()));
    assert_eq!(r["gates"]["cosine"]["status"], "pass");
    assert_eq!(
        r["gates"]["task"]["status"], "pass",
        "{}",
        r["gates"]["task"]["message"]
    );
    assert_eq!(r["accepted"], true);
    // Natural and stress images keep their precision at the chosen scale.
    assert!(lowest_cosine(&r) >= 0.999, "{}", lowest_cosine(&r));
    println!(
        "{}, residual scale {s}: lowest cosine {:.6}, task agreement {}",
        path.display(),
        lowest_cosine(&r),
        r["gates"]["task"]["agreement"]
    );
    (naive_report, scaled, m)
}

/// `ane-export reference` of the golden `tall.png` with the checkpoint at
/// `model`, written in `dir`: its outputs.
pub(crate) fn reference_tall(model: &Path, dir: &Path) -> std::collections::HashMap<String, T> {
    let rf = dir.join("ref-tall.safetensors");
    let o = run(
        "ane-export",
        &[
            "reference",
            "--model",
            model.to_str().unwrap(),
            "--image",
            golden("images/tall.png").to_str().unwrap(),
            "--out",
            rf.to_str().unwrap(),
        ],
    );
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    read_all(&rf).0
}
