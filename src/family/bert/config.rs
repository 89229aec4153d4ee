//! The BERT family's config: [`BertConfig`]'s fields mirror transformers'
//! `BertConfig` (`models/bert/configuration_bert.py`), whose
//! `RobertaConfig` and `XLMRobertaConfig` are copies with other defaults;
//! the config is the checkpoint's top level. Beside it, the
//! sentence-transformers configuration of a checkpoint that has one
//! (`modules.json` and the `Pooling` module's `config.json`).

use std::path::Path;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::checkpoint::config::{Activation, VisionFields, check_sizes_in};
use crate::error::{Error, FieldError, Result};
use crate::family::SentencePooling;
use crate::family::text::{max_seq_length, sentence_pooling};

/// The tensor of the pooler (`BertPooler`: dense + tanh on the first token).
pub const POOLER: &str = "pooler.dense.weight";

/// A BERT-family encoder's hyper-parameters.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct BertConfig {
    /// `bert`, `roberta` or `xlm-roberta`: which position ids it counts.
    pub model_type: String,
    pub hidden_size: usize,
    pub intermediate_size: usize,
    pub num_hidden_layers: usize,
    pub num_attention_heads: usize,
    pub vocab_size: usize,
    pub max_position_embeddings: usize,
    pub type_vocab_size: usize,
    pub hidden_act: Activation,
    pub layer_norm_eps: f64,
    pub pad_token_id: usize,
    /// The position id of the first token: 0 for BERT; `pad_token_id + 1`
    /// for RoBERTa and XLM-R, whose position ids count from past the pad
    /// token's (transformers' `create_position_ids_from_input_ids`).
    pub position_offset: usize,
    /// Whether the checkpoint holds the pooler ([`POOLER`]).
    pub pooler: bool,
    /// The sentence embedding its sentence-transformers configuration asks for.
    #[serde(default)]
    pub sentence: Option<SentencePooling>,
    /// sentence-transformers' `max_seq_length` (`sentence_bert_config.json`):
    /// the checkpoint's users get texts truncated to it, so no bucket is
    /// longer.
    #[serde(default)]
    pub max_seq_length: Option<usize>,
}

impl BertConfig {
    /// `hidden_size / num_attention_heads`.
    pub fn head_dim(&self) -> usize {
        self.hidden_size / self.num_attention_heads
    }

    /// The most tokens one text can have: the position table's rows past
    /// the offset.
    pub fn max_tokens(&self) -> usize {
        let table = self
            .max_position_embeddings
            .saturating_sub(self.position_offset);
        self.max_seq_length.map_or(table, |m| m.min(table))
    }

    /// Parse a `config.json` (`path`) of `model_type` `bert`, `roberta` or
    /// `xlm-roberta`; `has_pooler`: whether the checkpoint holds [`POOLER`].
    pub fn from_json(path: &Path, v: &Value, has_pooler: bool) -> Result<Self> {
        let f = VisionFields::flat(path, v)?;
        let model_type = v
            .get("model_type")
            .and_then(Value::as_str)
            .unwrap_or("bert")
            .to_string();
        let roberta = model_type != "bert";
        if let Some(p) = v.get("position_embedding_type").and_then(Value::as_str)
            && p != "absolute"
        {
            return Err(Error::field(
                path,
                FieldError::Unsupported {
                    field: "position_embedding_type".into(),
                    value: p.to_string(),
                    expected: "absolute".into(),
                },
            ));
        }
        if f.flag("is_decoder", false)? {
            return Err(Error::field(
                path,
                FieldError::invalid(
                    "is_decoder",
                    "true: a causal decoder, not a bidirectional encoder",
                ),
            ));
        }
        let pad_token_id = f.uint("pad_token_id", Some(if roberta { 1 } else { 0 }))?;
        let c = BertConfig {
            hidden_size: f.uint("hidden_size", Some(768))?,
            intermediate_size: f.uint("intermediate_size", Some(3072))?,
            num_hidden_layers: f.uint("num_hidden_layers", Some(12))?,
            num_attention_heads: f.uint("num_attention_heads", Some(12))?,
            vocab_size: f.uint("vocab_size", Some(30522))?,
            max_position_embeddings: f.uint("max_position_embeddings", Some(512))?,
            type_vocab_size: f.uint("type_vocab_size", Some(2))?,
            hidden_act: f.activation(
                "gelu",
                &[Activation::GeluErf, Activation::GeluTanh, Activation::Relu],
            )?,
            layer_norm_eps: f.number("layer_norm_eps", Some(1e-12))?,
            pad_token_id,
            position_offset: if roberta { pad_token_id + 1 } else { 0 },
            pooler: has_pooler,
            sentence: sentence_pooling(path.parent().unwrap_or(Path::new(".")))?,
            max_seq_length: max_seq_length(path.parent().unwrap_or(Path::new(".")))?,
            model_type,
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
                ("type_vocab_size", self.type_vocab_size),
            ],
        )?;
        crate::family::text::check_text_encoder(
            (self.hidden_size, self.num_attention_heads),
            ("layer_norm_eps", self.layer_norm_eps),
            (self.pad_token_id, self.vocab_size),
        )?;
        if self.max_tokens() == 0 {
            return Err(FieldError::invalid(
                "max_position_embeddings",
                format!(
                    "{} leaves no position past the offset {} (pad_token_id + 1)",
                    self.max_position_embeddings, self.position_offset
                ),
            ));
        }
        if self.max_seq_length == Some(0) {
            return Err(FieldError::range("max_seq_length", "a positive count", 0));
        }
        if !matches!(self.model_type.as_str(), "bert" | "roberta" | "xlm-roberta") {
            return Err(FieldError::Unsupported {
                field: "model_type".into(),
                value: self.model_type.clone(),
                expected: "bert, roberta or xlm-roberta".into(),
            });
        }
        Ok(())
    }
}
