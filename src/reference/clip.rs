//! fp32 reference of the CLIP vision tower (Hugging Face layout).
//!
//! The maths follows transformers' `models/clip/modeling_clip.py`
//! (`CLIPVisionTransformer`, and `CLIPVisionModelWithProjection` for the
//! projection). This is an oracle the release gates trust: it shares no code
//! with the export path and keeps the checkpoint's own layout,
//! `(tokens, channels)`.
//!
//! Forward, for each image of `pixel_values [n, 3*P*P]` (patches in raster
//! order) and its `grid_thw [1, g, g]`: patch embedding (Conv2d without
//! bias == Linear), the class embedding prepended, the position table
//! added (`g*g + 1` rows: the checkpoint's `image_size`), `pre_layrnorm`,
//! `num_hidden_layers` pre-norm blocks (`layer_norm1`, attention with q, k,
//! v, out biases and no rotary, `layer_norm2`, MLP fc1 - `hidden_act` -
//! fc2). `last_hidden_state` is the result, not normalised;
//! `pooler_output = post_layernorm(last_hidden_state[0])`; `image_embeds =
//! visual_projection(pooler_output)` when the checkpoint has it.

use candle_core::{Device, Tensor};

use super::kernels::{self, Attention};
use super::vit::{Linear, Norm, TowerOutput, activation, add, check_grid};
use crate::checkpoint::{Checkpoint, ClipVisionConfig, clip::PROJECTION};
use crate::error::{Error, Result};

struct Block {
    norm1: Norm,
    norm2: Norm,
    /// q, k and v fused: rows `[0, D)` Q, `[D, 2D)` K, `[2D, 3D)` V.
    qkv: Linear,
    out: Linear,
    fc1: Linear,
    fc2: Linear,
}

/// The CLIP vision tower with its weights (f32 math).
pub struct ClipVisionTower {
    cfg: ClipVisionConfig,
    patch: Linear,
    class: Tensor,
    positions: Tensor,
    pre_norm: Norm,
    blocks: Vec<Block>,
    post_norm: Norm,
    projection: Option<Linear>,
}

impl ClipVisionTower {
    /// Load the tower from a checkpoint, checking every tensor's shape against `cfg`.
    pub fn load(ck: &Checkpoint, cfg: &ClipVisionConfig) -> Result<Self> {
        let cfg = cfg.clone();
        let (d, p, mlp) = (cfg.hidden_size, cfg.patch_size, cfg.intermediate_size);
        let eps = cfg.layer_norm_eps;
        let zeros = |n: usize| Tensor::zeros(n, candle_core::DType::F32, &Device::Cpu);
        let w = ck.tensor("embeddings.patch_embedding.weight", &[d, 3, p, p])?;
        let patch = Linear::new(&w.reshape((d, 3 * p * p))?, zeros(d)?)?;
        let class = ck
            .tensor("embeddings.class_embedding", &[d])?
            .reshape((1, d))?;
        let positions = ck.tensor(
            "embeddings.position_embedding.weight",
            &[cfg.positions(), d],
        )?;
        let blocks = (0..cfg.num_hidden_layers)
            .map(|i| {
                let b = format!("encoder.layers.{i}");
                let a = format!("{b}.self_attn");
                let part = |n: &str| -> Result<(Tensor, Tensor)> {
                    Ok((
                        ck.tensor(&format!("{a}.{n}_proj.weight"), &[d, d])?,
                        ck.tensor(&format!("{a}.{n}_proj.bias"), &[d])?,
                    ))
                };
                let (q, k, v) = (part("q")?, part("k")?, part("v")?);
                let qkv = Linear::new(
                    &Tensor::cat(&[&q.0, &k.0, &v.0], 0)?,
                    Tensor::cat(&[&q.1, &k.1, &v.1], 0)?,
                )?;
                Ok(Block {
                    norm1: Norm::layer(ck, &format!("{b}.layer_norm1"), d, eps)?,
                    norm2: Norm::layer(ck, &format!("{b}.layer_norm2"), d, eps)?,
                    qkv,
                    out: Linear::load(ck, &format!("{a}.out_proj"), d, d)?,
                    fc1: Linear::load(ck, &format!("{b}.mlp.fc1"), mlp, d)?,
                    fc2: Linear::load(ck, &format!("{b}.mlp.fc2"), d, mlp)?,
                })
            })
            .collect::<Result<Vec<_>>>()?;
        let projection = match cfg.projection_dim {
            Some(pd) => Some(Linear::new(
                &ck.tensor_unprefixed(PROJECTION, &[pd, d])?,
                zeros(pd)?,
            )?),
            None => None,
        };
        Ok(ClipVisionTower {
            patch,
            class,
            positions,
            pre_norm: Norm::layer(ck, "pre_layrnorm", d, eps)?,
            blocks,
            post_norm: Norm::layer(ck, "post_layernorm", d, eps)?,
            projection,
            cfg,
        })
    }

    fn check(
        &self,
        rows: usize,
        cols: usize,
        grid_thw: &[[usize; 3]],
    ) -> std::result::Result<(), String> {
        let c = &self.cfg;
        check_grid(rows, cols, grid_thw, 3 * c.patch_size * c.patch_size, 1)?;
        for (i, &[t, h, w]) in grid_thw.iter().enumerate() {
            if t != 1 || h != c.grid() || w != c.grid() {
                return Err(format!(
                    "grid_thw[{i}] = [{t}, {h}, {w}]: the position table holds a {g}x{g} grid \
                     (image_size {}, patch_size {}); expected [1, {g}, {g}]",
                    c.image_size,
                    c.patch_size,
                    g = c.grid()
                ));
            }
        }
        Ok(())
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
        let per = cfg.grid() * cfg.grid();
        let seq = per + 1;
        let hd = cfg.head_dim();
        let attn = Attention {
            heads: cfg.num_attention_heads,
            head_dim: hd,
            // No rotary embeddings.
            cos: Vec::new(),
            sin: Vec::new(),
            segments: vec![(0, seq)],
        };
        let (mut hidden, mut pooled, mut embeds) = (Vec::new(), Vec::new(), Vec::new());
        let mut block_outputs: Vec<Vec<Tensor>> = vec![Vec::new(); cfg.num_hidden_layers];
        for i in 0..grid_thw.len() {
            let patches = self.patch.forward(&pixel_values.narrow(0, i * per, per)?)?;
            let mut x = add(&Tensor::cat(&[&self.class, &patches], 0)?, &self.positions)?;
            x = self.pre_norm.forward(&x)?;
            for (bi, blk) in self.blocks.iter().enumerate() {
                let h = blk.norm1.forward(&x)?;
                let a = kernels::apply1(&blk.qkv.forward(&h)?, &attn)?;
                x = add(&x, &blk.out.forward(&a)?)?;
                let h = blk.norm2.forward(&x)?;
                let h = blk
                    .fc2
                    .forward(&activation(&blk.fc1.forward(&h)?, cfg.hidden_act)?)?;
                x = add(&x, &h)?;
                if keep_blocks {
                    block_outputs[bi].push(x.clone());
                }
            }
            let p = self.post_norm.forward(&x.narrow(0, 0, 1)?)?;
            if let Some(proj) = &self.projection {
                embeds.push(proj.forward(&p)?);
            }
            pooled.push(p);
            hidden.push(x);
        }
        let mut outputs = vec![Tensor::cat(&hidden, 0)?, Tensor::cat(&pooled, 0)?];
        if self.projection.is_some() {
            outputs.push(Tensor::cat(&embeds, 0)?);
        }
        Ok(TowerOutput {
            outputs,
            block_outputs: block_outputs
                .into_iter()
                .filter(|b| !b.is_empty())
                .map(|b| Tensor::cat(&b, 0))
                .collect::<candle_core::Result<_>>()?,
        })
    }
}

impl super::VisionTower for ClipVisionTower {
    fn forward(
        &self,
        pixel_values: &Tensor,
        grid_thw: &[[usize; 3]],
        keep_blocks: bool,
    ) -> Result<TowerOutput> {
        ClipVisionTower::forward(self, pixel_values, grid_thw, keep_blocks)
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
