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

use candle_core::{CpuStorage, CustomOp1, DType, Device, Layout, Shape, Tensor};
use rayon::prelude::*;

use crate::checkpoint::{Activation, Checkpoint, Qwen3VisionConfig, config::LAYER_NORM_EPS};
use crate::error::{Error, Result};

/// `x W^T + b` for `x (n, in)`, `W (out, in)`.
struct Linear {
    w: Tensor,
    b: Tensor,
}

impl Linear {
    fn load(ck: &Checkpoint, name: &str, out: usize, inp: usize) -> Result<Linear> {
        Ok(Linear {
            w: ck.tensor(&format!("{name}.weight"), &[out, inp])?,
            b: ck.tensor(&format!("{name}.bias"), &[out])?,
        })
    }
    fn forward(&self, x: &Tensor) -> candle_core::Result<Tensor> {
        x.matmul(&self.w.t()?)?.broadcast_add(&self.b)
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

/// Element-wise GELU over all cores (candle's unary ops run on one thread,
/// and the MLP activation is the largest element-wise op of the tower).
struct ParGelu(Activation);

impl CustomOp1 for ParGelu {
    fn name(&self) -> &'static str {
        "par-gelu"
    }
    fn cpu_fwd(&self, s: &CpuStorage, l: &Layout) -> candle_core::Result<(CpuStorage, Shape)> {
        let CpuStorage::F32(data) = s else {
            candle_core::bail!("par-gelu expects f32");
        };
        let Some((a, b)) = l.contiguous_offsets() else {
            candle_core::bail!("par-gelu expects a contiguous tensor");
        };
        let src = &data[a..b];
        let mut out = vec![0f32; src.len()];
        let act = self.0;
        out.par_chunks_mut(1 << 14)
            .zip(src.par_chunks(1 << 14))
            .for_each(|(o, i)| match act {
                Activation::GeluTanh => {
                    // PyTorch's gelu(approximate="tanh").
                    const BETA: f32 = 0.797_884_6; // sqrt(2 / pi)
                    const KAPPA: f32 = 0.044_715;
                    for (o, &x) in o.iter_mut().zip(i) {
                        *o = 0.5 * x * (1.0 + (BETA * (x + KAPPA * x * x * x)).tanh());
                    }
                }
                Activation::GeluErf => {
                    for (o, &x) in o.iter_mut().zip(i) {
                        *o = 0.5 * x * (1.0 + libm_erf(x / std::f32::consts::SQRT_2));
                    }
                }
            });
        Ok((CpuStorage::F32(out), l.shape().clone()))
    }
}

/// erf in f64 via candle's implementation, rounded to f32.
fn libm_erf(x: f32) -> f32 {
    candle_core::cpu::erf::erf_f64(f64::from(x)) as f32
}

fn gelu(x: &Tensor, act: Activation) -> candle_core::Result<Tensor> {
    x.contiguous()?.apply_op1_no_bwd(&ParGelu(act))
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
        let cfg = ck.vision.clone();
        let (d, p, t) = (cfg.hidden_size, cfg.patch_size, cfg.temporal_patch_size);
        // Conv3d with kernel == stride is a Linear over the flattened (c, t, py, px) patch.
        let pw = ck.tensor("patch_embed.proj.weight", &[d, cfg.in_channels, t, p, p])?;
        let patch = Linear {
            w: pw.reshape((d, cfg.patch_dim()))?,
            b: ck.tensor("patch_embed.proj.bias", &[d])?,
        };
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
        let mut x = (self.patch.forward(pixel_values)? + pos)?; // (n, D)
        let (cos, sin) = self.rotary(grid_thw)?; // (n, hd/2) each
        let segments = frame_segments(grid_thw);

        let mut deepstack = Vec::new();
        let mut block_outputs = Vec::new();
        for (i, blk) in self.blocks.iter().enumerate() {
            x = self.block(blk, &x, &cos, &sin, &segments)?;
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

    fn block(
        &self,
        blk: &Block,
        x: &Tensor,
        cos: &Tensor,
        sin: &Tensor,
        segments: &[(usize, usize)],
    ) -> Result<Tensor> {
        let h = blk.norm1.forward(x)?;
        let x = (x + self.attention(blk, &h, cos, sin, segments)?)?;
        let h = blk.norm2.forward(&x)?;
        let h = blk
            .fc2
            .forward(&gelu(&blk.fc1.forward(&h)?, self.cfg.hidden_act)?)?;
        Ok((x + h)?)
    }

    fn attention(
        &self,
        blk: &Block,
        x: &Tensor,
        cos: &Tensor,
        sin: &Tensor,
        segments: &[(usize, usize)],
    ) -> Result<Tensor> {
        let (n, d) = x.dims2()?;
        let heads = self.cfg.num_heads;
        let hd = self.cfg.head_dim();
        // Rows of qkv.weight: [0, D) Q head-major, [D, 2D) K, [2D, 3D) V.
        let qkv = blk
            .qkv
            .forward(x)?
            .reshape((n, 3, heads, hd))?
            .permute((1, 2, 0, 3))?; // (3, H, n, hd)
        let q = candle_nn::rotary_emb::rope(&qkv.get(0)?.unsqueeze(0)?.contiguous()?, cos, sin)?;
        let k = candle_nn::rotary_emb::rope(&qkv.get(1)?.unsqueeze(0)?.contiguous()?, cos, sin)?;
        let v = qkv.get(2)?.contiguous()?.unsqueeze(0)?;
        let q = (q * (hd as f64).powf(-0.5))?;
        let mut outs = Vec::with_capacity(segments.len());
        for &(s, len) in segments {
            let (qs, ks, vs) = (
                q.narrow(2, s, len)?,
                k.narrow(2, s, len)?,
                v.narrow(2, s, len)?,
            );
            // Bound the score tensor to about 256 MB by taking heads in groups.
            let group = ((1usize << 26) / (len * len).max(1)).clamp(1, heads);
            let mut parts = Vec::new();
            for h0 in (0..heads).step_by(group) {
                let g = group.min(heads - h0);
                let (qh, kh, vh) = (
                    qs.narrow(1, h0, g)?.contiguous()?,
                    ks.narrow(1, h0, g)?.contiguous()?,
                    vs.narrow(1, h0, g)?.contiguous()?,
                );
                let scores = qh.matmul(&kh.t()?)?; // (1, g, len, len)
                let probs = candle_nn::ops::softmax_last_dim(&scores)?;
                parts.push(probs.matmul(&vh)?); // (1, g, len, hd)
            }
            outs.push(Tensor::cat(&parts, 1)?);
        }
        let o = Tensor::cat(&outs, 2)?; // (1, H, n, hd)
        let o = o.squeeze(0)?.transpose(0, 1)?.reshape((n, d))?;
        Ok(blk.proj.forward(&o)?)
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
    fn rotary(&self, grid_thw: &[[usize; 3]]) -> Result<(Tensor, Tensor)> {
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
        let cos = Tensor::from_vec(cos, (total, spatial), &Device::Cpu)?;
        let sin = Tensor::from_vec(sin, (total, spatial), &Device::Cpu)?;
        Ok((cos, sin))
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

/// Convert a `TowerOutput` tensor to a flat f32 vector.
pub fn to_vec(t: &Tensor) -> Result<Vec<f32>> {
    Ok(t.to_dtype(DType::F32)?.flatten_all()?.to_vec1::<f32>()?)
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::D;

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

    #[test]
    fn parallel_gelu_matches_candle() {
        let x = Tensor::arange(-600f32, 600.0, &Device::Cpu).unwrap();
        let x = (x / 100.0).unwrap();
        let ours = gelu(&x, Activation::GeluTanh).unwrap();
        let theirs = x.gelu().unwrap();
        let diff = (ours - theirs)
            .unwrap()
            .abs()
            .unwrap()
            .max(D::Minus1)
            .unwrap();
        assert!(diff.to_scalar::<f32>().unwrap() < 1e-6);
        let ours = gelu(&x, Activation::GeluErf).unwrap();
        let theirs = x.gelu_erf().unwrap();
        let diff = (ours - theirs)
            .unwrap()
            .abs()
            .unwrap()
            .max(D::Minus1)
            .unwrap();
        assert!(diff.to_scalar::<f32>().unwrap() < 1e-6);
    }
}
