//! SigLIP2's tensors in the ANE layout, for its builder; the inputs
//! the program takes are [`super::host`]'s.

use crate::checkpoint::Checkpoint;
use crate::error::Result;
use crate::export::layout::{LayoutTensor, Storage, Writer};
use crate::family::siglip2::Siglip2VisionConfig;

/// All tower weights of a SigLIP2 checkpoint in the ANE layout, under the
/// names of SigLIP's builder.
pub fn layout(
    ck: &Checkpoint,
    c: &Siglip2VisionConfig,
    storage: Storage,
) -> Result<Vec<LayoutTensor>> {
    let (d, p, mlp) = (c.hidden_size, c.patch_size, c.intermediate_size);
    let mut w = Writer::new(ck, storage);
    let patch = w.read("embeddings.patch_embedding.weight", &[d, 3 * p * p])?;
    w.push(
        "patch_embed.weight",
        vec![d, 3 * p * p, 1, 1],
        patch,
        "patch embedding (Linear over (py, px, c) rows) as a 1x1 conv",
    )?;
    let bias = w.read("embeddings.patch_embedding.bias", &[d])?;
    w.push("patch_embed.bias", vec![d], bias, "patch embedding bias")?;
    crate::family::siglip::layout::blocks_and_head(
        &mut w,
        (d, mlp, c.num_hidden_layers),
        c.vision_use_head,
    )?;
    Ok(w.finish())
}
