//! ModernBERT (`modernbert`): its registry entry, and [`Tower`] for its
//! config, wiring the family's modules together: the config in
//! `config.rs`, the reference in `reference.rs`, the layout in `layout.rs`,
//! the host inputs in `host.rs`, the builder in
//! `python/ane_export/modernbert.py`.
//!
//! A text encoder ([`Input::Tokens`]): rotary positions, attention that
//! alternates between every token and a sliding window, a GeGLU MLP,
//! pre-norm blocks without biases. A bucket is a number of tokens; a call
//! is one text, padded and masked. Output under transformers' name:
//! `last_hidden_state [T, D]`; besides it the host computes the sentence
//! embedding the checkpoint's sentence-transformers configuration asks
//! for. No pooler, no language model.

pub mod config;
pub mod host;
pub mod layout;
pub mod reference;

pub use config::ModernBertConfig;

use std::sync::Arc;

use serde_json::Value;

use super::{
    Build, Entry, Family, Input, Oracle, OutputSpec, Pooling, Reference, Sizes, Tower,
    VisionConfig, WeightNames,
};
use crate::checkpoint::Checkpoint;
use crate::error::{FieldError, Result};
use crate::export::layout::{LayoutTensor, Storage};

pub const ENTRY: Entry = Entry {
    name: "modernbert",
    model_types: &["modernbert"],
    parse: |path, v, _| ModernBertConfig::from_json(path, v).map(VisionConfig::ModernBert),
    weights: WeightNames {
        // `ModernBertModel` saves the encoder at the top level; the task
        // heads under `model.`.
        prefixes: &["", "model."],
        probe: "embeddings.tok_embeddings.weight",
        extra: &[],
        unread: &[],
    },
    from_manifest: |v| super::config_from_manifest(v).map(VisionConfig::ModernBert),
    decoder: None,
    residual_scale: true,
    branch_scale: false,
};

impl Tower for ModernBertConfig {
    fn family(&self) -> Family {
        Family(&ENTRY)
    }
    fn sizes(&self) -> Sizes {
        super::encoder_sizes(self.hidden_size, self.num_hidden_layers)
    }
    fn validate(&self) -> std::result::Result<(), FieldError> {
        ModernBertConfig::validate(self)
    }
    fn input(&self) -> Input<'_> {
        Input::Tokens(self)
    }
    fn output_names(&self) -> Vec<String> {
        vec!["last_hidden_state".into()]
    }
    /// `last_hidden_state`, a column per token with the pad columns last.
    fn outputs(&self, tokens: usize) -> Vec<OutputSpec> {
        vec![OutputSpec {
            padded: true,
            ..super::encoder_output("last_hidden_state", self.hidden_size, tokens)
        }]
    }
    fn pooled_output(&self) -> Option<Pooling> {
        Some(Pooling::Mean("last_hidden_state"))
    }
}

super::text::text_encoder_host!(ModernBertConfig);

impl Build for ModernBertConfig {
    fn layout(&self, ck: &Checkpoint, storage: Storage) -> Result<Vec<LayoutTensor>> {
        layout::layout(ck, self, storage)
    }
    fn builder_spec(&self) -> Value {
        serde_json::json!({
            "hidden_size": self.hidden_size,
            "num_heads": self.num_attention_heads,
            "depth": self.num_hidden_layers,
            "intermediate_size": self.intermediate_size,
            "hidden_act": self.hidden_activation.hf_name(),
            "norm_eps": self.norm_eps,
            "norm_bias": self.norm_bias,
            "attention_bias": self.attention_bias,
            "mlp_bias": self.mlp_bias,
            "layer_types": self.layer_types,
            "rope_theta": {
                "full_attention": self.rope_theta.full,
                "sliding_attention": self.rope_theta.sliding,
            },
            "local_attention": self.local_attention,
        })
    }
    /// The checkpoint's epsilon, at least the text builders' floor
    /// ([`super::text::MIN_PROGRAM_EPS`]).
    fn layer_norm_eps(&self) -> f64 {
        self.norm_eps.max(super::text::MIN_PROGRAM_EPS)
    }
}

impl Reference for ModernBertConfig {
    fn oracle(&self, ck: &Checkpoint) -> Result<Oracle> {
        Ok(Oracle::Text(Arc::new(reference::ModernBertEncoder::load(
            ck, self,
        )?)))
    }
}
