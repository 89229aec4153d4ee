//! DINOv2's export: its tensors in the ANE layout, and the host inputs of
//! one call of a bucket (see [`super::host`] for what all families share).
//!
//! A DINOv2 bucket is a square resolution: every image is resized and
//! cropped to it, so a call is one image of exactly `N = (side / P)^2`
//! patches; the sequence is the class token, the `R` register tokens, then
//! the patches, with no padding and no mask. The inputs:
//! * `patches [1, 3*P*P, 1, N]`: the image's patch rows in raster order, (c, py, px);
//! * `positions [1, D, 1, 1 + N]`: the position rows of the class token and
//!   the patches, the checkpoint's table (`pos_table` in `host.safetensors`)
//!   resampled by the host to the bucket's grid as the manifest's
//!   `host.pos_interpolation` says (PyTorch's bicubic, with antialiasing for
//!   the registers variant), the same for every call of a bucket.
//!
//! The class token and the registers are constants of the program
//! (`embeddings.class`, `embeddings.registers`). LayerScale stays a
//! separate multiply (`blocks.<i>.ls1`, `.ls2`): folding it into the
//! projections would put the small scales of trained checkpoints into the
//! fp16 weights, where they lose precision.

use super::host::{
    HostInputs, HostRecipe, HostTable, PosInterpolation, one_image_inputs, resample_bicubic,
};
use super::layout::{LayoutTensor, Storage, Writer, channels_first};
use crate::checkpoint::{Checkpoint, Dinov2VisionConfig};
use crate::error::Result;
use crate::preprocess::PixelBatch;

/// All tower weights of a DINOv2 checkpoint in the ANE layout, the blocks
/// under the names the shared ViT builder reads (`blocks.<i>.norm1`,
/// `.attn.qkv`, ...) with `blocks.<i>.ls1`/`.ls2` and, for SwiGLU,
/// `blocks.<i>.mlp.gate_up` and `.mlp.down`.
pub fn layout(
    ck: &Checkpoint,
    c: &Dinov2VisionConfig,
    storage: Storage,
) -> Result<Vec<LayoutTensor>> {
    let (d, p, h) = (c.hidden_size, c.patch_size, c.mlp_hidden());
    let mut w = Writer::new(ck, storage);
    let patch = w.read(
        "embeddings.patch_embeddings.projection.weight",
        &[d, 3, p, p],
    )?;
    w.push(
        "patch_embed.weight",
        vec![d, 3 * p * p, 1, 1],
        patch,
        "patch embedding (Conv2d) as a 1x1 conv over (c, py, px)",
    )?;
    let bias = w.read("embeddings.patch_embeddings.projection.bias", &[d])?;
    w.push("patch_embed.bias", vec![d], bias, "patch embedding bias")?;
    let class = w.read("embeddings.cls_token", &[1, 1, d])?;
    w.push(
        "embeddings.class",
        vec![1, d, 1, 1],
        class,
        "class token, the first token",
    )?;
    let r = c.num_register_tokens;
    if r > 0 {
        let regs = w.read("embeddings.register_tokens", &[1, r, d])?;
        w.push(
            "embeddings.registers",
            vec![1, d, 1, r],
            channels_first(&regs, r, d),
            "register tokens after the class token (no position), channels first",
        )?;
    }
    for i in 0..c.num_hidden_layers {
        let (l, b) = (format!("encoder.layer.{i}"), format!("blocks.{i}"));
        w.layer_norm_as(
            &format!("{l}.norm1"),
            &format!("{b}.norm1"),
            d,
            "pre-attention norm",
        )?;
        let (mut qkv_w, mut qkv_b) = (Vec::with_capacity(3 * d * d), Vec::with_capacity(3 * d));
        for part in ["query", "key", "value"] {
            let n = format!("{l}.attention.attention.{part}");
            qkv_w.extend(w.read(&format!("{n}.weight"), &[d, d])?);
            if c.qkv_bias {
                qkv_b.extend(w.read(&format!("{n}.bias"), &[d])?);
            } else {
                qkv_b.extend(std::iter::repeat_n(0f32, d));
            }
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
            "q, k, v biases (zero without qkv_bias)",
        )?;
        w.linear_as(
            &format!("{l}.attention.output.dense"),
            &format!("{b}.attn.proj"),
            (d, d),
            "attention output projection",
        )?;
        let ls1 = w.read(&format!("{l}.layer_scale1.lambda1"), &[d])?;
        w.push(
            &format!("{b}.ls1"),
            vec![1, d, 1, 1],
            ls1,
            "LayerScale of the attention branch",
        )?;
        w.layer_norm_as(
            &format!("{l}.norm2"),
            &format!("{b}.norm2"),
            d,
            "pre-MLP norm",
        )?;
        if c.use_swiglu_ffn {
            w.linear_as(
                &format!("{l}.mlp.weights_in"),
                &format!("{b}.mlp.gate_up"),
                (2 * h, d),
                "SwiGLU in: rows [0,H) the gate (SiLU), [H,2H) the up projection",
            )?;
            w.linear_as(
                &format!("{l}.mlp.weights_out"),
                &format!("{b}.mlp.down"),
                (d, h),
                "SwiGLU out",
            )?;
        } else {
            w.linear_as(
                &format!("{l}.mlp.fc1"),
                &format!("{b}.mlp.fc1"),
                (h, d),
                "MLP up",
            )?;
            w.linear_as(
                &format!("{l}.mlp.fc2"),
                &format!("{b}.mlp.fc2"),
                (d, h),
                "MLP down",
            )?;
        }
        let ls2 = w.read(&format!("{l}.layer_scale2.lambda1"), &[d])?;
        w.push(
            &format!("{b}.ls2"),
            vec![1, d, 1, 1],
            ls2,
            "LayerScale of the MLP branch",
        )?;
    }
    w.layer_norm_as(
        "layernorm",
        "post_norm",
        d,
        "norm of every token (last_hidden_state)",
    )?;
    Ok(w.finish())
}

/// The host's tables: the position table `[g*g + 1, D]` (class row first).
pub fn table_shapes(c: &Dinov2VisionConfig) -> Vec<(String, Vec<usize>)> {
    vec![("pos_table".into(), vec![c.positions(), c.hidden_size])]
}

/// The host tables of a DINOv2 checkpoint, read from its weights.
pub fn tables(ck: &Checkpoint, c: &Dinov2VisionConfig) -> Result<Vec<HostTable>> {
    let shape = vec![c.positions(), c.hidden_size];
    let v = ck
        .tensor(
            "embeddings.position_embeddings",
            &[1, c.positions(), c.hidden_size],
        )?
        .flatten_all()?
        .to_vec1::<f32>()?;
    Ok(vec![("pos_table".into(), shape, v)])
}

/// What the host computes: no rotary; the position resampling of the
/// family's variant.
pub fn host_recipe(c: &Dinov2VisionConfig) -> HostRecipe {
    HostRecipe {
        rope_theta: None,
        pos_interpolation: Some(if c.interpolate_antialias {
            PosInterpolation::BicubicAntialias
        } else {
            PosInterpolation::Bicubic
        }),
    }
}

/// The position rows `[1 + n, D]` of a square grid of `n` patches: the
/// class row, then the table's patch rows resampled (the table itself when
/// the grid is the table's, as transformers skips the resampling then).
pub fn position_rows(
    c: &Dinov2VisionConfig,
    recipe: &HostRecipe,
    pos_table: &[f32],
    n: usize,
) -> std::result::Result<Vec<f32>, String> {
    let (g, d) = (c.grid(), c.hidden_size);
    if pos_table.len() != c.positions() * d {
        return Err(format!(
            "host table `pos_table` holds {} values, expected [{}, {d}]",
            pos_table.len(),
            c.positions()
        ));
    }
    let side = (n as f64).sqrt().round() as usize;
    if side * side != n {
        return Err(format!("{n} patches: a DINOv2 bucket is a square grid"));
    }
    if side == g {
        return Ok(pos_table.to_vec());
    }
    let antialias = match recipe.pos_interpolation {
        Some(PosInterpolation::Bicubic) => false,
        Some(PosInterpolation::BicubicAntialias) => true,
        other => {
            return Err(format!(
                "host.pos_interpolation: {other:?}; DINOv2's host resamples its table bicubically \
                 (`bicubic` or `bicubic_antialias`)"
            ));
        }
    };
    let mut rows = pos_table[..d].to_vec();
    rows.extend(resample_bicubic(
        &pos_table[d..],
        g,
        d,
        (side, side),
        antialias,
    ));
    Ok(rows)
}

/// Build the inputs of one call: one image of exactly `bucket` patches,
/// and the position rows of the bucket's grid.
pub fn host_inputs(
    batch: &PixelBatch,
    c: &Dinov2VisionConfig,
    recipe: &HostRecipe,
    pos_table: &[f32],
    bucket: usize,
) -> std::result::Result<HostInputs, String> {
    let mut inputs = one_image_inputs(batch, c.patch_size, bucket, c.tokens(0), "DINOv2")?;
    let rows = position_rows(c, recipe, pos_table, bucket)?;
    inputs.tensors.push((
        "positions".into(),
        vec![1, c.hidden_size, 1, bucket + 1],
        channels_first(&rows, bucket + 1, c.hidden_size),
    ));
    Ok(inputs)
}

/// The inputs of a bucket of `n` patches, in order.
pub fn input_shapes(c: &Dinov2VisionConfig, n: usize) -> Vec<(String, Vec<usize>)> {
    let mut v = super::host::one_image_input_shapes(c.patch_size, n);
    v.push(("positions".into(), vec![1, c.hidden_size, 1, n + 1]));
    v
}
