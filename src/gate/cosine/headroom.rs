//! Headroom per op: the largest magnitude each op of the program produced
//! over the gate's cases, against the largest its output can hold where it
//! runs, smallest margins first, with the case that gave each.
//!
//! The limits are the Neural Engine's ([`crate::interp::ane_limit`]: 32,752
//! for matmul and conv outputs, 4,094 for a slice with an offset on the
//! last axis on M1/M2, 65,504 otherwise) when the interpreter ran in its
//! ANE mode, fp16's 65,504 for every op in fp16 mode. An op past its limit
//! on any case fails that case ([`over_limit`]); the squares inside the
//! norms are reported beside, as information only: how the Neural Engine
//! computes a norm's statistics is not published (docs/numerics.md).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::interp::Peak;

/// fp16's largest finite value: every op's limit outside the ANE mode.
pub const FP16_MAX: f32 = 65_504.0;

/// One op's headroom over the gate's cases.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct OpHeadroom {
    pub op: String,
    pub kind: String,
    /// The largest magnitude it produced (`None`: infinite, past its limit
    /// in the ANE mode or past fp16's range).
    pub peak: Option<f64>,
    /// The largest its output can hold.
    pub limit: f64,
    /// `limit / peak` (`None` for a peak of 0); below 1 (or a `None`
    /// peak) is past the limit.
    pub margin: Option<f64>,
    /// The case and bucket that gave the peak.
    pub case: String,
    pub bucket: String,
}

/// A norm's input: its largest square, as information.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct NormSquare {
    pub op: String,
    /// The largest square of its input (`None`: infinite).
    pub largest_square: Option<f64>,
    pub case: String,
    pub bucket: String,
}

/// Every op's headroom and the norms' squares over the gate's cases.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct Headroom {
    /// The limits applied: `ane` (the Neural Engine's) or `fp16`.
    pub limits: String,
    /// Every op that computes (not those that only move values), smallest
    /// margin first.
    pub ops: Vec<OpHeadroom>,
    /// The layer_norms' input squares, largest first.
    pub norm_squares: Vec<NormSquare>,
}

/// The limit an op is held to: the ANE's with `ane`, else fp16's.
pub fn limit_of(p: &Peak, ane: bool) -> f32 {
    if ane { p.limit } else { FP16_MAX }
}

/// The ops of one run past their limit, in program order.
pub fn over_limit(peaks: &[Peak], ane: bool) -> Vec<&Peak> {
    peaks
        .iter()
        .filter(|p| !within(p.max_abs, limit_of(p, ane)))
        .collect()
}

/// Whether `x` is at most `limit` (never for a NaN: a NaN is past any limit).
fn within(x: f32, limit: f32) -> bool {
    x <= limit
}

fn finite(x: f32) -> Option<f64> {
    x.is_finite().then_some(x as f64)
}

/// What to say of an op past its limit.
pub fn describe(p: &Peak, ane: bool) -> String {
    let limit = limit_of(p, ane);
    let what = if !ane {
        "fp16's range (65,504)"
    } else if limit == 32_752.0 {
        "the Neural Engine's 32,752 for matmul and conv outputs"
    } else if limit == 4_094.0 {
        "the 4,094 of a slice with an offset on the last axis (M1/M2)"
    } else {
        "fp16's range (65,504)"
    };
    let value = if p.max_abs.is_finite() {
        format!("reached {:.0}", p.max_abs)
    } else {
        "became infinite".to_string()
    };
    format!("op `{}` ({}) {value}, past {what}", p.op, p.kind)
}

/// Fold one run's peaks (case `case` in bucket `bucket`) into `by_op` and
/// `norms`: the largest per op, with where it came from.
pub fn add_run(
    by_op: &mut BTreeMap<String, (usize, Peak, String, String)>,
    norms: &mut BTreeMap<String, (f32, String, String)>,
    peaks: &[Peak],
    case: &str,
    bucket: &str,
) {
    for (i, p) in peaks.iter().enumerate() {
        let bigger = |old: f32| !within(p.max_abs, old);
        match by_op.get(&p.op) {
            Some((_, old, _, _)) if !bigger(old.max_abs) => {}
            _ => {
                let order = by_op.get(&p.op).map_or(i, |o| o.0);
                by_op.insert(
                    p.op.clone(),
                    (order, p.clone(), case.to_string(), bucket.to_string()),
                );
            }
        }
        if let Some(sq) = p.input_sq_max {
            let keep = norms.get(&p.op).is_none_or(|(old, _, _)| !within(sq, *old));
            if keep {
                norms.insert(p.op.clone(), (sq, case.to_string(), bucket.to_string()));
            }
        }
    }
}

/// The report from what [`add_run`] gathered.
pub fn finish(
    by_op: BTreeMap<String, (usize, Peak, String, String)>,
    norms: BTreeMap<String, (f32, String, String)>,
    ane: bool,
) -> Headroom {
    let mut ops: Vec<(usize, OpHeadroom)> = by_op
        .into_values()
        .map(|(order, p, case, bucket)| {
            let limit = limit_of(&p, ane) as f64;
            let peak = finite(p.max_abs);
            let margin = match peak {
                Some(v) if v > 0.0 => Some(limit / v),
                Some(_) => None,
                None => Some(0.0),
            };
            (
                order,
                OpHeadroom {
                    op: p.op,
                    kind: p.kind,
                    peak,
                    limit,
                    margin,
                    case,
                    bucket,
                },
            )
        })
        .collect();
    // Smallest margin first; ops that produced only zeros last; program
    // order among equals.
    ops.sort_by(|a, b| {
        let m = |o: &OpHeadroom| o.margin.unwrap_or(f64::INFINITY);
        m(&a.1).total_cmp(&m(&b.1)).then(a.0.cmp(&b.0))
    });
    let mut norm_squares: Vec<NormSquare> = norms
        .into_iter()
        .map(|(op, (sq, case, bucket))| NormSquare {
            op,
            largest_square: finite(sq),
            case,
            bucket,
        })
        .collect();
    norm_squares.sort_by(|a, b| {
        let v = |n: &NormSquare| n.largest_square.unwrap_or(f64::INFINITY);
        v(b).total_cmp(&v(a))
    });
    Headroom {
        limits: if ane { "ane" } else { "fp16" }.into(),
        ops: ops.into_iter().map(|(_, o)| o).collect(),
        norm_squares,
    }
}

/// Two partial reports' headroom as one (`gate --merge`): the larger peak
/// per op, the larger square per norm.
pub fn merge(a: Headroom, b: Headroom) -> Headroom {
    if a.ops.is_empty() && a.norm_squares.is_empty() {
        return b;
    }
    let mut ops: BTreeMap<String, OpHeadroom> = BTreeMap::new();
    let mut order: Vec<String> = Vec::new();
    for o in a.ops.into_iter().chain(b.ops) {
        let m = |o: &OpHeadroom| o.margin.unwrap_or(f64::INFINITY);
        match ops.get(&o.op) {
            Some(old) if m(old) <= m(&o) => {}
            _ => {
                if !ops.contains_key(&o.op) {
                    order.push(o.op.clone());
                }
                ops.insert(o.op.clone(), o);
            }
        }
    }
    let mut ops: Vec<OpHeadroom> = order.into_iter().filter_map(|k| ops.remove(&k)).collect();
    ops.sort_by(|x, y| {
        let m = |o: &OpHeadroom| o.margin.unwrap_or(f64::INFINITY);
        m(x).total_cmp(&m(y))
    });
    let mut norms: BTreeMap<String, NormSquare> = BTreeMap::new();
    for n in a.norm_squares.into_iter().chain(b.norm_squares) {
        let v = |n: &NormSquare| n.largest_square.unwrap_or(f64::INFINITY);
        match norms.get(&n.op) {
            Some(old) if v(old) >= v(&n) => {}
            _ => {
                norms.insert(n.op.clone(), n);
            }
        }
    }
    let mut norm_squares: Vec<NormSquare> = norms.into_values().collect();
    norm_squares.sort_by(|x, y| {
        let v = |n: &NormSquare| n.largest_square.unwrap_or(f64::INFINITY);
        v(y).total_cmp(&v(x))
    });
    Headroom {
        limits: a.limits,
        ops,
        norm_squares,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn peak(op: &str, kind: &str, max_abs: f32, limit: f32, sq: Option<f32>) -> Peak {
        Peak {
            op: op.into(),
            kind: kind.into(),
            max_abs,
            limit,
            input_sq_max: sq,
        }
    }

    #[test]
    fn the_largest_peak_per_op_smallest_margin_first_with_its_case() {
        let mut by_op = BTreeMap::new();
        let mut norms = BTreeMap::new();
        let a = [
            peak("b0_fc1", "conv", 100.0, 32_752.0, None),
            peak("b0_norm", "layer_norm", 3.0, 65_504.0, Some(400.0)),
            peak("b0_res", "add", 40_000.0, 65_504.0, None),
        ];
        let b = [
            peak("b0_fc1", "conv", 30_000.0, 32_752.0, None),
            peak("b0_norm", "layer_norm", 3.0, 65_504.0, Some(100.0)),
            peak("b0_res", "add", 10.0, 65_504.0, None),
        ];
        add_run(&mut by_op, &mut norms, &a, "square.png", "b1024");
        add_run(&mut by_op, &mut norms, &b, "noise.png", "b4096");
        let h = finish(by_op, norms, true);
        assert_eq!(h.ops[0].op, "b0_fc1");
        assert_eq!(h.ops[0].case, "noise.png");
        assert_eq!(h.ops[0].bucket, "b4096");
        assert!((h.ops[0].margin.unwrap() - 32_752.0 / 30_000.0).abs() < 1e-9);
        assert_eq!(h.ops[1].op, "b0_res");
        assert_eq!(h.ops[1].case, "square.png");
        assert_eq!(h.norm_squares[0].largest_square, Some(400.0));
        assert_eq!(h.norm_squares[0].case, "square.png");
        // In fp16 mode the same conv is held to 65,504.
        let mut by_op = BTreeMap::new();
        add_run(&mut by_op, &mut BTreeMap::new(), &b, "noise.png", "b4096");
        let h = finish(by_op, BTreeMap::new(), false);
        assert_eq!(h.ops[0].limit, 65_504.0);
    }

    #[test]
    fn ops_past_their_limit_fail_and_are_named() {
        let p = [
            peak("b1_fc2", "conv", 40_000.0, 32_752.0, None),
            peak("b1_res", "add", 40_000.0, 65_504.0, None),
            peak("b1_q", "slice_by_index", f32::INFINITY, 4_094.0, None),
        ];
        let ane: Vec<&str> = over_limit(&p, true).iter().map(|p| p.op.as_str()).collect();
        assert_eq!(ane, ["b1_fc2", "b1_q"]);
        let fp16: Vec<&str> = over_limit(&p, false)
            .iter()
            .map(|p| p.op.as_str())
            .collect();
        assert_eq!(fp16, ["b1_q"]);
        let d = describe(&p[0], true);
        assert!(
            d.contains("b1_fc2") && d.contains("40000") && d.contains("32,752"),
            "{d}"
        );
        let d = describe(&p[2], true);
        assert!(d.contains("became infinite") && d.contains("4,094"), "{d}");
        // A NaN peak is past any limit.
        assert_eq!(
            over_limit(&[peak("x", "mul", f32::NAN, 65_504.0, None)], true).len(),
            1
        );
    }

    #[test]
    fn merged_parts_keep_the_smaller_margin() {
        let h = |peak_v: f64, case: &str| Headroom {
            limits: "ane".into(),
            ops: vec![OpHeadroom {
                op: "b0_fc1".into(),
                kind: "conv".into(),
                peak: Some(peak_v),
                limit: 32_752.0,
                margin: Some(32_752.0 / peak_v),
                case: case.into(),
                bucket: "b1024".into(),
            }],
            norm_squares: vec![],
        };
        let m = merge(h(10.0, "a"), h(100.0, "b"));
        assert_eq!(m.ops.len(), 1);
        assert_eq!(m.ops[0].case, "b");
        let m = merge(Headroom::default(), h(10.0, "a"));
        assert_eq!(m.ops[0].case, "a");
    }
}
