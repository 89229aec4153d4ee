//! Qwen3-VL (`qwen3_vl`, `qwen3_vl_moe`): its registry entry, and the [`Tower`]
//! traits for its config, wiring the family's modules together: the config in
//! `config.rs`, the reference in `reference.rs`, the
//! layout in `layout.rs`, the host inputs in `host.rs`, the builder in
//! `python/ane_export/qwen3_vl.py`.

pub mod config;
pub mod host;
pub mod layout;
pub mod reference;

pub use config::Qwen3VisionConfig;

use std::sync::Arc;

use serde_json::Value;

use super::{
    Build, Decoder, Entry, Family, Host, Input, NamedShape, Oracle, PatchSizes, Pixels, Reference,
    Sizes, Tower, VisionConfig,
};
use crate::checkpoint::Checkpoint;
use crate::error::{FieldError, Result};
use crate::export::layout::{LayoutTensor, Storage};
use crate::host::{HostError, HostInputs, HostRecipe, HostTable, HostTables};
use crate::preprocess::{ImageProcessorConfig, PixelBatch};

pub const ENTRY: Entry = Entry {
    name: "qwen3_vl",
    model_types: &["qwen3_vl", "qwen3_vl_moe", "qwen3_vl_vision"],
    parse: |path, v, _| Qwen3VisionConfig::from_json(path, v).map(VisionConfig::Qwen3Vl),
    weights: super::QWEN_WEIGHTS,
    from_manifest: |v| super::config_from_manifest(v).map(VisionConfig::Qwen3Vl),
    decoder: Some(Decoder::QWEN3_VL),
    residual_scale: true,
    branch_scale: true,
};

impl Tower for Qwen3VisionConfig {
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
        Qwen3VisionConfig::validate(self)
    }
    fn output_names(&self) -> Vec<String> {
        std::iter::once("embeds".to_string())
            .chain((0..self.deepstack_visual_indexes.len()).map(|j| format!("deepstack_{j}")))
            .collect()
    }
    fn input(&self) -> Input<'_> {
        Input::Pixels(self)
    }
}

impl Pixels for Qwen3VisionConfig {
    fn patches(&self) -> PatchSizes {
        PatchSizes {
            patch: self.patch_size,
            temporal_patch: self.temporal_patch_size,
            merge: self.spatial_merge_size,
        }
    }
    fn default_preprocessor(&self) -> ImageProcessorConfig {
        ImageProcessorConfig::qwen2_vl_processor(
            (
                self.patch_size,
                self.temporal_patch_size,
                self.spatial_merge_size,
            ),
            (65_536, 16_777_216),
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
        host::host_inputs(batch, self, recipe, tables.get("pos_table")?, bucket)
    }
}

impl Host for Qwen3VisionConfig {
    fn input_shapes(&self, patches: usize) -> Vec<NamedShape> {
        host::input_shapes(self, patches)
    }
    fn host_recipe(&self) -> HostRecipe {
        host::host_recipe(self)
    }
    fn host_table_shapes(&self) -> Vec<NamedShape> {
        host::table_shapes(self)
    }
    fn host_tables(&self, ck: &Checkpoint) -> Result<Vec<HostTable>> {
        host::tables(ck, self)
    }
}

impl Build for Qwen3VisionConfig {
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
            "deepstack_visual_indexes": self.deepstack_visual_indexes,
            "patch_dim": 3 * self.patch_size * self.patch_size,
            "hidden_act": self.hidden_act.hf_name(),
        })
    }
    fn layer_norm_eps(&self) -> f64 {
        config::LAYER_NORM_EPS
    }
}

impl Reference for Qwen3VisionConfig {
    fn oracle(&self, ck: &Checkpoint) -> Result<Oracle> {
        Ok(Oracle::Vision(Arc::new(reference::Qwen3VisionTower::load(
            ck, self,
        )?)))
    }
}
