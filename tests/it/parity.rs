//! Parity with transformers on committed golden outputs.
//!
//! Preprocessing: decoded RGB, resized levels (both resize backends) and
//! `grid_thw` against transformers' Qwen2-VL image processor. Tower: outputs
//! from the same `pixel_values` within 1e-4 relative to the output's
//! magnitude (max |ours - theirs| / max |theirs|).

use ane_export::family::Model;
use ane_export::preprocess::{
    DecodeLimits, ImageProcessorConfig, ResizeKernel, RgbImage, load_rgb, patchify,
    preprocess_file, resize_for_model,
};
use candle_core::{Device, Tensor};

use crate::common::{golden, read_all, reference_from_pixels, run};

/// Tolerance of the tower comparison, relative to the largest output magnitude.
const TOWER_REL_TOL: f32 = 1e-4;

fn golden_cfg() -> ImageProcessorConfig {
    let dir = golden("models/tiny-a");
    Model::open(&dir)
        .unwrap()
        .image_processor()
        .unwrap()
        .clone()
}

/// Levels of a resized image in golden layout: rows in merge-block order,
/// one temporal frame, (c, py, px) per row.
fn levels(img: &RgbImage, cfg: &ImageProcessorConfig) -> Vec<u8> {
    let raw = ImageProcessorConfig {
        temporal_patch_size: 1,
        do_rescale: false,
        do_normalize: false,
        ..cfg.clone()
    };
    patchify(img, &raw)
        .pixel_values
        .iter()
        .map(|&v| v as u8)
        .collect()
}

struct Diff {
    count: usize,
    max: u8,
}

fn diff(a: &[u8], b: &[u8]) -> Diff {
    assert_eq!(a.len(), b.len());
    let mut d = Diff { count: 0, max: 0 };
    for (x, y) in a.iter().zip(b) {
        let e = x.abs_diff(*y);
        if e > 0 {
            d.count += 1;
            d.max = d.max.max(e);
        }
    }
    d
}

/// One golden preprocessing case: its name, the safetensors file and the image.
struct Case {
    stem: String,
    file: std::path::PathBuf,
    image: std::path::PathBuf,
}

/// Every case of golden/preprocess (images in golden/images) and of
/// golden/preprocess-jpeg (JPEGs of several qualities, subsamplings and
/// orientations in golden/images-jpeg, from make_golden_jpeg.py).
fn preprocess_cases() -> Vec<(Case, std::collections::HashMap<String, String>)> {
    let mut v = Vec::new();
    for (pre, images, min) in [
        ("preprocess", "images", 16),
        ("preprocess-jpeg", "images-jpeg", 19),
    ] {
        let mut n = 0;
        for e in std::fs::read_dir(golden(pre)).unwrap() {
            let file = e.unwrap().path();
            if file.extension().is_none_or(|e| e != "safetensors") {
                continue;
            }
            let (_, meta) = read_all(&file);
            let image = golden(&format!("{images}/{}", meta["image"]));
            let stem = format!("{pre}/{}", file.file_stem().unwrap().to_string_lossy());
            v.push((Case { stem, file, image }, meta));
            n += 1;
        }
        assert!(n >= min, "golden {pre} cases missing: {n} < {min}");
    }
    v.sort_by(|a, b| a.0.stem.cmp(&b.0.stem));
    v
}

/// Whether our decoder of this image may differ from Pillow's: lossy WebP
/// (bit-exact in practice, held to a bound), and JPEG when built without the
/// `libjpeg-turbo` feature (the image crate's decoder differs from
/// libjpeg-turbo in IDCT and chroma upsampling).
fn may_differ(image: &std::path::Path) -> bool {
    let name = image.file_name().unwrap().to_string_lossy();
    (name.ends_with(".jpg") && !cfg!(feature = "libjpeg-turbo")) || name == "lossy.webp"
}

/// Resizing transformers' own decoded RGB reproduces its levels bit for bit,
/// for both backends (torchvision's uint8 kernel and Pillow's; the JPEG set
/// stores torchvision's levels only).
#[test]
fn resize_matches_both_backends() {
    let base = golden_cfg();
    for (case, meta) in preprocess_cases() {
        let stem = &case.stem;
        let (t, _) = read_all(&case.file);
        let Some(rgb) = t.get("rgb") else { continue };
        let img = RgbImage {
            height: rgb.shape[0],
            width: rgb.shape[1],
            data: rgb.u8.clone(),
        };
        for (kernel, key) in [
            (ResizeKernel::Torchvision, "levels"),
            (ResizeKernel::Pil, "levels_pil"),
        ] {
            let Some(want) = t.get(key) else { continue };
            let cfg = ImageProcessorConfig {
                kernel,
                ..base.clone()
            };
            let resized = resize_for_model(&img, &cfg).unwrap();
            let d = diff(&levels(&resized, &cfg), &want.u8);
            println!(
                "resize {stem:28} {kernel:?}: {} of {} levels differ, max {}",
                d.count,
                want.u8.len(),
                d.max
            );
            assert_eq!(
                d.count, 0,
                "{stem} ({meta:?}): {kernel:?} resize must be bit-exact"
            );
        }
    }
}

/// Decoding matches Pillow bit for bit: PNG, lossless WebP, and JPEG of every
/// quality, chroma subsampling, progressive or baseline, gray, CMYK and every
/// EXIF orientation (libjpeg-turbo, as Pillow). Lossy WebP, and JPEG when built
/// without the `libjpeg-turbo` feature, are held to a bound instead.
#[test]
fn decode_matches_pillow() {
    let mut jpegs = 0;
    for (case, _) in preprocess_cases() {
        let stem = &case.stem;
        let (t, _) = read_all(&case.file);
        let Some(rgb) = t.get("rgb") else { continue };
        let ours = load_rgb(&case.image, DecodeLimits::default()).unwrap();
        assert_eq!(
            (ours.height, ours.width),
            (rgb.shape[0], rgb.shape[1]),
            "{stem}: size (EXIF orientation?)"
        );
        let d = diff(&ours.data, &rgb.u8);
        let mean: f64 = ours
            .data
            .iter()
            .zip(&rgb.u8)
            .map(|(a, b)| f64::from(a.abs_diff(*b)))
            .sum::<f64>()
            / rgb.u8.len() as f64;
        println!(
            "decode {stem:28} {:>6} of {:>7} bytes differ, max {:>3}, mean {mean:.4}",
            d.count,
            rgb.u8.len(),
            d.max
        );
        if may_differ(&case.image) {
            assert!(
                mean < 1.0 && d.max <= 40,
                "{stem}: lossy decode too far from Pillow"
            );
        } else {
            assert_eq!(
                d.count, 0,
                "{stem}: decode must be bit-exact with Pillow ({} bytes differ, max {})",
                d.count, d.max
            );
        }
        jpegs += usize::from(case.image.extension().is_some_and(|e| e == "jpg"));
    }
    assert!(jpegs >= 23, "only {jpegs} JPEG cases checked");
}

/// A JPEG cut short is refused, as Pillow refuses it ("image file is
/// truncated"), naming the file.
#[cfg(feature = "libjpeg-turbo")]
#[test]
fn truncated_jpeg_is_refused() {
    let path = golden("images-jpeg/truncated.jpg");
    let e = load_rgb(&path, DecodeLimits::default())
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("JPEG file is truncated") && e.contains("truncated.jpg"),
        "{e}"
    );
}

/// The whole pipeline from the file: grid_thw identical; resized levels
/// bit-exact and pixel values within 1e-6 (transformers fuses rescale into
/// normalisation, `(l - 127.5) / 127.5`, which rounds differently in the last
/// bit). Where the decoders may differ (see [`may_differ`]): max difference
/// at most 0.1 and mean below 0.005 (normalised units; one level is 0.0078).
#[test]
fn pixel_values_match_transformers() {
    let cfg = golden_cfg();
    let mut worst = 0f32;
    for (case, _) in preprocess_cases() {
        let stem = &case.stem;
        let (t, _) = read_all(&case.file);
        let p = preprocess_file(&case.image, &cfg, DecodeLimits::default()).unwrap();
        let g = &t["grid_thw"].i64;
        let ours: Vec<i64> = p.batch.grid_thw[0].iter().map(|&v| v as i64).collect();
        assert_eq!(&ours, g, "{stem}: grid_thw");
        let want = reconstruct(&t["levels"].u8, &cfg);
        assert_eq!(p.batch.pixel_values.len(), want.len());
        let (mut max, mut sum) = (0f32, 0f64);
        for (a, b) in p.batch.pixel_values.iter().zip(&want) {
            let e = (a - b).abs();
            max = max.max(e);
            sum += f64::from(e);
        }
        let mean = sum / want.len() as f64;
        println!("pixel_values {stem:28} max {max:.5} mean {mean:.6}");
        if may_differ(&case.image) {
            assert!(
                max <= 0.1 && mean < 0.005,
                "{stem}: pixel difference max {max} mean {mean}"
            );
            worst = worst.max(max);
        } else {
            assert_eq!(
                levels(&p.resized, &cfg),
                t["levels"].u8,
                "{stem}: levels must be bit-exact"
            );
            assert!(max <= 1e-6, "{stem}: pixel difference {max}");
        }
    }
    println!("worst pixel difference where decoders may differ: {worst:.6}");
}

/// transformers' pixel values from golden levels: `(l / 255 - mean) / std` in
/// f32, each row expanded from (c, py, px) to (c, t, py, px).
fn reconstruct(levels: &[u8], cfg: &ImageProcessorConfig) -> Vec<f32> {
    let (p, t) = (cfg.patch_size, cfg.temporal_patch_size);
    let mut out = Vec::with_capacity(levels.len() * t);
    for row in levels.chunks_exact(3 * p * p) {
        for c in 0..3 {
            let plane = &row[c * p * p..(c + 1) * p * p];
            for _ in 0..t {
                out.extend(
                    plane
                        .iter()
                        .map(|&l| (f32::from(l) / 255.0 - cfg.image_mean[c]) / cfg.image_std[c]),
                );
            }
        }
    }
    out
}

fn tower_cases() -> Vec<(String, std::path::PathBuf)> {
    let mut v = Vec::new();
    for m in TOWER_MODELS {
        for e in std::fs::read_dir(golden(&format!("tower/{m}"))).unwrap() {
            let p = e.unwrap().path();
            v.push((m.to_string(), p));
        }
    }
    v.sort();
    assert!(v.len() >= 47, "golden tower cases missing");
    v
}

/// The golden checkpoints with tower outputs: Qwen3-VL (f32, bf16, f16),
/// Qwen2.5-VL and Qwen2-VL (bf16), and each family's bf16 tower with
/// planted massive activations (`make golden-qwen-massive`: the stream
/// holds about 45,000, or 98,000, in two channels between two blocks).
const TOWER_MODELS: [&str; 11] = [
    "tiny-a",
    "tiny-b",
    "tiny-c",
    "tiny-q25",
    "tiny-q2",
    "tiny-a-massive32k",
    "tiny-a-massive",
    "tiny-q25-massive32k",
    "tiny-q25-massive",
    "tiny-q2-massive32k",
    "tiny-q2-massive",
];

fn case_pixels(
    t: &std::collections::HashMap<String, crate::common::T>,
    meta: &std::collections::HashMap<String, String>,
    cfg: &ImageProcessorConfig,
) -> Vec<f32> {
    // The patch-14 families' cases carry their own levels.
    if let Some(l) = t.get("levels") {
        return reconstruct(&l.u8, cfg);
    }
    let mut pv = Vec::new();
    for stem in meta["images"].split(',') {
        let (t, _) = read_all(&golden(&format!("preprocess/{stem}.safetensors")));
        pv.extend(reconstruct(&t["levels"].u8, cfg));
    }
    pv
}

fn rel_err(ours: &[f32], theirs: &[f32]) -> f32 {
    assert_eq!(ours.len(), theirs.len());
    let scale = theirs.iter().fold(0f32, |m, v| m.max(v.abs()));
    let err = ours
        .iter()
        .zip(theirs)
        .fold(0f32, |m, (a, b)| m.max((a - b).abs()));
    assert!(ours.iter().all(|v| v.is_finite()));
    err / scale
}

/// The reference tower of each family matches transformers' (fp32, SDPA)
/// on every golden case: one image, several images in one call, near 4096
/// patches; Qwen3-VL from f32, bf16 and f16 checkpoints, Qwen2.5-VL (window
/// attention with edge windows) and Qwen2-VL from bf16 ones.
#[test]
fn tower_matches_transformers() {
    let mut families = std::collections::BTreeSet::new();
    for (model, path) in tower_cases() {
        let ck = Model::open(&golden(&format!("models/{model}"))).unwrap();
        families.insert(ck.vision.family().name());
        let tower = ane_export::family::reference_tower(&ck).unwrap();
        let (t, meta) = read_all(&path);
        let pv = case_pixels(&t, &meta, ck.image_processor().unwrap());
        let grid: Vec<[usize; 3]> = t["grid_thw"]
            .i64
            .chunks(3)
            .map(|g| [g[0] as usize, g[1] as usize, g[2] as usize])
            .collect();
        let n = pv.len() / crate::common::pixels(&ck).patch_dim();
        let x = Tensor::from_vec(
            pv,
            (n, crate::common::pixels(&ck).patch_dim()),
            &Device::Cpu,
        )
        .unwrap();
        let out = tower.forward(&x, &grid, false).unwrap();
        let name = path.file_stem().unwrap().to_string_lossy();
        // Files name the outputs `embeds`, `deepstack.<i>`.
        let outputs: Vec<(String, Tensor)> = ck
            .vision
            .outputs(0)
            .into_iter()
            .map(|s| s.file_name)
            .zip(out.outputs)
            .collect();
        assert_eq!(outputs[0].0, "embeds");
        assert_eq!(outputs.len(), ck.vision.output_names().len());
        for (key, ours) in outputs {
            let theirs = &t[&key];
            assert_eq!(
                ours.dims(),
                theirs.shape.as_slice(),
                "{model}/{name} {key} shape"
            );
            let ours = ours.flatten_all().unwrap().to_vec1::<f32>().unwrap();
            let e = rel_err(&ours, &theirs.f32);
            println!("tower {model}/{name:7} {key:11} rel err {e:.2e}");
            assert!(
                e <= TOWER_REL_TOL,
                "{model}/{name} {key}: relative error {e:.3e}"
            );
        }
    }
    assert_eq!(
        families.into_iter().collect::<Vec<_>>(),
        ["qwen2_5_vl", "qwen2_vl", "qwen3_vl"]
    );
}

/// The patch-14 families' preprocessing (factor 28, CLIP mean and std)
/// against transformers' torchvision backend on lossless images: the same
/// grid and levels, and bit for bit the same `pixel_values` where stored.
#[test]
fn patch14_preprocessing_matches_transformers() {
    for model in ["tiny-q25", "tiny-q2"] {
        let ck = Model::open(&golden(&format!("models/{model}"))).unwrap();
        let cfg = ck.image_processor().unwrap();
        assert_eq!((cfg.patch_size, cfg.factor()), (14, 28));
        let mut with_pixels = 0;
        let mut cases = 0;
        for e in std::fs::read_dir(golden("preprocess-p14")).unwrap() {
            let path = e.unwrap().path();
            let (t, meta) = read_all(&path);
            let img = golden(&format!("images/{}", meta["image"]));
            let got = preprocess_file(&img, cfg, DecodeLimits::default())
                .unwrap()
                .batch;
            let g: Vec<i64> = got.grid_thw[0].iter().map(|&v| v as i64).collect();
            assert_eq!(g, t["grid_thw"].i64, "{} grid", meta["image"]);
            let rgb = load_rgb(&img, DecodeLimits::default()).unwrap();
            let resized = resize_for_model(&rgb, cfg).unwrap();
            assert_eq!(
                levels(&resized, cfg),
                t["levels"].u8,
                "{} levels",
                meta["image"]
            );
            if let Some(pv) = t.get("pixel_values") {
                let same = got
                    .pixel_values
                    .iter()
                    .zip(&pv.f32)
                    .filter(|(a, b)| a.to_bits() == b.to_bits())
                    .count();
                assert_eq!(got.pixel_values.len(), pv.f32.len());
                assert_eq!(same, pv.f32.len(), "{}: pixel_values differ", meta["image"]);
                with_pixels += 1;
            }
            cases += 1;
        }
        assert!(
            cases >= 10 && with_pixels >= 5,
            "{cases} cases, {with_pixels} with pixel_values"
        );
    }
}

/// `ane-export reference --pixel-values` end to end: the file round trip and
/// the CLI give the same numbers as the golden outputs.
#[test]
fn reference_cli_from_pixel_values() {
    let dir = tempfile::tempdir().unwrap();
    let model = golden("models/tiny-c");
    let ck = Model::open(&model).unwrap();
    let (t, meta) = read_all(&golden("tower/tiny-c/multi.safetensors"));
    let pv = case_pixels(&t, &meta, ck.image_processor().unwrap());
    let (o, out) = reference_from_pixels(
        &model,
        dir.path(),
        &pv,
        crate::common::pixels(&ck).patch_dim(),
        &t["grid_thw"].i64,
    );
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let (got, _) = read_all(&out);
    assert_eq!(got["grid_thw"].i64, t["grid_thw"].i64);
    assert!(
        !got.contains_key("pixel_values"),
        "pixel_values is written only from images"
    );
    for key in ["embeds", "deepstack.0", "deepstack.1", "deepstack.2"] {
        assert!(
            rel_err(&got[key].f32, &t[key].f32) <= TOWER_REL_TOL,
            "{key}"
        );
    }
}

/// `ane-export reference --image` writes pixel_values equal to preprocessing
/// and outputs of the documented shapes; `ane-run preprocess` writes the same
/// pixel values.
#[test]
fn reference_cli_from_images() {
    let dir = tempfile::tempdir().unwrap();
    let model = golden("models/tiny-a");
    let imgs = [golden("images/wide.jpg"), golden("images/rgba.png")];
    let out = dir.path().join("out.safetensors");
    let mut args = vec![
        "reference",
        "--model",
        model.to_str().unwrap(),
        "--out",
        out.to_str().unwrap(),
        "--image",
    ];
    args.extend(imgs.iter().map(|p| p.to_str().unwrap()));
    let o = run("ane-export", &args);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let (got, _) = read_all(&out);
    let ck = Model::open(&model).unwrap();
    let mut rows = 0;
    let mut want_pv = Vec::new();
    for (i, img) in imgs.iter().enumerate() {
        let p =
            preprocess_file(img, ck.image_processor().unwrap(), DecodeLimits::default()).unwrap();
        let g: Vec<i64> = p.batch.grid_thw[0].iter().map(|&v| v as i64).collect();
        assert_eq!(&got["grid_thw"].i64[i * 3..i * 3 + 3], g.as_slice());
        rows += p.batch.rows();
        want_pv.extend(p.batch.pixel_values);
    }
    assert_eq!(
        got["pixel_values"].shape,
        vec![rows, crate::common::pixels(&ck).patch_dim()]
    );
    assert_eq!(got["pixel_values"].f32, want_pv);
    assert_eq!(
        got["embeds"].shape,
        vec![rows / 4, ck.vision.out_hidden_size()]
    );
    assert_eq!(
        got["deepstack.1"].shape,
        vec![rows / 4, ck.vision.out_hidden_size()]
    );
    assert!(!got.contains_key("deepstack.2"));

    let pre = dir.path().join("pre.safetensors");
    let mut args = vec![
        "preprocess",
        "--model",
        model.to_str().unwrap(),
        "--out",
        pre.to_str().unwrap(),
        "--image",
    ];
    args.extend(imgs.iter().map(|p| p.to_str().unwrap()));
    let o = run("ane-run", &args);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let (p, _) = read_all(&pre);
    assert_eq!(p["pixel_values"].f32, want_pv);
    assert_eq!(p["grid_thw"].i64, got["grid_thw"].i64);
}
