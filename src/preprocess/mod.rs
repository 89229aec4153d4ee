//! Host-side preprocessing, matching transformers' Qwen2-VL image processor
//! (which Qwen2-VL, Qwen2.5-VL and Qwen3-VL all use for still images).
//!
//! decode -> RGB -> `smart_resize` -> bicubic resize with antialias ->
//! rescale and normalise (f32) -> duplicate to `temporal_patch_size` frames ->
//! patchify into merge-block order -> `pixel_values [n, C*T*P*P]`, `grid_thw`.

pub mod decode;
#[cfg(feature = "libjpeg-turbo")]
pub mod jpeg;
pub mod resize;
pub mod text;

use std::path::Path;

mod config;
mod patchify;
mod sizing;

pub use config::*;
pub use decode::{DecodeLimits, RgbImage, decode_rgb, load_rgb};
pub use patchify::{PixelBatch, patchify};
pub use resize::{Filter, ResizeKernel, resize_rgb};
pub use sizing::{naflex_size, resize_for_model, smart_resize};
pub use text::{TextProcessor, TokenBatch};

use crate::error::{Error, Result};
pub use crate::error::{ImageError, PreprocessError};

/// Decoded, resized and patchified image, with the intermediate sizes kept for reports.
#[derive(Clone, Debug)]
pub struct Preprocessed {
    pub original: (usize, usize),
    pub resized: RgbImage,
    pub batch: PixelBatch,
}

/// The whole host-side pipeline for one image file.
pub fn preprocess_file(
    path: &Path,
    cfg: &ImageProcessorConfig,
    limits: DecodeLimits,
) -> Result<Preprocessed> {
    let img = load_rgb(path, limits)?;
    preprocess_rgb(img, cfg).map_err(|m| Error::image(path, ImageError::Preprocess(m)))
}

/// The pipeline after decoding.
pub fn preprocess_rgb(
    img: RgbImage,
    cfg: &ImageProcessorConfig,
) -> std::result::Result<Preprocessed, PreprocessError> {
    let original = (img.width, img.height);
    let resized = resize_for_model(&img, cfg)?;
    let batch = patchify(&resized, cfg);
    Ok(Preprocessed {
        original,
        resized,
        batch,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn smart_resize_matches_python() {
        // Values computed with transformers' smart_resize (factor 32, Qwen3-VL limits).
        let f = |h, w| smart_resize(h, w, 32, 65_536, 16_777_216).unwrap();
        assert_eq!(f(300, 300), (288, 288));
        assert_eq!(f(1010, 1030), (1024, 1024));
        assert_eq!(f(12, 20), (224, 352));
        // Half to even: 48 / 32 = 1.5 rounds to 2.
        assert_eq!(smart_resize(48, 48, 32, 0, u64::MAX).unwrap(), (64, 64));
        assert!(smart_resize(20, 4001, 32, 0, u64::MAX).is_err());
        // A bucket's budget is a hard limit: a tiny image raised to the
        // minimum, and an extreme aspect ratio, stay within 128 patches.
        let cap = 128 * 256;
        let (h, w) = smart_resize(12, 20, 32, cap, cap).unwrap();
        assert!(h * w <= cap as usize && (h, w) == (128, 224), "{h}x{w}");
        let (h, w) = smart_resize(20, 3200, 32, cap, cap).unwrap();
        assert!(h * w <= cap as usize && h == 32, "{h}x{w}");
        let e = smart_resize(20, 20, 32, 0, 500).unwrap_err();
        assert_eq!(
            e,
            PreprocessError::BudgetTooSmall {
                max_pixels: 500,
                factor: 32
            }
        );
        assert_eq!(
            e.to_string(),
            "a budget of 500 pixels cannot hold one 32x32 block"
        );
        let e = smart_resize(20, 4001, 32, 0, u64::MAX).unwrap_err();
        assert!(
            matches!(
                e,
                PreprocessError::AspectRatio {
                    width: 4001,
                    height: 20,
                    ..
                }
            ),
            "{e:?}"
        );
        assert_eq!(
            e.to_string(),
            "aspect ratio 200.1 (4001x20) is above the limit of 200"
        );
        assert_eq!(
            smart_resize(0, 5, 32, 0, 500),
            Err(PreprocessError::ZeroSize {
                width: 5,
                height: 0
            })
        );
        // Over the budget: scaled down, then floored to the factor.
        assert_eq!(
            smart_resize(1000, 1000, 32, 0, 1024 * 256).unwrap(),
            (512, 512)
        );
        assert_eq!(
            smart_resize(1000, 700, 32, 0, 1024 * 256).unwrap(),
            (608, 416)
        );
    }

    #[test]
    fn patchify_orders_merge_blocks() {
        let cfg = ImageProcessorConfig {
            do_normalize: false,
            do_rescale: false,
            ..ImageProcessorConfig::qwen2_vl_processor(
                (1, 2, 2),
                (65_536, 16_777_216),
                [0.5; 3],
                [0.5; 3],
            )
        };
        // 4x4 image, pixel value = 10*row + col in every channel.
        let mut data = Vec::new();
        for y in 0..4u8 {
            for x in 0..4u8 {
                data.extend_from_slice(&[10 * y + x; 3]);
            }
        }
        let b = patchify(
            &RgbImage {
                width: 4,
                height: 4,
                data,
            },
            &cfg,
        );
        assert_eq!(b.grid_thw, vec![[1, 4, 4]]);
        assert_eq!(b.row_len, 6);
        let first: Vec<f32> = (0..16).map(|r| b.pixel_values[r * 6]).collect();
        let expect = [
            0., 1., 10., 11., 2., 3., 12., 13., 20., 21., 30., 31., 22., 23., 32., 33.,
        ];
        assert_eq!(first, expect);
        // Both temporal frames hold the same value.
        assert!(b.pixel_values.chunks(2).all(|p| p[0] == p[1]));
    }
}
