//! `ane-run bench`: latency per bucket of an artifact, after a warm-up.
//!
//! Each bucket runs a synthetic image that fills it. With the interpreter
//! (any OS) there is one row per bucket; with Core ML on a Mac one row per
//! bucket and compute units (CPU_ONLY, CPU_AND_NE, ALL), the chip named, and
//! with `--energy` (root) the energy per image from `powermetrics`.

use std::process::ExitCode;
use std::time::Instant;

use serde_json::json;

use super::BenchArgs;
use crate::error::Error;
use crate::runtime::{Executor, LoadOptions, MilExecutor, Runtime};

/// Median and 90th percentile (nearest rank) of sorted-in-place samples.
fn median_p90(v: &mut [f64]) -> (f64, f64) {
    v.sort_by(f64::total_cmp);
    let n = v.len();
    if n == 0 {
        return (f64::NAN, f64::NAN);
    }
    let med = if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    };
    let rank = ((0.9 * n as f64).ceil() as usize).clamp(1, n);
    (med, v[rank - 1])
}

pub(super) fn run(a: BenchArgs) -> anyhow::Result<ExitCode> {
    if a.runs == 0 {
        return Err(Error::Invalid("--runs: at least one timed run is needed".into()).into());
    }
    let coreml = a.executor.is_coreml();
    if coreml && !cfg!(target_os = "macos") {
        return Err(Error::Invalid(
            "--executor coreml needs macOS (Core ML); on this machine use --executor mil".into(),
        )
        .into());
    }
    if a.energy && !coreml {
        return Err(Error::Invalid("--energy needs Core ML on a Mac (powermetrics)".into()).into());
    }
    // One runtime per way of running: the interpreter, or each compute-units setting.
    let mut executors: Vec<Box<dyn Executor>> = Vec::new();
    if coreml {
        let env = crate::bridge::find_env()?;
        for units in ["CPU_ONLY", "CPU_AND_NE", "ALL"] {
            let mut c = crate::gate::coreml::CoreMl::new(env.clone());
            c.units = units.into();
            executors.push(Box::new(c));
        }
    } else {
        executors.push(Box::new(MilExecutor(a.precision)));
    }
    let machine = if coreml {
        format!(
            "{} (measured on a Mac)",
            crate::mac::this_chip().unwrap_or_else(|e| format!("chip unknown: {e}"))
        )
    } else {
        format!(
            "{} {} CPU, MIL interpreter",
            std::env::consts::OS,
            std::env::consts::ARCH
        )
    };

    let mut rows = Vec::new();
    for executor in executors {
        let describe = executor.describe();
        let rt = Runtime::load(
            &a.artifact,
            LoadOptions {
                allow_unaccepted: a.allow_unaccepted,
                executor,
            },
        )?;
        let buckets: Vec<_> = if a.bucket.is_empty() {
            rt.artifact.buckets.clone()
        } else {
            a.bucket
                .iter()
                .map(|n| rt.artifact.bucket(n).cloned())
                .collect::<crate::Result<Vec<_>>>()?
        };
        for b in &buckets {
            let p = rt.synthetic(b)?;
            eprintln!(
                "bench {} with {describe}: {} warm-up, {} runs",
                b.name, a.warmup, a.runs
            );
            for _ in 0..a.warmup {
                rt.execute_in(&p, b)?;
            }
            let power = if a.energy {
                let f =
                    tempfile::NamedTempFile::new().map_err(|e| Error::Invalid(e.to_string()))?;
                Some((
                    crate::mac::PowerMetrics::start(f.path(), 100).map_err(Error::Invalid)?,
                    f,
                ))
            } else {
                None
            };
            let mut times = Vec::with_capacity(a.runs);
            for _ in 0..a.runs {
                let t = Instant::now();
                rt.execute_in(&p, b)?;
                times.push(t.elapsed().as_secs_f64());
            }
            let energy = match power {
                Some((pm, _file)) => {
                    let s = pm.stop().map_err(Error::Invalid)?;
                    let per = |f: fn(&crate::mac::EnergySample) -> f64| {
                        s.iter().map(f).sum::<f64>() / a.runs as f64
                    };
                    json!({"ane_mj": per(|x| x.ane_mj), "cpu_mj": per(|x| x.cpu_mj),
                           "gpu_mj": per(|x| x.gpu_mj), "samples": s.len()})
                }
                None => serde_json::Value::Null,
            };
            let (median, p90) = median_p90(&mut times);
            rows.push(json!({
                "executor": describe, "bucket": b.name, "patches": b.patches,
                "warmup": a.warmup, "runs": a.runs, "median_s": median, "p90_s": p90,
                "min_s": times.first(), "energy_per_image": energy,
            }));
        }
    }
    let report = json!({"artifact": a.artifact, "machine": machine, "results": rows});
    if a.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        println!("{machine}");
        println!(
            "{:<40} {:<8} {:>8} {:>10} {:>10}",
            "executor", "bucket", "patches", "median s", "p90 s"
        );
        for r in &rows {
            println!(
                "{:<40} {:<8} {:>8} {:>10.3} {:>10.3}",
                r["executor"].as_str().unwrap_or(""),
                r["bucket"].as_str().unwrap_or(""),
                r["patches"],
                r["median_s"].as_f64().unwrap_or(f64::NAN),
                r["p90_s"].as_f64().unwrap_or(f64::NAN)
            );
        }
    }
    Ok(ExitCode::SUCCESS)
}

#[cfg(test)]
mod tests {
    use super::median_p90;

    #[test]
    fn median_and_p90() {
        assert_eq!(median_p90(&mut [3.0, 1.0, 2.0]), (2.0, 3.0));
        let mut v: Vec<f64> = (1..=10).map(f64::from).collect();
        assert_eq!(median_p90(&mut v), (5.5, 9.0));
        assert_eq!(median_p90(&mut [4.0]), (4.0, 4.0));
    }
}
