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

use crate::checkpoint::{Activation, Checkpoint};
use crate::error::{GridError, Result};
use crate::family::siglip::SiglipVisionConfig;
use crate::reference::vit::{
    EncoderLayer, Linear, Norm, Pass, TowerOutput, activation, add, bilinear_aa_matrix,
    check_one_frame, position_rows, resample_grid_by, run_in_passes, segments,
};

/// How the position table meets an image's grid.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Positions {
    /// SigLIP: the table is the `g x g` grid of `image_size`, resampled
    /// for other grids as `interpolate_pos_encoding` does (bicubic, no
    /// antialiasing).
    Bicubic,
    /// SigLIP2 (NaFlex): the `g x g` table resized to every image's grid,
    /// bilinear with antialiasing, even at its own size.
    BilinearAntialias,
}

/// The sizes the SigLIP-style towers (SigLIP, SigLIP2) share.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Dims {
    pub hidden: usize,
    pub heads: usize,
    pub mlp: usize,
    pub depth: usize,
    pub patch: usize,
    /// Side of the position table's square grid.
    pub grid: usize,
    pub act: Activation,
    pub eps: f64,
    pub use_head: bool,
}

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

/// The SigLIP vision tower with its weights (f32 math); SigLIP2's too
/// (`reference/siglip2.rs`), which differs in its patch embedding's layout
/// and its position table's resizing.
pub struct SiglipVisionTower {
    dims: Dims,
    resize: Positions,
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
        let (d, p) = (cfg.hidden_size, cfg.patch_size);
        let w = ck.tensor("embeddings.patch_embedding.weight", &[d, 3, p, p])?;
        let patch = Linear::new(
            &w.reshape((d, 3 * p * p))?,
            ck.tensor("embeddings.patch_embedding.bias", &[d])?,
        )?;
        let dims = Dims {
            hidden: d,
            heads: cfg.num_attention_heads,
            mlp: cfg.intermediate_size,
            depth: cfg.num_hidden_layers,
            patch: p,
            grid: cfg.grid(),
            act: cfg.hidden_act,
            eps: cfg.layer_norm_eps,
            use_head: cfg.vision_use_head,
        };
        Self::assemble(ck, dims, patch, Positions::Bicubic)
    }

    /// The tower from its patch embedding (a Linear over patch rows) and
    /// the checkpoint's other tensors, which SigLIP and SigLIP2 name alike.
    pub(crate) fn assemble(
        ck: &Checkpoint,
        dims: Dims,
        patch: Linear,
        resize: Positions,
    ) -> Result<Self> {
        let (d, mlp, eps) = (dims.hidden, dims.mlp, dims.eps);
        let positions = ck
            .tensor(
                "embeddings.position_embedding.weight",
                &[dims.grid * dims.grid, d],
            )?
            .flatten_all()?
            .to_vec1::<f32>()?;
        let blocks = crate::reference::vit::load_blocks(dims.depth, |i| {
            EncoderLayer::load(ck, i, d, mlp, eps)
        })?;
        let head = if dims.use_head {
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
            dims,
            resize,
        })
    }

    fn check(
        &self,
        rows: usize,
        cols: usize,
        grid_thw: &[[usize; 3]],
    ) -> std::result::Result<(), GridError> {
        check_one_frame(rows, cols, grid_thw, self.dims.patch)
    }

    /// The pooling head over one image's tokens `x [n, d]`: `[1, d]`.
    fn pool(&self, head: &Head, x: &Tensor) -> candle_core::Result<Tensor> {
        let (d, heads) = (self.dims.hidden, self.dims.heads);
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
            self.dims.act,
        )?)?;
        add(&h, &m)
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
        let dims = &self.dims;
        let seqs: Vec<usize> = grid_thw.iter().map(|g| g[1] * g[2]).collect();
        let mut start = 0;
        let embed = |i: usize| {
            let [_, h, w] = grid_thw[i];
            let per = h * w;
            let patches = self.patch.forward(&pixel_values.narrow(0, start, per)?)?;
            start += per;
            let (g, d) = (dims.grid, dims.hidden);
            let pos = match self.resize {
                // transformers' `interpolate_pos_encoding`: bicubic, no antialiasing.
                Positions::Bicubic => position_rows(&self.positions, 0, (g, d), (h, w), false)?,
                Positions::BilinearAntialias => {
                    let (mh, mw) = (bilinear_aa_matrix(g, h), bilinear_aa_matrix(g, w));
                    let rows = resample_grid_by(&self.positions, (g, d), (h, w), (&mh, &mw));
                    Tensor::from_vec(rows, (per, d), &candle_core::Device::Cpu)?
                }
            };
            add(&patches, &pos)
        };
        let (passes, block_outputs) = run_in_passes(
            &seqs,
            (dims.heads, dims.hidden / dims.heads),
            dims.depth,
            keep_blocks,
            embed,
            |b, x, attn| self.blocks[b].forward(x, attn, dims.act),
        )?;
        let (mut hidden, mut pooled) = (Vec::new(), Vec::new());
        for Pass { x, images } in passes {
            let x = self.post_norm.forward(&x)?;
            if let Some(head) = &self.head {
                for (first, seq) in segments(&seqs[images]) {
                    pooled.push(self.pool(head, &x.narrow(0, first, seq)?)?);
                }
            }
            hidden.push(x);
        }
        let mut outputs = vec![Tensor::cat(&hidden, 0)?];
        if self.head.is_some() {
            outputs.push(Tensor::cat(&pooled, 0)?);
        }
        Ok(TowerOutput {
            outputs,
            block_outputs,
        })
    }
}

impl crate::reference::VisionTower for SiglipVisionTower {
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
    ) -> std::result::Result<(), GridError> {
        self.check(rows, cols, grid_thw)
    }
}
