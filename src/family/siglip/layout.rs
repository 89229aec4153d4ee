//! SigLIP's export: its tensors in the ANE layout, and the host inputs of
//! one call of a bucket (see [`crate::host`] for what all families share).
//!
//! A SigLIP bucket is a square resolution: every image is resized to it, so
//! a call is one image of exactly `N = (side / P)^2` patches with no padding
//! and no mask (no class token). The inputs:
//! * `patches [1, 3*P*P, 1, N]`: the image's patch rows in raster order, (c, py, px);
//! * `positions [1, D, 1, N]`: the checkpoint's position table
//!   (`pos_table` in `host.safetensors`) itself at the checkpoint's
//!   `image_size`, resampled by the host for other sides as transformers'
//!   `interpolate_pos_encoding` does (bicubic, no antialiasing).
//!
//! The pooling head's probe is a constant of the program, its `in_proj`
//! split into `head.attn.q` and `head.attn.kv`.

use crate::checkpoint::Checkpoint;
use crate::error::Result;
use crate::export::layout::{LayoutTensor, Storage, Writer};
use crate::family::siglip::SiglipVisionConfig;
use crate::host::FixedEncoder;

/// All tower weights of a SigLIP checkpoint in the ANE layout, the blocks
/// under the names the shared ViT builder reads (`blocks.<i>.norm1`, ...).
pub fn layout(
    ck: &Checkpoint,
    c: &SiglipVisionConfig,
    storage: Storage,
) -> Result<Vec<LayoutTensor>> {
    let (d, p, mlp) = (c.hidden_size, c.patch_size, c.intermediate_size);
    let mut w = Writer::new(ck, storage);
    let patch = w.read("embeddings.patch_embedding.weight", &[d, 3, p, p])?;
    w.push(
        "patch_embed.weight",
        vec![d, 3 * p * p, 1, 1],
        patch,
        "patch embedding (Conv2d) as a 1x1 conv over (c, py, px)",
    )?;
    let bias = w.read("embeddings.patch_embedding.bias", &[d])?;
    w.push("patch_embed.bias", vec![d], bias, "patch embedding bias")?;
    blocks_and_head(&mut w, (d, mlp, c.num_hidden_layers), c.vision_use_head)?;
    Ok(w.finish())
}

/// The blocks, `post_layernorm` and the attention-pooling head (with
/// `use_head`), which SigLIP and SigLIP2 name and lay out alike; `(d, mlp,
/// depth)` their sizes.
pub(crate) fn blocks_and_head(
    w: &mut Writer,
    (d, mlp, depth): (usize, usize, usize),
    use_head: bool,
) -> Result<()> {
    for i in 0..depth {
        w.encoder_layer(i, d, mlp)?;
    }
    w.layer_norm_as(
        "post_layernorm",
        "post_norm",
        d,
        "norm of every token (last_hidden_state)",
    )?;
    if use_head {
        let probe = w.read("head.probe", &[1, 1, d])?;
        w.push(
            "head.probe",
            vec![1, d, 1, 1],
            probe,
            "pooling head's learned query",
        )?;
        let in_w = w.read("head.attention.in_proj_weight", &[3 * d, d])?;
        let in_b = w.read("head.attention.in_proj_bias", &[3 * d])?;
        w.push(
            "head.attn.q.weight",
            vec![d, d, 1, 1],
            in_w[..d * d].to_vec(),
            "pooling head's query projection, in_proj rows [0, D) (1x1 conv, R2)",
        )?;
        w.push(
            "head.attn.q.bias",
            vec![d],
            in_b[..d].to_vec(),
            "pooling head's query bias",
        )?;
        w.push(
            "head.attn.kv.weight",
            vec![2 * d, d, 1, 1],
            in_w[d * d..].to_vec(),
            "pooling head's key and value projections, in_proj rows [D, 3D) (1x1 conv, R2)",
        )?;
        w.push(
            "head.attn.kv.bias",
            vec![2 * d],
            in_b[d..].to_vec(),
            "pooling head's key and value biases",
        )?;
        w.linear_as(
            "head.attention.out_proj",
            "head.attn.proj",
            (d, d),
            "pooling head's output projection",
        )?;
        w.layer_norm_as("head.layernorm", "head.norm", d, "pooling head's norm")?;
        w.linear_as(
            "head.mlp.fc1",
            "head.mlp.fc1",
            (mlp, d),
            "pooling head's MLP up",
        )?;
        w.linear_as(
            "head.mlp.fc2",
            "head.mlp.fc2",
            (d, mlp),
            "pooling head's MLP down",
        )?;
    }
    Ok(())
}

/// The host side of a bucket: one image, the position rows of its grid
/// resampled from the checkpoint's table as transformers'
/// `interpolate_pos_encoding` does.
pub fn host(c: &SiglipVisionConfig) -> FixedEncoder {
    FixedEncoder {
        family: "SigLIP",
        patch: c.patch_size,
        grid: c.grid(),
        hidden: c.hidden_size,
        lead: 0,
        extra: 0,
        tensor: "embeddings.position_embedding.weight",
        stored: vec![c.positions(), c.hidden_size],
        antialias: false,
    }
}
