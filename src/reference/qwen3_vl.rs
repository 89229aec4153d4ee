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

use candle_core::{DType, Device, Tensor};

use super::kernels::{self, Attention, Gelu, LinearOp, ParAdd};
use crate::checkpoint::{Activation, Checkpoint, Qwen3VisionConfig, qwen3_vl::LAYER_NORM_EPS};
use crate::error::{Error, Result};

/// `x W^T + b` for `x (n, in)`; the checkpoint's `W (out, in)` is kept
/// transposed, `(in, out)`, for the matrix product.
struct Linear {
    wt: Tensor,
    b: Tensor,
}

impl Linear {
    fn load(ck: &Checkpoint, name: &str, out: usize, inp: usize) -> Result<Linear> {
        let w = ck.tensor(&format!("{name}.weight"), &[out, inp])?;
        Linear::new(&w, ck.tensor(&format!("{name}.bias"), &[out])?)
    }
    fn new(w: &Tensor, b: Tensor) -> Result<Linear> {
        let (out, inp) = w.dims2()?;
        let wt = kernels::transpose(&w.flatten_all()?.to_vec1::<f32>()?, out, inp);
        Ok(Linear {
            wt: Tensor::from_vec(wt, (inp, out), &Device::Cpu)?,
            b,
        })
    }
    fn forward(&self, x: &Tensor) -> candle_core::Result<Tensor> {
        x.contiguous()?
            .apply_op3_no_bwd(&self.wt, &self.b, &LinearOp)
    }
}

struct LayerNorm {
    w: Tensor,
    b: Tensor,
}

impl LayerNorm {
    fn load(ck: &Checkpoint, name: &str, dim: usize) -> Result<LayerNorm> {
        Ok(LayerNorm {
            w: ck.tensor(&format!("{name}.weight"), &[dim])?,
            b: ck.tensor(&format!("{name}.bias"), &[dim])?,
        })
    }
    fn forward(&self, x: &Tensor) -> candle_core::Result<Tensor> {
        candle_nn::ops::layer_norm(x, &self.w, &self.b, LAYER_NORM_EPS as f32)
    }
}

fn gelu(x: &Tensor, act: Activation) -> candle_core::Result<Tensor> {
    let op = match act {
        Activation::GeluTanh => Gelu::Tanh,
        Activation::GeluErf => Gelu::Erf,
        other => {
            return Err(candle_core::Error::Msg(format!(
                "vision_config.hidden_act: {} is not a Qwen3-VL activation",
                other.hf_name()
            )));
        }
    };
    kernels::apply1(x, &op)
}

fn add(a: &Tensor, b: &Tensor) -> candle_core::Result<Tensor> {
    a.contiguous()?.apply_op2_no_bwd(&b.contiguous()?, &ParAdd)
}

struct Block {
    norm1: LayerNorm,
    norm2: LayerNorm,
    qkv: Linear,
    proj: Linear,
    fc1: Linear,
    fc2: Linear,
}

/// The merger and the deepstack mergers: `m*m` consecutive rows become one.
struct Merger {
    norm: LayerNorm,
    /// Deepstack mergers normalise after merging rows (over `m*m*D`).
    postshuffle: bool,
    fc1: Linear,
    fc2: Linear,
}

impl Merger {
    fn load(
        ck: &Checkpoint,
        name: &str,
        cfg: &Qwen3VisionConfig,
        postshuffle: bool,
    ) -> Result<Merger> {
        let d = cfg.hidden_size;
        let md = d * cfg.spatial_merge_size * cfg.spatial_merge_size;
        Ok(Merger {
            norm: LayerNorm::load(
                ck,
                &format!("{name}.norm"),
                if postshuffle { md } else { d },
            )?,
            postshuffle,
            fc1: Linear::load(ck, &format!("{name}.linear_fc1"), md, md)?,
            fc2: Linear::load(ck, &format!("{name}.linear_fc2"), cfg.out_hidden_size, md)?,
        })
    }

    fn forward(&self, x: &Tensor, unit: usize) -> candle_core::Result<Tensor> {
        let (n, d) = x.dims2()?;
        let x = if self.postshuffle {
            self.norm.forward(&x.reshape((n / unit, d * unit))?)?
        } else {
            self.norm.forward(x)?.reshape((n / unit, d * unit))?
        };
        // nn.GELU() in the merger is the exact erf form.
        let x = gelu(&self.fc1.forward(&x)?, Activation::GeluErf)?;
        self.fc2.forward(&x)
    }
}

/// What the tower returns for one call.
pub struct TowerOutput {
    /// `[n / merge^2, out_hidden_size]`.
    pub embeds: Tensor,
    /// One `[n / merge^2, out_hidden_size]` per deepstack index, in config order.
    pub deepstack: Vec<Tensor>,
    /// `[n, hidden]` after each block, when asked for.
    pub block_outputs: Vec<Tensor>,
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
    pub fn load(ck: &Checkpoint) -> Result<Self> {
        let cfg = ck
            .vision
            .qwen3_vl()
            .ok_or_else(|| Error::checkpoint(&ck.dir, "not a Qwen3-VL vision tower"))?
            .clone();
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
        let mut blocks = Vec::with_capacity(cfg.depth);
        for i in 0..cfg.depth {
            let b = format!("blocks.{i}");
            blocks.push(Block {
                norm1: LayerNorm::load(ck, &format!("{b}.norm1"), d)?,
                norm2: LayerNorm::load(ck, &format!("{b}.norm2"), d)?,
                qkv: Linear::load(ck, &format!("{b}.attn.qkv"), 3 * d, d)?,
                proj: Linear::load(ck, &format!("{b}.attn.proj"), d, d)?,
                fc1: Linear::load(ck, &format!("{b}.mlp.linear_fc1"), cfg.intermediate_size, d)?,
                fc2: Linear::load(ck, &format!("{b}.mlp.linear_fc2"), d, cfg.intermediate_size)?,
            });
        }
        let merger = Merger::load(ck, "merger", &cfg, false)?;
        let deepstack = (0..cfg.deepstack_visual_indexes.len())
            .map(|j| Merger::load(ck, &format!("deepstack_merger_list.{j}"), &cfg, true))
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
    ) -> std::result::Result<(), String> {
        let m = self.cfg.spatial_merge_size;
        if cols != self.cfg.patch_dim() {
            return Err(format!(
                "pixel_values rows hold {cols} values, the model expects {}",
                self.cfg.patch_dim()
            ));
        }
        if grid_thw.is_empty() {
            return Err("grid_thw is empty".into());
        }
        let mut total = 0usize;
        for (i, &[t, h, w]) in grid_thw.iter().enumerate() {
            if t == 0 || h == 0 || w == 0 || h % m != 0 || w % m != 0 {
                return Err(format!(
                    "grid_thw[{i}] = [{t}, {h}, {w}]: expected positive sizes with h and w multiples of {m}"
                ));
            }
            total = t
                .checked_mul(h)
                .and_then(|x| x.checked_mul(w))
                .and_then(|x| x.checked_add(total))
                .ok_or_else(|| format!("grid_thw[{i}] overflows"))?;
        }
        if total != rows {
            return Err(format!(
                "grid_thw describes {total} patches but pixel_values has {rows} rows"
            ));
        }
        Ok(())
    }

    /// Run the tower. `pixel_values` is `[n, C*T*P*P]` f32.
    pub fn forward(
        &self,
        pixel_values: &Tensor,
        grid_thw: &[[usize; 3]],
        keep_blocks: bool,
    ) -> Result<TowerOutput> {
        let (n, cols) = pixel_values.dims2()?;
        self.check_grid(n, cols, grid_thw).map_err(Error::Invalid)?;
        let cfg = &self.cfg;
        let d = cfg.hidden_size;
        let unit = cfg.spatial_merge_size * cfg.spatial_merge_size;

        let pos = Tensor::from_vec(self.interpolate_pos(grid_thw), (n, d), &Device::Cpu)?;
        let mut x = add(&self.patch.forward(pixel_values)?, &pos)?; // (n, D)
        let (cos, sin) = self.rotary(grid_thw); // (n, hd/2) each
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
            embeds,
            deepstack,
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
            .forward(&gelu(&blk.fc1.forward(&h)?, self.cfg.hidden_act)?)?;
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

    /// Rotary cos/sin, `[n, head_dim / 2]` each: `[row * inv_freq, col * inv_freq]`.
    fn rotary(&self, grid_thw: &[[usize; 3]]) -> (Vec<f32>, Vec<f32>) {
        let cfg = &self.cfg;
        let spatial = cfg.head_dim() / 2;
        let theta = cfg.rope_theta as f32;
        let inv: Vec<f32> = (0..spatial)
            .step_by(2)
            .map(|k| 1.0 / theta.powf(k as f32 / spatial as f32))
            .collect();
        let total: usize = grid_thw.iter().map(|g| g[0] * g[1] * g[2]).sum();
        let mut cos = Vec::with_capacity(total * spatial);
        let mut sin = Vec::with_capacity(total * spatial);
        for &[t, h, w] in grid_thw {
            for _ in 0..t {
                for (row, col) in merge_order(h, w, cfg.spatial_merge_size) {
                    for pos in [row, col] {
                        for &f in &inv {
                            let a = pos as f32 * f;
                            cos.push(a.cos());
                            sin.push(a.sin());
                        }
                    }
                }
            }
        }
        (cos, sin)
    }
}

/// (row, col) of each token of an `h x w` grid in merge-block order.
fn merge_order(h: usize, w: usize, m: usize) -> impl Iterator<Item = (usize, usize)> {
    (0..h / m).flat_map(move |br| {
        (0..w / m).flat_map(move |bc| {
            (0..m).flat_map(move |ir| (0..m).map(move |ic| (br * m + ir, bc * m + ic)))
        })
    })
}

/// `(start, len)` of each attention segment: every frame of every image.
fn frame_segments(grid_thw: &[[usize; 3]]) -> Vec<(usize, usize)> {
    let mut v = Vec::new();
    let mut s = 0;
    for &[t, h, w] in grid_thw {
        for _ in 0..t {
            v.push((s, h * w));
            s += h * w;
        }
    }
    v
}

impl super::VisionTower for Qwen3VisionTower {
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
    ) -> std::result::Result<(), String> {
        Qwen3VisionTower::check_grid(self, rows, cols, grid_thw)
    }
}

/// Convert a `TowerOutput` tensor to a flat f32 vector.
pub fn to_vec(t: &Tensor) -> Result<Vec<f32>> {
    Ok(t.to_dtype(DType::F32)?.flatten_all()?.to_vec1::<f32>()?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn merge_order_groups_2x2_blocks() {
        let v: Vec<_> = merge_order(4, 4, 2).take(8).collect();
        assert_eq!(
            v,
            vec![
                (0, 0),
                (0, 1),
                (1, 0),
                (1, 1),
                (0, 2),
                (0, 3),
                (1, 2),
                (1, 3)
            ]
        );
    }

    #[test]
    fn segments_split_frames_and_images() {
        assert_eq!(
            frame_segments(&[[2, 2, 4], [1, 4, 4]]),
            vec![(0, 8), (8, 8), (16, 16)]
        );
    }
}
