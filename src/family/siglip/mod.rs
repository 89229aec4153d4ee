//! SigLIP (`siglip`, `siglip_vision_model`): its registry entry, and
//! [`Tower`] for its config, wiring the family's modules together: the
//! config in `config.rs`, the reference in `reference.rs`,
//! the layout in `layout.rs`, the host inputs in `host.rs`, the builder in
//! `python/ane_export/siglip.py`.
//!
//! A fixed-resolution encoder like CLIP: a bucket is a square side in pixels
//! (by default the processor's size), one image per call, no padding, no
//! class token. Outputs under transformers' names: `last_hidden_state [N, D]`
//! (after `post_layernorm`) and, with the attention-pooling head,
//! `pooler_output [1, D]`. No language model: the task gate reads
//! `pooler_output`, or the mean of `last_hidden_state` without the head.

pub mod config;
pub mod host;
pub mod layout;
pub mod reference;

pub use config::SiglipVisionConfig;

use std::sync::Arc;

use serde_json::Value;

use super::{
    Build, Entry, Family, Input, Oracle, OutputSpec, PatchSizes, Pixels, Pooling, Reference, Sizes,
    Tower, VisionConfig, WeightNames,
};
use crate::buckets::Bucket;
use crate::checkpoint::Checkpoint;
use crate::error::{BucketsError, FieldError, Result};
use crate::export::layout::{LayoutTensor, Storage};
use crate::host::{HostError, HostInputs, HostRecipe, HostTables};
use crate::preprocess::{FixedResize, ImageProcessorConfig, PixelBatch};

pub const ENTRY: Entry = Entry {
    name: "siglip",
    model_types: &["siglip", "siglip_vision_model"],
    parse: |path, v, _| SiglipVisionConfig::from_json(path, v).map(VisionConfig::Siglip),
    weights: WeightNames {
        // `SiglipModel` puts the tower under `vision_model.`; transformers 5
        // saves a `SiglipVisionModel` without the prefix.
        prefixes: &["vision_model.", ""],
        probe: "embeddings.patch_embedding.weight",
        extra: &[],
        // a buffer older transformers saved (`arange`), which the embeddings recompute.
        unread: &["embeddings.position_ids"],
    },
    from_manifest: |v| super::config_from_manifest(v).map(VisionConfig::Siglip),
    decoder: None,
    residual_scale: true,
    branch_scale: false,
};

impl Tower for SiglipVisionConfig {
    fn family(&self) -> Family {
        Family(&ENTRY)
    }
    fn sizes(&self) -> Sizes {
        super::encoder_sizes(self.hidden_size, self.num_hidden_layers)
    }
    fn validate(&self) -> std::result::Result<(), FieldError> {
        SiglipVisionConfig::validate(self)
    }
    fn output_names(&self) -> Vec<String> {
        self.outputs(0).into_iter().map(|o| o.name).collect()
    }
    fn outputs(&self, patches: usize) -> Vec<OutputSpec> {
        let d = self.hidden_size;
        let spec = |name: &str, cols| super::encoder_output(name, d, cols);
        let mut v = vec![spec("last_hidden_state", patches)];
        if self.vision_use_head {
            v.push(spec("pooler_output", 1));
        }
        v
    }
    fn pooled_output(&self) -> Option<Pooling> {
        Some(Pooling::head_or_mean(self.vision_use_head))
    }
    fn bucket_slots(&self, b: &Bucket) -> std::result::Result<usize, BucketsError> {
        super::resampled_bucket_patches(self, b, self.image_size)
    }
    fn input(&self) -> Input<'_> {
        Input::Pixels(self)
    }
}

impl Pixels for SiglipVisionConfig {
    /// One image per call: a call runs one image of exactly the bucket's side.
    fn images_per_call(&self) -> Option<usize> {
        Some(1)
    }
    fn patches(&self) -> PatchSizes {
        super::encoder_patches(self.patch_size)
    }
    fn default_buckets(&self, pre: &ImageProcessorConfig) -> Option<Vec<Bucket>> {
        Some(super::fixed_default_buckets(pre, self.image_size))
    }
    fn default_preprocessor(&self) -> ImageProcessorConfig {
        // google/siglip-*'s preprocessor_config.json: resize to the image
        // size (no crop), bicubic, mean = std = 0.5.
        let s = self.image_size;
        ImageProcessorConfig::fixed_processor(
            self.patch_size,
            FixedResize {
                shortest_edge: None,
                size: (s, s),
                crop: None,
            },
            [0.5; 3],
            [0.5; 3],
        )
    }
    fn host_inputs(
        &self,
        recipe: &HostRecipe,
        tables: &HostTables,
        batch: &PixelBatch,
        bucket: usize,
    ) -> std::result::Result<HostInputs, HostError> {
        host::host(self).inputs(recipe, tables.get("pos_table")?, batch, bucket)
    }
}

super::encoder_host!(SiglipVisionConfig);

impl Build for SiglipVisionConfig {
    fn layout(&self, ck: &Checkpoint, storage: Storage) -> Result<Vec<LayoutTensor>> {
        layout::layout(ck, self, storage)
    }
    fn builder_spec(&self) -> Value {
        serde_json::json!({
            "hidden_size": self.hidden_size,
            "num_heads": self.num_attention_heads,
            "depth": self.num_hidden_layers,
            "intermediate_size": self.intermediate_size,
            "patch_dim": 3 * self.patch_size * self.patch_size,
            "hidden_act": self.hidden_act.hf_name(),
            "layer_norm_eps": self.layer_norm_eps,
            "use_head": self.vision_use_head,
        })
    }
    fn layer_norm_eps(&self) -> f64 {
        self.layer_norm_eps
    }
}

impl Reference for SiglipVisionConfig {
    fn oracle(&self, ck: &Checkpoint) -> Result<Oracle> {
        Ok(Oracle::Vision(Arc::new(
            reference::SiglipVisionTower::load(ck, self)?,
        )))
    }
}
