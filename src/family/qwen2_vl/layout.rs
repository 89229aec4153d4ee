//! Qwen2-VL's export: its tensors in the ANE layout, and the host inputs of
//! one call of a bucket (see [`crate::host`] for what all families share).
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

use crate::checkpoint::Checkpoint;
use crate::error::Result;
use crate::export::layout::{LayoutTensor, Storage, Writer};
use crate::family::qwen2_vl::Qwen2VisionConfig;
use crate::host::{HostInputs, HostRecipe, frame_mask, pack_patches, rotary_tables};
use crate::preprocess::PixelBatch;

/// All tower weights of a Qwen2-VL checkpoint in the ANE layout.
pub fn layout(
    ck: &Checkpoint,
    c: &Qwen2VisionConfig,
    storage: Storage,
) -> Result<Vec<LayoutTensor>> {
    let (d, mlp) = (c.embed_dim, c.mlp_dim());
    let mut w = Writer::new(ck, storage);
    w.patch_embed(d, c.patch_size, c.temporal_patch_size, false)?;
    for i in 0..c.depth {
        let b = format!("blocks.{i}");
        w.layer_norm(&format!("{b}.norm1"), d, "pre-attention norm")?;
        w.linear(
            &format!("{b}.attn.qkv"),
            3 * d,
            d,
            true,
            "fused QKV: rows [0,D) Q, [D,2D) K, [2D,3D) V, head-major",
        )?;
        w.linear(
            &format!("{b}.attn.proj"),
            d,
            d,
            true,
            "attention output projection",
        )?;
        w.layer_norm(&format!("{b}.norm2"), d, "pre-MLP norm")?;
        w.linear(&format!("{b}.mlp.fc1"), mlp, d, true, "MLP up")?;
        w.linear(&format!("{b}.mlp.fc2"), d, mlp, true, "MLP down")?;
    }
    let md = d * c.spatial_merge_size * c.spatial_merge_size;
    w.layer_norm("merger.ln_q", d, "merger norm (before merging 4 tokens)")?;
    w.linear("merger.mlp.0", md, md, true, "merger fc1")?;
    w.linear("merger.mlp.2", c.hidden_size, md, true, "merger fc2")?;
    Ok(w.finish())
}

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
) -> std::result::Result<HostInputs, String> {
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
