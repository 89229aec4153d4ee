//! CLIP's vision config: [`ClipVisionConfig`]'s fields mirror transformers'
//! `CLIPVisionConfig` (`models/clip/configuration_clip.py`). A `clip`
//! checkpoint (`CLIPModel`) nests it under `vision_config`; a
//! `clip_vision_model` checkpoint (`CLIPVisionModel`,
//! `CLIPVisionModelWithProjection`) is it.

use std::path::Path;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::checkpoint::config::{Activation, VisionFields, check_encoder, check_sizes};
use crate::error::{Error, FieldError, Result};

/// The tensor that holds the projection to the joint embedding space, when
/// the checkpoint has one (outside the `vision_model.` prefix).
pub const PROJECTION: &str = "visual_projection.weight";

/// The CLIP vision tower's hyper-parameters.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ClipVisionConfig {
    pub hidden_size: usize,
    pub intermediate_size: usize,
    pub num_hidden_layers: usize,
    pub num_attention_heads: usize,
    pub num_channels: usize,
    pub image_size: usize,
    pub patch_size: usize,
    pub hidden_act: Activation,
    pub layer_norm_eps: f64,
    /// Width of `image_embeds` when the checkpoint holds
    /// `visual_projection.weight` (`projection_dim`); `None` without it.
    pub projection_dim: Option<usize>,
}

impl ClipVisionConfig {
    /// `hidden_size / num_attention_heads`.
    pub fn head_dim(&self) -> usize {
        self.hidden_size / self.num_attention_heads
    }

    /// Patches along one side of the checkpoint's `image_size`.
    pub fn grid(&self) -> usize {
        self.image_size / self.patch_size
    }

    /// Rows of the position table: one per patch, and the class token.
    pub fn positions(&self) -> usize {
        self.grid() * self.grid() + 1
    }

    /// Parse a `config.json` (transformers' defaults for absent fields are
    /// ViT-B/32's); `has_projection` says whether the checkpoint holds
    /// [`PROJECTION`].
    pub fn from_json(path: &Path, v: &Value, has_projection: bool) -> Result<Self> {
        let f = VisionFields::of(path, v)?;
        let projection_dim = if has_projection {
            // `CLIPModel` keeps it at the top level; `CLIPVisionConfig` too.
            let top = v.get("projection_dim").and_then(Value::as_u64);
            Some(match top {
                Some(p) => p as usize,
                None => f.uint("projection_dim", Some(512))?,
            })
        } else {
            None
        };
        let c = ClipVisionConfig {
            hidden_size: f.uint("hidden_size", Some(768))?,
            intermediate_size: f.uint("intermediate_size", Some(3072))?,
            num_hidden_layers: f.uint("num_hidden_layers", Some(12))?,
            num_attention_heads: f.uint("num_attention_heads", Some(12))?,
            num_channels: f.uint("num_channels", Some(3))?,
            image_size: f.uint("image_size", Some(224))?,
            patch_size: f.uint("patch_size", Some(32))?,
            hidden_act: f.activation(
                "quick_gelu",
                &[
                    Activation::QuickGelu,
                    Activation::GeluErf,
                    Activation::GeluTanh,
                ],
            )?,
            layer_norm_eps: f.number("layer_norm_eps", Some(1e-5))?,
            projection_dim,
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
        if !self.image_size.is_multiple_of(self.patch_size) {
            return Err(FieldError::invalid(
                "vision_config.image_size",
                format!(
                    "{} is not a multiple of patch_size {}",
                    self.image_size, self.patch_size
                ),
            ));
        }
        if let Some(p) = self.projection_dim {
            check_sizes(&[("projection_dim", p)])?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The vision part of the released openai/clip-vit-large-patch14-336 config.json.
    const VIT_L_336: &str = r#"{"model_type": "clip", "projection_dim": 768, "vision_config": {
        "hidden_size": 1024, "image_size": 336, "intermediate_size": 4096,
        "model_type": "clip_vision_model", "num_attention_heads": 16,
        "num_hidden_layers": 24, "patch_size": 14, "projection_dim": 768}}"#;

    #[test]
    fn parses_the_released_config() {
        let v: Value = serde_json::from_str(VIT_L_336).unwrap();
        let c = ClipVisionConfig::from_json(Path::new("config.json"), &v, true).unwrap();
        assert_eq!((c.grid(), c.positions(), c.head_dim()), (24, 577, 64));
        assert_eq!(c.projection_dim, Some(768));
        assert_eq!(c.hidden_act, Activation::QuickGelu);
        assert_eq!(c.layer_norm_eps, 1e-5);
        let c = ClipVisionConfig::from_json(Path::new("config.json"), &v, false).unwrap();
        assert_eq!(c.projection_dim, None);
    }

    #[test]
    fn bad_configs_name_the_field() {
        let e = |text: &str| {
            let v: Value = serde_json::from_str(text).unwrap();
            ClipVisionConfig::from_json(Path::new("config.json"), &v, false)
                .unwrap_err()
                .to_string()
        };
        let m = e(r#"{"model_type": "clip_vision_model", "image_size": 230, "patch_size": 14}"#);
        assert!(
            m.contains("vision_config.image_size") && m.contains("230"),
            "{m}"
        );
        let m = e(
            r#"{"model_type": "clip_vision_model", "hidden_size": 100, "num_attention_heads": 3}"#,
        );
        assert!(m.contains("num_attention_heads"), "{m}");
        let m = e(r#"{"model_type": "clip", "vision_config": {"hidden_act": "relu"}}"#);
        assert!(m.contains("hidden_act"), "{m}");
        let m = e(r#"{"model_type": "clip"}"#);
        assert!(m.contains("vision_config"), "{m}");
    }
}
