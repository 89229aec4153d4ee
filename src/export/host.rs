//! Host-side inputs of an exported Qwen3-VL bucket: what must not be in the
//! graph (ANE-RULES R8, R10). Written independently of the reference tower
//! (which has its own position and rotary code) so that the cosine gate
//! compares two implementations.
//!
//! For a bucket of N patches and the images of one call (n <= N real rows):
//! * `patches [1, 3*P*P, 1, N]`: one temporal frame of each row, (c, py, px);
//! * `pos [1, D, 1, N]`: the learned position table, bilinearly interpolated
//!   (align_corners) to each image's grid, in merge-block order;
//! * `cos`, `sin [1, hd, 1, N]`: rotary tables `[row freqs, col freqs]` twice;
//! * `mask [1, N, N]`: 0 where query and key are in the same frame of the same
//!   image, -1e4 elsewhere; pad rows attend only to themselves.
//!
//! Pad rows stay finite: zero pixels and position, cos 1 and sin 0 (TOWERS.md).

use crate::checkpoint::Qwen3VisionConfig;
use crate::preprocess::PixelBatch;

/// The additive mask value (ANE-RULES R5: -1e4, never -inf).
pub const MASK_VALUE: f32 = -1e4;

/// How learned position tables are resampled to an image's grid.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PosInterpolation {
    /// Bilinear with the grid's corners on the table's corners
    /// (`src = i * (S-1) / (size-1)`), as Qwen3-VL's `fast_pos_embed_interpolate`.
    BilinearAlignCorners,
    /// Bilinear with half-pixel centres (`src = (i + 0.5) * S / size - 0.5`,
    /// clamped at the edges): what `align_corners=False` computes. Not
    /// Qwen3-VL's; written only by `build --fault pos-align` for the gates' tests.
    BilinearHalfPixel,
}

/// What the host computes besides the pixels, recorded in the artifact's
/// manifest (`host`) so that every runtime computes the inputs the package
/// was built for: the rotary base and the position-table resampling.
#[derive(Clone, Copy, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct HostRecipe {
    pub rope_theta: f64,
    pub pos_interpolation: PosInterpolation,
}

impl HostRecipe {
    /// The recipe of a Qwen3-VL vision config (what manifests without a
    /// `host` field were built with).
    pub fn of(cfg: &Qwen3VisionConfig) -> HostRecipe {
        HostRecipe {
            rope_theta: cfg.rope_theta,
            pos_interpolation: PosInterpolation::BilinearAlignCorners,
        }
    }

    /// The recipe's values, or the name of the field that is invalid.
    pub fn validate(&self) -> Result<(), String> {
        if !(self.rope_theta.is_finite() && self.rope_theta > 1.0) {
            return Err(format!(
                "host.rope_theta: expected a finite number > 1, got {}",
                self.rope_theta
            ));
        }
        Ok(())
    }
}

/// One call's inputs, each flattened row-major in the shapes above.
#[derive(Debug)]
pub struct HostInputs {
    pub patches: Vec<f32>,
    pub pos: Vec<f32>,
    pub cos: Vec<f32>,
    pub sin: Vec<f32>,
    pub mask: Vec<f32>,
    /// Real rows; outputs keep the first `real / 4` merged tokens.
    pub real: usize,
    pub bucket: usize,
}

impl HostInputs {
    /// (name, shape, values) of every input, as the package names them.
    pub fn named(&self, cfg: &Qwen3VisionConfig) -> Vec<(&'static str, Vec<usize>, &[f32])> {
        let n = self.bucket;
        let p = cfg.patch_size;
        vec![
            ("patches", vec![1, 3 * p * p, 1, n], &self.patches),
            ("pos", vec![1, cfg.hidden_size, 1, n], &self.pos),
            ("cos", vec![1, cfg.head_dim(), 1, n], &self.cos),
            ("sin", vec![1, cfg.head_dim(), 1, n], &self.sin),
            ("mask", vec![1, n, n], &self.mask),
        ]
    }
}

/// (row, col) of the tokens of an h x w grid in merge-block order.
fn block_order(h: usize, w: usize, m: usize) -> Vec<(usize, usize)> {
    let mut v = Vec::with_capacity(h * w);
    for br in 0..h / m {
        for bc in 0..w / m {
            for ir in 0..m {
                for ic in 0..m {
                    v.push((br * m + ir, bc * m + ic));
                }
            }
        }
    }
    v
}

/// Build the inputs of one call. `pos_table` is `[S*S, D]` row-major.
pub fn qwen3_vl(
    batch: &PixelBatch,
    cfg: &Qwen3VisionConfig,
    recipe: &HostRecipe,
    pos_table: &[f32],
    bucket: usize,
) -> Result<HostInputs, String> {
    let (p, t, d, m) = (
        cfg.patch_size,
        cfg.temporal_patch_size,
        cfg.hidden_size,
        cfg.spatial_merge_size,
    );
    let hd = cfg.head_dim();
    let n = batch.rows();
    if n > bucket {
        return Err(format!("{n} patches do not fit a bucket of {bucket}"));
    }
    if batch.row_len != cfg.patch_dim() {
        return Err(format!(
            "rows of {} values, the model expects {}",
            batch.row_len,
            cfg.patch_dim()
        ));
    }
    let cin = 3 * p * p;
    let mut patches = vec![0f32; cin * bucket];
    for r in 0..n {
        let row = &batch.pixel_values[r * batch.row_len..(r + 1) * batch.row_len];
        for c in 0..3 {
            for k in 0..p * p {
                // (c, t=0, py, px) -> channel (c, py, px)
                patches[(c * p * p + k) * bucket + r] = row[c * t * p * p + k];
            }
        }
    }
    let side = cfg.pos_side();
    let mut pos = vec![0f32; d * bucket];
    let mut cos = vec![1f32; hd * bucket];
    let mut sin = vec![0f32; hd * bucket];
    let mut mask = vec![MASK_VALUE; bucket * bucket];
    let quarter = hd / 4;
    let inv: Vec<f32> = (0..quarter)
        .map(|k| 1.0 / (recipe.rope_theta as f32).powf((2 * k) as f32 / (hd / 2) as f32))
        .collect();
    let mut r = 0usize;
    for &[gt, gh, gw] in &batch.grid_thw {
        let order = block_order(gh, gw, m);
        for _ in 0..gt {
            let start = r;
            for &(row, col) in &order {
                // Bilinear, align_corners: src = i * (S-1) / (size-1), in f32
                // (half-pixel centres only for the pos-align test fault).
                let axis = |i: usize, size: usize| {
                    let src = match recipe.pos_interpolation {
                        PosInterpolation::BilinearAlignCorners => {
                            i as f32 * (side - 1) as f32 / (size.max(2) - 1) as f32
                        }
                        PosInterpolation::BilinearHalfPixel => ((i as f32 + 0.5) * side as f32
                            / size as f32
                            - 0.5)
                            .clamp(0.0, (side - 1) as f32),
                    };
                    let f = src.floor();
                    let i0 = f as usize;
                    [
                        (i0.min(side - 1), (1.0 - (src - f)).max(0.0)),
                        (
                            (i0 + 1).min(side - 1),
                            (1.0 - (src - f - 1.0).abs()).max(0.0),
                        ),
                    ]
                };
                let (ys, xs) = (axis(row, gh), axis(col, gw));
                for (yi, wy) in ys {
                    for (xi, wx) in xs {
                        let wgt = wy * wx;
                        let base = (yi * side + xi) * d;
                        for c in 0..d {
                            pos[c * bucket + r] += pos_table[base + c] * wgt;
                        }
                    }
                }
                for (k, &f) in inv.iter().enumerate() {
                    let (a, b) = (row as f32 * f, col as f32 * f);
                    for half in [0, hd / 2] {
                        cos[(half + k) * bucket + r] = a.cos();
                        sin[(half + k) * bucket + r] = a.sin();
                        cos[(half + quarter + k) * bucket + r] = b.cos();
                        sin[(half + quarter + k) * bucket + r] = b.sin();
                    }
                }
                r += 1;
            }
            for q in start..r {
                mask[q * bucket + start..q * bucket + r].fill(0.0);
            }
        }
    }
    for q in n..bucket {
        mask[q * bucket + q] = 0.0;
    }
    Ok(HostInputs {
        patches,
        pos,
        cos,
        sin,
        mask,
        real: n,
        bucket,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::checkpoint::{Activation, Qwen3VisionConfig};

    fn cfg() -> Qwen3VisionConfig {
        Qwen3VisionConfig {
            depth: 1,
            hidden_size: 8,
            hidden_act: Activation::GeluTanh,
            intermediate_size: 8,
            num_heads: 2,
            in_channels: 3,
            patch_size: 2,
            spatial_merge_size: 2,
            temporal_patch_size: 2,
            out_hidden_size: 4,
            num_position_embeddings: 16,
            deepstack_visual_indexes: vec![],
            rope_theta: 10_000.0,
        }
    }

    #[test]
    fn padding_is_finite_and_isolated() {
        let c = cfg();
        // Two images of 2x2 and 2x4 patches: 4 + 8 = 12 rows in a bucket of 16.
        let rows = 12;
        let batch = PixelBatch {
            pixel_values: (0..rows * c.patch_dim()).map(|i| i as f32).collect(),
            row_len: c.patch_dim(),
            grid_thw: vec![[1, 2, 2], [1, 2, 4]],
        };
        let table: Vec<f32> = (0..16 * 8).map(|i| i as f32 * 0.01).collect();
        let h = qwen3_vl(&batch, &c, &HostRecipe::of(&c), &table, 16).unwrap();
        let n = 16;
        // Block-diagonal mask: image 1 rows 0..4, image 2 rows 4..12, pads attend to themselves.
        let m = |q: usize, k: usize| h.mask[q * n + k];
        assert_eq!(m(0, 3), 0.0);
        assert_eq!(m(0, 4), MASK_VALUE);
        assert_eq!(m(5, 11), 0.0);
        assert_eq!(m(11, 3), MASK_VALUE);
        for q in 12..16 {
            for k in 0..16 {
                assert_eq!(m(q, k), if q == k { 0.0 } else { MASK_VALUE });
            }
        }
        // Pad columns: zero pixels and position, cos 1, sin 0.
        for r in 12..16 {
            assert!((0..12).all(|ch| h.patches[ch * n + r] == 0.0));
            assert!((0..8).all(|ch| h.pos[ch * n + r] == 0.0));
            assert!((0..4).all(|ch| h.cos[ch * n + r] == 1.0 && h.sin[ch * n + r] == 0.0));
        }
        // Row 1 of image 1 is token (0, 1): first frame, channel (c=0, py=0, px=1) = value 1.
        assert_eq!(h.patches[n + 1], batch.pixel_values[c.patch_dim() + 1]);
        // Token 0 sits at grid corner (0, 0): position = table row 0.
        assert!((0..8).all(|ch| (h.pos[ch * n] - table[ch]).abs() < 1e-6));
        assert!(
            qwen3_vl(&batch, &c, &HostRecipe::of(&c), &table, 8)
                .unwrap_err()
                .contains("do not fit")
        );
    }
}
