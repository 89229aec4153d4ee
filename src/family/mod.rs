//! Tower families, registered in one place.
//!
//! A family is a set of modules, one in each layer that needs one: its
//! typed vision config (`checkpoint/<family>.rs`), its fp32 reference tower
//! (`reference/<family>.rs`), its ANE layout and host inputs
//! (`export/<family>.rs`), its MIL builder (`python/ane_export/<family>.py`),
//! and this directory's `<family>.rs`, which implements [`Tower`] by wiring
//! those modules together. This module is the only place that chooses among
//! families: a checkpoint's `model_type` (or an artifact's `family`) picks an
//! [`Entry`] of [`REGISTRY`] once, and every layer asks the parsed
//! [`VisionConfig`] (through [`Tower`]) for the family's behaviour. Nothing
//! else in the code names a family.
//!
//! Adding a family: write its modules in each layer, add a variant to
//! [`VisionConfig`] and its arm in [`VisionConfig::tower`], and an entry to
//! [`REGISTRY`]. ARCHITECTURE.md lists the files a family touches.

pub mod clip;
pub mod dinov2;
pub mod qwen2_5_vl;
pub mod qwen2_vl;
pub mod qwen3_vl;
pub mod siglip;
pub mod siglip2;

use std::path::Path;
use std::sync::Arc;

use serde::Serialize;
use serde_json::Value;

use crate::buckets::Bucket;
use crate::checkpoint::Checkpoint;
pub use crate::checkpoint::WeightNames;
use crate::error::{Error, Result};
use crate::export::layout::{LayoutTensor, Storage};
use crate::host::{HostInputs, HostRecipe, HostTable, HostTables};
pub use crate::lm::Decoder;
use crate::preprocess::{ImageProcessorConfig, PixelBatch};
use crate::reference::VisionTower;
use clip::ClipVisionConfig;
use dinov2::Dinov2VisionConfig;
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
    pub from_manifest: fn(&Value) -> std::result::Result<VisionConfig, String>,
    /// How the family's language model differs from Qwen3-VL's (what
    /// `src/lm` runs for `ane-run vqa` and the VQA gate); `None` for an
    /// encoder without one.
    pub decoder: Option<Decoder>,
    /// Whether the family's builder can carry the residual stream scaled
    /// down (`build --residual-scale`).
    pub residual_scale: bool,
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
    pub fn manifest_config(self, v: &Value) -> std::result::Result<VisionConfig, String> {
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
        if let Some(f) = &pre.fixed {
            // A fixed-resolution bucket is a square of `capacity` patches:
            // the processor's resize and crop, scaled to its side.
            let side = (capacity as f64).sqrt().round() as usize * self.patch_size();
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
        let p = self.patch_size() as u64;
        let mut budget = capacity as u64 * p * p;
        let mut last = None;
        for _ in 0..8 {
            let mut c = pre.clone();
            c.max_pixels = c.max_pixels.min(budget);
            c.min_pixels = c.min_pixels.min(c.max_pixels);
            let (t, grid) = run(&c)?;
            let worst = grid.iter().map(|g| self.slots(&[*g])).max().unwrap_or(0);
            if worst <= capacity {
                return Ok(t);
            }
            budget = ((c.max_pixels as f64) * (capacity as f64 / worst as f64) * 0.97) as u64;
            last = Some(t);
        }
        Ok(last.expect("at least one run"))
    }
}

impl std::ops::Deref for VisionConfig {
    type Target = dyn Tower;
    fn deref(&self) -> &(dyn Tower + 'static) {
        self.tower()
    }
}

/// Where the task gate finds an image's embedding among a family's outputs
/// (by their file names).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Pooling {
    /// An output of one row (CLIP's and SigLIP's `pooler_output`).
    Output(&'static str),
    /// The mean over the rows of an output (a SigLIP without its head).
    Mean(&'static str),
}

impl Pooling {
    /// SigLIP's and SigLIP2's: the attention-pooling head's `pooler_output`
    /// with the head, else the mean of `last_hidden_state`.
    pub fn head_or_mean(use_head: bool) -> Pooling {
        if use_head {
            Pooling::Output("pooler_output")
        } else {
            Pooling::Mean("last_hidden_state")
        }
    }

    /// The output it reads.
    pub fn output(self) -> &'static str {
        match self {
            Pooling::Output(n) | Pooling::Mean(n) => n,
        }
    }

    /// The embedding from that output's rows `[rows, width]`.
    pub fn pool(self, values: &[f32], width: usize) -> Vec<f32> {
        match self {
            Pooling::Output(_) => values.to_vec(),
            Pooling::Mean(_) => {
                let rows = values.len() / width.max(1);
                let mut m = vec![0f64; width];
                for r in values.chunks_exact(width) {
                    for (a, v) in m.iter_mut().zip(r) {
                        *a += *v as f64;
                    }
                }
                m.iter().map(|v| (*v / rows.max(1) as f64) as f32).collect()
            }
        }
    }
}

impl std::fmt::Display for Pooling {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Pooling::Output(n) => f.write_str(n),
            Pooling::Mean(n) => write!(f, "mean of {n}"),
        }
    }
}

/// A fixed-resolution encoder's bucket (`pixels` only; the host resamples
/// the position table to its grid): its patch count, `(side / patch)^2`,
/// for a side that is a positive multiple of the patch, or the
/// checkpoint's own `image_size` (whose remainder the patch embedding drops,
/// as so400m's 384 px at patch 14).
pub(crate) fn resampled_bucket_patches(
    t: &dyn Tower,
    b: &Bucket,
    image_size: usize,
) -> std::result::Result<usize, String> {
    let (family, p) = (t.family().name(), t.patch_size());
    let Some(side) = b.pixels else {
        return Err(format!(
            "bucket `{}`: a {family} bucket is a square side in `pixels` (e.g. `pixels: {}`), not `patches`",
            b.name,
            16 * p
        ));
    };
    let side = side as usize;
    if side == 0 || (!side.is_multiple_of(p) && side != image_size) {
        return Err(format!(
            "bucket `{}`: {side} pixels is not a positive multiple of the patch size {p} \
             (nor the checkpoint's image_size {image_size})",
            b.name
        ));
    }
    Ok((side / p) * (side / p))
}

/// The sizes of a plain ViT encoder (CLIP, SigLIP, DINOv2): one frame, no
/// merging, its outputs as wide as its blocks.
pub(crate) fn encoder_sizes(patch: usize, hidden: usize, depth: usize) -> Sizes {
    Sizes {
        patch,
        temporal_patch: 1,
        merge: 1,
        hidden,
        out_hidden: hidden,
        depth,
    }
}

/// An encoder's output under transformers' name (the same in files), a
/// column per token, no padding.
pub(crate) fn encoder_output(name: &str, width: usize, cols: usize) -> OutputSpec {
    OutputSpec {
        name: name.to_string(),
        file_name: name.to_string(),
        width,
        cols,
        padded: false,
    }
}

/// A fixed-resolution encoder's default bucket: the processor's side.
pub(crate) fn fixed_default_buckets(pre: &ImageProcessorConfig, image_size: usize) -> Vec<Bucket> {
    let side = pre.fixed.map_or(image_size, |f| f.side());
    vec![Bucket {
        name: format!("b{side}"),
        patches: 0,
        pixels: Some(side as u64),
        cosine_min: None,
        residency_min: None,
    }]
}

/// The shape of an input or output of a bucket's function.
pub type NamedShape = (String, Vec<usize>);

/// One output of a bucket's function: `[1, width, 1, cols]`, a column per
/// token; what callers get are its rows `[tokens, width]`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OutputSpec {
    /// The function's output name.
    pub name: String,
    /// The name `ane-export reference` and `ane-run embed` write it under.
    pub file_name: String,
    pub width: usize,
    pub cols: usize,
    /// Whether pad columns are among the `cols` (the call's real tokens
    /// are then found through the host's layout,
    /// [`crate::host::HostInputs::token_columns`]); otherwise every
    /// column is a real token, in order.
    pub padded: bool,
}

/// What every layer asks of a family, given its parsed vision config.
/// The sizes every family's tower has, read from its config under the
/// family's own field names.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Sizes {
    pub patch: usize,
    pub temporal_patch: usize,
    pub merge: usize,
    pub hidden: usize,
    pub out_hidden: usize,
    pub depth: usize,
}

/// A manifest's `config` as the family's config `C`, validated, the
/// messages naming the field: what every [`Entry::from_manifest`] does
/// before wrapping it in its [`VisionConfig`] variant.
pub(crate) fn config_from_manifest<C: serde::de::DeserializeOwned + Tower>(
    v: &Value,
) -> std::result::Result<C, String> {
    let c: C = serde_json::from_value(v.clone()).map_err(|e| format!("field `config`: {e}"))?;
    c.validate().map_err(|m| format!("field `config`: {m}"))?;
    Ok(c)
}

pub trait Tower: Send + Sync {
    fn family(&self) -> Family;

    /// The sizes the accessors below read.
    fn sizes(&self) -> Sizes;

    /// Side of a patch in pixels.
    fn patch_size(&self) -> usize {
        self.sizes().patch
    }
    fn temporal_patch_size(&self) -> usize {
        self.sizes().temporal_patch
    }
    /// Side of the square of patches merged into one output token.
    fn merge_size(&self) -> usize {
        self.sizes().merge
    }
    /// Width of the blocks' hidden states.
    fn hidden_size(&self) -> usize {
        self.sizes().hidden
    }
    /// Width of each output token (what the language model takes).
    fn out_hidden_size(&self) -> usize {
        self.sizes().out_hidden
    }
    /// Number of blocks.
    fn depth(&self) -> usize {
        self.sizes().depth
    }

    /// Columns of one `pixel_values` row: `C * T * P * P`.
    fn patch_dim(&self) -> usize {
        3 * self.temporal_patch_size() * self.patch_size() * self.patch_size()
    }

    /// Validate the config; the message names the field.
    fn validate(&self) -> std::result::Result<(), String>;

    /// Slots (bucket columns) a call of images `grid_thw` takes: one per
    /// patch unless the family's host pads (Qwen2.5-VL's windows).
    fn slots(&self, grid_thw: &[[usize; 3]]) -> usize {
        grid_thw.iter().map(|g| g[0] * g[1] * g[2]).sum()
    }

    /// How many images one call of a bucket takes at most (`None`: as many
    /// as fit its slots). The cosine gate skips a case of more images, as
    /// it skips one that does not fit.
    fn images_per_call(&self) -> Option<usize> {
        None
    }

    /// What a bucket's `patches` counts, for the manifest, when it is not
    /// one slot per patch (families whose host lays patches out with padding).
    fn capacity_note(&self) -> Option<String> {
        None
    }

    /// Whether a bucket of `slots` columns suits the family; the message says why not.
    fn check_bucket(&self, slots: usize) -> std::result::Result<(), String> {
        let unit = self.merge_size() * self.merge_size();
        if slots == 0 || !slots.is_multiple_of(unit) {
            return Err(format!(
                "{slots} patches: expected a positive multiple of {unit} (the patches merged into one token)"
            ));
        }
        Ok(())
    }

    /// The outputs of every bucket's function, in order; for the Qwen-VL
    /// families each is `[1, out_hidden_size, 1, N / merge^2]` and the
    /// first is the merged tokens the language model takes. Without
    /// deepstack outputs, that one.
    fn output_names(&self) -> Vec<String> {
        vec!["embeds".to_string()]
    }

    /// The outputs of a bucket of `patches` patches, in the order of
    /// [`Tower::output_names`]: by default the merged tokens (`embeds`,
    /// then `deepstack.<i>` in files), padded like the patches.
    fn outputs(&self, patches: usize) -> Vec<OutputSpec> {
        let unit = self.merge_size() * self.merge_size();
        self.output_names()
            .into_iter()
            .enumerate()
            .map(|(i, name)| OutputSpec {
                file_name: if i == 0 {
                    "embeds".to_string()
                } else {
                    format!("deepstack.{}", i - 1)
                },
                name,
                width: self.out_hidden_size(),
                cols: patches / unit,
                padded: true,
            })
            .collect()
    }

    /// The embedding of an image the task gate's probes read, for a family
    /// without a language model; `None`: the task gate does not apply.
    fn pooled_output(&self) -> Option<Pooling> {
        None
    }

    /// The patch count of a bucket of the buckets file (its `patches`, or
    /// for a fixed-resolution family its `pixels` squared in patches); the
    /// message says why the bucket does not suit the family.
    fn bucket_patches(&self, b: &Bucket) -> std::result::Result<usize, String> {
        match b.pixels {
            Some(_) => Err(format!(
                "bucket `{}`: `pixels` is for fixed-resolution encoders; a {} bucket counts `patches`",
                b.name,
                self.family().name()
            )),
            None => Ok(b.patches as usize),
        }
    }

    /// The buckets a build uses when the buckets file has none that suit
    /// the family (a fixed-resolution encoder's processor size); `None`:
    /// the file's buckets are the family's.
    fn default_buckets(&self, _pre: &ImageProcessorConfig) -> Option<Vec<Bucket>> {
        None
    }

    /// The inputs of a bucket of `patches` patches, in order.
    fn input_shapes(&self, patches: usize) -> Vec<NamedShape>;

    /// The image processor the family's checkpoints ship, used when a model
    /// directory has no `preprocessor_config.json`.
    fn default_preprocessor(&self) -> ImageProcessorConfig;

    /// What the host computes for this config unless a manifest says otherwise.
    fn host_recipe(&self) -> HostRecipe;

    /// The tables `host.safetensors` must hold: (name, shape); none unless
    /// the family's host reads tables from the checkpoint.
    fn host_table_shapes(&self) -> Vec<NamedShape> {
        Vec::new()
    }

    /// Those tables, read from the checkpoint at build time: (name, shape, values).
    fn host_tables(&self, _ck: &Checkpoint) -> Result<Vec<HostTable>> {
        Ok(Vec::new())
    }

    /// The host inputs of one call of a bucket of `bucket` patches.
    fn host_inputs(
        &self,
        recipe: &HostRecipe,
        tables: &HostTables,
        batch: &PixelBatch,
        bucket: usize,
    ) -> std::result::Result<HostInputs, String>;

    /// The tower's weights in the ANE layout, for the family's builder.
    fn layout(&self, ck: &Checkpoint, storage: Storage) -> Result<Vec<LayoutTensor>>;

    /// The outputs that are the residual stream itself, not after a norm
    /// (CLIP's `last_hidden_state`): with the stream scaled down, the host
    /// scales them back (`host.output_scale`).
    fn residual_outputs(&self) -> Vec<&'static str> {
        Vec::new()
    }

    /// What the family's Python builder takes besides the weights, as JSON.
    fn builder_spec(&self) -> Value;

    /// The normalisation epsilon the family's reference uses, which the
    /// cosine gate checks every `layer_norm` of the program against.
    fn layer_norm_eps(&self) -> f64;

    /// The fp32 reference tower of a checkpoint of this family.
    fn reference_tower(&self, ck: &Checkpoint) -> Result<Arc<dyn VisionTower>>;
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

/// The fp32 reference tower of a checkpoint, for its family.
/// A checkpoint whose tower tensors are not all read by it (its config
/// describes fewer layers than it saved) is an error naming them.
pub fn reference_tower(m: &Model) -> Result<Arc<dyn VisionTower>> {
    let tower = m.vision.reference_tower(&m.checkpoint)?;
    m.checkpoint.check_all_read()?;
    Ok(tower)
}

/// A checkpoint with its family resolved: the family, its vision config and
/// the image processor, the tower's tensors selected. Reads as the
/// [`Checkpoint`] it holds (its directory, its tensors).
pub struct Model {
    pub checkpoint: Checkpoint,
    pub family: Family,
    /// The vision config of the checkpoint's family.
    pub vision: VisionConfig,
    pub preprocessor: ImageProcessorConfig,
    /// Whether `preprocessor_config.json` existed (else the family's
    /// default processor is used).
    pub has_preprocessor_config: bool,
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
        let defaults = vision.default_preprocessor();
        let pp_path = ck.dir.join("preprocessor_config.json");
        let has_pp = pp_path.is_file();
        let preprocessor = if has_pp {
            let text = std::fs::read_to_string(&pp_path).map_err(|e| Error::io(&pp_path, e))?;
            let p = ImageProcessorConfig::from_json(&pp_path, &text, &defaults)?;
            let want = (
                vision.patch_size(),
                vision.temporal_patch_size(),
                vision.merge_size(),
            );
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
            preprocessor,
            has_preprocessor_config: has_pp,
        })
    }
}
