//! The residual scale a build chooses when `--residual-scale` is not given:
//! the smallest power of two that leaves [`HEADROOM`] below the Neural
//! Engine's output ceiling for the residual stream's largest value, as the
//! fp32 reference computes it on the calibration images (the cosine gate's
//! default cases, the stress images among them), or for a text encoder on
//! the golden texts (the cosine gate's text cases).
//!
//! Why the stream: the values past fp16's reach in trained towers are
//! massive activations carried by the residual stream (a few channels of a
//! few tokens, written by one block's MLP and then carried), and the
//! projections that write the stream (the attention's output projection,
//! the MLP's down projection) are 1x1 convolutions, whose outputs the
//! Neural Engine turns into infinity past 32,752 ([`MATMUL_OUTPUT_LIMIT`]).
//! Dividing the stream by S divides every such value by S and costs the
//! norms nothing (they normalise the scale away); the values inside a
//! branch (an MLP's hidden layer) are the branch's own and are not moved
//! by S: the gate's headroom report shows them op by op.
//!
//! Why the smallest: scaling far beyond need costs natural images their
//! precision (small values nearer fp16's subnormals, the norms' epsilon
//! weighing S^2 more), so a tower whose stream fits keeps S = 1.

use std::path::PathBuf;

use candle_core::{Device, Tensor};

use crate::error::{Error, Result};
use crate::family::Model;
use crate::gate::cosine::{Case, fit};

/// The largest magnitude a matmul or convolution output keeps on the
/// Neural Engine: past it the output becomes infinite, independently of
/// the reduction length (ANEForge, docs/numeric-cliffs.md, "Matmul output
/// saturation": measured on M1 to M5; ane-guide, "Saturation hazard":
/// 32,752 passes, the next fp16 value, 32,768, is infinite).
pub const MATMUL_OUTPUT_LIMIT: f32 = 32_752.0;

/// How far below [`MATMUL_OUTPUT_LIMIT`] the scaled stream's calibrated
/// peak must stay: a factor of 4 (two powers of two) for images that drive
/// the stream harder than the calibration images do.
pub const HEADROOM: f32 = 4.0;

/// The largest residual scale a build makes (`--residual-scale`'s range).
pub const MAX_SCALE: u32 = 4096;

/// What the calibration found and chose, recorded in the manifest
/// (`calibration`).
#[derive(Clone, Debug, serde::Serialize, serde::Deserialize, PartialEq)]
pub struct Calibration {
    /// The chosen residual scale (1: the stream as it is).
    pub residual_scale: u32,
    /// The residual stream's largest magnitude in the fp32 reference, over
    /// every calibration image and bucket.
    pub stream_peak: f32,
    /// The image that gave it, by file name.
    pub image: String,
    /// The bucket it ran in.
    pub bucket: String,
    /// The block after which the stream held it (0-based).
    pub block: usize,
    /// The ceiling the scaled peak is kept under, and the factor below it.
    pub limit: f32,
    pub headroom: f32,
    /// Whether even [`MAX_SCALE`] leaves less than the headroom.
    pub short: bool,
    /// The reference runs made (an image in a bucket, distinct grids).
    pub runs: usize,
}

impl Calibration {
    /// One line for the build's progress.
    pub fn summary(&self) -> String {
        let scaled = self.stream_peak / self.residual_scale as f32;
        let mut s = format!(
            "residual scale {} chosen: the fp32 reference's residual stream peaks at {:.0} (after block {}, {} \
             in {}; {} runs), {:.0} scaled, against {:.0} / {} = {:.0}",
            self.residual_scale,
            self.stream_peak,
            self.block,
            self.image,
            self.bucket,
            self.runs,
            scaled,
            self.limit,
            self.headroom,
            self.limit / self.headroom
        );
        if self.short {
            s.push_str(&format!(
                "; even {MAX_SCALE} leaves less than the headroom: the gate will judge"
            ));
        }
        s
    }
}

/// Whether `x` is at most `limit` (never for a NaN).
fn within(x: f32, limit: f32) -> bool {
    x <= limit
}

/// The smallest power of two S (1 to [`MAX_SCALE`]) with `peak / S` at
/// most `limit / headroom`, and whether even the largest falls short.
pub fn choose_scale(peak: f32, limit: f32, headroom: f32) -> (u32, bool) {
    let target = limit / headroom;
    let mut s = 1u32;
    while s < MAX_SCALE && !within(peak / s as f32, target) {
        s *= 2;
    }
    (s, !within(peak / s as f32, target))
}

/// Run the fp32 reference of `model` on every single-image case of `cases`
/// in every bucket (`(name, slots)`) it fits, once per distinct grid,
/// and choose the scale from the residual stream's largest magnitude.
pub fn calibrate(
    model: &Model,
    buckets: &[(String, usize)],
    cases: &[Case],
) -> Result<Calibration> {
    if model.vision.input().tokens().is_some() {
        return calibrate_text(model, buckets, cases);
    }
    let tower = crate::family::reference_tower(model)?;
    let cfg = &model.vision;
    let px = cfg.pixels()?;
    let pre = model.image_processor()?;
    let mut seen: Vec<(PathBuf, Vec<[usize; 3]>)> = Vec::new();
    let mut best: Option<(f32, String, String, usize)> = None;
    for case in cases.iter().filter(|c| c.images.len() == 1) {
        for (bucket, slots) in buckets {
            let batch = fit(cfg, &case.images, pre, *slots)?;
            if px.slots(&batch.grid_thw) > *slots {
                continue;
            }
            let key = (case.images[0].clone(), batch.grid_thw.clone());
            if seen.contains(&key) {
                continue;
            }
            seen.push(key);
            let pv = Tensor::from_slice(
                &batch.pixel_values,
                (batch.rows(), batch.row_len),
                &Device::Cpu,
            )
            .map_err(Error::from)?;
            let out = tower.forward(&pv, &batch.grid_thw, true)?;
            for (block, t) in out.block_outputs.iter().enumerate() {
                let peak = max_abs(t)?;
                if best.as_ref().is_none_or(|b| !within(peak, b.0)) {
                    best = Some((peak, case.name.clone(), bucket.clone(), block));
                }
            }
        }
    }
    let (peak, image, bucket, block) = best.ok_or_else(|| {
        Error::Invalid(
            "calibration: no calibration image fits any bucket; give --residual-scale".into(),
        )
    })?;
    let (residual_scale, short) = choose_scale(peak, MATMUL_OUTPUT_LIMIT, HEADROOM);
    Ok(Calibration {
        residual_scale,
        stream_peak: peak,
        image,
        bucket,
        block,
        limit: MATMUL_OUTPUT_LIMIT,
        headroom: HEADROOM,
        short,
        runs: seen.len(),
    })
}

/// A text encoder's calibration: each text case tokenized as the runtime
/// does for the largest bucket (a text shorter than it runs the same in
/// every bucket: padding is masked), the family's stream peaks
/// ([`crate::reference::TextEncoder::stream_peaks`]) over every text.
fn calibrate_text(
    model: &Model,
    buckets: &[(String, usize)],
    cases: &[Case],
) -> Result<Calibration> {
    let encoder = crate::family::text_encoder(model)?;
    let tok = model.text_processor()?;
    let (bucket, largest) = buckets
        .iter()
        .max_by_key(|b| b.1)
        .ok_or_else(|| Error::Invalid("calibration: no bucket".into()))?;
    let mut best: Option<(f32, String, usize)> = None;
    let mut runs = 0;
    for case in cases {
        let Some(text) = &case.text else { continue };
        let tokens = tok.encode(text, *largest)?;
        runs += 1;
        for (block, peak) in encoder.stream_peaks(&tokens)?.into_iter().enumerate() {
            if best.as_ref().is_none_or(|b| !within(peak, b.0)) {
                best = Some((peak, case.name.clone(), block));
            }
        }
    }
    let (peak, image, block) = best.ok_or_else(|| {
        Error::Invalid("calibration: no calibration text; give --residual-scale".into())
    })?;
    let (residual_scale, short) = choose_scale(peak, MATMUL_OUTPUT_LIMIT, HEADROOM);
    Ok(Calibration {
        residual_scale,
        stream_peak: peak,
        image,
        bucket: bucket.clone(),
        block,
        limit: MATMUL_OUTPUT_LIMIT,
        headroom: HEADROOM,
        short,
        runs,
    })
}

/// The largest magnitude in `t` (infinite where it holds a NaN).
fn max_abs(t: &Tensor) -> Result<f32> {
    let v: Vec<f32> = t
        .flatten_all()
        .and_then(|t| t.to_dtype(candle_core::DType::F32))
        .and_then(|t| t.to_vec1())
        .map_err(Error::from)?;
    Ok(crate::interp::max_abs(&v))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_smallest_power_of_two_with_the_headroom_is_chosen() {
        let t = MATMUL_OUTPUT_LIMIT / HEADROOM; // 8,188
        assert_eq!(choose_scale(0.0, MATMUL_OUTPUT_LIMIT, HEADROOM), (1, false));
        assert_eq!(choose_scale(t, MATMUL_OUTPUT_LIMIT, HEADROOM), (1, false));
        assert_eq!(
            choose_scale(t + 1.0, MATMUL_OUTPUT_LIMIT, HEADROOM),
            (2, false)
        );
        // A stream at 40,000 (past the ceiling, under fp16's maximum): 8.
        assert_eq!(
            choose_scale(40_000.0, MATMUL_OUTPUT_LIMIT, HEADROOM),
            (8, false)
        );
        assert_eq!(
            choose_scale(70_000.0, MATMUL_OUTPUT_LIMIT, HEADROOM),
            (16, false)
        );
        assert_eq!(
            choose_scale(1e9, MATMUL_OUTPUT_LIMIT, HEADROOM),
            (MAX_SCALE, true)
        );
        assert_eq!(
            choose_scale(f32::INFINITY, MATMUL_OUTPUT_LIMIT, HEADROOM),
            (MAX_SCALE, true)
        );
        assert_eq!(
            choose_scale(f32::NAN, MATMUL_OUTPUT_LIMIT, HEADROOM),
            (MAX_SCALE, true)
        );
    }

    #[test]
    fn max_abs_sees_negative_peaks_and_nan() {
        let t = Tensor::new(&[[1f32, -5.0], [3.0, 2.0]], &Device::Cpu).unwrap();
        assert_eq!(max_abs(&t).unwrap(), 5.0);
        let t = Tensor::new(&[1f32, f32::NAN], &Device::Cpu).unwrap();
        assert_eq!(max_abs(&t).unwrap(), f32::INFINITY);
    }
}
