//! What the reference towers share: the layers of a pre-norm ViT in the
//! checkpoint's own layout, `(tokens, channels)`, on the fused kernels of
//! [`super::kernels`], and the token orders of the Qwen image processors
//! (merge-block order, frames as attention segments, 2-D rotary angles).
//! Part of the reference: nothing here is shared with the export path.

use candle_core::{DType, Device, Tensor};

use super::kernels::{self, Gelu, LinearOp, ParAdd};
use crate::checkpoint::{Activation, Checkpoint};
use crate::error::{GridError, Result};

/// A tower's `depth` blocks, `load(i)` loading block `i`, over rayon's
/// threads: each block's weights are read, widened, transposed and
/// compacted apart from the others'. Returns them in order, or one
/// block's error.
pub fn load_blocks<B: Send>(
    depth: usize,
    load: impl Fn(usize) -> Result<B> + Sync + Send,
) -> Result<Vec<B>> {
    use rayon::prelude::*;
    // Every block's result kept, then the first error in block order: the
    // error a user sees does not depend on which thread failed first.
    let all: Vec<Result<B>> = (0..depth).into_par_iter().map(load).collect();
    all.into_iter().collect()
}

/// `x W^T + b` for `x (n, in)`; the checkpoint's `W (out, in)` is kept
/// transposed, `(in, out)`, for the matrix product.
pub struct Linear {
    wt: Tensor,
    b: Tensor,
}

impl Linear {
    /// `name.weight [out, in]` and `name.bias [out]`.
    pub fn load(ck: &Checkpoint, name: &str, out: usize, inp: usize) -> Result<Linear> {
        let w = ck.tensor(&format!("{name}.weight"), &[out, inp])?;
        Linear::new(&w, ck.tensor(&format!("{name}.bias"), &[out])?)
    }

    /// `name.weight [out, in]` of a Linear without bias.
    pub fn load_no_bias(ck: &Checkpoint, name: &str, out: usize, inp: usize) -> Result<Linear> {
        let w = ck.tensor(&format!("{name}.weight"), &[out, inp])?;
        Linear::new(&w, Tensor::zeros(out, DType::F32, &Device::Cpu)?)
    }

    /// A Conv3d patch embedding without bias (`patch_embed.proj.weight
    /// [d, c, t, p, p]`, kernel == stride) as the Linear over the flattened
    /// `(c, t, py, px)` patch it is.
    pub fn patch_embed_no_bias(ck: &Checkpoint, d: usize, [c, t, p]: [usize; 3]) -> Result<Linear> {
        let w = ck.tensor("patch_embed.proj.weight", &[d, c, t, p, p])?;
        Linear::new(
            &w.reshape((d, c * t * p * p))?,
            Tensor::zeros(d, DType::F32, &Device::Cpu)?,
        )
    }

    /// The Linear of `w [out, in]` (f32, as the checkpoint reader gives
    /// it) and `b [out]`. `W^T` is held in the checkpoint's own precision
    /// when that holds it exactly (bf16 or f16 weights: half the memory of
    /// f32) and widened for each product ([`kernels::compact`]).
    pub fn new(w: &Tensor, b: Tensor) -> Result<Linear> {
        let (out, inp) = w.dims2()?;
        let wt = kernels::transpose(&w.flatten_all()?.to_vec1::<f32>()?, out, inp);
        Ok(Linear {
            wt: kernels::compact(wt, (inp, out))?,
            b,
        })
    }

    pub fn forward(&self, x: &Tensor) -> candle_core::Result<Tensor> {
        x.contiguous()?
            .apply_op3_no_bwd(&self.wt, &self.b, &LinearOp)
    }
}

/// LayerNorm (`name.weight`, `name.bias`) or RMSNorm (`name.weight` only)
/// over the channels.
pub enum Norm {
    Layer { w: Tensor, b: Tensor, eps: f32 },
    Rms { w: Tensor, eps: f32 },
}

impl Norm {
    pub fn layer(ck: &Checkpoint, name: &str, dim: usize, eps: f64) -> Result<Norm> {
        Ok(Norm::Layer {
            w: ck.tensor(&format!("{name}.weight"), &[dim])?,
            b: ck.tensor(&format!("{name}.bias"), &[dim])?,
            eps: eps as f32,
        })
    }

    pub fn rms(ck: &Checkpoint, name: &str, dim: usize, eps: f64) -> Result<Norm> {
        Ok(Norm::Rms {
            w: ck.tensor(&format!("{name}.weight"), &[dim])?,
            eps: eps as f32,
        })
    }

    pub fn forward(&self, x: &Tensor) -> candle_core::Result<Tensor> {
        match self {
            Norm::Layer { w, b, eps } => candle_nn::ops::layer_norm(x, w, b, *eps),
            Norm::Rms { w, eps } => candle_nn::ops::rms_norm(&x.contiguous()?, w, *eps),
        }
    }
}

/// The MLP activation `act` applied elementwise.
pub fn activation(x: &Tensor, act: Activation) -> candle_core::Result<Tensor> {
    let op = match act {
        Activation::GeluTanh => Gelu::Tanh,
        Activation::GeluErf => Gelu::Erf,
        Activation::QuickGelu => Gelu::Quick,
        Activation::Silu => Gelu::Silu,
        Activation::Relu => Gelu::Relu,
    };
    kernels::apply1(x, &op)
}

pub fn add(a: &Tensor, b: &Tensor) -> candle_core::Result<Tensor> {
    a.contiguous()?.apply_op2_no_bwd(&b.contiguous()?, &ParAdd)
}

/// One layer of a plain ViT encoder as transformers lays it out for CLIP
/// and SigLIP (`encoder.layers.<i>`: `layer_norm1`, `self_attn.{q,k,v,out}_proj`
/// with biases, `layer_norm2`, `mlp.fc1`, `mlp.fc2`): `x + out(attn(LN1 x))`,
/// then `x + fc2(act(fc1(LN2 x)))`.
pub struct EncoderLayer {
    norm1: Norm,
    norm2: Norm,
    /// q, k and v fused: rows `[0, D)` Q, `[D, 2D)` K, `[2D, 3D)` V.
    qkv: Linear,
    out: Linear,
    fc1: Linear,
    fc2: Linear,
}

impl EncoderLayer {
    /// Layer `i` of width `d`, MLP `mlp`, LayerNorm epsilon `eps`.
    pub fn load(ck: &Checkpoint, i: usize, d: usize, mlp: usize, eps: f64) -> Result<EncoderLayer> {
        let b = format!("encoder.layers.{i}");
        let a = format!("{b}.self_attn");
        let part = |n: &str| -> Result<(Tensor, Tensor)> {
            Ok((
                ck.tensor(&format!("{a}.{n}_proj.weight"), &[d, d])?,
                ck.tensor(&format!("{a}.{n}_proj.bias"), &[d])?,
            ))
        };
        let (q, k, v) = (part("q")?, part("k")?, part("v")?);
        Ok(EncoderLayer {
            norm1: Norm::layer(ck, &format!("{b}.layer_norm1"), d, eps)?,
            norm2: Norm::layer(ck, &format!("{b}.layer_norm2"), d, eps)?,
            qkv: Linear::new(
                &Tensor::cat(&[&q.0, &k.0, &v.0], 0)?,
                Tensor::cat(&[&q.1, &k.1, &v.1], 0)?,
            )?,
            out: Linear::load(ck, &format!("{a}.out_proj"), d, d)?,
            fc1: Linear::load(ck, &format!("{b}.mlp.fc1"), mlp, d)?,
            fc2: Linear::load(ck, &format!("{b}.mlp.fc2"), d, mlp)?,
        })
    }

    /// The layer over `x [tokens, d]`, attention by `attn`, MLP activation `act`.
    pub fn forward(
        &self,
        x: &Tensor,
        attn: &kernels::Attention,
        act: Activation,
    ) -> candle_core::Result<Tensor> {
        let h = self.norm1.forward(x)?;
        let a = kernels::apply1(&self.qkv.forward(&h)?, attn)?;
        let x = add(x, &self.out.forward(&a)?)?;
        let h = self.norm2.forward(&x)?;
        let h = self
            .fc2
            .forward(&activation(&self.fc1.forward(&h)?, act)?)?;
        add(&x, &h)
    }
}

/// Full attention without rotary embeddings over images of `seqs` tokens
/// each, their rows one after another, every image attending to itself
/// alone (the fixed-resolution encoders').
pub fn plain_attention(heads: usize, head_dim: usize, seqs: &[usize]) -> kernels::Attention {
    kernels::Attention {
        heads,
        head_dim,
        cos: Vec::new(),
        sin: Vec::new(),
        segments: segments(seqs).collect(),
    }
}

/// Each image's first row and token count, for images of `seqs` tokens
/// whose rows follow one another.
pub fn segments(seqs: &[usize]) -> impl Iterator<Item = (usize, usize)> + '_ {
    seqs.iter().scan(0, |start, &len| {
        let first = *start;
        *start += len;
        Some((first, len))
    })
}

/// Tokens the encoders run through their blocks in one pass: the images of
/// a call go through together, as attention segments of one sequence, up to
/// this many tokens, so that each Linear's weights are widened and packed
/// once for several images rather than once per image (the products of an
/// image of a few hundred tokens are too small to hide that cost).
pub const PASS_TOKENS: usize = 4096;

/// The images of a call (`seqs[i]` tokens each) in passes: consecutive
/// images whose tokens sum to at most `budget`, an image larger than that in
/// a pass of its own.
pub fn passes(seqs: &[usize], budget: usize) -> Vec<std::ops::Range<usize>> {
    let mut out = Vec::new();
    let (mut lo, mut tokens) = (0, 0);
    for (i, &s) in seqs.iter().enumerate() {
        if i > lo && tokens + s > budget {
            out.push(lo..i);
            (lo, tokens) = (i, 0);
        }
        tokens += s;
    }
    if lo < seqs.len() {
        out.push(lo..seqs.len());
    }
    out
}

/// One pass of [`run_in_passes`]: the blocks' output for its images, and
/// which images of the call they are.
pub struct Pass {
    /// `[tokens, hidden]`: the images' tokens one after another.
    pub x: Tensor,
    /// The pass's images, as indices into the call's `seqs`.
    pub images: std::ops::Range<usize>,
}

/// An encoder's blocks over a call's images (`seqs[i]` tokens each), in
/// [`passes`] of at most [`PASS_TOKENS`] tokens, each image attending to
/// itself alone. `embed(i)` gives image `i`'s tokens before the first block
/// (called once per image, in order); `block(b, x, attention)` runs block
/// `b` of `depth`. Returns the passes and, with `keep_blocks`, every block's
/// output over all the images.
pub fn run_in_passes(
    seqs: &[usize],
    (heads, head_dim): (usize, usize),
    depth: usize,
    keep_blocks: bool,
    mut embed: impl FnMut(usize) -> candle_core::Result<Tensor>,
    block: impl Fn(usize, &Tensor, &kernels::Attention) -> candle_core::Result<Tensor>,
) -> candle_core::Result<(Vec<Pass>, Vec<Tensor>)> {
    let mut out = Vec::new();
    let mut kept: Vec<Vec<Tensor>> = vec![Vec::new(); if keep_blocks { depth } else { 0 }];
    for images in passes(seqs, PASS_TOKENS) {
        let xs = images
            .clone()
            .map(&mut embed)
            .collect::<candle_core::Result<Vec<_>>>()?;
        let attn = plain_attention(heads, head_dim, &seqs[images.clone()]);
        let mut x = Tensor::cat(&xs, 0)?;
        for b in 0..depth {
            x = block(b, &x, &attn)?;
            if let Some(k) = kept.get_mut(b) {
                k.push(x.clone());
            }
        }
        out.push(Pass { x, images });
    }
    Ok((out, concat_blocks(kept)?))
}

/// Check the grids of a fixed-resolution encoder's call: `rows` x `cols`
/// of `pixel_values` (`3 * patch^2` columns) against `grid_thw`, every
/// image one frame (any grid: the position table is resampled to it); the
/// message says what is wrong.
pub fn check_one_frame(
    rows: usize,
    cols: usize,
    grid_thw: &[[usize; 3]],
    patch: usize,
) -> std::result::Result<(), GridError> {
    check_grid(rows, cols, grid_thw, 3 * patch * patch, 1)?;
    for (i, &[t, ..]) in grid_thw.iter().enumerate() {
        if t != 1 {
            return Err(GridError::Frames { index: i, t });
        }
    }
    Ok(())
}

/// The position rows of an `h x w` grid from a learned table `[lead + g*g,
/// d]` (`lead` rows first that are not resampled: CLIP's and DINOv2's
/// class token): the table itself when the grid is the table's (as
/// transformers skips the resampling then), else the lead rows and the
/// `g x g` rows resampled by [`resample_grid`]; `[lead + h*w, d]`.
pub fn position_rows(
    table: &[f32],
    lead: usize,
    (g, d): (usize, usize),
    (h, w): (usize, usize),
    antialias: bool,
) -> candle_core::Result<Tensor> {
    if (h, w) == (g, g) {
        return Tensor::from_slice(table, (lead + g * g, d), &Device::Cpu);
    }
    let mut out = table[..lead * d].to_vec();
    out.extend(resample_grid(&table[lead * d..], (g, d), (h, w), antialias));
    Tensor::from_vec(out, (lead + h * w, d), &Device::Cpu)
}

/// Per-block states gathered image by image (`per_block[b]` holds block
/// `b`'s output for each image) as one tensor per block, the images' rows
/// one after another; blocks never kept are left out.
pub fn concat_blocks(per_block: Vec<Vec<Tensor>>) -> candle_core::Result<Vec<Tensor>> {
    per_block
        .into_iter()
        .filter(|b| !b.is_empty())
        .map(|b| Tensor::cat(&b, 0))
        .collect()
}

/// What a tower returns for one call.
pub struct TowerOutput {
    /// The outputs `[tokens, width]` of
    /// [`crate::family::Tower::outputs`], in order: for the Qwen-VL
    /// families the merged tokens `[n / merge^2, out_hidden_size]`, then
    /// one such per deepstack index in config order.
    pub outputs: Vec<Tensor>,
    /// `[n, hidden]` after each block, when asked for.
    pub block_outputs: Vec<Tensor>,
}

/// Check `grid_thw` against `rows` x `cols` of `pixel_values` (`patch_dim`
/// columns, grid sides multiples of `m`); the message says what is wrong.
pub fn check_grid(
    rows: usize,
    cols: usize,
    grid_thw: &[[usize; 3]],
    patch_dim: usize,
    m: usize,
) -> std::result::Result<(), GridError> {
    if cols != patch_dim {
        return Err(GridError::RowLength {
            got: cols,
            expected: patch_dim,
        });
    }
    if grid_thw.is_empty() {
        return Err(GridError::Empty);
    }
    let mut total = 0usize;
    for (i, &[t, h, w]) in grid_thw.iter().enumerate() {
        if t == 0 || h == 0 || w == 0 || h % m != 0 || w % m != 0 {
            return Err(GridError::Sizes {
                index: i,
                t,
                h,
                w,
                multiple: m,
            });
        }
        total = t
            .checked_mul(h)
            .and_then(|x| x.checked_mul(w))
            .and_then(|x| x.checked_add(total))
            .ok_or(GridError::Overflow(i))?;
    }
    if total != rows {
        return Err(GridError::Rows {
            patches: total,
            rows,
        });
    }
    Ok(())
}

/// Rotary cos/sin, `[n, head_dim / 2]` each: `[row * inv_freq, col * inv_freq]`
/// for every token in merge-block order, `inv_freq[k] = theta^(-2k / (hd/2))`.
pub fn rotary(
    grid_thw: &[[usize; 3]],
    m: usize,
    head_dim: usize,
    theta: f64,
) -> (Vec<f32>, Vec<f32>) {
    let spatial = head_dim / 2;
    let theta = theta as f32;
    let inv: Vec<f32> = (0..spatial)
        .step_by(2)
        .map(|k| 1.0 / theta.powf(k as f32 / spatial as f32))
        .collect();
    let total: usize = grid_thw.iter().map(|g| g[0] * g[1] * g[2]).sum();
    let mut cos = Vec::with_capacity(total * spatial);
    let mut sin = Vec::with_capacity(total * spatial);
    for &[t, h, w] in grid_thw {
        for _ in 0..t {
            for (row, col) in merge_order(h, w, m) {
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

/// (row, col) of each token of an `h x w` grid in merge-block order.
pub fn merge_order(h: usize, w: usize, m: usize) -> impl Iterator<Item = (usize, usize)> {
    (0..h / m).flat_map(move |br| {
        (0..w / m).flat_map(move |bc| {
            (0..m).flat_map(move |ir| (0..m).map(move |ic| (br * m + ir, bc * m + ic)))
        })
    })
}

/// `(start, len)` of each attention segment: every frame of every image.
pub fn frame_segments(grid_thw: &[[usize; 3]]) -> Vec<(usize, usize)> {
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

/// The merger of the Qwen towers: normalise (before merging rows, or after
/// when `postshuffle`), `unit` consecutive rows become one, fc1, exact GELU
/// (`nn.GELU()`), fc2.
pub struct Merger {
    pub norm: Norm,
    pub postshuffle: bool,
    pub fc1: Linear,
    pub fc2: Linear,
}

impl Merger {
    /// Qwen2-VL's and Qwen2.5-VL's merger: `merger.ln_q` (the family's norm,
    /// over each patch's `d` channels, made by `norm`), then `merger.mlp.0`,
    /// GELU and `merger.mlp.2` over groups of `merge^2` patches to `out`.
    pub fn load_qwen2(
        ck: &Checkpoint,
        norm: impl FnOnce(&Checkpoint, &str, usize) -> Result<Norm>,
        d: usize,
        merge: usize,
        out: usize,
    ) -> Result<Merger> {
        let md = d * merge * merge;
        Ok(Merger {
            norm: norm(ck, "merger.ln_q", d)?,
            postshuffle: false,
            fc1: Linear::load(ck, "merger.mlp.0", md, md)?,
            fc2: Linear::load(ck, "merger.mlp.2", out, md)?,
        })
    }

    pub fn forward(&self, x: &Tensor, unit: usize) -> candle_core::Result<Tensor> {
        let (n, d) = x.dims2()?;
        let x = if self.postshuffle {
            self.norm.forward(&x.reshape((n / unit, d * unit))?)?
        } else {
            self.norm.forward(x)?.reshape((n / unit, d * unit))?
        };
        let x = activation(&self.fc1.forward(&x)?, Activation::GeluErf)?;
        self.fc2.forward(&x)
    }
}

/// The `[out, inp]` matrix of PyTorch's bicubic `interpolate` along one
/// axis from `inp` to `out` samples, `align_corners=False`: without
/// antialiasing Keys' cubic with a = -0.75 on the 4 nearest samples (edge
/// samples repeated); with it, the cubic with a = -0.5 stretched by the
/// scale when shrinking, weights normalised to sum 1
/// (`_upsample_bicubic2d_aa`).
pub fn resample_matrix(inp: usize, out: usize, antialias: bool) -> Vec<f64> {
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

/// A `g x g` grid of rows of `d` channels (`table`, row-major `[g*g, d]`)
/// resampled to `h x w` by PyTorch's bicubic `interpolate`
/// (`align_corners=False`, antialiased or not: [`resample_matrix`]),
/// computed in f64 as dense matrices, width then height; rows `[h*w, d]`.
pub fn resample_grid(
    table: &[f32],
    (g, d): (usize, usize),
    (h, w): (usize, usize),
    antialias: bool,
) -> Vec<f32> {
    let (mh, mw) = (
        resample_matrix(g, h, antialias),
        resample_matrix(g, w, antialias),
    );
    resample_grid_by(table, (g, d), (h, w), (&mh, &mw))
}

/// The `[out, inp]` matrix of PyTorch's bilinear `interpolate` with
/// `align_corners=False` and `antialias=True` along one axis (SigLIP2's
/// position table): the triangle of half-width 1, stretched by the scale
/// when shrinking, centred at `scale * (i + 0.5)`, weights normalised to
/// sum 1 (`_upsample_bilinear2d_aa`).
pub fn bilinear_aa_matrix(inp: usize, out: usize) -> Vec<f64> {
    let scale = inp as f64 / out as f64;
    let (support, inv) = if scale >= 1.0 {
        (scale, 1.0 / scale)
    } else {
        (1.0, 1.0)
    };
    let mut m = vec![0f64; out * inp];
    for i in 0..out {
        let center = scale * (i as f64 + 0.5);
        let lo = ((center - support + 0.5) as i64).max(0) as usize;
        let hi = ((center + support + 0.5) as i64).min(inp as i64) as usize;
        let ws: Vec<f64> = (lo..hi)
            .map(|j| (1.0 - ((j as f64 - center + 0.5) * inv).abs()).max(0.0))
            .collect();
        let total: f64 = ws.iter().sum();
        for (j, wv) in (lo..hi).zip(ws) {
            m[i * inp + j] = if total != 0.0 { wv / total } else { wv };
        }
    }
    m
}

/// A `g x g` grid of rows (`table`, `[g*g, d]`) resampled to `h x w` by
/// the matrices `mh [h, g]` and `mw [w, g]`, in f64, width then height.
pub fn resample_grid_by(
    table: &[f32],
    (g, d): (usize, usize),
    (h, w): (usize, usize),
    (mh, mw): (&[f64], &[f64]),
) -> Vec<f32> {
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
    let mut out = Vec::with_capacity(h * w * d);
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
    out
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

    #[test]
    fn bilinear_antialias_is_plain_bilinear_when_growing() {
        // Growing, the stretched triangle is the plain one: output i reads
        // src = (i + 0.5) * scale - 0.5, clamped at the edges.
        let (inp, out) = (4, 7);
        let m = bilinear_aa_matrix(inp, out);
        for i in 0..out {
            let src = ((i as f64 + 0.5) * inp as f64 / out as f64 - 0.5).max(0.0);
            let (x0, t) = (src.floor() as usize, src - src.floor());
            let mut want = vec![0f64; inp];
            want[x0] += 1.0 - t;
            want[(x0 + 1).min(inp - 1)] += t;
            for (a, b) in m[i * inp..(i + 1) * inp].iter().zip(&want) {
                assert!((a - b).abs() < 1e-12, "row {i}: {a} vs {b}");
            }
        }
        // The same size is the identity; shrinking by 2, an inner output
        // reads 4 inputs with the triangle stretched to half-width 2.
        let id = bilinear_aa_matrix(5, 5);
        for i in 0..5 {
            assert_eq!(id[i * 5 + i], 1.0);
        }
        let half = bilinear_aa_matrix(8, 4);
        assert_eq!(
            &half[8..16],
            &[0.0, 0.125, 0.375, 0.375, 0.125, 0.0, 0.0, 0.0]
        );
    }

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
