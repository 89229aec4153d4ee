//! SigLIP2's host inputs of one call of a bucket (see [`crate::host`]
//! for what all families share); its tensors in the ANE layout are in
//! [`super::layout`].
//!
//! A SigLIP2 bucket is a patch budget, as transformers' `max_num_patches`:
//! a call is one image, resized by the processor to keep its aspect ratio
//! within the budget, its `h x w` patches in the first columns and the rest
//! padding. The inputs:
//! * `patches [1, 3*P*P, 1, N]`: the image's patch rows in raster order,
//!   (py, px, c) each as the processor makes them; pad columns zero;
//! * `positions [1, D, 1, N]`: the checkpoint's `g x g` table (`pos_table`
//!   in `host.safetensors`) resized to `h x w` as transformers'
//!   `resize_positional_embeddings` does (bilinear, antialiased, even at the
//!   table's own size); pad columns hold the first resized row, as there;
//! * `mask [1, N, N]`: 0 where the key is a real patch, -1e4 where it is a
//!   pad (every query, pads included, attends the real keys alone, as
//!   transformers' key-padding mask does). The pooling head's probe reads
//!   row 0.
//!
//! The output `last_hidden_state [1, D, 1, N]` has the image's tokens in
//! its first `h * w` columns; `pooler_output [1, D, 1, 1]` with the head.

use crate::checkpoint::Checkpoint;
use crate::error::Result;
use crate::family::siglip2::Siglip2VisionConfig;
use crate::host::channels_first;
use crate::host::{
    HostError, HostInputs, HostRecipe, HostTable, MASK_VALUE, PosInterpolation, Taps,
    antialias_taps, pack_patches,
};
use crate::preprocess::PixelBatch;

/// The host side of a SigLIP2 bucket.
pub struct Naflex {
    pub patch: usize,
    /// Side of the position table's square grid, and its rows' width.
    pub grid: usize,
    pub hidden: usize,
}

/// The host of a config.
pub fn host(c: &Siglip2VisionConfig) -> Naflex {
    Naflex {
        patch: c.patch_size,
        grid: c.table_side(),
        hidden: c.hidden_size,
    }
}

impl Naflex {
    /// The tables `host.safetensors` holds: `pos_table [g*g, D]`.
    pub fn table_shapes(&self) -> Vec<(String, Vec<usize>)> {
        vec![("pos_table".into(), vec![self.grid * self.grid, self.hidden])]
    }

    /// Those tables, read from the checkpoint.
    pub fn tables(&self, ck: &Checkpoint) -> Result<Vec<HostTable>> {
        let shape = vec![self.grid * self.grid, self.hidden];
        let v = ck
            .tensor("embeddings.position_embedding.weight", &shape)?
            .flatten_all()?
            .to_vec1::<f32>()?;
        Ok(vec![("pos_table".into(), shape, v)])
    }

    /// What the host computes: the table resized bilinearly with antialiasing.
    pub fn recipe(&self) -> HostRecipe {
        HostRecipe {
            output_scale: None,
            rope_theta: None,
            pos_interpolation: Some(PosInterpolation::BilinearAntialias),
        }
    }

    /// The inputs of a bucket of `n` slots, in order: `patches`, `positions`, `mask`.
    pub fn input_shapes(&self, n: usize) -> Vec<(String, Vec<usize>)> {
        vec![
            ("patches".into(), vec![1, 3 * self.patch * self.patch, 1, n]),
            ("positions".into(), vec![1, self.hidden, 1, n]),
            ("mask".into(), vec![1, n, n]),
        ]
    }

    /// The inputs of one call: one image of at most `bucket` patches.
    pub fn inputs(
        &self,
        recipe: &HostRecipe,
        table: &[f32],
        batch: &PixelBatch,
        bucket: usize,
    ) -> std::result::Result<HostInputs, HostError> {
        let (g, d, p) = (self.grid, self.hidden, self.patch);
        let &[[t, h, w]] = batch.grid_thw.as_slice() else {
            return Err(HostError::Batch(format!(
                "a SigLIP2 call takes one image, got {}",
                batch.grid_thw.len()
            )));
        };
        let real = h * w;
        if t != 1 || real == 0 || real != batch.rows() || real > bucket {
            return Err(HostError::DoesNotFit(format!(
                "an image of {t} x {h} x {w} patches ({} rows) does not fit a SigLIP2 bucket of {bucket} patches",
                batch.rows()
            )));
        }
        if table.len() != g * g * d {
            return Err(HostError::TableSize {
                name: "pos_table",
                got: table.len(),
                rows: g * g,
                cols: d,
            });
        }
        let patches = pack_patches(batch, p, 1, 3 * p * p, bucket)?;
        let mut rows = match recipe.pos_interpolation {
            Some(PosInterpolation::BilinearAntialias) => resize_bilinear(table, g, d, (h, w), true),
            Some(PosInterpolation::BilinearHalfPixel) => {
                resize_bilinear(table, g, d, (h, w), false)
            }
            other => {
                return Err(HostError::Recipe {
                    field: "host.pos_interpolation",
                    msg: format!(
                        "{other:?}; a SigLIP2 table is resized bilinearly (`bilinear_antialias`)"
                    ),
                });
            }
        };
        let first = rows[..d].to_vec();
        for _ in real..bucket {
            rows.extend_from_slice(&first);
        }
        let mut mask = vec![0f32; bucket * bucket];
        for q in mask.chunks_exact_mut(bucket) {
            q[real..].fill(MASK_VALUE);
        }
        Ok(HostInputs {
            tensors: vec![
                ("patches".into(), vec![1, 3 * p * p, 1, bucket], patches),
                (
                    "positions".into(),
                    vec![1, d, 1, bucket],
                    channels_first(&rows, bucket, d),
                ),
                ("mask".into(), vec![1, bucket, bucket], mask),
            ],
            real,
            bucket,
            slots: None,
        })
    }
}

/// Resize a `g x g` grid of rows of `d` channels (`table`, `[g*g, d]`) to
/// `h x w` with PyTorch's bilinear `interpolate` (`align_corners=False`),
/// antialiased or not, in f32 as PyTorch computes it on a CPU: along the
/// width, then the height; rows `[h*w, d]`.
pub fn resize_bilinear(
    table: &[f32],
    g: usize,
    d: usize,
    (h, w): (usize, usize),
    antialias: bool,
) -> Vec<f32> {
    let (taps_w, taps_h) = (
        bilinear_taps(g, w, antialias),
        bilinear_taps(g, h, antialias),
    );
    crate::host::separable(table, g, d, (h, w), (&taps_w, &taps_h))
}

/// For each of `out` samples from `inp`: the first source sample and the
/// weights of it and the following ones. Antialiased, the triangle is
/// stretched by the scale when shrinking and its weights normalised
/// (`_upsample_bilinear2d_aa`); plain, the two samples around
/// `(i + 0.5) * scale - 0.5`, clamped at 0 below and at the last above.
fn bilinear_taps(inp: usize, out: usize, antialias: bool) -> Vec<Taps> {
    let scale = inp as f32 / out as f32;
    (0..out)
        .map(|i| {
            if antialias {
                antialias_taps(inp, out, i, 1.0, |x| (1.0 - x.abs()).max(0.0))
            } else {
                let src = (scale * (i as f32 + 0.5) - 0.5).max(0.0);
                let x0 = (src as usize).min(inp - 1);
                let x1 = (x0 + 1).min(inp - 1);
                let t = src - x0 as f32;
                if x1 == x0 {
                    (x0, vec![1.0])
                } else {
                    (x0, vec![1.0 - t, t])
                }
            }
        })
        .collect()
}
