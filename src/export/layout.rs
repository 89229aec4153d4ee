//! Rewriting a checkpoint's tower weights into the ANE layout.
//!
//! Every Linear `W [out, in]` becomes a 1x1 conv weight `[out, in, 1, 1]`
//! (ANE-RULES R2, `linear_to_conv2d_map` in ml-ane-transformers). The patch
//! embedding's Conv3d `[D, 3, T, P, P]` becomes a 1x1 conv over one frame's
//! `(c, py, px)`: for a still image every temporal frame is the same, so the
//! frames' kernels are summed (in f32) and the host sends one frame, halving
//! the input. Norm weights and biases keep their shapes.
//!
//! This module holds what every family's layout does ([`Writer`]); each
//! family's own module lists its tensors.

use half::f16;
use half::slice::HalfFloatSliceExt;

use crate::checkpoint::Checkpoint;
use crate::error::{Error, Result};

/// The values of a layout tensor, in the precision asked for.
#[derive(Clone, Debug)]
pub enum LayoutData {
    F32(Vec<f32>),
    /// Rounded to nearest even from the f32 layout value.
    F16(Vec<f16>),
}

impl LayoutData {
    pub fn len(&self) -> usize {
        match self {
            LayoutData::F32(v) => v.len(),
            LayoutData::F16(v) => v.len(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// Which precision the layout keeps its tensors in.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Storage {
    /// `ane-export layout`: exactly the rewritten values.
    F32,
    /// `ane-export build`: what the package stores. Each tensor is rounded
    /// as soon as it is rewritten, so the tower is never held in f32 whole.
    F16,
}

/// One tensor in the ANE layout.
#[derive(Clone, Debug)]
pub struct LayoutTensor {
    pub name: String,
    pub shape: Vec<usize>,
    pub data: LayoutData,
    /// What the tensor is, for the JSON description of `ane-export layout`.
    pub meaning: String,
}

pub(crate) fn tensor(ck: &Checkpoint, name: &str, shape: &[usize]) -> Result<Vec<f32>> {
    Ok(ck.tensor(name, shape)?.flatten_all()?.to_vec1::<f32>()?)
}

/// Keep `v` in `storage`. A finite value beyond fp16's range would become
/// infinite in the package: refused, naming the tensor.
fn store(ck: &Checkpoint, name: &str, v: Vec<f32>, storage: Storage) -> Result<LayoutData> {
    match storage {
        Storage::F32 => Ok(LayoutData::F32(v)),
        Storage::F16 => {
            let mut h = vec![f16::ZERO; v.len()];
            h.convert_from_f32_slice(&v);
            if let Some(i) = h
                .iter()
                .zip(&v)
                .position(|(x, y)| x.is_infinite() && y.is_finite())
            {
                return Err(Error::checkpoint(
                    &ck.dir,
                    format!(
                        "tensor {name} (in the ANE layout): value {} at index {i} is beyond fp16's \
                         range (largest finite 65504), and the package stores fp16 weights",
                        v[i]
                    ),
                ));
            }
            Ok(LayoutData::F16(h))
        }
    }
}

/// Checkpoint tensor `name` of `shape`, kept in `storage`.
fn load(ck: &Checkpoint, name: &str, shape: &[usize], storage: Storage) -> Result<LayoutData> {
    store(ck, name, tensor(ck, name, shape)?, storage)
}

/// Collects a family's layout tensors, loading each from the checkpoint
/// and keeping it in the storage asked for.
pub struct Writer<'a> {
    ck: &'a Checkpoint,
    storage: Storage,
    out: Vec<LayoutTensor>,
}

impl<'a> Writer<'a> {
    pub fn new(ck: &'a Checkpoint, storage: Storage) -> Self {
        Writer {
            ck,
            storage,
            out: Vec::new(),
        }
    }

    /// The tensors written, in order.
    pub fn finish(self) -> Vec<LayoutTensor> {
        self.out
    }

    /// Checkpoint tensor `name` of `shape`, in f32.
    pub fn read(&self, name: &str, shape: &[usize]) -> Result<Vec<f32>> {
        tensor(self.ck, name, shape)
    }

    /// Add a computed tensor.
    pub fn push(
        &mut self,
        name: &str,
        shape: Vec<usize>,
        data: Vec<f32>,
        meaning: &str,
    ) -> Result<()> {
        self.out.push(LayoutTensor {
            data: store(self.ck, name, data, self.storage)?,
            name: name.to_string(),
            shape,
            meaning: meaning.to_string(),
        });
        Ok(())
    }

    /// Add checkpoint tensor `name` as it is.
    pub fn copy(&mut self, name: &str, shape: Vec<usize>, meaning: &str) -> Result<()> {
        let data = load(self.ck, name, &shape, self.storage)?;
        self.out.push(LayoutTensor {
            name: name.to_string(),
            shape,
            data,
            meaning: meaning.to_string(),
        });
        Ok(())
    }

    /// The Conv3d patch embedding `[D, 3, T, P, P]` (`patch_embed.proj`) as
    /// a 1x1 conv `patch_embed.weight [D, 3*P*P, 1, 1]` over one frame's
    /// `(c, py, px)`, the temporal frames summed in f32 (R2); its bias, if
    /// the family has one, as `patch_embed.bias`.
    pub fn patch_embed(&mut self, d: usize, p: usize, t: usize, bias: bool) -> Result<()> {
        let w = self.read("patch_embed.proj.weight", &[d, 3, t, p, p])?;
        let mut folded = vec![0f32; d * 3 * p * p];
        for o in 0..d {
            for ch in 0..3 {
                for ti in 0..t {
                    for k in 0..p * p {
                        folded[(o * 3 + ch) * p * p + k] += w[((o * 3 + ch) * t + ti) * p * p + k];
                    }
                }
            }
        }
        self.push(
            "patch_embed.weight",
            vec![d, 3 * p * p, 1, 1],
            folded,
            "patch embedding as a 1x1 conv over (c, py, px), temporal frames summed",
        )?;
        if bias {
            let b = self.read("patch_embed.proj.bias", &[d])?;
            self.push("patch_embed.bias", vec![d], b, "patch embedding bias")?;
        }
        Ok(())
    }

    /// A Linear `name.weight [o, i]` as a 1x1 conv weight `[o, i, 1, 1]`
    /// (R2), with its bias `name.bias [o]` if `bias`.
    pub fn linear(
        &mut self,
        name: &str,
        o: usize,
        i: usize,
        bias: bool,
        meaning: &str,
    ) -> Result<()> {
        let data = load(self.ck, &format!("{name}.weight"), &[o, i], self.storage)?;
        self.out.push(LayoutTensor {
            name: format!("{name}.weight"),
            shape: vec![o, i, 1, 1],
            data,
            meaning: format!("{meaning} (Linear as 1x1 conv, R2)"),
        });
        if bias {
            self.copy(&format!("{name}.bias"), vec![o], &format!("{meaning} bias"))?;
        }
        Ok(())
    }

    /// A LayerNorm over `n` channels: `name.weight` and `name.bias`.
    pub fn layer_norm(&mut self, name: &str, n: usize, meaning: &str) -> Result<()> {
        for part in ["weight", "bias"] {
            self.copy(
                &format!("{name}.{part}"),
                vec![n],
                &format!("{meaning} {part} (LayerNorm over channels)"),
            )?;
        }
        Ok(())
    }

    /// A LayerNorm `from` of the checkpoint written as `to` (`.weight`, `.bias`).
    pub fn layer_norm_as(&mut self, from: &str, to: &str, d: usize, meaning: &str) -> Result<()> {
        for part in ["weight", "bias"] {
            let v = self.read(&format!("{from}.{part}"), &[d])?;
            self.push(
                &format!("{to}.{part}"),
                vec![d],
                v,
                &format!("{meaning} {part} (LayerNorm over channels)"),
            )?;
        }
        Ok(())
    }

    /// A Linear `from` of the checkpoint `[o, i]` written as the 1x1 conv
    /// `to` (R2), with its bias.
    pub fn linear_as(
        &mut self,
        from: &str,
        to: &str,
        (o, i): (usize, usize),
        meaning: &str,
    ) -> Result<()> {
        let weight = self.read(&format!("{from}.weight"), &[o, i])?;
        self.push(
            &format!("{to}.weight"),
            vec![o, i, 1, 1],
            weight,
            &format!("{meaning} (Linear as 1x1 conv, R2)"),
        )?;
        let bias = self.read(&format!("{from}.bias"), &[o])?;
        self.push(
            &format!("{to}.bias"),
            vec![o],
            bias,
            &format!("{meaning} bias"),
        )
    }

    /// Layer `i` of a plain ViT encoder in transformers' CLIP and SigLIP
    /// layout (`encoder.layers.<i>`: `layer_norm1`, `self_attn.{q,k,v,out}_proj`,
    /// `layer_norm2`, `mlp.fc1`, `mlp.fc2`, width `d`, MLP `mlp`) written
    /// under the names the shared ViT builder reads: `blocks.<i>.norm1`,
    /// `.attn.qkv` (q, k and v fused), `.attn.proj`, `.norm2`, `.mlp.fc1`, `.mlp.fc2`.
    pub fn encoder_layer(&mut self, i: usize, d: usize, mlp: usize) -> Result<()> {
        let (l, b) = (format!("encoder.layers.{i}"), format!("blocks.{i}"));
        self.layer_norm_as(
            &format!("{l}.layer_norm1"),
            &format!("{b}.norm1"),
            d,
            "pre-attention norm",
        )?;
        let (mut qkv_w, mut qkv_b) = (Vec::with_capacity(3 * d * d), Vec::with_capacity(3 * d));
        for part in ["q", "k", "v"] {
            let name = format!("{l}.self_attn.{part}_proj");
            qkv_w.extend(self.read(&format!("{name}.weight"), &[d, d])?);
            qkv_b.extend(self.read(&format!("{name}.bias"), &[d])?);
        }
        self.push(
            &format!("{b}.attn.qkv.weight"),
            vec![3 * d, d, 1, 1],
            qkv_w,
            "q, k, v projections fused: rows [0,D) Q, [D,2D) K, [2D,3D) V, head-major (1x1 conv, R2)",
        )?;
        self.push(
            &format!("{b}.attn.qkv.bias"),
            vec![3 * d],
            qkv_b,
            "q, k, v biases",
        )?;
        self.linear_as(
            &format!("{l}.self_attn.out_proj"),
            &format!("{b}.attn.proj"),
            (d, d),
            "attention output projection",
        )?;
        self.layer_norm_as(
            &format!("{l}.layer_norm2"),
            &format!("{b}.norm2"),
            d,
            "pre-MLP norm",
        )?;
        self.linear_as(
            &format!("{l}.mlp.fc1"),
            &format!("{b}.mlp.fc1"),
            (mlp, d),
            "MLP up",
        )?;
        self.linear_as(
            &format!("{l}.mlp.fc2"),
            &format!("{b}.mlp.fc2"),
            (d, mlp),
            "MLP down",
        )
    }

    /// An RMSNorm over `n` channels: `name.weight`.
    pub fn rms_norm(&mut self, name: &str, n: usize, meaning: &str) -> Result<()> {
        self.copy(
            &format!("{name}.weight"),
            vec![n],
            &format!("{meaning} weight (RMSNorm over channels)"),
        )
    }
}
