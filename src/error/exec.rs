//! Why one bucket of an artifact could not give its rows (the runtime and
//! the cosine gate raise it; [`super::Error::Exec`] names the bucket), and
//! why an executor could not run a function ([`ExecutorError`], `exec`
//! raises it).

use std::time::Duration;

use super::{InterpError, PackageError};

/// Why one bucket could not give its rows.
#[derive(Debug)]
pub enum ExecError {
    /// The host inputs cannot be made for these images in this bucket.
    HostInputs(super::HostError),
    /// The executor failed.
    Executor(ExecutorError),
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
            ExecError::Executor(e) => e.fmt(f),
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

/// How a child process of Core ML or Core AI (`runtime`) ended: its exit
/// code (`None`: killed by a signal) and the end of what it printed on
/// stderr.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{}", match code {
    Some(c) => format!("{runtime} child exited {c}: {stderr}"),
    None if *runtime == "Core ML" => format!(
        "Core ML child was killed by a signal (a failed Neural Engine compile kills the \
         process on its first prediction, R18): {stderr}"
    ),
    None => format!("{runtime} child was killed by a signal: {stderr}"),
})]
pub struct ChildExit {
    /// "Core ML" or "Core AI".
    pub runtime: &'static str,
    pub code: Option<i32>,
    pub stderr: String,
}

/// A `runtime` child stopped for giving no reply within `limit` while
/// doing `what`; `flag` sets the limit.
fn too_late(runtime: &str, limit: &Duration, what: &str, flag: &str, stderr: &str) -> String {
    format!(
        "the {runtime} child gave no reply in {} s for {what}, and was stopped \
         (raise the limit with {flag}, 0 for none); it printed: {stderr}",
        limit.as_secs_f64()
    )
}

/// Why an executor could not run a function of a package (or, for Core ML,
/// plan one).
#[derive(Debug, thiserror::Error)]
pub enum ExecutorError {
    /// The MIL interpreter refused the function or failed running it
    /// (boxed, as [`ExecutorError::Package`] is: it is large).
    #[error("{0}")]
    Interpreter(Box<InterpError>),
    /// An executor of packages was given a bucket without one (an
    /// artifact that ships the `.aimodel` alone).
    #[error(
        "{executor} runs packages, and the artifact ships the .aimodel alone: use --executor coreai"
    )]
    NoPackage { executor: String },
    /// Core ML was asked for off macOS.
    #[error("--executor coreml needs macOS (Core ML); on this machine use --executor mil")]
    NeedsMacOs,
    /// The function is not in the package.
    #[error(transparent)]
    Package(Box<PackageError>),
    /// A tensor going in or out could not be converted (its message).
    #[error("{0}")]
    Tensor(String),
    /// The Core ML child could not be started: what failed, and why (a
    /// temporary directory, its stderr file, the venv's Python, ...).
    #[error("{what}: {cause}")]
    Start { what: String, cause: String },
    /// The files the Core ML child exchanges could not be written or read
    /// (the message).
    #[error("{0}")]
    Exchange(String),
    /// The Core ML or Core AI (`runtime`) child answered that the
    /// prediction failed (its message).
    #[error("{runtime}: {function}: {error}")]
    Failed {
        runtime: &'static str,
        function: String,
        error: String,
    },
    /// The Core ML child ended before replying; the next prediction starts
    /// a new one.
    #[error("{function}: {exit}")]
    Died { function: String, exit: ChildExit },
    /// The Core ML child wrote something that is not a reply (`line`, its
    /// start), and was stopped.
    #[error("{function}: its reply is not a reply ({error}): {line:?}; {exit}")]
    NotAReply {
        function: String,
        error: String,
        line: String,
        exit: Box<ChildExit>,
    },
    /// The Core ML child gave no reply within `limit` and was stopped:
    /// while loading the function's model (`--coreml-load-timeout`), or
    /// predicting with it loaded (`--coreml-timeout`).
    #[error("{function}: {}", if *loading {
        too_late(runtime, limit, "its first prediction, which loads and compiles the model", "--coreml-load-timeout", stderr)
    } else {
        too_late(runtime, limit, "a prediction of a loaded model", "--coreml-timeout", stderr)
    })]
    NoReply {
        runtime: &'static str,
        function: String,
        loading: bool,
        limit: Duration,
        stderr: String,
    },
    /// A one-shot child (`MLComputePlan`; Core AI's op listing) ran past
    /// the load limit and was stopped.
    #[error(
        "{}",
        too_late(
            if *what == "MLComputePlan" { "Core ML" } else { "Core AI" },
            limit,
            &format!("{what}, which loads the model"),
            "--coreml-load-timeout",
            stderr
        )
    )]
    PlanNoReply {
        what: &'static str,
        limit: Duration,
        stderr: String,
    },
    /// A one-shot child (`MLComputePlan`; Core AI's op listing) failed.
    #[error(transparent)]
    PlanFailed(ChildExit),
    /// The plan it wrote is not what `ane_export.coreml plan` writes (the
    /// JSON error).
    #[error("compute plan: {0}")]
    BadPlan(String),
    /// An output the Core ML child wrote is not f32.
    #[error("output `{0}` is not f32")]
    NotF32(String),
}

impl From<InterpError> for ExecutorError {
    fn from(e: InterpError) -> Self {
        ExecutorError::Interpreter(Box::new(e))
    }
}

impl From<PackageError> for ExecutorError {
    fn from(e: PackageError) -> Self {
        ExecutorError::Package(Box::new(e))
    }
}
