//! Why a buckets file (`buckets.yaml`) cannot be used (`buckets` raises it;
//! [`super::Error::Buckets`] names the file). `index` is a bucket's place in
//! the file's list, `name` its name.

/// Why a buckets file cannot be used, or a bucket asked for is not in it.
#[derive(Debug, thiserror::Error)]
pub enum BucketsError {
    /// Not YAML, or not the fields of a buckets file (the parser's message).
    #[error("invalid buckets file: {0}")]
    Yaml(serde_yaml::Error),
    #[error("field `buckets`: at least one bucket is needed")]
    NoBuckets,
    /// A name that is not an identifier (letters, digits, `_`; up to 64).
    #[error("buckets[{index}].name `{name}`: expected an identifier (letters, digits, _)")]
    Name { index: usize, name: String },
    #[error("buckets[{index}] `{name}`: give one of `patches`, `pixels` or `tokens`, not several")]
    PatchesAndPixels { index: usize, name: String },
    /// A text encoder's bucket outside 1..=`max` tokens (ANE-RULES R6).
    #[error("buckets[{index}] `{name}`: tokens {tokens} must be 1 to {max} (ANE-RULES R6)")]
    Tokens {
        index: usize,
        name: String,
        tokens: u64,
        max: u64,
    },
    /// A fixed-resolution bucket's side outside 1..=`max`.
    #[error("buckets[{index}] `{name}`: pixels {pixels} must be a side of 1 to {max}")]
    Pixels {
        index: usize,
        name: String,
        pixels: u64,
        max: u64,
    },
    #[error("buckets[{index}] `{name}`: patches {patches} must be a positive multiple of 4")]
    Patches {
        index: usize,
        name: String,
        patches: u64,
    },
    /// More patches than the Neural Engine's axis limit `max` (ANE-RULES R6).
    #[error(
        "buckets[{index}] `{name}`: {patches} patches exceed the Neural Engine axis limit of {max} (ANE-RULES R6)"
    )]
    TooManyPatches {
        index: usize,
        name: String,
        patches: u64,
        max: u64,
    },
    /// A bucket's own threshold outside [0, 1].
    #[error("buckets[{index}].{key}: {value} is outside [0, 1]")]
    Threshold {
        index: usize,
        key: &'static str,
        value: f64,
    },
    #[error("buckets[{index}]: name `{name}` is used twice")]
    Duplicate { index: usize, name: String },
    /// A gate's threshold outside [0, 1].
    #[error("gates.{key}: {value} is outside [0, 1]")]
    GateThreshold { key: &'static str, value: f64 },
    /// A bucket asked for that the file does not list (`known`: those it does).
    /// A bucket that does not suit the family: `pixels` for a family that
    /// counts patches, or `patches` for a fixed-resolution one, or a side
    /// the patch does not divide (the message says which).
    #[error("bucket `{name}`: {msg}")]
    Unsuitable { name: String, msg: String },
    /// A bucket of slots that is not a whole number of the units the family
    /// lays out (merged patches, windows): the message says which.
    #[error("{0}")]
    Slots(String),
    #[error("unknown bucket `{name}`; the buckets file has: {}", known.join(", "))]
    Unknown { name: String, known: Vec<String> },
}
