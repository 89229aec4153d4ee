//! fp32 reference of the SigLIP2 vision tower (NaFlex), Hugging Face layout.
//!
//! The maths follows transformers' `models/siglip2/modeling_siglip2.py`
//! (`Siglip2VisionTransformer`), which is SigLIP's tower with two
//! differences, both here: the patch embedding is a Linear over patch rows
//! in (py, px, c) order, and the position table (`num_patches` rows, a
//! `g x g` square) is resized to every image's grid by bilinear
//! interpolation with antialiasing, even when the grid is the table's.
//! The blocks, `post_layernorm` and the attention-pooling head are SigLIP's
//! ([`SiglipVisionTower`]).
//!
//! transformers pads every image's rows to `max_num_patches` and masks the
//! pad keys; a real token never attends a pad, so running each image on its
//! real rows alone, as here, gives the same real rows and the same pooled
//! output. Pad rows have no reference: they are never an output.

use crate::checkpoint::Checkpoint;
use crate::error::Result;
use crate::family::siglip::reference::{Dims, Positions, SiglipVisionTower};
use crate::family::siglip2::Siglip2VisionConfig;
use crate::reference::vit::Linear;

/// Load SigLIP2's tower from a checkpoint, every tensor's shape checked against `cfg`.
pub fn load(ck: &Checkpoint, cfg: &Siglip2VisionConfig) -> Result<SiglipVisionTower> {
    let (d, p) = (cfg.hidden_size, cfg.patch_size);
    let patch = Linear::load(ck, "embeddings.patch_embedding", d, 3 * p * p)?;
    let dims = Dims {
        hidden: d,
        heads: cfg.num_attention_heads,
        mlp: cfg.intermediate_size,
        depth: cfg.num_hidden_layers,
        patch: p,
        grid: cfg.table_side(),
        act: cfg.hidden_act,
        eps: cfg.layer_norm_eps,
        use_head: cfg.vision_use_head,
    };
    SiglipVisionTower::assemble(ck, dims, patch, Positions::BilinearAntialias)
}
