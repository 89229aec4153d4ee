//! Why one bucket of an artifact could not give its rows (the runtime and
//! the cosine gate raise it; [`super::Error::Exec`] names the bucket).

/// Why one bucket could not give its rows.
#[derive(Debug, Clone, PartialEq)]
pub enum ExecError {
    /// The host inputs cannot be made for these images in this bucket.
    HostInputs(super::HostError),
    /// The executor failed (its own message).
    Executor(String),
    /// The package lacks an output the family names.
    MissingOutput(String),
    /// An output holds another number of values than `[1, width, 1, cols]`.
    OutputSize {
        name: String,
        got: usize,
        width: usize,
        cols: usize,
    },
}

impl std::error::Error for ExecError {}

impl std::fmt::Display for ExecError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ExecError::HostInputs(e) => write!(f, "{e}"),
            ExecError::Executor(m) => f.write_str(m),
            ExecError::MissingOutput(name) => write!(f, "the package has no output `{name}`"),
            ExecError::OutputSize {
                name,
                got,
                width,
                cols,
            } => write!(
                f,
                "output `{name}` holds {got} values, expected {width} x {cols}"
            ),
        }
    }
}
