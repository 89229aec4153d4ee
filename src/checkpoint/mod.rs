//! Reading Hugging Face checkpoints: a model directory, or a repo id resolved
//! in the local Hugging Face cache, downloading what it lacks from the hub.
//!
//! A model directory holds `config.json`, optionally `preprocessor_config.json`,
//! and weights as `model.safetensors` or shards listed in
//! `model.safetensors.index.json`. Pickled weights (`*.bin`, `*.pt`, `*.pth`)
//! are refused: unpickling can run arbitrary code.

pub mod clip;
pub mod config;
pub mod dinov2;
pub mod hub;
pub mod qwen2_5_vl;
pub mod qwen2_vl;
pub mod qwen3_vl;
pub mod safetensors;
pub mod siglip;
pub mod siglip2;

use std::path::{Path, PathBuf};

use serde_json::Value;

pub use crate::family::{Family, VisionConfig};
pub use clip::ClipVisionConfig;
pub use config::Activation;
pub use dinov2::Dinov2VisionConfig;
pub use qwen2_5_vl::Qwen25VisionConfig;
pub use qwen2_vl::Qwen2VisionConfig;
pub use qwen3_vl::Qwen3VisionConfig;
pub use safetensors::WeightStore;
pub use siglip::SiglipVisionConfig;
pub use siglip2::Siglip2VisionConfig;

use crate::error::{Error, Result};
use crate::preprocess::ImageProcessorConfig;

/// File names that hold pickled weights.
const PICKLE_SUFFIXES: &[&str] = &[".bin", ".pt", ".pth", ".ckpt", ".pkl"];

/// An opened checkpoint: configs and the vision tower's weights, memory-mapped.
pub struct Checkpoint {
    pub dir: PathBuf,
    pub family: Family,
    pub model_type: String,
    /// The vision config of the checkpoint's family.
    pub vision: VisionConfig,
    pub preprocessor: ImageProcessorConfig,
    /// Whether `preprocessor_config.json` existed (else Qwen3-VL defaults are used).
    pub has_preprocessor_config: bool,
    /// The prefix of the tower's tensors, e.g. `model.visual.`.
    pub prefix: String,
    pub weights: WeightStore,
}

/// Resolve `--model`: an existing directory, or a repo id (`org/name`) at
/// `revision` (default `main`), from the local Hugging Face cache and, for
/// what it lacks, the hub ([`hub`]).
pub fn resolve_model(spec: &str, revision: Option<&str>) -> Result<PathBuf> {
    let p = Path::new(spec);
    if p.is_dir() {
        if revision.is_some() {
            return Err(Error::Invalid(format!(
                "--revision applies to a repo id in the Hugging Face cache, but `{spec}` is a directory"
            )));
        }
        return Ok(p.to_path_buf());
    }
    if p.is_file() {
        if is_pickle(p) {
            return Err(pickle_error(p));
        }
        return Err(Error::checkpoint(
            p,
            "expected a model directory (config.json and *.safetensors) or a repo id, got a file",
        ));
    }
    // Not here: a repo id, or a mistyped path, which the error must say.
    hub::resolve(spec, revision.unwrap_or("main")).map_err(|e| match e {
        Error::Hub { what, error } => Error::Hub {
            what: format!(
                "--model {spec}: no such local directory, so taken as a Hugging Face repo id: {what}"
            ),
            error,
        },
        e => e,
    })
}

fn is_pickle(p: &Path) -> bool {
    let name = p.file_name().and_then(|n| n.to_str()).unwrap_or("");
    PICKLE_SUFFIXES.iter().any(|s| name.ends_with(s))
}

fn pickle_error(p: &Path) -> Error {
    Error::Pickled(p.to_path_buf())
}

/// Read and parse a JSON file; errors name it.
pub(crate) fn read_json(path: &Path) -> Result<Value> {
    let text = std::fs::read_to_string(path).map_err(|e| Error::io(path, e))?;
    serde_json::from_str(&text).map_err(|e| Error::config(path, format!("invalid JSON: {e}")))
}

/// The shard file names a `model.safetensors.index.json` lists (deduplicated,
/// unsorted), each checked to be a `.safetensors` file name inside the model
/// directory. A pure function of the parsed JSON; `index` names it in errors.
pub fn shard_names(index: &Path, v: &Value) -> Result<Vec<String>> {
    let map = v
        .get("weight_map")
        .and_then(Value::as_object)
        .ok_or_else(|| Error::config(index, "field `weight_map`: missing or not an object"))?;
    let mut files: Vec<String> = Vec::new();
    for (tensor, f) in map {
        let f = f.as_str().ok_or_else(|| {
            Error::config(
                index,
                format!("field `weight_map.{tensor}`: expected a file name"),
            )
        })?;
        let fp = Path::new(f);
        if fp.is_absolute() || fp.components().count() != 1 || !f.ends_with(".safetensors") {
            return Err(Error::config(
                index,
                format!(
                    "field `weight_map.{tensor}`: `{f}` must be a .safetensors file name inside the model directory"
                ),
            ));
        }
        if !files.iter().any(|x| x == f) {
            files.push(f.to_string());
        }
    }
    Ok(files)
}

/// The safetensors files of a model directory, in a stable order.
pub fn weight_files(dir: &Path) -> Result<Vec<PathBuf>> {
    let index = dir.join("model.safetensors.index.json");
    if index.is_file() {
        let v = read_json(&index)?;
        let mut files = shard_names(&index, &v)?;
        files.sort();
        let paths: Vec<PathBuf> = files.iter().map(|f| dir.join(f)).collect();
        for p in &paths {
            if !p.is_file() {
                return Err(Error::checkpoint(
                    p,
                    "shard listed in model.safetensors.index.json is missing",
                ));
            }
        }
        return Ok(paths);
    }
    let single = dir.join("model.safetensors");
    if single.is_file() {
        return Ok(vec![single]);
    }
    // Any other *.safetensors (e.g. a tower saved on its own).
    let mut found = Vec::new();
    let mut pickles = Vec::new();
    for entry in std::fs::read_dir(dir).map_err(|e| Error::io(dir, e))? {
        let p = entry.map_err(|e| Error::io(dir, e))?.path();
        let name = p
            .file_name()
            .and_then(|n| n.to_str())
            .unwrap_or("")
            .to_string();
        if name.ends_with(".safetensors") {
            found.push(p);
        } else if is_pickle(&p) {
            pickles.push(p);
        }
    }
    found.sort();
    if !found.is_empty() {
        return Ok(found);
    }
    if let Some(p) = pickles.first() {
        return Err(pickle_error(p));
    }
    Err(Error::checkpoint(
        dir,
        "no weights found: expected model.safetensors or model.safetensors.index.json",
    ))
}

impl Checkpoint {
    /// Open a model directory: parse configs, index and mmap the tower's weights.
    pub fn open(dir: &Path) -> Result<Checkpoint> {
        let cfg_path = dir.join("config.json");
        if !cfg_path.is_file() {
            return Err(Error::checkpoint(
                dir,
                "config.json is missing: not a Hugging Face model directory",
            ));
        }
        let cfg = read_json(&cfg_path)?;
        let model_type = cfg
            .get("model_type")
            .and_then(Value::as_str)
            .ok_or_else(|| Error::config(&cfg_path, "field `model_type`: missing or not a string"))?
            .to_string();
        let family = Family::from_model_type(&cfg_path, &model_type)?;
        let files = weight_files(dir)?;
        // Index every tensor to find the prefix, then keep only the tower's.
        let mut weights = WeightStore::open(&files)?;
        let names = family.weights();
        let prefix = names
            .prefixes
            .iter()
            .find(|p| weights.contains(&format!("{p}{}", names.probe)))
            .ok_or_else(|| {
                Error::checkpoint(
                    dir,
                    format!(
                        "no vision tower found: expected `{}` under one of the prefixes {}",
                        names.probe,
                        names
                            .prefixes
                            .iter()
                            .map(|p| format!("`{p}`"))
                            .collect::<Vec<_>>()
                            .join(", ")
                    ),
                )
            })?
            .to_string();
        weights.retain(|n| n.starts_with(&prefix) || names.extra.contains(&n));
        let vision = family.vision_config(&cfg_path, &cfg, &|n| weights.contains(n))?;

        let defaults = vision.default_preprocessor();
        let pp_path = dir.join("preprocessor_config.json");
        let has_pp = pp_path.is_file();
        let preprocessor = if has_pp {
            let text = std::fs::read_to_string(&pp_path).map_err(|e| Error::io(&pp_path, e))?;
            let p = ImageProcessorConfig::from_json(&pp_path, &text, &defaults)?;
            if (p.patch_size, p.temporal_patch_size, p.merge_size)
                != (
                    vision.patch_size(),
                    vision.temporal_patch_size(),
                    vision.merge_size(),
                )
            {
                return Err(Error::config(
                    &pp_path,
                    format!(
                        "patch/temporal/merge sizes ({}, {}, {}) disagree with config.json ({}, {}, {})",
                        p.patch_size,
                        p.temporal_patch_size,
                        p.merge_size,
                        vision.patch_size(),
                        vision.temporal_patch_size(),
                        vision.merge_size()
                    ),
                ));
            }
            p
        } else {
            defaults
        };

        Ok(Checkpoint {
            dir: dir.to_path_buf(),
            family,
            model_type,
            vision,
            preprocessor,
            has_preprocessor_config: has_pp,
            prefix,
            weights,
        })
    }

    /// An error naming the tower tensors that nothing has read so far,
    /// besides those the family knows no layer reads
    /// ([`crate::family::WeightNames::unread`]): called once a tower is
    /// loaded (the build's layout, the reference), it catches a config that
    /// describes fewer layers than the checkpoint saved, which would
    /// otherwise build, pass every gate (the reference reads the same
    /// config) and silently drop blocks.
    pub fn check_all_read(&self) -> Result<()> {
        let known = self.family.weights().unread;
        let left: Vec<String> = self
            .weights
            .unread()
            .into_iter()
            .filter(|n| {
                !n.strip_prefix(self.prefix.as_str())
                    .is_some_and(|rest| known.contains(&rest))
            })
            .collect();
        if left.is_empty() {
            return Ok(());
        }
        Err(Error::Unread {
            path: self.dir.clone(),
            tensors: left,
        })
    }

    /// Load one tensor by its full name (one of the family's
    /// [`crate::family::WeightNames::extra`]) as f32 with the expected shape.
    pub fn tensor_unprefixed(&self, name: &str, shape: &[usize]) -> Result<candle_core::Tensor> {
        self.weights.f32(name, shape, &self.dir)
    }

    /// Load one tower tensor (name without prefix) as f32 with the expected shape.
    pub fn tensor(&self, name: &str, shape: &[usize]) -> Result<candle_core::Tensor> {
        self.weights
            .f32(&format!("{}{name}", self.prefix), shape, &self.dir)
    }
}
