//! Tower families, registered in one place.
//!
//! A family is one folder, `family/<family>/`: its typed config
//! (`config.rs`), its fp32 reference tower (`reference.rs`), its ANE layout
//! (`layout.rs`), its host inputs (`host.rs`), and `mod.rs`, its registry entry and the
//! traits of [`Tower`] (split by concern in `tower.rs`) wiring those
//! together; beside it, its MIL builder (`python/ane_export/<family>.py`).
//! The reference shares nothing with the layout and the host inputs
//! (tests/it/layering.rs).
//!
//! This module is the only place that chooses among families: a
//! checkpoint's `model_type` (or an artifact's `family`) picks an [`Entry`]
//! of [`REGISTRY`] once ([`Model::resolve`]), and every layer asks the parsed
//! [`VisionConfig`] (through [`Tower`]) for the family's behaviour; what a
//! tower reads is its [`Input`] modality. Nothing else in the code names a
//! family.
//!
//! Adding a family: write its folder, add a variant to [`VisionConfig`] and
//! its arm in [`VisionConfig::tower`], and an entry to [`REGISTRY`].

pub mod bert;
pub mod clip;
pub mod dinov2;
pub mod modernbert;
pub mod qwen2_5_vl;
pub mod qwen2_vl;
pub mod qwen3_vl;
pub mod siglip;
pub mod siglip2;
pub mod text;
mod tower;

pub use tower::{
    Build, Host, Input, NamedShape, Oracle, OutputSpec, PatchSizes, Pixels, Pooling, Reference,
    SentenceMode, SentencePooling, Sizes, Tokens, Tower,
};
pub(crate) use tower::{
    config_from_manifest, encoder_host, encoder_output, encoder_patches, encoder_sizes,
    fixed_default_buckets, resampled_bucket_patches,
};

use std::path::Path;
use std::sync::Arc;

use serde::Serialize;
use serde_json::Value;

use crate::checkpoint::Checkpoint;
pub use crate::checkpoint::WeightNames;
use crate::error::{Error, FieldError, Result};
pub use crate::lm::Decoder;
use crate::preprocess::{ImageProcessorConfig, TextProcessor};
use crate::reference::{TextEncoder, VisionTower};
use bert::BertConfig;
use clip::ClipVisionConfig;
use dinov2::Dinov2VisionConfig;
use modernbert::ModernBertConfig;
use qwen2_5_vl::Qwen25VisionConfig;
use qwen2_vl::Qwen2VisionConfig;
use qwen3_vl::Qwen3VisionConfig;
use siglip::SiglipVisionConfig;
use siglip2::Siglip2VisionConfig;

/// Parse a checkpoint's `config.json` (its path, its JSON, and whether the
/// checkpoint holds a tensor of a given full name) into the family's config.
pub type ParseConfig = fn(&Path, &Value, &dyn Fn(&str) -> bool) -> Result<VisionConfig>;

/// A registered family: its name and how to read its config.
pub struct Entry {
    /// The family's name in manifests (`family`) and in the Python package
    /// (`ane_export.<name>`).
    pub name: &'static str,
    /// `config.json` `model_type`s whose vision tower is this family's.
    pub model_types: &'static [&'static str],
    /// Parse the vision config of a checkpoint's `config.json` (`path`
    /// names the file in errors); `has` tells whether the checkpoint holds
    /// a tensor (its full name), for what the config does not say (CLIP's
    /// optional projection).
    pub parse: ParseConfig,
    /// Where the tower's tensors are in a checkpoint.
    pub weights: WeightNames,
    /// Read and validate the vision config a manifest records (`config`);
    /// the error is the message naming the field.
    pub from_manifest: fn(&Value) -> std::result::Result<VisionConfig, FieldError>,
    /// How the family's language model differs from Qwen3-VL's (what
    /// `src/lm` runs for `ane-run vqa` and the VQA gate); `None` for an
    /// encoder without one.
    pub decoder: Option<Decoder>,
    /// Whether the family's builder can carry the residual stream scaled
    /// down (`build --residual-scale`).
    pub residual_scale: bool,
    /// Whether the family's builder can carry its MLP's hidden layer
    /// scaled down (`build --branch-scale`): a SwiGLU MLP's product
    /// (Qwen2.5-VL), a GELU MLP's fc1 output (Qwen3-VL, Qwen2-VL).
    pub branch_scale: bool,
}

/// The Qwen-VL checkpoints' tower (`model.visual.`, `visual.`, or a tower-only checkpoint).
pub const QWEN_WEIGHTS: WeightNames = WeightNames {
    prefixes: &["model.visual.", "visual.", ""],
    probe: "patch_embed.proj.weight",
    extra: &[],
    unread: &[],
};

/// Every family this version supports.
pub const REGISTRY: &[Entry] = &[
    qwen3_vl::ENTRY,
    qwen2_5_vl::ENTRY,
    qwen2_vl::ENTRY,
    clip::ENTRY,
    siglip::ENTRY,
    siglip2::ENTRY,
    dinov2::ENTRY,
    bert::ENTRY,
    modernbert::ENTRY,
];

/// Every supported `model_type`, for messages.
pub fn supported_model_types() -> Vec<&'static str> {
    REGISTRY
        .iter()
        .flat_map(|e| e.model_types.iter().copied())
        .collect()
}

/// A family, as the registry names it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Family(&'static Entry);

impl PartialEq for Entry {
    fn eq(&self, other: &Self) -> bool {
        self.name == other.name
    }
}
impl Eq for Entry {}
impl std::fmt::Debug for Entry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name)
    }
}

impl Serialize for Family {
    fn serialize<S: serde::Serializer>(&self, s: S) -> std::result::Result<S::Ok, S::Error> {
        s.serialize_str(self.0.name)
    }
}

impl Family {
    /// The family of a `model_type`, or a clear error naming what is supported.
    pub fn from_model_type(path: &Path, model_type: &str) -> Result<Family> {
        if let Some(e) = REGISTRY
            .iter()
            .find(|e| e.model_types.contains(&model_type))
        {
            return Ok(Family(e));
        }
        Err(Error::UnsupportedModel {
            path: path.to_path_buf(),
            model_type: model_type.to_string(),
            supported: supported_model_types().join(", "),
        })
    }

    /// The family an artifact's manifest names, if this version knows it.
    pub fn from_name(name: &str) -> Option<Family> {
        REGISTRY.iter().find(|e| e.name == name).map(Family)
    }

    /// The family's name in manifests.
    pub fn name(self) -> &'static str {
        self.0.name
    }

    /// The family's language model, if it has one.
    pub fn decoder(self) -> Option<Decoder> {
        self.0.decoder
    }

    /// Whether the family's builder can carry the residual stream scaled
    /// down (`build --residual-scale`).
    pub fn residual_scale(self) -> bool {
        self.0.residual_scale
    }

    /// The families whose builders can, for messages.
    pub fn residual_scale_families() -> Vec<&'static str> {
        REGISTRY
            .iter()
            .filter(|e| e.residual_scale)
            .map(|e| e.name)
            .collect()
    }

    /// Whether the family's builder can carry its MLP's hidden layer
    /// scaled down (`build --branch-scale`).
    pub fn branch_scale(self) -> bool {
        self.0.branch_scale
    }

    /// The families whose builders can, for messages.
    pub fn branch_scale_families() -> Vec<&'static str> {
        REGISTRY
            .iter()
            .filter(|e| e.branch_scale)
            .map(|e| e.name)
            .collect()
    }

    /// The Python module that builds the family's programs.
    pub fn python_module(self) -> String {
        format!("ane_export.{}", self.name())
    }

    /// Parse the vision config of a checkpoint's `config.json` (`path`
    /// names it in errors; `has` whether the checkpoint holds a tensor).
    pub fn vision_config(
        self,
        path: &Path,
        config_json: &Value,
        has: &dyn Fn(&str) -> bool,
    ) -> Result<VisionConfig> {
        (self.0.parse)(path, config_json, has)
    }

    /// Where the family's tower tensors are in a checkpoint.
    pub fn weights(self) -> &'static WeightNames {
        &self.0.weights
    }

    /// The vision config a manifest records (`config`), validated; the
    /// error is the message for the field.
    pub fn manifest_config(self, v: &Value) -> std::result::Result<VisionConfig, FieldError> {
        (self.0.from_manifest)(v)
    }
}

/// A family's vision config. Serialised as the family's own config (the
/// manifest's `config`), the family being recorded beside it.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(untagged)]
pub enum VisionConfig {
    Qwen3Vl(Qwen3VisionConfig),
    Qwen2Vl(Qwen2VisionConfig),
    Qwen25Vl(Qwen25VisionConfig),
    Clip(ClipVisionConfig),
    Siglip(SiglipVisionConfig),
    Siglip2(Siglip2VisionConfig),
    Dinov2(Dinov2VisionConfig),
    Bert(BertConfig),
    ModernBert(ModernBertConfig),
}

impl VisionConfig {
    /// The family's behaviour for this config.
    pub fn tower(&self) -> &(dyn Tower + 'static) {
        match self {
            VisionConfig::Qwen3Vl(c) => c,
            VisionConfig::Qwen2Vl(c) => c,
            VisionConfig::Qwen25Vl(c) => c,
            VisionConfig::Clip(c) => c,
            VisionConfig::Siglip(c) => c,
            VisionConfig::Siglip2(c) => c,
            VisionConfig::Dinov2(c) => c,
            VisionConfig::Bert(c) => c,
            VisionConfig::ModernBert(c) => c,
        }
    }
}

impl VisionConfig {
    /// Preprocess for a bucket of `capacity` slots: `run` preprocesses with
    /// `pre` capped at `capacity * P^2` pixels (per image, as the processor's
    /// `max_pixels` is) and returns its result with the images' grids. When
    /// the family's layout gives an image more slots than its patches (the
    /// padded windows of Qwen2.5-VL) and one image then overflows the
    /// bucket, `run` is asked again with a smaller budget, up to 8 times.
    /// For families with a slot per patch that never happens, so they are
    /// run once. Whether all the images of a call fit together is the
    /// caller's to check.
    pub fn fitting<T>(
        &self,
        pre: &ImageProcessorConfig,
        capacity: usize,
        mut run: impl FnMut(&ImageProcessorConfig) -> Result<(T, Vec<[usize; 3]>)>,
    ) -> Result<T> {
        let px = self.pixels()?;
        if let Some(f) = &pre.fixed {
            // A fixed-resolution bucket is a square of `capacity` patches:
            // the processor's resize and crop, scaled to its side.
            let side = (capacity as f64).sqrt().round() as usize * px.patch_size();
            let mut c = pre.clone();
            c.fixed = Some(f.scaled_to(side));
            return run(&c).map(|(t, _)| t);
        }
        if let Some(n) = pre.max_num_patches {
            // A NaFlex budget: the processor's, within the bucket. The
            // resize fits it exactly, so one run.
            let mut c = pre.clone();
            c.max_num_patches = Some(n.min(capacity));
            return run(&c).map(|(t, _)| t);
        }
        let p = px.patch_size() as u64;
        let mut budget = capacity as u64 * p * p;
        let mut last = None;
        for _ in 0..8 {
            let mut c = pre.clone();
            c.max_pixels = c.max_pixels.min(budget);
            c.min_pixels = c.min_pixels.min(c.max_pixels);
            let (t, grid) = run(&c)?;
            let worst = grid.iter().map(|g| px.slots(&[*g])).max().unwrap_or(0);
            if worst <= capacity {
                return Ok(t);
            }
            budget = ((c.max_pixels as f64) * (capacity as f64 / worst as f64) * 0.97) as u64;
            last = Some(t);
        }
        Ok(last.expect("at least one run"))
    }
}

impl VisionConfig {
    /// The image modality, or the error that this tower reads text.
    pub fn pixels(&self) -> Result<&dyn Pixels> {
        self.input().pixels().ok_or_else(|| {
            Error::Invalid(format!(
                "a {} model is a text encoder: it takes text (--text), not images",
                self.family().name()
            ))
        })
    }

    /// The text modality, or the error that this tower reads images.
    pub fn tokens(&self) -> Result<&dyn Tokens> {
        self.input().tokens().ok_or_else(|| {
            Error::Invalid(format!(
                "a {} model is an image tower: it takes images, not text",
                self.family().name()
            ))
        })
    }
}

impl std::ops::Deref for VisionConfig {
    type Target = dyn Tower;
    fn deref(&self) -> &(dyn Tower + 'static) {
        self.tower()
    }
}

/// The decoder of a checkpoint's `model_type` (`path` names its
/// `config.json`): its family's, or an error for a family without a
/// language model. What [`crate::lm::Vlm::load`] asks.
pub fn decoder(path: &Path, model_type: &str) -> Result<Decoder> {
    let family = Family::from_model_type(path, model_type)?;
    family.decoder().ok_or_else(|| {
        Error::config(
            path,
            format!(
                "field `model_type`: `{model_type}` is a {} encoder: it has no language model",
                family.name()
            ),
        )
    })
}

/// The fp32 reference of a checkpoint, for its family and modality.
/// A checkpoint whose tower tensors are not all read by it (its config
/// describes fewer layers than it saved) is an error naming them.
pub fn oracle(m: &Model) -> Result<Oracle> {
    let oracle = m.vision.oracle(&m.checkpoint)?;
    m.checkpoint.check_all_read()?;
    Ok(oracle)
}

/// The fp32 reference tower of an image model; an error for a text encoder.
pub fn reference_tower(m: &Model) -> Result<Arc<dyn VisionTower>> {
    m.vision.pixels()?;
    match oracle(m)? {
        Oracle::Vision(t) => Ok(t),
        Oracle::Text(_) => Err(Error::Invalid("not an image tower".into())),
    }
}

/// The fp32 reference encoder of a text model; an error for an image tower.
pub fn text_encoder(m: &Model) -> Result<Arc<dyn TextEncoder>> {
    m.vision.tokens()?;
    match oracle(m)? {
        Oracle::Text(t) => Ok(t),
        Oracle::Vision(_) => Err(Error::Invalid("not a text encoder".into())),
    }
}

/// What turns a user's input into a call: an image processor, or a
/// text encoder's tokenizer.
#[derive(Clone, Debug)]
pub enum Processor {
    Image(ImageProcessorConfig),
    /// Boxed: a tokenizer is ten times an image processor's size.
    Text(Box<TextProcessor>),
}

/// A checkpoint with its family resolved: the family, its vision config and
/// the image processor, the tower's tensors selected. Reads as the
/// [`Checkpoint`] it holds (its directory, its tensors).
pub struct Model {
    pub checkpoint: Checkpoint,
    pub family: Family,
    /// The vision config of the checkpoint's family.
    pub vision: VisionConfig,
    /// The image processor (`preprocessor_config.json`, else the family's
    /// default) or the tokenizer (`tokenizer.json`).
    pub processor: Processor,
    /// Whether `preprocessor_config.json` existed (else the family's
    /// default processor is used).
    pub has_preprocessor_config: bool,
}

impl Model {
    /// The image processor, or the error that this is a text encoder.
    pub fn image_processor(&self) -> Result<&ImageProcessorConfig> {
        self.vision.pixels()?;
        match &self.processor {
            Processor::Image(p) => Ok(p),
            Processor::Text(_) => Err(Error::Invalid("no image processor".into())),
        }
    }

    /// The tokenizer, or the error that this is an image tower.
    pub fn text_processor(&self) -> Result<&TextProcessor> {
        self.vision.tokens()?;
        match &self.processor {
            Processor::Text(p) => Ok(p),
            Processor::Image(_) => Err(Error::Invalid("no tokenizer".into())),
        }
    }
}

impl std::ops::Deref for Model {
    type Target = Checkpoint;
    fn deref(&self) -> &Checkpoint {
        &self.checkpoint
    }
}

impl Model {
    /// Open a model directory and resolve its family.
    pub fn open(dir: &Path) -> Result<Model> {
        Model::resolve(Checkpoint::open(dir)?)
    }

    /// Resolve a checkpoint's family, once: its `model_type` picks the
    /// registry entry, which finds the tower's tensors and parses the vision
    /// config and `preprocessor_config.json` (checked against the config).
    pub fn resolve(mut ck: Checkpoint) -> Result<Model> {
        let family = Family::from_model_type(&ck.config_path, &ck.model_type)?;
        ck.select_tower(family.weights())?;
        let vision =
            family.vision_config(&ck.config_path, &ck.config, &|n| ck.weights.contains(n))?;
        let px = match vision.input() {
            Input::Pixels(px) => px,
            Input::Tokens(_) => {
                let processor = Processor::Text(Box::new(TextProcessor::open_dir(&ck.dir)?));
                return Ok(Model {
                    checkpoint: ck,
                    family,
                    vision,
                    processor,
                    has_preprocessor_config: false,
                });
            }
        };
        let defaults = px.default_preprocessor();
        let pp_path = ck.dir.join("preprocessor_config.json");
        let has_pp = pp_path.is_file();
        let preprocessor = if has_pp {
            let text = std::fs::read_to_string(&pp_path).map_err(|e| Error::io(&pp_path, e))?;
            let p = ImageProcessorConfig::from_json(&pp_path, &text, &defaults)?;
            let want = (px.patch_size(), px.temporal_patch_size(), px.merge_size());
            if (p.patch_size, p.temporal_patch_size, p.merge_size) != want {
                return Err(Error::config(
                    &pp_path,
                    format!(
                        "patch/temporal/merge sizes ({}, {}, {}) disagree with config.json ({}, {}, {})",
                        p.patch_size, p.temporal_patch_size, p.merge_size, want.0, want.1, want.2
                    ),
                ));
            }
            p
        } else {
            defaults
        };
        Ok(Model {
            checkpoint: ck,
            family,
            vision,
            processor: Processor::Image(preprocessor),
            has_preprocessor_config: has_pp,
        })
    }
}
