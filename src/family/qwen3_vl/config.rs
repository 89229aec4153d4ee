//! Qwen3-VL's vision config: [`Qwen3VisionConfig`]'s fields mirror
//! transformers' `Qwen3VLVisionConfig`
//! (`models/qwen3_vl/configuration_qwen3_vl.py`).

use std::path::Path;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::checkpoint::config::{
    Activation, VisionFields, VitChecks, check_block_indexes, check_sizes, check_vit,
};
use crate::error::{Error, FieldError, Result};

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
        c.validate().map_err(|e| Error::field(path, e))?;
        Ok(c)
    }

    /// Check sizes and indexes for consistency; the message names the field.
    pub fn validate(&self) -> std::result::Result<(), FieldError> {
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
            return Err(FieldError::Unsupported {
                field: "vision_config.hidden_act".into(),
                value: self.hidden_act.hf_name().into(),
                expected: "gelu_pytorch_tanh or gelu".into(),
            });
        }
        check_vit(&VitChecks {
            width: ("hidden_size", self.hidden_size),
            num_heads: self.num_heads,
            in_channels: self.in_channels,
            patch_size: self.patch_size,
            temporal_patch_size: self.temporal_patch_size,
            spatial_merge_size: self.spatial_merge_size,
            rope_theta: self.rope_theta,
        })?;
        let side = self.pos_side();
        if side * side != self.num_position_embeddings {
            return Err(FieldError::invalid(
                "vision_config.num_position_embeddings",
                format!("{} is not a square", self.num_position_embeddings),
            ));
        }
        check_block_indexes(
            "deepstack_visual_indexes",
            &self.deepstack_visual_indexes,
            self.depth,
        )?;
        Ok(())
    }
}
