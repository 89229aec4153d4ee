//! Core ML on a Mac, behind the [`Executor`] interface: prediction with
//! `CPU_AND_NE` (measured on the Mac), and `MLComputePlan` (residency as
//! Core ML plans it: the device it prefers for each op and its estimated
//! cost; `gate::plan` turns it into the residency gate's result, labelled
//! `coreml-plan`: a plan, not a measurement of a run).
//!
//! This is the only Mac-specific code of the executors, and it is thin: Core ML
//! runs in `python -m ane_export.coreml` from the project's venv, in a child
//! process (a failed Neural Engine compile that kills the process on its
//! first prediction cannot take the caller down, ANE-RULES R18), exchanging
//! safetensors and JSON files. Predictions go to one `serve` child per
//! executor, which keeps each function's model loaded, so a folder of images
//! pays for loading and compiling once; if the child dies, the error says
//! so and the next prediction starts a new one. It cannot run on Linux;
//! predictions it produces are labelled "measured on a Mac", placements
//! "coreml-plan".

use std::collections::{BTreeMap, HashMap, HashSet};
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::{Arc, Mutex, mpsc};
use std::time::Duration;

use candle_core::{Device, Tensor};

use super::Executor;
use crate::error::{ChildExit, ExecutorError};
use crate::home::PythonEnv;
use crate::interp::RunOutput;
use crate::mlpackage::Package;
use crate::tensor_file::{self, OwnedTensor};

/// How long to wait for the Core ML child's reply before stopping it (a
/// hung child would otherwise hang the run); `None` waits for ever.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Timeouts {
    /// The first prediction of each function in a child, which loads the
    /// model and compiles it for the Neural Engine (minutes for a large
    /// tower); also the `MLComputePlan` child, which loads it too.
    pub load: Option<Duration>,
    /// Every later prediction of a function whose model is loaded.
    pub predict: Option<Duration>,
}

impl Default for Timeouts {
    /// 30 minutes to load, 10 minutes per prediction: limits for a child
    /// that has stopped answering, far above the work itself.
    fn default() -> Self {
        Timeouts {
            load: Some(Duration::from_secs(1800)),
            predict: Some(Duration::from_secs(600)),
        }
    }
}

/// Core ML through coremltools in a child process. A clone shares the
/// running child (and the models it has loaded); the child ends with the
/// last clone.
#[derive(Clone)]
pub struct CoreMl {
    pub env: PythonEnv,
    /// coremltools' compute units, `CPU_AND_NE` for the gates (ANE-RULES R15).
    pub units: String,
    pub timeouts: Timeouts,
    server: Arc<Shared>,
}

/// The `serve` child of a [`CoreMl`] and its clones.
#[derive(Default)]
struct Shared(Mutex<Option<Server>>);

/// What the `serve` child says about one prediction.
#[derive(Debug, serde::Deserialize)]
pub struct Reply {
    pub ok: bool,
    #[serde(default)]
    pub error: String,
    /// Seconds spent loading (and compiling) the function's model for this
    /// request; 0 once it is loaded.
    #[serde(default)]
    pub load_s: f64,
    /// Seconds in `predict` alone; `None` if the reply does not say.
    #[serde(default)]
    pub predict_s: Option<f64>,
    #[serde(default)]
    pub pid: u32,
    /// Whether the function's model is loaded in the child after this
    /// request (also when the prediction itself failed).
    #[serde(default)]
    pub loaded: bool,
}

/// The running `serve` child for one package.
struct Server {
    pkg: PathBuf,
    child: Child,
    stdin: ChildStdin,
    /// The lines of its stdout, read by a thread that ends with it.
    replies: mpsc::Receiver<String>,
    /// Functions whose model this child has loaded.
    loaded: HashSet<String>,
    /// Holds the child's stderr.
    dir: tempfile::TempDir,
}

/// Why a request got no reply.
enum NoReply {
    /// The child ended.
    Gone,
    /// What it wrote is not a reply: why, and the line's start.
    Garbled { error: String, line: String },
    /// Nothing came within the limit: the child is stopped.
    Late { limit: Duration, loading: bool },
}

/// How a child that ended describes itself: its exit and its stderr.
fn ended(status: Option<std::process::ExitStatus>, stderr: String) -> ChildExit {
    ChildExit {
        code: status.and_then(|s| s.code()),
        stderr,
    }
}

/// Start `python -m ane_export.coreml ARGS --compute-units UNITS` with its
/// stderr in a file of the returned directory (`stderr.txt`, read with
/// [`Server::stderr`]), and stdin and stdout piped or not.
fn spawn_module(
    env: &PythonEnv,
    args: &[&std::ffi::OsStr],
    units: &str,
    piped: bool,
) -> Result<(Child, tempfile::TempDir), ExecutorError> {
    let start = |what: String, e: std::io::Error| ExecutorError::Start {
        what,
        cause: e.to_string(),
    };
    let dir = tempfile::tempdir().map_err(|e| start("a temporary directory".into(), e))?;
    let err_path = dir.path().join("stderr.txt");
    let err =
        std::fs::File::create(&err_path).map_err(|e| start(err_path.display().to_string(), e))?;
    let io = || if piped { Stdio::piped() } else { Stdio::null() };
    let child = Command::new(&env.python)
        .args(["-m", "ane_export.coreml"])
        .args(args)
        .args(["--compute-units", units])
        .env("PYTHONPATH", &env.package_dir)
        .stdin(io())
        .stdout(io())
        .stderr(err)
        .spawn()
        .map_err(|e| start(env.python.display().to_string(), e))?;
    Ok((child, dir))
}

impl Server {
    fn start(env: &PythonEnv, units: &str, pkg: &Path) -> Result<Server, ExecutorError> {
        let (mut child, dir) =
            spawn_module(env, &["serve".as_ref(), pkg.as_os_str()], units, true)?;
        let (Some(stdin), Some(stdout)) = (child.stdin.take(), child.stdout.take()) else {
            let _ = child.kill();
            let _ = child.wait();
            return Err(ExecutorError::Start {
                what: "Core ML child".into(),
                cause: "no pipes".into(),
            });
        };
        // The binaries restore the default SIGPIPE action (for `| head`): a
        // write to a child that has died must fail with EPIPE instead of
        // ending this process.
        #[cfg(target_os = "macos")]
        // SAFETY: setting a flag on a pipe descriptor this process owns.
        unsafe {
            use std::os::fd::AsRawFd;
            libc::fcntl(stdin.as_raw_fd(), libc::F_SETNOSIGPIPE, 1);
        }
        // Replies are read on a thread so that waiting for one can time out;
        // the thread ends at the child's end of output.
        let (tx, replies) = mpsc::channel();
        let reader = std::thread::Builder::new()
            .name("coreml-replies".into())
            .spawn(move || {
                let mut r = BufReader::new(stdout);
                loop {
                    let mut line = String::new();
                    match r.read_line(&mut line) {
                        Ok(n) if n > 0 && tx.send(line).is_ok() => {}
                        _ => break,
                    }
                }
            });
        if let Err(e) = reader {
            let _ = child.kill();
            let _ = child.wait();
            return Err(ExecutorError::Start {
                what: "a thread to read the Core ML child's replies".into(),
                cause: e.to_string(),
            });
        }
        Ok(Server {
            pkg: pkg.to_path_buf(),
            child,
            stdin,
            replies,
            loaded: HashSet::new(),
            dir,
        })
    }

    /// One request and its reply.
    fn ask(
        &mut self,
        function: &str,
        inputs: &Path,
        out: &Path,
        timeouts: Timeouts,
    ) -> Result<Reply, NoReply> {
        let gone = || NoReply::Gone;
        // A child known to have ended is not written to.
        if !matches!(self.child.try_wait(), Ok(None)) {
            return Err(gone());
        }
        let req = serde_json::json!({"function": function, "inputs": inputs, "out": out});
        writeln!(self.stdin, "{req}").map_err(|_| gone())?;
        self.stdin.flush().map_err(|_| gone())?;
        let loading = !self.loaded.contains(function);
        let limit = if loading {
            timeouts.load
        } else {
            timeouts.predict
        };
        let line = match limit {
            Some(limit) => self.replies.recv_timeout(limit).map_err(|e| match e {
                mpsc::RecvTimeoutError::Timeout => NoReply::Late { limit, loading },
                mpsc::RecvTimeoutError::Disconnected => gone(),
            })?,
            None => self.replies.recv().map_err(|_| gone())?,
        };
        let reply: Reply = serde_json::from_str(&line).map_err(|e| NoReply::Garbled {
            error: e.to_string(),
            line: line.trim().chars().take(400).collect(),
        })?;
        if reply.ok || reply.loaded {
            self.loaded.insert(function.to_string());
        }
        Ok(reply)
    }

    /// The child's stderr, from its end.
    fn stderr(dir: &tempfile::TempDir) -> String {
        super::child::text_tail(&dir.path().join("stderr.txt"), 4000)
    }

    /// Why the child is gone: its exit and its stderr.
    fn died(mut self) -> ChildExit {
        drop(self.stdin);
        let w = super::child::wait_or_kill(&mut self.child, Duration::from_secs(5));
        ended(w.status, Server::stderr(&self.dir))
    }

    /// Stop a child that gave no reply in time; what it printed.
    fn stop_late(mut self) -> String {
        let _ = self.child.kill();
        let _ = self.child.wait();
        Server::stderr(&self.dir)
    }

    /// Close its input (it then exits) and wait, killing it after 5 s.
    fn finish(self) {
        let _ = self.died();
    }
}

impl CoreMl {
    pub fn new(env: PythonEnv) -> Self {
        CoreMl {
            env,
            units: "CPU_AND_NE".into(),
            timeouts: Timeouts::default(),
            server: Arc::default(),
        }
    }

    /// Predict `function` of the package at `pkg` from the tensors in the
    /// safetensors file `inputs`, writing the outputs to `out`. Starts the
    /// `serve` child on first use (or for another package) and again after
    /// it dies or is stopped for giving no reply within [`Timeouts`].
    pub fn predict_files(
        &self,
        pkg: &Path,
        function: &str,
        inputs: &Path,
        out: &Path,
    ) -> Result<Reply, ExecutorError> {
        let mut guard = self.server.0.lock().unwrap_or_else(|e| e.into_inner());
        let mut server = match guard.take() {
            Some(s) if s.pkg == pkg => s,
            old => {
                if let Some(old) = old {
                    old.finish();
                }
                Server::start(&self.env, &self.units, pkg)?
            }
        };
        let function = function.to_string();
        match server.ask(&function, inputs, out, self.timeouts) {
            Ok(r) => {
                *guard = Some(server);
                if r.ok {
                    Ok(r)
                } else {
                    Err(ExecutorError::Failed {
                        function,
                        error: r.error,
                    })
                }
            }
            Err(NoReply::Gone) => Err(ExecutorError::Died {
                function,
                exit: server.died(),
            }),
            Err(NoReply::Garbled { error, line }) => Err(ExecutorError::NotAReply {
                function,
                error,
                line,
                exit: Box::new(server.died()),
            }),
            Err(NoReply::Late { limit, loading }) => Err(ExecutorError::NoReply {
                function,
                loading,
                limit,
                stderr: server.stop_late(),
            }),
        }
    }

    /// A one-shot `python -m ane_export.coreml ARGS`, stopped if it runs
    /// past the load limit (it loads the model).
    fn child(&self, args: &[&std::ffi::OsStr]) -> Result<(), ExecutorError> {
        let (mut child, dir) = spawn_module(&self.env, args, &self.units, false)?;
        let limit = self.timeouts.load.unwrap_or(Duration::MAX);
        let w = super::child::wait_or_kill(&mut child, limit);
        match w.status {
            _ if w.killed => Err(ExecutorError::PlanNoReply {
                limit,
                stderr: Server::stderr(&dir),
            }),
            Some(s) if s.success() => Ok(()),
            status => Err(ExecutorError::PlanFailed(ended(
                status,
                Server::stderr(&dir),
            ))),
        }
    }

    /// `MLComputePlan` of one function: the JSON the `plan` child writes
    /// (`operations`: each op's type, preferred device and estimated cost),
    /// which the residency gate reads (`gate::plan`).
    pub fn plan(&self, pkg: &Path, function: &str) -> Result<String, ExecutorError> {
        let dir = tempfile::tempdir().map_err(|e| ExecutorError::Exchange(e.to_string()))?;
        let out = dir.path().join("plan.json");
        self.child(&[
            "plan".as_ref(),
            pkg.as_os_str(),
            function.as_ref(),
            out.as_os_str(),
        ])?;
        std::fs::read_to_string(&out).map_err(|e| ExecutorError::Exchange(e.to_string()))
    }
}

impl Drop for Shared {
    fn drop(&mut self) {
        let server = self.0.get_mut().unwrap_or_else(|e| e.into_inner()).take();
        if let Some(s) = server {
            s.finish();
        }
    }
}

impl Executor for CoreMl {
    fn describe(&self) -> String {
        format!("coreml {} (measured on a Mac)", self.units)
    }

    fn run(
        &self,
        pkg: &Package,
        function: &str,
        inputs: &HashMap<String, Tensor>,
        _capture: &crate::interp::Capture,
    ) -> Result<RunOutput, ExecutorError> {
        let exchange = |e: &dyn std::fmt::Display| ExecutorError::Exchange(e.to_string());
        let tensor = |e: candle_core::Error| ExecutorError::Tensor(e.to_string());
        // Each call has its own files: several threads may share the executor.
        let dir = tempfile::tempdir().map_err(|e| exchange(&e))?;
        let (inp, out) = (
            dir.path().join("in.safetensors"),
            dir.path().join("out.safetensors"),
        );
        let mut tensors = Vec::new();
        for (k, t) in inputs {
            let v = t
                .flatten_all()
                .and_then(|f| f.to_vec1::<f32>())
                .map_err(tensor)?;
            tensors.push((k.clone(), OwnedTensor::f32(t.dims().to_vec(), &v)));
        }
        tensor_file::write(&inp, tensors, None).map_err(|e| exchange(&e))?;
        let reply = self.predict_files(&pkg.path, function, &inp, &out)?;
        let bytes = std::fs::read(&out).map_err(|e| exchange(&e))?;
        let f = pkg.program.select(Some(function))?;
        let mut outputs = BTreeMap::new();
        for o in &f.outputs {
            let t = tensor_file::read_tensor(&bytes, &out, &o.name).map_err(|e| exchange(&e))?;
            let v = t.f32.ok_or_else(|| ExecutorError::NotF32(o.name.clone()))?;
            outputs.insert(
                o.name.clone(),
                Tensor::from_vec(v, t.shape, &Device::Cpu).map_err(tensor)?,
            );
        }
        // Core ML exposes neither intermediate values nor where fp16 overflowed.
        Ok(RunOutput {
            work: Default::default(),
            profile: None,
            outputs,
            first_overflow: None,
            peaks: Vec::new(),
            captured: BTreeMap::new(),
            predict_s: reply.predict_s,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
        c.timeouts = ample;
        let first = c.predict_files(pkg, "b1024", &inp, &out).unwrap();
        // The first prediction of a function has the load limit.
        c.timeouts = short;
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
        c.timeouts = ample;
        let slow = c.predict_files(pkg, "slow", &inp, &out).unwrap();
        assert_ne!(slow.pid, first.pid);
        c.timeouts = short;
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
        c.timeouts = ample;
        let e = c.predict_files(pkg, "unfed", &inp, &out).unwrap_err();
        assert!(
            matches!(&e, ExecutorError::Failed { function, error }
                if function == "unfed" && error == "no input x"),
            "{e:?}"
        );
        c.timeouts = short;
        let e = c.predict_files(pkg, "unfed", &inp, &out).unwrap_err();
        assert!(
            matches!(e, ExecutorError::NoReply { loading: false, .. }),
            "{e:?}"
        );
        assert!(
            e.to_string().contains("for a prediction of a loaded model"),
            "{e}"
        );
        c.timeouts = ample;
        let again = c.predict_files(pkg, "b1024", &inp, &out).unwrap();
        assert_ne!(again.pid, slow.pid);
        c.timeouts = short;
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
        let r = c.run(&pkg, "main", &inputs, &Default::default()).unwrap();
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
            matches!(&e, ExecutorError::Died { function, exit: ChildExit { code: None, stderr } }
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
