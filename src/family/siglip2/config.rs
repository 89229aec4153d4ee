//! SigLIP2's vision config: [`Siglip2VisionConfig`]'s fields mirror
//! transformers' `Siglip2VisionConfig` (`models/siglip2/configuration_siglip2.py`).
//! A `siglip2` checkpoint (`Siglip2Model`) nests it under `vision_config`; a
//! `siglip2_vision_model` checkpoint (`Siglip2VisionModel`) is it.
//!
//! What differs from SigLIP: the patch embedding is a Linear over patch rows
//! (py, px, c) rather than a convolution, and the position table is a square
//! of `num_patches` rows that transformers resizes to each image's grid
//! (NaFlex: images keep their aspect ratio under a patch budget).

use std::path::Path;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::checkpoint::config::{Activation, VisionFields, check_encoder};
use crate::error::{Error, FieldError, Result};

/// The SigLIP2 vision tower's hyper-parameters.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Siglip2VisionConfig {
    pub hidden_size: usize,
    pub intermediate_size: usize,
    pub num_hidden_layers: usize,
    pub num_attention_heads: usize,
    pub num_channels: usize,
    /// Rows of the position table, a square (`position_embedding_size^2`).
    pub num_patches: usize,
    pub patch_size: usize,
    pub hidden_act: Activation,
    pub layer_norm_eps: f64,
    /// The attention-pooling head (`head.*`), which gives `pooler_output`.
    pub vision_use_head: bool,
}

impl Siglip2VisionConfig {
    /// `hidden_size / num_attention_heads`.
    pub fn head_dim(&self) -> usize {
        self.hidden_size / self.num_attention_heads
    }

    /// Side of the square position table (`int(num_patches ** 0.5)`).
    pub fn table_side(&self) -> usize {
        (self.num_patches as f64).sqrt() as usize
    }

    /// Parse a `config.json` (transformers' defaults for absent fields are
    /// siglip2-base-patch16-naflex's).
    pub fn from_json(path: &Path, v: &Value) -> Result<Self> {
        let f = VisionFields::of(path, v)?;
        let c = Siglip2VisionConfig {
            hidden_size: f.uint("hidden_size", Some(768))?,
            intermediate_size: f.uint("intermediate_size", Some(3072))?,
            num_hidden_layers: f.uint("num_hidden_layers", Some(12))?,
            num_attention_heads: f.uint("num_attention_heads", Some(12))?,
            num_channels: f.uint("num_channels", Some(3))?,
            num_patches: f.uint("num_patches", Some(256))?,
            patch_size: f.uint("patch_size", Some(16))?,
            hidden_act: f.activation(
                "gelu_pytorch_tanh",
                &[
                    Activation::GeluTanh,
                    Activation::GeluErf,
                    Activation::QuickGelu,
                ],
            )?,
            layer_norm_eps: f.number("layer_norm_eps", Some(1e-6))?,
            vision_use_head: f.flag("vision_use_head", true)?,
        };
        c.validate().map_err(|e| Error::field(path, e))?;
        Ok(c)
    }

    /// Check sizes for consistency; the message names the field.
    pub fn validate(&self) -> std::result::Result<(), FieldError> {
        check_encoder(
            "vision_config.",
            &[
                ("hidden_size", self.hidden_size),
                ("intermediate_size", self.intermediate_size),
                ("num_hidden_layers", self.num_hidden_layers),
                ("num_attention_heads", self.num_attention_heads),
                ("num_patches", self.num_patches),
                ("patch_size", self.patch_size),
            ],
            (self.hidden_size, self.num_attention_heads),
            self.num_channels,
            self.layer_norm_eps,
        )?;
        let s = self.table_side();
        if s * s != self.num_patches {
            return Err(FieldError::invalid(
                "vision_config.num_patches",
                format!(
                    "{} is not a square (the position table is \
                 resized as a square grid)",
                    self.num_patches
                ),
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The vision part of the released google/siglip2-so400m-patch16-naflex config.json.
    const SO400M_NAFLEX: &str = r#"{"model_type": "siglip2", "vision_config": {
        "hidden_size": 1152, "intermediate_size": 4304, "model_type": "siglip2_vision_model",
        "num_attention_heads": 16, "num_hidden_layers": 27, "num_patches": 256,
        "patch_size": 16}}"#;

    #[test]
    fn parses_the_released_config() {
        let v: Value = serde_json::from_str(SO400M_NAFLEX).unwrap();
        let c = Siglip2VisionConfig::from_json(Path::new("config.json"), &v).unwrap();
        assert_eq!((c.table_side(), c.head_dim()), (16, 72));
        assert_eq!(c.hidden_act, Activation::GeluTanh);
        assert!(c.vision_use_head);
    }

    #[test]
    fn bad_configs_name_the_field() {
        let e = |text: &str| {
            let v: Value = serde_json::from_str(text).unwrap();
            Siglip2VisionConfig::from_json(Path::new("config.json"), &v)
                .unwrap_err()
                .to_string()
        };
        let m = e(r#"{"model_type": "siglip2_vision_model", "num_patches": 250}"#);
        assert!(
            m.contains("vision_config.num_patches") && m.contains("square"),
            "{m}"
        );
        let m = e(r#"{"model_type": "siglip2_vision_model", "vision_use_head": "yes"}"#);
        assert!(m.contains("vision_use_head"), "{m}");
        let m = e(r#"{"model_type": "siglip2_vision_model", "num_channels": 1}"#);
        assert!(m.contains("num_channels"), "{m}");
    }
}
