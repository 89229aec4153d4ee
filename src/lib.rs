//! ane-export: turn the vision tower of a vision-language model into
//! static-shape Core ML packages for the Apple Neural Engine, and prove them
//! right.
//!
//! Data flows one way: checkpoint ([`checkpoint`]) -> host preprocessing
//! ([`preprocess`]) -> fp32 reference tower ([`reference`](mod@reference)), the oracle the
//! release gates compare exported packages against.

pub mod acceptance;
pub mod artifact;
pub mod bench;
pub mod blas;
pub mod bridge;
pub mod buckets;
pub mod builder;
pub mod checkpoint;
pub mod cli;
pub mod error;
pub mod exec;
pub mod export;
pub mod family;
pub mod gate;
pub mod home;
pub mod host;
pub mod interp;
pub mod lm;
pub mod mlpackage;
mod named;
pub mod preprocess;
pub mod reference;
pub mod runtime;
pub mod tensor_file;

pub use error::{Error, ImageError, Result};
