//! The BERT family (`bert`, `roberta`, `xlm-roberta`): its registry entry,
//! and [`Tower`] for its config, wiring the family's modules together: the
//! config in `config.rs`, the reference in `reference.rs`, the layout in
//! `layout.rs`, the host inputs in `host.rs`, the builder in
//! `python/ane_export/bert.py`.
//!
//! A text encoder: it reads [`Input::Tokens`]. A bucket is a number of
//! tokens (`tokens: N`; by default b128 and b512); a call is one text,
//! tokenized by the checkpoint's `tokenizer.json` and truncated to the
//! largest bucket, padded to its bucket and masked. Outputs under
//! transformers' names: `last_hidden_state [T, D]` (the real tokens) and
//! `pooler_output [1, D]` where the checkpoint has a pooler; besides them
//! the host computes the sentence embedding the checkpoint's
//! sentence-transformers configuration asks for. No language model.

pub mod config;
pub mod host;
pub mod layout;
pub mod reference;

pub use config::BertConfig;

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
    name: "bert",
    model_types: &["bert", "roberta", "xlm-roberta"],
    parse: |path, v, has| {
        BertConfig::from_json(path, v, has(config::POOLER)).map(VisionConfig::Bert)
    },
    weights: WeightNames {
        // `BertModel` and sentence-transformers save the encoder at the top
        // level; the task heads under the base model's prefix.
        prefixes: &["", "bert.", "roberta."],
        probe: "embeddings.word_embeddings.weight",
        extra: &[],
        // Buffers older checkpoints saved: transformers recomputes them.
        unread: &["embeddings.position_ids", "embeddings.token_type_ids"],
    },
    from_manifest: |v| super::config_from_manifest(v).map(VisionConfig::Bert),
    decoder: None,
    residual_scale: true,
    branch_scale: false,
};

impl Tower for BertConfig {
    fn family(&self) -> Family {
        Family(&ENTRY)
    }
    fn sizes(&self) -> Sizes {
        super::encoder_sizes(self.hidden_size, self.num_hidden_layers)
    }
    fn validate(&self) -> std::result::Result<(), FieldError> {
        BertConfig::validate(self)
    }
    fn input(&self) -> Input<'_> {
        Input::Tokens(self)
    }
    fn output_names(&self) -> Vec<String> {
        self.outputs(0).into_iter().map(|o| o.name).collect()
    }
    /// `last_hidden_state`, a column per token with the pad columns last,
    /// and `pooler_output` where the checkpoint has a pooler.
    fn outputs(&self, tokens: usize) -> Vec<OutputSpec> {
        let d = self.hidden_size;
        let mut v = vec![OutputSpec {
            name: "last_hidden_state".into(),
            file_name: "last_hidden_state".into(),
            width: d,
            cols: tokens,
            padded: true,
        }];
        if self.pooler {
            v.push(super::encoder_output("pooler_output", d, 1));
        }
        v
    }
    fn pooled_output(&self) -> Option<Pooling> {
        Some(Pooling::Mean("last_hidden_state"))
    }
}

super::text::text_encoder_host!(BertConfig);

impl Build for BertConfig {
    fn layout(&self, ck: &Checkpoint, storage: Storage) -> Result<Vec<LayoutTensor>> {
        layout::layout(ck, self, storage)
    }
    fn builder_spec(&self) -> Value {
        serde_json::json!({
            "hidden_size": self.hidden_size,
            "num_heads": self.num_attention_heads,
            "depth": self.num_hidden_layers,
            "intermediate_size": self.intermediate_size,
            "hidden_act": self.hidden_act.hf_name(),
            "layer_norm_eps": self.layer_norm_eps,
            "pooler": self.pooler,
        })
    }
    /// The program's epsilon: the checkpoint's, at least
    /// [`super::text::MIN_PROGRAM_EPS`]. BERT's 1e-12 is 0 in fp16, where a LayerNorm of
    /// a constant column divides by zero (ANE-RULES R5); the builder
    /// (`bert.py`, `MIN_LN_EPS`) raises it to 1e-7, as Apple's ANE port of
    /// DistilBERT does (ml-ane-transformers, `huggingface/distilbert.py`).
    /// The fp32 reference keeps the checkpoint's; against hidden states of
    /// variance near 1 the two differ far below fp16's resolution, which
    /// the cosine gate's cases measure.
    fn layer_norm_eps(&self) -> f64 {
        self.layer_norm_eps.max(super::text::MIN_PROGRAM_EPS)
    }
}

impl Reference for BertConfig {
    fn oracle(&self, ck: &Checkpoint) -> Result<Oracle> {
        Ok(Oracle::Text(Arc::new(reference::BertEncoder::load(
            ck, self,
        )?)))
    }
}
