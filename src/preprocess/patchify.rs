//! Rescale, normalise and cut a resized image into patch rows, in the
//! order the processor gives them (merge blocks for Qwen-VL, raster for the
//! encoders): [`PixelBatch`].

use super::*;
use crate::error::{PreprocessError, Result};

/// One preprocessed image (or a batch of them, concatenated).
#[derive(Clone, Debug)]
pub struct PixelBatch {
    /// `[n, 3*T*P*P]` row major; rows in merge-block order per image.
    pub pixel_values: Vec<f32>,
    /// Columns per row.
    pub row_len: usize,
    /// `(t, h, w)` in patches, one per image.
    pub grid_thw: Vec<[usize; 3]>,
}

impl PixelBatch {
    /// Total number of patch rows.
    pub fn rows(&self) -> usize {
        self.pixel_values.len() / self.row_len.max(1)
    }

    /// Concatenate several batches into one call.
    pub fn concat(parts: Vec<PixelBatch>) -> Result<PixelBatch> {
        let row_len = parts.first().map_or(0, |p| p.row_len);
        let mut out = PixelBatch {
            pixel_values: Vec::new(),
            row_len,
            grid_thw: Vec::new(),
        };
        for p in parts {
            if p.row_len != row_len {
                return Err(PreprocessError::RowLengths(row_len, p.row_len).into());
            }
            out.pixel_values.extend(p.pixel_values);
            out.grid_thw.extend(p.grid_thw);
        }
        Ok(out)
    }
}

/// Rescale and normalise one 8-bit level in channel `c` exactly as the chosen
/// backend does in f32.
pub(super) fn normalise_table(cfg: &ImageProcessorConfig) -> [[f32; 256]; 3] {
    let mut t = [[0f32; 256]; 3];
    for (c, tc) in t.iter_mut().enumerate() {
        for (l, v) in tc.iter_mut().enumerate() {
            *v = match (cfg.kernel, cfg.do_rescale, cfg.do_normalize) {
                // torchvision fuses rescale into mean and std: (x - m/r) / (s/r).
                (ResizeKernel::Torchvision, true, true) => {
                    let inv = (1.0 / cfg.rescale_factor) as f32;
                    (l as f32 - cfg.image_mean[c] * inv) / (cfg.image_std[c] * inv)
                }
                // numpy: rescale in f64, cast to f32, then (x - m) / s in f32.
                (_, true, norm) => {
                    let x = (l as f64 * cfg.rescale_factor) as f32;
                    if norm {
                        (x - cfg.image_mean[c]) / cfg.image_std[c]
                    } else {
                        x
                    }
                }
                (_, false, true) => (l as f32 - cfg.image_mean[c]) / cfg.image_std[c],
                (_, false, false) => l as f32,
            };
        }
    }
    t
}

/// Patchify a resized image into merge-block order.
///
/// Rows are ordered (block_row, block_col, in_row, in_col); each row holds
/// (c, t, py, px) with the still image repeated over the T temporal frames.
pub fn patchify(img: &RgbImage, cfg: &ImageProcessorConfig) -> PixelBatch {
    let (p, m, t) = (cfg.patch_size, cfg.merge_size, cfg.temporal_patch_size);
    let (gh, gw) = (img.height / p, img.width / p);
    let table = normalise_table(cfg);
    if cfg.max_num_patches.is_some() {
        return patchify_channels_last(img, p, &table);
    }
    let row_len = cfg.row_len();
    let mut out = vec![0f32; gh * gw * row_len];
    let mut r = 0;
    for br in 0..gh / m {
        for bc in 0..gw / m {
            for ir in 0..m {
                for ic in 0..m {
                    let (pr, pc) = (br * m + ir, bc * m + ic);
                    let row = &mut out[r * row_len..(r + 1) * row_len];
                    for c in 0..3 {
                        for py in 0..p {
                            let y = pr * p + py;
                            for px in 0..p {
                                let x = pc * p + px;
                                let v = table[c][img.data[(y * img.width + x) * 3 + c] as usize];
                                for ti in 0..t {
                                    row[((c * t + ti) * p + py) * p + px] = v;
                                }
                            }
                        }
                    }
                    r += 1;
                }
            }
        }
    }
    PixelBatch {
        pixel_values: out,
        row_len,
        grid_thw: vec![[1, gh, gw]],
    }
}

/// SigLIP2's `convert_image_to_patches`: rows in raster order of patches,
/// each (py, px, c).
pub(super) fn patchify_channels_last(
    img: &RgbImage,
    p: usize,
    table: &[[f32; 256]; 3],
) -> PixelBatch {
    let (gh, gw) = (img.height / p, img.width / p);
    let row_len = 3 * p * p;
    let mut out = Vec::with_capacity(gh * gw * row_len);
    for pr in 0..gh {
        for pc in 0..gw {
            for py in 0..p {
                let y = pr * p + py;
                for px in 0..p {
                    let x = pc * p + px;
                    for (c, tc) in table.iter().enumerate() {
                        out.push(tc[img.data[(y * img.width + x) * 3 + c] as usize]);
                    }
                }
            }
        }
    }
    PixelBatch {
        pixel_values: out,
        row_len,
        grid_thw: vec![[1, gh, gw]],
    }
}
