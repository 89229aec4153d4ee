//! `ane-export build` as a library: a [`BuildPlan`] holds every setting,
//! resolved (the buckets read and selected, the target and weights chosen),
//! and [`build`] makes its artifact in one call.
//!
//! The artifact is assembled in a temporary sibling directory and renamed
//! into place; `manifest.json` is written last, so a directory without a
//! valid manifest is never an artifact. An advisory lock (`flock`) on a file
//! beside the output keeps two builds from interleaving and dies with its
//! process; an existing artifact is replaced only with `force`, only once
//! the new one is complete, and by one atomic exchange where the OS has one
//! ([`publish`]). What a killed build left behind is removed by the next one.

pub mod calibrate;
mod pipeline;
mod publish;

use std::path::PathBuf;

pub use self::calibrate::Calibration;
pub use self::pipeline::build;
use crate::buckets::Bucket;
use crate::checkpoint::hub::HubEvents;
use crate::error::{BuildError, Error, Result};
use crate::named::named_enum;

/// What to build, every setting resolved.
#[derive(Clone, Debug)]
pub struct BuildPlan {
    /// The checkpoint: a directory, or a repo id resolved in the Hugging Face
    /// cache (fetching what it lacks).
    pub model: String,
    /// Revision of a repo id (default: main).
    pub revision: Option<String>,
    /// Where the hub's notes and download progress go.
    pub hub_events: HubEvents,
    /// The artifact directory to create.
    pub out: PathBuf,
    /// The buckets to build, in order.
    pub buckets: Vec<Bucket>,
    /// One package per bucket instead of one multifunction package.
    pub per_bucket: bool,
    pub target: Target,
    pub weights: WeightMode,
    /// The formats the artifact ships: the `.mlpackage`, the Core AI
    /// `.aimodel` translated from it, or both.
    pub format: Format,
    /// Queries per attention chunk (ANE-RULES R4); 0: no chunking.
    pub query_chunk: usize,
    /// The residual stream carried divided by this power of two
    /// (`--residual-scale`; 1: not scaled), for towers whose activations
    /// exceed fp16; `None`: chosen by calibration ([`calibrate`]) for a
    /// family whose builder scales.
    pub residual_scale: Option<u32>,
    /// The images calibration runs (every image of the folder); `None`: the
    /// cosine gate's default cases.
    pub calibration_images: Option<PathBuf>,
    /// The MLP's hidden layer carried divided by this power of two
    /// (`--branch-scale`), for the families whose builder scales it.
    pub branch_scale: Option<u32>,
    /// Replace an existing artifact at `out`.
    pub force: bool,
    /// Deliberate defects (the gates' own tests); empty for real builds.
    pub faults: Vec<Fault>,
}

impl BuildPlan {
    /// A plan that cannot be built, named before anything is read.
    pub fn check(&self) -> Result<()> {
        if !self.per_bucket && self.target != Target::Macos15 {
            return Err(BuildError::MultifunctionTarget {
                target: self.target.coremltools_name(),
            }
            .into());
        }
        if self.buckets.is_empty() {
            return Err(BuildError::NoBuckets.into());
        }
        if let Some(s) = self.residual_scale
            && !(s.is_power_of_two() && (1..=calibrate::MAX_SCALE).contains(&s))
        {
            return Err(BuildError::ResidualScale(s).into());
        }
        if let Some(s) = self.branch_scale
            && !(s.is_power_of_two() && (2..=4096).contains(&s))
        {
            return Err(BuildError::BranchScale(s).into());
        }
        match replaceable(&self.out)? {
            Existing::Artifact if !self.force => Err(Error::Exists(self.out.clone())),
            _ => Ok(()),
        }
    }
}

/// What stands at `--out` before a build.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Existing {
    /// Nothing, or an empty directory: built into without `--force`.
    Nothing,
    /// An artifact (a directory holding `manifest.json`): replaced only
    /// with `--force`.
    Artifact,
}

/// Whether a build may write `out`: nothing there, an empty directory, or
/// an artifact. Anything else (a file, a directory of other files) is
/// refused even with `--force`, since replacing it would delete what the
/// tool did not write.
pub(crate) fn replaceable(out: &std::path::Path) -> Result<Existing> {
    let meta = match std::fs::symlink_metadata(out) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Existing::Nothing),
        Err(e) => return Err(Error::io(out, e)),
        Ok(m) => m,
    };
    if !meta.is_dir() {
        return Err(BuildError::OutNotADirectory {
            out: out.to_path_buf(),
            what: if meta.file_type().is_symlink() {
                "a symbolic link"
            } else {
                "a file"
            },
        }
        .into());
    }
    if out.join("manifest.json").is_file() {
        return Ok(Existing::Artifact);
    }
    let mut entries = std::fs::read_dir(out).map_err(|e| Error::io(out, e))?;
    if entries.next().is_none() {
        return Ok(Existing::Nothing);
    }
    Err(Error::NotAnArtifact(out.to_path_buf()))
}

/// What a build made.
#[derive(Clone, Debug)]
pub struct Built {
    pub artifact: PathBuf,
    /// (name, slots) of each bucket built.
    pub buckets: Vec<(String, usize)>,
    /// What a bucket's slots are: `patches`, or `tokens` for a text encoder.
    pub slot_unit: &'static str,
    /// The packages written (their paths while the artifact was assembled).
    pub packages: Vec<PathBuf>,
    /// The Core AI program, where the artifact ships one (its final path).
    pub aimodel: Option<PathBuf>,
    pub fp16_weight_bytes: usize,
    /// Seconds in Python's emission (build, convert, compress, save).
    pub emit_s: f64,
    pub total_s: f64,
    /// The residual scale built with (`None`: a family that does not scale).
    pub residual_scale: Option<u32>,
    /// How it was chosen, when the build chose it.
    pub calibration: Option<Calibration>,
}

named_enum! {
    /// The stages of a build, in order.
    #[derive(Clone, Copy, Debug, PartialEq, Eq)]
    pub enum Stage {
        Read = "read",
        Layout = "layout",
        Calibrate = "calibrate",
        Emit = "emit and optimise",
        Verify = "verify",
        Translate = "translate to Core AI",
        Hash = "hash",
        Write = "write",
    }
}

named_enum! {
    /// Deployment targets.
    #[derive(Clone, Copy, Debug, PartialEq, Eq)]
    pub enum Target {
        Macos14 = "macos14",
        Macos15 = "macos15",
    }
}

impl Target {
    /// coremltools' name for the target.
    pub fn coremltools_name(self) -> &'static str {
        match self {
            Target::Macos14 => "macOS14",
            Target::Macos15 => "macOS15",
        }
    }
}

named_enum! {
    /// The formats an artifact ships (`--format`).
    #[derive(Clone, Copy, Debug, PartialEq, Eq)]
    pub enum Format {
        /// The Core ML package only.
        Mlpackage = "mlpackage",
        /// The Core AI program only (the package is emitted, translated and left out).
        Aimodel = "aimodel",
        /// The Core ML package and the Core AI program translated from it.
        Both = "both",
    }
}

impl Format {
    /// Whether the artifact ships the `.mlpackage`.
    pub fn mlpackage(self) -> bool {
        self != Format::Aimodel
    }

    /// Whether the artifact ships the `.aimodel`.
    pub fn aimodel(self) -> bool {
        self != Format::Mlpackage
    }

    /// The manifest's `formats`: the names of the formats shipped.
    pub fn shipped(self) -> Vec<&'static str> {
        let mut v = Vec::new();
        if self.mlpackage() {
            v.push("mlpackage");
        }
        if self.aimodel() {
            v.push("aimodel");
        }
        v
    }
}

named_enum! {
    /// How weights are stored in the package.
    #[derive(Clone, Copy, Debug, PartialEq, Eq)]
    pub enum WeightMode {
        Fp16 = "fp16",
        Int8 = "int8",
        Pal6 = "pal6",
        Pal8 = "pal8",
    }
}

named_enum! {
    /// Deliberate defects a build can inject (the gates' own tests). Gross
    /// ones, each for one gate, and subtle ones of the kind a port gets
    /// wrong, which the cosine gate must reject at its default threshold.
    #[derive(Clone, Copy, Debug, PartialEq, Eq)]
    pub enum Fault {
        /// Red and blue swapped in the patch embedding (the artifact sees BGR).
        SwapRb = "swap-rb",
        /// The attention mask ignored.
        NoMask = "no-mask",
        /// An identity gather (leaves the ANE, R8).
        Gather = "gather",
        /// One block's residual stream scaled by 65536 and back (inf in fp16).
        Overflow = "overflow",
        /// The rotary base recorded for the host 10x too large (100000 for 10000).
        RopeTheta = "rope-theta",
        /// Two attention heads' outputs exchanged before the output projection, in every block.
        SwapHeads = "swap-heads",
        /// Every LayerNorm's epsilon 10x too large.
        LnEps = "ln-eps",
        /// The position table resampled the wrong way: half-pixel centres instead
        /// of aligned corners (Qwen3-VL), antialiasing toggled (DINOv2).
        PosAlign = "pos-align",
        /// The 2x2 merge groups read in transposed order ((0,0), (1,0), (0,1), (1,1)).
        MergeOrder = "merge-order",
        /// int8 weights (per output channel) whose scales are applied along the
        /// input-channel axis, in every square 1x1 conv.
        Int8Axis = "int8-axis",
    }
}

impl Fault {
    /// Faults the host side carries (written into the manifest's `host`
    /// recipe); the others are in the program the Python builder emits.
    pub fn is_host(self) -> bool {
        matches!(self, Fault::RopeTheta | Fault::PosAlign)
    }
}
