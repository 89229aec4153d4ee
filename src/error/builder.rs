//! Why a build cannot be made: a plan that asks for what the tool cannot
//! build, an `--out` it cannot write, a package that is not what the family
//! says (`builder` raises it).

use std::path::PathBuf;

/// Why a build cannot be made.
#[derive(Debug, thiserror::Error)]
pub enum BuildError {
    /// One multifunction package needs macOS 15 (`target`: coremltools' name).
    #[error(
        "--target {target}: multifunction packages need macOS 15; add --per-bucket for one package per bucket"
    )]
    MultifunctionTarget { target: &'static str },
    /// A plan without buckets.
    #[error("no buckets to build")]
    NoBuckets,
    /// `--residual-scale` outside the powers of two from 1 to 4096.
    #[error("--residual-scale {0}: expected a power of two from 1 (no scaling) to 4096")]
    ResidualScale(u32),
    /// `--residual-scale` for a family whose builder does not scale.
    #[error("--residual-scale {scale}: the {family} builder does not scale its residual stream yet ({} do)", families.join(", "))]
    ResidualScaleFamily {
        scale: u32,
        family: &'static str,
        families: Vec<&'static str>,
    },
    /// `--branch-scale` outside the powers of two from 2 to 4096.
    #[error("--branch-scale {0}: expected a power of two from 2 to 4096")]
    BranchScale(u32),
    /// `--branch-scale` for a family whose builder has no linear branch to scale.
    #[error("--branch-scale {scale}: the {family} builder does not scale its MLP branch ({} do)", families.join(", "))]
    BranchScaleFamily {
        scale: u32,
        family: &'static str,
        families: Vec<&'static str>,
    },
    /// A test fault the family has nothing to apply to (`fault`: its name).
    #[error("--fault {fault}: {family} has no {what}")]
    FaultNotApplicable {
        fault: &'static str,
        family: &'static str,
        what: &'static str,
    },
    /// `--out` is a file or a symbolic link (`what`: which).
    #[error("--out {}: is {what}, expected a directory path (an artifact, an empty directory, or one to create)", out.display())]
    OutNotADirectory { out: PathBuf, what: &'static str },
    /// `--out`'s parent directory cannot be made.
    #[error("--out {}: cannot create its parent directory {}: {error}", out.display(), parent.display())]
    OutParent {
        out: PathBuf,
        parent: PathBuf,
        error: std::io::Error,
    },
    /// The build's lock or temporary directory cannot be written beside `--out`.
    #[error("--out {}: cannot write the artifact there: {error}", out.display())]
    OutUnwritable { out: PathBuf, error: std::io::Error },
    /// A package written by the builder whose function is not what the
    /// family says (a builder bug; `what` says which part).
    #[error("bucket {bucket}: {what}")]
    Verify { bucket: String, what: String },
}
