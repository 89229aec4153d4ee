//! SigLIP2 with NaFlex (`siglip2`, `siglip2_vision_model`): its registry
//! entry, and the [`Tower`] traits for its config, wiring the family's modules
//! together: the config in `config.rs`, the reference in
//! `reference.rs` (SigLIP's tower with a Linear patch embedding and
//! a resized table), the layout in `layout.rs`, the host inputs in `host.rs`, the
//! builder in `python/ane_export/siglip2.py`.
//!
//! A bucket is a patch budget like Qwen's (`patches`): an image is resized
//! by SigLIP2's processor (aspect ratio kept, sides multiples of the patch)
//! to at most the processor's `max_num_patches`, capped by the bucket, and
//! runs in the smallest bucket that holds it; the rest of the bucket is
//! padding the host masks. One image per call. Outputs under transformers'
//! names: `last_hidden_state [N, D]` (the image's `h * w` tokens in the
//! first columns) and, with the head, `pooler_output [1, D]`. No language
//! model: the task gate reads `pooler_output`, or the mean of
//! `last_hidden_state` without the head.

pub mod config;
pub mod host;
pub mod layout;
pub mod reference;

pub use config::Siglip2VisionConfig;

use std::sync::Arc;

use serde_json::Value;

use super::{
    Build, Entry, Family, Input, Oracle, OutputSpec, PatchSizes, Pixels, Pooling, Reference, Sizes,
    Tower, VisionConfig, WeightNames,
};
use crate::checkpoint::Checkpoint;
use crate::error::{FieldError, Result};
use crate::export::layout::{LayoutTensor, Storage};
use crate::host::{HostError, HostInputs, HostRecipe, HostTables};
use crate::preprocess::{ImageProcessorConfig, PixelBatch};

pub const ENTRY: Entry = Entry {
    name: "siglip2",
    model_types: &["siglip2", "siglip2_vision_model"],
    parse: |path, v, _| Siglip2VisionConfig::from_json(path, v).map(VisionConfig::Siglip2),
    weights: WeightNames {
        // `Siglip2Model` puts the tower under `vision_model.`; transformers 5
        // saves a `Siglip2VisionModel` without the prefix.
        prefixes: &["vision_model.", ""],
        probe: "embeddings.patch_embedding.weight",
        extra: &[],
        unread: &[],
    },
    from_manifest: |v| super::config_from_manifest(v).map(VisionConfig::Siglip2),
    decoder: None,
    residual_scale: true,
    branch_scale: false,
};

impl Tower for Siglip2VisionConfig {
    fn family(&self) -> Family {
        Family(&ENTRY)
    }
    fn sizes(&self) -> Sizes {
        super::encoder_sizes(self.hidden_size, self.num_hidden_layers)
    }
    fn validate(&self) -> std::result::Result<(), FieldError> {
        Siglip2VisionConfig::validate(self)
    }
    fn output_names(&self) -> Vec<String> {
        self.outputs(0).into_iter().map(|o| o.name).collect()
    }
    fn outputs(&self, patches: usize) -> Vec<OutputSpec> {
        let d = self.hidden_size;
        let mut v = vec![OutputSpec {
            padded: true,
            ..super::encoder_output("last_hidden_state", d, patches)
        }];
        if self.vision_use_head {
            v.push(super::encoder_output("pooler_output", d, 1));
        }
        v
    }
    fn pooled_output(&self) -> Option<Pooling> {
        Some(Pooling::head_or_mean(self.vision_use_head))
    }
    fn capacity_note(&self) -> Option<String> {
        Some(
            "patch budget of one image (transformers' max_num_patches); the columns past the \
             image's patches are padding"
                .into(),
        )
    }
    fn input(&self) -> Input<'_> {
        Input::Pixels(self)
    }
}

impl Pixels for Siglip2VisionConfig {
    /// One image per call: a NaFlex call runs one image, its tokens padded to the bucket.
    fn images_per_call(&self) -> Option<usize> {
        Some(1)
    }
    fn patches(&self) -> PatchSizes {
        super::encoder_patches(self.patch_size)
    }
    fn default_preprocessor(&self) -> ImageProcessorConfig {
        // google/siglip2-*-naflex's preprocessor_config.json.
        ImageProcessorConfig::naflex_processor(self.patch_size, 256)
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

super::encoder_host!(Siglip2VisionConfig);

impl Build for Siglip2VisionConfig {
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

impl Reference for Siglip2VisionConfig {
    fn oracle(&self, ck: &Checkpoint) -> Result<Oracle> {
        Ok(Oracle::Vision(Arc::new(reference::load(ck, self)?)))
    }
}
