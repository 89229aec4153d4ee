//! The one door to Python (the only module that uses pyo3).
//!
//! Python does only what needs coremltools or coreai-core: assembling MIL
//! programs and saving packages, and translating them into Core AI
//! programs. The interpreter is started once, pointed explicitly at
//! the project's venv (`$ANE_EXPORT_VENV`, else the `.venv` of the tool's
//! home, [`crate::home`]: an embedded interpreter does not honour
//! `VIRTUAL_ENV`), checked against the pins, and
//! given weights as numpy arrays that take ownership of Rust's buffers (no
//! copy). A Python exception becomes an error naming the stage and carrying
//! the traceback.

use std::path::{Path, PathBuf};

use numpy::{IntoPyArray, PyArrayMethods};
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList};

pub use crate::home::{PythonEnv, find_env};

use crate::error::{Error, Result};
use crate::export::layout::{LayoutData, LayoutTensor};

/// The process's SIGINT disposition, saved before Python starts.
struct SigintDisposition(libc::sigaction);

impl SigintDisposition {
    fn save() -> Self {
        // SAFETY: sigaction with a null new action only reads the current one.
        unsafe {
            let mut old: libc::sigaction = std::mem::zeroed();
            libc::sigaction(libc::SIGINT, std::ptr::null(), &mut old);
            SigintDisposition(old)
        }
    }

    fn restore(&self) {
        // SAFETY: reinstalls a disposition the kernel gave us.
        unsafe {
            libc::sigaction(libc::SIGINT, &self.0, std::ptr::null_mut());
        }
    }
}

/// Turn a Python exception into an error naming the stage, with the traceback.
fn py_error(py: Python<'_>, stage: &str, e: PyErr) -> Error {
    let tb = py
        .import("traceback")
        .and_then(|m| m.call_method1("format_exception", (e.value(py),)))
        .and_then(|l| l.extract::<Vec<String>>())
        .map(|l| l.concat())
        .unwrap_or_else(|_| e.to_string());
    Error::Invalid(format!(
        "Python failed during {stage}: {}\n{tb}",
        e.value(py)
    ))
}

fn prepare(py: Python<'_>, env: &PythonEnv) -> PyResult<()> {
    let sys = py.import("sys")?;
    let path = sys.getattr("path")?.cast_into::<PyList>()?;
    for p in [&env.package_dir, &env.site_packages] {
        let s = p.to_string_lossy().to_string();
        if !path.contains(&s)? {
            path.insert(0, s)?;
        }
    }
    py.import("ane_export")?.call_method0("check_environment")?;
    Ok(())
}

/// One emission or translation at a time per process. A poisoned lock only
/// means another one panicked; the state it guards is Python's, which each
/// sets up afresh.
static EMISSION: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// What the Python builder needs besides the weights.
pub struct BuildSpec<'a> {
    /// The tower's config; its family chooses the Python module.
    pub cfg: &'a crate::family::VisionConfig,
    /// coremltools' deployment target name, e.g. `macOS15`.
    pub target: &'a str,
    /// `fp16`, `int8`, `pal6` or `pal8`.
    pub weights: &'a str,
    /// Deliberate defects for the gates' tests (see the Python `FAULTS`); empty for real builds.
    pub faults: &'a [String],
    /// Queries per attention chunk (R4); 0: no chunking.
    pub query_chunk: usize,
    /// The residual stream divided by this inside the program
    /// (`residual_scale` in the builder's spec); `None`: unscaled.
    pub residual_scale: Option<u32>,
    /// The MLP's hidden layer divided by this inside the program
    /// (`branch_scale` in the builder's spec); `None`: unscaled.
    pub branch_scale: Option<u32>,
    /// Where coremltools writes its temporary packages (each converted,
    /// compressed and merged model, the size of its weights), in a
    /// directory of their own that emission removes before it returns;
    /// `None`: the system's temporary directory. The build gives its
    /// staging directory, which the next build cleans up if this one is
    /// killed.
    pub scratch: Option<&'a Path>,
}

/// Build and save a tower's packages with its family's Python module
/// (`ane_export.<family>.save_packages`): one function per bucket in one
/// package at `path` (`multifunction`), or `path/<bucket>.mlpackage` each.
///
/// One emission at a time per process: coremltools' MIL builder keeps the
/// block being built in global state, and the interpreter releases the GIL
/// between bytecodes, so two threads building at once would put one's ops in
/// the other's program (two library builds in one test process did).
pub fn save_packages(
    env: &PythonEnv,
    spec: BuildSpec<'_>,
    weights: Vec<LayoutTensor>,
    buckets: &[(String, usize)],
    path: &Path,
    multifunction: bool,
    metadata: &serde_json::Value,
) -> Result<Vec<PathBuf>> {
    let _one = EMISSION.lock().unwrap_or_else(|e| e.into_inner());
    let sigint = SigintDisposition::save();
    Python::attach(|py| {
        prepare(py, env).map_err(|e| py_error(py, "environment check", e))?;
        // Starting Python installs its own SIGINT handler (Ctrl-C then
        // raises KeyboardInterrupt mid-emission, a long traceback and exit
        // 2): the process keeps the handling it had.
        sigint.restore();
        let run = || -> PyResult<Vec<String>> {
            let json = py.import("json")?;
            let s = json.call_method1("loads", (spec.cfg.builder_spec().to_string(),))?;
            if let Some(r) = spec.residual_scale {
                s.set_item("residual_scale", r)?;
            }
            if let Some(b) = spec.branch_scale {
                s.set_item("branch_scale", b)?;
            }
            // The numpy array takes ownership of the Vec: no copy. The build
            // passes fp16 (`Storage::F16`), the precision the package stores;
            // f32 arrays are rounded by the Python side (to nearest even, as
            // the Rust side rounds).
            let w = PyDict::new(py);
            for t in weights {
                let arr = match t.data {
                    LayoutData::F16(v) => v.into_pyarray(py).reshape(t.shape)?.into_any(),
                    LayoutData::F32(v) => v.into_pyarray(py).reshape(t.shape)?.into_any(),
                };
                w.set_item(t.name, arr)?;
            }
            let meta = json.call_method1("loads", (metadata.to_string(),))?;
            let kwargs = PyDict::new(py);
            kwargs.set_item("target", spec.target)?;
            kwargs.set_item("weights_mode", spec.weights)?;
            kwargs.set_item("faults", spec.faults.to_vec())?;
            kwargs.set_item("query_chunk", spec.query_chunk)?;
            if let Some(d) = spec.scratch {
                kwargs.set_item("scratch", d.to_string_lossy().to_string())?;
            }
            let args = (
                s,
                w,
                buckets.to_vec(),
                path.to_string_lossy().to_string(),
                multifunction,
                meta,
            );
            let out = py
                .import(spec.cfg.family().python_module().as_str())?
                .call_method("save_packages", args, Some(&kwargs))?;
            out.extract::<Vec<String>>()
        };
        run()
            .map(|v| v.into_iter().map(PathBuf::from).collect())
            .map_err(|e| py_error(py, "emission", e))
    })
}

/// Translate MIL functions into one Core AI program at `out` (an
/// `.aimodel` directory that must not exist) with
/// `ane_export.coreai.save_aimodel`: `sources` are (package, function in
/// it, name in the program), one per bucket, so that a multifunction
/// package and per-bucket packages both give one program with one function
/// per bucket. Returns the translation's summary (the coreai-core version,
/// each function's Core AI ops), which the manifest records.
///
/// One translation or emission at a time per process, as for
/// [`save_packages`] (the Python side's builders keep global state).
pub fn save_aimodel(
    env: &PythonEnv,
    sources: &[(PathBuf, String, String)],
    out: &Path,
) -> Result<serde_json::Value> {
    let _one = EMISSION.lock().unwrap_or_else(|e| e.into_inner());
    let sigint = SigintDisposition::save();
    Python::attach(|py| {
        prepare(py, env).map_err(|e| py_error(py, "environment check", e))?;
        sigint.restore();
        let run = || -> PyResult<String> {
            let coreai = py.import("ane_export.coreai")?;
            coreai.call_method0("check_environment")?;
            let sources: Vec<(String, String, String)> = sources
                .iter()
                .map(|(p, f, n)| (p.to_string_lossy().to_string(), f.clone(), n.clone()))
                .collect();
            let summary = coreai
                .call_method1("save_aimodel", (sources, out.to_string_lossy().to_string()))?;
            py.import("json")?
                .call_method1("dumps", (summary,))?
                .extract::<String>()
        };
        let text = run().map_err(|e| py_error(py, "the Core AI translation", e))?;
        serde_json::from_str(&text)
            .map_err(|e| Error::Invalid(format!("the Core AI translation's summary: {e}")))
    })
}
