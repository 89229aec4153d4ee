//! SigLIP2 with NaFlex end to end on its golden tiny checkpoints
//! (`golden/models/tiny-siglip2`: a `Siglip2Model` with its text tower and
//! the pooling head, patch 12, a 7 x 7 position table;
//! `tiny-siglip2-nohead`: a `Siglip2VisionModel` without the head, patch 8,
//! a 6 x 6 table; made by `make golden-siglip2` with transformers):
//! preprocessing bit-exact with both of transformers' backends at two
//! budgets, the reference within 1e-4 of transformers on padded images
//! whose table grows and shrinks, the built program (executed by the
//! interpreter) against transformers' own outputs with the image in a
//! bucket of its budget and in a larger one, the gates, `ane-run embed`,
//! `reference --pixel-values` on transformers' padded batch, and bad
//! configs, checkpoints and buckets refused.

use std::path::Path;

use ane_export::family::Model;
use ane_export::interp::Precision;
use ane_export::mlpackage::Package;
use ane_export::preprocess::{DecodeLimits, PixelBatch, ResizeKernel, preprocess_file};
use serde_json::Value;

use crate::common::{build_model, golden, interpret_bucket, read_all, run};
use crate::encoders::{
    build_fails, edit_config, embed_tall, gate, lowest_cosine, reference_tall, rel_err, tensor,
    values,
};

/// A buckets file of `patches` buckets `b<n>` in `dir`.
pub(crate) fn buckets_file(dir: &Path, sizes: &[usize]) -> std::path::PathBuf {
    let p = dir.join("naflex.yaml");
    let mut text = "buckets:\n".to_string();
    for n in sizes {
        text += &format!("  - name: b{n}\n    patches: {n}\n");
    }
    std::fs::write(&p, text).unwrap();
    p
}

/// An image's grid from a golden's `spatial_shapes [2]`.
fn grid(t: &crate::common::T) -> [usize; 3] {
    [1, t.i64[0] as usize, t.i64[1] as usize]
}

#[test]
fn naflex_preprocessing_is_bit_exact_with_both_backends() {
    let ck = Model::open(&golden("models/tiny-siglip2")).unwrap();
    assert_eq!(ck.image_processor().unwrap().max_num_patches, Some(144));
    let mut n = 0;
    let mut padded = 0;
    for e in std::fs::read_dir(golden("preprocess-siglip2")).unwrap() {
        let (want, meta) = read_all(&e.unwrap().path());
        let image = golden(&format!("images/{}", meta["image"]));
        let budget: usize = meta["budget"].parse().unwrap();
        for (key, kernel) in [
            ("tv", ResizeKernel::Torchvision),
            ("pil", ResizeKernel::Pil),
        ] {
            let mut pre = ck.image_processor().unwrap().clone();
            pre.kernel = kernel;
            pre.max_num_patches = Some(budget);
            let got = preprocess_file(&image, &pre, DecodeLimits::default())
                .unwrap()
                .batch;
            let g = grid(&want["spatial_shapes"]);
            assert_eq!(got.grid_thw, vec![g], "{} at {budget}", meta["image"]);
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
                "{} at {budget} {key}: {bad} values differ",
                meta["image"]
            );
            padded += usize::from(g[1] * g[2] < budget);
            n += 1;
        }
    }
    assert_eq!(n, 24, "6 images, 2 budgets, 2 backends");
    assert!(padded >= 12, "most cases leave padding: {padded}");
}

#[test]
fn naflex_references_match_transformers() {
    for (model, outputs) in [
        ("tiny-siglip2", &["last_hidden_state", "pooler_output"][..]),
        ("tiny-siglip2-nohead", &["last_hidden_state"][..]),
    ] {
        let ck = Model::open(&golden(&format!("models/{model}"))).unwrap();
        let names: Vec<String> = ck.vision.outputs(0).into_iter().map(|s| s.name).collect();
        assert_eq!(names, outputs);
        let tower = ane_export::family::reference_tower(&ck).unwrap();
        for e in std::fs::read_dir(golden(&format!("tower/{model}"))).unwrap() {
            let p = e.unwrap().path();
            let (t, _) = read_all(&p);
            let g = grid(&t["spatial_shapes"]);
            // transformers' padded rows: the image's come first.
            let pv = tensor(&t["pixel_values"])
                .narrow(0, 0, g[1] * g[2])
                .unwrap();
            let out = tower.forward(&pv, &[g], false).unwrap();
            for (name, got) in outputs.iter().zip(&out.outputs) {
                let want = &t[*name];
                assert_eq!(got.dims(), want.shape.as_slice(), "{model} {name}");
                let err = rel_err(&values(got), &want.f32);
                println!("{model} {} {name}: relative error {err:.2e}", p.display());
                assert!(err <= 1e-4, "{model} {} {name}: {err:.2e}", p.display());
            }
        }
    }
}

/// One package with buckets of 64 and 144 patches: every golden image at
/// budget 64 runs in both (padding 0 to 84 columns), at budget 144 in the
/// larger, and each gives transformers' real tokens and pooled output.
#[test]
fn naflex_buckets_pad_and_match_transformers() {
    let t = tempfile::tempdir().unwrap();
    let model = "tiny-siglip2";
    let path = golden(&format!("models/{model}"));
    let yaml = buckets_file(t.path(), &[64, 144]);
    let art = build_model(
        &path,
        t.path(),
        model,
        &[],
        &["--buckets", yaml.to_str().unwrap()],
    );
    let m: Value =
        serde_json::from_str(&std::fs::read_to_string(art.join("manifest.json")).unwrap()).unwrap();
    crate::common::assert_schema("manifest", &m);
    assert_eq!(m["family"], "siglip2");
    assert_eq!(m["host"]["pos_interpolation"], "bilinear_antialias");
    assert_eq!(m["preprocessing"]["max_num_patches"], 144);
    assert_eq!(m["preprocessing"]["filter"], "bilinear");
    assert!(
        m["buckets"][0]["capacity"]
            .as_str()
            .unwrap()
            .contains("max_num_patches")
    );
    let pkg = Package::open(&art.join(format!("{model}.mlpackage"))).unwrap();
    let ck = Model::open(&path).unwrap();
    let mut runs = 0;
    for e in std::fs::read_dir(golden(&format!("tower/{model}"))).unwrap() {
        let p = e.unwrap().path();
        let (want, meta) = read_all(&p);
        let g = grid(&want["spatial_shapes"]);
        let real = g[1] * g[2];
        let budget = want["pixel_values"].shape[0];
        let b = PixelBatch {
            pixel_values: want["pixel_values"].f32[..real * want["pixel_values"].shape[1]].to_vec(),
            row_len: want["pixel_values"].shape[1],
            grid_thw: vec![g],
        };
        for bucket in [64, 144].into_iter().filter(|&n| n >= budget) {
            for precision in [Precision::Fp32, Precision::Fp16] {
                let (got, columns) =
                    interpret_bucket(&pkg, &ck, &format!("b{bucket}"), bucket, &b, precision);
                assert_eq!(columns, (0..real).collect::<Vec<_>>());
                for spec in ck.vision.outputs(bucket) {
                    let w = &want[&spec.name];
                    let out = values(&got[&spec.name]); // [D, cols]
                    let cols = if spec.padded { real } else { 1 };
                    let mut rows = vec![0f32; cols * spec.width];
                    for r in 0..cols {
                        for c in 0..spec.width {
                            rows[r * spec.width + c] = out[c * spec.cols + r];
                        }
                    }
                    assert_eq!(w.shape, [cols, spec.width]);
                    let err = rel_err(&rows, &w.f32);
                    let bound = if precision == Precision::Fp32 {
                        1e-4
                    } else {
                        2e-2
                    };
                    println!(
                        "{} ({real} of b{bucket}) {precision:?} {}: {err:.2e}",
                        meta["image"], spec.name
                    );
                    assert!(
                        err <= bound,
                        "{} b{bucket} {precision:?} {}: {err:.2e}",
                        meta["image"],
                        spec.name
                    );
                }
                runs += 1;
            }
        }
    }
    assert_eq!(
        runs, 24,
        "4 images at 64 in two buckets and at 144 in one, two precisions"
    );
}

/// The gates pass both tiny checkpoints and accept them; `ane-run embed`
/// writes the image's tokens alone under transformers' names; `--fault
/// pos-align` (the table resized without antialiasing) lowers the lowest
/// cosine, which the gate measures.
#[test]
fn naflex_passes_its_gates_and_embeds() {
    let t = tempfile::tempdir().unwrap();
    for (model, sizes, pooled, tokens) in [
        ("tiny-siglip2", &[100, 144][..], "pooler_output", 140),
        (
            "tiny-siglip2-nohead",
            &[100][..],
            "mean of last_hidden_state",
            96,
        ),
    ] {
        let path = golden(&format!("models/{model}"));
        let yaml = buckets_file(t.path(), sizes);
        let bf = ["--buckets", yaml.to_str().unwrap()];
        let art = build_model(&path, t.path(), model, &[], &bf);
        let (o, r) = gate(&art, &[]);
        assert!(
            o.status.success(),
            "{model}: {}",
            String::from_utf8_lossy(&o.stderr)
        );
        crate::common::assert_schema("report", &r);
        let g = &r["gates"];
        assert_eq!(
            g["residency"]["status"], "pass",
            "{}",
            g["residency"]["message"]
        );
        assert_eq!(g["cosine"]["status"], "pass");
        assert_eq!(g["vqa"]["status"], "not_applicable");
        assert_eq!(g["task"]["status"], "pass", "{}", g["task"]["message"]);
        assert_eq!(g["task"]["pooled"], pooled);
        assert_eq!(r["accepted"], true, "{model}");
        let good = lowest_cosine(&r);

        let (got, meta) = embed_tall(&art, &t.path().join(format!("{model}-emb")));
        assert_eq!(meta["bucket"], format!("b{}", sizes[sizes.len() - 1]));
        assert_eq!(
            got["last_hidden_state"].shape[0], tokens,
            "{model}: pad columns dropped"
        );
        // The same image through the reference.
        let want = reference_tall(&path, t.path());
        for name in ["last_hidden_state", "pooler_output"] {
            if let Some(w) = want.get(name) {
                let err = rel_err(&got[name].f32, &w.f32);
                assert!(err <= 1e-4, "{model} {name}: {err:.2e}");
            }
        }

        let bad = build_model(
            &path,
            t.path(),
            &format!("{model}-pos"),
            &[],
            &["--buckets", yaml.to_str().unwrap(), "--fault", "pos-align"],
        );
        let (_, r) = gate(
            &bad,
            &["--buckets", yaml.to_str().unwrap(), "--skip", "task"],
        );
        let worse = lowest_cosine(&r);
        println!("{model}: lowest cosine {good:.6} built right, {worse:.6} with pos-align");
        assert!(
            1.0 - worse > 10.0 * (1.0 - good),
            "{model}: pos-align {worse} against {good}"
        );
    }
}

/// transformers' padded batch (`pixel_values [2, 64, 432]`, its mask and
/// spatial shapes) through `ane-export reference --pixel-values`: each
/// image's real tokens and pooled output; a mask that disagrees with the
/// shapes is refused naming the tensor.
#[test]
fn naflex_reference_reads_transformers_padded_batch() {
    let t = tempfile::tempdir().unwrap();
    let input = golden("pixel-values/tiny-siglip2.safetensors");
    let out = t.path().join("ref.safetensors");
    let args = |input: &Path| {
        vec![
            "reference".to_string(),
            "--model".into(),
            golden("models/tiny-siglip2").display().to_string(),
            "--pixel-values".into(),
            input.display().to_string(),
            "--out".into(),
            out.display().to_string(),
        ]
    };
    let a = args(&input);
    let o = run(
        "ane-export",
        &a.iter().map(String::as_str).collect::<Vec<_>>(),
    );
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let (got, _) = read_all(&out);
    let (want, _) = read_all(&input);
    let shapes = &want["spatial_shapes"].i64;
    let (n, d) = (
        want["pixel_values"].shape[1],
        want["last_hidden_state"].shape[2],
    );
    let mut rows = Vec::new();
    for (i, hw) in shapes.chunks(2).enumerate() {
        let real = (hw[0] * hw[1]) as usize;
        rows.extend_from_slice(&want["last_hidden_state"].f32[i * n * d..(i * n + real) * d]);
    }
    assert_eq!(got["last_hidden_state"].shape, [rows.len() / d, d]);
    let err = rel_err(&got["last_hidden_state"].f32, &rows);
    assert!(err <= 1e-4, "last_hidden_state: {err:.2e}");
    let err = rel_err(&got["pooler_output"].f32, &want["pooler_output"].f32);
    assert!(err <= 1e-4, "pooler_output: {err:.2e}");

    // A mask that says one more patch is real than the shapes do.
    let bad = t.path().join("bad.safetensors");
    let mut mask = want["pixel_attention_mask"].i64.clone();
    mask[(shapes[0] * shapes[1]) as usize] = 1;
    ane_export::tensor_file::write(
        &bad,
        vec![
            (
                "pixel_values".into(),
                ane_export::tensor_file::OwnedTensor::f32(
                    want["pixel_values"].shape.clone(),
                    &want["pixel_values"].f32,
                ),
            ),
            (
                "spatial_shapes".into(),
                ane_export::tensor_file::OwnedTensor::i64(vec![2, 2], shapes),
            ),
            (
                "pixel_attention_mask".into(),
                ane_export::tensor_file::OwnedTensor::i64(vec![2, n], &mask),
            ),
        ],
        None,
    )
    .unwrap();
    let a = args(&bad);
    let o = run(
        "ane-export",
        &a.iter().map(String::as_str).collect::<Vec<_>>(),
    );
    crate::common::assert_fails(&o, &["pixel_attention_mask", "row 0"]);
}

#[test]
fn bad_naflex_configs_checkpoints_and_buckets_are_refused() {
    // A position table that is not a square.
    build_fails(
        "tiny-siglip2",
        |d| edit_config(d, |v| v["vision_config"]["num_patches"] = 50.into()),
        &[],
        &["vision_config.num_patches", "square"],
    );
    // A head tensor missing from the checkpoint.
    build_fails(
        "tiny-siglip2",
        |d| crate::common::drop_tensor(&d.join("model.safetensors"), "vision_model.head.probe"),
        &[],
        &["head.probe"],
    );
    // A bucket in pixels: NaFlex buckets are patch budgets.
    let t = tempfile::tempdir().unwrap();
    let yaml = t.path().join("px.yaml");
    std::fs::write(&yaml, "buckets:\n  - name: b96\n    pixels: 96\n").unwrap();
    build_fails(
        "tiny-siglip2",
        |_| {},
        &["--buckets", yaml.to_str().unwrap()],
        &["b96", "patches"],
    );
    // A processor budget that is not a count.
    build_fails(
        "tiny-siglip2",
        |d| {
            let p = d.join("preprocessor_config.json");
            let mut v: Value = serde_json::from_str(&std::fs::read_to_string(&p).unwrap()).unwrap();
            v["max_num_patches"] = 0.into();
            std::fs::write(&p, v.to_string()).unwrap();
        },
        &[],
        &["preprocessor_config.json", "max_num_patches"],
    );
}
