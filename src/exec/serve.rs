//! The Python child processes that execute artifacts for the executors
//! backed by Apple's runtimes: `python -m ane_export.coreml` (Core ML, on a
//! Mac) and `python -m ane_export.coreai` (Core AI, on Linux and macOS),
//! which speak the same line protocol (python/ane_export/coreml.py's module
//! doc). [`Served`] is one such child for one model at a time, shared by
//! its clones: predictions go to one `serve` child, which keeps each
//! function loaded, so a folder of images pays for loading (and compiling)
//! once; if the child dies, the error says so and the next prediction
//! starts a new one. A child cannot take the caller down (a failed Neural
//! Engine compile kills the process on its first prediction, ANE-RULES
//! R18; coreai-core can abort at exit).

use std::collections::{BTreeMap, HashMap, HashSet};
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::{Arc, Mutex, mpsc};
use std::time::Duration;

use candle_core::{Device, Tensor};

use crate::error::{ChildExit, ExecutorError};
use crate::home::PythonEnv;
use crate::interp::RunOutput;
use crate::tensor_file::{self, OwnedTensor};

/// The Python module a child runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Module {
    /// `ane_export.coreml`: Core ML through coremltools, with compute units.
    Coreml,
    /// `ane_export.coreai`: the Core AI runtime of coreai-core, which has
    /// no device choice on Linux.
    Coreai,
}

impl Module {
    /// The module `python -m` runs.
    pub fn module(self) -> &'static str {
        match self {
            Module::Coreml => "ane_export.coreml",
            Module::Coreai => "ane_export.coreai",
        }
    }

    /// The runtime's name in messages.
    pub fn label(self) -> &'static str {
        match self {
            Module::Coreml => "Core ML",
            Module::Coreai => "Core AI",
        }
    }
}

/// How long to wait for a child's reply before stopping it (a hung child
/// would otherwise hang the run); `None` waits for ever.
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

/// A `serve` child of `module` for one model at a time. A clone shares the
/// running child (and the functions it has loaded); the child ends with
/// the last clone.
#[derive(Clone)]
pub struct Served {
    pub env: PythonEnv,
    pub module: Module,
    /// coremltools' compute units (`--compute-units`), for Core ML; `None`
    /// for Core AI.
    pub units: Option<String>,
    pub timeouts: Timeouts,
    server: Arc<Shared>,
}

/// The `serve` child of a [`Served`] and its clones.
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

/// The running `serve` child for one model.
struct Server {
    module: Module,
    model: PathBuf,
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

/// How a child of `module` that ended describes itself: its exit and its
/// stderr.
fn ended(module: Module, status: Option<std::process::ExitStatus>, stderr: String) -> ChildExit {
    ChildExit {
        runtime: module.label(),
        code: status.and_then(|s| s.code()),
        stderr,
    }
}

/// Start `python -m MODULE ARGS [--compute-units UNITS]` with its stderr
/// in a file of the returned directory (`stderr.txt`, read with
/// [`Server::stderr`]), and stdin and stdout piped or not.
fn spawn_module(
    env: &PythonEnv,
    module: Module,
    args: &[&std::ffi::OsStr],
    units: Option<&str>,
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
    let mut cmd = Command::new(&env.python);
    cmd.args(["-m", module.module()]).args(args);
    if let Some(units) = units {
        cmd.args(["--compute-units", units]);
    }
    let child = cmd
        .env("PYTHONPATH", &env.package_dir)
        .stdin(io())
        .stdout(io())
        .stderr(err)
        .spawn()
        .map_err(|e| start(env.python.display().to_string(), e))?;
    Ok((child, dir))
}

impl Server {
    fn start(
        env: &PythonEnv,
        module: Module,
        units: Option<&str>,
        model: &Path,
    ) -> Result<Server, ExecutorError> {
        let (mut child, dir) = spawn_module(
            env,
            module,
            &["serve".as_ref(), model.as_os_str()],
            units,
            true,
        )?;
        let (Some(stdin), Some(stdout)) = (child.stdin.take(), child.stdout.take()) else {
            let _ = child.kill();
            let _ = child.wait();
            return Err(ExecutorError::Start {
                what: format!("{} child", module.label()),
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
            .name("child-replies".into())
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
                what: format!("a thread to read the {} child's replies", module.label()),
                cause: e.to_string(),
            });
        }
        Ok(Server {
            module,
            model: model.to_path_buf(),
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
        ended(self.module, w.status, Server::stderr(&self.dir))
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

impl Served {
    /// A child of `module` from `env`, not started yet, without compute
    /// units and with the default [`Timeouts`].
    pub fn new(env: PythonEnv, module: Module) -> Self {
        Served {
            env,
            module,
            units: None,
            timeouts: Timeouts::default(),
            server: Arc::default(),
        }
    }

    /// Predict `function` of the model at `model` (a package, or a Core AI
    /// program) from the tensors in the safetensors file `inputs`, writing
    /// the outputs to `out`. Starts the `serve` child on first use (or for
    /// another model) and again after it dies or is stopped for giving no
    /// reply within [`Timeouts`].
    pub fn predict_files(
        &self,
        model: &Path,
        function: &str,
        inputs: &Path,
        out: &Path,
    ) -> Result<Reply, ExecutorError> {
        let mut guard = self.server.0.lock().unwrap_or_else(|e| e.into_inner());
        let mut server = match guard.take() {
            Some(s) if s.model == model => s,
            old => {
                if let Some(old) = old {
                    old.finish();
                }
                Server::start(&self.env, self.module, self.units.as_deref(), model)?
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
                        runtime: self.module.label(),
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
                runtime: self.module.label(),
                function,
                loading,
                limit,
                stderr: server.stop_late(),
            }),
        }
    }

    /// A one-shot `python -m MODULE ARGS` doing `what` (e.g.
    /// "MLComputePlan"), stopped if it runs past the load limit (it loads
    /// the model).
    pub(crate) fn one_shot(
        &self,
        what: &'static str,
        args: &[&std::ffi::OsStr],
    ) -> Result<(), ExecutorError> {
        let (mut child, dir) =
            spawn_module(&self.env, self.module, args, self.units.as_deref(), false)?;
        let limit = self.timeouts.load.unwrap_or(Duration::MAX);
        let w = super::child::wait_or_kill(&mut child, limit);
        match w.status {
            _ if w.killed => Err(ExecutorError::PlanNoReply {
                what,
                limit,
                stderr: Server::stderr(&dir),
            }),
            Some(s) if s.success() => Ok(()),
            status => Err(ExecutorError::PlanFailed(ended(
                self.module,
                status,
                Server::stderr(&dir),
            ))),
        }
    }

    /// Run `function` of the model at `model` on named inputs (sent as
    /// f32) and read back the outputs `outputs` names (written as f32):
    /// what both executors backed by a child do, in files of their own for
    /// each call (several threads may share the child).
    pub(crate) fn run(
        &self,
        model: &Path,
        function: &str,
        inputs: &HashMap<String, Tensor>,
        outputs: &[String],
    ) -> Result<RunOutput, ExecutorError> {
        let exchange = |e: &dyn std::fmt::Display| ExecutorError::Exchange(e.to_string());
        let tensor = |e: candle_core::Error| ExecutorError::Tensor(e.to_string());
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
        let reply = self.predict_files(model, function, &inp, &out)?;
        let bytes = std::fs::read(&out).map_err(|e| exchange(&e))?;
        let mut values = BTreeMap::new();
        for name in outputs {
            let t = tensor_file::read_tensor(&bytes, &out, name).map_err(|e| exchange(&e))?;
            let v = t.f32.ok_or_else(|| ExecutorError::NotF32(name.clone()))?;
            values.insert(
                name.clone(),
                Tensor::from_vec(v, t.shape, &Device::Cpu).map_err(tensor)?,
            );
        }
        // The runtimes expose neither intermediate values nor where fp16
        // overflowed.
        Ok(RunOutput {
            work: Default::default(),
            profile: None,
            outputs: values,
            first_overflow: None,
            peaks: Vec::new(),
            captured: BTreeMap::new(),
            predict_s: reply.predict_s,
        })
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
