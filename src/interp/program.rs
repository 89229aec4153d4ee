//! Loading a function for the interpreter: the checks made before anything
//! runs (every op supported, every string parameter implemented), the
//! constants kept in fp16 as stored, and the schedule of a run (which ops
//! run fused as attention chains, when each value is freed).

use std::collections::HashMap;

use candle_core::Tensor;

use super::{Capture, InterpError, Map, Precision, RunOutput, SUPPORTED_OPS, Set, Settings, fuse};
use crate::mlpackage::{Arg, DType, Function, HostData, Package, Value};

/// A function of a package, checked and ready to run.
pub struct Interpreter<'p> {
    pub(super) pkg: &'p Package,
    pub(super) func: &'p Function,
    /// How it runs.
    pub(super) settings: Settings,
    pub(super) fuse: bool,
    /// Carry repeated columns packed (`packed.rs`).
    pub(super) pack: bool,
    /// The constants kept in fp16 as stored ([`fp16_conv_weights`]).
    pub(super) fp16_weights: Set<&'p str>,
    /// The schedule of runs without captures, made by the first.
    pub(super) schedule: std::sync::OnceLock<Schedule<'p>>,
}

/// Where a run executes each op and when it frees each value: made once
/// per interpreter for its runs without captures (`exec --runs`), afresh
/// for a run that captures values.
pub(super) struct Schedule<'p> {
    /// Attention chains by the index of their last op (fuse.rs): they run
    /// in tiles there, their other ops are skipped and what they read is
    /// read there.
    pub(super) plans: Map<usize, fuse::Plan>,
    /// Per op, the index of the op it runs at (its own, or its chain's).
    pub(super) runs_at: Vec<usize>,
    /// Per op, the values it reads (where it runs).
    pub(super) reads: Vec<Vec<&'p str>>,
    /// Per value, the index of the last op that reads it (`usize::MAX`
    /// for function outputs): each value is freed after it, since a
    /// tower's program holds thousands of intermediates.
    pub(super) last_use: Map<&'p str, usize>,
}

impl<'p> Schedule<'p> {
    pub(super) fn new(func: &'p Function, keep: &Set<&str>, fuse: bool) -> Self {
        let plans = if fuse {
            fuse::plan(func, keep)
        } else {
            Map::default()
        };
        let mut runs_at: Vec<usize> = (0..func.ops.len()).collect();
        for p in plans.values() {
            for i in p.ops() {
                runs_at[i] = p.ctx;
            }
        }
        let mut reads: Vec<Vec<&str>> = vec![Vec::new(); func.ops.len()];
        let mut last_use: Map<&str, usize> = Map::default();
        for (i, op) in func.ops.iter().enumerate() {
            for a in op.inputs.values().flatten() {
                if let Arg::Var(n) = a {
                    let at = runs_at[i];
                    reads[at].push(n.as_str());
                    let e = last_use.entry(n.as_str()).or_insert(at);
                    *e = (*e).max(at);
                }
            }
        }
        for o in &func.outputs {
            last_use.insert(o.name.as_str(), usize::MAX);
        }
        Schedule {
            plans,
            runs_at,
            reads,
            last_use,
        }
    }
}

/// The `const` ops of `func` whose fp16 blob feeds nothing but `conv` ops'
/// `weight` (the ANE layout's Linears): the interpreter keeps them in fp16,
/// as the package stores them, and the 1x1 convolution widens a task's rows
/// at a time as it multiplies (`blas::sgemm_f16a`; widening is exact). Every
/// other value is f32 or i64, so an op that reads one of these is a conv.
pub(super) fn fp16_conv_weights(func: &Function) -> Set<&str> {
    let mut only_conv_weight: Map<&str, bool> = Map::default();
    for op in &func.ops {
        for (key, args) in &op.inputs {
            for a in args {
                if let Arg::Var(n) = a {
                    *only_conv_weight.entry(n.as_str()).or_insert(true) &=
                        op.kind == "conv" && key == "weight";
                }
            }
        }
    }
    func.ops
        .iter()
        .filter(|o| {
            o.kind == "const" && matches!(o.attributes.get("val"), Some(Value::Blob { .. }))
        })
        .filter_map(|o| match o.outputs.as_slice() {
            [out] if out.ty.dtype == DType::F16 => Some(out.name.as_str()),
            _ => None,
        })
        .filter(|n| {
            only_conv_weight.get(n) == Some(&true) && !func.outputs.iter().any(|o| o.name == *n)
        })
        .collect()
}

impl<'p> Interpreter<'p> {
    /// Choose a function and check, before running anything, that every op
    /// is supported; run it with the default [`Settings`].
    pub fn new(pkg: &'p Package, function: Option<&str>) -> Result<Self, InterpError> {
        Self::with_settings(pkg, function, Settings::default())
    }

    /// [`Interpreter::new`], run with `settings`.
    pub fn with_settings(
        pkg: &'p Package,
        function: Option<&str>,
        settings: Settings,
    ) -> Result<Self, InterpError> {
        let func = pkg.program.select(function)?;
        let unsupported: Vec<(String, String)> = func
            .ops
            .iter()
            .filter(|o| !SUPPORTED_OPS.contains(&o.kind.as_str()))
            .map(|o| (o.kind.clone(), o.label().to_string()))
            .collect();
        if !unsupported.is_empty() {
            return Err(InterpError::UnsupportedOps {
                function: func.name.clone(),
                ops: unsupported,
            });
        }
        check_string_params(func)?;
        Ok(Interpreter {
            pkg,
            func,
            fuse: true,
            settings,
            pack: settings.shortcuts,
            fp16_weights: fp16_conv_weights(func),
            schedule: std::sync::OnceLock::new(),
        })
    }

    /// Run every op one by one, without running attention chains in tiles
    /// (the two give the same values up to the order of sums; tests compare them).
    pub fn without_fusion(mut self) -> Self {
        self.fuse = false;
        self.schedule = std::sync::OnceLock::new();
        self
    }

    /// Compute every column of every value, without packing repeated ones
    /// (the two give the same bits; tests compare them).
    pub fn without_packing(mut self) -> Self {
        self.pack = false;
        self
    }

    /// How many attention chains a run without captures executes in tiles.
    pub fn attention_chains(&self) -> usize {
        self.schedule().plans.len()
    }

    /// The schedule of runs without captures, made by the first use.
    pub(super) fn schedule(&self) -> &Schedule<'p> {
        self.schedule
            .get_or_init(|| Schedule::new(self.func, &Set::default(), self.fuse))
    }

    pub fn function(&self) -> &Function {
        self.func
    }

    /// Run on named inputs (f32 tensors whose shapes match the declared inputs).
    pub fn run(
        &self,
        inputs: &HashMap<String, Tensor>,
        precision: Precision,
    ) -> Result<RunOutput, InterpError> {
        self.run_capturing(inputs, precision, &Capture::default())
    }

    /// Run, and also keep the values `capture` names (op outputs), e.g.
    /// the output of each block, for reports of where drift enters.
    pub fn run_capturing(
        &self,
        inputs: &HashMap<String, Tensor>,
        precision: Precision,
        capture: &Capture,
    ) -> Result<RunOutput, InterpError> {
        // On a thread of rayon's pool: the ops' parallel loops then start
        // where they run, instead of each waking the pool from outside and
        // waiting (a packed call's ops are small, and many).
        rayon::scope(|_| self.run_in_pool(inputs, precision, capture))
    }
}

/// The string parameters the interpreter reads, with the values it
/// implements: anything else is refused when the interpreter is made, before
/// any op runs.
const STRING_PARAMS: &[(&str, &str, &[&str])] = &[
    (
        "gelu",
        "mode",
        &["EXACT", "TANH_APPROXIMATION", "SIGMOID_APPROXIMATION"],
    ),
    (
        "cast",
        "dtype",
        &[
            "fp16", "fp32", "fp64", "int32", "int64", "int16", "int8", "uint8", "uint16", "bool",
        ],
    ),
    (
        "conv",
        "pad_type",
        &["valid", "same", "same_lower", "custom"],
    ),
];

/// Refuse a string parameter of [`STRING_PARAMS`] (inline, or a `const`'s
/// output) whose value the interpreter does not implement, naming the op,
/// the parameter and the value.
fn check_string_params(func: &Function) -> Result<(), InterpError> {
    let string_of = |v: &Value| match v {
        Value::Immediate {
            data: HostData::Str(s),
            ..
        } => s.first().cloned(),
        _ => None,
    };
    let consts: Map<&str, String> = func
        .ops
        .iter()
        .filter(|o| o.kind == "const")
        .filter_map(|o| {
            Some((
                o.outputs.first()?.name.as_str(),
                string_of(o.attributes.get("val")?)?,
            ))
        })
        .collect();
    for op in &func.ops {
        for &(kind, key, allowed) in STRING_PARAMS.iter().filter(|p| p.0 == op.kind) {
            let value = match op.inputs.get(key).map(Vec::as_slice) {
                Some([Arg::Const(v)]) => string_of(v),
                Some([Arg::Var(n)]) => consts.get(n.as_str()).cloned(),
                _ => op.attributes.get(key).and_then(string_of),
            };
            if let Some(v) = value
                && !allowed.contains(&v.as_str())
            {
                return Err(InterpError::UnsupportedParam {
                    op: op.label().to_string(),
                    kind: kind.to_string(),
                    key: key.to_string(),
                    value: v,
                    supported: allowed.iter().map(|s| s.to_string()).collect(),
                });
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A golden program whose `gelu` mode (or `cast` dtype) is changed to a
    /// value the interpreter lacks is refused when the interpreter is made,
    /// naming the op, the parameter and the value; the unedited one is not.
    #[test]
    fn unknown_string_parameters_are_refused_before_running() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("golden/mil");
        let mut seen = 0;
        for case in std::fs::read_dir(&dir).unwrap() {
            let pkg_path = case.unwrap().path().join("model.mlpackage");
            if !pkg_path.exists() {
                continue;
            }
            let pkg = Package::open(&pkg_path).unwrap();
            let names: Vec<String> = pkg.program.functions.keys().cloned().collect();
            for fname in names {
                assert!(
                    Interpreter::new(&pkg, Some(&fname)).is_ok(),
                    "{}",
                    pkg_path.display()
                );
                for &(kind, key, _) in STRING_PARAMS {
                    let mut edited = Package::open(&pkg_path).unwrap();
                    let func = edited.program.functions.get_mut(&fname).unwrap();
                    let Some(i) = func.ops.iter().position(|o| o.kind == kind) else {
                        continue;
                    };
                    // The parameter, inline or through its const.
                    let arg = func.ops[i].inputs.get(key).and_then(|a| a.first()).cloned();
                    let bogus = Value::Immediate {
                        ty: crate::mlpackage::TensorType {
                            dtype: DType::Str,
                            shape: vec![],
                        },
                        data: HostData::Str(vec!["BOGUS".into()]),
                    };
                    match arg {
                        Some(Arg::Var(n)) => {
                            let c = func
                                .ops
                                .iter_mut()
                                .find(|o| {
                                    o.kind == "const"
                                        && o.outputs.first().is_some_and(|x| x.name == n)
                                })
                                .unwrap();
                            c.attributes.insert("val".into(), bogus);
                        }
                        _ => {
                            func.ops[i]
                                .inputs
                                .insert(key.into(), vec![Arg::Const(bogus)]);
                        }
                    }
                    let label = func.ops[i].label().to_string();
                    let e = Interpreter::new(&edited, Some(&fname)).err().unwrap();
                    assert!(
                        matches!(&e, InterpError::UnsupportedParam { op, kind: k, key: p, value, .. }
                            if *op == label && k == kind && p == key && value == "BOGUS"),
                        "{e:?}"
                    );
                    assert!(
                        e.to_string()
                            .contains(&format!("op `{label}` ({kind}): {key} `BOGUS`")),
                        "{e}"
                    );
                    seen += 1;
                }
            }
        }
        assert!(seen >= 2, "only {seen} golden ops to edit");
    }

    /// What a caller gets wrong, and an op the interpreter lacks, are
    /// variants of their own, worded as they always were.
    #[test]
    fn refusals_are_typed_and_worded() {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("golden/mil/elementwise/model.mlpackage");
        let pkg = Package::open(&path).unwrap();
        let it = Interpreter::new(&pkg, None).unwrap();
        let func = it.function();
        let input = &func.inputs[0];

        let e = it.run(&HashMap::new(), Precision::Fp32).err().unwrap();
        assert!(
            matches!(&e, InterpError::MissingInput { name, .. } if *name == input.name),
            "{e:?}"
        );
        assert_eq!(
            e.to_string(),
            format!(
                "function `{}` needs input `{}` {:?} {:?}",
                func.name, input.name, input.ty.dtype, input.ty.shape
            )
        );

        let wrong = Tensor::zeros(7, candle_core::DType::F32, &candle_core::Device::Cpu).unwrap();
        let inputs = HashMap::from([(input.name.clone(), wrong)]);
        let e = it.run(&inputs, Precision::Fp32).err().unwrap();
        assert!(
            matches!(&e, InterpError::InputShape { got, .. } if *got == [7]),
            "{e:?}"
        );
        assert_eq!(
            e.to_string(),
            format!(
                "input `{}` has shape [7], the function expects {:?}",
                input.name, input.ty.shape
            )
        );

        let e = Interpreter::new(&pkg, Some("nope")).err().unwrap();
        assert!(
            matches!(&e, InterpError::Package(p)
            if matches!(**p, crate::mlpackage::PackageError::NoSuchFunction { .. })),
            "{e:?}"
        );

        let mut edited = Package::open(&path).unwrap();
        let name = edited.program.functions.keys().next().unwrap().clone();
        let func = edited.program.functions.get_mut(&name).unwrap();
        let i = func.ops.iter().position(|o| o.kind != "const").unwrap();
        func.ops[i].kind = "bogus_op".into();
        let label = func.ops[i].label().to_string();
        let e = Interpreter::new(&edited, Some(&name)).err().unwrap();
        assert!(
            matches!(&e, InterpError::UnsupportedOps { ops, .. }
            if *ops == [("bogus_op".to_string(), label.clone())]),
            "{e:?}"
        );
        assert_eq!(
            e.to_string(),
            format!(
                "function `{name}` uses ops the interpreter does not support: `bogus_op` (op `{label}`)"
            )
        );
    }
}
