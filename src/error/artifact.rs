//! Why an artifact's `manifest.json` cannot be used: a field missing,
//! malformed or unsupported, or a path leaving the artifact (`artifact`
//! raises it; [`super::Error::Manifest`] names the file).

use super::FieldError;

/// Why a field of an artifact's manifest cannot be used.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ManifestError {
    /// A field missing or not of its type (its name, `preprocessing.kernel`).
    #[error("field `{0}`: missing or malformed")]
    Malformed(String),
    /// A preprocessing flag recorded false, which the runtime does not do.
    #[error("field `{0} (false is not supported)`: missing or malformed")]
    Unsupported(String),
    /// `preprocessing.fixed` whose sizes do not give one square.
    #[error("field `preprocessing.fixed: {0}`: missing or malformed")]
    Fixed(FieldError),
    /// A path that is absolute or leaves the artifact (a package, a file).
    #[error("path `{0}` must be relative and stay inside the artifact")]
    Escapes(String),
}
