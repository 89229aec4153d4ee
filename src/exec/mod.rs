//! What executes an artifact's ML programs: the [`Executor`] interface, the
//! MIL interpreter behind it ([`MilExecutor`], any OS), Core ML on a Mac
//! ([`coreml::CoreMl`]) and the Core AI runtime on the artifact's
//! `.aimodel` ([`coreai::CoreAi`], Linux and macOS), both in a child
//! process ([`serve::Served`], supervised by [`child`]). The runtime
//! (`ane-run`) and the gates both run artifacts through it.

pub mod child;
pub mod coreai;
pub mod coreml;
pub mod serve;

use std::collections::HashMap;

use candle_core::Tensor;

pub use crate::error::{ChildExit, ExecutorError};
use crate::interp::{Capture, Interpreter, Precision, Profile, RunOutput, Settings};
use crate::mlpackage::Package;
use crate::named::named_enum;

named_enum! {
    /// Where an artifact is executed.
    #[derive(Clone, Copy, Debug, PartialEq, Eq)]
    pub enum ExecutorKind {
        Auto = "auto",
        Mil = "mil",
        Coreml = "coreml",
        Coreai = "coreai",
    }
}

impl ExecutorKind {
    /// Whether this choice means Core ML on this machine.
    pub fn is_coreml(self) -> bool {
        match self {
            ExecutorKind::Auto => cfg!(target_os = "macos"),
            ExecutorKind::Mil | ExecutorKind::Coreai => false,
            ExecutorKind::Coreml => true,
        }
    }

    /// What this choice means for the artifact `art`: the Core AI runtime
    /// on its `.aimodel` (an error naming it when it has none), Core ML
    /// with compute `units`, or the interpreter `mil`; the child processes
    /// with `timeouts`.
    pub fn for_artifact(
        self,
        art: &crate::artifact::Artifact,
        units: &str,
        timeouts: coreml::Timeouts,
        mil: MilExecutor,
    ) -> crate::Result<Box<dyn Executor>> {
        if self.on_aimodel(art)? {
            let mut c = coreai::CoreAi::for_artifact(crate::home::find_env()?, art)?;
            c.served.timeouts = timeouts;
            return Ok(Box::new(c));
        }
        Ok(match self.coreml(units, timeouts)? {
            Some(c) => Box::new(c),
            None => Box::new(mil),
        })
    }

    /// Core ML with compute `units` and `timeouts` when this choice means it
    /// here (`None` for the interpreter); an error off macOS when Core ML was
    /// asked for.
    pub fn coreml(
        self,
        units: &str,
        timeouts: coreml::Timeouts,
    ) -> crate::Result<Option<coreml::CoreMl>> {
        if !self.is_coreml() {
            return Ok(None);
        }
        if !cfg!(target_os = "macos") {
            return Err(ExecutorError::NeedsMacOs.into());
        }
        let mut c = coreml::CoreMl::new(crate::home::find_env()?);
        c.served.units = Some(units.into());
        c.served.timeouts = timeouts;
        Ok(Some(c))
    }
}

impl ExecutorKind {
    /// Whether this choice means the Core AI runtime for `art`: asked for,
    /// or `auto` on an artifact that ships the `.aimodel` alone; the
    /// interpreter or Core ML asked for on such an artifact is an error
    /// naming it.
    pub fn on_aimodel(self, art: &crate::artifact::Artifact) -> crate::Result<bool> {
        match self {
            ExecutorKind::Coreai => Ok(true),
            _ if art.ships_package() => Ok(false),
            ExecutorKind::Auto => Ok(true),
            other => Err(crate::Error::config(
                &art.dir.join("manifest.json"),
                format!(
                    "--executor {other}: the artifact ships the .aimodel alone (built with \
                     --format aimodel), which the Core AI runtime runs: use --executor coreai or auto"
                ),
            )),
        }
    }
}

/// One bucket's program, as the executors find it: the package's function
/// (absent from an artifact that ships the `.aimodel` alone), the
/// `.aimodel`'s function (absent from one that ships the package alone),
/// and the outputs to return, by name (the manifest's bucket entry).
#[derive(Clone, Copy)]
pub struct Target<'a> {
    /// The package and its function that runs the bucket.
    pub package: Option<(&'a Package, &'a str)>,
    /// The `.aimodel`'s function that runs the bucket (named like it).
    pub aimodel_function: Option<&'a str>,
    /// The outputs to return.
    pub outputs: &'a [String],
}

impl<'a> Target<'a> {
    /// `function` of `pkg` alone (no `.aimodel`), returning every output
    /// the function declares.
    pub fn package(pkg: &'a Package, function: &'a str, outputs: &'a [String]) -> Self {
        Target {
            package: Some((pkg, function)),
            aimodel_function: None,
            outputs,
        }
    }

    /// The package and its function, for an executor that runs packages;
    /// an error naming `executor` without one.
    pub fn needs_package(
        &self,
        executor: &str,
    ) -> std::result::Result<(&'a Package, &'a str), ExecutorError> {
        self.package.ok_or_else(|| ExecutorError::NoPackage {
            executor: executor.to_string(),
        })
    }
}

/// Runs one bucket of an artifact on host inputs: the MIL interpreter on any
/// OS, Core ML on a Mac ([`coreml`]), the Core AI runtime ([`coreai`]).
pub trait Executor: Sync {
    /// How outputs are produced, for reports (e.g. "mil-interpreter fp16").
    fn describe(&self) -> String;
    /// Run the bucket's program `target` on named inputs; also return the
    /// values `capture` names, where the executor can (the interpreter;
    /// not Core ML or Core AI).
    fn run(
        &self,
        target: Target<'_>,
        inputs: &HashMap<String, Tensor>,
        capture: &Capture,
    ) -> std::result::Result<RunOutput, ExecutorError>;
    /// Whether several runs may execute at once, each on threads of its
    /// own (the cosine gate then runs its cases side by side). False
    /// unless an executor says so.
    fn concurrent_runs(&self) -> bool {
        false
    }
}

/// The MIL interpreter in a numeric mode, run with `settings`; each run's
/// profile, where the settings ask for one, is handed to `on_profile` (the
/// CLI prints it).
#[derive(Clone, Copy, Debug)]
pub struct MilExecutor {
    pub precision: Precision,
    pub settings: Settings,
    pub on_profile: Option<fn(&Profile)>,
}

impl MilExecutor {
    /// The interpreter in `precision`, with the default [`Settings`].
    pub fn new(precision: Precision) -> Self {
        MilExecutor {
            precision,
            settings: Settings::default(),
            on_profile: None,
        }
    }
}

impl Executor for MilExecutor {
    fn describe(&self) -> String {
        match self.precision {
            Precision::Fp16 => "mil-interpreter fp16".into(),
            Precision::Fp32 => "mil-interpreter fp32".into(),
            Precision::Ane => "mil-interpreter ane".into(),
        }
    }
    fn run(
        &self,
        target: Target<'_>,
        inputs: &HashMap<String, Tensor>,
        capture: &Capture,
    ) -> std::result::Result<RunOutput, ExecutorError> {
        let (pkg, function) = target.needs_package(&self.describe())?;
        let out = Interpreter::with_settings(pkg, Some(function), self.settings)
            .and_then(|i| i.run_capturing(inputs, self.precision, capture))
            .map_err(ExecutorError::from)?;
        if let (Some(p), Some(report)) = (&out.profile, self.on_profile) {
            report(p);
        }
        Ok(out)
    }
    /// The interpreter's runs share nothing but the package's decoded
    /// constants (behind a lock), and each runs on the rayon pool it is
    /// called from.
    fn concurrent_runs(&self) -> bool {
        true
    }
}
