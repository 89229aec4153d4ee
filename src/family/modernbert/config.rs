//! ModernBERT's config: [`ModernBertConfig`]'s fields mirror transformers'
//! `ModernBertConfig` (`models/modernbert/configuration_modernbert.py`), the
//! checkpoint's top level; beside it the sentence-transformers configuration
//! of a checkpoint that has one.

use std::path::Path;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::checkpoint::config::{Activation, VisionFields, check_sizes_in};
use crate::error::{Error, FieldError, Result};
use crate::family::SentencePooling;
use crate::family::text::{max_seq_length, sentence_pooling};

/// What one layer's attention sees.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum LayerType {
    /// Every token (`full_attention`; rotary base `rope_theta.full`).
    FullAttention,
    /// Keys within `local_attention / 2` positions (`sliding_attention`;
    /// rotary base `rope_theta.sliding`).
    SlidingAttention,
}

/// The rotary bases of the two layer types.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct RopeThetas {
    pub full: f64,
    pub sliding: f64,
}

/// A ModernBERT encoder's hyper-parameters.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ModernBertConfig {
    pub hidden_size: usize,
    pub intermediate_size: usize,
    pub num_hidden_layers: usize,
    pub num_attention_heads: usize,
    pub vocab_size: usize,
    pub max_position_embeddings: usize,
    pub hidden_activation: Activation,
    pub norm_eps: f64,
    pub norm_bias: bool,
    pub attention_bias: bool,
    pub mlp_bias: bool,
    pub layer_types: Vec<LayerType>,
    pub rope_theta: RopeThetas,
    /// The sliding window's width: a key is visible within
    /// `local_attention / 2` positions of the query.
    pub local_attention: usize,
    pub pad_token_id: usize,
    #[serde(default)]
    pub sentence: Option<SentencePooling>,
    #[serde(default)]
    pub max_seq_length: Option<usize>,
}

impl ModernBertConfig {
    pub fn head_dim(&self) -> usize {
        self.hidden_size / self.num_attention_heads
    }

    /// Half the sliding window: the largest distance a sliding layer sees.
    pub fn half_window(&self) -> usize {
        self.local_attention / 2
    }

    /// The most tokens one text can have (the rotary tables' positions, or
    /// sentence-transformers' `max_seq_length`).
    pub fn max_tokens(&self) -> usize {
        let table = self.max_position_embeddings;
        self.max_seq_length.map_or(table, |m| m.min(table))
    }

    /// Parse a `config.json` (`path`) of `model_type` `modernbert`.
    pub fn from_json(path: &Path, v: &Value) -> Result<Self> {
        let f = VisionFields::flat(path, v)?;
        let depth = f.uint("num_hidden_layers", Some(22))?;
        let layer_types = match v.get("layer_types") {
            Some(Value::Array(a)) => a
                .iter()
                .enumerate()
                .map(|(i, t)| match t.as_str() {
                    Some("full_attention") => Ok(LayerType::FullAttention),
                    Some("sliding_attention") => Ok(LayerType::SlidingAttention),
                    _ => Err(Error::field(
                        path,
                        FieldError::Unsupported {
                            field: format!("layer_types[{i}]"),
                            value: t.to_string(),
                            expected: "full_attention or sliding_attention".into(),
                        },
                    )),
                })
                .collect::<Result<Vec<_>>>()?,
            Some(Value::Null) | None => {
                // Older configs: every n-th layer global, from the first.
                let n = f.uint("global_attn_every_n_layers", Some(3))?.max(1);
                (0..depth)
                    .map(|i| {
                        if i % n == 0 {
                            LayerType::FullAttention
                        } else {
                            LayerType::SlidingAttention
                        }
                    })
                    .collect()
            }
            Some(x) => {
                return Err(Error::field(
                    path,
                    FieldError::Type {
                        field: "layer_types".into(),
                        expected: "a list",
                        got: x.to_string(),
                    },
                ));
            }
        };
        let theta = |kind: &str, old: &str, default: f64| -> Result<f64> {
            match v["rope_parameters"][kind]["rope_theta"].as_f64() {
                Some(t) => Ok(t),
                None => f.number(old, Some(default)),
            }
        };
        for kind in ["full_attention", "sliding_attention"] {
            if let Some(t) = v["rope_parameters"][kind]["rope_type"].as_str()
                && t != "default"
            {
                return Err(Error::field(
                    path,
                    FieldError::Unsupported {
                        field: format!("rope_parameters.{kind}.rope_type"),
                        value: t.to_string(),
                        expected: "default".into(),
                    },
                ));
            }
        }
        let c = ModernBertConfig {
            hidden_size: f.uint("hidden_size", Some(768))?,
            intermediate_size: f.uint("intermediate_size", Some(1152))?,
            num_hidden_layers: depth,
            num_attention_heads: f.uint("num_attention_heads", Some(12))?,
            vocab_size: f.uint("vocab_size", Some(50368))?,
            max_position_embeddings: f.uint("max_position_embeddings", Some(8192))?,
            hidden_activation: activation(path, v)?,
            norm_eps: f.number("norm_eps", Some(1e-5))?,
            norm_bias: f.flag("norm_bias", false)?,
            attention_bias: f.flag("attention_bias", false)?,
            mlp_bias: f.flag("mlp_bias", false)?,
            layer_types,
            rope_theta: RopeThetas {
                full: theta("full_attention", "global_rope_theta", 160_000.0)?,
                sliding: theta("sliding_attention", "local_rope_theta", 10_000.0)?,
            },
            local_attention: f.uint("local_attention", Some(128))?,
            pad_token_id: f.uint("pad_token_id", Some(50283))?,
            sentence: sentence_pooling(path.parent().unwrap_or(Path::new(".")))?,
            max_seq_length: max_seq_length(path.parent().unwrap_or(Path::new(".")))?,
        };
        c.validate().map_err(|e| Error::field(path, e))?;
        Ok(c)
    }

    /// Check sizes for consistency; the message names the field.
    pub fn validate(&self) -> std::result::Result<(), FieldError> {
        check_sizes_in(
            "",
            &[
                ("hidden_size", self.hidden_size),
                ("intermediate_size", self.intermediate_size),
                ("num_hidden_layers", self.num_hidden_layers),
                ("num_attention_heads", self.num_attention_heads),
                ("vocab_size", self.vocab_size),
                ("max_position_embeddings", self.max_position_embeddings),
                ("local_attention", self.local_attention),
            ],
        )?;
        if !self.hidden_size.is_multiple_of(self.num_attention_heads)
            || !self.head_dim().is_multiple_of(2)
        {
            return Err(FieldError::invalid(
                "num_attention_heads",
                format!(
                    "{} heads of hidden_size {}: expected an even head size (rotary)",
                    self.num_attention_heads, self.hidden_size
                ),
            ));
        }
        if self.layer_types.len() != self.num_hidden_layers {
            return Err(FieldError::invalid(
                "layer_types",
                format!(
                    "{} entries for {} layers",
                    self.layer_types.len(),
                    self.num_hidden_layers
                ),
            ));
        }
        for (k, t) in [
            ("rope_theta", self.rope_theta.full),
            ("local_rope_theta", self.rope_theta.sliding),
        ] {
            if !(t.is_finite() && t > 1.0) {
                return Err(FieldError::range(k, "a finite number > 1", t));
            }
        }
        crate::family::text::check_text_encoder(
            (self.hidden_size, self.num_attention_heads),
            ("norm_eps", self.norm_eps),
            (self.pad_token_id, self.vocab_size),
        )?;
        Ok(())
    }
}

/// `hidden_activation` (ModernBERT's name for the MLP's activation).
fn activation(path: &Path, v: &Value) -> Result<Activation> {
    let name = v
        .get("hidden_activation")
        .and_then(Value::as_str)
        .unwrap_or("gelu");
    match name {
        "gelu" => Ok(Activation::GeluErf),
        "gelu_pytorch_tanh" | "gelu_new" => Ok(Activation::GeluTanh),
        "silu" => Ok(Activation::Silu),
        "relu" => Ok(Activation::Relu),
        other => Err(Error::field(
            path,
            FieldError::Unsupported {
                field: "hidden_activation".into(),
                value: other.to_string(),
                expected: "gelu, gelu_pytorch_tanh, gelu_new, silu or relu".into(),
            },
        )),
    }
}
