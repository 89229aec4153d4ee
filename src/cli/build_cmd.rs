//! `ane-export build` and `ane-export layout`: the arguments resolved into
//! a plan, the library's build run on it, its progress drawn and its
//! summary printed.

use std::process::ExitCode;

use serde_json::json;

use super::{BuildArgs, LayoutArgs};
use crate::buckets::BucketsFile;
use crate::builder::{self, BuildPlan, Stage};
use crate::checkpoint::resolve_model;
use crate::error::Error;
use crate::export::layout;
use crate::family::Model;
use crate::tensor_file::{self, OwnedTensor};

/// One progress bar over the build's stages; drawn only on a terminal.
struct Stages(indicatif::ProgressBar);

impl Stages {
    fn new() -> Stages {
        let bar = indicatif::ProgressBar::with_draw_target(
            Some(Stage::ALL.len() as u64),
            super::draw_target(),
        );
        if let Ok(style) =
            indicatif::ProgressStyle::with_template("{spinner} [{pos}/{len}] {msg} {elapsed}")
        {
            bar.set_style(style);
        }
        bar.enable_steady_tick(std::time::Duration::from_millis(200));
        Stages(bar)
    }

    fn stage(&self, stage: Stage, detail: &str) {
        let i = Stage::ALL.iter().position(|s| *s == stage).unwrap_or(0);
        self.0.set_position(i as u64);
        self.0.set_message(format!("{stage} {detail}"));
    }
}

impl Drop for Stages {
    fn drop(&mut self) {
        self.0.finish_and_clear();
    }
}

/// The plan `a` asks for: the buckets file read and the buckets selected.
fn plan(a: BuildArgs) -> crate::Result<(BuildPlan, String)> {
    let (file, source) = BucketsFile::load(a.buckets.as_deref())?;
    let buckets = file.select(&a.bucket).map_err(|error| Error::Buckets {
        file: source.clone(),
        error,
    })?;
    let plan = BuildPlan {
        model: a.model.model,
        revision: a.model.revision,
        hub_events: super::hub_events(),
        out: a.out,
        buckets,
        per_bucket: a.per_bucket,
        target: a.target,
        weights: a.weights,
        format: a.format,
        query_chunk: a.query_chunk,
        residual_scale: a.residual_scale,
        calibration_images: a.calibration_images,
        branch_scale: a.branch_scale,
        force: a.force,
        faults: a.fault,
    };
    Ok((plan, source))
}

pub(super) fn run(a: BuildArgs) -> anyhow::Result<ExitCode> {
    let json_out = a.json;
    let (plan, buckets_file) = plan(a)?;
    let stages = Stages::new();
    let built = builder::build(&plan, &|s, d| stages.stage(s, d))?;
    drop(stages);
    let (total_s, emit_s) = (built.total_s, built.emit_s);
    let summary = json!({
        "artifact": built.artifact, "buckets": built.buckets.iter().map(|b| &b.0).collect::<Vec<_>>(),
        "packages": built.packages.iter().map(|p| p.file_name().map(|n| n.to_string_lossy().to_string())).collect::<Vec<_>>(),
        "fp16_weight_bytes": built.fp16_weight_bytes, "emit_s": emit_s, "total_s": total_s,
        "peak_rss_mb": super::peak_rss_mib(), "buckets_file": buckets_file,
        "residual_scale": built.residual_scale, "calibration": built.calibration,
        "formats": plan.format.shipped(),
        "aimodel": built.aimodel.as_ref().and_then(|p| p.file_name()).map(|n| n.to_string_lossy().to_string()),
    });
    if json_out {
        println!("{}", serde_json::to_string_pretty(&summary)?);
    } else {
        let shipped = match (&built.aimodel, built.packages.is_empty()) {
            (Some(a), false) => format!(
                "; with {}",
                a.file_name().unwrap_or_default().to_string_lossy()
            ),
            (Some(a), true) => format!(
                "; {} alone",
                a.file_name().unwrap_or_default().to_string_lossy()
            ),
            (None, _) => String::new(),
        };
        super::say(&format!(
            "built {} ({} buckets from {buckets_file}: {}) in {total_s:.1} s (emission {emit_s:.1} s){shipped}",
            built.artifact.display(),
            built.buckets.len(),
            built
                .buckets
                .iter()
                .map(|b| format!("{} = {} {}", b.0, b.1, built.slot_unit))
                .collect::<Vec<_>>()
                .join(", ")
        ));
        // A scale chosen is said; none needed (1) is in the manifest alone.
        if let Some(c) = built
            .calibration
            .as_ref()
            .filter(|c| c.residual_scale > 1 || c.short)
        {
            super::say(&c.summary());
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// `ane-export layout`: the ANE-layout weights and their description.
pub(super) fn layout(a: LayoutArgs) -> anyhow::Result<ExitCode> {
    let dir = resolve_model(
        &a.model.model,
        a.model.revision.as_deref(),
        &super::hub_events(),
    )?;
    let ck = Model::open(&dir)?;
    let weights = ck.vision.layout(&ck, layout::Storage::F32)?;
    if a.out.is_file() {
        return Err(Error::Invalid(format!(
            "--out {}: is a file, expected a directory",
            a.out.display()
        ))
        .into());
    }
    std::fs::create_dir_all(&a.out).map_err(|e| Error::io(&a.out, e))?;
    let desc: Vec<serde_json::Value> = weights
        .iter()
        .map(|t| json!({"name": t.name, "shape": t.shape, "dtype": "f32", "meaning": t.meaning}))
        .collect();
    let doc = json!({
        "family": ck.family.name(),
        "layout": "ANE: activations (B, C, 1, S); every Linear a 1x1 conv [out, in, 1, 1]; \
                   patch embedding folded over temporal frames to [D, 3*P*P, 1, 1]; norms over channels",
        "config": ck.vision,
        "source": dir,
        "tensors": desc,
    });
    let count = weights.len();
    tensor_file::write(
        &a.out.join("weights.safetensors"),
        weights
            .into_iter()
            .map(|t| {
                let values = match t.data {
                    layout::LayoutData::F32(v) => v,
                    layout::LayoutData::F16(v) => v.iter().map(|x| x.to_f32()).collect(),
                };
                (t.name, OwnedTensor::f32(t.shape, &values))
            })
            .collect(),
        None,
    )?;
    tensor_file::write_atomic(
        &a.out.join("layout.json"),
        serde_json::to_string_pretty(&doc)?.as_bytes(),
    )?;
    eprintln!("wrote {count} tensors to {}", a.out.display());
    Ok(ExitCode::SUCCESS)
}
