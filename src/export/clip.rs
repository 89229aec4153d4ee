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

use super::host::{HostInputs, HostRecipe, pack_patches};
use super::layout::{LayoutTensor, Storage, Writer};
use crate::checkpoint::{Checkpoint, ClipVisionConfig, clip::PROJECTION};
use crate::error::Result;
use crate::preprocess::PixelBatch;

/// A Linear `from` of the checkpoint as the 1x1 conv `to` (R2), with its bias.
fn linear_as(
    w: &mut Writer,
    from: &str,
    to: &str,
    o: usize,
    i: usize,
    meaning: &str,
) -> Result<()> {
    let weight = w.read(&format!("{from}.weight"), &[o, i])?;
    w.push(
        &format!("{to}.weight"),
        vec![o, i, 1, 1],
        weight,
        &format!("{meaning} (Linear as 1x1 conv, R2)"),
    )?;
    let bias = w.read(&format!("{from}.bias"), &[o])?;
    w.push(
        &format!("{to}.bias"),
        vec![o],
        bias,
        &format!("{meaning} bias"),
    )
}

/// A LayerNorm `from` of the checkpoint as `to`.
fn norm_as(w: &mut Writer, from: &str, to: &str, d: usize, meaning: &str) -> Result<()> {
    for part in ["weight", "bias"] {
        let v = w.read(&format!("{from}.{part}"), &[d])?;
        w.push(
            &format!("{to}.{part}"),
            vec![d],
            v,
            &format!("{meaning} {part} (LayerNorm over channels)"),
        )?;
    }
    Ok(())
}

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
    // The table [seq, d] transposed to the activations' layout [1, d, 1, seq].
    let table = w.read("embeddings.position_embedding.weight", &[seq, d])?;
    let mut t = vec![0f32; seq * d];
    for (s, row) in table.chunks_exact(d).enumerate() {
        for (ch, v) in row.iter().enumerate() {
            t[ch * seq + s] = *v;
        }
    }
    w.push(
        "embeddings.positions",
        vec![1, d, 1, seq],
        t,
        "position table (class token first), channels first",
    )?;
    norm_as(
        &mut w,
        "pre_layrnorm",
        "pre_norm",
        d,
        "norm before the blocks",
    )?;
    for i in 0..c.num_hidden_layers {
        let (l, b) = (format!("encoder.layers.{i}"), format!("blocks.{i}"));
        norm_as(
            &mut w,
            &format!("{l}.layer_norm1"),
            &format!("{b}.norm1"),
            d,
            "pre-attention norm",
        )?;
        let (mut qkv_w, mut qkv_b) = (Vec::with_capacity(3 * d * d), Vec::with_capacity(3 * d));
        for part in ["q", "k", "v"] {
            let name = format!("{l}.self_attn.{part}_proj");
            qkv_w.extend(w.read(&format!("{name}.weight"), &[d, d])?);
            qkv_b.extend(w.read(&format!("{name}.bias"), &[d])?);
        }
        w.push(
            &format!("{b}.attn.qkv.weight"),
            vec![3 * d, d, 1, 1],
            qkv_w,
            "q, k, v projections fused: rows [0,D) Q, [D,2D) K, [2D,3D) V, head-major (1x1 conv, R2)",
        )?;
        w.push(
            &format!("{b}.attn.qkv.bias"),
            vec![3 * d],
            qkv_b,
            "q, k, v biases",
        )?;
        linear_as(
            &mut w,
            &format!("{l}.self_attn.out_proj"),
            &format!("{b}.attn.proj"),
            d,
            d,
            "attention output projection",
        )?;
        norm_as(
            &mut w,
            &format!("{l}.layer_norm2"),
            &format!("{b}.norm2"),
            d,
            "pre-MLP norm",
        )?;
        linear_as(
            &mut w,
            &format!("{l}.mlp.fc1"),
            &format!("{b}.mlp.fc1"),
            mlp,
            d,
            "MLP up",
        )?;
        linear_as(
            &mut w,
            &format!("{l}.mlp.fc2"),
            &format!("{b}.mlp.fc2"),
            d,
            mlp,
            "MLP down",
        )?;
    }
    norm_as(
        &mut w,
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

/// The inputs of a CLIP bucket of `n` patches, in order: (name, shape).
pub fn input_shapes(n: usize, cfg: &ClipVisionConfig) -> Vec<(String, Vec<usize>)> {
    let p = cfg.patch_size;
    vec![("patches".into(), vec![1, 3 * p * p, 1, n])]
}

/// The recipe of a CLIP vision config: nothing besides the pixels.
pub fn host_recipe() -> HostRecipe {
    HostRecipe {
        rope_theta: None,
        pos_interpolation: None,
    }
}

/// Build the inputs of one call: one image of exactly `bucket` patches.
pub fn host_inputs(
    batch: &PixelBatch,
    cfg: &ClipVisionConfig,
    bucket: usize,
) -> std::result::Result<HostInputs, String> {
    if batch.grid_thw.len() != 1 || batch.rows() != bucket {
        return Err(format!(
            "a CLIP bucket of {bucket} patches takes one image of exactly {bucket} patches, got {} \
             image(s) of {} patches",
            batch.grid_thw.len(),
            batch.rows()
        ));
    }
    let p = cfg.patch_size;
    let patches = pack_patches(batch, p, 1, 3 * p * p, bucket)?;
    Ok(HostInputs {
        tensors: vec![("patches".into(), vec![1, 3 * p * p, 1, bucket], patches)],
        // The sequence: the class token and every patch, all real.
        real: bucket + 1,
        bucket: bucket + 1,
        slots: None,
    })
}
