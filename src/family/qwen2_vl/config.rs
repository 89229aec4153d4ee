//! Qwen2-VL's vision config: [`Qwen2VisionConfig`]'s fields mirror
//! transformers' `Qwen2VLVisionConfig`
//! (`models/qwen2_vl/configuration_qwen2_vl.py`). `embed_dim` is the
//! blocks' width, `hidden_size` the width of the merged output tokens.

use std::path::Path;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::checkpoint::config::{Activation, VisionFields, VitChecks, check_sizes, check_vit};
use crate::error::{Error, FieldError, Result};

/// The Qwen2-VL vision tower's hyper-parameters.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Qwen2VisionConfig {
    pub depth: usize,
    pub embed_dim: usize,
    /// Output width (the language model's hidden size).
    pub hidden_size: usize,
    pub hidden_act: Activation,
    /// MLP width over `embed_dim`; the MLP is `int(embed_dim * mlp_ratio)` wide.
    pub mlp_ratio: f64,
    pub num_heads: usize,
    pub in_channels: usize,
    pub patch_size: usize,
    pub spatial_merge_size: usize,
    pub temporal_patch_size: usize,
    pub rope_theta: f64,
}

/// LayerNorm epsilon of every Qwen2-VL vision norm (`LayerNorm(..., eps=1e-6)`).
pub const LAYER_NORM_EPS: f64 = 1e-6;

impl Qwen2VisionConfig {
    /// `embed_dim / num_heads`.
    pub fn head_dim(&self) -> usize {
        self.embed_dim / self.num_heads
    }

    /// The MLP's width: `int(embed_dim * mlp_ratio)`, as transformers computes it.
    pub fn mlp_dim(&self) -> usize {
        (self.embed_dim as f64 * self.mlp_ratio) as usize
    }

    /// Columns of one `pixel_values` row: `C * T * P * P`.
    pub fn patch_dim(&self) -> usize {
        self.in_channels * self.temporal_patch_size * self.patch_size * self.patch_size
    }

    /// Parse `vision_config` of a `config.json` (transformers' defaults for
    /// absent fields are Qwen2-VL-7B's).
    pub fn from_json(path: &Path, v: &Value) -> Result<Self> {
        let f = VisionFields::of(path, v)?;
        let c = Qwen2VisionConfig {
            depth: f.uint("depth", Some(32))?,
            embed_dim: f.uint("embed_dim", Some(1280))?,
            hidden_size: f.uint("hidden_size", Some(3584))?,
            hidden_act: f.activation(
                "quick_gelu",
                &[
                    Activation::QuickGelu,
                    Activation::GeluErf,
                    Activation::GeluTanh,
                    Activation::Silu,
                ],
            )?,
            mlp_ratio: f.number("mlp_ratio", Some(4.0))?,
            num_heads: f.uint("num_heads", Some(16))?,
            in_channels: f.uint("in_channels", Some(3))?,
            patch_size: f.uint("patch_size", Some(14))?,
            spatial_merge_size: f.uint("spatial_merge_size", Some(2))?,
            temporal_patch_size: f.uint("temporal_patch_size", Some(2))?,
            rope_theta: f.rope_theta()?,
        };
        c.validate().map_err(|e| Error::field(path, e))?;
        Ok(c)
    }

    /// Check sizes for consistency; the message names the field.
    pub fn validate(&self) -> std::result::Result<(), FieldError> {
        check_sizes(&[
            ("depth", self.depth),
            ("embed_dim", self.embed_dim),
            ("hidden_size", self.hidden_size),
            ("num_heads", self.num_heads),
            ("patch_size", self.patch_size),
            ("spatial_merge_size", self.spatial_merge_size),
            ("temporal_patch_size", self.temporal_patch_size),
        ])?;
        if !(self.mlp_ratio.is_finite() && self.mlp_ratio > 0.0 && self.mlp_dim() >= 1)
            || self.mlp_dim() > 1 << 20
        {
            return Err(FieldError::invalid(
                "vision_config.mlp_ratio",
                format!(
                    "{} gives an MLP of {} channels",
                    self.mlp_ratio,
                    self.mlp_dim()
                ),
            ));
        }
        check_vit(&VitChecks {
            width: ("embed_dim", self.embed_dim),
            num_heads: self.num_heads,
            in_channels: self.in_channels,
            patch_size: self.patch_size,
            temporal_patch_size: self.temporal_patch_size,
            spatial_merge_size: self.spatial_merge_size,
            rope_theta: self.rope_theta,
        })?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The vision part of the released Qwen2-VL-7B-Instruct config.json.
    const QWEN2_VL_7B: &str = r#"{"model_type": "qwen2_vl", "vision_config": {
        "depth": 32, "embed_dim": 1280, "mlp_ratio": 4, "num_heads": 16, "in_chans": 3,
        "hidden_size": 3584, "patch_size": 14, "spatial_merge_size": 2,
        "spatial_patch_size": 14, "temporal_patch_size": 2}}"#;

    #[test]
    fn reads_the_released_7b_config() {
        let v: Value = serde_json::from_str(QWEN2_VL_7B).unwrap();
        let c = Qwen2VisionConfig::from_json(Path::new("config.json"), &v).unwrap();
        assert_eq!(
            (c.embed_dim, c.hidden_size, c.head_dim(), c.mlp_dim()),
            (1280, 3584, 80, 5120)
        );
        assert_eq!(c.hidden_act, Activation::QuickGelu);
        assert_eq!(c.patch_dim(), 3 * 2 * 14 * 14);
        assert_eq!(c.rope_theta, 10_000.0);
    }

    #[test]
    fn bad_fields_are_named() {
        for (field, value, words) in [
            ("num_heads", "7", "vision_config.num_heads"),
            ("mlp_ratio", "0", "vision_config.mlp_ratio"),
            ("embed_dim", "\"wide\"", "vision_config.embed_dim"),
            ("hidden_act", "\"relu\"", "vision_config.hidden_act"),
        ] {
            let mut v: Value = serde_json::from_str(QWEN2_VL_7B).unwrap();
            v["vision_config"][field] = serde_json::from_str(value).unwrap();
            let e = Qwen2VisionConfig::from_json(Path::new("config.json"), &v)
                .unwrap_err()
                .to_string();
            assert!(e.contains(words), "{field}: {e}");
        }
    }
}
