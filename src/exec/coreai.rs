//! Apple's Core AI runtime behind the [`Executor`] interface: an
//! artifact's `.aimodel` (one function per bucket, named like the bucket)
//! executed by coreai-core in `python -m ane_export.coreai serve`, the same
//! child and line protocol as Core ML's ([`Served`]), without compute
//! units: on Linux the runtime lowers the program for the CPU at every load
//! and has no device choice; on macOS the Neural Engine is preferred.
//!
//! It is the first executor written by Apple that runs on Linux; what it
//! produces is labelled with the runtime and the OS ("coreai-runtime cpu
//! (Linux)"). Like Core ML, it exposes no intermediate values and no
//! overflow.

use std::collections::HashMap;
use std::path::PathBuf;

use candle_core::Tensor;

use super::serve::{Module, Served};
use super::{Executor, Target};
use crate::artifact::Artifact;
use crate::error::{Error, ExecutorError};
use crate::home::PythonEnv;
use crate::interp::RunOutput;

/// An artifact's `.aimodel` run by the Core AI runtime in a child process.
/// A clone shares the running child; the child ends with the last clone.
#[derive(Clone)]
pub struct CoreAi {
    pub served: Served,
    /// The `.aimodel` directory.
    pub aimodel: PathBuf,
}

impl CoreAi {
    /// The Core AI program of `art`, run with `env`'s Python; an artifact
    /// without one is an error naming it and the build's `--format`.
    pub fn for_artifact(env: PythonEnv, art: &Artifact) -> crate::Result<CoreAi> {
        let Some(aimodel) = art.aimodel_path() else {
            return Err(Error::config(
                &art.dir.join("manifest.json"),
                "--executor coreai: the artifact has no .aimodel (its manifest's `formats` does not \
                 list aimodel); build it with --format aimodel or --format both",
            ));
        };
        Ok(CoreAi {
            served: Served::new(env, Module::Coreai),
            aimodel,
        })
    }

    /// Every function's Core AI ops with their operands' and results'
    /// types and shapes: the JSON `python -m ane_export.coreai ops` writes,
    /// which the residency rules read (predicted, like the package's).
    pub fn ops(&self) -> Result<String, ExecutorError> {
        let dir = tempfile::tempdir().map_err(|e| ExecutorError::Exchange(e.to_string()))?;
        let out = dir.path().join("ops.json");
        self.served.one_shot(
            "the Core AI op listing",
            &["ops".as_ref(), self.aimodel.as_os_str(), out.as_os_str()],
        )?;
        std::fs::read_to_string(&out).map_err(|e| ExecutorError::Exchange(e.to_string()))
    }
}

/// What runs a Core AI program on this OS, for reports: the runtime on the
/// CPU on Linux (the only device it has there), with the Neural Engine
/// preferred on macOS (`python/ane_export/coreai.py`, `_placement`).
pub fn describe_runtime() -> &'static str {
    if cfg!(target_os = "macos") {
        "coreai-runtime neural-engine preferred (macOS)"
    } else {
        "coreai-runtime cpu (Linux)"
    }
}

impl Executor for CoreAi {
    fn describe(&self) -> String {
        describe_runtime().into()
    }

    fn run(
        &self,
        target: Target<'_>,
        inputs: &HashMap<String, Tensor>,
        _capture: &crate::interp::Capture,
    ) -> Result<RunOutput, ExecutorError> {
        let Some(name) = target.aimodel_function else {
            return Err(ExecutorError::Failed {
                runtime: Module::Coreai.label(),
                function: target.package.map_or("?", |(_, f)| f).to_string(),
                error: format!("the bucket names no function of {}", self.aimodel.display()),
            });
        };
        // The program's functions have the package's inputs and outputs.
        self.served.run(&self.aimodel, name, inputs, target.outputs)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A stand-in for `ane_export.coreai serve`: checks that it is given
    /// the program and no compute units, and copies its inputs to its
    /// outputs, replying with the function it ran in `error` when asked
    /// for `b16` (so the test sees the name the executor chose).
    const SERVE: &str = r#"
import json, os, shutil, sys
assert sys.argv[1] == "serve" and sys.argv[2].endswith(".aimodel") and len(sys.argv) == 3, sys.argv
for line in sys.stdin:
    req = json.loads(line)
    if req["function"] != "b16":
        print(json.dumps({"ok": False, "error": "no function " + req["function"], "loaded": False}), flush=True)
        continue
    shutil.copyfile(req["inputs"], req["out"])
    print(json.dumps({"ok": True, "load_s": 0.5, "predict_s": 0.25, "pid": os.getpid(), "loaded": True}), flush=True)
"#;

    #[cfg(unix)]
    #[test]
    fn a_bucket_runs_the_programs_function_named_like_it() {
        let dir = tempfile::tempdir().unwrap();
        let pkgdir = dir.path().join("ane_export");
        std::fs::create_dir(&pkgdir).unwrap();
        std::fs::write(pkgdir.join("__init__.py"), "").unwrap();
        std::fs::write(pkgdir.join("coreai.py"), SERVE).unwrap();
        let c = CoreAi {
            served: Served::new(
                PythonEnv {
                    site_packages: dir.path().to_path_buf(),
                    package_dir: dir.path().to_path_buf(),
                    python: "python3".into(),
                },
                Module::Coreai,
            ),
            aimodel: dir.path().join("t.aimodel"),
        };
        assert_eq!(c.describe(), describe_runtime());
        let v: Vec<f32> = (0..128).map(|i| i as f32 * 0.25).collect();
        let t = Tensor::from_vec(v.clone(), (1, 16, 1, 8), &candle_core::Device::Cpu).unwrap();
        let inputs = HashMap::from([("out".to_string(), t)]);
        let outputs = ["out".to_string()];
        // No package: the program alone.
        let target = |f| Target {
            package: None,
            aimodel_function: f,
            outputs: &outputs,
        };
        let r = c
            .run(target(Some("b16")), &inputs, &Default::default())
            .unwrap();
        assert_eq!(r.predict_s, Some(0.25));
        let got = r.outputs["out"]
            .flatten_all()
            .unwrap()
            .to_vec1::<f32>()
            .unwrap();
        assert_eq!(got, v);
        // A function the program lacks: the runtime's error, named.
        let Err(e) = c.run(target(Some("b32")), &inputs, &Default::default()) else {
            panic!("a function the program lacks ran");
        };
        assert_eq!(e.to_string(), "Core AI: b32: no function b32");
        // A bucket that names no function of the program.
        let Err(e) = c.run(target(None), &inputs, &Default::default()) else {
            panic!("a bucket without a function ran");
        };
        assert!(e.to_string().contains("names no function of"), "{e}");
    }
}
