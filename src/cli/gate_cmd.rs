//! `ane-export gate`: the arguments resolved into a plan, the library's
//! gates run on it, progress drawn, the summary printed, the exit code
//! taken from the report.

use std::process::ExitCode;

use super::GateArgs;
use crate::buckets::BucketsFile;
use crate::gate::{self, GatePlan, Note, Written};

/// The plan `a` asks for: the thresholds file read.
fn plan(a: GateArgs, interp: crate::interp::Settings) -> crate::Result<(GatePlan, String)> {
    let (thresholds, source) = BucketsFile::load(a.buckets.as_deref())?;
    let artifact = a
        .artifact
        .or(a.artifact_flag)
        .ok_or_else(|| crate::Error::Invalid("no artifact given".into()))?;
    let plan = GatePlan {
        artifact,
        model: a.model,
        revision: a.revision,
        hub_events: super::hub_events(),
        images: a.images,
        texts: a.texts,
        vqa: a.vqa,
        task: a.task,
        buckets: a.bucket,
        merge: a.merge,
        skip: a.skip,
        thresholds,
        executor: a.executor,
        timeouts: a.coreml.timeouts(),
        interp,
        on_profile: Some(super::print_profile),
        precision: a.precision,
    };
    Ok((plan, source))
}

pub(super) fn run(a: GateArgs, interp: crate::interp::Settings) -> anyhow::Result<ExitCode> {
    let json = a.json;
    let (plan, thresholds) = plan(a, interp)?;
    super::say(&format!("thresholds from {thresholds}"));
    let bar = indicatif::ProgressBar::with_draw_target(None, super::draw_target());
    if let Ok(style) = indicatif::ProgressStyle::with_template("{spinner} {msg} {elapsed}") {
        bar.set_style(style);
    }
    bar.enable_steady_tick(std::time::Duration::from_millis(200));
    // On a terminal the bar shows the current step; in a log (CI) each step
    // is a line with the seconds since the gate started, so a log shows
    // where a slow gate spent its time.
    let log = !std::io::IsTerminal::is_terminal(&std::io::stderr()) && !super::quiet();
    let start = std::time::Instant::now();
    let result = gate::run(&plan, &|n| match n {
        Note::Progress(m) if log => eprintln!("[{:7.1} s] {m}", start.elapsed().as_secs_f64()),
        Note::Progress(m) => bar.set_message(m.to_string()),
        Note::Warning(m) => bar.suspend(|| eprintln!("warning: {m}")),
    });
    bar.finish_and_clear();
    let (report, written) = result?;
    match &written {
        Written::Partial(path) => super::say(&format!(
            "wrote {}; once every bucket is gated: ane-export gate {} --merge",
            path.display(),
            plan.artifact.display()
        )),
        Written::Report(dir) => super::say(&format!(
            "wrote {} and report.html; manifest.json records {}",
            dir.join("report.json").display(),
            if report.accepted {
                "acceptance"
            } else if report.passed {
                "the result, without acceptance (gates skipped)"
            } else {
                "the rejection"
            }
        )),
    }
    if json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        print!("{}", report.summary());
    }
    Ok(ExitCode::from(gate::exit_code(&report)))
}
