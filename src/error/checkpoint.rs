//! Why a checkpoint's files cannot be used: a malformed safetensors file
//! ([`SafetensorsError`], `checkpoint::safetensors` raises it) and a field of
//! a JSON config that is missing, of another type or out of range
//! ([`FieldError`], the `checkpoint::config` readers and the configs built
//! on them raise it). [`super::Error::Safetensors`] and
//! [`super::Error::Field`] name the file.

use safetensors::tensor::SafeTensorError;

/// Why a safetensors file is malformed. The variants the reader words
/// itself name the tensor at fault where there is one; any other refusal
/// is the `safetensors` crate's own error.
#[derive(Debug, thiserror::Error)]
pub enum SafetensorsError {
    /// Shorter than the 8 bytes that give the header's length.
    #[error("file is shorter than the 8-byte header length")]
    HeaderTooSmall,
    /// The header's length runs past the end of the file.
    #[error("header length runs past the end of the file (truncated?)")]
    HeaderPastEnd,
    /// A tensor's `data_offsets` hold another number of bytes than its
    /// dtype and shape need.
    #[error("tensor `{tensor}`: data_offsets [{start}, {end}] hold {} bytes but dtype and shape need {need}", end.saturating_sub(*start))]
    TensorSize {
        tensor: String,
        start: usize,
        end: usize,
        need: usize,
    },
    /// The tensors' data is not the bytes after the header: a truncated
    /// file, or trailing bytes.
    #[error(
        "header describes {described} bytes of tensor data but the file holds {held} (truncated or trailing bytes)"
    )]
    DataSize { described: usize, held: usize },
    /// A tensor's data offsets overlap another's, leave a gap or are out of order.
    #[error("tensor `{0}`: data offsets overlap, leave a gap or are out of order")]
    Offsets(String),
    /// Any other refusal of the `safetensors` crate (its error, kept as it
    /// is; its message is this error's).
    #[error("{0}")]
    Other(SafeTensorError),
}

/// Why a field of a JSON config (`config.json`, `preprocessor_config.json`)
/// cannot be used. Every variant but [`FieldError::NotAnObject`] and
/// [`FieldError::Inconsistent`] names the field, as the file spells it
/// (`vision_config.hidden_size`).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum FieldError {
    /// The file (or the part read) is not a JSON object.
    #[error("expected a JSON object")]
    NotAnObject,
    /// A required field is absent.
    #[error("field `{0}`: missing")]
    Missing(String),
    /// An object that is absent or of another type.
    #[error("field `{0}`: missing or not an object")]
    MissingObject(String),
    /// A field of another JSON type (`got`: the value as JSON).
    #[error("field `{field}`: expected {expected}, got {got}")]
    Type {
        field: String,
        expected: &'static str,
        got: String,
    },
    /// A list that is not of block indexes.
    #[error("field `{0}`: expected a list of block indexes")]
    NotIndexes(String),
    /// A value the tool does not support (an activation), with the values
    /// it does.
    #[error("field `{field}`: `{value}` is not supported, expected {expected}")]
    Unsupported {
        field: String,
        value: String,
        expected: String,
    },
    /// A value outside the range the tool accepts.
    #[error("field `{field}`: expected {expected}, got {got}")]
    Range {
        field: String,
        expected: String,
        got: String,
    },
    /// A value that disagrees with another field or with what the tool can
    /// build (the message says how).
    #[error("field `{field}`: {msg}")]
    Invalid { field: String, msg: String },
    /// Fields that disagree with each other (the message names them).
    #[error("{0}")]
    Inconsistent(String),
}

impl FieldError {
    /// [`FieldError::Range`].
    pub(crate) fn range(
        field: impl Into<String>,
        expected: impl Into<String>,
        got: impl std::fmt::Display,
    ) -> Self {
        FieldError::Range {
            field: field.into(),
            expected: expected.into(),
            got: got.to_string(),
        }
    }

    /// [`FieldError::Invalid`].
    pub(crate) fn invalid(field: impl Into<String>, msg: impl Into<String>) -> Self {
        FieldError::Invalid {
            field: field.into(),
            msg: msg.into(),
        }
    }

    /// The field at fault, as the file spells it, if one is.
    pub fn field(&self) -> Option<&str> {
        match self {
            FieldError::NotAnObject | FieldError::Inconsistent(_) => None,
            FieldError::Missing(f) | FieldError::MissingObject(f) | FieldError::NotIndexes(f) => {
                Some(f)
            }
            FieldError::Type { field, .. }
            | FieldError::Unsupported { field, .. }
            | FieldError::Range { field, .. }
            | FieldError::Invalid { field, .. } => Some(field),
        }
    }
}
