//! fp32 reference of the Qwen2-VL vision tower (Hugging Face layout).
//!
//! The maths follows transformers' `models/qwen2_vl/modeling_qwen2_vl.py`
//! (`Qwen2VisionTransformerPretrainedModel`). This is an oracle the release
//! gates trust: it shares no code with the export path and keeps the
//! checkpoint's own layout, `(tokens, channels)`.
//!
//! Forward, for `pixel_values [n, C*T*P*P]` and `grid_thw [k, 3]`:
//! patch embedding (Conv3d without bias == Linear) -> `depth` pre-norm
//! blocks (LayerNorm, 2D rotary attention over each frame of each image,
//! LayerNorm, MLP fc1-act-fc2 with `hidden_act`, quick GELU in the released
//! checkpoints) -> merger (`ln_q` LayerNorm, 2x2 merge, `mlp.0`, erf GELU,
//! `mlp.2`). No position table, no deepstack.

use candle_core::Tensor;

use crate::checkpoint::Checkpoint;
use crate::error::{GridError, Result};
use crate::family::qwen2_vl::Qwen2VisionConfig;
use crate::family::qwen2_vl::config::LAYER_NORM_EPS;
use crate::reference::kernels::{self, Attention};
use crate::reference::vit::{
    Linear, Merger, Norm, TowerOutput, activation, add, check_grid, frame_segments, rotary,
};

struct Block {
    norm1: Norm,
    norm2: Norm,
    qkv: Linear,
    proj: Linear,
    fc1: Linear,
    fc2: Linear,
}

/// The Qwen2-VL vision tower with weights in f32.
pub struct Qwen2VisionTower {
    cfg: Qwen2VisionConfig,
    patch: Linear,
    blocks: Vec<Block>,
    merger: Merger,
}

impl Qwen2VisionTower {
    /// Load the tower from a checkpoint, checking every tensor's shape against `cfg`.
    pub fn load(ck: &Checkpoint, cfg: &Qwen2VisionConfig) -> Result<Self> {
        let cfg = cfg.clone();
        let (d, p, t) = (cfg.embed_dim, cfg.patch_size, cfg.temporal_patch_size);
        let patch = Linear::patch_embed_no_bias(ck, d, [cfg.in_channels, t, p])?;
        let mlp = cfg.mlp_dim();
        let blocks = crate::reference::vit::load_blocks(cfg.depth, |i| {
            let b = format!("blocks.{i}");
            Ok(Block {
                norm1: Norm::layer(ck, &format!("{b}.norm1"), d, LAYER_NORM_EPS)?,
                norm2: Norm::layer(ck, &format!("{b}.norm2"), d, LAYER_NORM_EPS)?,
                qkv: Linear::load(ck, &format!("{b}.attn.qkv"), 3 * d, d)?,
                proj: Linear::load(ck, &format!("{b}.attn.proj"), d, d)?,
                fc1: Linear::load(ck, &format!("{b}.mlp.fc1"), mlp, d)?,
                fc2: Linear::load(ck, &format!("{b}.mlp.fc2"), d, mlp)?,
            })
        })?;
        let merger = Merger::load_qwen2(
            ck,
            |ck, name, d| Norm::layer(ck, name, d, LAYER_NORM_EPS),
            d,
            cfg.spatial_merge_size,
            cfg.hidden_size,
        )?;
        Ok(Qwen2VisionTower {
            cfg,
            patch,
            blocks,
            merger,
        })
    }

    /// Run the tower. `pixel_values` is `[n, C*T*P*P]` f32.
    pub fn forward(
        &self,
        pixel_values: &Tensor,
        grid_thw: &[[usize; 3]],
        keep_blocks: bool,
    ) -> Result<TowerOutput> {
        let (n, cols) = pixel_values.dims2()?;
        let cfg = &self.cfg;
        let m = cfg.spatial_merge_size;
        check_grid(n, cols, grid_thw, cfg.patch_dim(), m)?;
        let (cos, sin) = rotary(grid_thw, m, cfg.head_dim(), cfg.rope_theta);
        let attn = Attention {
            heads: cfg.num_heads,
            head_dim: cfg.head_dim(),
            cos,
            sin,
            segments: frame_segments(grid_thw),
        };
        let mut x = self.patch.forward(pixel_values)?;
        let mut block_outputs = Vec::new();
        for blk in &self.blocks {
            let h = blk.norm1.forward(&x)?;
            // Rows of qkv.weight: [0, D) Q head-major, [D, 2D) K, [2D, 3D) V.
            let a = kernels::apply1(&blk.qkv.forward(&h)?, &attn)?;
            x = add(&x, &blk.proj.forward(&a)?)?;
            let h = blk.norm2.forward(&x)?;
            let h = blk
                .fc2
                .forward(&activation(&blk.fc1.forward(&h)?, cfg.hidden_act)?)?;
            x = add(&x, &h)?;
            if keep_blocks {
                block_outputs.push(x.clone());
            }
        }
        Ok(TowerOutput {
            outputs: vec![self.merger.forward(&x, m * m)?],
            block_outputs,
        })
    }
}

impl crate::reference::VisionTower for Qwen2VisionTower {
    fn forward(
        &self,
        pixel_values: &Tensor,
        grid_thw: &[[usize; 3]],
        keep_blocks: bool,
    ) -> Result<TowerOutput> {
        Qwen2VisionTower::forward(self, pixel_values, grid_thw, keep_blocks)
    }

    fn check_grid(
        &self,
        rows: usize,
        cols: usize,
        grid_thw: &[[usize; 3]],
    ) -> std::result::Result<(), GridError> {
        check_grid(
            rows,
            cols,
            grid_thw,
            self.cfg.patch_dim(),
            self.cfg.spatial_merge_size,
        )
    }
}
