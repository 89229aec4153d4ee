//! DINOv2 (`dinov2`, `dinov2_with_registers`): its registry entry, and
//! [`Tower`] for its config, wiring the family's modules together: the
//! config in `config.rs`, the reference in `reference.rs`,
//! the layout in `layout.rs`, the host inputs in `host.rs`, the builder in
//! `python/ane_export/dinov2.py`.
//!
//! A fixed-resolution encoder: a bucket is a square side in pixels, any
//! multiple of the patch (by default the processor's crop size, 224 for the
//! released checkpoints, whose table is for 518): the host resamples the
//! position table to the bucket's grid, so several resolutions share one
//! package's weights. One image per call, no padding. Outputs under
//! transformers' names: `last_hidden_state [1 + R + N, D]` (class token,
//! registers, patches, after the final `layernorm`) and `pooler_output [1,
//! D]` (its class token). No language model: the task gate reads
//! `pooler_output`.

pub mod config;
pub mod host;
pub mod layout;
pub mod reference;

pub use config::Dinov2VisionConfig;

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
use crate::preprocess::{
    FixedResize, IMAGENET_MEAN, IMAGENET_STD, ImageProcessorConfig, PixelBatch,
};

pub const ENTRY: Entry = Entry {
    name: "dinov2",
    model_types: &["dinov2", "dinov2_with_registers"],
    parse: |path, v, _| Dinov2VisionConfig::from_json(path, v).map(VisionConfig::Dinov2),
    weights: WeightNames {
        // `Dinov2Model` and `Dinov2Backbone` save the tower at the top
        // level; the classification heads under the base model's prefix.
        prefixes: &["", "dinov2.", "dinov2_with_registers."],
        probe: "embeddings.patch_embeddings.projection.weight",
        extra: &[],
        // masked-image modelling's token: transformers uses it only with `bool_masked_pos`.
        unread: &["embeddings.mask_token"],
    },
    from_manifest: |v| super::config_from_manifest(v).map(VisionConfig::Dinov2),
    decoder: None,
    residual_scale: true,
    branch_scale: false,
};

impl Tower for Dinov2VisionConfig {
    fn family(&self) -> Family {
        Family(&ENTRY)
    }
    fn sizes(&self) -> Sizes {
        super::encoder_sizes(self.hidden_size, self.num_hidden_layers)
    }
    fn validate(&self) -> std::result::Result<(), FieldError> {
        Dinov2VisionConfig::validate(self)
    }
    fn output_names(&self) -> Vec<String> {
        self.outputs(0).into_iter().map(|o| o.name).collect()
    }
    fn outputs(&self, patches: usize) -> Vec<OutputSpec> {
        let d = self.hidden_size;
        let spec = |name: &str, cols| super::encoder_output(name, d, cols);
        vec![
            spec("last_hidden_state", self.tokens(patches)),
            spec("pooler_output", 1),
        ]
    }
    fn pooled_output(&self) -> Option<Pooling> {
        Some(Pooling::Output("pooler_output"))
    }
    fn bucket_slots(&self, b: &Bucket) -> std::result::Result<usize, BucketsError> {
        super::resampled_bucket_patches(self, b, self.image_size)
    }
    fn input(&self) -> Input<'_> {
        Input::Pixels(self)
    }
}

impl Pixels for Dinov2VisionConfig {
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
        // facebook/dinov2-*'s preprocessor_config.json (BitImageProcessor):
        // shortest edge 256, centre crop 224, bicubic, ImageNet mean and std.
        ImageProcessorConfig::fixed_processor(
            self.patch_size,
            FixedResize {
                shortest_edge: Some(256),
                size: (224, 224),
                crop: Some((224, 224)),
            },
            IMAGENET_MEAN,
            IMAGENET_STD,
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

super::encoder_host!(Dinov2VisionConfig);

impl Build for Dinov2VisionConfig {
    fn layout(&self, ck: &Checkpoint, storage: Storage) -> Result<Vec<LayoutTensor>> {
        layout::layout(ck, self, storage)
    }
    fn builder_spec(&self) -> Value {
        serde_json::json!({
            "hidden_size": self.hidden_size,
            "num_heads": self.num_attention_heads,
            "depth": self.num_hidden_layers,
            "mlp_hidden": self.mlp_hidden(),
            "patch_dim": 3 * self.patch_size * self.patch_size,
            "hidden_act": self.hidden_act.hf_name(),
            "swiglu": self.use_swiglu_ffn,
            "registers": self.num_register_tokens,
            "layer_norm_eps": self.layer_norm_eps,
        })
    }
    fn layer_norm_eps(&self) -> f64 {
        self.layer_norm_eps
    }
}

impl Reference for Dinov2VisionConfig {
    fn oracle(&self, ck: &Checkpoint) -> Result<Oracle> {
        Ok(Oracle::Vision(Arc::new(reference::Dinov2Tower::load(
            ck, self,
        )?)))
    }
}
