//! CLIP (`clip`, `clip_vision_model`): its registry entry, and [`Tower`] for
//! its config, wiring the family's modules together: the config in
//! `config.rs`, the reference in `reference.rs`, the layout
//! in `layout.rs`, the host inputs in `host.rs`, the builder in
//! `python/ane_export/clip.py`.
//!
//! A fixed-resolution encoder: a bucket is a square side in pixels
//! (`pixels` in buckets.yaml; by default the processor's crop size), one
//! image per call, no padding. Outputs under transformers' names:
//! `last_hidden_state [N + 1, D]` (class token first), `pooler_output
//! [1, D]`, and `image_embeds [1, projection_dim]` when the checkpoint has
//! `visual_projection`. No language model: the VQA gate does not apply.

pub mod config;
pub mod host;
pub mod layout;
pub mod reference;

pub use config::ClipVisionConfig;

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
use crate::preprocess::{CLIP_MEAN, CLIP_STD, FixedResize, ImageProcessorConfig, PixelBatch};
use config::PROJECTION;

pub const ENTRY: Entry = Entry {
    name: "clip",
    model_types: &["clip", "clip_vision_model"],
    parse: |path, v, has| {
        ClipVisionConfig::from_json(path, v, has(PROJECTION)).map(VisionConfig::Clip)
    },
    weights: WeightNames {
        // Released checkpoints (and transformers 5's `CLIPModel`) put the
        // tower under `vision_model.`; transformers 5 saves a
        // `CLIPVisionModel` without the prefix.
        prefixes: &["vision_model.", ""],
        probe: "embeddings.patch_embedding.weight",
        extra: &[PROJECTION],
        // a buffer older transformers saved (`arange`), which the embeddings recompute.
        unread: &["embeddings.position_ids"],
    },
    from_manifest: |v| super::config_from_manifest(v).map(VisionConfig::Clip),
    decoder: None,
    residual_scale: true,
    branch_scale: false,
};

impl Tower for ClipVisionConfig {
    fn family(&self) -> Family {
        Family(&ENTRY)
    }
    fn sizes(&self) -> Sizes {
        super::encoder_sizes(self.hidden_size, self.num_hidden_layers)
    }
    fn validate(&self) -> std::result::Result<(), FieldError> {
        ClipVisionConfig::validate(self)
    }
    fn output_names(&self) -> Vec<String> {
        self.outputs(0).into_iter().map(|o| o.name).collect()
    }
    fn outputs(&self, patches: usize) -> Vec<OutputSpec> {
        let d = self.hidden_size;
        let spec = super::encoder_output;
        let mut v = vec![
            spec("last_hidden_state", d, patches + 1),
            spec("pooler_output", d, 1),
        ];
        if let Some(p) = self.projection_dim {
            v.push(spec("image_embeds", p, 1));
        }
        v
    }
    fn pooled_output(&self) -> Option<Pooling> {
        Some(Pooling::Output("pooler_output"))
    }
    fn bucket_slots(&self, b: &Bucket) -> std::result::Result<usize, BucketsError> {
        super::resampled_bucket_patches(self, b, self.image_size)
    }
    fn residual_outputs(&self) -> Vec<&'static str> {
        vec!["last_hidden_state"]
    }
    fn input(&self) -> Input<'_> {
        Input::Pixels(self)
    }
}

impl Pixels for ClipVisionConfig {
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
        // openai/clip-vit-*'s preprocessor_config.json: shortest edge to the
        // image size, centre crop, bicubic, OpenAI's mean and std.
        let s = self.image_size;
        ImageProcessorConfig::fixed_processor(
            self.patch_size,
            FixedResize {
                shortest_edge: Some(s),
                size: (s, s),
                crop: Some((s, s)),
            },
            CLIP_MEAN,
            CLIP_STD,
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

super::encoder_host!(ClipVisionConfig);

impl Build for ClipVisionConfig {
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
            "projection_dim": self.projection_dim,
        })
    }
    fn layer_norm_eps(&self) -> f64 {
        self.layer_norm_eps
    }
}

impl Reference for ClipVisionConfig {
    fn oracle(&self, ck: &Checkpoint) -> Result<Oracle> {
        Ok(Oracle::Vision(Arc::new(reference::ClipVisionTower::load(
            ck, self,
        )?)))
    }
}
