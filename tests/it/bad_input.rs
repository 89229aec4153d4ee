//! Bad input: each case ends with exit 2 and a message naming the file (and
//! tensor or field) and what was expected, never a panic.

use std::path::Path;

use serde_json::Value;

use crate::common::{assert_fails, copy_model, golden, reference_from_pixels, run};

fn reference(model: &Path, image: &Path, out: &Path) -> std::process::Output {
    run(
        "ane-export",
        &[
            "reference",
            "--model",
            model.to_str().unwrap(),
            "--image",
            image.to_str().unwrap(),
            "--out",
            out.to_str().unwrap(),
        ],
    )
}

fn square() -> std::path::PathBuf {
    golden("images/square.png")
}

/// Run the reference on a mutated copy of tiny-a and check the failure.
fn fails_with(mutate: impl FnOnce(&Path), needles: &[&str]) {
    let m = copy_model("tiny-a");
    mutate(m.path());
    let out = m.path().join("out.safetensors");
    let o = reference(m.path(), &square(), &out);
    assert_fails(&o, needles);
    assert!(!out.exists(), "no output may be left behind on failure");
}

/// Rewrite the safetensors header of `file` with `f` (data unchanged).
fn edit_header(file: &Path, f: impl FnOnce(&mut serde_json::Map<String, Value>)) {
    let bytes = std::fs::read(file).unwrap();
    let n = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
    let mut h: Value = serde_json::from_slice(&bytes[8..8 + n]).unwrap();
    f(h.as_object_mut().unwrap());
    let text = serde_json::to_vec(&h).unwrap();
    let mut out = (text.len() as u64).to_le_bytes().to_vec();
    out.extend_from_slice(&text);
    out.extend_from_slice(&bytes[8 + n..]);
    std::fs::write(file, out).unwrap();
}

fn edit_config(dir: &Path, f: impl FnOnce(&mut Value)) {
    let p = dir.join("config.json");
    let mut v: Value = serde_json::from_str(&std::fs::read_to_string(&p).unwrap()).unwrap();
    f(&mut v);
    std::fs::write(p, serde_json::to_string(&v).unwrap()).unwrap();
}

const QKV: &str = "model.visual.blocks.0.attn.qkv.weight";

#[test]
fn missing_config() {
    fails_with(
        |d| std::fs::remove_file(d.join("config.json")).unwrap(),
        &["config.json is missing"],
    );
}

#[test]
fn malformed_config() {
    fails_with(
        |d| std::fs::write(d.join("config.json"), "{not json").unwrap(),
        &["config.json", "invalid JSON"],
    );
    fails_with(
        |d| {
            edit_config(d, |v| {
                drop(v["vision_config"].as_object_mut().unwrap().remove("depth"))
            })
        },
        &["config.json", "vision_config.depth", "missing"],
    );
    fails_with(
        |d| edit_config(d, |v| v["vision_config"]["num_heads"] = 7.into()),
        &["vision_config.num_heads", "does not divide"],
    );
}

#[test]
fn unsupported_family_names_supported_ones() {
    fails_with(
        |d| edit_config(d, |v| v["model_type"] = "paligemma".into()),
        &[
            "paligemma",
            "not a supported vision model",
            "qwen3_vl",
            "qwen2_5_vl",
            "qwen2_vl",
            "clip",
            "siglip",
            "siglip2",
            "dinov2",
        ],
    );
    fails_with(
        |d| edit_config(d, |v| v["model_type"] = "llava".into()),
        &["llava", "not a supported vision model", "qwen3_vl"],
    );
}

#[test]
fn truncated_safetensors() {
    fails_with(
        |d| {
            let p = d.join("model.safetensors");
            let b = std::fs::read(&p).unwrap();
            std::fs::write(&p, &b[..b.len() - 100]).unwrap();
        },
        &["model.safetensors", "malformed safetensors", "truncated"],
    );
    fails_with(
        |d| std::fs::write(d.join("model.safetensors"), [1u8, 2, 3]).unwrap(),
        &["model.safetensors", "shorter than"],
    );
}

#[test]
fn overlapping_offsets() {
    fails_with(
        |d| {
            edit_header(&d.join("model.safetensors"), |h| {
                // Point one tensor at the previous one's bytes.
                let mut entries: Vec<(String, (u64, u64))> = h
                    .iter()
                    .filter(|(k, _)| *k != "__metadata__")
                    .map(|(k, v)| {
                        (
                            k.clone(),
                            (
                                v["data_offsets"][0].as_u64().unwrap(),
                                v["data_offsets"][1].as_u64().unwrap(),
                            ),
                        )
                    })
                    .collect();
                entries.sort_by_key(|e| e.1);
                let (name, (s, e)) = entries[1].clone();
                h[&name]["data_offsets"] = serde_json::json!([s - 4, e - 4]);
            })
        },
        &["model.safetensors", "overlap"],
    );
}

#[test]
fn offsets_disagree_with_dtype_and_shape() {
    fails_with(
        |d| {
            edit_header(&d.join("model.safetensors"), |h| {
                h[QKV]["shape"] = serde_json::json!([216, 71])
            })
        },
        &["model.safetensors", QKV, "need"],
    );
}

#[test]
fn offsets_past_the_file() {
    fails_with(
        |d| {
            edit_header(&d.join("model.safetensors"), |h| {
                let last = h
                    .iter()
                    .filter(|(k, _)| *k != "__metadata__")
                    .max_by_key(|(_, v)| v["data_offsets"][1].as_u64().unwrap())
                    .map(|(k, _)| k.clone())
                    .unwrap();
                let e = h[&last]["data_offsets"][1].as_u64().unwrap();
                h[&last]["data_offsets"][1] = (e + 4096).into();
            })
        },
        &["model.safetensors", "malformed"],
    );
}

#[test]
fn missing_tensor() {
    fails_with(
        |d| {
            edit_header(&d.join("model.safetensors"), |h| {
                // Rename, so offsets stay valid but the tower lacks the tensor.
                let v = h.remove(QKV).unwrap();
                h.insert("model.visual.blocks.0.attn.qkv.weight_renamed".into(), v);
            })
        },
        &[QKV, "missing", "expected shape [216, 72]"],
    );
}

#[test]
fn shape_disagrees_with_config() {
    // 4 blocks stored, but the config asks for a wider MLP.
    fails_with(
        |d| edit_config(d, |v| v["vision_config"]["intermediate_size"] = 104.into()),
        &[
            "model.visual.blocks.0.mlp.linear_fc1.weight",
            "disagrees with config.json",
            "[104, 72]",
        ],
    );
}

#[test]
fn unsupported_dtype() {
    fails_with(
        |d| {
            edit_header(&d.join("model.safetensors"), |h| {
                h[QKV]["dtype"] = "I32".into()
            })
        },
        &[QKV, "dtype I32", "F32, F16 or BF16"],
    );
}

#[test]
fn nan_weights_warn_and_name_tensor() {
    let m = copy_model("tiny-a");
    let p = m.path().join("model.safetensors");
    let bytes = std::fs::read(&p).unwrap();
    let n = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
    let h: Value = serde_json::from_slice(&bytes[8..8 + n]).unwrap();
    let start = 8 + n + h[QKV]["data_offsets"][0].as_u64().unwrap() as usize;
    let mut bytes = bytes;
    bytes[start..start + 4].copy_from_slice(&f32::NAN.to_le_bytes());
    std::fs::write(&p, bytes).unwrap();
    let out = m.path().join("out.safetensors");
    let o = reference(m.path(), &square(), &out);
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(0), "{err}");
    assert!(
        err.contains("warning") && err.contains(QKV) && err.contains("NaN"),
        "{err}"
    );
}

#[test]
fn pickled_checkpoints_are_refused() {
    let m = copy_model("tiny-a");
    std::fs::remove_file(m.path().join("model.safetensors")).unwrap();
    std::fs::write(m.path().join("pytorch_model.bin"), b"\x80\x02}q\x00.").unwrap();
    let out = m.path().join("out.safetensors");
    assert_fails(
        &reference(m.path(), &square(), &out),
        &["pytorch_model.bin", "pickled", "execute"],
    );
    assert_fails(
        &reference(&m.path().join("pytorch_model.bin"), &square(), &out),
        &["pickled"],
    );
}

#[test]
fn bad_images() {
    let t = tempfile::tempdir().unwrap();
    let model = golden("models/tiny-a");
    let out = t.path().join("out.safetensors");
    // Truncated PNG.
    let png = std::fs::read(golden("images/square.png")).unwrap();
    let trunc = t.path().join("trunc.png");
    std::fs::write(&trunc, &png[..png.len() / 2]).unwrap();
    assert_fails(
        &reference(&model, &trunc, &out),
        &["trunc.png", "cannot decode"],
    );
    // Not an image.
    let txt = t.path().join("notes.png");
    std::fs::write(&txt, "hello").unwrap();
    assert_fails(
        &reference(&model, &txt, &out),
        &["notes.png", "not a JPEG, PNG or WebP"],
    );
    // Empty.
    let empty = t.path().join("empty.jpg");
    std::fs::write(&empty, "").unwrap();
    assert_fails(&reference(&model, &empty, &out), &["empty.jpg", "empty"]);
    // Missing file.
    assert_fails(
        &reference(&model, &t.path().join("nope.png"), &out),
        &["nope.png"],
    );
    // A PNG whose header declares 100000 x 100000 pixels.
    let bomb = t.path().join("bomb.png");
    std::fs::write(&bomb, png_header_only(100_000, 100_000)).unwrap();
    assert_fails(
        &reference(&model, &bomb, &out),
        &["bomb.png", "decompression bomb"],
    );
    // Aspect ratio above 200.
    let thin = t.path().join("thin.png");
    image::RgbImage::from_pixel(402, 2, image::Rgb([9, 9, 9]))
        .save(&thin)
        .unwrap();
    assert_fails(
        &reference(&model, &thin, &out),
        &["thin.png", "aspect ratio", "200"],
    );
    assert!(!out.exists());
}

/// A PNG that declares `w x h` pixels but holds no pixel data.
fn png_header_only(w: u32, h: u32) -> Vec<u8> {
    fn crc32(data: &[u8]) -> u32 {
        let mut c = 0xffff_ffffu32;
        for &b in data {
            c ^= u32::from(b);
            for _ in 0..8 {
                c = if c & 1 != 0 {
                    0xedb8_8320 ^ (c >> 1)
                } else {
                    c >> 1
                };
            }
        }
        !c
    }
    fn chunk(out: &mut Vec<u8>, kind: &[u8], data: &[u8]) {
        out.extend_from_slice(&(data.len() as u32).to_be_bytes());
        let mut body = kind.to_vec();
        body.extend_from_slice(data);
        out.extend_from_slice(&body);
        out.extend_from_slice(&crc32(&body).to_be_bytes());
    }
    let mut v = b"\x89PNG\r\n\x1a\n".to_vec();
    let mut ihdr = Vec::new();
    ihdr.extend_from_slice(&w.to_be_bytes());
    ihdr.extend_from_slice(&h.to_be_bytes());
    ihdr.extend_from_slice(&[8, 2, 0, 0, 0]);
    chunk(&mut v, b"IHDR", &ihdr);
    // An empty zlib stream: the decoder reads the header without inflating anything.
    chunk(
        &mut v,
        b"IDAT",
        &[0x78, 0x9c, 0x03, 0x00, 0x00, 0x00, 0x00, 0x01],
    );
    chunk(&mut v, b"IEND", &[]);
    v
}

#[test]
fn bad_pixel_values_file() {
    let t = tempfile::tempdir().unwrap();
    let model = golden("models/tiny-a");
    let (o, out) = reference_from_pixels(&model, t.path(), &vec![0.0; 8 * 1536], 1536, &[1, 4, 4]);
    assert_fails(
        &o,
        &["in.safetensors", "pixel_values", "16 patches", "8 rows"],
    );
    assert!(!out.exists());
}

#[test]
fn unknown_repo_id_offline_names_the_cache() {
    let t = tempfile::tempdir().unwrap();
    let out = t.path().join("o.safetensors");
    let o = std::process::Command::new(env!("CARGO_BIN_EXE_ane-export"))
        .args([
            "reference",
            "--model",
            "Qwen/Qwen3-VL-2B-Instruct",
            "--image",
            "x.png",
            "--out",
            out.to_str().unwrap(),
        ])
        .env("HF_HUB_CACHE", t.path())
        .env("HF_HUB_OFFLINE", "1")
        .output()
        .unwrap();
    assert_fails(
        &o,
        &[
            "Qwen/Qwen3-VL-2B-Instruct",
            "not in the local Hugging Face cache",
            "HF_HUB_OFFLINE is set",
        ],
    );
}

/// `make mac-check` off macOS says what it needs, exits 2 and runs nothing.
#[cfg(not(target_os = "macos"))]
#[test]
fn mac_check_needs_macos() {
    let root = crate::common::root();
    let o = std::process::Command::new("make")
        .args(["-s", "mac-check"])
        .current_dir(&root)
        .output()
        .unwrap();
    assert_fails(
        &o,
        &[
            "make mac-check needs macOS on Apple silicon",
            "Nothing was run",
        ],
    );
    assert!(
        !root.join("out/mac-check").exists(),
        "mac-check wrote output off macOS"
    );
}
