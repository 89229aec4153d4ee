//! Why an `.mlpackage` cannot be read: its `Manifest.json`, its model
//! protobuf, its weight file, or a blob a program points at (`mlpackage`
//! raises them; [`super::Error::Package`] names the file).

use std::path::PathBuf;

/// How a path inside a package (an item of `Manifest.json`, a weight file
/// a program names) fails to stay inside it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum PathProblem {
    #[error("is empty")]
    Empty,
    #[error("leaves the package (`..`)")]
    LeavesPackage,
    #[error("is absolute")]
    Absolute,
}

/// Why a package, or one of its files, cannot be read.
#[derive(Debug, thiserror::Error)]
pub enum PackageError {
    /// The path is not a directory.
    #[error("not an .mlpackage directory")]
    NotADirectory,
    /// `Manifest.json` or the model is larger than the reader allows.
    #[error("{len} bytes, above the limit of {max}")]
    TooLarge { len: u64, max: u64 },
    /// A symbolic link on the way to a file of the package.
    #[error("`{}` is a symbolic link; packages may not link outside themselves", .0.display())]
    Symlink(PathBuf),

    /// `Manifest.json` is not JSON.
    #[error("invalid JSON: {0}")]
    ManifestJson(serde_json::Error),
    /// A field of `Manifest.json` is missing or of another type; `expected`
    /// is what it must be (`an object`, `a string`).
    #[error("field `{field}`: missing or not {expected}")]
    ManifestField {
        field: String,
        expected: &'static str,
    },
    /// An item's path does not stay inside the package.
    #[error("field `itemInfoEntries.{id}.path`: `{path}` {problem}")]
    ItemPath {
        id: String,
        path: String,
        problem: PathProblem,
    },
    /// `rootModelIdentifier` names no item.
    #[error("field `rootModelIdentifier`: `{0}` names no item")]
    NoRootItem(String),

    /// The model file is not Core ML's protobuf.
    #[error("not a Core ML model protobuf: {0}")]
    NotAModel(prost::DecodeError),
    /// A Core ML model of another type (a neural network, a pipeline...).
    #[error("the model is not an ML program (only mlprogram packages are supported)")]
    NotAnMlProgram,
    /// An ML program without functions.
    #[error("the program has no functions")]
    NoFunctions,
    /// Something in function `function` the reader refuses: `at` says
    /// where (the op, its input, output or attribute), outermost first.
    #[error("function `{function}`: {}{problem}", at.iter().map(|a| format!("{a}: ")).collect::<String>())]
    Program {
        function: String,
        at: Vec<String>,
        problem: ProgramError,
    },
    /// The function asked for is not in the program.
    #[error("no function `{name}`; the package has: {}", available.join(", "))]
    NoSuchFunction {
        name: String,
        available: Vec<String>,
    },
    /// No function was named and the program has several, none the default.
    #[error("several functions ({}); choose one with --function", available.join(", "))]
    SeveralFunctions { available: Vec<String> },

    /// A program names a weight file outside `@model_path/`.
    #[error("weight file `{0}` does not start with @model_path/")]
    WeightFileOutside(String),
    /// A program names a weight file whose path leaves the package.
    #[error("weight file `{file}` {problem}")]
    WeightFilePath { file: String, problem: PathProblem },
    /// A value that is not a blob was read as one.
    #[error("not a blob value")]
    NotABlob,
    /// A blob in a weight file the package did not open.
    #[error("weight file `{0}` is not open")]
    WeightFileNotOpen(String),

    /// The weight file is shorter than its header.
    #[error("weight file is {0} bytes, shorter than its 64-byte header")]
    WeightFileTooShort(usize),
    /// A weight file of another storage version than 2.
    #[error("weight file version {0}, expected 2")]
    WeightFileVersion(u32),
    /// The header declares more blobs than the file can hold.
    #[error("weight file declares {count} blobs, more than {len} bytes can hold")]
    TooManyBlobs { count: u32, len: usize },
    /// A blob offset beyond what this machine addresses.
    #[error("blob offset {0} is out of range")]
    OffsetOutOfRange(u64),
    /// A blob offset inside the header or between records.
    #[error("blob offset {0} is not a 64-byte aligned offset past the header")]
    Misaligned(u64),
    /// A blob offset past the end of the weight file.
    #[error("blob offset {offset} is past the end of the weight file ({len} bytes)")]
    PastTheEnd { offset: u64, len: usize },
    /// The blob's metadata record is not one (its sentinel, `0xDEADBEEF` expected).
    #[error("blob at offset {offset}: bad sentinel {sentinel:#x}, expected 0xdeadbeef")]
    BadSentinel { offset: u64, sentinel: u32 },
    /// A blob of an element type MILBlob does not define.
    #[error("blob at offset {offset}: unknown dtype code {code}")]
    UnknownBlobDtype { offset: u64, code: u32 },
    /// A blob whose data runs past the end of the weight file.
    #[error(
        "blob at offset {offset}: data [{data_offset}, +{size}) runs past the end of the weight file ({len} bytes)"
    )]
    DataPastTheEnd {
        offset: u64,
        data_offset: u64,
        size: u64,
        len: usize,
    },
    /// A blob whose data starts inside its own metadata record.
    #[error("blob at offset {offset}: data offset {data_offset} overlaps its own metadata")]
    DataOverlapsRecord { offset: u64, data_offset: u64 },
    /// A blob's sub-byte padding that cannot be.
    #[error("blob at offset {offset}: padding of {bits} bits is invalid")]
    BadPadding { offset: u64, bits: u64 },
    /// A blob holding another number of values than its declared type
    /// (`dtype`s as the reader names them).
    #[error(
        "blob at offset {offset} holds {got} {blob_dtype} values, the type {dtype} {shape:?} needs {want}"
    )]
    BlobSize {
        offset: u64,
        got: u64,
        blob_dtype: String,
        dtype: String,
        shape: Vec<usize>,
        want: u64,
    },
    /// A blob an op names is not what its type says.
    #[error("function `{function}`, op `{op}` ({kind}), `{key}`: {error}")]
    OpBlob {
        function: String,
        op: String,
        kind: String,
        key: String,
        error: Box<PackageError>,
    },
}

/// What an ML program holds that the reader refuses (where is in
/// [`PackageError::Program`]).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ProgramError {
    /// The function has no block for its own opset.
    #[error("no block for its opset `{0}`")]
    NoBlock(String),
    #[error("{ops} operations, more than the limit of {limit}")]
    TooManyOps { ops: usize, limit: usize },
    /// A function output no operation produces.
    #[error("output `{0}` is produced by no operation")]
    NoProducer(String),
    #[error("nested blocks (control flow) are not supported")]
    ControlFlow,
    #[error("input `{0}` has an empty binding")]
    EmptyBinding(String),
    #[error("missing type")]
    MissingType,
    #[error("only tensor types are supported")]
    NotATensorType,
    #[error("unknown data type {0}")]
    UnknownDataType(i32),
    #[error("rank {rank} above the limit of {limit}")]
    RankTooHigh { rank: usize, limit: usize },
    #[error("dimension out of range")]
    DimensionOutOfRange,
    #[error("dynamic dimensions are not supported (static shapes only)")]
    DynamicShape,
    #[error("{elements} elements, above the limit of {limit}")]
    TooManyElements { elements: u64, limit: u64 },
    #[error("value without a type")]
    ValueWithoutType,
    #[error("only tensor immediates are supported")]
    NotATensorImmediate,
    #[error("immediate tensor without data")]
    ImmediateWithoutData,
    /// Raw bytes too few for the values of the type (`dtype` as the reader names it).
    #[error("{bytes} bytes cannot hold {n} {dtype} values")]
    TooFewBytes {
        bytes: usize,
        n: usize,
        dtype: String,
    },
    /// Another number of immediate values than the shape holds.
    #[error("{len} values for a tensor of shape {shape:?}")]
    ValueCount { len: usize, shape: Vec<usize> },
    #[error("value without data")]
    ValueWithoutData,
}

impl PackageError {
    /// A program failure in function `function`.
    pub(crate) fn program(function: &str, at: Vec<String>, problem: ProgramError) -> Self {
        PackageError::Program {
            function: function.to_string(),
            at,
            problem,
        }
    }
}
