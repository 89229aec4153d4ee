//! SigLIP's vision config: [`SiglipVisionConfig`]'s fields mirror
//! transformers' `SiglipVisionConfig` (`models/siglip/configuration_siglip.py`).
//! A `siglip` checkpoint (`SiglipModel`) nests it under `vision_config`; a
//! `siglip_vision_model` checkpoint (`SiglipVisionModel`) is it.

use std::path::Path;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::checkpoint::config::{Activation, VisionFields, check_encoder};
use crate::error::{Error, FieldError, Result};

/// The SigLIP vision tower's hyper-parameters.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct SiglipVisionConfig {
    pub hidden_size: usize,
    pub intermediate_size: usize,
    pub num_hidden_layers: usize,
    pub num_attention_heads: usize,
    pub num_channels: usize,
    pub image_size: usize,
    pub patch_size: usize,
    pub hidden_act: Activation,
    pub layer_norm_eps: f64,
    /// The attention-pooling head (`head.*`), which gives `pooler_output`.
    pub vision_use_head: bool,
}

impl SiglipVisionConfig {
    /// `hidden_size / num_attention_heads`.
    pub fn head_dim(&self) -> usize {
        self.hidden_size / self.num_attention_heads
    }

    /// Patches along one side of `image_size`: the patch embedding is a
    /// stride-`patch_size` Conv2d without padding, so a remainder is dropped
    /// (384 px at patch 14: 27).
    pub fn grid(&self) -> usize {
        self.image_size / self.patch_size
    }

    /// Rows of the position table: one per patch (no class token).
    pub fn positions(&self) -> usize {
        self.grid() * self.grid()
    }

    /// Parse a `config.json` (transformers' defaults for absent fields are
    /// siglip-base-patch16-224's).
    pub fn from_json(path: &Path, v: &Value) -> Result<Self> {
        let f = VisionFields::of(path, v)?;
        let vc = if v.get("vision_config").is_some() {
            &v["vision_config"]
        } else {
            v
        };
        let use_head = match vc.get("vision_use_head") {
            None | Some(Value::Null) => true,
            Some(Value::Bool(b)) => *b,
            Some(x) => {
                return Err(Error::config(
                    path,
                    format!(
                        "field `vision_config.vision_use_head`: expected true or false, got {x}"
                    ),
                ));
            }
        };
        let c = SiglipVisionConfig {
            hidden_size: f.uint("hidden_size", Some(768))?,
            intermediate_size: f.uint("intermediate_size", Some(3072))?,
            num_hidden_layers: f.uint("num_hidden_layers", Some(12))?,
            num_attention_heads: f.uint("num_attention_heads", Some(12))?,
            num_channels: f.uint("num_channels", Some(3))?,
            image_size: f.uint("image_size", Some(224))?,
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
            vision_use_head: use_head,
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
                ("image_size", self.image_size),
                ("patch_size", self.patch_size),
            ],
            (self.hidden_size, self.num_attention_heads),
            self.num_channels,
            self.layer_norm_eps,
        )?;
        if self.image_size < self.patch_size {
            return Err(FieldError::invalid(
                "vision_config.image_size",
                format!(
                    "{} is smaller than patch_size {}",
                    self.image_size, self.patch_size
                ),
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The vision part of the released google/siglip-so400m-patch14-384 config.json.
    const SO400M: &str = r#"{"model_type": "siglip", "vision_config": {
        "hidden_size": 1152, "image_size": 384, "intermediate_size": 4304,
        "model_type": "siglip_vision_model", "num_attention_heads": 16,
        "num_hidden_layers": 27, "patch_size": 14}}"#;

    #[test]
    fn parses_the_released_config() {
        let v: Value = serde_json::from_str(SO400M).unwrap();
        let c = SiglipVisionConfig::from_json(Path::new("config.json"), &v).unwrap();
        // 384 px at patch 14: the convolution drops the last 6 pixels.
        assert_eq!((c.grid(), c.positions(), c.head_dim()), (27, 729, 72));
        assert_eq!(c.hidden_act, Activation::GeluTanh);
        assert!(c.vision_use_head);
        assert_eq!(c.layer_norm_eps, 1e-6);
    }

    #[test]
    fn bad_configs_name_the_field() {
        let e = |text: &str| {
            let v: Value = serde_json::from_str(text).unwrap();
            SiglipVisionConfig::from_json(Path::new("config.json"), &v)
                .unwrap_err()
                .to_string()
        };
        let m = e(
            r#"{"model_type": "siglip_vision_model", "hidden_size": 100, "num_attention_heads": 3}"#,
        );
        assert!(m.contains("num_attention_heads"), "{m}");
        let m = e(r#"{"model_type": "siglip_vision_model", "vision_use_head": 1}"#);
        assert!(m.contains("vision_use_head"), "{m}");
        let m = e(r#"{"model_type": "siglip_vision_model", "image_size": 10, "patch_size": 16}"#);
        assert!(m.contains("vision_config.image_size"), "{m}");
    }
}
