//! `ane-export reference`.

use std::path::Path;
use std::process::ExitCode;
use std::time::Instant;

use anyhow::Context;
use candle_core::{Device, Tensor};

use super::{ReferenceArgs, peak_rss_mib};
use crate::checkpoint::resolve_model;
use crate::error::Error;
use crate::family::Model;
use crate::preprocess::{DecodeLimits, PixelBatch, preprocess_file};
use crate::tensor_file::f32_values as to_vec;
use crate::tensor_file::{self, OwnedTensor};

/// Read `pixel_values` and `grid_thw` from a safetensors file; for a
/// fixed-resolution encoder of patch side `image_patch`, `pixel_values`
/// may instead be transformers' images `[B, 3, H, W]` (no `grid_thw`),
/// cut into patch rows here; for SigLIP2 (NaFlex), transformers' padded
/// `[B, max_num_patches, 3*P*P]` with `spatial_shapes [B, 2]` and
/// `pixel_attention_mask [B, max_num_patches]` ([`naflex_rows`]).
pub(crate) fn read_pixel_file(
    path: &Path,
    image_patch: Option<usize>,
) -> crate::Result<PixelBatch> {
    let bytes = std::fs::read(path).map_err(|e| Error::io(path, e))?;
    let pv = tensor_file::read_tensor(&bytes, path, "pixel_values")?;
    if pv.shape.len() == 3 {
        return naflex_rows(path, &bytes, pv);
    }
    if pv.shape.len() == 4 {
        return match (pv.f32, image_patch) {
            (Some(v), Some(p)) => images_to_rows(path, &v, &pv.shape, p),
            _ => Err(Error::tensor(
                path,
                "pixel_values",
                "a 4-D [B, 3, H, W] float tensor is taken for fixed-resolution encoders (CLIP, SigLIP, \
                 DINOv2); this family expects [n, 3*T*P*P] with grid_thw",
            )),
        };
    }
    let grid = tensor_file::read_tensor(&bytes, path, "grid_thw")?;
    let (Some(values), [rows, cols]) = (pv.f32, pv.shape.as_slice()) else {
        return Err(Error::tensor(
            path,
            "pixel_values",
            "expected a 2-D float tensor [n, 3*T*P*P]",
        ));
    };
    let (Some(g), [k, 3]) = (grid.i64, grid.shape.as_slice()) else {
        return Err(Error::tensor(
            path,
            "grid_thw",
            "expected an integer tensor [k, 3]",
        ));
    };
    if values.iter().any(|v| !v.is_finite()) {
        return Err(Error::tensor(path, "pixel_values", "holds NaN or Inf"));
    }
    let mut grid_thw = Vec::with_capacity(*k);
    for row in g.chunks_exact(3) {
        if row.iter().any(|&v| !(1..=1 << 20).contains(&v)) {
            return Err(Error::tensor(
                path,
                "grid_thw",
                format!("row {row:?} must hold positive sizes"),
            ));
        }
        grid_thw.push([row[0] as usize, row[1] as usize, row[2] as usize]);
    }
    debug_assert_eq!(values.len(), rows * cols);
    Ok(PixelBatch {
        pixel_values: values,
        row_len: *cols,
        grid_thw,
    })
}

/// SigLIP2's processor output: `pixel_values [B, N, 3*P*P]` (each image's
/// rows first, then padding), `spatial_shapes [B, 2]` (each image's grid
/// in patches) and `pixel_attention_mask [B, N]` (1 on the image's rows,
/// 0 on the padding, which must agree with the shapes): the images' real
/// rows, one after another, and their grids.
fn naflex_rows(path: &Path, bytes: &[u8], pv: tensor_file::Loaded) -> crate::Result<PixelBatch> {
    let (Some(v), &[b, n, cols]) = (pv.f32, pv.shape.as_slice()) else {
        return Err(Error::tensor(
            path,
            "pixel_values",
            "expected a 3-D float tensor [B, max_num_patches, 3*P*P]",
        ));
    };
    if v.iter().any(|x| !x.is_finite()) {
        return Err(Error::tensor(path, "pixel_values", "holds NaN or Inf"));
    }
    let shapes = tensor_file::read_tensor(bytes, path, "spatial_shapes")?;
    let (Some(s), true) = (shapes.i64, shapes.shape == [b, 2]) else {
        return Err(Error::tensor(
            path,
            "spatial_shapes",
            format!("expected an integer tensor [{b}, 2] (each image's grid in patches)"),
        ));
    };
    let mask = tensor_file::read_tensor(bytes, path, "pixel_attention_mask")?;
    let (Some(m), true) = (mask.i64, mask.shape == [b, n]) else {
        return Err(Error::tensor(
            path,
            "pixel_attention_mask",
            format!("expected an integer tensor [{b}, {n}]"),
        ));
    };
    let mut batch = PixelBatch {
        pixel_values: Vec::new(),
        row_len: cols,
        grid_thw: Vec::with_capacity(b),
    };
    for (i, hw) in s.chunks_exact(2).enumerate() {
        let real = hw[0].saturating_mul(hw[1]);
        if hw[0] < 1 || hw[1] < 1 || real > n as i64 {
            return Err(Error::tensor(
                path,
                "spatial_shapes",
                format!("row {i} {hw:?}: expected a positive grid of at most {n} patches"),
            ));
        }
        let real = real as usize;
        let row = &m[i * n..(i + 1) * n];
        if row
            .iter()
            .enumerate()
            .any(|(k, &x)| x != i64::from(k < real))
        {
            return Err(Error::tensor(
                path,
                "pixel_attention_mask",
                format!(
                    "row {i}: expected 1 on the first {real} patches (spatial_shapes) and 0 after"
                ),
            ));
        }
        batch
            .pixel_values
            .extend_from_slice(&v[i * n * cols..(i * n + real) * cols]);
        batch.grid_thw.push([1, hw[0] as usize, hw[1] as usize]);
    }
    Ok(batch)
}

/// transformers' `pixel_values [B, 3, H, W]` as patch rows of side `p` in
/// raster order, (c, py, px) per row, and their grids; what a whole patch
/// does not cover on the right and bottom is dropped, as the patch
/// embedding's convolution drops it.
fn images_to_rows(path: &Path, v: &[f32], shape: &[usize], p: usize) -> crate::Result<PixelBatch> {
    let &[b, c, h, w] = shape else {
        unreachable!("called for 4-D tensors only")
    };
    if c != 3 || b == 0 || h < p || w < p {
        return Err(Error::tensor(
            path,
            "pixel_values",
            format!("{shape:?}: expected [B, 3, H, W] with B >= 1 and H, W >= the patch size {p}"),
        ));
    }
    if v.iter().any(|x| !x.is_finite()) {
        return Err(Error::tensor(path, "pixel_values", "holds NaN or Inf"));
    }
    let (gh, gw) = (h / p, w / p);
    let mut rows = Vec::with_capacity(b * gh * gw * 3 * p * p);
    for img in v.chunks_exact(3 * h * w) {
        for gy in 0..gh {
            for gx in 0..gw {
                for ch in 0..3 {
                    for py in 0..p {
                        let at = ch * h * w + (gy * p + py) * w + gx * p;
                        rows.extend_from_slice(&img[at..at + p]);
                    }
                }
            }
        }
    }
    Ok(PixelBatch {
        pixel_values: rows,
        row_len: 3 * p * p,
        grid_thw: vec![[1, gh, gw]; b],
    })
}

pub(super) fn run(a: ReferenceArgs) -> anyhow::Result<ExitCode> {
    let t0 = Instant::now();
    let dir = resolve_model(
        &a.model.model,
        a.model.revision.as_deref(),
        &super::hub_events(),
    )?;
    let ck = Model::open(&dir)?;
    if ck.vision.input().tokens().is_some() || !a.text.is_empty() {
        return run_text(&a, &ck, t0);
    }
    let pre = ck.image_processor()?;
    let from_images = a.pixel_values.is_none();
    let batch = match &a.pixel_values {
        Some(p) => {
            let fixed = pre.fixed.is_some();
            read_pixel_file(
                p,
                fixed
                    .then(|| ck.vision.pixels().map(|px| px.patch_size()))
                    .transpose()?,
            )?
        }
        None => {
            let parts = a
                .image
                .iter()
                .map(|img| preprocess_file(img, pre, DecodeLimits::default()).map(|p| p.batch))
                .collect::<crate::Result<Vec<_>>>()?;
            PixelBatch::concat(parts)?
        }
    };
    let tower = crate::family::reference_tower(&ck)?;
    if let Some(p) = &a.pixel_values {
        tower
            .check_grid(batch.rows(), batch.row_len, &batch.grid_thw)
            .map_err(|m| Error::tensor(p, "pixel_values", m.to_string()))?;
    }
    let load_s = t0.elapsed().as_secs_f64();

    let t1 = Instant::now();
    let pv = Tensor::from_slice(
        &batch.pixel_values,
        (batch.rows(), batch.row_len),
        &Device::Cpu,
    )?;
    let out = tower.forward(&pv, &batch.grid_thw, a.blocks)?;
    let forward_s = t1.elapsed().as_secs_f64();

    // The file names of the family's outputs (the patch count does not change them).
    let specs = ck.vision.outputs(0);
    let mut tensors = Vec::new();
    for (spec, t) in specs.iter().zip(&out.outputs) {
        tensors.push((
            spec.file_name.clone(),
            OwnedTensor::f32(t.dims().to_vec(), &to_vec(t)?),
        ));
    }
    for (i, t) in out.block_outputs.iter().enumerate() {
        tensors.push((
            format!("block.{i}"),
            OwnedTensor::f32(t.dims().to_vec(), &to_vec(t)?),
        ));
    }
    let grid: Vec<i64> = batch.grid_thw.iter().flatten().map(|&v| v as i64).collect();
    tensors.push((
        "grid_thw".into(),
        OwnedTensor::i64(vec![batch.grid_thw.len(), 3], &grid),
    ));
    if from_images {
        tensors.push((
            "pixel_values".into(),
            OwnedTensor::f32(vec![batch.rows(), batch.row_len], &batch.pixel_values),
        ));
    }
    tensor_file::write(&a.out, tensors, None)
        .with_context(|| format!("writing {}", a.out.display()))?;
    if let Some(w) = ck.weights.nonfinite_warning() {
        eprintln!("warning: {w}");
    }
    summary(
        &format!(
            "{} patches in {} images",
            batch.rows(),
            batch.grid_thw.len()
        ),
        &specs,
        &out,
        (load_s, forward_s),
    );
    Ok(ExitCode::SUCCESS)
}

/// The run's summary on stderr: what ran (`what`), the outputs' shapes,
/// the seconds loading and running and the peak memory.
fn summary(
    what: &str,
    specs: &[crate::family::OutputSpec],
    out: &crate::reference::TowerOutput,
    (load_s, forward_s): (f64, f64),
) {
    eprintln!(
        "reference: {what} -> {}",
        specs
            .iter()
            .zip(&out.outputs)
            .map(|(s, t)| format!("{} {:?}", s.file_name, t.dims()))
            .collect::<Vec<_>>()
            .join(", ")
    );
    eprintln!(
        "timing: load_s={load_s:.3} forward_s={forward_s:.3} peak_rss_mb={:.0}",
        peak_rss_mib().unwrap_or(f64::NAN)
    );
}

/// `reference --text`: each text tokenized by the checkpoint's tokenizer
/// (truncated to `--max-tokens`, else to the position table) and run
/// alone through the fp32 reference encoder.
fn run_text(a: &ReferenceArgs, ck: &Model, t0: Instant) -> anyhow::Result<ExitCode> {
    let tokens = ck.vision.tokens()?;
    let tok = ck.text_processor()?;
    if a.text.is_empty() || !a.image.is_empty() || a.pixel_values.is_some() {
        return Err(Error::Invalid(format!(
            "a {} model is a text encoder: give --text TEXT (images do not apply)",
            ck.family.name()
        ))
        .into());
    }
    let max = tokens.max_tokens();
    let limit = match a.max_tokens {
        Some(n) if n == 0 || n > max => {
            return Err(Error::Invalid(format!(
                "--max-tokens {n}: expected 1 to {max} (the checkpoint's position table)"
            ))
            .into());
        }
        Some(n) => n,
        None => max,
    };
    let texts = a
        .text
        .iter()
        .map(|t| tok.encode(t, limit))
        .collect::<crate::Result<Vec<_>>>()?;
    let encoder = crate::family::text_encoder(ck)?;
    let load_s = t0.elapsed().as_secs_f64();
    let t1 = Instant::now();
    let out = encoder.forward(&texts, a.blocks)?;
    let forward_s = t1.elapsed().as_secs_f64();
    let specs = ck.vision.outputs(0);
    let mut tensors = Vec::new();
    for (spec, t) in specs.iter().zip(&out.outputs) {
        tensors.push((
            spec.file_name.clone(),
            OwnedTensor::f32(t.dims().to_vec(), &to_vec(t)?),
        ));
    }
    let d = ck.vision.hidden_size();
    if let (Some(pool), Some(h)) = (tokens.sentence_pooling(), out.outputs.first()) {
        let rows = to_vec(h)?;
        let (mut pooled, mut start) = (Vec::new(), 0);
        for t in &texts {
            pooled.extend(pool.pool(&rows[start * d..(start + t.len()) * d], d));
            start += t.len();
        }
        tensors.push((
            "sentence_embedding".into(),
            OwnedTensor::f32(vec![texts.len(), d], &pooled),
        ));
    }
    for (i, t) in out.block_outputs.iter().enumerate() {
        tensors.push((
            format!("block.{i}"),
            OwnedTensor::f32(t.dims().to_vec(), &to_vec(t)?),
        ));
    }
    let ids: Vec<i64> = texts
        .iter()
        .flat_map(|t| t.ids.iter().map(|&i| i as i64))
        .collect();
    let lengths: Vec<i64> = texts.iter().map(|t| t.len() as i64).collect();
    tensors.push(("input_ids".into(), OwnedTensor::i64(vec![ids.len()], &ids)));
    tensors.push((
        "lengths".into(),
        OwnedTensor::i64(vec![lengths.len()], &lengths),
    ));
    tensor_file::write(&a.out, tensors, None)
        .with_context(|| format!("writing {}", a.out.display()))?;
    if let Some(w) = ck.weights.nonfinite_warning() {
        eprintln!("warning: {w}");
    }
    for (i, t) in texts.iter().enumerate() {
        if t.truncated() {
            eprintln!(
                "text {i}: truncated from {} to {} tokens",
                t.full_len,
                t.len()
            );
        }
    }
    summary(
        &format!("{} tokens in {} texts", ids.len(), texts.len()),
        &specs,
        &out,
        (load_s, forward_s),
    );
    Ok(ExitCode::SUCCESS)
}
