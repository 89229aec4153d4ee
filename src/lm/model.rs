//! The text decoder in candle, as transformers' `Qwen3VLTextModel` computes
//! it, and its Qwen2 variant (`Qwen2VLTextModel`, `Qwen2_5_VLTextModel`)
//! where the family's [`Decoder`](super::Decoder) says so:
//!
//! - per layer: RMSNorm, q/k/v projections (with biases in Qwen2), RMSNorm
//!   of each query and key head (`q_norm`, `k_norm`; Qwen3-VL only),
//!   M-RoPE (interleaved in Qwen3-VL, in three sections in Qwen2),
//!   grouped-query causal attention, `o_proj`, residual; RMSNorm, SwiGLU
//!   MLP, residual;
//! - after decoder layer `k < deepstack count`, deepstack feature `k` is added
//!   to the hidden states at the visual positions;
//! - final RMSNorm and the output projection (`lm_head`, or `embed_tokens`
//!   when tied).
//!
//! Activations and products are f32. Matrices stored as F16/BF16 stay so in
//! memory and are widened per product, so a full-size checkpoint needs its
//! stored size, not twice it.

use candle_core::{D, DType, Device, Tensor};

use super::config::TextConfig;
use crate::checkpoint::WeightStore;
use crate::error::Result;

/// Where checkpoints keep the decoder: transformers 5 and Qwen3-VL's
/// releases under `model.language_model.`, Qwen2-VL's and Qwen2.5-VL's
/// releases under `model.`.
pub(crate) const PREFIXES: [&str; 2] = ["model.language_model.", "model."];

struct Linear {
    w: Tensor,
    b: Option<Tensor>,
}

impl Linear {
    fn forward(&self, x: &Tensor) -> candle_core::Result<Tensor> {
        let w = self.w.to_dtype(DType::F32)?;
        let y = x.matmul(&w.t()?)?;
        match &self.b {
            Some(b) => y.broadcast_add(b),
            None => Ok(y),
        }
    }
}

struct RmsNorm {
    w: Tensor,
    eps: f32,
}

impl RmsNorm {
    /// Over the last axis, in f32: `x / sqrt(mean(x^2) + eps) * w`.
    fn forward(&self, x: &Tensor) -> candle_core::Result<Tensor> {
        candle_nn::ops::rms_norm(&x.contiguous()?, &self.w, self.eps)
    }
}

struct Layer {
    input_norm: RmsNorm,
    q: Linear,
    k: Linear,
    v: Linear,
    o: Linear,
    q_norm: Option<RmsNorm>,
    k_norm: Option<RmsNorm>,
    post_norm: RmsNorm,
    gate: Linear,
    up: Linear,
    down: Linear,
}

/// Keys and values of the positions seen so far, per layer: `(kv_heads, T, head_dim)`.
#[derive(Default)]
pub struct KvCache {
    layers: Vec<(Tensor, Tensor)>,
}

impl KvCache {
    /// Positions held.
    pub fn len(&self) -> usize {
        self.layers
            .first()
            .map_or(0, |(k, _)| k.dim(1).unwrap_or(0))
    }
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// Visual features for the positions of the image-pad tokens.
pub struct Visual<'a> {
    /// Row indices of the visual positions in the sequence being run.
    pub positions: &'a [u32],
    /// One `[positions, hidden]` per deepstack feature, added after decoder layer k.
    pub deepstack: &'a [Tensor],
}

/// The decoder's weights.
pub struct TextModel {
    pub cfg: TextConfig,
    embed: Tensor,
    layers: Vec<Layer>,
    norm: RmsNorm,
    lm_head: Option<Tensor>,
    /// `rope_theta^(-2i/head_dim)`, i < head_dim/2, in f32 as transformers computes it.
    inv_freq: Vec<f32>,
    /// Which of (T, H, W) each frequency slot takes its position from.
    slot_axis: Vec<usize>,
}

impl TextModel {
    /// Load every decoder tensor (named `{prefix}…`) from `weights`, shapes
    /// checked against `cfg`; `dir` names the checkpoint in errors.
    pub fn load(
        cfg: &TextConfig,
        weights: &WeightStore,
        prefix: &str,
        dir: &std::path::Path,
    ) -> Result<Self> {
        let (h, hd) = (cfg.hidden_size, cfg.head_dim);
        let (nq, nkv, ff) = (
            cfg.num_attention_heads * hd,
            cfg.num_key_value_heads * hd,
            cfg.intermediate_size,
        );
        let eps = cfg.rms_norm_eps as f32;
        let mat = |n: &str, s: &[usize]| weights.native(&format!("{prefix}{n}"), s, dir);
        let vec32 = |n: &str, s: usize| weights.f32(&format!("{prefix}{n}"), &[s], dir);
        let lin = |n: &str, out: usize, inp: usize| -> Result<Linear> {
            let b = if cfg.attention_bias && n.contains("self_attn") {
                Some(vec32(&format!("{n}.bias"), out)?)
            } else {
                None
            };
            Ok(Linear {
                w: mat(&format!("{n}.weight"), &[out, inp])?,
                b,
            })
        };
        let norm = |n: &str, s: usize| -> Result<RmsNorm> {
            Ok(RmsNorm {
                w: vec32(&format!("{n}.weight"), s)?,
                eps,
            })
        };
        let qk_norm = cfg.decoder.qk_norm;
        let mut layers = Vec::with_capacity(cfg.num_hidden_layers);
        for i in 0..cfg.num_hidden_layers {
            let p = format!("layers.{i}.");
            let a = format!("{p}self_attn.");
            let m = format!("{p}mlp.");
            layers.push(Layer {
                input_norm: norm(&format!("{p}input_layernorm"), h)?,
                q: lin(&format!("{a}q_proj"), nq, h)?,
                k: lin(&format!("{a}k_proj"), nkv, h)?,
                v: lin(&format!("{a}v_proj"), nkv, h)?,
                o: Linear {
                    w: mat(&format!("{a}o_proj.weight"), &[h, nq])?,
                    b: None,
                },
                q_norm: qk_norm
                    .then(|| norm(&format!("{a}q_norm"), hd))
                    .transpose()?,
                k_norm: qk_norm
                    .then(|| norm(&format!("{a}k_norm"), hd))
                    .transpose()?,
                post_norm: norm(&format!("{p}post_attention_layernorm"), h)?,
                gate: lin(&format!("{m}gate_proj"), ff, h)?,
                up: lin(&format!("{m}up_proj"), ff, h)?,
                down: lin(&format!("{m}down_proj"), h, ff)?,
            });
        }
        let embed = mat("embed_tokens.weight", &[cfg.vocab_size, h])?;
        let lm_head = if cfg.tie_word_embeddings {
            None
        } else {
            Some(weights.native("lm_head.weight", &[cfg.vocab_size, h], dir)?)
        };
        let half = hd / 2;
        let inv_freq = (0..half)
            .map(|i| 1.0 / (cfg.rope_theta as f32).powf((2 * i) as f32 / hd as f32))
            .collect();
        let [st, sh, sw] = cfg.mrope_section;
        let slot_axis = if cfg.decoder.interleaved_mrope {
            // Interleaved M-RoPE: slot j uses H when j % 3 == 1 and j < 3*sh,
            // W when j % 3 == 2 and j < 3*sw, else T.
            (0..half)
                .map(|j| match j % 3 {
                    1 if j < 3 * sh => 1,
                    2 if j < 3 * sw => 2,
                    _ => 0,
                })
                .collect()
        } else {
            // Sectioned: the first `st` slots T, the next `sh` H, the last `sw` W.
            (0..half)
                .map(|j| usize::from(j >= st) + usize::from(j >= st + sh))
                .collect()
        };
        debug_assert_eq!(st + sh + sw, half);
        Ok(TextModel {
            cfg: cfg.clone(),
            embed,
            layers,
            norm: norm("norm", h)?,
            lm_head,
            inv_freq,
            slot_axis,
        })
    }

    /// Embeddings of token ids: `[len, hidden]` f32.
    pub fn embed(&self, ids: &[u32]) -> Result<Tensor> {
        let idx = Tensor::from_slice(ids, ids.len(), &Device::Cpu)?;
        Ok(self.embed.index_select(&idx, 0)?.to_dtype(DType::F32)?)
    }

    /// cos and sin `[len, head_dim]` for positions `(t, h, w)` per token.
    fn rope_tables(&self, pos: &[[i64; 3]]) -> Result<(Tensor, Tensor)> {
        let half = self.inv_freq.len();
        let mut cos = vec![0f32; pos.len() * 2 * half];
        let mut sin = vec![0f32; pos.len() * 2 * half];
        for (r, p) in pos.iter().enumerate() {
            for j in 0..half {
                let a = p[self.slot_axis[j]] as f32 * self.inv_freq[j];
                let (s, c) = a.sin_cos();
                let o = r * 2 * half;
                cos[o + j] = c;
                cos[o + half + j] = c;
                sin[o + j] = s;
                sin[o + half + j] = s;
            }
        }
        let shape = (pos.len(), 2 * half);
        Ok((
            Tensor::from_vec(cos, shape, &Device::Cpu)?,
            Tensor::from_vec(sin, shape, &Device::Cpu)?,
        ))
    }

    /// Run `x` (`[len, hidden]`, the next `len` positions after those in
    /// `cache`) through the decoder, appending to `cache`; returns the final
    /// hidden states `[len, hidden]` after the last norm.
    pub fn forward(
        &self,
        x: Tensor,
        pos: &[[i64; 3]],
        visual: Option<&Visual>,
        cache: &mut KvCache,
    ) -> Result<Tensor> {
        let cfg = &self.cfg;
        let (len, _) = x.dims2()?;
        let past = cache.len();
        let (hq, hkv, hd) = (
            cfg.num_attention_heads,
            cfg.num_key_value_heads,
            cfg.head_dim,
        );
        let (cos, sin) = self.rope_tables(pos)?;
        let rope = |t: &Tensor| -> candle_core::Result<Tensor> {
            // t: (heads, len, hd); rotate_half as transformers does
            let x1 = t.narrow(D::Minus1, 0, hd / 2)?;
            let x2 = t.narrow(D::Minus1, hd / 2, hd / 2)?;
            let rot = Tensor::cat(&[&x2.neg()?, &x1], D::Minus1)?;
            t.broadcast_mul(&cos)?.add(&rot.broadcast_mul(&sin)?)
        };
        // Causal: query i (absolute past + i) sees keys j <= past + i.
        let mask = if len > 1 {
            let total = past + len;
            let m: Vec<f32> = (0..len)
                .flat_map(|i| {
                    (0..total).map(move |j| if j > past + i { f32::NEG_INFINITY } else { 0.0 })
                })
                .collect();
            Some(Tensor::from_vec(m, (len, total), &Device::Cpu)?)
        } else {
            None
        };
        let scale = 1.0 / (hd as f64).sqrt();
        let fresh = cache.layers.is_empty();
        let mut x = x;
        for (li, l) in self.layers.iter().enumerate() {
            let h = l.input_norm.forward(&x)?;
            let head_norm = |n: &Option<RmsNorm>, t: Tensor| match n {
                Some(n) => n.forward(&t),
                None => Ok(t),
            };
            let q = head_norm(&l.q_norm, l.q.forward(&h)?.reshape((len, hq, hd))?)?;
            let k = head_norm(&l.k_norm, l.k.forward(&h)?.reshape((len, hkv, hd))?)?;
            let v = l.v.forward(&h)?.reshape((len, hkv, hd))?;
            let q = rope(&q.transpose(0, 1)?.contiguous()?)?;
            let k = rope(&k.transpose(0, 1)?.contiguous()?)?;
            let v = v.transpose(0, 1)?.contiguous()?;
            let (k, v) = if fresh {
                cache.layers.push((k.clone(), v.clone()));
                (k, v)
            } else {
                let (pk, pv) = &cache.layers[li];
                let k = Tensor::cat(&[pk, &k], 1)?;
                let v = Tensor::cat(&[pv, &v], 1)?;
                cache.layers[li] = (k.clone(), v.clone());
                (k, v)
            };
            let total = k.dim(1)?;
            let rep = hq / hkv;
            let expand = |t: &Tensor| -> candle_core::Result<Tensor> {
                t.unsqueeze(1)?
                    .expand((hkv, rep, total, hd))?
                    .reshape((hq, total, hd))
            };
            let (k, v) = (expand(&k)?, expand(&v)?);
            let mut s = (q.matmul(&k.t()?.contiguous()?)? * scale)?;
            if let Some(m) = &mask {
                s = s.broadcast_add(m)?;
            }
            let p = candle_nn::ops::softmax_last_dim(&s)?;
            let a = p.matmul(&v)?.transpose(0, 1)?.reshape((len, hq * hd))?;
            x = (x + l.o.forward(&a)?)?;
            let h = l.post_norm.forward(&x)?;
            let m = (candle_nn::ops::silu(&l.gate.forward(&h)?)? * l.up.forward(&h)?)?;
            x = (x + l.down.forward(&m)?)?;
            if let Some(vis) = visual
                && li < vis.deepstack.len()
                && !vis.positions.is_empty()
            {
                let idx = Tensor::from_slice(vis.positions, vis.positions.len(), &Device::Cpu)?;
                x = x.index_add(&idx, &vis.deepstack[li], 0)?;
            }
        }
        Ok(self.norm.forward(&x)?)
    }

    /// Logits `[rows, vocab]` of final hidden states `[rows, hidden]`.
    pub fn logits(&self, h: &Tensor) -> Result<Tensor> {
        let w = self
            .lm_head
            .as_ref()
            .unwrap_or(&self.embed)
            .to_dtype(DType::F32)?;
        Ok(h.matmul(&w.t()?)?)
    }
}

/// Transformers' `get_rope_index` for a sequence of token ids: text tokens
/// count up on all three axes; the tokens of each image (a run of
/// `image_token_id`) take `start + (t, row, col)` on the merged grid, and the
/// next text starts at `start + max(rows, cols)`. Returns the positions and
/// the delta that decoding adds to the cache length (`max + 1 - len`).
pub fn mrope_positions(
    ids: &[u32],
    image_token_id: u32,
    grids: &[[usize; 3]],
    merge: usize,
) -> std::result::Result<(Vec<[i64; 3]>, i64), String> {
    let mut out = Vec::with_capacity(ids.len());
    let mut cur: i64 = 0;
    let mut grids = grids.iter();
    let mut i = 0;
    while i < ids.len() {
        if ids[i] != image_token_id {
            out.push([cur; 3]);
            cur += 1;
            i += 1;
            continue;
        }
        let run = ids[i..]
            .iter()
            .take_while(|&&t| t == image_token_id)
            .count();
        let g = grids
            .next()
            .ok_or("more runs of image tokens than images")?;
        let (t, h, w) = (g[0], g[1] / merge, g[2] / merge);
        if t * h * w != run {
            return Err(format!(
                "an image of grid {g:?} needs {} image tokens, the prompt has {run}",
                t * h * w
            ));
        }
        for ti in 0..t {
            for r in 0..h {
                for c in 0..w {
                    out.push([cur + ti as i64, cur + r as i64, cur + c as i64]);
                }
            }
        }
        cur += h.max(w) as i64;
        i += run;
    }
    if grids.next().is_some() {
        return Err("more images than runs of image tokens".into());
    }
    let max = out
        .iter()
        .flat_map(|p| p.iter().copied())
        .max()
        .unwrap_or(-1);
    Ok((out, max + 1 - ids.len() as i64))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn positions_follow_get_rope_index() {
        // 2 text, a 1x4x6 grid (2x3 tokens with merge 2), 2 text
        let ids = [7, 8, 5, 5, 5, 5, 5, 5, 9, 10];
        let (p, delta) = mrope_positions(&ids, 5, &[[1, 4, 6]], 2).unwrap();
        assert_eq!(p[0], [0, 0, 0]);
        assert_eq!(p[1], [1, 1, 1]);
        assert_eq!(
            &p[2..8],
            &[
                [2, 2, 2],
                [2, 2, 3],
                [2, 2, 4],
                [2, 3, 2],
                [2, 3, 3],
                [2, 3, 4]
            ]
        );
        // next text starts at 2 + max(2, 3)
        assert_eq!(p[8], [5, 5, 5]);
        assert_eq!(p[9], [6, 6, 6]);
        assert_eq!(delta, 7 - 10);
        assert!(
            mrope_positions(&ids, 5, &[[1, 4, 4]], 2)
                .unwrap_err()
                .contains("needs 4")
        );
        assert!(mrope_positions(&ids, 5, &[], 2).is_err());
        assert!(mrope_positions(&[1, 2], 5, &[[1, 2, 2]], 2).is_err());
    }
}
