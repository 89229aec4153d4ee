//! Qwen3-VL's host inputs of one call of a bucket (see [`crate::host`]
//! for what all families share); its tensors in the ANE layout are in
//! [`super::layout`].
//!
//! Inputs for a bucket of N patches and the images of one call (n <= N real
//! rows):
//! * `patches [1, 3*P*P, 1, N]`: one temporal frame of each row, (c, py, px);
//! * `pos [1, D, 1, N]`: the learned position table, bilinearly interpolated
//!   (align_corners) to each image's grid, in merge-block order;
//! * `cos`, `sin [1, hd, 1, N]`: rotary tables `[row freqs, col freqs]` twice;
//! * `mask [1, N, N]`: 0 where query and key are in the same frame of the same
//!   image, -1e4 elsewhere; pad rows attend to the first pad slot alone
//!   ([`crate::host`]).
//!
//! Pad rows stay finite: zero pixels and position, cos 1 and sin 0 (TOWERS.md).

use crate::checkpoint::Checkpoint;
use crate::error::Result;
use crate::family::qwen3_vl::Qwen3VisionConfig;
use crate::host::{
    HostError, HostInputs, HostRecipe, HostTable, PosInterpolation, block_order, frame_mask,
    pack_patches, rotary_tables,
};
use crate::preprocess::PixelBatch;

/// The inputs of a Qwen3-VL bucket of `n` patches, in order: (name, shape).
pub fn input_shapes(cfg: &Qwen3VisionConfig, n: usize) -> Vec<(String, Vec<usize>)> {
    let p = cfg.patch_size;
    vec![
        ("patches".into(), vec![1, 3 * p * p, 1, n]),
        ("pos".into(), vec![1, cfg.hidden_size, 1, n]),
        ("cos".into(), vec![1, cfg.head_dim(), 1, n]),
        ("sin".into(), vec![1, cfg.head_dim(), 1, n]),
        ("mask".into(), vec![1, n, n]),
    ]
}

/// The host tables of a Qwen3-VL tower: its learned position table.
pub fn table_shapes(cfg: &Qwen3VisionConfig) -> Vec<(String, Vec<usize>)> {
    vec![(
        "pos_table".into(),
        vec![cfg.num_position_embeddings, cfg.hidden_size],
    )]
}

/// The host tables of a Qwen3-VL checkpoint, read from its weights.
pub fn tables(ck: &Checkpoint, cfg: &Qwen3VisionConfig) -> Result<Vec<HostTable>> {
    let shape = vec![cfg.num_position_embeddings, cfg.hidden_size];
    let pos = ck
        .tensor("pos_embed.weight", &shape)?
        .flatten_all()?
        .to_vec1::<f32>()?;
    Ok(vec![("pos_table".into(), shape, pos)])
}

/// Build the inputs of one call. `pos_table` is `[S*S, D]` row-major.
pub fn host_inputs(
    batch: &PixelBatch,
    cfg: &Qwen3VisionConfig,
    recipe: &HostRecipe,
    pos_table: &[f32],
    bucket: usize,
) -> std::result::Result<HostInputs, HostError> {
    let (d, m) = (cfg.hidden_size, cfg.spatial_merge_size);
    let patches = pack_patches(
        batch,
        cfg.patch_size,
        cfg.temporal_patch_size,
        cfg.patch_dim(),
        bucket,
    )?;
    let interpolation = recipe.pos_interpolation.ok_or_else(|| HostError::Recipe {
        field: "host.pos_interpolation",
        msg: "missing, and the position table must be resampled".into(),
    })?;
    let align_corners = match interpolation {
        PosInterpolation::BilinearAlignCorners => true,
        PosInterpolation::BilinearHalfPixel => false,
        other => {
            return Err(HostError::Recipe {
                field: "host.pos_interpolation",
                msg: format!(
                    "{other:?} is not a bilinear resampling, which Qwen3-VL's host computes"
                ),
            });
        }
    };
    let side = cfg.pos_side();
    let mut pos = vec![0f32; d * bucket];
    let mut r = 0usize;
    for &[gt, gh, gw] in &batch.grid_thw {
        let order = block_order(gh, gw, m);
        for _ in 0..gt {
            for &(row, col) in &order {
                // Bilinear, align_corners: src = i * (S-1) / (size-1), in f32
                // (half-pixel centres only for the pos-align test fault).
                let axis = |i: usize, size: usize| {
                    let src = if align_corners {
                        i as f32 * (side - 1) as f32 / (size.max(2) - 1) as f32
                    } else {
                        ((i as f32 + 0.5) * side as f32 / size as f32 - 0.5)
                            .clamp(0.0, (side - 1) as f32)
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
                r += 1;
            }
        }
    }
    let (cos, sin) = rotary_tables(
        batch,
        m,
        cfg.head_dim(),
        crate::host::rope_theta(recipe)?,
        bucket,
    );
    let mask = frame_mask(batch, bucket);
    let tensors = input_shapes(cfg, bucket)
        .into_iter()
        .zip([patches, pos, cos, sin, mask])
        .map(|((name, shape), v)| (name, shape, v))
        .collect();
    Ok(HostInputs {
        tensors,
        real: batch.rows(),
        bucket,
        slots: None,
    })
}

/// The recipe of a Qwen3-VL vision config (what manifests without a `host`
/// field were built with).
pub fn host_recipe(cfg: &Qwen3VisionConfig) -> HostRecipe {
    HostRecipe {
        output_scale: None,
        rope_theta: Some(cfg.rope_theta),
        pos_interpolation: Some(PosInterpolation::BilinearAlignCorners),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::checkpoint::Activation;
    use crate::host::MASK_VALUE;

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
        let h = host_inputs(&batch, &c, &host_recipe(&c), &table, 16).unwrap();
        let n = 16;
        // Block-diagonal mask: image 1 rows 0..4, image 2 rows 4..12, pads
        // attend to the first pad slot (12) alone.
        let (mask, patches, pos) = (
            h.get("mask").unwrap(),
            h.get("patches").unwrap(),
            h.get("pos").unwrap(),
        );
        let (cos, sin) = (h.get("cos").unwrap(), h.get("sin").unwrap());
        let m = |q: usize, k: usize| mask[q * n + k];
        assert_eq!(m(0, 3), 0.0);
        assert_eq!(m(0, 4), MASK_VALUE);
        assert_eq!(m(5, 11), 0.0);
        assert_eq!(m(11, 3), MASK_VALUE);
        for q in 12..16 {
            for k in 0..16 {
                assert_eq!(m(q, k), if k == 12 { 0.0 } else { MASK_VALUE });
            }
        }
        // Pad columns: zero pixels and position, cos 1, sin 0.
        for r in 12..16 {
            assert!((0..12).all(|ch| patches[ch * n + r] == 0.0));
            assert!((0..8).all(|ch| pos[ch * n + r] == 0.0));
            assert!((0..4).all(|ch| cos[ch * n + r] == 1.0 && sin[ch * n + r] == 0.0));
        }
        // Row 1 of image 1 is token (0, 1): first frame, channel (c=0, py=0, px=1) = value 1.
        assert_eq!(patches[n + 1], batch.pixel_values[c.patch_dim() + 1]);
        // Token 0 sits at grid corner (0, 0): position = table row 0.
        assert!((0..8).all(|ch| (pos[ch * n] - table[ch]).abs() < 1e-6));
        let e = host_inputs(&batch, &c, &host_recipe(&c), &table, 8).unwrap_err();
        assert!(
            matches!(&e, HostError::DoesNotFit(m) if m.contains("do not fit")),
            "{e}"
        );
        let no_interp = HostRecipe {
            output_scale: None,
            pos_interpolation: None,
            ..host_recipe(&c)
        };
        let e = host_inputs(&batch, &c, &no_interp, &table, 16).unwrap_err();
        assert!(
            matches!(
                e,
                HostError::Recipe {
                    field: "host.pos_interpolation",
                    ..
                }
            ),
            "{e}"
        );
    }
}
