//! Qwen3-VL's vision config: [`Qwen3VisionConfig`]'s fields mirror
//! transformers' `Qwen3VLVisionConfig`
//! (`models/qwen3_vl/configuration_qwen3_vl.py`).

use std::path::Path;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::config::{Activation, VisionFields, check_sizes};
use crate::error::{Error, Result};

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
        let f = VisionFields::of(path, v)?;
        let c = Qwen3VisionConfig {
            depth: f.uint("depth", None)?,
            hidden_size: f.uint("hidden_size", None)?,
            hidden_act: f.activation(
                "gelu_pytorch_tanh",
                &[Activation::GeluTanh, Activation::GeluErf],
            )?,
            intermediate_size: f.uint("intermediate_size", None)?,
            num_heads: f.uint("num_heads", None)?,
            in_channels: f.uint("in_channels", Some(3))?,
            patch_size: f.uint("patch_size", Some(16))?,
            spatial_merge_size: f.uint("spatial_merge_size", Some(2))?,
            temporal_patch_size: f.uint("temporal_patch_size", Some(2))?,
            out_hidden_size: f.uint("out_hidden_size", None)?,
            num_position_embeddings: f.uint("num_position_embeddings", Some(2304))?,
            deepstack_visual_indexes: f.indexes("deepstack_visual_indexes", &[8, 16, 24])?,
            rope_theta: f.rope_theta()?,
        };
        c.validate().map_err(|m| Error::config(path, m))?;
        Ok(c)
    }

    /// Check sizes and indexes for consistency; the message names the field.
    pub fn validate(&self) -> std::result::Result<(), String> {
        check_sizes(&[
            ("depth", self.depth),
            ("hidden_size", self.hidden_size),
            ("intermediate_size", self.intermediate_size),
            ("num_heads", self.num_heads),
            ("patch_size", self.patch_size),
            ("spatial_merge_size", self.spatial_merge_size),
            ("temporal_patch_size", self.temporal_patch_size),
            ("out_hidden_size", self.out_hidden_size),
            ("num_position_embeddings", self.num_position_embeddings),
        ])?;
        if !matches!(self.hidden_act, Activation::GeluTanh | Activation::GeluErf) {
            return Err(format!(
                "field `vision_config.hidden_act`: `{}` is not supported, expected gelu_pytorch_tanh or gelu",
                self.hidden_act.hf_name()
            ));
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
