//! Why the MIL interpreter refused a function or failed running it
//! (`interp` raises it; [`super::ExecutorError::Interpreter`] carries it
//! out of an executor).
//!
//! A failure inside an op is wrapped once in [`InterpError::At`], which
//! names the function and the op; the variants it wraps say what the op
//! refused.

use super::PackageError;

/// Why the interpreter refused a function, or a run of it failed.
#[derive(Debug, thiserror::Error)]
pub enum InterpError {
    // The program is not one the interpreter runs (found before running).
    /// Ops the interpreter does not implement, as `(kind, op)` pairs (the
    /// op named by its first output), in program order.
    #[error("function `{function}` uses ops the interpreter does not support: {}",
        ops.iter().map(|(kind, op)| format!("`{kind}` (op `{op}`)")).collect::<Vec<_>>().join(", "))]
    UnsupportedOps {
        function: String,
        ops: Vec<(String, String)>,
    },
    /// A string parameter (`gelu`'s `mode`, `cast`'s `dtype`, `conv`'s
    /// `pad_type`) whose value the interpreter does not implement, with
    /// the values it does.
    #[error("op `{op}` ({kind}): {key} `{value}` is not supported by the interpreter; supported: {}",
        supported.join(", "))]
    UnsupportedParam {
        op: String,
        kind: String,
        key: String,
        value: String,
        supported: Vec<String>,
    },
    /// A form of an op the interpreter does not implement, met while
    /// running: a mode, a target dtype, a padding, `batch_dims` (the
    /// message says which).
    #[error("{0}")]
    Unsupported(String),
    /// Bytes of an element type the interpreter does not decode (the
    /// type, as the reader names it).
    #[error("cannot decode {0} bytes")]
    Undecodable(String),

    // The package.
    /// The function is not in the package, or a weight blob cannot be read.
    #[error(transparent)]
    Package(Box<PackageError>),

    // The caller's inputs.
    /// An input the function declares was not given (`dtype` as the
    /// reader names it).
    #[error("function `{function}` needs input `{name}` {dtype} {shape:?}")]
    MissingInput {
        function: String,
        name: String,
        dtype: String,
        shape: Vec<usize>,
    },
    /// An input of another shape than the function declares.
    #[error("input `{name}` has shape {got:?}, the function expects {expected:?}")]
    InputShape {
        name: String,
        expected: Vec<usize>,
        got: Vec<usize>,
    },
    /// A captured column beyond the value's last axis.
    #[error("captured column {column} of a last axis of {len}")]
    CaptureColumn { column: usize, len: usize },
    /// A value asked to be captured that the run never computed.
    #[error("value `{0}` was never computed")]
    NotComputed(String),

    // Values the program references that are absent.
    /// An op reads a variable no earlier op defined.
    #[error("variable `{0}` is used before it is defined")]
    Undefined(String),
    /// An op lacks an input it needs.
    #[error("missing input `{0}`")]
    MissingArg(String),
    /// A function output no op computed.
    #[error("output `{0}` was never computed")]
    OutputNotComputed(String),
    /// A string where an op needs a tensor (the string).
    #[error("expected a tensor, got the string `{0}`")]
    NotATensor(String),
    /// Raw bytes too few for the values of the type (`what`: the type, or
    /// the width of sub-byte values, `4-bit`).
    #[error("{bytes} bytes for {n} {what} values")]
    TooFewBytes {
        bytes: usize,
        n: usize,
        what: String,
    },

    // What an op computed, against what the program declares.
    /// An op gave another number of outputs than it declares.
    #[error("produced {got} outputs, declared {declared}")]
    OutputCount { got: usize, declared: usize },
    /// An output of another shape than declared.
    #[error("output `{name}` has shape {got:?}, declared {declared:?}")]
    OutputShape {
        name: String,
        got: Vec<usize>,
        declared: Vec<usize>,
    },

    // Arithmetic the interpreter checks.
    /// An int32 `add`, `sub`, `mul` ... whose exact result leaves int32.
    #[error("{kind} of int32 {x} and {y}: the result is outside int32's range")]
    Int32Overflow { kind: String, x: i64, y: i64 },
    /// An int32 reduction (`reduce_sum`, ...) whose exact result leaves int32.
    #[error("{kind} of an int32 tensor: the result {value} is outside int32's range")]
    Int32ReduceOverflow { kind: String, value: i64 },
    /// An int32 `real_div` by zero.
    #[error("real_div of int32 {0} by 0")]
    DivisionByZero(i64),

    /// An op's inputs or parameters are not ones it can run with: an axis
    /// out of range, a padding, a shape it cannot be reshaped to, a palette
    /// index (the message says which).
    #[error("{0}")]
    Invalid(String),
    /// A tensor operation failed (candle's error: shapes that do not
    /// agree, most often).
    #[error("{0}")]
    Candle(#[from] candle_core::Error),

    /// What failed in one op, with the function and the op (named by its
    /// first output) and its kind.
    #[error("function `{function}`, op `{op}` ({kind}): {error}")]
    At {
        function: String,
        op: String,
        kind: String,
        error: Box<InterpError>,
    },

    /// An invariant of the interpreter broken: a bug (the message).
    #[error("{0}")]
    Internal(String),
}

impl From<PackageError> for InterpError {
    fn from(e: PackageError) -> Self {
        InterpError::Package(Box::new(e))
    }
}

impl InterpError {
    /// The error inside [`InterpError::At`]'s context, if it is one (else itself).
    pub fn innermost(&self) -> &InterpError {
        match self {
            InterpError::At { error, .. } => error.innermost(),
            e => e,
        }
    }
}
