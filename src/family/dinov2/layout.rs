//! DINOv2's tensors in the ANE layout, for its builder; the inputs
//! the program takes are [`super::host`]'s.
//!
//! The class token and the registers are constants of the program
//! (`embeddings.class`, `embeddings.registers`). LayerScale stays a
//! separate multiply (`blocks.<i>.ls1`, `.ls2`): folding it into the
//! projections would put the small scales of trained checkpoints into the
//! fp16 weights, where they lose precision.

use crate::checkpoint::Checkpoint;
use crate::error::Result;
use crate::export::layout::{LayoutTensor, Storage, Writer};
use crate::family::dinov2::Dinov2VisionConfig;
use crate::host::channels_first;

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
