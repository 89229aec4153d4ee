//! What the families' vision configs share: the MLP activations, and a
//! reader of `config.json`'s `vision_config` whose errors name the field.
//! Each family's typed config lives in its own module beside this one.

use std::path::Path;

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use crate::error::{Error, Result};

/// The MLP activation inside the vision blocks.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Activation {
    /// `gelu_pytorch_tanh` / `gelu_new`: tanh approximation.
    GeluTanh,
    /// `gelu`: exact erf form.
    GeluErf,
    /// `quick_gelu`: `x * sigmoid(1.702 x)`.
    QuickGelu,
    /// `silu`: `x * sigmoid(x)`.
    Silu,
}

impl Activation {
    /// transformers' name (`hidden_act`), as the Python builders take it.
    pub fn hf_name(self) -> &'static str {
        match self {
            Activation::GeluTanh => "gelu_pytorch_tanh",
            Activation::GeluErf => "gelu",
            Activation::QuickGelu => "quick_gelu",
            Activation::Silu => "silu",
        }
    }
}

/// The `vision_config` object of a `config.json`, read field by field; every
/// error names `vision_config.<field>` and the file.
pub struct VisionFields<'a> {
    path: &'a Path,
    vc: &'a Map<String, Value>,
    /// How messages name a field: `vision_config.` before its key, or
    /// nothing for a config that is the tower's alone ([`VisionFields::flat`]).
    prefix: &'static str,
}

impl<'a> VisionFields<'a> {
    pub fn of(path: &'a Path, v: &'a Value) -> Result<Self> {
        // A checkpoint of the tower alone (`model_type` `<family>_vision`,
        // or `<family>_vision_model`) is its vision config.
        let bare = v
            .get("model_type")
            .and_then(Value::as_str)
            .is_some_and(|t| t.ends_with("_vision") || t.ends_with("_vision_model"));
        let vc = if bare {
            Some(v)
        } else {
            v.get("vision_config")
        }
        .and_then(Value::as_object)
        .ok_or_else(|| Error::config(path, "field `vision_config`: missing or not an object"))?;
        Ok(VisionFields {
            path,
            vc,
            prefix: "vision_config.",
        })
    }

    /// The fields of a config that is the vision model's own, top level
    /// (DINOv2's `config.json`); messages name the keys alone.
    pub fn flat(path: &'a Path, v: &'a Value) -> Result<Self> {
        let vc = v
            .as_object()
            .ok_or_else(|| Error::config(path, "expected a JSON object"))?;
        Ok(VisionFields {
            path,
            vc,
            prefix: "",
        })
    }

    /// A boolean; `default` when absent.
    pub fn flag(&self, key: &str, default: bool) -> Result<bool> {
        match self.vc.get(key) {
            None => Ok(default),
            Some(x) => x.as_bool().ok_or_else(|| {
                Error::config(
                    self.path,
                    format!(
                        "field `{}{key}`: expected true or false, got {x}",
                        self.prefix
                    ),
                )
            }),
        }
    }

    pub fn path(&self) -> &Path {
        self.path
    }

    /// A non-negative integer; `default` when absent (`None`: required).
    pub fn uint(&self, key: &str, default: Option<usize>) -> Result<usize> {
        match self.vc.get(key) {
            Some(x) => x.as_u64().map(|u| u as usize).ok_or_else(|| {
                Error::config(
                    self.path,
                    format!(
                        "field `{}{key}`: expected a non-negative integer, got {x}",
                        self.prefix
                    ),
                )
            }),
            None => default.ok_or_else(|| {
                Error::config(self.path, format!("field `{}{key}`: missing", self.prefix))
            }),
        }
    }

    /// A number; `default` when absent (`None`: required).
    pub fn number(&self, key: &str, default: Option<f64>) -> Result<f64> {
        match self.vc.get(key) {
            Some(x) => x.as_f64().ok_or_else(|| {
                Error::config(
                    self.path,
                    format!("field `{}{key}`: expected a number, got {x}", self.prefix),
                )
            }),
            None => default.ok_or_else(|| {
                Error::config(self.path, format!("field `{}{key}`: missing", self.prefix))
            }),
        }
    }

    /// A list of block indexes; `default` when absent.
    pub fn indexes(&self, key: &str, default: &[usize]) -> Result<Vec<usize>> {
        match self.vc.get(key) {
            None => Ok(default.to_vec()),
            Some(Value::Array(a)) => a
                .iter()
                .map(|x| x.as_u64().map(|u| u as usize))
                .collect::<Option<Vec<_>>>()
                .ok_or_else(|| {
                    Error::config(
                        self.path,
                        format!(
                            "field `{}{key}`: expected a list of block indexes",
                            self.prefix
                        ),
                    )
                }),
            Some(x) => Err(Error::config(
                self.path,
                format!("field `{}{key}`: expected a list, got {x}", self.prefix),
            )),
        }
    }

    /// `hidden_act` (default `default`), one of `allowed`.
    pub fn activation(&self, default: &str, allowed: &[Activation]) -> Result<Activation> {
        let name = self
            .vc
            .get("hidden_act")
            .and_then(Value::as_str)
            .unwrap_or(default);
        let act = match name {
            "gelu_pytorch_tanh" | "gelu_new" => Some(Activation::GeluTanh),
            "gelu" => Some(Activation::GeluErf),
            "quick_gelu" => Some(Activation::QuickGelu),
            "silu" => Some(Activation::Silu),
            _ => None,
        };
        act.filter(|a| allowed.contains(a)).ok_or_else(|| {
            Error::config(
                self.path,
                format!(
                    "field `{}hidden_act`: `{name}` is not supported, expected {}",
                    self.prefix,
                    allowed
                        .iter()
                        .map(|a| a.hf_name())
                        .collect::<Vec<_>>()
                        .join(" or ")
                ),
            )
        })
    }

    /// The rotary base: `rope_parameters.rope_theta`, else `rope_theta`,
    /// else 10000.
    pub fn rope_theta(&self) -> Result<f64> {
        Ok(self
            .vc
            .get("rope_parameters")
            .and_then(|r| r.get("rope_theta"))
            .or_else(|| self.vc.get("rope_theta"))
            .map(|x| {
                x.as_f64().ok_or_else(|| {
                    Error::config(
                        self.path,
                        format!("field `vision_config.rope_theta`: expected a number, got {x}"),
                    )
                })
            })
            .transpose()?
            .unwrap_or(10_000.0))
    }
}

/// What the plain ViT encoders' configs (CLIP, SigLIP, DINOv2) share:
/// positive sizes, RGB input, heads that divide the width, a positive
/// LayerNorm epsilon; the message names the field (after `prefix`,
/// `vision_config.` or nothing for a top-level config).
pub fn check_encoder(
    prefix: &str,
    sizes: &[(&str, usize)],
    (hidden, heads): (usize, usize),
    channels: usize,
    eps: f64,
) -> std::result::Result<(), String> {
    check_sizes_in(prefix, sizes)?;
    if channels != 3 {
        return Err(format!(
            "field `{prefix}num_channels`: only 3 (RGB) is supported, got {channels}"
        ));
    }
    if !hidden.is_multiple_of(heads) {
        return Err(format!(
            "field `{prefix}num_attention_heads`: {heads} does not divide hidden_size {hidden}"
        ));
    }
    if !(eps.is_finite() && eps > 0.0) {
        return Err(format!(
            "field `{prefix}layer_norm_eps`: expected a positive number, got {eps}"
        ));
    }
    Ok(())
}

/// What the Qwen-VL families' vision configs share, for [`check_vit`].
pub struct VitChecks<'a> {
    /// The field that holds the blocks' width (`hidden_size`, or Qwen2-VL's
    /// `embed_dim`), and its value.
    pub width: (&'a str, usize),
    pub num_heads: usize,
    pub in_channels: usize,
    pub patch_size: usize,
    pub temporal_patch_size: usize,
    pub spatial_merge_size: usize,
    pub rope_theta: f64,
}

/// The checks the Qwen-VL families' vision configs share, after
/// [`check_sizes`]: three input channels; patch, temporal and merge sizes in
/// range; `num_heads` dividing the width into heads whose size is a multiple
/// of 4 (2-D rotary); a positive `rope_theta`. The message names the field.
pub fn check_vit(c: &VitChecks) -> std::result::Result<(), String> {
    if c.in_channels != 3 {
        return Err(format!(
            "field `vision_config.in_channels`: expected 3, got {}",
            c.in_channels
        ));
    }
    if c.patch_size > 64 || c.temporal_patch_size > 16 || c.spatial_merge_size > 8 {
        return Err("field `vision_config`: patch, temporal or merge size out of range".into());
    }
    let (field, width) = c.width;
    if !width.is_multiple_of(c.num_heads) {
        return Err(format!(
            "field `vision_config.num_heads`: {} does not divide {field} {width}",
            c.num_heads
        ));
    }
    if !(width / c.num_heads).is_multiple_of(4) {
        return Err(format!(
            "field `vision_config.num_heads`: head_dim {} must be a multiple of 4 for 2D rotary embeddings",
            width / c.num_heads
        ));
    }
    if !(c.rope_theta.is_finite() && c.rope_theta > 0.0) {
        return Err(format!(
            "field `vision_config.rope_theta`: expected a positive number, got {}",
            c.rope_theta
        ));
    }
    Ok(())
}

/// Every block index in `indexes` (field `vision_config.{field}`) below `depth`.
pub fn check_block_indexes(
    field: &str,
    indexes: &[usize],
    depth: usize,
) -> std::result::Result<(), String> {
    match indexes.iter().find(|&&i| i >= depth) {
        Some(i) => Err(format!(
            "field `vision_config.{field}`: block {i} does not exist (depth {depth})"
        )),
        None => Ok(()),
    }
}

/// Each `(field, value)` in 1..=2^20; the message names the first that is not.
pub fn check_sizes(sizes: &[(&str, usize)]) -> std::result::Result<(), String> {
    check_sizes_in("vision_config.", sizes)
}

/// [`check_sizes`] for fields named after `prefix`.
pub fn check_sizes_in(prefix: &str, sizes: &[(&str, usize)]) -> std::result::Result<(), String> {
    const MAX_DIM: usize = 1 << 20;
    for &(k, v) in sizes {
        if v == 0 || v > MAX_DIM {
            return Err(format!(
                "field `{prefix}{k}`: expected 1..={MAX_DIM}, got {v}"
            ));
        }
    }
    Ok(())
}
