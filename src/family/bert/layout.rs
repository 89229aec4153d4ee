//! The BERT family's tensors in the ANE layout, for its builder
//! (`python/ane_export/bert.py`); the embedding tables stay on the host
//! ([`super::host`]), which gives the program their sum.

use crate::checkpoint::Checkpoint;
use crate::error::Result;
use crate::export::layout::{LayoutTensor, Storage, Writer};
use crate::family::bert::BertConfig;

/// The encoder's weights under the names the builder reads: the embedding
/// LayerNorm `embeddings.norm`, per layer `blocks.<i>.attn.qkv` (q, k, v
/// fused), `.attn.proj`, `.norm1` (after attention), `.mlp.fc1`,
/// `.mlp.fc2`, `.norm2` (after the MLP), and `pooler` when the checkpoint
/// has one.
pub fn layout(ck: &Checkpoint, c: &BertConfig, storage: Storage) -> Result<Vec<LayoutTensor>> {
    let (d, m) = (c.hidden_size, c.intermediate_size);
    let mut w = Writer::new(ck, storage);
    w.layer_norm_as(
        "embeddings.LayerNorm",
        "embeddings.norm",
        d,
        "LayerNorm of the embeddings (word + position + token type, summed by the host)",
    )?;
    for i in 0..c.num_hidden_layers {
        let (l, b) = (format!("encoder.layer.{i}"), format!("blocks.{i}"));
        let (mut qkv_w, mut qkv_b) = (Vec::with_capacity(3 * d * d), Vec::with_capacity(3 * d));
        for part in ["query", "key", "value"] {
            let n = format!("{l}.attention.self.{part}");
            qkv_w.extend(w.read(&format!("{n}.weight"), &[d, d])?);
            qkv_b.extend(w.read(&format!("{n}.bias"), &[d])?);
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
        w.linear_as(
            &format!("{l}.attention.output.dense"),
            &format!("{b}.attn.proj"),
            (d, d),
            "attention output projection",
        )?;
        w.layer_norm_as(
            &format!("{l}.attention.output.LayerNorm"),
            &format!("{b}.norm1"),
            d,
            "post-attention norm (after the residual add)",
        )?;
        w.linear_as(
            &format!("{l}.intermediate.dense"),
            &format!("{b}.mlp.fc1"),
            (m, d),
            "MLP up",
        )?;
        w.linear_as(
            &format!("{l}.output.dense"),
            &format!("{b}.mlp.fc2"),
            (d, m),
            "MLP down",
        )?;
        w.layer_norm_as(
            &format!("{l}.output.LayerNorm"),
            &format!("{b}.norm2"),
            d,
            "post-MLP norm (after the residual add)",
        )?;
    }
    if c.pooler {
        w.linear_as(
            "pooler.dense",
            "pooler",
            (d, d),
            "pooler: dense then tanh on the first token",
        )?;
    }
    Ok(w.finish())
}
