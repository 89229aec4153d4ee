//! Core ML on a Mac, behind the gate's [`Executor`] interface: prediction
//! with `CPU_AND_NE` and `MLComputePlan` (measured residency).
//!
//! This is the only Mac-specific code of the gates, and it is thin: each call
//! runs `python -m ane_export.coreml` from the project's venv in a child
//! process (a failed Neural Engine compile that kills the process on its
//! first prediction cannot take the gate down, ANE-RULES R18), exchanging
//! safetensors and JSON files. It cannot run on Linux; figures it produces
//! are labelled "measured".

use std::collections::{BTreeMap, HashMap};
use std::path::Path;
use std::process::Command;

use candle_core::{Device, Tensor};

use super::residency::{ByType, OffAne, Prediction};
use crate::bridge::PythonEnv;
use crate::interp::RunOutput;
use crate::mlpackage::Package;
use crate::runtime::Executor;
use crate::tensor_file::{self, OwnedTensor};

/// Core ML through coremltools in a child process.
pub struct CoreMl {
    pub env: PythonEnv,
    /// coremltools' compute units, `CPU_AND_NE` for the gates (ANE-RULES R15).
    pub units: String,
}

impl CoreMl {
    pub fn new(env: PythonEnv) -> Self {
        CoreMl {
            env,
            units: "CPU_AND_NE".into(),
        }
    }

    fn child(&self, args: &[&str]) -> Result<(), String> {
        let out = Command::new(&self.env.python)
            .args(["-m", "ane_export.coreml"])
            .args(args)
            .args(["--compute-units", &self.units])
            .env("PYTHONPATH", &self.env.package_dir)
            .output()
            .map_err(|e| format!("{}: {e}", self.env.python.display()))?;
        if out.status.success() {
            return Ok(());
        }
        let err = String::from_utf8_lossy(&out.stderr);
        Err(match out.status.code() {
            Some(c) => format!("Core ML child exited {c}: {}", err.trim()),
            None => format!(
                "Core ML child was killed by a signal (a failed Neural Engine compile kills the process on its first prediction, R18): {}",
                err.trim()
            ),
        })
    }

    /// `MLComputePlan` of one function as a residency result (measured).
    pub fn measure(&self, pkg: &Path, function: &str) -> Result<Prediction, String> {
        let dir = tempfile::tempdir().map_err(|e| e.to_string())?;
        let out = dir.path().join("plan.json");
        self.child(&[
            "plan",
            &pkg.to_string_lossy(),
            function,
            &out.to_string_lossy(),
        ])?;
        let text = std::fs::read_to_string(&out).map_err(|e| e.to_string())?;
        plan_to_prediction(function, &text)
    }
}

/// Turn the plan rows written by `ane_export.coreml plan` into a residency
/// result: the fraction is the cost weight Core ML places on the Neural Engine.
pub fn plan_to_prediction(function: &str, json: &str) -> Result<Prediction, String> {
    #[derive(serde::Deserialize)]
    struct Row {
        op: String,
        #[serde(rename = "type")]
        kind: String,
        device: String,
        cost: f64,
    }
    #[derive(serde::Deserialize)]
    struct Plan {
        operations: Vec<Row>,
    }
    let plan: Plan = serde_json::from_str(json).map_err(|e| format!("compute plan: {e}"))?;
    let mut by_type: BTreeMap<String, ByType> = BTreeMap::new();
    let mut off = Vec::new();
    let (mut total, mut on) = (0.0, 0.0);
    let mut ops = 0;
    for r in plan.operations.iter().filter(|r| r.kind != "const") {
        ops += 1;
        let e = by_type.entry(r.kind.clone()).or_insert_with(|| ByType {
            op: r.kind.clone(),
            ..ByType::default()
        });
        e.count += 1;
        e.cost += r.cost;
        total += r.cost;
        if r.device == "ane" {
            e.on_ane += 1;
            e.cost_on_ane += r.cost;
            on += r.cost;
        } else {
            off.push(OffAne {
                op: r.op.clone(),
                kind: r.kind.clone(),
                rule: format!("measured: {}", r.device),
                reason: format!("MLComputePlan prefers the {} for this op", r.device),
                cost: r.cost,
            });
        }
    }
    Ok(Prediction {
        function: function.to_string(),
        fraction: if total > 0.0 { on / total } else { 0.0 },
        ops,
        ops_off_ane: off.len(),
        by_type: by_type.into_values().collect(),
        off_ane: off,
        checks: vec![],
    })
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
        _capture: &[String],
    ) -> Result<RunOutput, String> {
        let dir = tempfile::tempdir().map_err(|e| e.to_string())?;
        let (inp, out) = (
            dir.path().join("in.safetensors"),
            dir.path().join("out.safetensors"),
        );
        let mut tensors = Vec::new();
        for (k, t) in inputs {
            let v = t
                .flatten_all()
                .and_then(|f| f.to_vec1::<f32>())
                .map_err(|e| e.to_string())?;
            tensors.push((k.clone(), OwnedTensor::f32(t.dims().to_vec(), &v)));
        }
        tensor_file::write(&inp, tensors, None).map_err(|e| e.to_string())?;
        self.child(&[
            "predict",
            &pkg.path.to_string_lossy(),
            function,
            &inp.to_string_lossy(),
            &out.to_string_lossy(),
        ])?;
        let bytes = std::fs::read(&out).map_err(|e| e.to_string())?;
        let f = pkg.program.function(Some(function))?;
        let mut outputs = BTreeMap::new();
        for o in &f.outputs {
            let t = tensor_file::read_tensor(&bytes, &out, &o.name).map_err(|e| e.to_string())?;
            let v = t
                .f32
                .ok_or_else(|| format!("output `{}` is not f32", o.name))?;
            outputs.insert(
                o.name.clone(),
                Tensor::from_vec(v, t.shape, &Device::Cpu).map_err(|e| e.to_string())?,
            );
        }
        // Core ML exposes neither intermediate values nor where fp16 overflowed.
        Ok(RunOutput {
            outputs,
            first_overflow: None,
            captured: BTreeMap::new(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plan_rows_weight_the_fraction_by_cost() {
        let json = r#"{"function": "b1024", "operations": [
            {"op": "w", "type": "const", "device": "cpu", "cost": 0.0, "supported": [], "block": ""},
            {"op": "c", "type": "conv", "device": "ane", "cost": 0.6, "supported": ["ane"], "block": ""},
            {"op": "g", "type": "gather", "device": "cpu", "cost": 0.1, "supported": ["cpu"], "block": ""},
            {"op": "s", "type": "softmax", "device": "ane", "cost": 0.3, "supported": ["ane"], "block": ""}]}"#;
        let p = plan_to_prediction("b1024", json).unwrap();
        assert!((p.fraction - 0.9).abs() < 1e-12);
        assert_eq!((p.ops, p.ops_off_ane), (3, 1));
        assert_eq!(p.off_ane[0].rule, "measured: cpu");
        assert!(plan_to_prediction("b1024", "{}").is_err());
    }
}
