//! CLIP's tensors in the ANE layout, for its builder; the inputs
//! the program takes are [`super::host`]'s.
//!
//! The class embedding is a constant of the program (`embeddings.class`).

use crate::checkpoint::Checkpoint;
use crate::error::Result;
use crate::export::layout::{LayoutTensor, Storage, Writer};
use crate::family::clip::ClipVisionConfig;
use crate::family::clip::config::PROJECTION;

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
