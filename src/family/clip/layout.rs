//! CLIP's export: its tensors in the ANE layout, and the host inputs of one
//! call of a bucket (see [`crate::host`] for what all families share).
//!
//! A CLIP bucket is a square resolution: every image is resized and cropped
//! to it, so a call is one image of exactly `N = (side / P)^2` patches and
//! the sequence `N + 1` tokens (the class token first) has no padding and
//! needs no mask. The inputs:
//! * `patches [1, 3*P*P, 1, N]`: the image's patch rows in raster order, (c, py, px);
//! * `positions [1, D, 1, N + 1]`: the position rows of the class token and
//!   the patches: the checkpoint's table (`pos_table` in `host.safetensors`)
//!   itself at the checkpoint's `image_size`, resampled by the host for
//!   other sides as transformers' `interpolate_pos_encoding` does (bicubic,
//!   no antialiasing), the same for every call of a bucket.
//!
//! The class embedding is a constant of the program (`embeddings.class`).

use crate::checkpoint::Checkpoint;
use crate::error::Result;
use crate::export::layout::{LayoutTensor, Storage, Writer};
use crate::family::clip::ClipVisionConfig;
use crate::family::clip::config::PROJECTION;
use crate::host::FixedEncoder;

/// All tower weights of a CLIP checkpoint in the ANE layout, under the
/// names the shared ViT builder reads (`blocks.<i>.norm1`, `.attn.qkv`, ...).
pub fn layout(
    ck: &Checkpoint,
    c: &ClipVisionConfig,
    storage: Storage,
) -> Result<Vec<LayoutTensor>> {
    let (d, p, mlp) = (c.hidden_size, c.patch_size, c.intermediate_size);
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

/// The host side of a bucket: one image, the position rows of its grid
/// resampled from the checkpoint's table as transformers'
/// `interpolate_pos_encoding` does.
pub fn host(c: &ClipVisionConfig) -> FixedEncoder {
    FixedEncoder {
        family: "CLIP",
        patch: c.patch_size,
        grid: c.grid(),
        hidden: c.hidden_size,
        lead: 1,
        extra: 1,
        tensor: "embeddings.position_embedding.weight",
        stored: vec![c.positions(), c.hidden_size],
        antialias: false,
    }
}
