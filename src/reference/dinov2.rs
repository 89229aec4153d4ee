//! fp32 reference of the DINOv2 tower (Hugging Face layout), with or
//! without registers.
//!
//! The maths follows transformers' `models/dinov2/modeling_dinov2.py` and
//! `models/dinov2_with_registers/modeling_dinov2_with_registers.py`. This is
//! an oracle the release gates trust: it shares no code with the export path
//! (the host's position resampling included) and keeps the checkpoint's own
//! layout, `(tokens, channels)`.
//!
//! Forward, for each image of `pixel_values [n, 3*P*P]` (patches in raster
//! order) and its `grid_thw [1, h, w]`: patch embedding (Conv2d with bias
//! == Linear), the class token prepended, the position table added (the
//! checkpoint's `g x g` patch rows resampled to `h x w` by PyTorch's
//! bicubic `interpolate`, `align_corners=False`, with antialiasing for
//! `dinov2_with_registers`; unchanged when `h == w == g`), the register
//! tokens inserted after the class token (no position), `num_hidden_layers`
//! blocks (`norm1`, attention with q, k, v, out biases and no rotary,
//! `layer_scale1`, residual; `norm2`, MLP fc1 - `hidden_act` - fc2 or
//! SwiGLU, `layer_scale2`, residual), then `layernorm`.
//! `last_hidden_state` is the normalised sequence (class token, registers,
//! patches); `pooler_output` its class token.

use candle_core::{DType, Device, Tensor};

use super::kernels::Attention;
use super::vit::{Linear, Norm, TowerOutput, activation, add, check_grid, concat_blocks};
use crate::checkpoint::{Activation, Checkpoint, Dinov2VisionConfig};
use crate::error::{Error, Result};

/// The MLP of a block: fc1 - act - fc2, or SwiGLU.
enum Mlp {
    Fc {
        fc1: Linear,
        fc2: Linear,
    },
    /// `weights_in` gives `[gate, up]` of `hidden` each: `silu(gate) * up`.
    SwiGlu {
        win: Linear,
        wout: Linear,
        hidden: usize,
    },
}

/// One `encoder.layer.<i>`.
struct Layer {
    norm1: Norm,
    /// q, k and v fused: rows `[0, D)` Q, `[D, 2D)` K, `[2D, 3D)` V.
    qkv: Linear,
    out: Linear,
    ls1: Tensor,
    norm2: Norm,
    mlp: Mlp,
    ls2: Tensor,
}

impl Layer {
    fn load(ck: &Checkpoint, i: usize, c: &Dinov2VisionConfig) -> Result<Layer> {
        let (d, h, eps) = (c.hidden_size, c.mlp_hidden(), c.layer_norm_eps);
        let l = format!("encoder.layer.{i}");
        let mut ws = Vec::new();
        let mut bs = Vec::new();
        for part in ["query", "key", "value"] {
            let n = format!("{l}.attention.attention.{part}");
            ws.push(ck.tensor(&format!("{n}.weight"), &[d, d])?);
            bs.push(if c.qkv_bias {
                ck.tensor(&format!("{n}.bias"), &[d])?
            } else {
                Tensor::zeros(d, DType::F32, &Device::Cpu)?
            });
        }
        let mlp = if c.use_swiglu_ffn {
            Mlp::SwiGlu {
                win: Linear::load(ck, &format!("{l}.mlp.weights_in"), 2 * h, d)?,
                wout: Linear::load(ck, &format!("{l}.mlp.weights_out"), d, h)?,
                hidden: h,
            }
        } else {
            Mlp::Fc {
                fc1: Linear::load(ck, &format!("{l}.mlp.fc1"), h, d)?,
                fc2: Linear::load(ck, &format!("{l}.mlp.fc2"), d, h)?,
            }
        };
        Ok(Layer {
            norm1: Norm::layer(ck, &format!("{l}.norm1"), d, eps)?,
            qkv: Linear::new(&Tensor::cat(&ws, 0)?, Tensor::cat(&bs, 0)?)?,
            out: Linear::load(ck, &format!("{l}.attention.output.dense"), d, d)?,
            ls1: ck.tensor(&format!("{l}.layer_scale1.lambda1"), &[d])?,
            norm2: Norm::layer(ck, &format!("{l}.norm2"), d, eps)?,
            mlp,
            ls2: ck.tensor(&format!("{l}.layer_scale2.lambda1"), &[d])?,
        })
    }

    fn forward(
        &self,
        x: &Tensor,
        attn: &Attention,
        act: Activation,
    ) -> candle_core::Result<Tensor> {
        let h = self.norm1.forward(x)?;
        let a = super::kernels::apply1(&self.qkv.forward(&h)?, attn)?;
        let a = self.out.forward(&a)?.broadcast_mul(&self.ls1)?;
        let x = add(x, &a)?;
        let h = self.norm2.forward(&x)?;
        let h = match &self.mlp {
            Mlp::Fc { fc1, fc2 } => fc2.forward(&activation(&fc1.forward(&h)?, act)?)?,
            Mlp::SwiGlu { win, wout, hidden } => {
                let gu = win.forward(&h)?;
                let gate = activation(&gu.narrow(1, 0, *hidden)?, Activation::Silu)?;
                wout.forward(&gate.mul(&gu.narrow(1, *hidden, *hidden)?)?)?
            }
        };
        add(&x, &h.broadcast_mul(&self.ls2)?)
    }
}

/// The DINOv2 tower with its weights (f32 math).
pub struct Dinov2Tower {
    cfg: Dinov2VisionConfig,
    patch: Linear,
    class: Tensor,
    /// `[g*g + 1, D]`, the class token's row first.
    positions: Vec<f32>,
    /// `[R, D]`, `None` without registers.
    registers: Option<Tensor>,
    blocks: Vec<Layer>,
    norm: Norm,
}

impl Dinov2Tower {
    /// Load the tower from a checkpoint, checking every tensor's shape against `cfg`.
    pub fn load(ck: &Checkpoint, cfg: &Dinov2VisionConfig) -> Result<Self> {
        let cfg = cfg.clone();
        let (d, p) = (cfg.hidden_size, cfg.patch_size);
        let w = ck.tensor(
            "embeddings.patch_embeddings.projection.weight",
            &[d, 3, p, p],
        )?;
        let b = ck.tensor("embeddings.patch_embeddings.projection.bias", &[d])?;
        let patch = Linear::new(&w.reshape((d, 3 * p * p))?, b)?;
        let class = ck
            .tensor("embeddings.cls_token", &[1, 1, d])?
            .reshape((1, d))?;
        let positions = ck
            .tensor("embeddings.position_embeddings", &[1, cfg.positions(), d])?
            .flatten_all()?
            .to_vec1::<f32>()?;
        let r = cfg.num_register_tokens;
        let registers = if r > 0 {
            Some(
                ck.tensor("embeddings.register_tokens", &[1, r, d])?
                    .reshape((r, d))?,
            )
        } else {
            None
        };
        let blocks = (0..cfg.num_hidden_layers)
            .map(|i| Layer::load(ck, i, &cfg))
            .collect::<Result<Vec<_>>>()?;
        Ok(Dinov2Tower {
            patch,
            class,
            positions,
            registers,
            blocks,
            norm: Norm::layer(ck, "layernorm", d, cfg.layer_norm_eps)?,
            cfg,
        })
    }

    fn check(
        &self,
        rows: usize,
        cols: usize,
        grid_thw: &[[usize; 3]],
    ) -> std::result::Result<(), String> {
        let p = self.cfg.patch_size;
        check_grid(rows, cols, grid_thw, 3 * p * p, 1)?;
        for (i, &[t, ..]) in grid_thw.iter().enumerate() {
            if t != 1 {
                return Err(format!(
                    "grid_thw[{i}]: {t} frames; DINOv2 takes one image per grid (t = 1)"
                ));
            }
        }
        Ok(())
    }

    /// The position rows `[1 + h*w, D]` of an `h x w` grid: the class
    /// token's row, then the patch rows resampled (PyTorch's bicubic
    /// `interpolate`, computed here in f64 as dense matrices), or the table
    /// itself when the grid is the table's.
    fn position_rows(&self, h: usize, w: usize) -> Result<Tensor> {
        let (g, d) = (self.cfg.grid(), self.cfg.hidden_size);
        if h == g && w == g {
            return Ok(Tensor::from_slice(
                &self.positions,
                (g * g + 1, d),
                &Device::Cpu,
            )?);
        }
        let aa = self.cfg.interpolate_antialias;
        let (mh, mw) = (resample_matrix(g, h, aa), resample_matrix(g, w, aa));
        let table = &self.positions[d..];
        // Along the width: t1[a][x][c] = sum_b mw[x][b] table[a][b][c].
        let mut t1 = vec![0f64; g * w * d];
        for a in 0..g {
            for x in 0..w {
                let o = &mut t1[(a * w + x) * d..(a * w + x + 1) * d];
                for b in 0..g {
                    let k = mw[x * g + b];
                    if k != 0.0 {
                        let row = &table[(a * g + b) * d..(a * g + b + 1) * d];
                        for (o, v) in o.iter_mut().zip(row) {
                            *o += k * *v as f64;
                        }
                    }
                }
            }
        }
        // Then along the height.
        let mut out: Vec<f32> = self.positions[..d].to_vec();
        out.reserve(h * w * d);
        for y in 0..h {
            for x in 0..w {
                let mut acc = vec![0f64; d];
                for a in 0..g {
                    let k = mh[y * g + a];
                    if k != 0.0 {
                        for (o, v) in acc
                            .iter_mut()
                            .zip(&t1[(a * w + x) * d..(a * w + x + 1) * d])
                        {
                            *o += k * v;
                        }
                    }
                }
                out.extend(acc.iter().map(|v| *v as f32));
            }
        }
        Ok(Tensor::from_vec(out, (1 + h * w, d), &Device::Cpu)?)
    }

    /// Run the tower over each image; outputs are the images' rows one after another.
    pub fn forward(
        &self,
        pixel_values: &Tensor,
        grid_thw: &[[usize; 3]],
        keep_blocks: bool,
    ) -> Result<TowerOutput> {
        let (n, cols) = pixel_values.dims2()?;
        self.check(n, cols, grid_thw).map_err(Error::Invalid)?;
        let cfg = &self.cfg;
        let (mut hidden, mut pooled) = (Vec::new(), Vec::new());
        let mut block_outputs: Vec<Vec<Tensor>> = vec![Vec::new(); cfg.num_hidden_layers];
        let mut start = 0;
        for &[_, h, w] in grid_thw {
            let per = h * w;
            let seq = cfg.tokens(per);
            let attn = Attention {
                heads: cfg.num_attention_heads,
                head_dim: cfg.head_dim(),
                // No rotary embeddings.
                cos: Vec::new(),
                sin: Vec::new(),
                segments: vec![(0, seq)],
            };
            let patches = self.patch.forward(&pixel_values.narrow(0, start, per)?)?;
            start += per;
            let x = add(
                &Tensor::cat(&[&self.class, &patches], 0)?,
                &self.position_rows(h, w)?,
            )?;
            let mut x = match &self.registers {
                Some(r) => Tensor::cat(&[&x.narrow(0, 0, 1)?, r, &x.narrow(0, 1, per)?], 0)?,
                None => x,
            };
            for (bi, blk) in self.blocks.iter().enumerate() {
                x = blk.forward(&x, &attn, cfg.hidden_act)?;
                if keep_blocks {
                    block_outputs[bi].push(x.clone());
                }
            }
            let x = self.norm.forward(&x)?;
            pooled.push(x.narrow(0, 0, 1)?);
            hidden.push(x);
        }
        Ok(TowerOutput {
            outputs: vec![Tensor::cat(&hidden, 0)?, Tensor::cat(&pooled, 0)?],
            block_outputs: concat_blocks(block_outputs)?,
        })
    }
}

/// The `[out, inp]` matrix of PyTorch's bicubic `interpolate` along one
/// axis from `inp` to `out` samples, `align_corners=False`: without
/// antialiasing Keys' cubic with a = -0.75 on the 4 nearest samples (edge
/// samples repeated); with it, the cubic with a = -0.5 stretched by the
/// scale when shrinking, weights normalised to sum 1
/// (`_upsample_bicubic2d_aa`).
fn resample_matrix(inp: usize, out: usize, antialias: bool) -> Vec<f64> {
    let scale = inp as f64 / out as f64;
    let mut m = vec![0f64; out * inp];
    let keys = |x: f64, a: f64| {
        let x = x.abs();
        if x < 1.0 {
            ((a + 2.0) * x - (a + 3.0)) * x * x + 1.0
        } else if x < 2.0 {
            a * (((x - 5.0) * x + 8.0) * x - 4.0)
        } else {
            0.0
        }
    };
    for i in 0..out {
        let row = &mut m[i * inp..(i + 1) * inp];
        if antialias {
            let center = scale * (i as f64 + 0.5);
            let (support, inv) = if scale >= 1.0 {
                (2.0 * scale, 1.0 / scale)
            } else {
                (2.0, 1.0)
            };
            let lo = ((center - support + 0.5) as i64).max(0) as usize;
            let hi = ((center + support + 0.5) as i64).min(inp as i64) as usize;
            let ws: Vec<f64> = (lo..hi)
                .map(|j| keys((j as f64 - center + 0.5) * inv, -0.5))
                .collect();
            let total: f64 = ws.iter().sum();
            for (j, wv) in (lo..hi).zip(ws) {
                row[j] += if total != 0.0 { wv / total } else { wv };
            }
        } else {
            let src = scale * (i as f64 + 0.5) - 0.5;
            let x0 = src.floor();
            let t = src - x0;
            for k in -1i64..=2 {
                let j = (x0 as i64 + k).clamp(0, inp as i64 - 1) as usize;
                row[j] += keys(t - k as f64, -0.75);
            }
        }
    }
    m
}

impl super::VisionTower for Dinov2Tower {
    fn forward(
        &self,
        pixel_values: &Tensor,
        grid_thw: &[[usize; 3]],
        keep_blocks: bool,
    ) -> Result<TowerOutput> {
        Dinov2Tower::forward(self, pixel_values, grid_thw, keep_blocks)
    }

    fn check_grid(
        &self,
        rows: usize,
        cols: usize,
        grid_thw: &[[usize; 3]],
    ) -> std::result::Result<(), String> {
        self.check(rows, cols, grid_thw)
    }
}

#[cfg(test)]
mod tests {
    use super::resample_matrix;

    #[test]
    fn resampling_rows_sum_to_one_and_keep_the_same_size() {
        for aa in [false, true] {
            for (inp, out) in [(7, 4), (4, 7), (37, 16), (5, 5)] {
                let m = resample_matrix(inp, out, aa);
                for r in m.chunks(inp) {
                    assert!(
                        (r.iter().sum::<f64>() - 1.0).abs() < 1e-12,
                        "{inp}->{out} {aa}"
                    );
                }
            }
            let m = resample_matrix(5, 5, aa);
            for i in 0..5 {
                for j in 0..5 {
                    assert_eq!(m[i * 5 + j], if i == j { 1.0 } else { 0.0 });
                }
            }
        }
    }
}
