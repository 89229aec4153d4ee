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

use crate::checkpoint::{Activation, Checkpoint};
use crate::error::{GridError, Result};
use crate::family::dinov2::Dinov2VisionConfig;
use crate::reference::vit::{
    Linear, Norm, Pass, TowerOutput, activation, add, check_one_frame, position_rows,
    run_in_passes, segments,
};

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
        attn: &crate::reference::kernels::Attention,
        act: Activation,
    ) -> candle_core::Result<Tensor> {
        let h = self.norm1.forward(x)?;
        let a = crate::reference::kernels::apply1(&self.qkv.forward(&h)?, attn)?;
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
        let blocks = crate::reference::vit::load_blocks(cfg.num_hidden_layers, |i| {
            Layer::load(ck, i, &cfg)
        })?;
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
    ) -> std::result::Result<(), GridError> {
        check_one_frame(rows, cols, grid_thw, self.cfg.patch_size)
    }

    /// Run the tower over each image; outputs are the images' rows one after
    /// another. Images go through the blocks together, in passes of at most
    /// [`crate::reference::vit::PASS_TOKENS`] tokens, each attending to itself alone.
    pub fn forward(
        &self,
        pixel_values: &Tensor,
        grid_thw: &[[usize; 3]],
        keep_blocks: bool,
    ) -> Result<TowerOutput> {
        let (n, cols) = pixel_values.dims2()?;
        self.check(n, cols, grid_thw)?;
        let cfg = &self.cfg;
        let seqs: Vec<usize> = grid_thw.iter().map(|g| cfg.tokens(g[1] * g[2])).collect();
        let mut start = 0;
        let embed = |i: usize| {
            let [_, h, w] = grid_thw[i];
            let per = h * w;
            let patches = self.patch.forward(&pixel_values.narrow(0, start, per)?)?;
            start += per;
            let pos = position_rows(
                &self.positions,
                1,
                (cfg.grid(), cfg.hidden_size),
                (h, w),
                cfg.interpolate_antialias,
            )?;
            let x = add(&Tensor::cat(&[&self.class, &patches], 0)?, &pos)?;
            match &self.registers {
                Some(r) => Tensor::cat(&[&x.narrow(0, 0, 1)?, r, &x.narrow(0, 1, per)?], 0),
                None => Ok(x),
            }
        };
        let (passes, block_outputs) = run_in_passes(
            &seqs,
            (cfg.num_attention_heads, cfg.head_dim()),
            cfg.num_hidden_layers,
            keep_blocks,
            embed,
            |b, x, attn| self.blocks[b].forward(x, attn, cfg.hidden_act),
        )?;
        let (mut hidden, mut pooled) = (Vec::new(), Vec::new());
        for Pass { x, images } in passes {
            let x = self.norm.forward(&x)?;
            for (first, _) in segments(&seqs[images]) {
                pooled.push(x.narrow(0, first, 1)?);
            }
            hidden.push(x);
        }
        Ok(TowerOutput {
            outputs: vec![Tensor::cat(&hidden, 0)?, Tensor::cat(&pooled, 0)?],
            block_outputs,
        })
    }
}

impl crate::reference::VisionTower for Dinov2Tower {
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
    ) -> std::result::Result<(), GridError> {
        self.check(rows, cols, grid_thw)
    }
}
