//! The residency gate's result from Core ML's `MLComputePlan` (on a Mac:
//! [`crate::exec::coreml::CoreMl::plan`]): each op's preferred device, the
//! fraction weighted by the plan's estimated cost, labelled `coreml-plan`.

use std::collections::BTreeMap;

use super::residency::{ByType, OffAne, Prediction};
use crate::exec::ExecutorError;

/// Turn the plan rows written by `ane_export.coreml plan` into a residency
/// result: the fraction is the cost weight Core ML places on the Neural Engine.
/// Rows that are not the plan's are [`ExecutorError::BadPlan`], as the
/// Core ML child's other failures.
pub fn plan_to_prediction(function: &str, json: &str) -> Result<Prediction, ExecutorError> {
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
    let plan: Plan =
        serde_json::from_str(json).map_err(|e| ExecutorError::BadPlan(e.to_string()))?;
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
                rule: format!("coreml-plan: {}", r.device),
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
        assert_eq!(p.off_ane[0].rule, "coreml-plan: cpu");
        let e = plan_to_prediction("b1024", "{}").unwrap_err();
        assert!(
            matches!(&e, ExecutorError::BadPlan(m) if m.contains("operations")),
            "{e:?}"
        );
        assert!(
            e.to_string()
                .starts_with("compute plan: missing field `operations`")
        );
    }
}
