//! CLIP's export: its tensors in the ANE layout, and the host inputs of one
//! call of a bucket (see [`super::host`] for what all families share).
//!
//! A CLIP bucket is a square resolution: every image is resized and cropped
//! to it, so a call is one image of exactly `N = (side / P)^2` patches and
//! the sequence `N + 1` tokens (the class token first) has no padding and
//! needs no mask. The only input:
//! * `patches [1, 3*P*P, 1, N]`: the image's patch rows in raster order, (c, py, px).
//!
//! The class embedding and the position table are constants of the
//! program (`embeddings.class`, `embeddings.positions`); the host keeps no
//! tables for this family.

use super::host::{HostInputs, one_image_inputs};
use super::layout::{LayoutTensor, Storage, Writer};
use crate::checkpoint::{Checkpoint, ClipVisionConfig, clip::PROJECTION};
use crate::error::Result;
use crate::preprocess::PixelBatch;

/// All tower weights of a CLIP checkpoint in the ANE layout, under the
/// names the shared ViT builder reads (`blocks.<i>.norm1`, `.attn.qkv`, ...).
pub fn layout(
    ck: &Checkpoint,
    c: &ClipVisionConfig,
    storage: Storage,
) -> Result<Vec<LayoutTensor>> {
    let (d, p, mlp, seq) = (
        c.hidden_size,
        c.patch_size,
        c.intermediate_size,
        c.positions(),
    );
    let mut w = Writer::new(ck, storage);
    let patch = w.read("embeddings.patch_embedding.weight", &[d, 3, p, p])?;
    w.push(
        "patch_embed.weight",
        vec![d, 3 * p * p, 1, 1],
        patch,
        "patch embedding (Conv2d, no bias) as a 1x1 conv over (c, py, px)",
    )?;
    let class = w.read("embeddings.class_embedding", &[d])?;
    w.push(
        "embeddings.class",
        vec![1, d, 1, 1],
        class,
        "class embedding, the first token",
    )?;
    let table = w.read("embeddings.position_embedding.weight", &[seq, d])?;
    let t = super::layout::channels_first(&table, seq, d);
    w.push(
        "embeddings.positions",
        vec![1, d, 1, seq],
        t,
        "position table (class token first), channels first",
    )?;
    w.layer_norm_as("pre_layrnorm", "pre_norm", d, "norm before the blocks")?;
    for i in 0..c.num_hidden_layers {
        w.encoder_layer(i, d, mlp)?;
    }
    w.layer_norm_as(
        "post_layernorm",
        "post_norm",
        d,
        "norm of the class token (pooler_output)",
    )?;
    if let Some(pd) = c.projection_dim {
        let v = ck
            .tensor_unprefixed(PROJECTION, &[pd, d])?
            .flatten_all()?
            .to_vec1::<f32>()?;
        w.push(
            "projection.weight",
            vec![pd, d, 1, 1],
            v,
            "visual projection to image_embeds, no bias (1x1 conv, R2)",
        )?;
    }
    Ok(w.finish())
}

/// Build the inputs of one call: one image of exactly `bucket` patches,
/// after the class token.
pub fn host_inputs(
    batch: &PixelBatch,
    cfg: &ClipVisionConfig,
    bucket: usize,
) -> std::result::Result<HostInputs, String> {
    one_image_inputs(batch, cfg.patch_size, bucket, 1, "CLIP")
}
