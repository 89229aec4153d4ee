//! The library's error type, and each stage's own.
//!
//! Every variant that comes from user input names the file (and, where there
//! is one, the tensor or field) and says what was expected. The binaries map
//! any error to exit code 2 ("could not run"); exit code 1 is reserved for a
//! check that ran and said no (the gates).
//!
//! A stage's failures are an enum of their own in a file of this module
//! (`mlpackage.rs`: [`PackageError`], `checkpoint.rs`: [`SafetensorsError`]
//! and [`FieldError`], `exec.rs`: [`ExecutorError`] and [`ExecError`],
//! `interp.rs`: [`InterpError`], ...),
//! re-exported by the stage that raises them, and wrapped by a variant of
//! [`Error`] that adds the file (or bucket) they concern. This module
//! imports no stage: it is on the ground floor.

mod artifact;
mod bench;
mod buckets;
mod builder;
mod checkpoint;
mod exec;
mod home;
mod host;
mod hub;
mod interp;
mod lm;
mod mlpackage;
mod named;
mod preprocess;
mod reference;

use std::path::{Path, PathBuf};

pub use artifact::ManifestError;
pub use bench::{BenchError, PlistError};
pub use buckets::BucketsError;
pub use builder::BuildError;
pub use checkpoint::{FieldError, SafetensorsError};
pub use exec::{ChildExit, ExecError, ExecutorError};
pub use home::HomeError;
pub use host::HostError;
pub use hub::HubError;
pub use interp::InterpError;
pub use lm::LmError;
pub use mlpackage::{PackageError, PathProblem, ProgramError};
pub use named::UnknownName;
pub use preprocess::{ImageError, PreprocessError};
pub use reference::GridError;

use crate::acceptance::Acceptance;

/// Errors raised while reading checkpoints, images and tensors, or computing.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A file could not be opened or read. The OS error is in the message
    /// and is not also a `source`, so that a chain printed whole (`{:#}`)
    /// says it once.
    #[error("{}: {error}", path.display())]
    Io {
        path: PathBuf,
        error: std::io::Error,
    },

    /// A JSON file (config.json, preprocessor_config.json, an index) is malformed
    /// or lacks a field.
    #[error("{}: {msg}", path.display())]
    Config { path: PathBuf, msg: String },

    /// A field of a JSON config (`config.json`, `preprocessor_config.json`)
    /// cannot be used; the [`FieldError`] names it.
    #[error("{}: {error}", path.display())]
    Field { path: PathBuf, error: FieldError },

    /// A checkpoint cannot be used: missing files, pickles, unsupported family.
    #[error("{}: {msg}", path.display())]
    Checkpoint { path: PathBuf, msg: String },

    /// A safetensors file is malformed.
    #[error("{}: malformed safetensors: {error}", path.display())]
    Safetensors {
        path: PathBuf,
        error: SafetensorsError,
    },

    /// Tensors could not be written as safetensors (the tensor, when one is
    /// at fault, and the `safetensors` crate's error).
    #[error("{}{error}", tensor.as_ref().map(|t| format!("tensor `{t}`: ")).unwrap_or_default())]
    TensorWrite {
        tensor: Option<String>,
        error: safetensors::tensor::SafeTensorError,
    },

    /// An `.mlpackage` (`path`: the package, or the file of it at fault)
    /// cannot be read.
    #[error("{}: {error}", path.display())]
    Package {
        path: PathBuf,
        error: Box<PackageError>,
    },

    /// A pickled checkpoint file (`.bin`, `.pt`, ...): never loaded, since
    /// unpickling can execute arbitrary code.
    #[error("{}: refusing to load a pickled checkpoint: unpickling can execute arbitrary code. \
             Convert it to safetensors first (e.g. with transformers' `save_pretrained(..., safe_serialization=True)`)", .0.display())]
    Pickled(PathBuf),

    /// A `model_type` no family handles.
    #[error("{}: model_type `{model_type}` is not a supported vision model; supported: {supported}",
        path.display())]
    UnsupportedModel {
        path: PathBuf,
        model_type: String,
        supported: String,
    },

    /// Weights holding NaN or Inf, which an export refuses (the names of
    /// the tensors).
    #[error("{}: {} tensors hold NaN or Inf values ({}); refusing to export them", path.display(), tensors.len(), tensors.join(", "))]
    NonFinite { path: PathBuf, tensors: Vec<String> },

    /// Tower tensors that no layer read once the tower was loaded: the
    /// config describes fewer layers than the checkpoint holds.
    #[error("{}: {} tower tensor{} not read by any layer config.json describes ({}{}): the config disagrees with the weights (e.g. a `depth` or `num_hidden_layers` smaller than the blocks saved)",
        path.display(), tensors.len(), if tensors.len() == 1 { " is" } else { "s are" },
        tensors.iter().take(4).map(|t| format!("`{t}`")).collect::<Vec<_>>().join(", "),
        if tensors.len() > 4 { ", ..." } else { "" })]
    Unread { path: PathBuf, tensors: Vec<String> },

    /// One tensor is missing or disagrees with what the config implies.
    #[error("{}: tensor `{tensor}`: {msg}", path.display())]
    Tensor {
        path: PathBuf,
        tensor: String,
        msg: String,
    },

    /// An image cannot be decoded, is outside the limits, or cannot be
    /// preprocessed.
    #[error("{}: {error}", path.display())]
    Image { path: PathBuf, error: ImageError },

    /// The Hugging Face hub could not give a repository or one of its files:
    /// `what` is `org/name` or `org/name/path`, `error` what went wrong.
    #[error("{what}: {error}")]
    Hub { what: String, error: Box<HubError> },

    /// The output of a build exists and replacing it was not asked for.
    #[error("--out {}: already exists; pass --force to replace it", .0.display())]
    Exists(PathBuf),

    /// The output of a build is a directory that is not an artifact: never
    /// replaced, since that would delete files the tool did not write.
    #[error("--out {}: exists and is not an artifact (no manifest.json); refusing to replace it, even with --force: \
             choose a new path or an empty directory", .0.display())]
    NotAnArtifact(PathBuf),

    /// Another build holds the lock beside the output.
    #[error("--out {}: another build is writing there (it holds {})", out.display(), lock.display())]
    Busy { out: PathBuf, lock: PathBuf },

    /// A file of an artifact is not what its manifest lists: changed after
    /// the build (or gating), or damaged.
    #[error("{}: sha256 {got} differs from the manifest's {want}: the file changed after the build", path.display())]
    Modified {
        path: PathBuf,
        got: String,
        want: String,
    },

    /// An artifact the gates did not accept, loaded without leave.
    #[error("{}: the artifact {}; --allow-unaccepted loads it anyway", manifest.display(), acceptance.refusal())]
    NotAccepted {
        manifest: PathBuf,
        acceptance: Acceptance,
    },

    /// A field of an artifact's `manifest.json` cannot be used.
    #[error("{}: {error}", path.display())]
    Manifest { path: PathBuf, error: ManifestError },

    /// A bucket asked for that the artifact does not have (`known`: those it has).
    #[error("unknown bucket `{name}`; the artifact has: {}", known.join(", "))]
    UnknownBucket { name: String, known: Vec<String> },

    /// A buckets file (`file`: its path, or `built-in defaults`) cannot be used.
    #[error("{file}: {error}")]
    Buckets { file: String, error: BucketsError },

    /// A bucket the family cannot build (`BucketsError::Unsuitable`,
    /// `BucketsError::Slots`); `name` is given when the error does not say it.
    #[error("{}{error}", name.as_ref().map(|n| format!("bucket {n}: ")).unwrap_or_default())]
    Bucket {
        name: Option<String>,
        error: BucketsError,
    },

    /// The language model cannot answer.
    #[error(transparent)]
    Lm(#[from] LmError),

    /// A build that cannot be made.
    #[error(transparent)]
    Build(#[from] BuildError),

    /// A call's `pixel_values` and `grid_thw` do not go together.
    #[error(transparent)]
    Grid(#[from] GridError),

    /// A bucket could not be executed or its outputs could not be read.
    #[error("bucket {bucket}: {error}")]
    Exec { bucket: String, error: ExecError },

    /// An executor failed outside a bucket's run (Core ML off macOS, its
    /// compute plan).
    #[error(transparent)]
    Executor(#[from] ExecutorError),

    /// An image cannot be sized for the model, or images cannot be batched.
    #[error(transparent)]
    Preprocess(#[from] PreprocessError),

    /// `powermetrics` or `system_profiler` could not be run or read.
    #[error(transparent)]
    Bench(#[from] BenchError),

    /// One of the tool's own files (a default golden set, the venv) is not found.
    #[error(transparent)]
    Home(#[from] HomeError),

    /// Invalid arguments or inputs that are not tied to one file.
    #[error("{0}")]
    Invalid(String),

    /// A tensor computation failed (a bug, or an input that slipped past validation).
    #[error("tensor computation failed: {0}")]
    Candle(#[from] candle_core::Error),
}

/// Shorthand used across the library.
pub type Result<T, E = Error> = std::result::Result<T, E>;

impl Error {
    pub(crate) fn io(path: &Path, error: std::io::Error) -> Self {
        Error::Io {
            path: path.to_path_buf(),
            error,
        }
    }
    pub(crate) fn config(path: &Path, msg: impl Into<String>) -> Self {
        Error::Config {
            path: path.to_path_buf(),
            msg: msg.into(),
        }
    }
    pub(crate) fn field(path: &Path, error: FieldError) -> Self {
        Error::Field {
            path: path.to_path_buf(),
            error,
        }
    }
    pub(crate) fn package(path: &Path, error: PackageError) -> Self {
        Error::Package {
            path: path.to_path_buf(),
            error: Box::new(error),
        }
    }
    pub(crate) fn checkpoint(path: &Path, msg: impl Into<String>) -> Self {
        Error::Checkpoint {
            path: path.to_path_buf(),
            msg: msg.into(),
        }
    }
    pub(crate) fn tensor(path: &Path, tensor: &str, msg: impl Into<String>) -> Self {
        Error::Tensor {
            path: path.to_path_buf(),
            tensor: tensor.to_string(),
            msg: msg.into(),
        }
    }
    pub(crate) fn image(path: &Path, error: ImageError) -> Self {
        Error::Image {
            path: path.to_path_buf(),
            error,
        }
    }
}
