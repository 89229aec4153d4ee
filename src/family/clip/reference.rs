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

use crate::checkpoint::Checkpoint;
use crate::error::{GridError, Result};
use crate::family::clip::ClipVisionConfig;
use crate::family::clip::config::PROJECTION;
use crate::reference::vit::{
    EncoderLayer, Linear, Norm, Pass, TowerOutput, add, check_one_frame, position_rows,
    run_in_passes, segments,
};

/// The CLIP vision tower with its weights (f32 math).
pub struct ClipVisionTower {
    cfg: ClipVisionConfig,
    patch: Linear,
    class: Tensor,
    /// `[g*g + 1, D]`, the class token's row first.
    positions: Vec<f32>,
    pre_norm: Norm,
    blocks: Vec<EncoderLayer>,
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
        let positions = ck
            .tensor(
                "embeddings.position_embedding.weight",
                &[cfg.positions(), d],
            )?
            .flatten_all()?
            .to_vec1::<f32>()?;
        let blocks = crate::reference::vit::load_blocks(cfg.num_hidden_layers, |i| {
            EncoderLayer::load(ck, i, d, mlp, eps)
        })?;
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
        let seqs: Vec<usize> = grid_thw.iter().map(|g| g[1] * g[2] + 1).collect();
        let mut start = 0;
        let embed = |i: usize| {
            let [_, h, w] = grid_thw[i];
            let per = h * w;
            let patches = self.patch.forward(&pixel_values.narrow(0, start, per)?)?;
            start += per;
            // transformers' `interpolate_pos_encoding`: bicubic, no antialiasing.
            let pos = position_rows(
                &self.positions,
                1,
                (cfg.grid(), cfg.hidden_size),
                (h, w),
                false,
            )?;
            // `pre_layrnorm` normalises each row alone: per image as per pass.
            self.pre_norm
                .forward(&add(&Tensor::cat(&[&self.class, &patches], 0)?, &pos)?)
        };
        let (passes, block_outputs) = run_in_passes(
            &seqs,
            (cfg.num_attention_heads, cfg.head_dim()),
            cfg.num_hidden_layers,
            keep_blocks,
            embed,
            |b, x, attn| self.blocks[b].forward(x, attn, cfg.hidden_act),
        )?;
        let (mut hidden, mut pooled, mut embeds) = (Vec::new(), Vec::new(), Vec::new());
        for Pass { x, images } in passes {
            for (first, _) in segments(&seqs[images]) {
                let p = self.post_norm.forward(&x.narrow(0, first, 1)?)?;
                if let Some(proj) = &self.projection {
                    embeds.push(proj.forward(&p)?);
                }
                pooled.push(p);
            }
            hidden.push(x);
        }
        let mut outputs = vec![Tensor::cat(&hidden, 0)?, Tensor::cat(&pooled, 0)?];
        if self.projection.is_some() {
            outputs.push(Tensor::cat(&embeds, 0)?);
        }
        Ok(TowerOutput {
            outputs,
            block_outputs,
        })
    }
}

impl crate::reference::VisionTower for ClipVisionTower {
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
    ) -> std::result::Result<(), GridError> {
        self.check(rows, cols, grid_thw)
    }
}
