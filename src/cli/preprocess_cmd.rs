//! `ane-run preprocess`.

use std::collections::HashMap;
use std::process::ExitCode;

use anyhow::Context;

use super::{HostInputsArgs, PreprocessArgs};
use crate::checkpoint::resolve_model;
use crate::error::{Error, ImageError};
use crate::family::Model;
use crate::preprocess::{DecodeLimits, PixelBatch, preprocess_file};
use crate::tensor_file::{self, OwnedTensor};

pub(super) fn run(a: PreprocessArgs) -> anyhow::Result<ExitCode> {
    let dir = resolve_model(
        &a.model.model,
        a.model.revision.as_deref(),
        &super::hub_events(),
    )?;
    let ck = Model::open(&dir)?;
    let mut cfg = ck.image_processor()?.clone();
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
                    ImageError::TooManyPatches {
                        patches: rows,
                        max: n,
                    },
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

pub(super) fn host_inputs(a: HostInputsArgs) -> anyhow::Result<ExitCode> {
    let art = crate::artifact::Artifact::open(&a.artifact)?;
    let tables = art.host_tables()?;
    let (cfg, pre) = (art.cfg.clone(), art.image_processor()?.clone());
    let buckets: Vec<(String, usize)> = art
        .buckets
        .iter()
        .map(|b| (b.name.clone(), b.patches))
        .collect();
    // Each image is resized to fit the largest bucket; the call then goes to
    // the smallest bucket that holds all its slots.
    let largest = buckets.iter().map(|b| b.1).max().unwrap_or(0);
    let parts = a
        .image
        .iter()
        .map(|i| {
            cfg.fitting(&pre, largest, |pre| {
                let b = preprocess_file(i, pre, DecodeLimits::default())?.batch;
                let grid = b.grid_thw.clone();
                Ok((b, grid))
            })
        })
        .collect::<crate::Result<Vec<_>>>()?;
    let batch = PixelBatch::concat(parts)?;
    let slots = cfg.pixels()?.slots(&batch.grid_thw);
    let (name, n) = match &a.bucket {
        Some(b) => buckets.iter().find(|x| &x.0 == b).cloned().ok_or_else(|| {
            Error::Invalid(format!(
                "unknown bucket `{b}`; the artifact has: {}",
                buckets
                    .iter()
                    .map(|x| x.0.clone())
                    .collect::<Vec<_>>()
                    .join(", ")
            ))
        })?,
        None => {
            let mut fit: Vec<_> = buckets.iter().filter(|x| x.1 >= slots).cloned().collect();
            fit.sort_by_key(|x| x.1);
            fit.into_iter()
                .next()
                .ok_or_else(|| Error::Invalid(format!("{slots} slots fit no bucket")))?
        }
    };
    let px = cfg.pixels()?;
    let inputs = px
        .host_inputs(&art.host, &tables, &batch, n)
        .map_err(|m| Error::Invalid(format!("bucket {name}: {m}")))?;
    let unit = px.merge_size() * px.merge_size();
    let columns = inputs.token_columns(unit);
    let contiguous = columns.iter().enumerate().all(|(i, &c)| i == c);
    let token_columns = serde_json::to_string(&columns).unwrap_or_default();
    let tensors = inputs
        .named()
        .into_iter()
        .map(|(k, shape, v)| (k.to_string(), OwnedTensor::f32(shape.to_vec(), v)))
        .collect();
    let mut meta = HashMap::new();
    meta.insert("bucket".to_string(), name.clone());
    meta.insert("real_patches".to_string(), batch.rows().to_string());
    meta.insert("grid_thw".to_string(), format!("{:?}", batch.grid_thw));
    meta.insert("token_columns".to_string(), token_columns);
    tensor_file::write(&a.out, tensors, Some(meta))
        .with_context(|| format!("writing {}", a.out.display()))?;
    eprintln!(
        "bucket {name}: {} real patches in {slots} of {n} slots; outputs keep {}",
        batch.rows(),
        if contiguous {
            format!("the first {} tokens", columns.len())
        } else {
            format!(
                "{} tokens, at the columns in metadata `token_columns`",
                columns.len()
            )
        }
    );
    Ok(ExitCode::SUCCESS)
}
