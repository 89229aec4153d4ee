//! Qwen2.5-VL's tensors in the ANE layout, for its builder; the inputs
//! the program takes are [`super::host`]'s.

use crate::checkpoint::Checkpoint;
use crate::error::Result;
use crate::export::layout::{LayoutTensor, Storage, Writer};
use crate::family::qwen2_5_vl::Qwen25VisionConfig;

/// All tower weights of a Qwen2.5-VL checkpoint in the ANE layout.
pub fn layout(
    ck: &Checkpoint,
    c: &Qwen25VisionConfig,
    storage: Storage,
) -> Result<Vec<LayoutTensor>> {
    let (d, i) = (c.hidden_size, c.intermediate_size);
    let mut w = Writer::new(ck, storage);
    w.patch_embed(d, c.patch_size, c.temporal_patch_size, false)?;
    for k in 0..c.depth {
        let b = format!("blocks.{k}");
        w.rms_norm(&format!("{b}.norm1"), d, "pre-attention norm")?;
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
        w.rms_norm(&format!("{b}.norm2"), d, "pre-MLP norm")?;
        w.linear(&format!("{b}.mlp.gate_proj"), i, d, true, "MLP gate")?;
        w.linear(&format!("{b}.mlp.up_proj"), i, d, true, "MLP up")?;
        w.linear(&format!("{b}.mlp.down_proj"), d, i, true, "MLP down")?;
    }
    let md = d * c.spatial_merge_size * c.spatial_merge_size;
    w.rms_norm("merger.ln_q", d, "merger norm (before merging 4 tokens)")?;
    w.linear("merger.mlp.0", md, md, true, "merger fc1")?;
    w.linear("merger.mlp.2", c.out_hidden_size, md, true, "merger fc2")?;
    Ok(w.finish())
}
