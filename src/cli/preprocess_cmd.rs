//! `ane-run preprocess`.

use std::collections::HashMap;
use std::process::ExitCode;

use anyhow::Context;

use super::PreprocessArgs;
use crate::checkpoint::{Checkpoint, resolve_model};
use crate::error::Error;
use crate::preprocess::{DecodeLimits, PixelBatch, preprocess_file};
use crate::tensor_file::{self, OwnedTensor};

pub(super) fn run(a: PreprocessArgs) -> anyhow::Result<ExitCode> {
    let dir = resolve_model(&a.model.model, a.model.revision.as_deref())?;
    let ck = Checkpoint::open(&dir)?;
    let mut cfg = ck.preprocessor.clone();
    if let Some(n) = a.max_patches {
        if n == 0 || n % 4 != 0 {
            return Err(Error::Invalid(format!(
                "--max-patches {n}: expected a positive multiple of 4"
            ))
            .into());
        }
        cfg.max_pixels = n * (cfg.patch_size * cfg.patch_size) as u64;
        cfg.min_pixels = cfg.min_pixels.min(cfg.max_pixels);
    }
    let mut parts = Vec::new();
    let mut sizes = Vec::new();
    for img in &a.image {
        let p = preprocess_file(img, &cfg, DecodeLimits::default())?;
        if let Some(n) = a.max_patches {
            let rows = p.batch.rows() as u64;
            if rows > n {
                return Err(Error::image(
                    img,
                    format!("needs {rows} patches, more than --max-patches {n}"),
                )
                .into());
            }
        }
        sizes.push(format!(
            "{}: {}x{} -> {}x{}",
            img.display(),
            p.original.0,
            p.original.1,
            p.resized.width,
            p.resized.height
        ));
        parts.push(p.batch);
    }
    let batch = PixelBatch::concat(parts)?;
    let grid: Vec<i64> = batch.grid_thw.iter().flatten().map(|&v| v as i64).collect();
    let mut meta = HashMap::new();
    meta.insert("images".to_string(), sizes.join("\n"));
    tensor_file::write(
        &a.out,
        vec![
            (
                "pixel_values".into(),
                OwnedTensor::f32(vec![batch.rows(), batch.row_len], &batch.pixel_values),
            ),
            (
                "grid_thw".into(),
                OwnedTensor::i64(vec![batch.grid_thw.len(), 3], &grid),
            ),
        ],
        Some(meta),
    )
    .with_context(|| format!("writing {}", a.out.display()))?;
    for s in sizes {
        eprintln!("{s}");
    }
    Ok(ExitCode::SUCCESS)
}
