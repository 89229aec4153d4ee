//! Reading Hugging Face checkpoints: a model directory, or a repo id resolved
//! in the local Hugging Face cache, downloading what it lacks from the hub.
//!
//! A model directory holds `config.json`, optionally `preprocessor_config.json`,
//! and weights as `model.safetensors` or shards listed in
//! `model.safetensors.index.json`. Pickled weights (`*.bin`, `*.pt`, `*.pth`)
//! are refused: unpickling can run arbitrary code.

pub mod config;
pub mod hub;
pub mod safetensors;

use std::path::{Path, PathBuf};

use serde_json::Value;

pub use config::Activation;
pub use safetensors::WeightStore;

use crate::error::{Error, Result};

/// File names that hold pickled weights.
const PICKLE_SUFFIXES: &[&str] = &[".bin", ".pt", ".pth", ".ckpt", ".pkl"];

/// An opened checkpoint, whatever its family: `config.json`, and every
/// tensor of its safetensors files indexed and memory-mapped. The family is
/// resolved from it once, above this layer (`family::Model::resolve`),
/// which then keeps only the tower's tensors ([`Checkpoint::select_tower`]).
pub struct Checkpoint {
    pub dir: PathBuf,
    /// `config.json`'s path, for messages.
    pub config_path: PathBuf,
    /// `config.json`, parsed.
    pub config: Value,
    pub model_type: String,
    /// The prefix of the tower's tensors, e.g. `model.visual.` (empty until
    /// a tower is selected).
    pub prefix: String,
    pub weights: WeightStore,
    /// Where the tower's tensors are, once selected.
    names: Option<&'static WeightNames>,
}

/// Where a family's tower tensors are in a checkpoint: the first of
/// `prefixes` under which `probe` exists is the tower's prefix; tensors
/// outside it are dropped, except `extra` (full names).
#[derive(Debug)]
pub struct WeightNames {
    pub prefixes: &'static [&'static str],
    pub probe: &'static str,
    pub extra: &'static [&'static str],
    /// Tensors (names under the prefix) that checkpoints of the family may
    /// hold and that no layer reads at inference (transformers loads them
    /// too and leaves them unused, e.g. DINOv2's `embeddings.mask_token`).
    /// Any other tower tensor left unread once a tower is loaded is an
    /// error ([`Checkpoint::check_all_read`]).
    pub unread: &'static [&'static str],
}

/// Resolve `--model`: an existing directory, or a repo id (`org/name`) at
/// `revision` (default `main`), from the local Hugging Face cache and, for
/// what it lacks, the hub ([`hub`]), which reports to `events`.
pub fn resolve_model(
    spec: &str,
    revision: Option<&str>,
    events: &hub::HubEvents,
) -> Result<PathBuf> {
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
    hub::resolve(spec, revision.unwrap_or("main"), events).map_err(|e| match e {
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
    /// Open a model directory: parse `config.json`, index and mmap every
    /// tensor of its weights. Nothing here depends on the family.
    pub fn open(dir: &Path) -> Result<Checkpoint> {
        let config_path = dir.join("config.json");
        if !config_path.is_file() {
            return Err(Error::checkpoint(
                dir,
                "config.json is missing: not a Hugging Face model directory",
            ));
        }
        let config = read_json(&config_path)?;
        let model_type = config
            .get("model_type")
            .and_then(Value::as_str)
            .ok_or_else(|| {
                Error::config(&config_path, "field `model_type`: missing or not a string")
            })?
            .to_string();
        let weights = WeightStore::open(&weight_files(dir)?)?;
        Ok(Checkpoint {
            dir: dir.to_path_buf(),
            config_path,
            config,
            model_type,
            prefix: String::new(),
            weights,
            names: None,
        })
    }

    /// Find the tower's tensors (`names`), then keep only them: the prefix
    /// is the first of `names.prefixes` under which `names.probe` exists.
    pub fn select_tower(&mut self, names: &'static WeightNames) -> Result<()> {
        let prefix = names
            .prefixes
            .iter()
            .find(|p| self.weights.contains(&format!("{p}{}", names.probe)))
            .ok_or_else(|| {
                Error::checkpoint(
                    &self.dir,
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
        self.weights
            .retain(|n| n.starts_with(&prefix) || names.extra.contains(&n));
        self.prefix = prefix;
        self.names = Some(names);
        Ok(())
    }

    /// An error naming the tower tensors that nothing has read so far,
    /// besides those the family knows no layer reads
    /// ([`WeightNames::unread`]): called once a tower is
    /// loaded (the build's layout, the reference), it catches a config that
    /// describes fewer layers than the checkpoint saved, which would
    /// otherwise build, pass every gate (the reference reads the same
    /// config) and silently drop blocks.
    pub fn check_all_read(&self) -> Result<()> {
        let known = self.names.map_or(&[][..], |n| n.unread);
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
    /// [`WeightNames::extra`]) as f32 with the expected shape.
    pub fn tensor_unprefixed(&self, name: &str, shape: &[usize]) -> Result<candle_core::Tensor> {
        self.weights.f32(name, shape, &self.dir)
    }

    /// Load one tower tensor (name without prefix) as f32 with the expected shape.
    pub fn tensor(&self, name: &str, shape: &[usize]) -> Result<candle_core::Tensor> {
        self.weights
            .f32(&format!("{}{name}", self.prefix), shape, &self.dir)
    }
}
