//! The interface a family implements, split by concern ([`Tower`],
//! [`Pixels`], [`Host`], [`Build`], [`Reference`]), and the pieces the
//! families share (output specs, pooling, encoder helpers).

use std::sync::Arc;

use serde_json::Value;

use super::Family;
use crate::buckets::Bucket;
use crate::checkpoint::Checkpoint;
use crate::error::{BucketsError, FieldError, Result};
use crate::export::layout::{LayoutTensor, Storage};
use crate::host::{HostError, HostInputs, HostRecipe, HostTable, HostTables};
use crate::preprocess::{ImageProcessorConfig, PixelBatch, TokenBatch};
use crate::reference::{TextEncoder, VisionTower};

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
) -> std::result::Result<usize, BucketsError> {
    let family = t.family().name();
    let Some(px) = t.input().pixels() else {
        return Err(BucketsError::Unsuitable {
            name: b.name.clone(),
            msg: format!("a {family} bucket counts `tokens`"),
        });
    };
    let p = px.patch_size();
    let Some(side) = b.pixels else {
        return Err(BucketsError::Unsuitable {
            name: b.name.clone(),
            msg: format!(
                "a {family} bucket is a square side in `pixels` (e.g. `pixels: {}`), not `patches`",
                16 * p
            ),
        });
    };
    let side = side as usize;
    if side == 0 || (!side.is_multiple_of(p) && side != image_size) {
        return Err(BucketsError::Unsuitable {
            name: b.name.clone(),
            msg: format!(
                "{side} pixels is not a positive multiple of the patch size {p} \
                 (nor the checkpoint's image_size {image_size})"
            ),
        });
    }
    Ok((side / p) * (side / p))
}

/// The sizes of a plain ViT encoder (CLIP, SigLIP, DINOv2): one frame, no
/// merging, its outputs as wide as its blocks.
pub(crate) fn encoder_sizes(hidden: usize, depth: usize) -> Sizes {
    Sizes {
        hidden,
        out_hidden: hidden,
        depth,
    }
}

/// A plain ViT encoder's patches: square, one frame, no merging.
pub(crate) fn encoder_patches(patch: usize) -> PatchSizes {
    PatchSizes {
        patch,
        temporal_patch: 1,
        merge: 1,
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
        tokens: None,
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

/// The sizes every family's tower has, whatever it reads, from its config
/// under the family's own field names.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Sizes {
    /// Width of the blocks' hidden states.
    pub hidden: usize,
    /// Width of each output token.
    pub out_hidden: usize,
    /// Number of blocks.
    pub depth: usize,
}

/// How an image tower cuts images into patches.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PatchSizes {
    /// Side of a patch in pixels.
    pub patch: usize,
    /// Frames in one patch.
    pub temporal_patch: usize,
    /// Side of the square of patches merged into one output token.
    pub merge: usize,
}

/// A manifest's `config` as the family's config `C`, validated, the
/// messages naming the field: what every [`Entry::from_manifest`] does
/// before wrapping it in its [`VisionConfig`] variant.
pub(crate) fn config_from_manifest<C: serde::de::DeserializeOwned + Tower>(
    v: &Value,
) -> std::result::Result<C, FieldError> {
    let c: C = serde_json::from_value(v.clone())
        .map_err(|e| FieldError::invalid("config", e.to_string()))?;
    c.validate()
        .map_err(|m| FieldError::invalid("config", m.to_string()))?;
    Ok(c)
}

/// [`Host`] for an encoder family whose host is one value, its `host.rs`'s
/// `host(config)` (a [`crate::host::FixedEncoder`], or SigLIP2's NaFlex
/// host), which answers each of `Host`'s questions itself.
macro_rules! encoder_host {
    ($config:ty) => {
        impl $crate::family::Host for $config {
            fn input_shapes(&self, patches: usize) -> Vec<$crate::family::NamedShape> {
                host::host(self).input_shapes(patches)
            }
            fn host_recipe(&self) -> $crate::host::HostRecipe {
                host::host(self).recipe()
            }
            fn host_table_shapes(&self) -> Vec<$crate::family::NamedShape> {
                host::host(self).table_shapes()
            }
            fn host_tables(
                &self,
                ck: &$crate::checkpoint::Checkpoint,
            ) -> $crate::error::Result<Vec<$crate::host::HostTable>> {
                host::host(self).tables(ck)
            }
        }
    };
}
pub(crate) use encoder_host;

/// What every layer asks of a family, given its parsed config: split by
/// concern into the traits below, which every family implements, each in a
/// block of its own (`family/<name>/mod.rs`). [`Tower`] is the whole: what
/// every tower has whatever it reads (sizes, outputs, buckets), the input it
/// takes ([`Tower::input`], the modality seam), and through its
/// supertraits what the host computes ([`Host`]), what the build writes
/// ([`Build`]) and the fp32 oracle ([`Reference`]).
pub trait Tower: Host + Build + Reference + Send + Sync {
    fn family(&self) -> Family;

    /// The sizes the accessors below read.
    fn sizes(&self) -> Sizes;

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

    /// Validate the config; the message names the field.
    fn validate(&self) -> std::result::Result<(), FieldError>;

    /// What the tower reads: the input modality. Code that turns a user's
    /// input into a call (the runtime, the gates' cases, `preprocess`)
    /// matches on it, so a new modality is a new variant the compiler
    /// leads through every such place.
    fn input(&self) -> Input<'_>;

    /// What a bucket's `patches` counts, for the manifest, when it is not
    /// one slot per patch (families whose host lays patches out with padding).
    fn capacity_note(&self) -> Option<String> {
        None
    }

    /// Whether a bucket of `slots` columns suits the family; the message says why not.
    fn check_bucket(&self, slots: usize) -> std::result::Result<(), BucketsError> {
        let px = match self.input() {
            Input::Pixels(px) => px,
            Input::Tokens(t) => {
                let max = t.max_tokens();
                if slots == 0 || slots > max {
                    return Err(BucketsError::Slots(format!(
                        "{slots} tokens: expected 1 to {max} (the checkpoint's position table)"
                    )));
                }
                return Ok(());
            }
        };
        let unit = px.merge_size() * px.merge_size();
        if slots == 0 || !slots.is_multiple_of(unit) {
            return Err(BucketsError::Slots(format!(
                "{slots} patches: expected a positive multiple of {unit} (the patches merged into one token)"
            )));
        }
        Ok(())
    }

    /// The slots (columns) of a bucket of the buckets file (its `patches`,
    /// or for a fixed-resolution family its `pixels` squared in patches);
    /// the message says why the bucket does not suit the family.
    fn bucket_slots(&self, b: &Bucket) -> std::result::Result<usize, BucketsError> {
        let family = self.family().name();
        let unsuitable = |msg: String| BucketsError::Unsuitable {
            name: b.name.clone(),
            msg,
        };
        match (self.input(), b.pixels, b.tokens) {
            (Input::Tokens(_), _, Some(t)) => Ok(t as usize),
            (Input::Tokens(_), ..) => Err(unsuitable(format!(
                "a {family} bucket counts `tokens` (e.g. `tokens: 128`), not patches or pixels"
            ))),
            (Input::Pixels(_), _, Some(_)) => Err(unsuitable(format!(
                "`tokens` is for text encoders; a {family} bucket counts `patches`"
            ))),
            (Input::Pixels(_), Some(_), None) => Err(unsuitable(format!(
                "`pixels` is for fixed-resolution encoders; a {family} bucket counts `patches`"
            ))),
            (Input::Pixels(_), None, None) => Ok(b.patches as usize),
        }
    }

    /// The outputs of every bucket's function, in order; for the Qwen-VL
    /// families each is `[1, out_hidden_size, 1, N / merge^2]` and the
    /// first is the merged tokens the language model takes. Without
    /// deepstack outputs, that one.
    fn output_names(&self) -> Vec<String> {
        vec!["embeds".to_string()]
    }

    /// The outputs of a bucket of `slots` columns, in the order of
    /// [`Tower::output_names`]: by default the merged tokens (`embeds`,
    /// then `deepstack.<i>` in files), padded like the patches.
    fn outputs(&self, slots: usize) -> Vec<OutputSpec> {
        let unit = self
            .input()
            .pixels()
            .map_or(1, |px| px.merge_size() * px.merge_size());
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
                cols: slots / unit,
                padded: true,
            })
            .collect()
    }

    /// The embedding the task gate's probes read, for a family without a
    /// language model; `None`: the task gate does not apply.
    fn pooled_output(&self) -> Option<Pooling> {
        None
    }

    /// The outputs that are the residual stream itself, not after a norm
    /// (CLIP's `last_hidden_state`): with the stream scaled down, the host
    /// scales them back (`host.output_scale`).
    fn residual_outputs(&self) -> Vec<&'static str> {
        Vec::new()
    }
}

/// The input a tower reads: the modality seam. Each variant is a trait of
/// its own: how the modality's input becomes a call of a bucket.
#[derive(Clone, Copy)]
pub enum Input<'a> {
    /// Images, cut into patches.
    Pixels(&'a dyn Pixels),
    /// Text, as token ids (the text encoders).
    Tokens(&'a dyn Tokens),
}

impl<'a> Input<'a> {
    /// The image modality, if the tower reads images.
    pub fn pixels(self) -> Option<&'a dyn Pixels> {
        match self {
            Input::Pixels(p) => Some(p),
            Input::Tokens(_) => None,
        }
    }

    /// The text modality, if the tower reads text.
    pub fn tokens(self) -> Option<&'a dyn Tokens> {
        match self {
            Input::Tokens(t) => Some(t),
            Input::Pixels(_) => None,
        }
    }

    /// What the modality is, for messages: `images` or `text`.
    pub fn noun(self) -> &'static str {
        match self {
            Input::Pixels(_) => "images",
            Input::Tokens(_) => "text",
        }
    }
}

/// How a text encoder pools its tokens into one sentence embedding, as the
/// checkpoint's sentence-transformers configuration asks
/// (`modules.json`, `1_Pooling/config.json`, a `Normalize` module).
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct SentencePooling {
    pub mode: SentenceMode,
    /// L2-normalised after pooling (a `Normalize` module).
    pub normalize: bool,
}

/// The pooling of [`SentencePooling`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SentenceMode {
    /// The mean of the real tokens' rows (`pooling_mode_mean_tokens`).
    Mean,
    /// The first token's row (`pooling_mode_cls_token`).
    Cls,
}

impl SentencePooling {
    /// The sentence embedding of one text's `last_hidden_state` rows
    /// `[tokens, width]` (its real tokens only), in f64 sums.
    pub fn pool(self, rows: &[f32], width: usize) -> Vec<f32> {
        let n = rows.len() / width.max(1);
        let mut v: Vec<f64> = match self.mode {
            SentenceMode::Cls => rows[..width.min(rows.len())]
                .iter()
                .map(|&x| x as f64)
                .collect(),
            SentenceMode::Mean => {
                let mut m = vec![0f64; width];
                for r in rows.chunks_exact(width) {
                    for (a, &x) in m.iter_mut().zip(r) {
                        *a += x as f64;
                    }
                }
                m.iter().map(|a| a / n.max(1) as f64).collect()
            }
        };
        if self.normalize {
            // sentence-transformers' Normalize: x / max(||x||, 1e-12).
            let norm = v.iter().map(|x| x * x).sum::<f64>().sqrt().max(1e-12);
            v.iter_mut().for_each(|x| *x /= norm);
        }
        v.into_iter().map(|x| x as f32).collect()
    }
}

/// The text modality: a text encoder's tokenizer, buckets in tokens, and
/// the host inputs of a call of one text.
pub trait Tokens: Send + Sync {
    /// The most tokens one call can hold (the position table's rows).
    fn max_tokens(&self) -> usize;

    /// The buckets a build uses when the buckets file has none in
    /// `tokens`: b128 and b512, as far as [`Tokens::max_tokens`] allows.
    fn default_buckets(&self) -> Vec<Bucket> {
        let max = self.max_tokens();
        let mut v: Vec<usize> = [128, 512].into_iter().filter(|&n| n <= max).collect();
        if v.is_empty() {
            v.push(max);
        }
        v.into_iter()
            .map(|n| Bucket {
                name: format!("b{n}"),
                patches: 0,
                pixels: None,
                tokens: Some(n as u64),
                cosine_min: None,
                residency_min: None,
            })
            .collect()
    }

    /// The sentence embedding the checkpoint's sentence-transformers
    /// configuration asks for, if it has one.
    fn sentence_pooling(&self) -> Option<SentencePooling>;

    /// The host inputs of one text's tokens in a bucket of `bucket` tokens.
    fn host_inputs(
        &self,
        recipe: &HostRecipe,
        tables: &HostTables,
        batch: &TokenBatch,
        bucket: usize,
    ) -> std::result::Result<HostInputs, HostError>;
}

/// The image modality: how a family cuts images into patches and bucket
/// slots, its processor, and the host inputs of a call of images.
pub trait Pixels: Send + Sync {
    /// The sizes the accessors below read.
    fn patches(&self) -> PatchSizes;

    /// Side of a patch in pixels.
    fn patch_size(&self) -> usize {
        self.patches().patch
    }
    fn temporal_patch_size(&self) -> usize {
        self.patches().temporal_patch
    }
    /// Side of the square of patches merged into one output token.
    fn merge_size(&self) -> usize {
        self.patches().merge
    }
    /// Columns of one `pixel_values` row: `C * T * P * P`.
    fn patch_dim(&self) -> usize {
        3 * self.temporal_patch_size() * self.patch_size() * self.patch_size()
    }

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

    /// The image processor the family's checkpoints ship, used when a model
    /// directory has no `preprocessor_config.json`.
    fn default_preprocessor(&self) -> ImageProcessorConfig;

    /// The buckets a build uses when the buckets file has none that suit
    /// the family (a fixed-resolution encoder's processor size); `None`:
    /// the file's buckets are the family's.
    fn default_buckets(&self, _pre: &ImageProcessorConfig) -> Option<Vec<Bucket>> {
        None
    }

    /// The host inputs of one call of images in a bucket of `bucket` slots.
    fn host_inputs(
        &self,
        recipe: &HostRecipe,
        tables: &HostTables,
        batch: &PixelBatch,
        bucket: usize,
    ) -> std::result::Result<HostInputs, HostError>;
}

/// What the host computes besides the modality's own inputs: the shapes of
/// a bucket's inputs, the recipe the manifest records, and the tables read
/// from the checkpoint at build time.
pub trait Host: Send + Sync {
    /// The inputs of a bucket of `slots` columns, in order.
    fn input_shapes(&self, slots: usize) -> Vec<NamedShape>;

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
}

/// What the build writes: the weights in the ANE layout and what the
/// family's Python builder takes besides them.
pub trait Build: Send + Sync {
    /// The tower's weights in the ANE layout, for the family's builder.
    fn layout(&self, ck: &Checkpoint, storage: Storage) -> Result<Vec<LayoutTensor>>;

    /// What the family's Python builder takes besides the weights, as JSON.
    fn builder_spec(&self) -> Value;

    /// The normalisation epsilon the family's reference uses, which the
    /// cosine gate checks every `layer_norm` of the program against.
    fn layer_norm_eps(&self) -> f64;
}

/// The fp32 oracle.
pub trait Reference: Send + Sync {
    /// The fp32 reference of a checkpoint of this family, for its modality.
    fn oracle(&self, ck: &Checkpoint) -> Result<Oracle>;
}

/// A family's fp32 reference, by modality.
#[derive(Clone)]
pub enum Oracle {
    /// An image tower.
    Vision(Arc<dyn VisionTower>),
    /// A text encoder.
    Text(Arc<dyn TextEncoder>),
}
