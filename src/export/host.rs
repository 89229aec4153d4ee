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

/// One call's inputs, each flattened row-major in the shapes above.
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
        .map(|k| 1.0 / (cfg.rope_theta as f32).powf((2 * k) as f32 / (hd / 2) as f32))
        .collect();
    let mut r = 0usize;
    for &[gt, gh, gw] in &batch.grid_thw {
        let order = block_order(gh, gw, m);
        for _ in 0..gt {
            let start = r;
            for &(row, col) in &order {
                // Bilinear, align_corners: src = i * (S-1) / (size-1), in f32.
                let axis = |i: usize, size: usize| {
                    let src = i as f32 * (side - 1) as f32 / (size.max(2) - 1) as f32;
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
