//! Core ML on a Mac, behind the [`Executor`] interface: prediction with
//! `CPU_AND_NE` (measured on the Mac), and `MLComputePlan` (residency as
//! Core ML plans it: the device it prefers for each op and its estimated
//! cost; `gate::plan` turns it into the residency gate's result, labelled
//! `coreml-plan`: a plan, not a measurement of a run).
//!
//! This is the only Mac-specific code of the executors, and it is thin: Core ML
//! runs in `python -m ane_export.coreml` from the project's venv, in a child
//! process ([`Served`], shared with Core AI: a failed Neural Engine compile
//! that kills the process on its first prediction cannot take the caller
//! down, ANE-RULES R18), exchanging safetensors and JSON files. Predictions
//! go to one `serve` child per executor, which keeps each function's model
//! loaded, so a folder of images pays for loading and compiling once; if
//! the child dies, the error says so and the next prediction starts a new
//! one. It cannot run on Linux;
//! predictions it produces are labelled "measured on a Mac", placements
//! "coreml-plan".

use std::collections::HashMap;
use std::path::Path;

use candle_core::Tensor;

use super::serve::Served;
pub use super::serve::{Module, Reply, Timeouts};
use super::{Executor, Target};
use crate::error::ExecutorError;
use crate::home::PythonEnv;
use crate::interp::RunOutput;

/// Core ML through coremltools in a child process ([`Served`]). A clone
/// shares the running child (and the models it has loaded); the child ends
/// with the last clone.
#[derive(Clone)]
pub struct CoreMl {
    /// The child, with coremltools' compute units (`CPU_AND_NE` for the
    /// gates, ANE-RULES R15) and its limits.
    pub served: Served,
}

impl CoreMl {
    pub fn new(env: PythonEnv) -> Self {
        let mut served = Served::new(env, Module::Coreml);
        served.units = Some("CPU_AND_NE".into());
        CoreMl { served }
    }

    /// Predict `function` of the package at `pkg` (see
    /// [`Served::predict_files`]).
    pub fn predict_files(
        &self,
        pkg: &Path,
        function: &str,
        inputs: &Path,
        out: &Path,
    ) -> Result<Reply, ExecutorError> {
        self.served.predict_files(pkg, function, inputs, out)
    }

    /// `MLComputePlan` of one function: the JSON the `plan` child writes
    /// (`operations`: each op's type, preferred device and estimated cost),
    /// which the residency gate reads (`gate::plan`).
    pub fn plan(&self, pkg: &Path, function: &str) -> Result<String, ExecutorError> {
        let dir = tempfile::tempdir().map_err(|e| ExecutorError::Exchange(e.to_string()))?;
        let out = dir.path().join("plan.json");
        self.served.one_shot(
            "MLComputePlan",
            &[
                "plan".as_ref(),
                pkg.as_os_str(),
                function.as_ref(),
                out.as_os_str(),
            ],
        )?;
        std::fs::read_to_string(&out).map_err(|e| ExecutorError::Exchange(e.to_string()))
    }
}

impl Executor for CoreMl {
    fn describe(&self) -> String {
        format!(
            "coreml {} (measured on a Mac)",
            self.served.units.as_deref().unwrap_or("")
        )
    }

    fn run(
        &self,
        target: Target<'_>,
        inputs: &HashMap<String, Tensor>,
        _capture: &crate::interp::Capture,
    ) -> Result<RunOutput, ExecutorError> {
        let (pkg, function) = target.needs_package(&self.describe())?;
        self.served.run(&pkg.path, function, inputs, target.outputs)
    }
}

#[cfg(test)]
mod tests {
    use std::path::PathBuf;
    use std::time::Duration;

    use candle_core::Device;

    use super::*;
    use crate::error::ChildExit;
    use crate::mlpackage::Package;

    /// A stand-in for `ane_export.coreml serve`: copies the input file to
    /// the output; `bad` gets an error reply, `crash` kills the process,
    /// `hang` never replies, `slow` replies at once the first time and
    /// after 60 s later on, `unfed` likewise but with an error reply that
    /// says its model is loaded; as the `plan` child it sleeps 60 s.
    const SERVE: &str = r#"
import json, os, shutil, signal, sys, time
if sys.argv[1] == "plan":
    time.sleep(60)
assert sys.argv[1:3] == ["serve", sys.argv[2]] and sys.argv[3:] == ["--compute-units", "CPU_AND_NE"]
seen = set()
for line in sys.stdin:
    req = json.loads(line)
    if req["function"] == "hang" or (req["function"] in ("slow", "unfed") and req["function"] in seen):
        sys.stderr.write("compiling " + req["function"] + "\n")
        sys.stderr.flush()
        time.sleep(60)
    seen.add(req["function"])
    if req["function"] == "unfed":
        print(json.dumps({"ok": False, "error": "no input x", "loaded": True}), flush=True)
        continue
    if req["function"] == "crash":
        sys.stderr.write("compiling for the Neural Engine\n")
        sys.stderr.flush()
        os.kill(os.getpid(), signal.SIGKILL)
    if req["function"] == "bad":
        print(json.dumps({"ok": False, "error": "no function bad"}), flush=True)
        continue
    if req["function"] == "garbage":
        print("loading weights...", flush=True)
        continue
    if req["function"] == "quit":
        print(json.dumps({"ok": True, "pid": os.getpid()}), flush=True)
        sys.exit(0)
    shutil.copyfile(req["inputs"], req["out"])
    print(json.dumps({"ok": True, "load_s": 0.0, "predict_s": 0.125, "pid": os.getpid()}), flush=True)
"#;

    /// An executor whose `ane_export.coreml` is `module`, and an input file.
    #[cfg(unix)]
    fn stand_in(dir: &Path, module: &str) -> (CoreMl, PathBuf, PathBuf) {
        let pkgdir = dir.join("ane_export");
        std::fs::create_dir(&pkgdir).unwrap();
        std::fs::write(pkgdir.join("__init__.py"), "").unwrap();
        std::fs::write(pkgdir.join("coreml.py"), module).unwrap();
        let c = CoreMl::new(PythonEnv {
            site_packages: dir.to_path_buf(),
            package_dir: dir.to_path_buf(),
            python: "python3".into(),
        });
        let (inp, out) = (dir.join("in"), dir.join("out"));
        std::fs::write(&inp, b"tensors").unwrap();
        (c, inp, out)
    }

    #[cfg(unix)]
    #[test]
    fn a_child_that_gives_no_reply_in_time_is_stopped_and_replaced() {
        let dir = tempfile::tempdir().unwrap();
        let (mut c, inp, out) = stand_in(dir.path(), SERVE);
        // Short limits only where no reply is to come: a loaded machine may
        // take seconds to start Python.
        let ample = Timeouts {
            load: Some(Duration::from_secs(120)),
            predict: Some(Duration::from_secs(120)),
        };
        let short = Timeouts {
            load: Some(Duration::from_millis(1500)),
            predict: Some(Duration::from_millis(500)),
        };
        let pkg = Path::new("a.mlpackage");
        c.served.timeouts = ample;
        let first = c.predict_files(pkg, "b1024", &inp, &out).unwrap();
        // The first prediction of a function has the load limit.
        c.served.timeouts = short;
        let t0 = std::time::Instant::now();
        let e = c.predict_files(pkg, "hang", &inp, &out).unwrap_err();
        assert!(
            t0.elapsed() < Duration::from_secs(30),
            "no wait for the 60 s sleep"
        );
        assert!(
            matches!(&e, ExecutorError::NoReply { function, loading: true, limit, .. }
                if function == "hang" && *limit == Duration::from_millis(1500)),
            "{e:?}"
        );
        let e = e.to_string();
        assert!(
            e.starts_with("hang: ")
                && e.contains("no reply in 1.5 s for its first prediction")
                && e.contains("--coreml-load-timeout")
                && e.contains("compiling hang"),
            "{e}"
        );
        // SAFETY: signal 0 only asks whether the process exists.
        assert_eq!(unsafe { libc::kill(first.pid as i32, 0) }, -1, "stopped");
        // A new child; its loaded function has the prediction limit.
        c.served.timeouts = ample;
        let slow = c.predict_files(pkg, "slow", &inp, &out).unwrap();
        assert_ne!(slow.pid, first.pid);
        c.served.timeouts = short;
        let t0 = std::time::Instant::now();
        let e = c.predict_files(pkg, "slow", &inp, &out).unwrap_err();
        assert!(
            t0.elapsed() < Duration::from_secs(30),
            "no wait for the 60 s sleep"
        );
        assert!(
            matches!(e, ExecutorError::NoReply { loading: false, .. }),
            "{e:?}"
        );
        let e = e.to_string();
        assert!(
            e.contains("no reply in 0.5 s for a prediction of a loaded model")
                && e.contains("--coreml-timeout"),
            "{e}"
        );
        // A failed prediction after the model loaded: later ones have the
        // prediction limit too.
        c.served.timeouts = ample;
        let e = c.predict_files(pkg, "unfed", &inp, &out).unwrap_err();
        assert!(
            matches!(&e, ExecutorError::Failed { function, error, .. }
                if function == "unfed" && error == "no input x"),
            "{e:?}"
        );
        c.served.timeouts = short;
        let e = c.predict_files(pkg, "unfed", &inp, &out).unwrap_err();
        assert!(
            matches!(e, ExecutorError::NoReply { loading: false, .. }),
            "{e:?}"
        );
        assert!(
            e.to_string().contains("for a prediction of a loaded model"),
            "{e}"
        );
        c.served.timeouts = ample;
        let again = c.predict_files(pkg, "b1024", &inp, &out).unwrap();
        assert_ne!(again.pid, slow.pid);
        c.served.timeouts = short;
        // The one-shot MLComputePlan child has the load limit.
        let e = c.plan(pkg, "b1024").unwrap_err();
        assert!(matches!(e, ExecutorError::PlanNoReply { .. }), "{e:?}");
        assert!(
            e.to_string()
                .contains("no reply in 1.5 s for MLComputePlan"),
            "{e}"
        );
    }

    #[cfg(unix)]
    #[test]
    fn a_prediction_returns_the_outputs_and_the_time_the_child_reports() {
        let dir = tempfile::tempdir().unwrap();
        let (c, _, _) = stand_in(dir.path(), SERVE);
        let pkg = Package::open(
            &Path::new(env!("CARGO_MANIFEST_DIR"))
                .join("golden/mil/attention_block/model.mlpackage"),
        )
        .unwrap();
        // The stand-in copies its inputs to its outputs: named as the outputs.
        let v: Vec<f32> = (0..128).map(|i| i as f32 * 0.5).collect();
        let t = Tensor::from_vec(v.clone(), (1, 16, 1, 8), &Device::Cpu).unwrap();
        let inputs = HashMap::from([("out".to_string(), t)]);
        let outputs = ["out".to_string()];
        let r = c
            .run(
                Target::package(&pkg, "main", &outputs),
                &inputs,
                &Default::default(),
            )
            .unwrap();
        assert_eq!(r.predict_s, Some(0.125));
        let got = r.outputs["out"]
            .flatten_all()
            .unwrap()
            .to_vec1::<f32>()
            .unwrap();
        assert_eq!(got, v);
        assert_eq!(r.outputs["out"].dims(), [1, 16, 1, 8]);
    }

    #[cfg(unix)]
    #[test]
    fn clones_share_the_child_which_ends_with_the_last() {
        let dir = tempfile::tempdir().unwrap();
        let (c, inp, out) = stand_in(dir.path(), SERVE);
        let pkg = Path::new("a.mlpackage");
        let first = c.predict_files(pkg, "b1024", &inp, &out).unwrap();
        let d = c.clone();
        assert_eq!(
            d.predict_files(pkg, "b1024", &inp, &out).unwrap().pid,
            first.pid
        );
        drop(c);
        let alive = d.predict_files(pkg, "b4096", &inp, &out).unwrap();
        assert_eq!(alive.pid, first.pid, "dropping one clone keeps the child");
        drop(d);
        // SAFETY: signal 0 only asks whether the process exists.
        assert_eq!(
            unsafe { libc::kill(first.pid as i32, 0) },
            -1,
            "ended with the last"
        );
    }

    #[cfg(unix)]
    #[test]
    fn the_serve_child_is_kept_and_started_again_after_a_crash() {
        let dir = tempfile::tempdir().unwrap();
        let (c, inp, out) = stand_in(dir.path(), SERVE);
        let pkg = Path::new("a.mlpackage");
        let first = c.predict_files(pkg, "b1024", &inp, &out).unwrap();
        assert_eq!(std::fs::read(&out).unwrap(), b"tensors");
        let again = c.predict_files(pkg, "b4096", &inp, &out).unwrap();
        assert_eq!(again.pid, first.pid, "one child serves every request");
        let e = c.predict_files(pkg, "bad", &inp, &out).unwrap_err();
        assert_eq!(e.to_string(), "Core ML: bad: no function bad");
        let after_error = c.predict_files(pkg, "b1024", &inp, &out).unwrap();
        assert_eq!(after_error.pid, first.pid, "an error reply keeps the child");
        let e = c.predict_files(pkg, "crash", &inp, &out).unwrap_err();
        assert!(
            matches!(&e, ExecutorError::Died { function, exit: ChildExit { code: None, stderr, .. } }
                if function == "crash" && stderr == "compiling for the Neural Engine"),
            "{e:?}"
        );
        let e = e.to_string();
        assert!(
            e.starts_with("crash: ")
                && e.contains("killed by a signal")
                && e.contains("compiling for the Neural Engine"),
            "{e}"
        );
        let restarted = c.predict_files(pkg, "b1024", &inp, &out).unwrap();
        assert_ne!(restarted.pid, first.pid, "a new child after the crash");
        // Something other than a reply on its stdout: named, and a new child.
        let e = c.predict_files(pkg, "garbage", &inp, &out).unwrap_err();
        assert!(
            matches!(&e, ExecutorError::NotAReply { line, .. } if line == "loading weights..."),
            "{e:?}"
        );
        let e = e.to_string();
        assert!(
            e.contains("not a reply") && e.contains("loading weights"),
            "{e}"
        );
        // A child that ended between requests is not written to.
        let quit = c.predict_files(pkg, "quit", &inp, &out).unwrap();
        std::thread::sleep(Duration::from_millis(300));
        let e = c.predict_files(pkg, "b1024", &inp, &out).unwrap_err();
        assert!(
            matches!(
                e,
                ExecutorError::Died {
                    exit: ChildExit { code: Some(0), .. },
                    ..
                }
            ),
            "{e:?}"
        );
        assert!(e.to_string().contains("exited 0"), "{e}");
        let restarted = c.predict_files(pkg, "b1024", &inp, &out).unwrap();
        assert_ne!(restarted.pid, quit.pid);
        let other = c
            .predict_files(Path::new("b.mlpackage"), "b1024", &inp, &out)
            .unwrap();
        assert_ne!(other.pid, restarted.pid, "another package, another child");
        let pid = other.pid;
        drop(c);
        // SAFETY: signal 0 only asks whether the process exists.
        assert_eq!(
            unsafe { libc::kill(pid as i32, 0) },
            -1,
            "dropping ends the child"
        );
    }
}
