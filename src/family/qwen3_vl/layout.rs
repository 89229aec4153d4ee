//! Qwen3-VL's tensors in the ANE layout, for its builder; the inputs
//! the program takes are [`super::host`]'s.

use crate::checkpoint::Checkpoint;
use crate::error::Result;
use crate::export::layout::{LayoutTensor, Storage, Writer};
use crate::family::qwen3_vl::Qwen3VisionConfig;

/// All tower weights of a Qwen3-VL checkpoint in the ANE layout.
pub fn layout(
    ck: &Checkpoint,
    c: &Qwen3VisionConfig,
    storage: Storage,
) -> Result<Vec<LayoutTensor>> {
    let d = c.hidden_size;
    let mut w = Writer::new(ck, storage);
    w.patch_embed(d, c.patch_size, c.temporal_patch_size, true)?;
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
        w.linear(
            &format!("{b}.mlp.linear_fc1"),
            c.intermediate_size,
            d,
            true,
            "MLP up",
        )?;
        w.linear(
            &format!("{b}.mlp.linear_fc2"),
            d,
            c.intermediate_size,
            true,
            "MLP down",
        )?;
    }
    let md = 4 * d;
    w.layer_norm("merger.norm", d, "merger norm (before merging 4 tokens)")?;
    w.linear("merger.linear_fc1", md, md, true, "merger fc1")?;
    w.linear(
        "merger.linear_fc2",
        c.out_hidden_size,
        md,
        true,
        "merger fc2",
    )?;
    for j in 0..c.deepstack_visual_indexes.len() {
        let m = format!("deepstack_merger_list.{j}");
        w.layer_norm(
            &format!("{m}.norm"),
            md,
            "deepstack norm (after merging 4 tokens)",
        )?;
        w.linear(&format!("{m}.linear_fc1"), md, md, true, "deepstack fc1")?;
        w.linear(
            &format!("{m}.linear_fc2"),
            c.out_hidden_size,
            md,
            true,
            "deepstack fc2",
        )?;
    }
    Ok(w.finish())
}
