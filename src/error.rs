//! The library's error type.
//!
//! Every variant that comes from user input names the file (and, where there
//! is one, the tensor or field) and says what was expected. The binaries map
//! any error to exit code 2 ("could not run"); exit code 1 is reserved for a
//! check that ran and said no (the gates).

use std::path::{Path, PathBuf};

/// Errors raised while reading checkpoints, images and tensors, or computing.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A file could not be opened or read.
    #[error("{}: {source}", path.display())]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },

    /// A JSON file (config.json, preprocessor_config.json, an index) is malformed
    /// or lacks a field.
    #[error("{}: {msg}", path.display())]
    Config { path: PathBuf, msg: String },

    /// A checkpoint cannot be used: missing files, pickles, unsupported family.
    #[error("{}: {msg}", path.display())]
    Checkpoint { path: PathBuf, msg: String },

    /// A safetensors file is malformed.
    #[error("{}: malformed safetensors: {msg}", path.display())]
    Safetensors { path: PathBuf, msg: String },

    /// One tensor is missing or disagrees with what the config implies.
    #[error("{}: tensor `{tensor}`: {msg}", path.display())]
    Tensor {
        path: PathBuf,
        tensor: String,
        msg: String,
    },

    /// An image cannot be decoded or is outside the limits.
    #[error("{}: {msg}", path.display())]
    Image { path: PathBuf, msg: String },

    /// The Hugging Face hub could not give a repository or one of its files:
    /// `what` is `org/name` or `org/name/path`, `error` what went wrong.
    #[error("{what}: {error}")]
    Hub {
        what: String,
        #[source]
        error: crate::checkpoint::hub::HubError,
    },

    /// The output of a build exists and replacing it was not asked for.
    #[error("--out {}: already exists; pass --force to replace it", .0.display())]
    Exists(PathBuf),

    /// Another build holds the lock beside the output.
    #[error("--out {}: another build is writing there (it holds {})", out.display(), lock.display())]
    Busy { out: PathBuf, lock: PathBuf },

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
    pub(crate) fn io(path: &Path, source: std::io::Error) -> Self {
        Error::Io {
            path: path.to_path_buf(),
            source,
        }
    }
    pub(crate) fn config(path: &Path, msg: impl Into<String>) -> Self {
        Error::Config {
            path: path.to_path_buf(),
            msg: msg.into(),
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
    pub(crate) fn image(path: &Path, msg: impl Into<String>) -> Self {
        Error::Image {
            path: path.to_path_buf(),
            msg: msg.into(),
        }
    }
}
