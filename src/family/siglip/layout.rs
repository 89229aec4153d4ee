//! SigLIP's tensors in the ANE layout, for its builder; the inputs
//! the program takes are [`super::host`]'s.
//!
//! The pooling head's probe is a constant of the program, its `in_proj`
//! split into `head.attn.q` and `head.attn.kv`.

use crate::checkpoint::Checkpoint;
use crate::error::Result;
use crate::export::layout::{LayoutTensor, Storage, Writer};
use crate::family::siglip::SiglipVisionConfig;

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
