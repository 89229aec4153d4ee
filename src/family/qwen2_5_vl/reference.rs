//! fp32 reference of the Qwen2.5-VL vision tower (Hugging Face layout).
//!
//! The maths follows transformers' `models/qwen2_5_vl/modeling_qwen2_5_vl.py`
//! (`Qwen2_5_VisionTransformerPretrainedModel`) and `vision_utils.py`
//! (`get_vision_window_index`). An oracle the release gates trust: it shares
//! no code with the export path (whose host pads windows to a fixed size;
//! here windows keep their real sizes, as in transformers).
//!
//! Forward, for `pixel_values [n, C*T*P*P]` (merge-block order) and
//! `grid_thw [k, 3]`: patch embedding (Conv3d without bias == Linear) ->
//! rows reordered by window (each window `window_size / patch / merge`
//! merge units on a side, raster order of windows and of units within
//! one; edge windows smaller) -> `depth` pre-norm blocks (RMSNorm, 2D rotary
//! attention within each window, or over each frame for the blocks in
//! `fullatt_block_indexes`, RMSNorm, SwiGLU MLP with biases) -> merger
//! (`ln_q` RMSNorm, 2x2 merge, `mlp.0`, erf GELU, `mlp.2`) -> merged tokens
//! put back in merge-block order. No position table, no deepstack.

use candle_core::{Device, Tensor};

use crate::checkpoint::Checkpoint;
use crate::error::{GridError, Result};
use crate::family::qwen2_5_vl::Qwen25VisionConfig;
use crate::family::qwen2_5_vl::config::RMS_NORM_EPS;
use crate::reference::kernels::{self, Attention};
use crate::reference::vit::{
    Linear, Merger, Norm, TowerOutput, activation, add, check_grid, frame_segments, rotary,
};

struct Block {
    norm1: Norm,
    norm2: Norm,
    qkv: Linear,
    proj: Linear,
    gate: Linear,
    up: Linear,
    down: Linear,
}

/// The Qwen2.5-VL vision tower with weights in f32.
pub struct Qwen25VisionTower {
    cfg: Qwen25VisionConfig,
    patch: Linear,
    blocks: Vec<Block>,
    merger: Merger,
}

/// transformers' `get_vision_window_index`: the merge units of every frame
/// in window order (as indexes into the call's merge units), and each
/// window's length in patches.
pub fn window_index(
    grid_thw: &[[usize; 3]],
    m: usize,
    window_units: usize,
) -> (Vec<usize>, Vec<usize>) {
    let (mut index, mut lens) = (Vec::new(), Vec::new());
    let mut base = 0;
    for &[t, h, w] in grid_thw {
        let (uh, uw) = (h / m, w / m);
        for f in 0..t {
            let frame = base + f * uh * uw;
            for wr in 0..uh.div_ceil(window_units) {
                for wc in 0..uw.div_ceil(window_units) {
                    let mut len = 0;
                    for r in wr * window_units..((wr + 1) * window_units).min(uh) {
                        for c in wc * window_units..((wc + 1) * window_units).min(uw) {
                            index.push(frame + r * uw + c);
                            len += m * m;
                        }
                    }
                    lens.push(len);
                }
            }
        }
        base += t * uh * uw;
    }
    (index, lens)
}

/// Rows `[n, width]` regrouped by merge unit (`unit` rows each): unit `j`
/// of the result is unit `order[j]` of `v`.
fn permute_units(v: &[f32], width: usize, unit: usize, order: &[usize]) -> Vec<f32> {
    let block = width * unit;
    let mut out = Vec::with_capacity(v.len());
    for &u in order {
        out.extend_from_slice(&v[u * block..(u + 1) * block]);
    }
    out
}

impl Qwen25VisionTower {
    /// Load the tower from a checkpoint, checking every tensor's shape against `cfg`.
    pub fn load(ck: &Checkpoint, cfg: &Qwen25VisionConfig) -> Result<Self> {
        let cfg = cfg.clone();
        let (d, p, t, i) = (
            cfg.hidden_size,
            cfg.patch_size,
            cfg.temporal_patch_size,
            cfg.intermediate_size,
        );
        let patch = Linear::patch_embed_no_bias(ck, d, [cfg.in_channels, t, p])?;
        let blocks = crate::reference::vit::load_blocks(cfg.depth, |k| {
            let b = format!("blocks.{k}");
            Ok(Block {
                norm1: Norm::rms(ck, &format!("{b}.norm1"), d, RMS_NORM_EPS)?,
                norm2: Norm::rms(ck, &format!("{b}.norm2"), d, RMS_NORM_EPS)?,
                qkv: Linear::load(ck, &format!("{b}.attn.qkv"), 3 * d, d)?,
                proj: Linear::load(ck, &format!("{b}.attn.proj"), d, d)?,
                gate: Linear::load(ck, &format!("{b}.mlp.gate_proj"), i, d)?,
                up: Linear::load(ck, &format!("{b}.mlp.up_proj"), i, d)?,
                down: Linear::load(ck, &format!("{b}.mlp.down_proj"), d, i)?,
            })
        })?;
        let merger = Merger::load_qwen2(
            ck,
            |ck, name, d| Norm::rms(ck, name, d, RMS_NORM_EPS),
            d,
            cfg.spatial_merge_size,
            cfg.out_hidden_size,
        )?;
        Ok(Qwen25VisionTower {
            cfg,
            patch,
            blocks,
            merger,
        })
    }

    /// Run the tower. `pixel_values` is `[n, C*T*P*P]` f32. Block outputs,
    /// when kept, are put back in merge-block order (transformers' hidden
    /// states are in window order).
    pub fn forward(
        &self,
        pixel_values: &Tensor,
        grid_thw: &[[usize; 3]],
        keep_blocks: bool,
    ) -> Result<TowerOutput> {
        let (n, cols) = pixel_values.dims2()?;
        let cfg = &self.cfg;
        let (d, m, hd) = (cfg.hidden_size, cfg.spatial_merge_size, cfg.head_dim());
        let unit = m * m;
        check_grid(n, cols, grid_thw, cfg.patch_dim(), m)?;
        let (order, lens) = window_index(grid_thw, m, cfg.window_units());
        let (cos, sin) = rotary(grid_thw, m, hd, cfg.rope_theta);
        let (cos, sin) = (
            permute_units(&cos, hd / 2, unit, &order),
            permute_units(&sin, hd / 2, unit, &order),
        );
        let mut starts = Vec::with_capacity(lens.len());
        let mut s = 0;
        for &l in &lens {
            starts.push((s, l));
            s += l;
        }
        let windowed = Attention {
            heads: cfg.num_heads,
            head_dim: hd,
            cos: cos.clone(),
            sin: sin.clone(),
            segments: starts,
        };
        // Frames stay contiguous in window order: windows never cross a frame.
        let full = Attention {
            heads: cfg.num_heads,
            head_dim: hd,
            cos,
            sin,
            segments: frame_segments(grid_thw),
        };
        let x = self.patch.forward(pixel_values)?;
        let x = permute_units(&x.flatten_all()?.to_vec1::<f32>()?, d, unit, &order);
        let mut x = Tensor::from_vec(x, (n, d), &Device::Cpu)?;
        let mut block_outputs = Vec::new();
        for (k, blk) in self.blocks.iter().enumerate() {
            let attn = if cfg.fullatt_block_indexes.contains(&k) {
                &full
            } else {
                &windowed
            };
            let h = blk.norm1.forward(&x)?;
            let a = kernels::apply1(&blk.qkv.forward(&h)?, attn)?;
            x = add(&x, &blk.proj.forward(&a)?)?;
            let h = blk.norm2.forward(&x)?;
            let g = activation(&blk.gate.forward(&h)?, cfg.hidden_act)?;
            let h = blk.down.forward(&(g * blk.up.forward(&h)?)?)?;
            x = add(&x, &h)?;
            if keep_blocks {
                // Back in merge-block order, as the other towers return them.
                let v = x.flatten_all()?.to_vec1::<f32>()?;
                let mut back = vec![0f32; v.len()];
                for (j, &u) in order.iter().enumerate() {
                    back[u * unit * d..(u + 1) * unit * d]
                        .copy_from_slice(&v[j * unit * d..(j + 1) * unit * d]);
                }
                block_outputs.push(Tensor::from_vec(back, (n, d), &Device::Cpu)?);
            }
        }
        let merged = self.merger.forward(&x, unit)?; // window order
        let out = cfg.out_hidden_size;
        let merged = merged.flatten_all()?.to_vec1::<f32>()?;
        let mut embeds = vec![0f32; merged.len()];
        for (j, &u) in order.iter().enumerate() {
            embeds[u * out..(u + 1) * out].copy_from_slice(&merged[j * out..(j + 1) * out]);
        }
        Ok(TowerOutput {
            outputs: vec![Tensor::from_vec(embeds, (n / unit, out), &Device::Cpu)?],
            block_outputs,
        })
    }
}

impl crate::reference::VisionTower for Qwen25VisionTower {
    fn forward(
        &self,
        pixel_values: &Tensor,
        grid_thw: &[[usize; 3]],
        keep_blocks: bool,
    ) -> Result<TowerOutput> {
        Qwen25VisionTower::forward(self, pixel_values, grid_thw, keep_blocks)
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

#[cfg(test)]
mod tests {
    use super::*;

    /// A 6 x 10 unit grid in windows of 4 units: windows of 4x4, 4x4, 4x2,
    /// 2x4, 2x4, 2x2 units, units in raster order within each.
    #[test]
    fn windows_are_raster_ordered_with_smaller_edges() {
        let (order, lens) = window_index(&[[1, 12, 20]], 2, 4);
        assert_eq!(lens, vec![64, 64, 32, 32, 32, 16]);
        assert_eq!(&order[..5], &[0, 1, 2, 3, 10]);
        assert_eq!(order.len(), 60);
        let mut sorted = order.clone();
        sorted.sort();
        assert_eq!(sorted, (0..60).collect::<Vec<_>>());
        // Second image's units follow the first's.
        let (order, lens) = window_index(&[[1, 2, 2], [2, 4, 2]], 2, 4);
        assert_eq!(order, vec![0, 1, 2, 3, 4]);
        assert_eq!(lens, vec![4, 8, 8]);
    }
}
