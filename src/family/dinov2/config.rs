//! DINOv2's config: [`Dinov2VisionConfig`]'s fields mirror transformers'
//! `Dinov2Config` (`models/dinov2/configuration_dinov2.py`) and
//! `Dinov2WithRegistersConfig`. Both are the vision model's own config,
//! at the top level of `config.json` (no `vision_config`).

use std::path::Path;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::checkpoint::config::{Activation, VisionFields, check_encoder, check_sizes_in};
use crate::error::{Error, FieldError, Result};

/// The DINOv2 tower's hyper-parameters.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Dinov2VisionConfig {
    pub hidden_size: usize,
    pub num_hidden_layers: usize,
    pub num_attention_heads: usize,
    /// The MLP's width is `int(hidden_size * mlp_ratio)` (two thirds of it,
    /// rounded up to a multiple of 8, with SwiGLU).
    pub mlp_ratio: f64,
    pub hidden_act: Activation,
    pub layer_norm_eps: f64,
    /// The side the position table was trained for (518 for the released
    /// checkpoints); other sides resample it.
    pub image_size: usize,
    pub patch_size: usize,
    pub num_channels: usize,
    /// Whether q, k and v have biases.
    pub qkv_bias: bool,
    /// The MLP is SwiGLU (`weights_in` -> SiLU(first half) * second half
    /// -> `weights_out`) instead of fc1 - `hidden_act` - fc2 (ViT-g/14).
    pub use_swiglu_ffn: bool,
    /// Register tokens after the class token (`dinov2_with_registers`); 0
    /// for `dinov2`.
    pub num_register_tokens: usize,
    /// Whether the position table is resampled with antialiasing
    /// (`dinov2_with_registers` passes `antialias=True` to PyTorch's
    /// bicubic `interpolate`; `dinov2` does not).
    pub interpolate_antialias: bool,
}

/// How this config's messages name a field: top level, no `vision_config.`.
const FIELD: &str = "";

impl Dinov2VisionConfig {
    /// `hidden_size / num_attention_heads`.
    pub fn head_dim(&self) -> usize {
        self.hidden_size / self.num_attention_heads
    }

    /// Patches along one side of the position table (`image_size / patch_size`).
    pub fn grid(&self) -> usize {
        self.image_size / self.patch_size
    }

    /// Rows of the position table: one per patch of `image_size`, and the class token.
    pub fn positions(&self) -> usize {
        self.grid() * self.grid() + 1
    }

    /// Width of the MLP's hidden layer (of each half of SwiGLU's
    /// `weights_in`), as transformers computes it.
    pub fn mlp_hidden(&self) -> usize {
        let h = (self.hidden_size as f64 * self.mlp_ratio) as usize;
        if self.use_swiglu_ffn {
            // `(int(h * 2 / 3) + 7) // 8 * 8`
            (((h * 2) as f64 / 3.0) as usize).next_multiple_of(8)
        } else {
            h
        }
    }

    /// Tokens of a call of `patches` patches: the class token, the
    /// registers, the patches.
    pub fn tokens(&self, patches: usize) -> usize {
        1 + self.num_register_tokens + patches
    }

    /// Parse a `config.json` of `model_type` `dinov2` or
    /// `dinov2_with_registers` (transformers' defaults for absent fields).
    pub fn from_json(path: &Path, v: &Value) -> Result<Self> {
        let f = VisionFields::flat(path, v)?;
        let registers =
            v.get("model_type").and_then(Value::as_str) == Some("dinov2_with_registers");
        let c = Dinov2VisionConfig {
            hidden_size: f.uint("hidden_size", Some(768))?,
            num_hidden_layers: f.uint("num_hidden_layers", Some(12))?,
            num_attention_heads: f.uint("num_attention_heads", Some(12))?,
            mlp_ratio: f.number("mlp_ratio", Some(4.0))?,
            hidden_act: f.activation(
                "gelu",
                &[
                    Activation::GeluErf,
                    Activation::GeluTanh,
                    Activation::QuickGelu,
                    Activation::Silu,
                ],
            )?,
            layer_norm_eps: f.number("layer_norm_eps", Some(1e-6))?,
            image_size: f.uint("image_size", Some(224))?,
            patch_size: f.uint("patch_size", Some(if registers { 16 } else { 14 }))?,
            num_channels: f.uint("num_channels", Some(3))?,
            qkv_bias: f.flag("qkv_bias", true)?,
            use_swiglu_ffn: f.flag("use_swiglu_ffn", false)?,
            num_register_tokens: if registers {
                f.uint("num_register_tokens", Some(4))?
            } else {
                0
            },
            interpolate_antialias: registers,
        };
        c.validate().map_err(|e| Error::field(path, e))?;
        Ok(c)
    }

    /// Check sizes for consistency; the message names the field.
    pub fn validate(&self) -> std::result::Result<(), FieldError> {
        check_encoder(
            FIELD,
            &[
                ("hidden_size", self.hidden_size),
                ("num_hidden_layers", self.num_hidden_layers),
                ("num_attention_heads", self.num_attention_heads),
                ("image_size", self.image_size),
                ("patch_size", self.patch_size),
            ],
            (self.hidden_size, self.num_attention_heads),
            self.num_channels,
            self.layer_norm_eps,
        )?;
        if !(self.mlp_ratio.is_finite() && self.mlp_ratio > 0.0) {
            return Err(FieldError::invalid(
                "mlp_ratio",
                format!("expected a positive number, got {}", self.mlp_ratio),
            ));
        }
        check_sizes_in(FIELD, &[("hidden_size * mlp_ratio", self.mlp_hidden())])?;
        if !self.image_size.is_multiple_of(self.patch_size) {
            return Err(FieldError::invalid(
                "image_size",
                format!(
                    "{} is not a multiple of patch_size {}",
                    self.image_size, self.patch_size
                ),
            ));
        }
        if self.num_register_tokens > 1024 {
            return Err(FieldError::invalid(
                "num_register_tokens",
                format!("expected at most 1024, got {}", self.num_register_tokens),
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// facebook/dinov2-giant's config.json (the fields that matter).
    const GIANT: &str = r#"{"model_type": "dinov2", "hidden_size": 1536, "image_size": 518,
        "mlp_ratio": 4, "num_attention_heads": 24, "num_hidden_layers": 40, "patch_size": 14,
        "use_swiglu_ffn": true, "layerscale_value": 1.0, "hidden_act": "gelu"}"#;

    /// facebook/dinov2-with-registers-base's.
    const BASE_REG: &str = r#"{"model_type": "dinov2_with_registers", "hidden_size": 768,
        "image_size": 518, "num_attention_heads": 12, "num_hidden_layers": 12,
        "patch_size": 14, "num_register_tokens": 4}"#;

    fn parse(text: &str) -> Result<Dinov2VisionConfig> {
        let v: Value = serde_json::from_str(text).unwrap();
        Dinov2VisionConfig::from_json(Path::new("config.json"), &v)
    }

    #[test]
    fn parses_the_released_configs() {
        let g = parse(GIANT).unwrap();
        // 6144 * 2 / 3 = 4096, already a multiple of 8.
        assert_eq!((g.grid(), g.positions(), g.mlp_hidden()), (37, 1370, 4096));
        assert_eq!((g.head_dim(), g.num_register_tokens), (64, 0));
        assert!(!g.interpolate_antialias && g.qkv_bias);
        let b = parse(BASE_REG).unwrap();
        assert_eq!(
            (b.mlp_hidden(), b.num_register_tokens, b.tokens(256)),
            (3072, 4, 261)
        );
        assert!(b.interpolate_antialias);
        // SwiGLU's rounding up to a multiple of 8: int(192 * 2 / 3) = 128; int(200 * 2 / 3) = 133 -> 136.
        let mut c = g.clone();
        c.hidden_size = 48;
        assert_eq!(c.mlp_hidden(), 128);
        c.hidden_size = 50;
        assert_eq!(c.mlp_hidden(), 136);
    }

    #[test]
    fn bad_configs_name_the_field() {
        let e = |text: &str| parse(text).unwrap_err().to_string();
        let m = e(r#"{"model_type": "dinov2", "image_size": 230, "patch_size": 14}"#);
        assert!(m.contains("`image_size`") && m.contains("230"), "{m}");
        let m = e(r#"{"model_type": "dinov2", "hidden_size": 100, "num_attention_heads": 3}"#);
        assert!(m.contains("`num_attention_heads`"), "{m}");
        let m = e(r#"{"model_type": "dinov2", "mlp_ratio": 0}"#);
        assert!(m.contains("`mlp_ratio`"), "{m}");
        let m = e(r#"{"model_type": "dinov2", "use_swiglu_ffn": "yes"}"#);
        assert!(m.contains("`use_swiglu_ffn`"), "{m}");
        let m = e(r#"{"model_type": "dinov2", "hidden_act": "relu"}"#);
        assert!(m.contains("`hidden_act`"), "{m}");
        let m = e(r#"{"model_type": "dinov2", "num_channels": 1}"#);
        assert!(
            m.contains("`num_channels`") && !m.contains("vision_config"),
            "{m}"
        );
    }
}
