//! What executes an artifact's ML programs: the [`Executor`] interface, the
//! MIL interpreter behind it ([`MilExecutor`], any OS), and Core ML on a Mac
//! ([`coreml::CoreMl`], in a child process supervised by [`child`]). The
//! runtime (`ane-run`) and the gates both run artifacts through it.

pub mod child;
pub mod coreml;

use std::collections::HashMap;

use candle_core::Tensor;

pub use crate::error::{ChildExit, ExecutorError};
use crate::interp::{Capture, Interpreter, Precision, RunOutput};
use crate::mlpackage::Package;
use crate::named::named_enum;

named_enum! {
    /// Where an artifact is executed.
    #[derive(Clone, Copy, Debug, PartialEq, Eq)]
    pub enum ExecutorKind {
        Auto = "auto",
        Mil = "mil",
        Coreml = "coreml",
    }
}

impl ExecutorKind {
    /// Whether this choice means Core ML on this machine.
    pub fn is_coreml(self) -> bool {
        match self {
            ExecutorKind::Auto => cfg!(target_os = "macos"),
            ExecutorKind::Mil => false,
            ExecutorKind::Coreml => true,
        }
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
        c.units = units.into();
        c.timeouts = timeouts;
        Ok(Some(c))
    }
}

/// Runs one bucket of an artifact on host inputs: the MIL interpreter on any
/// OS, Core ML on a Mac ([`coreml`]).
pub trait Executor: Sync {
    /// How outputs are produced, for reports (e.g. "mil-interpreter fp16").
    fn describe(&self) -> String;
    /// Run `function` on named inputs; also return the values `capture`
    /// names, where the executor can (the interpreter; not Core ML).
    fn run(
        &self,
        pkg: &Package,
        function: &str,
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

/// The MIL interpreter in a numeric mode.
pub struct MilExecutor(pub Precision);

impl Executor for MilExecutor {
    fn describe(&self) -> String {
        match self.0 {
            Precision::Fp16 => "mil-interpreter fp16".into(),
            Precision::Fp32 => "mil-interpreter fp32".into(),
        }
    }
    fn run(
        &self,
        pkg: &Package,
        function: &str,
        inputs: &HashMap<String, Tensor>,
        capture: &Capture,
    ) -> std::result::Result<RunOutput, ExecutorError> {
        Interpreter::new(pkg, Some(function))
            .and_then(|i| i.run_capturing(inputs, self.0, capture))
            .map_err(ExecutorError::Interpreter)
    }
    /// The interpreter's runs share nothing but the package's decoded
    /// constants (behind a lock), and each runs on the rayon pool it is
    /// called from.
    fn concurrent_runs(&self) -> bool {
        true
    }
}
