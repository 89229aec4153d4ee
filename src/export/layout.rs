//! Rewriting a checkpoint's tower weights into the ANE layout.
//!
//! Every Linear `W [out, in]` becomes a 1x1 conv weight `[out, in, 1, 1]`
//! (ANE-RULES R2, `linear_to_conv2d_map` in ml-ane-transformers). The patch
//! embedding's Conv3d `[D, 3, T, P, P]` becomes a 1x1 conv over one frame's
//! `(c, py, px)`: for a still image every temporal frame is the same, so the
//! frames' kernels are summed (in f32) and the host sends one frame, halving
//! the input. Norm weights and biases keep their shapes.

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

fn tensor(ck: &Checkpoint, name: &str, shape: &[usize]) -> Result<Vec<f32>> {
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

/// All tower weights of a Qwen3-VL checkpoint in the ANE layout.
pub fn qwen3_vl(ck: &Checkpoint, storage: Storage) -> Result<Vec<LayoutTensor>> {
    let c = &ck.vision;
    let (d, p, t) = (c.hidden_size, c.patch_size, c.temporal_patch_size);
    let mut out = Vec::new();
    let mut push = |name: String, shape: Vec<usize>, data: Vec<f32>, meaning: &str| -> Result<()> {
        out.push(LayoutTensor {
            data: store(ck, &name, data, storage)?,
            name,
            shape,
            meaning: meaning.to_string(),
        });
        Ok(())
    };
    // Conv3d [D, 3, T, P, P] -> sum over T -> [D, 3*P*P, 1, 1]   (R2, frames folded)
    let w = tensor(ck, "patch_embed.proj.weight", &[d, 3, t, p, p])?;
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
    push(
        "patch_embed.weight".into(),
        vec![d, 3 * p * p, 1, 1],
        folded,
        "patch embedding as a 1x1 conv over (c, py, px), temporal frames summed",
    )?;
    push(
        "patch_embed.bias".into(),
        vec![d],
        tensor(ck, "patch_embed.proj.bias", &[d])?,
        "patch embedding bias",
    )?;
    let linear = |name: &str,
                  o: usize,
                  i: usize,
                  meaning: &str,
                  out: &mut Vec<LayoutTensor>|
     -> Result<()> {
        out.push(LayoutTensor {
            name: format!("{name}.weight"),
            shape: vec![o, i, 1, 1],
            data: load(ck, &format!("{name}.weight"), &[o, i], storage)?,
            meaning: format!("{meaning} (Linear as 1x1 conv, R2)"),
        });
        out.push(LayoutTensor {
            name: format!("{name}.bias"),
            shape: vec![o],
            data: load(ck, &format!("{name}.bias"), &[o], storage)?,
            meaning: format!("{meaning} bias"),
        });
        Ok(())
    };
    let norm = |name: &str, n: usize, meaning: &str, out: &mut Vec<LayoutTensor>| -> Result<()> {
        for part in ["weight", "bias"] {
            out.push(LayoutTensor {
                name: format!("{name}.{part}"),
                shape: vec![n],
                data: load(ck, &format!("{name}.{part}"), &[n], storage)?,
                meaning: format!("{meaning} {part} (LayerNorm over channels)"),
            });
        }
        Ok(())
    };
    for i in 0..c.depth {
        let b = format!("blocks.{i}");
        norm(&format!("{b}.norm1"), d, "pre-attention norm", &mut out)?;
        linear(
            &format!("{b}.attn.qkv"),
            3 * d,
            d,
            "fused QKV: rows [0,D) Q, [D,2D) K, [2D,3D) V, head-major",
            &mut out,
        )?;
        linear(
            &format!("{b}.attn.proj"),
            d,
            d,
            "attention output projection",
            &mut out,
        )?;
        norm(&format!("{b}.norm2"), d, "pre-MLP norm", &mut out)?;
        linear(
            &format!("{b}.mlp.linear_fc1"),
            c.intermediate_size,
            d,
            "MLP up",
            &mut out,
        )?;
        linear(
            &format!("{b}.mlp.linear_fc2"),
            d,
            c.intermediate_size,
            "MLP down",
            &mut out,
        )?;
    }
    let md = 4 * d;
    norm(
        "merger.norm",
        d,
        "merger norm (before merging 4 tokens)",
        &mut out,
    )?;
    linear("merger.linear_fc1", md, md, "merger fc1", &mut out)?;
    linear(
        "merger.linear_fc2",
        c.out_hidden_size,
        md,
        "merger fc2",
        &mut out,
    )?;
    for j in 0..c.deepstack_visual_indexes.len() {
        let m = format!("deepstack_merger_list.{j}");
        norm(
            &format!("{m}.norm"),
            md,
            "deepstack norm (after merging 4 tokens)",
            &mut out,
        )?;
        linear(
            &format!("{m}.linear_fc1"),
            md,
            md,
            "deepstack fc1",
            &mut out,
        )?;
        linear(
            &format!("{m}.linear_fc2"),
            c.out_hidden_size,
            md,
            "deepstack fc2",
            &mut out,
        )?;
    }
    Ok(out)
}
