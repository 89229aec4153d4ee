//! `ane-export build` as a library: what a build is asked for (a
//! [`BuildPlan`]), and the choices it takes.

use crate::named::named_enum;

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
        /// The position table resampled with half-pixel centres instead of aligned corners.
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
