//! Why the host inputs of a call cannot be made (`host` and the families'
//! `host.rs` raise it; [`super::ExecError::HostInputs`] names the bucket).

/// Why the host inputs of one call cannot be made.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum HostError {
    /// A field of the manifest's host recipe is missing or holds what the
    /// family's host does not compute (`field`: e.g. `host.rope_theta`).
    #[error("{field}: {msg}")]
    Recipe { field: &'static str, msg: String },
    /// A table the family's host reads is not in `host.safetensors`.
    #[error("host table `{0}` is missing")]
    MissingTable(String),
    /// A host table of another size than the config implies.
    #[error("host table `{name}` holds {got} values, expected [{rows}, {cols}]")]
    TableSize {
        name: &'static str,
        got: usize,
        rows: usize,
        cols: usize,
    },
    /// The images of the call do not fit the bucket: a larger bucket (or
    /// fewer images) would take them.
    #[error("{0}")]
    DoesNotFit(String),
    /// The bucket does not suit the family (its slots are not a whole
    /// number of windows, not a square grid).
    #[error("{0}")]
    Bucket(String),
    /// The batch disagrees with the model or with itself (row length, its
    /// grid, the number of images a call takes).
    #[error("{0}")]
    Batch(String),
}
