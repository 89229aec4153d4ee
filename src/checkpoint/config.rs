//! Typed views of a checkpoint's `config.json`.
//!
//! Only the vision tower's configuration is read here. Fields mirror
//! transformers' `Qwen3VLVisionConfig`
//! (`models/qwen3_vl/configuration_qwen3_vl.py`).

use std::path::Path;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::error::{Error, Result};

/// Model families by `model_type`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Family {
    /// `qwen3_vl` and `qwen3_vl_moe` (same vision tower).
    Qwen3Vl,
}

/// `model_type` values whose vision tower this version can read.
pub const SUPPORTED_MODEL_TYPES: &[&str] = &["qwen3_vl", "qwen3_vl_moe"];
/// Families the project plans to support; named in the "not supported yet" error.
const PLANNED_MODEL_TYPES: &[&str] = &["qwen2_5_vl", "qwen2_vl"];

impl Family {
    /// The family of a `model_type`, or a clear error naming what is supported.
    pub fn from_model_type(path: &Path, model_type: &str) -> Result<Family> {
        match model_type {
            "qwen3_vl" | "qwen3_vl_moe" => Ok(Family::Qwen3Vl),
            t if PLANNED_MODEL_TYPES.contains(&t) => Err(Error::config(
                path,
                format!(
                    "model_type `{t}` is not supported yet; supported: {}",
                    SUPPORTED_MODEL_TYPES.join(", ")
                ),
            )),
            t => Err(Error::config(
                path,
                format!(
                    "model_type `{t}` is not a supported vision-language model; supported: {}",
                    SUPPORTED_MODEL_TYPES.join(", ")
                ),
            )),
        }
    }
}

/// The MLP activation inside the vision blocks.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Activation {
    /// `gelu_pytorch_tanh` / `gelu_new`: tanh approximation.
    GeluTanh,
    /// `gelu`: exact erf form.
    GeluErf,
}

/// The Qwen3-VL vision tower's hyper-parameters.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Qwen3VisionConfig {
    pub depth: usize,
    pub hidden_size: usize,
    pub hidden_act: Activation,
    pub intermediate_size: usize,
    pub num_heads: usize,
    pub in_channels: usize,
    pub patch_size: usize,
    pub spatial_merge_size: usize,
    pub temporal_patch_size: usize,
    pub out_hidden_size: usize,
    pub num_position_embeddings: usize,
    pub deepstack_visual_indexes: Vec<usize>,
    pub rope_theta: f64,
}

/// LayerNorm epsilon used throughout the Qwen3-VL vision tower.
pub const LAYER_NORM_EPS: f64 = 1e-6;

impl Qwen3VisionConfig {
    /// `hidden_size / num_heads`.
    pub fn head_dim(&self) -> usize {
        self.hidden_size / self.num_heads
    }

    /// Side of the square learned position table.
    pub fn pos_side(&self) -> usize {
        (self.num_position_embeddings as f64).sqrt().round() as usize
    }

    /// Columns of one `pixel_values` row: `C * T * P * P`.
    pub fn patch_dim(&self) -> usize {
        self.in_channels * self.temporal_patch_size * self.patch_size * self.patch_size
    }

    /// Parse `vision_config` of a `config.json`.
    pub fn from_json(path: &Path, v: &Value) -> Result<Self> {
        let vc = v
            .get("vision_config")
            .and_then(Value::as_object)
            .ok_or_else(|| {
                Error::config(path, "field `vision_config`: missing or not an object")
            })?;
        let uint = |key: &str, default: Option<usize>| -> Result<usize> {
            match vc.get(key) {
                Some(x) => x.as_u64().map(|u| u as usize).ok_or_else(|| {
                    Error::config(
                        path,
                        format!(
                            "field `vision_config.{key}`: expected a non-negative integer, got {x}"
                        ),
                    )
                }),
                None => default.ok_or_else(|| {
                    Error::config(path, format!("field `vision_config.{key}`: missing"))
                }),
            }
        };
        let hidden_act = match vc
            .get("hidden_act")
            .and_then(Value::as_str)
            .unwrap_or("gelu_pytorch_tanh")
        {
            "gelu_pytorch_tanh" | "gelu_new" => Activation::GeluTanh,
            "gelu" => Activation::GeluErf,
            other => {
                return Err(Error::config(
                    path,
                    format!(
                        "field `vision_config.hidden_act`: `{other}` is not supported, expected gelu_pytorch_tanh or gelu"
                    ),
                ));
            }
        };
        let deepstack = match vc.get("deepstack_visual_indexes") {
            None => vec![8, 16, 24],
            Some(Value::Array(a)) => a
                .iter()
                .map(|x| x.as_u64().map(|u| u as usize))
                .collect::<Option<Vec<_>>>()
                .ok_or_else(|| {
                    Error::config(path, "field `vision_config.deepstack_visual_indexes`: expected a list of block indexes")
                })?,
            Some(x) => {
                return Err(Error::config(
                    path,
                    format!("field `vision_config.deepstack_visual_indexes`: expected a list, got {x}"),
                ));
            }
        };
        let rope_theta = vc
            .get("rope_parameters")
            .and_then(|r| r.get("rope_theta"))
            .or_else(|| vc.get("rope_theta"))
            .map(|x| {
                x.as_f64().ok_or_else(|| {
                    Error::config(
                        path,
                        format!("field `vision_config.rope_theta`: expected a number, got {x}"),
                    )
                })
            })
            .transpose()?
            .unwrap_or(10_000.0);
        let c = Qwen3VisionConfig {
            depth: uint("depth", None)?,
            hidden_size: uint("hidden_size", None)?,
            hidden_act,
            intermediate_size: uint("intermediate_size", None)?,
            num_heads: uint("num_heads", None)?,
            in_channels: uint("in_channels", Some(3))?,
            patch_size: uint("patch_size", Some(16))?,
            spatial_merge_size: uint("spatial_merge_size", Some(2))?,
            temporal_patch_size: uint("temporal_patch_size", Some(2))?,
            out_hidden_size: uint("out_hidden_size", None)?,
            num_position_embeddings: uint("num_position_embeddings", Some(2304))?,
            deepstack_visual_indexes: deepstack,
            rope_theta,
        };
        c.validate().map_err(|m| Error::config(path, m))?;
        Ok(c)
    }

    /// Check sizes and indexes for consistency; the message names the field.
    pub fn validate(&self) -> std::result::Result<(), String> {
        const MAX_DIM: usize = 1 << 20;
        for (k, v) in [
            ("depth", self.depth),
            ("hidden_size", self.hidden_size),
            ("intermediate_size", self.intermediate_size),
            ("num_heads", self.num_heads),
            ("patch_size", self.patch_size),
            ("spatial_merge_size", self.spatial_merge_size),
            ("temporal_patch_size", self.temporal_patch_size),
            ("out_hidden_size", self.out_hidden_size),
            ("num_position_embeddings", self.num_position_embeddings),
        ] {
            if v == 0 || v > MAX_DIM {
                return Err(format!(
                    "field `vision_config.{k}`: expected 1..={MAX_DIM}, got {v}"
                ));
            }
        }
        if self.in_channels != 3 {
            return Err(format!(
                "field `vision_config.in_channels`: expected 3, got {}",
                self.in_channels
            ));
        }
        if self.patch_size > 64 || self.temporal_patch_size > 16 || self.spatial_merge_size > 8 {
            return Err("field `vision_config`: patch, temporal or merge size out of range".into());
        }
        if !self.hidden_size.is_multiple_of(self.num_heads) {
            return Err(format!(
                "field `vision_config.num_heads`: {} does not divide hidden_size {}",
                self.num_heads, self.hidden_size
            ));
        }
        if !self.head_dim().is_multiple_of(4) {
            return Err(format!(
                "field `vision_config.num_heads`: head_dim {} must be a multiple of 4 for 2D rotary embeddings",
                self.head_dim()
            ));
        }
        let side = self.pos_side();
        if side * side != self.num_position_embeddings {
            return Err(format!(
                "field `vision_config.num_position_embeddings`: {} is not a square",
                self.num_position_embeddings
            ));
        }
        if let Some(&i) = self
            .deepstack_visual_indexes
            .iter()
            .find(|&&i| i >= self.depth)
        {
            return Err(format!(
                "field `vision_config.deepstack_visual_indexes`: block {i} does not exist (depth {})",
                self.depth
            ));
        }
        if !(self.rope_theta.is_finite() && self.rope_theta > 0.0) {
            return Err(format!(
                "field `vision_config.rope_theta`: expected a positive number, got {}",
                self.rope_theta
            ));
        }
        Ok(())
    }
}
