//! Qwen2-VL's tensors in the ANE layout, for its builder; the inputs
//! the program takes are [`super::host`]'s.

use crate::checkpoint::Checkpoint;
use crate::error::Result;
use crate::export::layout::{LayoutTensor, Storage, Writer};
use crate::family::qwen2_vl::Qwen2VisionConfig;

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
