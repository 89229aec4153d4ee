//! fp32 reference of the Qwen3-VL vision tower (Hugging Face layout).
//!
//! Qwen3-VL: <https://github.com/QwenLM/Qwen3-VL>; the maths follows
//! transformers' `models/qwen3_vl/modeling_qwen3_vl.py` (`Qwen3VLVisionModel`)
//! and `vision_utils.py` (position-table interpolation, rotary positions).
//! This is the oracle the release gates trust: it shares no code with the
//! export path and keeps the checkpoint's own layout, `(tokens, channels)`.
//!
//! Forward, for `pixel_values [n, C*T*P*P]` and `grid_thw [k, 3]`:
//! patch embedding (Conv3d == Linear) + bilinearly interpolated position
//! table -> `depth` pre-norm blocks with 2D rotary attention, each frame of
//! each image attending only to itself -> merger (LayerNorm, 2x2 merge,
//! fc1, erf GELU, fc2); after each block in `deepstack_visual_indexes` a
//! deepstack merger (merge first, then LayerNorm over 4D).

use candle_core::{Device, Tensor};

use crate::checkpoint::Checkpoint;
use crate::error::{GridError, Result};
use crate::family::qwen3_vl::Qwen3VisionConfig;
use crate::family::qwen3_vl::config::LAYER_NORM_EPS;
use crate::reference::kernels::{self, Attention};
use crate::reference::vit::{
    Linear, Merger, Norm, TowerOutput, activation, add, check_grid, frame_segments, load_blocks,
    merge_order, rotary,
};

struct Block {
    norm1: Norm,
    norm2: Norm,
    qkv: Linear,
    proj: Linear,
    fc1: Linear,
    fc2: Linear,
}

/// The merger (LayerNorm before merging) or a deepstack merger (after).
fn load_merger(
    ck: &Checkpoint,
    name: &str,
    cfg: &Qwen3VisionConfig,
    postshuffle: bool,
) -> Result<Merger> {
    let d = cfg.hidden_size;
    let md = d * cfg.spatial_merge_size * cfg.spatial_merge_size;
    Ok(Merger {
        norm: Norm::layer(
            ck,
            &format!("{name}.norm"),
            if postshuffle { md } else { d },
            LAYER_NORM_EPS,
        )?,
        postshuffle,
        fc1: Linear::load(ck, &format!("{name}.linear_fc1"), md, md)?,
        fc2: Linear::load(ck, &format!("{name}.linear_fc2"), cfg.out_hidden_size, md)?,
    })
}

/// The Qwen3-VL vision tower with weights in f32.
pub struct Qwen3VisionTower {
    cfg: Qwen3VisionConfig,
    patch: Linear,
    /// `[S*S, D]` learned position table, kept on the host as a flat vector.
    pos_table: Vec<f32>,
    blocks: Vec<Block>,
    merger: Merger,
    deepstack: Vec<Merger>,
}

impl Qwen3VisionTower {
    /// Load the tower from a checkpoint, checking every tensor's shape against the config.
    pub fn load(ck: &Checkpoint, cfg: &Qwen3VisionConfig) -> Result<Self> {
        let cfg = cfg.clone();
        let (d, p, t) = (cfg.hidden_size, cfg.patch_size, cfg.temporal_patch_size);
        // Conv3d with kernel == stride is a Linear over the flattened (c, t, py, px) patch.
        let pw = ck.tensor("patch_embed.proj.weight", &[d, cfg.in_channels, t, p, p])?;
        let patch = Linear::new(
            &pw.reshape((d, cfg.patch_dim()))?,
            ck.tensor("patch_embed.proj.bias", &[d])?,
        )?;
        let pos_table = ck
            .tensor("pos_embed.weight", &[cfg.num_position_embeddings, d])?
            .flatten_all()?
            .to_vec1::<f32>()?;
        let blocks = load_blocks(cfg.depth, |i| {
            let b = format!("blocks.{i}");
            Ok(Block {
                norm1: Norm::layer(ck, &format!("{b}.norm1"), d, LAYER_NORM_EPS)?,
                norm2: Norm::layer(ck, &format!("{b}.norm2"), d, LAYER_NORM_EPS)?,
                qkv: Linear::load(ck, &format!("{b}.attn.qkv"), 3 * d, d)?,
                proj: Linear::load(ck, &format!("{b}.attn.proj"), d, d)?,
                fc1: Linear::load(ck, &format!("{b}.mlp.linear_fc1"), cfg.intermediate_size, d)?,
                fc2: Linear::load(ck, &format!("{b}.mlp.linear_fc2"), d, cfg.intermediate_size)?,
            })
        })?;
        let merger = load_merger(ck, "merger", &cfg, false)?;
        let deepstack = (0..cfg.deepstack_visual_indexes.len())
            .map(|j| load_merger(ck, &format!("deepstack_merger_list.{j}"), &cfg, true))
            .collect::<Result<Vec<_>>>()?;
        Ok(Qwen3VisionTower {
            cfg,
            patch,
            pos_table,
            blocks,
            merger,
            deepstack,
        })
    }

    /// The configuration the tower was loaded with.
    pub fn config(&self) -> &Qwen3VisionConfig {
        &self.cfg
    }

    /// Check `grid_thw` against the row count and the merge size.
    pub fn check_grid(
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

    /// Run the tower. `pixel_values` is `[n, C*T*P*P]` f32.
    pub fn forward(
        &self,
        pixel_values: &Tensor,
        grid_thw: &[[usize; 3]],
        keep_blocks: bool,
    ) -> Result<TowerOutput> {
        let (n, cols) = pixel_values.dims2()?;
        self.check_grid(n, cols, grid_thw)?;
        let cfg = &self.cfg;
        let d = cfg.hidden_size;
        let unit = cfg.spatial_merge_size * cfg.spatial_merge_size;

        let pos = Tensor::from_vec(self.interpolate_pos(grid_thw), (n, d), &Device::Cpu)?;
        let mut x = add(&self.patch.forward(pixel_values)?, &pos)?; // (n, D)
        let (cos, sin) = rotary(
            grid_thw,
            cfg.spatial_merge_size,
            cfg.head_dim(),
            cfg.rope_theta,
        ); // (n, hd/2) each
        let attn = Attention {
            heads: cfg.num_heads,
            head_dim: cfg.head_dim(),
            cos,
            sin,
            segments: frame_segments(grid_thw),
        };

        let mut deepstack = Vec::new();
        let mut block_outputs = Vec::new();
        for (i, blk) in self.blocks.iter().enumerate() {
            x = self.block(blk, &x, &attn)?;
            if let Some(j) = cfg.deepstack_visual_indexes.iter().position(|&k| k == i) {
                deepstack.push(self.deepstack[j].forward(&x, unit)?);
            }
            if keep_blocks {
                block_outputs.push(x.clone());
            }
        }
        let embeds = self.merger.forward(&x, unit)?;
        Ok(TowerOutput {
            outputs: std::iter::once(embeds).chain(deepstack).collect(),
            block_outputs,
        })
    }

    fn block(&self, blk: &Block, x: &Tensor, attn: &Attention) -> Result<Tensor> {
        let h = blk.norm1.forward(x)?;
        // Rows of qkv.weight: [0, D) Q head-major, [D, 2D) K, [2D, 3D) V.
        let a = kernels::apply1(&blk.qkv.forward(&h)?, attn)?;
        let x = add(x, &blk.proj.forward(&a)?)?;
        let h = blk.norm2.forward(&x)?;
        let h = blk
            .fc2
            .forward(&activation(&blk.fc1.forward(&h)?, self.cfg.hidden_act)?)?;
        Ok(add(&x, &h)?)
    }

    /// Bilinear (align_corners) interpolation of the position table for every
    /// token, in merge-block order: `[n, D]` flattened.
    fn interpolate_pos(&self, grid_thw: &[[usize; 3]]) -> Vec<f32> {
        let cfg = &self.cfg;
        let (side, d, m) = (cfg.pos_side(), cfg.hidden_size, cfg.spatial_merge_size);
        // transformers' `_interpolation_axis_taps_weights`, bilinear, align_corners=True, f32.
        let taps = |index: usize, size: usize| -> ([usize; 2], [f32; 2]) {
            let src = index as f32 * (side - 1) as f32 / (size.max(2) - 1) as f32;
            let floor = src.floor();
            let mut t = [0usize; 2];
            let mut w = [0f32; 2];
            for o in 0..2 {
                t[o] = (floor as usize + o).min(side - 1);
                w[o] = (1.0 - (src - floor - o as f32).abs()).max(0.0);
            }
            (t, w)
        };
        let total: usize = grid_thw.iter().map(|g| g[0] * g[1] * g[2]).sum();
        let mut out = vec![0f32; total * d];
        let mut r = 0;
        for &[t, h, w] in grid_thw {
            let mut frame = Vec::with_capacity(h * w * d);
            for (row, col) in merge_order(h, w, m) {
                let (ht, hw) = taps(row, h);
                let (wt, ww) = taps(col, w);
                let mut acc = vec![0f32; d];
                let mut first = true;
                for a in 0..2 {
                    for b in 0..2 {
                        let wgt = hw[a] * ww[b];
                        let base = (ht[a] * side + wt[b]) * d;
                        let row_t = &self.pos_table[base..base + d];
                        for (o, &v) in acc.iter_mut().zip(row_t) {
                            *o = if first { v * wgt } else { *o + v * wgt };
                        }
                        first = false;
                    }
                }
                frame.extend_from_slice(&acc);
            }
            for _ in 0..t {
                out[r * d..(r + h * w) * d].copy_from_slice(&frame);
                r += h * w;
            }
        }
        out
    }
}

impl crate::reference::VisionTower for Qwen3VisionTower {
    fn forward(
        &self,
        pixel_values: &Tensor,
        grid_thw: &[[usize; 3]],
        keep_blocks: bool,
    ) -> Result<TowerOutput> {
        Qwen3VisionTower::forward(self, pixel_values, grid_thw, keep_blocks)
    }

    fn check_grid(
        &self,
        rows: usize,
        cols: usize,
        grid_thw: &[[usize; 3]],
    ) -> std::result::Result<(), GridError> {
        Qwen3VisionTower::check_grid(self, rows, cols, grid_thw)
    }
}
