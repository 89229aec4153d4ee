//! The language-model half of a `config.json`, for every family whose
//! decoder [`Decoder`] describes (Qwen3-VL's, and the Qwen2 decoders of
//! Qwen2-VL and Qwen2.5-VL).

use std::path::Path;

use serde_json::Value;

use crate::error::{Error, FieldError, Result};

/// How a family's language model differs from Qwen3-VL's; each family's
/// registry entry names its own, one of the decoders below.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Decoder {
    /// M-RoPE frequency slots interleaved T, H, W (Qwen3-VL), or in three
    /// consecutive sections (`mrope_section`, Qwen2-VL and Qwen2.5-VL).
    pub interleaved_mrope: bool,
    /// An RMSNorm of every query and key head (`q_norm`, `k_norm`).
    pub qk_norm: bool,
    /// The q, k and v projections have biases whatever `attention_bias` says.
    pub qkv_bias: bool,
    /// The system turn the chat template adds when none is given.
    pub system_prompt: Option<&'static str>,
    /// Without `text_config`, the text fields are read from the top level
    /// (the layout transformers 4 wrote for these families).
    pub flat_text_config: bool,
}

impl Decoder {
    /// Qwen3-VL's: interleaved M-RoPE, q/k norms, no q/k/v biases, the text
    /// fields under `text_config`.
    pub const QWEN3_VL: Decoder = Decoder {
        interleaved_mrope: true,
        qk_norm: true,
        qkv_bias: false,
        system_prompt: None,
        flat_text_config: false,
    };

    /// Qwen2-VL's and Qwen2.5-VL's Qwen2 decoder: sectioned M-RoPE, q/k/v
    /// biases, no q/k norms; the chat template's default system turn;
    /// transformers 4 wrote the text config at the top level.
    pub const QWEN2: Decoder = Decoder {
        interleaved_mrope: false,
        qk_norm: false,
        qkv_bias: true,
        system_prompt: Some("You are a helpful assistant."),
        flat_text_config: true,
    };
}

/// What the Rust decoder needs from `config.json` (`text_config` and the
/// multimodal token ids).
#[derive(Clone, Debug, PartialEq)]
pub struct TextConfig {
    /// The family's decoder variant.
    pub decoder: Decoder,
    pub vocab_size: usize,
    pub hidden_size: usize,
    pub intermediate_size: usize,
    pub num_hidden_layers: usize,
    pub num_attention_heads: usize,
    pub num_key_value_heads: usize,
    pub head_dim: usize,
    pub rms_norm_eps: f64,
    pub rope_theta: f64,
    /// Frequency slots given to (T, H, W), interleaved; sums to `head_dim / 2`.
    pub mrope_section: [usize; 3],
    pub attention_bias: bool,
    /// The output projection is `embed_tokens` (no `lm_head.weight`).
    pub tie_word_embeddings: bool,
    pub image_token_id: u32,
    pub vision_start_token_id: u32,
    pub vision_end_token_id: u32,
    /// `vision_config.spatial_merge_size`: patches per visual token side.
    pub spatial_merge_size: usize,
    /// How many deepstack features the tower feeds (`deepstack_visual_indexes`);
    /// feature k is added after decoder layer k, and, as in transformers,
    /// features beyond the last layer are unused.
    pub deepstack_layers: usize,
}

fn field<'a>(path: &Path, v: &'a Value, section: &str, name: &str) -> Result<&'a Value> {
    v.get(name).ok_or_else(|| {
        Error::config(
            path,
            format!("field `{section}{name}`: missing (the language model needs it)"),
        )
    })
}

fn usize_of(path: &Path, v: &Value, section: &str, name: &str) -> Result<usize> {
    field(path, v, section, name)?
        .as_u64()
        .filter(|&n| n > 0 && n < (1 << 31))
        .map(|n| n as usize)
        .ok_or_else(|| {
            Error::config(
                path,
                format!("field `{section}{name}`: expected a positive integer"),
            )
        })
}

fn f64_of(path: &Path, v: &Value, section: &str, name: &str) -> Result<f64> {
    field(path, v, section, name)?
        .as_f64()
        .filter(|x| x.is_finite() && *x > 0.0)
        .ok_or_else(|| {
            Error::config(
                path,
                format!("field `{section}{name}`: expected a positive number"),
            )
        })
}

fn token_id(path: &Path, v: &Value, name: &str) -> Result<u32> {
    // The top level; transformers 4 also wrote some ids inside text_config.
    let (section, holder) = match (v.get(name), v.get("text_config")) {
        (None, Some(t)) if t.get(name).is_some() => ("text_config.", t),
        _ => ("", v),
    };
    field(path, holder, section, name)?
        .as_u64()
        .and_then(|n| u32::try_from(n).ok())
        .ok_or_else(|| {
            Error::config(
                path,
                format!("field `{section}{name}`: expected a token id"),
            )
        })
}

impl TextConfig {
    /// Parse and validate `config.json` (`path` names it in errors) for
    /// the family's `decoder`.
    ///
    /// RoPE settings are read from `text_config.rope_parameters` (transformers
    /// 5) or from `text_config.rope_scaling` and `text_config.rope_theta`
    /// (transformers 4, as the released checkpoints ship).
    pub fn from_json(path: &Path, v: &Value, decoder: Decoder) -> Result<TextConfig> {
        let model_type = v.get("model_type").and_then(Value::as_str).unwrap_or("");
        if model_type.ends_with("_vision") {
            return Err(Error::config(
                path,
                format!(
                    "field `model_type`: `{model_type}` is a vision tower alone: no language model"
                ),
            ));
        }
        let (t, s) = match v.get("text_config") {
            Some(t) => (t, "text_config."),
            None if decoder.flat_text_config && v.get("num_hidden_layers").is_some() => (v, ""),
            None => {
                return Err(Error::config(
                    path,
                    "field `text_config`: missing: no language model",
                ));
            }
        };
        let rope = t
            .get("rope_parameters")
            .or_else(|| t.get("rope_scaling"))
            .ok_or_else(|| {
                Error::config(
                    path,
                    "field `text_config.rope_parameters` (or `rope_scaling`): missing",
                )
            })?;
        let rs = if t.get("rope_parameters").is_some() {
            format!("{s}rope_parameters.")
        } else {
            format!("{s}rope_scaling.")
        };
        let rs = rs.as_str();
        let theta = match rope.get("rope_theta") {
            Some(_) => f64_of(path, rope, rs, "rope_theta")?,
            None => f64_of(path, t, s, "rope_theta")?,
        };
        if let Some(i) = rope.get("mrope_interleaved").and_then(Value::as_bool)
            && i != decoder.interleaved_mrope
        {
            return Err(Error::config(
                path,
                format!(
                    "field `{rs}mrope_interleaved`: {i}; the {model_type} decoder {} M-RoPE",
                    if decoder.interleaved_mrope {
                        "interleaves"
                    } else {
                        "does not interleave"
                    }
                ),
            ));
        }
        let sec = field(path, rope, rs, "mrope_section")?
            .as_array()
            .filter(|a| a.len() == 3)
            .and_then(|a| {
                let v: Vec<usize> = a
                    .iter()
                    .filter_map(|x| x.as_u64().map(|n| n as usize))
                    .collect();
                (v.len() == 3).then(|| [v[0], v[1], v[2]])
            })
            .ok_or_else(|| {
                Error::config(
                    path,
                    format!("field `{rs}mrope_section`: expected three non-negative integers"),
                )
            })?;
        let heads = usize_of(path, t, s, "num_attention_heads")?;
        let hidden = usize_of(path, t, s, "hidden_size")?;
        let head_dim = match t.get("head_dim") {
            Some(Value::Null) | None => hidden / heads,
            Some(_) => usize_of(path, t, s, "head_dim")?,
        };
        let tie = v
            .get("tie_word_embeddings")
            .or_else(|| t.get("tie_word_embeddings"))
            .and_then(Value::as_bool)
            .unwrap_or(false);
        let vc = v
            .get("vision_config")
            .ok_or_else(|| Error::config(path, "field `vision_config`: missing"))?;
        let cfg = TextConfig {
            decoder,
            vocab_size: usize_of(path, t, s, "vocab_size")?,
            hidden_size: hidden,
            intermediate_size: usize_of(path, t, s, "intermediate_size")?,
            num_hidden_layers: usize_of(path, t, s, "num_hidden_layers")?,
            num_attention_heads: heads,
            num_key_value_heads: usize_of(path, t, s, "num_key_value_heads")?,
            head_dim,
            rms_norm_eps: f64_of(path, t, s, "rms_norm_eps")?,
            rope_theta: theta,
            mrope_section: sec,
            attention_bias: decoder.qkv_bias
                || t.get("attention_bias")
                    .and_then(Value::as_bool)
                    .unwrap_or(false),
            tie_word_embeddings: tie,
            image_token_id: token_id(path, v, "image_token_id")?,
            vision_start_token_id: token_id(path, v, "vision_start_token_id")?,
            vision_end_token_id: token_id(path, v, "vision_end_token_id")?,
            spatial_merge_size: usize_of(path, vc, "vision_config.", "spatial_merge_size")?,
            deepstack_layers: vc
                .get("deepstack_visual_indexes")
                .and_then(Value::as_array)
                .map_or(0, Vec::len),
        };
        cfg.validate().map_err(|e| Error::field(path, e))?;
        Ok(cfg)
    }

    /// The relations between fields that the decoder relies on.
    pub fn validate(&self) -> std::result::Result<(), FieldError> {
        if !self.head_dim.is_multiple_of(2) {
            return Err(FieldError::Inconsistent(format!(
                "text_config.head_dim {} must be even (RoPE)",
                self.head_dim
            )));
        }
        let sum: usize = self.mrope_section.iter().sum();
        if sum != self.head_dim / 2 {
            return Err(FieldError::Inconsistent(format!(
                "mrope_section {:?} sums to {sum}, expected head_dim / 2 = {}",
                self.mrope_section,
                self.head_dim / 2
            )));
        }
        if !self
            .num_attention_heads
            .is_multiple_of(self.num_key_value_heads)
        {
            return Err(FieldError::Inconsistent(format!(
                "text_config.num_attention_heads {} is not a multiple of num_key_value_heads {}",
                self.num_attention_heads, self.num_key_value_heads
            )));
        }
        for (name, id) in [
            ("image_token_id", self.image_token_id),
            ("vision_start_token_id", self.vision_start_token_id),
            ("vision_end_token_id", self.vision_end_token_id),
        ] {
            if id as usize >= self.vocab_size {
                return Err(FieldError::Inconsistent(format!(
                    "{name} {id} is outside the vocabulary ({} tokens)",
                    self.vocab_size
                )));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The text part of the released Qwen3-VL-2B-Instruct config.json
    /// (transformers 4 layout), with its vision section cut to what is read.
    const QWEN3_VL_2B: &str = r#"{
      "architectures": ["Qwen3VLForConditionalGeneration"],
      "image_token_id": 151655, "model_type": "qwen3_vl",
      "text_config": {
        "attention_bias": false, "attention_dropout": 0.0, "bos_token_id": 151643,
        "dtype": "bfloat16", "eos_token_id": 151645, "head_dim": 128, "hidden_act": "silu",
        "hidden_size": 2048, "initializer_range": 0.02, "intermediate_size": 6144,
        "max_position_embeddings": 262144, "model_type": "qwen3_vl_text",
        "num_attention_heads": 16, "num_hidden_layers": 28, "num_key_value_heads": 8,
        "rms_norm_eps": 1e-06,
        "rope_scaling": {"mrope_interleaved": true, "mrope_section": [24, 20, 20], "rope_type": "default"},
        "rope_theta": 5000000, "tie_word_embeddings": true, "use_cache": true, "vocab_size": 151936
      },
      "tie_word_embeddings": true, "video_token_id": 151656,
      "vision_config": {"deepstack_visual_indexes": [5, 11, 17], "spatial_merge_size": 2},
      "vision_end_token_id": 151653, "vision_start_token_id": 151652
    }"#;

    #[test]
    fn released_2b_config_parses() {
        let v: Value = serde_json::from_str(QWEN3_VL_2B).unwrap();
        let c = TextConfig::from_json(Path::new("config.json"), &v, Decoder::QWEN3_VL).unwrap();
        assert_eq!(c.mrope_section, [24, 20, 20]);
        assert_eq!(c.rope_theta, 5e6);
        assert_eq!(
            (c.num_attention_heads, c.num_key_value_heads, c.head_dim),
            (16, 8, 128)
        );
        assert!(c.tie_word_embeddings);
        assert_eq!(c.image_token_id, 151655);
        assert_eq!(c.deepstack_layers, 3);
    }

    /// The released Qwen2.5-VL-3B-Instruct config.json (transformers 4
    /// layout: the text fields at the top level), vision section cut.
    const QWEN25_VL_3B: &str = r#"{
      "architectures": ["Qwen2_5_VLForConditionalGeneration"], "attention_dropout": 0.0,
      "bos_token_id": 151643, "eos_token_id": 151645, "vision_start_token_id": 151652,
      "vision_end_token_id": 151653, "vision_token_id": 151654, "image_token_id": 151655,
      "video_token_id": 151656, "hidden_act": "silu", "hidden_size": 2048,
      "initializer_range": 0.02, "intermediate_size": 11008, "max_position_embeddings": 128000,
      "max_window_layers": 70, "model_type": "qwen2_5_vl", "num_attention_heads": 16,
      "num_hidden_layers": 36, "num_key_value_heads": 2, "rms_norm_eps": 1e-06,
      "rope_theta": 1000000.0, "sliding_window": 32768, "tie_word_embeddings": true,
      "torch_dtype": "bfloat16", "transformers_version": "4.41.2", "use_cache": true,
      "use_sliding_window": false,
      "vision_config": {"depth": 32, "hidden_act": "silu", "hidden_size": 1280,
        "intermediate_size": 3420, "num_heads": 16, "in_chans": 3, "out_hidden_size": 2048,
        "patch_size": 14, "spatial_merge_size": 2, "spatial_patch_size": 14, "window_size": 112,
        "fullatt_block_indexes": [7, 15, 23, 31], "tokens_per_second": 2, "temporal_patch_size": 2},
      "rope_scaling": {"type": "mrope", "mrope_section": [16, 24, 24]},
      "vocab_size": 151936
    }"#;

    #[test]
    fn released_qwen2_5_vl_config_parses() {
        let v: Value = serde_json::from_str(QWEN25_VL_3B).unwrap();
        let c = TextConfig::from_json(Path::new("config.json"), &v, Decoder::QWEN2).unwrap();
        assert_eq!(c.mrope_section, [16, 24, 24]);
        assert_eq!(
            (c.hidden_size, c.num_hidden_layers, c.head_dim),
            (2048, 36, 128)
        );
        assert_eq!((c.num_attention_heads, c.num_key_value_heads), (16, 2));
        assert!(c.attention_bias && c.tie_word_embeddings);
        assert!(!c.decoder.interleaved_mrope && !c.decoder.qk_norm);
        assert_eq!(c.deepstack_layers, 0);
        assert_eq!(c.image_token_id, 151655);
        // An interleaved section is not this decoder's.
        let mut v: Value = serde_json::from_str(QWEN25_VL_3B).unwrap();
        v["rope_scaling"]["mrope_interleaved"] = true.into();
        let e = TextConfig::from_json(Path::new("config.json"), &v, Decoder::QWEN2)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("rope_scaling.mrope_interleaved") && e.contains("does not interleave"),
            "{e}"
        );
    }

    #[test]
    fn bad_fields_are_named() {
        let mut v: Value = serde_json::from_str(QWEN3_VL_2B).unwrap();
        v["text_config"]["rope_scaling"]["mrope_section"] = serde_json::json!([24, 20, 19]);
        let e = TextConfig::from_json(Path::new("config.json"), &v, Decoder::QWEN3_VL).unwrap_err();
        assert!(
            matches!(
                &e,
                Error::Field {
                    error: FieldError::Inconsistent(_),
                    ..
                }
            ),
            "{e:?}"
        );
        let e = e.to_string();
        assert!(
            e.contains("mrope_section") && e.contains("sums to 63"),
            "{e}"
        );
        let mut v: Value = serde_json::from_str(QWEN3_VL_2B).unwrap();
        v["text_config"]["num_key_value_heads"] = serde_json::json!(3);
        let e = TextConfig::from_json(Path::new("config.json"), &v, Decoder::QWEN3_VL)
            .unwrap_err()
            .to_string();
        assert!(e.contains("num_key_value_heads 3"), "{e}");
        let mut v: Value = serde_json::from_str(QWEN3_VL_2B).unwrap();
        v.as_object_mut().unwrap().remove("text_config");
        let e = TextConfig::from_json(Path::new("config.json"), &v, Decoder::QWEN3_VL)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("text_config") && e.contains("no language model"),
            "{e}"
        );
    }
}
