//! Qwen2.5-VL's vision config: [`Qwen25VisionConfig`]'s fields mirror
//! transformers' `Qwen2_5_VLVisionConfig`
//! (`models/qwen2_5_vl/configuration_qwen2_5_vl.py`). `hidden_size` is the
//! blocks' width, `out_hidden_size` the width of the merged output tokens.

use std::path::Path;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::checkpoint::config::{
    Activation, VisionFields, VitChecks, check_block_indexes, check_sizes, check_vit,
};
use crate::error::{Error, FieldError, Result};

/// The Qwen2.5-VL vision tower's hyper-parameters.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Qwen25VisionConfig {
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
    /// Side of an attention window in pixels (112: 8 x 8 patches).
    pub window_size: usize,
    /// Blocks that attend over the whole image; the others attend within windows.
    pub fullatt_block_indexes: Vec<usize>,
    pub rope_theta: f64,
}

/// RMSNorm epsilon of every Qwen2.5-VL vision norm.
pub const RMS_NORM_EPS: f64 = 1e-6;

impl Qwen25VisionConfig {
    /// `hidden_size / num_heads`.
    pub fn head_dim(&self) -> usize {
        self.hidden_size / self.num_heads
    }

    /// Columns of one `pixel_values` row: `C * T * P * P`.
    pub fn patch_dim(&self) -> usize {
        self.in_channels * self.temporal_patch_size * self.patch_size * self.patch_size
    }

    /// Side of a window in merge units (`window_size / patch / merge`).
    pub fn window_units(&self) -> usize {
        self.window_size / self.patch_size / self.spatial_merge_size
    }

    /// Patches in a full window: `(window_size / patch_size)^2`.
    pub fn window_slots(&self) -> usize {
        let s = self.window_size / self.patch_size;
        s * s
    }

    /// Parse `vision_config` of a `config.json` (absent fields take
    /// Qwen2.5-VL-7B's values).
    pub fn from_json(path: &Path, v: &Value) -> Result<Self> {
        let f = VisionFields::of(path, v)?;
        let c = Qwen25VisionConfig {
            depth: f.uint("depth", Some(32))?,
            hidden_size: f.uint("hidden_size", Some(1280))?,
            hidden_act: f.activation(
                "silu",
                &[
                    Activation::Silu,
                    Activation::GeluErf,
                    Activation::GeluTanh,
                    Activation::QuickGelu,
                ],
            )?,
            intermediate_size: f.uint("intermediate_size", Some(3420))?,
            num_heads: f.uint("num_heads", Some(16))?,
            in_channels: f.uint("in_channels", Some(3))?,
            patch_size: f.uint("patch_size", Some(14))?,
            spatial_merge_size: f.uint("spatial_merge_size", Some(2))?,
            temporal_patch_size: f.uint("temporal_patch_size", Some(2))?,
            out_hidden_size: f.uint("out_hidden_size", Some(3584))?,
            window_size: f.uint("window_size", Some(112))?,
            fullatt_block_indexes: f.indexes("fullatt_block_indexes", &[7, 15, 23, 31])?,
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
            ("window_size", self.window_size),
        ])?;
        check_vit(&VitChecks {
            width: ("hidden_size", self.hidden_size),
            num_heads: self.num_heads,
            in_channels: self.in_channels,
            patch_size: self.patch_size,
            temporal_patch_size: self.temporal_patch_size,
            spatial_merge_size: self.spatial_merge_size,
            rope_theta: self.rope_theta,
        })?;
        let unit = self.patch_size * self.spatial_merge_size;
        if !self.window_size.is_multiple_of(unit) || self.window_size > 64 * unit {
            return Err(FieldError::invalid(
                "vision_config.window_size",
                format!(
                    "{} is not a multiple of patch_size * spatial_merge_size = {unit} \
                 (at most 64 merge units)",
                    self.window_size
                ),
            ));
        }
        check_block_indexes(
            "fullatt_block_indexes",
            &self.fullatt_block_indexes,
            self.depth,
        )?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The vision part of the released Qwen2.5-VL-7B-Instruct config.json.
    const QWEN25_VL_7B: &str = r#"{"model_type": "qwen2_5_vl", "vision_config": {
        "depth": 32, "hidden_act": "silu", "hidden_size": 1280, "intermediate_size": 3420,
        "num_heads": 16, "in_chans": 3, "out_hidden_size": 3584, "patch_size": 14,
        "spatial_merge_size": 2, "spatial_patch_size": 14, "window_size": 112,
        "fullatt_block_indexes": [7, 15, 23, 31], "tokens_per_second": 2,
        "temporal_patch_size": 2}}"#;

    #[test]
    fn reads_the_released_7b_config() {
        let v: Value = serde_json::from_str(QWEN25_VL_7B).unwrap();
        let c = Qwen25VisionConfig::from_json(Path::new("config.json"), &v).unwrap();
        assert_eq!(
            (c.hidden_size, c.out_hidden_size, c.head_dim()),
            (1280, 3584, 80)
        );
        assert_eq!((c.window_units(), c.window_slots()), (4, 64));
        assert_eq!(c.fullatt_block_indexes, vec![7, 15, 23, 31]);
        assert_eq!(c.hidden_act, Activation::Silu);
    }

    #[test]
    fn bad_fields_are_named() {
        for (field, value, words) in [
            ("window_size", "100", "vision_config.window_size"),
            (
                "fullatt_block_indexes",
                "[7, 32]",
                "vision_config.fullatt_block_indexes",
            ),
            (
                "fullatt_block_indexes",
                "7",
                "vision_config.fullatt_block_indexes",
            ),
            ("num_heads", "7", "vision_config.num_heads"),
            ("hidden_act", "\"relu\"", "vision_config.hidden_act"),
        ] {
            let mut v: Value = serde_json::from_str(QWEN25_VL_7B).unwrap();
            v["vision_config"][field] = serde_json::from_str(value).unwrap();
            let e = Qwen25VisionConfig::from_json(Path::new("config.json"), &v)
                .unwrap_err()
                .to_string();
            assert!(e.contains(words), "{field}: {e}");
        }
    }
}
