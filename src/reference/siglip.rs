//! fp32 reference of the SigLIP vision tower (Hugging Face layout).
//!
//! The maths follows transformers' `models/siglip/modeling_siglip.py`
//! (`SiglipVisionTransformer`). This is an oracle the release gates trust:
//! it shares no code with the export path and keeps the checkpoint's own
//! layout, `(tokens, channels)`.
//!
//! Forward, for each image of `pixel_values [n, 3*P*P]` (patches in raster
//! order) and its `grid_thw [1, g, g]`: patch embedding (Conv2d with bias ==
//! Linear), the position table added (`g*g` rows, no class token),
//! `num_hidden_layers` pre-norm blocks (`layer_norm1`, attention with q, k,
//! v, out biases, `layer_norm2`, MLP fc1 - `hidden_act` (tanh GELU) - fc2),
//! `post_layernorm` over every token: `last_hidden_state`. With the head
//! (`vision_use_head`): a learned probe attends over the tokens (PyTorch's
//! `MultiheadAttention`: `in_proj` q, k, v, scaled dot products per head,
//! `out_proj`), then `h + mlp(layernorm(h))`: `pooler_output`.

use candle_core::{D, Tensor};

use super::vit::{
    EncoderLayer, Linear, Norm, TowerOutput, activation, add, check_one_frame, concat_blocks,
    plain_attention, position_rows,
};
use crate::checkpoint::{Checkpoint, SiglipVisionConfig};
use crate::error::{Error, Result};

/// The attention-pooling head.
struct Head {
    /// `[1, d]`.
    probe: Tensor,
    q: Linear,
    /// k and v of `in_proj`: rows `[0, D)` K, `[D, 2D)` V.
    kv: Linear,
    out: Linear,
    norm: Norm,
    fc1: Linear,
    fc2: Linear,
}

/// The SigLIP vision tower with its weights (f32 math).
pub struct SiglipVisionTower {
    cfg: SiglipVisionConfig,
    patch: Linear,
    /// `[g*g, D]`.
    positions: Vec<f32>,
    blocks: Vec<EncoderLayer>,
    post_norm: Norm,
    head: Option<Head>,
}

impl SiglipVisionTower {
    /// Load the tower from a checkpoint, checking every tensor's shape against `cfg`.
    pub fn load(ck: &Checkpoint, cfg: &SiglipVisionConfig) -> Result<Self> {
        let cfg = cfg.clone();
        let (d, p, mlp) = (cfg.hidden_size, cfg.patch_size, cfg.intermediate_size);
        let eps = cfg.layer_norm_eps;
        let w = ck.tensor("embeddings.patch_embedding.weight", &[d, 3, p, p])?;
        let patch = Linear::new(
            &w.reshape((d, 3 * p * p))?,
            ck.tensor("embeddings.patch_embedding.bias", &[d])?,
        )?;
        let positions = ck
            .tensor(
                "embeddings.position_embedding.weight",
                &[cfg.positions(), d],
            )?
            .flatten_all()?
            .to_vec1::<f32>()?;
        let blocks = (0..cfg.num_hidden_layers)
            .map(|i| EncoderLayer::load(ck, i, d, mlp, eps))
            .collect::<Result<Vec<_>>>()?;
        let head = if cfg.vision_use_head {
            let w = ck.tensor("head.attention.in_proj_weight", &[3 * d, d])?;
            let b = ck.tensor("head.attention.in_proj_bias", &[3 * d])?;
            Some(Head {
                probe: ck.tensor("head.probe", &[1, 1, d])?.reshape((1, d))?,
                q: Linear::new(&w.narrow(0, 0, d)?, b.narrow(0, 0, d)?)?,
                kv: Linear::new(&w.narrow(0, d, 2 * d)?, b.narrow(0, d, 2 * d)?)?,
                out: Linear::load(ck, "head.attention.out_proj", d, d)?,
                norm: Norm::layer(ck, "head.layernorm", d, eps)?,
                fc1: Linear::load(ck, "head.mlp.fc1", mlp, d)?,
                fc2: Linear::load(ck, "head.mlp.fc2", d, mlp)?,
            })
        } else {
            None
        };
        Ok(SiglipVisionTower {
            patch,
            positions,
            blocks,
            post_norm: Norm::layer(ck, "post_layernorm", d, eps)?,
            head,
            cfg,
        })
    }

    fn check(
        &self,
        rows: usize,
        cols: usize,
        grid_thw: &[[usize; 3]],
    ) -> std::result::Result<(), String> {
        check_one_frame(rows, cols, grid_thw, self.cfg.patch_size)
    }

    /// The pooling head over one image's tokens `x [n, d]`: `[1, d]`.
    fn pool(&self, head: &Head, x: &Tensor) -> candle_core::Result<Tensor> {
        let (d, heads) = (self.cfg.hidden_size, self.cfg.num_attention_heads);
        let hd = d / heads;
        let n = x.dim(0)?;
        let q = head.q.forward(&head.probe)?.reshape((heads, 1, hd))?;
        let kv = head.kv.forward(x)?;
        let k = kv
            .narrow(1, 0, d)?
            .reshape((n, heads, hd))?
            .transpose(0, 1)?
            .contiguous()?;
        let v = kv
            .narrow(1, d, d)?
            .reshape((n, heads, hd))?
            .transpose(0, 1)?
            .contiguous()?;
        let scores = (q.matmul(&k.t()?)? * (hd as f64).powf(-0.5))?;
        let a = candle_nn::ops::softmax(&scores, D::Minus1)?;
        let ctx = a.matmul(&v)?.transpose(0, 1)?.reshape((1, d))?;
        let h = head.out.forward(&ctx)?;
        let m = head.fc2.forward(&activation(
            &head.fc1.forward(&head.norm.forward(&h)?)?,
            self.cfg.hidden_act,
        )?)?;
        add(&h, &m)
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
            let attn = plain_attention(cfg.num_attention_heads, cfg.head_dim(), per);
            let patches = self.patch.forward(&pixel_values.narrow(0, start, per)?)?;
            start += per;
            // transformers' `interpolate_pos_encoding`: bicubic, no antialiasing.
            let pos = position_rows(
                &self.positions,
                0,
                (cfg.grid(), cfg.hidden_size),
                (h, w),
                false,
            )?;
            let mut x = add(&patches, &pos)?;
            for (bi, blk) in self.blocks.iter().enumerate() {
                x = blk.forward(&x, &attn, cfg.hidden_act)?;
                if keep_blocks {
                    block_outputs[bi].push(x.clone());
                }
            }
            let x = self.post_norm.forward(&x)?;
            if let Some(head) = &self.head {
                pooled.push(self.pool(head, &x)?);
            }
            hidden.push(x);
        }
        let mut outputs = vec![Tensor::cat(&hidden, 0)?];
        if self.head.is_some() {
            outputs.push(Tensor::cat(&pooled, 0)?);
        }
        Ok(TowerOutput {
            outputs,
            block_outputs: concat_blocks(block_outputs)?,
        })
    }
}

impl super::VisionTower for SiglipVisionTower {
    fn forward(
        &self,
        pixel_values: &Tensor,
        grid_thw: &[[usize; 3]],
        keep_blocks: bool,
    ) -> Result<TowerOutput> {
        SiglipVisionTower::forward(self, pixel_values, grid_thw, keep_blocks)
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
