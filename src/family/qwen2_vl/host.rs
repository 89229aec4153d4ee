//! Qwen2-VL's host inputs of one call of a bucket (see [`crate::host`]
//! for what all families share); its tensors in the ANE layout are in
//! [`super::layout`].
//!
//! Inputs for a bucket of N patches and the images of one call (n <= N real
//! rows), in merge-block order:
//! * `patches [1, 3*P*P, 1, N]`: one temporal frame of each row, (c, py, px);
//! * `cos`, `sin [1, hd, 1, N]`: rotary tables `[row freqs, col freqs]` twice;
//! * `mask [1, N, N]`: 0 where query and key are in the same frame of the same
//!   image, -1e4 elsewhere; pad rows attend to the first pad slot alone
//!   ([`crate::host`]).
//!
//! No position table: the host keeps no tables for this family.

use crate::family::qwen2_vl::Qwen2VisionConfig;
use crate::host::{HostError, HostInputs, HostRecipe, frame_mask, pack_patches, rotary_tables};
use crate::preprocess::PixelBatch;

/// The inputs of a Qwen2-VL bucket of `n` patches, in order: (name, shape).
pub fn input_shapes(cfg: &Qwen2VisionConfig, n: usize) -> Vec<(String, Vec<usize>)> {
    let p = cfg.patch_size;
    vec![
        ("patches".into(), vec![1, 3 * p * p, 1, n]),
        ("cos".into(), vec![1, cfg.head_dim(), 1, n]),
        ("sin".into(), vec![1, cfg.head_dim(), 1, n]),
        ("mask".into(), vec![1, n, n]),
    ]
}

/// The recipe of a Qwen2-VL vision config: its rotary base.
pub fn host_recipe(cfg: &Qwen2VisionConfig) -> HostRecipe {
    HostRecipe {
        output_scale: None,
        rope_theta: Some(cfg.rope_theta),
        pos_interpolation: None,
    }
}

/// Build the inputs of one call.
pub fn host_inputs(
    batch: &PixelBatch,
    cfg: &Qwen2VisionConfig,
    recipe: &HostRecipe,
    bucket: usize,
) -> std::result::Result<HostInputs, HostError> {
    let m = cfg.spatial_merge_size;
    let patches = pack_patches(
        batch,
        cfg.patch_size,
        cfg.temporal_patch_size,
        cfg.patch_dim(),
        bucket,
    )?;
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
        .zip([patches, cos, sin, mask])
        .map(|((name, shape), v)| (name, shape, v))
        .collect();
    Ok(HostInputs {
        tensors,
        real: batch.rows(),
        bucket,
        slots: None,
    })
}
