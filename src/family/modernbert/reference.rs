//! fp32 reference of ModernBERT's encoder, in the checkpoint's own layout
//! `(tokens, channels)`.
//!
//! The maths follows transformers' `models/modernbert/modeling_modernbert.py`
//! (eager attention). It shares no code with the export path: its
//! attention is its own, written with candle's products, apart from the
//! fused kernels the image towers' references use.
//!
//! Forward, for each text's token ids (special tokens included, never
//! padded): `embeddings.norm(tok_embeddings[t])`, then per layer `i`
//! `x = x + Wo(attn(attn_norm(x)))` (no `attn_norm` in layer 0) and `x = x +
//! mlp.Wo(act(a) * g)` with `[a, g] = mlp.Wi(mlp_norm(x))`, then
//! `final_norm`. The attention rotates q and k over the whole head by
//! positions `0..T` (base per layer type), and a `sliding_attention` layer
//! sees the keys within `local_attention / 2` positions of each query.
//! LayerNorms without bias and Linears without bias unless the config
//! says so. `last_hidden_state` is the output.

use candle_core::{DType, Device, Tensor};

use super::config::{LayerType, ModernBertConfig};
use crate::checkpoint::{Activation, Checkpoint};
use crate::error::{Error, Result};
use crate::preprocess::TokenBatch;
use crate::reference::vit::{Linear, Norm, TowerOutput, activation};

/// A LayerNorm `name` with its bias, or zeros for one without.
fn norm(ck: &Checkpoint, name: &str, c: &ModernBertConfig) -> Result<Norm> {
    let d = c.hidden_size;
    Ok(Norm::Layer {
        w: ck.tensor(&format!("{name}.weight"), &[d])?,
        b: if c.norm_bias {
            ck.tensor(&format!("{name}.bias"), &[d])?
        } else {
            Tensor::zeros(d, DType::F32, &Device::Cpu)?
        },
        eps: c.norm_eps as f32,
    })
}

/// A Linear `name` `[out, in]`, with its bias when `bias`.
fn linear(ck: &Checkpoint, name: &str, (out, inp): (usize, usize), bias: bool) -> Result<Linear> {
    if bias {
        Linear::load(ck, name, out, inp)
    } else {
        Linear::load_no_bias(ck, name, out, inp)
    }
}

struct Layer {
    attn_norm: Option<Norm>,
    qkv: Linear,
    wo: Linear,
    mlp_norm: Norm,
    wi: Linear,
    mlp_wo: Linear,
    kind: LayerType,
}

impl Layer {
    fn load(ck: &Checkpoint, i: usize, c: &ModernBertConfig) -> Result<Layer> {
        let (d, m) = (c.hidden_size, c.intermediate_size);
        let l = format!("layers.{i}");
        Ok(Layer {
            attn_norm: if i == 0 {
                None
            } else {
                Some(norm(ck, &format!("{l}.attn_norm"), c)?)
            },
            qkv: linear(ck, &format!("{l}.attn.Wqkv"), (3 * d, d), c.attention_bias)?,
            wo: linear(ck, &format!("{l}.attn.Wo"), (d, d), c.attention_bias)?,
            mlp_norm: norm(ck, &format!("{l}.mlp_norm"), c)?,
            wi: linear(ck, &format!("{l}.mlp.Wi"), (2 * m, d), c.mlp_bias)?,
            mlp_wo: linear(ck, &format!("{l}.mlp.Wo"), (d, m), c.mlp_bias)?,
            kind: c.layer_types[i],
        })
    }
}

/// `x * cos + rotate_half(x) * sin` for `x [heads, T, hd]`, `cos`, `sin [T, hd]`.
fn rotate(x: &Tensor, cos: &Tensor, sin: &Tensor) -> candle_core::Result<Tensor> {
    let hd = x.dim(2)?;
    let (lo, hi) = (x.narrow(2, 0, hd / 2)?, x.narrow(2, hd / 2, hd / 2)?);
    let rot = Tensor::cat(&[&hi.neg()?, &lo], 2)?;
    x.broadcast_mul(cos)?.add(&rot.broadcast_mul(sin)?)
}

/// The loaded encoder.
pub struct ModernBertEncoder {
    cfg: ModernBertConfig,
    tok: Vec<f32>,
    norm: Norm,
    layers: Vec<Layer>,
    final_norm: Norm,
}

impl ModernBertEncoder {
    pub fn load(ck: &Checkpoint, cfg: &ModernBertConfig) -> Result<ModernBertEncoder> {
        let tok = ck
            .tensor(
                "embeddings.tok_embeddings.weight",
                &[cfg.vocab_size, cfg.hidden_size],
            )?
            .flatten_all()?
            .to_vec1::<f32>()?;
        let layers =
            crate::reference::vit::load_blocks(cfg.num_hidden_layers, |i| Layer::load(ck, i, cfg))?;
        Ok(ModernBertEncoder {
            tok,
            norm: norm(ck, "embeddings.norm", cfg)?,
            layers,
            final_norm: norm(ck, "final_norm", cfg)?,
            cfg: cfg.clone(),
        })
    }

    /// `cos`, `sin [T, hd]` of positions `0..t` at base `theta`:
    /// `[freqs, freqs]`, `freqs_k = p * theta^(-2k / hd)`.
    fn rotary(&self, t: usize, theta: f64) -> candle_core::Result<(Tensor, Tensor)> {
        let hd = self.cfg.head_dim();
        let (mut cos, mut sin) = (Vec::with_capacity(t * hd), Vec::with_capacity(t * hd));
        for p in 0..t {
            for j in 0..hd {
                let k = j % (hd / 2);
                let inv = 1.0 / (theta as f32).powf(2.0 * k as f32 / hd as f32);
                let a = p as f32 * inv;
                cos.push(a.cos());
                sin.push(a.sin());
            }
        }
        Ok((
            Tensor::from_vec(cos, (t, hd), &Device::Cpu)?,
            Tensor::from_vec(sin, (t, hd), &Device::Cpu)?,
        ))
    }

    /// The additive mask `[T, T]` of a sliding layer: 0 within the half
    /// window, -inf beyond (every query sees itself).
    fn band(&self, t: usize) -> candle_core::Result<Tensor> {
        let w = self.cfg.half_window();
        let v: Vec<f32> = (0..t * t)
            .map(|k| {
                let (i, j) = (k / t, k % t);
                if i.abs_diff(j) <= w {
                    0.0
                } else {
                    f32::NEG_INFINITY
                }
            })
            .collect();
        Tensor::from_vec(v, (t, t), &Device::Cpu)
    }

    fn attention(
        &self,
        l: &Layer,
        x: &Tensor,
        rope: &(Tensor, Tensor),
        band: Option<&Tensor>,
    ) -> candle_core::Result<Tensor> {
        let (t, d) = x.dims2()?;
        let (h, hd) = (self.cfg.num_attention_heads, self.cfg.head_dim());
        let qkv = l.qkv.forward(x)?;
        let part = |k: usize| -> candle_core::Result<Tensor> {
            qkv.narrow(1, k * d, d)?
                .reshape((t, h, hd))?
                .transpose(0, 1)?
                .contiguous()
        };
        let q = rotate(&part(0)?, &rope.0, &rope.1)?;
        let k = rotate(&part(1)?, &rope.0, &rope.1)?;
        let v = part(2)?;
        let mut s = (q.matmul(&k.transpose(1, 2)?.contiguous()?)? * (hd as f64).powf(-0.5))?;
        if let Some(b) = band {
            s = s.broadcast_add(b)?;
        }
        let p = candle_nn::ops::softmax_last_dim(&s)?;
        let o = p.matmul(&v)?.transpose(0, 1)?.reshape((t, d))?;
        l.wo.forward(&o)
    }

    fn mlp(&self, l: &Layer, x: &Tensor, act: Activation) -> candle_core::Result<Tensor> {
        let m = self.cfg.intermediate_size;
        let h = l.wi.forward(x)?;
        let a = activation(&h.narrow(1, 0, m)?.contiguous()?, act)?;
        let g = h.narrow(1, m, m)?;
        l.mlp_wo.forward(&a.mul(&g)?)
    }

    /// One text's `last_hidden_state [T, D]` and, with `keep_blocks`, each
    /// layer's output.
    fn one(&self, tokens: &TokenBatch, keep_blocks: bool) -> Result<(Tensor, Vec<Tensor>)> {
        let c = &self.cfg;
        let (t, d) = (tokens.len(), c.hidden_size);
        let mut x = Vec::with_capacity(t * d);
        for &id in &tokens.ids {
            x.extend_from_slice(&self.tok[id as usize * d..][..d]);
        }
        let mut x = self
            .norm
            .forward(&Tensor::from_vec(x, (t, d), &Device::Cpu)?)?;
        let full = self.rotary(t, c.rope_theta.full)?;
        let sliding = self.rotary(t, c.rope_theta.sliding)?;
        let band = self.band(t)?;
        let mut blocks = Vec::new();
        for l in &self.layers {
            let h = match &l.attn_norm {
                Some(n) => n.forward(&x)?,
                None => x.clone(),
            };
            let a = match l.kind {
                LayerType::FullAttention => self.attention(l, &h, &full, None)?,
                LayerType::SlidingAttention => self.attention(l, &h, &sliding, Some(&band))?,
            };
            x = x.add(&a)?;
            let m = self.mlp(l, &l.mlp_norm.forward(&x)?, c.hidden_activation)?;
            x = x.add(&m)?;
            if keep_blocks {
                blocks.push(x.clone());
            }
        }
        Ok((self.final_norm.forward(&x)?, blocks))
    }

    pub fn forward(&self, texts: &[TokenBatch], keep_blocks: bool) -> Result<TowerOutput> {
        if texts.is_empty() {
            return Err(Error::Invalid("no text".into()));
        }
        let c = &self.cfg;
        let mut hidden = Vec::new();
        let mut per_block: Vec<Vec<Tensor>> = Vec::new();
        for (i, t) in texts.iter().enumerate() {
            if t.is_empty() || t.len() > c.max_position_embeddings {
                return Err(Error::Invalid(format!(
                    "text {i}: {} tokens; expected 1 to {}",
                    t.len(),
                    c.max_position_embeddings
                )));
            }
            if let Some(id) = t.ids.iter().find(|&&id| id as usize >= c.vocab_size) {
                return Err(Error::Invalid(format!(
                    "text {i}: token id {id} is not below vocab_size {}",
                    c.vocab_size
                )));
            }
            let (h, blocks) = self.one(t, keep_blocks)?;
            hidden.push(h);
            per_block.push(blocks);
        }
        let block_outputs = (0..if keep_blocks { c.num_hidden_layers } else { 0 })
            .map(|b| Tensor::cat(&per_block.iter().map(|p| &p[b]).collect::<Vec<_>>(), 0))
            .collect::<candle_core::Result<Vec<_>>>()?;
        Ok(TowerOutput {
            outputs: vec![Tensor::cat(&hidden, 0)?],
            block_outputs,
        })
    }
}

impl crate::reference::TextEncoder for ModernBertEncoder {
    fn forward(&self, texts: &[TokenBatch], keep_blocks: bool) -> Result<TowerOutput> {
        ModernBertEncoder::forward(self, texts, keep_blocks)
    }

    /// The stream after each layer (a pre-norm stream, which the program
    /// carries divided by the residual scale throughout).
    fn stream_peaks(&self, text: &TokenBatch) -> Result<Vec<f32>> {
        let out = self.forward(std::slice::from_ref(text), true)?;
        out.block_outputs
            .iter()
            .map(|t| Ok(crate::interp::max_abs(&t.flatten_all()?.to_vec1::<f32>()?)))
            .collect()
    }
}
