//! Helpers shared by the integration tests.

use std::path::{Path, PathBuf};
use std::process::Output;

/// The repository root.
pub fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

pub fn golden(rel: &str) -> PathBuf {
    root().join("golden").join(rel)
}

/// A tensor read from a golden safetensors file.
pub struct T {
    pub shape: Vec<usize>,
    pub f32: Vec<f32>,
    pub u8: Vec<u8>,
    pub i64: Vec<i64>,
}

/// Read every tensor of a safetensors file, plus its metadata.
pub fn read_all(
    path: &Path,
) -> (
    std::collections::HashMap<String, T>,
    std::collections::HashMap<String, String>,
) {
    let bytes = std::fs::read(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    let (_, meta) = safetensors::SafeTensors::read_metadata(&bytes).unwrap();
    let mut out = std::collections::HashMap::new();
    for (name, v) in st.tensors() {
        let d = v.data();
        let mut t = T {
            shape: v.shape().to_vec(),
            f32: vec![],
            u8: vec![],
            i64: vec![],
        };
        match v.dtype() {
            safetensors::Dtype::F32 => {
                t.f32 = d
                    .chunks_exact(4)
                    .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
                    .collect()
            }
            safetensors::Dtype::U8 => t.u8 = d.to_vec(),
            safetensors::Dtype::I64 => {
                t.i64 = d
                    .chunks_exact(8)
                    .map(|c| i64::from_le_bytes(c.try_into().unwrap()))
                    .collect()
            }
            other => panic!("unexpected dtype {other:?}"),
        }
        out.insert(name, t);
    }
    (out, meta.metadata().clone().unwrap_or_default())
}

/// Rewrite the safetensors file `path` without tensor `name`.
pub fn drop_tensor(path: &Path, name: &str) {
    let bytes = std::fs::read(path).unwrap();
    let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    let kept: Vec<(String, safetensors::tensor::TensorView)> = st
        .tensors()
        .into_iter()
        .filter(|(n, _)| n != name)
        .collect();
    std::fs::write(path, safetensors::serialize(kept, None).unwrap()).unwrap();
}

/// Run one of the project's binaries.
pub fn run(bin: &str, args: &[&str]) -> Output {
    run_env(bin, args, &[])
}

/// [`run`] with environment variables set (`Some`) or removed (`None`).
pub fn run_env(bin: &str, args: &[&str], env: &[(&str, Option<&str>)]) -> Output {
    let exe = match bin {
        "ane-export" => env!("CARGO_BIN_EXE_ane-export"),
        "ane-run" => env!("CARGO_BIN_EXE_ane-run"),
        _ => panic!("unknown binary {bin}"),
    };
    let mut cmd = std::process::Command::new(exe);
    cmd.args(args);
    for (k, v) in env {
        match v {
            Some(v) => cmd.env(k, v),
            None => cmd.env_remove(k),
        };
    }
    cmd.output().expect("spawn binary")
}

/// Assert a command failed with exit 2 and that stderr holds every needle.
pub fn assert_fails(out: &Output, needles: &[&str]) {
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(
        out.status.code(),
        Some(2),
        "expected exit 2, stderr:\n{err}"
    );
    for n in needles {
        assert!(err.contains(n), "stderr lacks {n:?}:\n{err}");
    }
    assert!(!err.contains("panicked"), "panic:\n{err}");
}

/// Copy a golden model directory into a fresh temp dir for mutation.
pub fn copy_model(name: &str) -> tempfile::TempDir {
    let t = tempfile::tempdir().unwrap();
    copy_dir(&golden(&format!("models/{name}")), t.path());
    t
}

/// Copy the files of `from` into `to`, folders (a sentence-transformers
/// checkpoint's `1_Pooling`) included.
fn copy_dir(from: &Path, to: &Path) {
    for e in std::fs::read_dir(from).unwrap() {
        let p = e.unwrap().path();
        let dest = to.join(p.file_name().unwrap());
        if p.is_dir() {
            std::fs::create_dir_all(&dest).unwrap();
            copy_dir(&p, &dest);
        } else {
            std::fs::copy(&p, &dest).unwrap();
        }
    }
}

/// Write a `--pixel-values` input (`pixel_values [rows, cols]`, `grid_thw [k, 3]`)
/// into `dir` and run `ane-export reference` on it; returns the run and the output path.
pub fn reference_from_pixels(
    model: &Path,
    dir: &Path,
    pv: &[f32],
    cols: usize,
    grid: &[i64],
) -> (Output, PathBuf) {
    use ane_export::tensor_file::{OwnedTensor, write};
    let input = dir.join("in.safetensors");
    write(
        &input,
        vec![
            (
                "pixel_values".into(),
                OwnedTensor::f32(vec![pv.len() / cols, cols], pv),
            ),
            (
                "grid_thw".into(),
                OwnedTensor::i64(vec![grid.len() / 3, 3], grid),
            ),
        ],
        None,
    )
    .unwrap();
    let out = dir.join("out.safetensors");
    let args = [
        "reference",
        "--model",
        model.to_str().unwrap(),
        "--pixel-values",
        input.to_str().unwrap(),
        "--out",
        out.to_str().unwrap(),
    ];
    (run("ane-export", &args), out)
}

/// A temporary folder holding copies of the named golden images.
pub fn golden_images(names: &[&str]) -> tempfile::TempDir {
    let t = tempfile::tempdir().unwrap();
    for n in names {
        std::fs::copy(golden(&format!("images/{n}")), t.path().join(n)).unwrap();
    }
    t
}

/// Build tiny-a into `dir/name` (`--bucket` for each of `buckets`, then
/// `extra` arguments) and return the artifact's path; the build must succeed.
pub fn build_tiny(dir: &Path, name: &str, buckets: &[&str], extra: &[&str]) -> PathBuf {
    build_model(&golden("models/tiny-a"), dir, name, buckets, extra)
}

/// Build the checkpoint `model` into `dir/name`, as [`build_tiny`] does.
pub fn build_model(
    model: &Path,
    dir: &Path,
    name: &str,
    buckets: &[&str],
    extra: &[&str],
) -> PathBuf {
    let out = dir.join(name);
    let mut args = vec![
        "build",
        "--model",
        model.to_str().unwrap(),
        "--out",
        out.to_str().unwrap(),
    ];
    for b in buckets {
        args.extend(["--bucket", b]);
    }
    args.extend(extra);
    let o = run("ane-export", &args);
    assert!(
        o.status.success(),
        "build failed:\n{}",
        String::from_utf8_lossy(&o.stderr)
    );
    out
}

/// The golden images `images/{name}` preprocessed with the checkpoint's
/// processor and concatenated into one call.
pub fn golden_batch(
    ck: &ane_export::family::Model,
    images: &[&str],
) -> ane_export::preprocess::PixelBatch {
    use ane_export::preprocess::{DecodeLimits, PixelBatch, preprocess_file};
    let parts = images
        .iter()
        .map(|i| {
            preprocess_file(
                &golden(&format!("images/{i}")),
                ck.image_processor().unwrap(),
                DecodeLimits::default(),
            )
            .unwrap()
            .batch
        })
        .collect();
    PixelBatch::concat(parts).unwrap()
}

/// The host's inputs for `batch` in a bucket of `slots` (the family's
/// tables read from `ck`), and the same as tensors by name, as the
/// interpreter takes them.
pub fn host_input_tensors(
    ck: &ane_export::family::Model,
    batch: &ane_export::preprocess::PixelBatch,
    slots: usize,
) -> (
    ane_export::host::HostInputs,
    std::collections::HashMap<String, candle_core::Tensor>,
) {
    use candle_core::{Device, Tensor};
    let mut tables = ane_export::host::HostTables::default();
    for (name, _, v) in ck.vision.host_tables(ck).unwrap() {
        tables.insert(name, v);
    }
    let inputs = pixels(ck)
        .host_inputs(&ck.vision.host_recipe(), &tables, batch, slots)
        .unwrap();
    let ins = inputs
        .named()
        .into_iter()
        .map(|(name, shape, v)| {
            (
                name.to_string(),
                Tensor::from_slice(v, shape, &Device::Cpu).unwrap(),
            )
        })
        .collect();
    (inputs, ins)
}

/// Bucket `function` (of `slots` columns) of `pkg` run by the interpreter
/// on the host's inputs for `batch` (the family's tables read from `ck`):
/// the outputs, which must not overflow fp16, and the output column of each
/// real merged token.
pub fn interpret_bucket(
    pkg: &ane_export::mlpackage::Package,
    ck: &ane_export::family::Model,
    function: &str,
    slots: usize,
    batch: &ane_export::preprocess::PixelBatch,
    precision: ane_export::interp::Precision,
) -> (
    std::collections::BTreeMap<String, candle_core::Tensor>,
    Vec<usize>,
) {
    let (inputs, ins) = host_input_tensors(ck, batch, slots);
    let merge = pixels(ck).merge_size();
    let columns = inputs.token_columns(merge * merge);
    let got = ane_export::interp::Interpreter::new(pkg, Some(function))
        .unwrap()
        .run(&ins, precision)
        .unwrap();
    assert!(got.first_overflow.is_none(), "{:?}", got.first_overflow);
    (got.outputs, columns)
}

/// Min and mean cosine between the tokens of `ours` (`[out, cols]`,
/// channel-major as the package lays them out; token `t` at column
/// `columns[t]`) and `reference` (`[tokens, out]`).
pub fn token_cosines(ours: &[f32], columns: &[usize], reference: &[f32], out: usize) -> (f64, f64) {
    let cols = ours.len() / out;
    assert_eq!(reference.len(), columns.len() * out, "reference tokens");
    let (mut min, mut sum) = (f64::MAX, 0.0);
    for (t, &col) in columns.iter().enumerate() {
        let (mut dot, mut a2, mut b2) = (0f64, 0f64, 0f64);
        for c in 0..out {
            let (a, r) = (
                f64::from(ours[c * cols + col]),
                f64::from(reference[t * out + c]),
            );
            dot += a * r;
            a2 += a * a;
            b2 += r * r;
        }
        let cos = dot / (a2.sqrt() * b2.sqrt()).max(1e-30);
        min = min.min(cos);
        sum += cos;
    }
    (min, sum / columns.len().max(1) as f64)
}

/// The gate's `gate/report.json` in an artifact.
pub fn gate_report(artifact: &Path) -> serde_json::Value {
    let p = artifact.join("gate/report.json");
    serde_json::from_str(&std::fs::read_to_string(&p).unwrap()).unwrap()
}

/// What the JSON schema `docs/schemas/<name>.schema.json` finds wrong with
/// `doc`, one line per error (`<path>: <message>`); empty when it is valid.
pub fn schema_errors(name: &str, doc: &serde_json::Value) -> Vec<String> {
    let p = root().join(format!("docs/schemas/{name}.schema.json"));
    let schema: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&p).unwrap()).unwrap();
    let v = jsonschema::validator_for(&schema).unwrap_or_else(|e| panic!("{}: {e}", p.display()));
    v.iter_errors(doc)
        .map(|e| format!("{}: {e}", e.instance_path()))
        .collect()
}

/// `doc` is valid against `docs/schemas/<name>.schema.json`.
pub fn assert_schema(name: &str, doc: &serde_json::Value) {
    let errs = schema_errors(name, doc);
    assert!(
        errs.is_empty(),
        "not a valid {name} (docs/schemas/{name}.schema.json):\n{}",
        errs.join("\n")
    );
}

/// The image modality of a model's tower (every family today).
pub fn pixels(m: &ane_export::family::Model) -> &dyn ane_export::family::Pixels {
    m.vision.pixels().expect("an image model")
}
