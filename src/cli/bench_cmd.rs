//! `ane-run bench`: latency per bucket of an artifact, after a warm-up.
//!
//! Each bucket runs a synthetic image that fills it (a text encoder's, a
//! repeated sentence's tokens). With the interpreter
//! (any OS) there is one row per bucket; with Core ML on a Mac one row per
//! bucket and compute units (CPU_ONLY, CPU_AND_NE, ALL), the chip named, and
//! with `--energy` (root) the energy per image from `powermetrics`: after the
//! timed runs of each row, the model runs again back to back for
//! `--energy-seconds`, and the energy is the mean power of the samples wholly
//! inside that loop times its wall time per image (`crate::bench`).

use std::process::ExitCode;
use std::time::{Duration, Instant};

use serde_json::json;

use super::BenchArgs;
use crate::error::Error;
use crate::exec::Executor;
use crate::runtime::{Call, Runtime};

/// A call that fills a bucket, by modality.
enum Synthetic {
    Image(crate::runtime::Prepared),
    Tokens(crate::preprocess::TokenBatch),
}

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

pub(super) fn run(a: BenchArgs, interp: crate::interp::Settings) -> anyhow::Result<ExitCode> {
    if a.runs == 0 {
        return Err(Error::Invalid("--runs: at least one timed run is needed".into()).into());
    }
    // Checks that Core ML can run here before anything else (an artifact
    // that ships the .aimodel alone runs on Core AI).
    let art = crate::artifact::Artifact::open(&a.artifact)?;
    let coreai = a.executor.on_aimodel(&art)?;
    let coreml = !coreai && a.coreml.executor(a.executor, "CPU_ONLY")?.is_some();
    if a.energy && !coreml {
        return Err(Error::Invalid("--energy needs Core ML on a Mac (powermetrics)".into()).into());
    }
    if !(a.energy_seconds > 0.0 && a.energy_seconds <= 3600.0) {
        return Err(Error::Invalid(format!(
            "--energy-seconds: expected seconds in (0, 3600], got {}",
            a.energy_seconds
        ))
        .into());
    }
    // The idle baseline: samples before any model is loaded.
    let mut power = if a.energy {
        crate::bench::require_root()?;
        let mut pm = crate::bench::PowerMetrics::start(crate::bench::INTERVAL_MS)?;
        for w in &pm.warnings {
            eprintln!("{w}");
        }
        eprintln!("energy: {IDLE_SAMPLES} idle samples from powermetrics before loading");
        // The first sample covers powermetrics' own start: left out.
        let s = pm.wait_for(IDLE_SAMPLES + 1, Duration::from_secs(30))?;
        let idle = crate::bench::mean_power(&s[1..=IDLE_SAMPLES])
            .ok_or_else(|| Error::Invalid("powermetrics idle samples of zero length".into()))?;
        Some((pm, idle))
    } else {
        None
    };
    let min_samples =
        ((a.energy_seconds * 1000.0 / crate::bench::INTERVAL_MS as f64).ceil() as usize).max(1);
    // One runtime per way of running: the interpreter, or each compute-units setting.
    let mut executors: Vec<Box<dyn Executor>> = Vec::new();
    if coreml {
        for units in ["CPU_ONLY", "CPU_AND_NE", "ALL"] {
            if let Some(c) = a.coreml.executor(a.executor, units)? {
                executors.push(Box::new(c));
            }
        }
    } else {
        executors.push(a.executor.for_artifact(
            &art,
            "CPU_ONLY",
            a.coreml.timeouts(),
            super::mil(a.precision, interp),
        )?);
    }
    let machine = if coreml {
        format!(
            "{} (measured on a Mac)",
            crate::bench::this_chip().unwrap_or_else(|e| format!("chip unknown: {e}"))
        )
    } else if coreai {
        format!(
            "{} {} CPU, Core AI runtime",
            std::env::consts::OS,
            std::env::consts::ARCH
        )
    } else {
        format!(
            "{} {} CPU, MIL interpreter (matrix products: {}, kernels {})",
            std::env::consts::OS,
            std::env::consts::ARCH,
            crate::blas::backend(),
            crate::blas::kernel()
        )
    };

    let mut rows = Vec::new();
    for executor in executors {
        let describe = executor.describe();
        let rt = Runtime::load(
            super::embed_cmd::clear(&a.artifact, a.allow_unaccepted)?,
            executor,
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
            // A synthetic input that fills the bucket: an image, or tokens.
            let input = match rt.artifact.cfg.input() {
                crate::family::Input::Pixels(_) => Synthetic::Image(rt.synthetic(b)?),
                crate::family::Input::Tokens(_) => Synthetic::Tokens(rt.synthetic_tokens(b)?),
            };
            let call = match &input {
                Synthetic::Image(p) => Call::Pixels(&p.batch),
                Synthetic::Tokens(t) => Call::Tokens(t),
            };
            let once = || rt.call(call, b).map(|(_, _, predict)| predict);
            eprintln!(
                "bench {} with {describe}: {} warm-up, {} runs",
                b.name, a.warmup, a.runs
            );
            for _ in 0..a.warmup {
                once()?;
            }
            let (mut times, mut predict) = (Vec::with_capacity(a.runs), Vec::new());
            for _ in 0..a.runs {
                let t = Instant::now();
                let p = once()?;
                times.push(t.elapsed().as_secs_f64());
                predict.extend(p);
            }
            let energy = match power.as_mut() {
                Some((pm, idle)) => {
                    eprintln!(
                        "energy {} with {describe}: at least {} s of runs",
                        b.name, a.energy_seconds
                    );
                    let e = pm.measure(*idle, a.runs, min_samples, || once().map(|_| ()))?;
                    serde_json::to_value(e)?
                }
                None => serde_json::Value::Null,
            };
            let (median, p90) = median_p90(&mut times);
            // The prediction alone, when the executor times it (Core ML).
            let (predict_median, predict_p90) = if predict.len() == times.len() {
                let (m, p) = median_p90(&mut predict);
                (json!(m), json!(p))
            } else {
                (serde_json::Value::Null, serde_json::Value::Null)
            };
            rows.push(json!({
                "executor": describe, "bucket": b.name, "patches": b.patches,
                "warmup": a.warmup, "runs": a.runs, "median_s": median, "p90_s": p90,
                "min_s": times.first(), "predict_median_s": predict_median,
                "predict_p90_s": predict_p90, "energy_per_image": energy,
            }));
        }
    }
    let (idle, samplers) = match power {
        Some((pm, idle)) => {
            let samplers = pm.samplers().join(",");
            // Every row is measured: a bad last sample must not lose them.
            if let Err(e) = pm.stop() {
                eprintln!("warning: stopping powermetrics: {e}");
            }
            (serde_json::to_value(idle)?, json!(samplers))
        }
        None => (serde_json::Value::Null, serde_json::Value::Null),
    };
    let report = json!({"artifact": a.artifact, "machine": machine, "idle_power": idle,
                        "energy_samplers": samplers, "results": rows});
    if a.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        print!("{}", table(&machine, &report));
    }
    Ok(ExitCode::SUCCESS)
}

/// Samples of idle power taken before the first model loads.
const IDLE_SAMPLES: usize = 10;

/// The text report: one line per row, with the energy columns when measured.
fn table(machine: &str, report: &serde_json::Value) -> String {
    let rows = report["results"]
        .as_array()
        .map(Vec::as_slice)
        .unwrap_or(&[]);
    let energy = rows.iter().any(|r| !r["energy_per_image"].is_null());
    let predict = rows.iter().any(|r| !r["predict_median_s"].is_null());
    let mut out = format!("{machine}\n");
    out += &format!(
        "{:<40} {:<8} {:>8} {:>10} {:>10}",
        "executor", "bucket", "patches", "median s", "p90 s"
    );
    if predict {
        out += &format!(" {:>12} {:>12}", "predict med", "predict p90");
    }
    if energy {
        out += &format!(
            " {:>12} {:>12} {:>12}",
            "ANE mJ/img", "GPU mJ/img", "CPU mJ/img"
        );
    }
    out += "\n";
    let f = |v: &serde_json::Value| v.as_f64().unwrap_or(f64::NAN);
    for r in rows {
        out += &format!(
            "{:<40} {:<8} {:>8} {:>10.3} {:>10.3}",
            r["executor"].as_str().unwrap_or(""),
            r["bucket"].as_str().unwrap_or(""),
            r["patches"],
            f(&r["median_s"]),
            f(&r["p90_s"])
        );
        if predict {
            out += &format!(
                " {:>12.3} {:>12.3}",
                f(&r["predict_median_s"]),
                f(&r["predict_p90_s"])
            );
        }
        if energy {
            // A unit powermetrics did not report shows as `-`, not 0.
            let e = &r["energy_per_image"]["total"];
            for unit in ["ane_mj", "gpu_mj", "cpu_mj"] {
                out += &match e[unit].as_f64() {
                    Some(mj) => format!(" {mj:>12.1}"),
                    None => format!(" {:>12}", "-"),
                };
            }
        }
        out += "\n";
    }
    if predict {
        out += "predict: Core ML's prediction alone, timed in its child process; median and \
                p90 also pass the tensors to it and back through files\n";
    }
    if energy {
        out += &format!(
            "energy: powermetrics ({}) on this Mac, mean power while running times wall time \
             per image; idle power and the figures above idle are in --json\n",
            report["energy_samplers"]
                .as_str()
                .unwrap_or("samplers unknown")
        );
    }
    out
}

#[cfg(test)]
mod tests {
    use super::{median_p90, table};
    use serde_json::json;

    #[test]
    fn the_table_shows_energy_only_when_measured() {
        let row = |energy| {
            json!({"executor": "coreml CPU_AND_NE", "bucket": "b1024", "patches": 1024,
                   "median_s": 0.05, "p90_s": 0.06, "energy_per_image": energy})
        };
        let t = table("m", &json!({"results": [row(serde_json::Value::Null)]}));
        assert!(!t.contains("mJ") && !t.contains("predict"), "{t}");
        let mut timed = row(serde_json::Value::Null);
        timed["predict_median_s"] = json!(0.0123);
        timed["predict_p90_s"] = json!(0.0456);
        let t = table("m", &json!({"results": [timed]}));
        assert!(
            t.contains("predict med") && t.contains("0.012") && t.contains("0.046"),
            "{t}"
        );
        let e = json!({"total": {"ane_mj": 75.04, "gpu_mj": null, "cpu_mj": 40.0}});
        let t = table(
            "m",
            &json!({"energy_samplers": "cpu_power,gpu_power", "results": [row(e)]}),
        );
        assert!(
            t.contains("ANE mJ/img")
                && t.contains("75.0")
                && t.contains("powermetrics (cpu_power,gpu_power)"),
            "{t}"
        );
        // The GPU not reported: `-`, never a 0 or NaN.
        let last = t.lines().find(|l| l.contains("b1024")).unwrap();
        assert!(
            last.trim_end().ends_with("75.0            -         40.0"),
            "{last}"
        );
        assert!(!t.contains("NaN"), "{t}");
    }

    #[test]
    fn median_and_p90() {
        assert_eq!(median_p90(&mut [3.0, 1.0, 2.0]), (2.0, 3.0));
        let mut v: Vec<f64> = (1..=10).map(f64::from).collect();
        assert_eq!(median_p90(&mut v), (5.5, 9.0));
        assert_eq!(median_p90(&mut [4.0]), (4.0, 4.0));
    }
}
