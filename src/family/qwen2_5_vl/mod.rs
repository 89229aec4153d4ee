//! Qwen2.5-VL (`qwen2_5_vl`): its registry entry, and the [`Tower`] traits for its config,
//! wiring the family's modules together: the config in
//! `config.rs`, the reference in `reference.rs`, the
//! layout in `layout.rs`, the host inputs in `host.rs`, the builder in
//! `python/ane_export/qwen2_5_vl.py`.

pub mod config;
pub mod host;
pub mod layout;
pub mod reference;

pub use config::Qwen25VisionConfig;

use std::sync::Arc;

use serde_json::Value;

use super::{
    Build, Decoder, Entry, Family, Host, Input, NamedShape, Oracle, PatchSizes, Pixels, Reference,
    Sizes, Tower, VisionConfig,
};
use crate::checkpoint::Checkpoint;
use crate::error::{BucketsError, FieldError, Result};
use crate::export::layout::{LayoutTensor, Storage};
use crate::host::{HostError, HostInputs, HostRecipe, HostTables};
use crate::preprocess::{CLIP_MEAN, CLIP_STD, ImageProcessorConfig, PixelBatch};

pub const ENTRY: Entry = Entry {
    name: "qwen2_5_vl",
    model_types: &["qwen2_5_vl", "qwen2_5_vl_vision"],
    parse: |path, v, _| Qwen25VisionConfig::from_json(path, v).map(VisionConfig::Qwen25Vl),
    weights: super::QWEN_WEIGHTS,
    from_manifest: |v| super::config_from_manifest(v).map(VisionConfig::Qwen25Vl),
    decoder: Some(Decoder::QWEN2),
    residual_scale: true,
    branch_scale: true,
};

impl Tower for Qwen25VisionConfig {
    fn family(&self) -> Family {
        Family(&ENTRY)
    }
    fn sizes(&self) -> Sizes {
        Sizes {
            hidden: self.hidden_size,
            out_hidden: self.out_hidden_size,
            depth: self.depth,
        }
    }
    fn validate(&self) -> std::result::Result<(), FieldError> {
        Qwen25VisionConfig::validate(self)
    }
    fn capacity_note(&self) -> Option<String> {
        Some(format!(
            "slots: every attention window of an image takes {} (window_size {} / patch_size {}, squared), \
             edge windows included; real merge units first, the rest padding",
            self.window_slots(),
            self.window_size,
            self.patch_size
        ))
    }
    fn check_bucket(&self, slots: usize) -> std::result::Result<(), BucketsError> {
        let s = self.window_slots();
        if slots.is_multiple_of(s) {
            Ok(())
        } else {
            Err(BucketsError::Slots(format!(
                "{slots} slots: a Qwen2.5-VL bucket holds whole windows of {s} slots (window_size {} / patch_size {}, squared)",
                self.window_size, self.patch_size
            )))
        }
    }
    fn input(&self) -> Input<'_> {
        Input::Pixels(self)
    }
}

impl Pixels for Qwen25VisionConfig {
    fn patches(&self) -> PatchSizes {
        PatchSizes {
            patch: self.patch_size,
            temporal_patch: self.temporal_patch_size,
            merge: self.spatial_merge_size,
        }
    }
    fn default_preprocessor(&self) -> ImageProcessorConfig {
        // Qwen2.5-VL-7B-Instruct's preprocessor_config.json.
        ImageProcessorConfig::qwen2_vl_processor(
            (
                self.patch_size,
                self.temporal_patch_size,
                self.spatial_merge_size,
            ),
            (3_136, 12_845_056),
            CLIP_MEAN,
            CLIP_STD,
        )
    }
    fn host_inputs(
        &self,
        recipe: &HostRecipe,
        _tables: &HostTables,
        batch: &PixelBatch,
        bucket: usize,
    ) -> std::result::Result<HostInputs, HostError> {
        host::host_inputs(batch, self, recipe, bucket)
    }
    fn slots(&self, grid_thw: &[[usize; 3]]) -> usize {
        host::slots_needed(self, grid_thw)
    }
}

impl Host for Qwen25VisionConfig {
    fn input_shapes(&self, patches: usize) -> Vec<NamedShape> {
        host::input_shapes(self, patches)
    }
    fn host_recipe(&self) -> HostRecipe {
        host::host_recipe(self)
    }
}

impl Build for Qwen25VisionConfig {
    fn layout(&self, ck: &Checkpoint, storage: Storage) -> Result<Vec<LayoutTensor>> {
        layout::layout(ck, self, storage)
    }
    fn builder_spec(&self) -> Value {
        serde_json::json!({
            "hidden_size": self.hidden_size,
            "num_heads": self.num_heads,
            "depth": self.depth,
            "out_hidden_size": self.out_hidden_size,
            "intermediate_size": self.intermediate_size,
            "window_slots": self.window_slots(),
            "fullatt_block_indexes": self.fullatt_block_indexes,
            "patch_dim": 3 * self.patch_size * self.patch_size,
            "hidden_act": self.hidden_act.hf_name(),
        })
    }
    fn layer_norm_eps(&self) -> f64 {
        config::RMS_NORM_EPS
    }
}

impl Reference for Qwen25VisionConfig {
    fn oracle(&self, ck: &Checkpoint) -> Result<Oracle> {
        Ok(Oracle::Vision(Arc::new(
            reference::Qwen25VisionTower::load(ck, self)?,
        )))
    }
}
