//! `ane-export gate`.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use super::GateArgs;
use crate::artifact::{Artifact, sha256_file};
use crate::buckets::BucketsFile;
use crate::checkpoint::{Checkpoint, resolve_model, weight_files};
use crate::error::Error;
use crate::gate::{
    self, CosineGate, GateName, Gates, PlacementSource, Report, ResidencyBucket, ResidencyGate,
    Status, Tool, cosine, residency, vqa,
};
use crate::interp::Precision;
use crate::lm::Vlm;
use crate::lm::features::{ArtifactTower, ReferenceTower};
use crate::mlpackage::Package;
use crate::runtime::{LoadOptions, Runtime};

/// Whether `dir`'s config and weights hash as the manifest's source records.
fn source_matches(art: &Artifact, dir: &Path) -> crate::Result<bool> {
    let Some(want) = art.manifest["source"]["sha256"].as_object() else {
        return Ok(false);
    };
    let mut got = BTreeMap::new();
    for f in std::iter::once(dir.join("config.json")).chain(weight_files(dir)?) {
        let name = f
            .file_name()
            .map(|n| n.to_string_lossy().to_string())
            .unwrap_or_default();
        got.insert(name, sha256_file(&f)?);
    }
    Ok(got.len() == want.len()
        && got
            .iter()
            .all(|(k, v)| want.get(k).and_then(|w| w.as_str()) == Some(v.as_str())))
}

/// The reference's checkpoint: --model, else the source the manifest records.
fn model_dir(a: &GateArgs, art: &Artifact) -> crate::Result<PathBuf> {
    if let Some(m) = &a.model {
        return resolve_model(m, a.revision.as_deref());
    }
    let p = art.source_path.clone().ok_or_else(|| {
        Error::Invalid("the manifest records no source checkpoint; pass --model".into())
    })?;
    if !p.is_dir() {
        return Err(Error::Invalid(format!(
            "the source checkpoint recorded in the manifest, {}, is not here; pass --model",
            p.display()
        )));
    }
    Ok(p)
}

/// The VQA gate: the checkpoint's language model answers the questions from
/// the reference tower and from the artifact as the cosine gate executes it.
/// Without a loadable language model it is `not_run`, with the reason.
fn vqa_gate(
    a: &GateArgs,
    art: &Artifact,
    dir: &Path,
    th: &vqa::VqaThresholds,
    tower: Option<std::sync::Arc<dyn crate::reference::VisionTower>>,
    coreml: Option<crate::exec::coreml::CoreMl>,
) -> anyhow::Result<vqa::VqaGate> {
    let vlm = match Vlm::load(dir) {
        Ok(v) => v,
        Err(e) => {
            return Ok(vqa::unavailable(
                a.vqa.as_deref(),
                false,
                &format!("no language model to answer with ({e})"),
            )?);
        }
    };
    let questions = vqa::read_questions(&vqa::question_file(a.vqa.as_deref())?)?;
    let ck = Checkpoint::open(dir)?;
    let reference = match tower {
        Some(t) => ReferenceTower::shared(t, &ck),
        None => ReferenceTower::load(&ck)?,
    };
    let executor: Box<dyn crate::exec::Executor> = match coreml {
        Some(c) => Box::new(c),
        None => Box::new(crate::exec::MilExecutor(Precision::Fp16)),
    };
    let rt = Runtime::load(
        &art.dir,
        LoadOptions {
            allow_unaccepted: true,
            executor,
        },
    )?;
    let bar = spinner();
    let g = vqa::run(
        &questions,
        &vlm,
        &reference,
        &ArtifactTower(&rt),
        th,
        &|m| bar.set_message(format!("vqa: {m}")),
    )?;
    bar.finish_and_clear();
    Ok(g)
}

fn spinner() -> indicatif::ProgressBar {
    let bar =
        indicatif::ProgressBar::with_draw_target(None, indicatif::ProgressDrawTarget::stderr());
    if let Ok(style) = indicatif::ProgressStyle::with_template("{spinner} {msg} {elapsed}") {
        bar.set_style(style);
    }
    bar.enable_steady_tick(std::time::Duration::from_millis(200));
    bar
}

pub(super) fn run(a: GateArgs) -> anyhow::Result<ExitCode> {
    let mut art = Artifact::open(&a.artifact)?;
    // The gates judge exactly the bytes the manifest lists.
    art.verify()?;
    let (bfile, _source) = BucketsFile::load(a.buckets.as_deref())?;
    let skipped: Vec<String> = {
        let mut v: Vec<String> = a.skip.iter().map(|g| g.name().to_string()).collect();
        v.sort();
        v.dedup();
        v
    };
    let skip = |g: GateName| a.skip.contains(&g);
    let gate_dir = art.dir.join("gate");
    let vqa_th = vqa::VqaThresholds {
        agreement_min: bfile.gates.vqa_agreement_min,
        accuracy_drop_max: bfile.gates.vqa_accuracy_drop_max,
    };

    let report = if a.merge {
        let dir = gate_dir.join("partial");
        let mut parts = Vec::new();
        if dir.is_dir() {
            let mut paths: Vec<PathBuf> = std::fs::read_dir(&dir)
                .map_err(|e| Error::io(&dir, e))?
                .filter_map(|e| e.ok().map(|e| e.path()))
                .filter(|p| p.extension().is_some_and(|x| x == "json"))
                .collect();
            paths.sort();
            for p in paths {
                let text = std::fs::read_to_string(&p).map_err(|e| Error::io(&p, e))?;
                let r: Report = serde_json::from_str(&text)
                    .map_err(|e| Error::config(&p, format!("not a gate report: {e}")))?;
                parts.push((p, r));
            }
        }
        let vqa_gate = if skip(GateName::Vqa) {
            vqa::unavailable(a.vqa.as_deref(), true, "")?
        } else {
            let dir = model_dir(&a, &art)?;
            let coreml = a.coreml.executor(a.executor, "CPU_AND_NE")?;
            vqa_gate(&a, &art, &dir, &vqa_th, None, coreml)?
        };
        let mut r = gate::merge(&art, parts, vqa_gate)?;
        r.vqa_thresholds = vqa_th;
        r
    } else {
        gate_run(&a, &art, &bfile, skipped, vqa_th)?
    };

    let partial = !a.merge && !a.bucket.is_empty() && report.buckets.len() < art.buckets.len();
    if partial {
        let dir = gate_dir.join("partial");
        std::fs::create_dir_all(&dir).map_err(|e| Error::io(&dir, e))?;
        let path = dir.join(format!("{}.json", report.buckets.join("+")));
        crate::tensor_file::write_atomic(&path, serde_json::to_string_pretty(&report)?.as_bytes())?;
        eprintln!(
            "wrote {}; once every bucket is gated: ane-export gate {} --merge",
            path.display(),
            art.dir.display()
        );
    } else {
        report.write(&gate_dir)?;
        gate::record(&mut art, &report, &gate_dir)?;
        eprintln!(
            "wrote {} and report.html; manifest.json records {}",
            gate_dir.join("report.json").display(),
            if report.accepted {
                "acceptance"
            } else if report.passed {
                "the result, without acceptance (gates skipped)"
            } else {
                "the rejection"
            }
        );
    }
    if a.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        print!("{}", report.summary());
    }
    Ok(ExitCode::from(gate::exit_code(&report)))
}

/// Run the gates on the selected buckets.
fn gate_run(
    a: &GateArgs,
    art: &Artifact,
    bfile: &BucketsFile,
    skipped: Vec<String>,
    vqa_th: vqa::VqaThresholds,
) -> anyhow::Result<Report> {
    let skip = |g: GateName| a.skip.contains(&g);
    let selected: Vec<&crate::artifact::BucketEntry> = if a.bucket.is_empty() {
        art.buckets.iter().collect()
    } else {
        a.bucket
            .iter()
            .map(|n| art.bucket(n))
            .collect::<crate::Result<Vec<_>>>()?
    };
    let thresholds: BTreeMap<String, crate::buckets::Thresholds> = selected
        .iter()
        .map(|b| (b.name.clone(), bfile.thresholds(&b.name)))
        .collect();

    let dir = model_dir(a, art)?;
    let ck = Checkpoint::open(&dir)?;
    if ck.vision != art.cfg {
        return Err(Error::checkpoint(
            &dir,
            "its vision config differs from the artifact's: not the model this artifact was built from",
        )
        .into());
    }
    let matches = source_matches(art, &dir)?;
    if !matches {
        eprintln!(
            "warning: {} does not hash as the source recorded in the manifest",
            dir.display()
        );
    }

    // Core ML on a Mac (its plan of placements), else the interpreter
    // (placements predicted by the static checker).
    let coreml = a.coreml.executor(a.executor, "CPU_AND_NE")?;
    let source = if coreml.is_some() {
        PlacementSource::CoremlPlan
    } else {
        PlacementSource::Predicted
    };

    let mut pkgs: HashMap<String, Package> = HashMap::new();
    for b in &selected {
        if !pkgs.contains_key(&b.package) {
            pkgs.insert(b.package.clone(), Package::open(&art.package_path(b))?);
        }
    }

    // 1. Residency (predicted by the static checker).
    let residency_gate = if skip(GateName::Residency) {
        ResidencyGate {
            status: Status::Skipped,
            source,
            message: "skipped with --skip residency".into(),
            buckets: vec![],
        }
    } else {
        let mut buckets = Vec::new();
        for b in &selected {
            let pkg = &pkgs[&b.package];
            let f = pkg.program.function(Some(&b.function)).map_err(|m| {
                Error::checkpoint(&art.package_path(b), format!("bucket {}: {m}", b.name))
            })?;
            let bytes: u64 = pkg.weight_bytes().values().sum();
            let mut p = residency::predict(pkg, f, bytes);
            if let Some(c) = &coreml {
                // Measured placement; the static checks still apply.
                let checks = std::mem::take(&mut p.checks);
                p = c
                    .plan(&art.package_path(b), &b.function)
                    .and_then(|json| gate::plan::plan_to_prediction(&b.function, &json))
                    .map_err(|m| {
                        Error::Invalid(format!("bucket {}: MLComputePlan: {m}", b.name))
                    })?;
                p.checks = checks;
            }
            let th = thresholds[&b.name].residency_min;
            let ok = p.fraction + 1e-12 >= th && p.failed_checks().is_empty();
            buckets.push(ResidencyBucket {
                bucket: b.name.clone(),
                status: if ok { Status::Pass } else { Status::Fail },
                threshold: th,
                prediction: p,
            });
        }
        let (s, m) = gate::residency_status(&buckets, source);
        ResidencyGate {
            status: s,
            source,
            message: m,
            buckets,
        }
    };

    // 2. Cosine. The reference tower it loads is reused by the VQA gate.
    let mut loaded = None;
    let mil = crate::exec::MilExecutor(Precision::Fp16);
    let executor: &dyn crate::exec::Executor = match &coreml {
        Some(c) => c,
        None => &mil,
    };
    let cosine_gate = if skip(GateName::Cosine) {
        CosineGate {
            status: Status::Skipped,
            executor: executor.describe(),
            message: "skipped with --skip cosine".into(),
            cases: vec![],
            constants: vec![],
        }
    } else {
        let cases = cosine::cases(a.images.as_deref())?;
        let tower = crate::family::reference_tower(&ck)?;
        loaded = Some(tower.clone());
        let run = cosine::CosineRun {
            artifact: art,
            tower: tower.as_ref(),
            reference_pre: &ck.preprocessor,
            executor,
        };
        let with_th: Vec<(&crate::artifact::BucketEntry, f64)> = selected
            .iter()
            .map(|b| (*b, thresholds[&b.name].cosine_min))
            .collect();
        let bar = spinner();
        let results = run.run(&with_th, &cases, &|m| {
            bar.set_message(format!("cosine: {m}"))
        })?;
        bar.finish_and_clear();
        // Constants the outputs cannot show, read from each bucket's program.
        let mut constants = Vec::new();
        for b in &selected {
            let pkg = &pkgs[&b.package];
            if let Ok(f) = pkg.program.function(Some(&b.function)) {
                constants.extend(
                    cosine::constant_mismatches(pkg, f, art.cfg.layer_norm_eps())
                        .into_iter()
                        .map(|m| format!("{}: {m}", b.name)),
                );
            }
        }
        let (s, m) = gate::cosine_status(&results, &constants);
        CosineGate {
            status: s,
            executor: executor.describe(),
            message: m,
            cases: results,
            constants,
        }
    };

    // 3. VQA, over every bucket: a partial run leaves it to --merge.
    let vqa_gate = if skip(GateName::Vqa) {
        vqa::unavailable(a.vqa.as_deref(), true, "")?
    } else if selected.len() < art.buckets.len() {
        vqa::deferred(a.vqa.as_deref())?
    } else {
        // The same Core ML child, with the models the cosine gate loaded.
        vqa_gate(a, art, &dir, &vqa_th, loaded, coreml.clone())?
    };

    let mut r = Report {
        schema: gate::SCHEMA.into(),
        tool: Tool {
            name: "ane-export".into(),
            version: env!("CARGO_PKG_VERSION").into(),
        },
        artifact: art.dir.display().to_string(),
        artifact_digest: art.digest(),
        model: dir.display().to_string(),
        source_matches: matches,
        created_unix: gate::now_unix(),
        passed: false,
        accepted: false,
        buckets: selected.iter().map(|b| b.name.clone()).collect(),
        skipped,
        thresholds,
        vqa_thresholds: vqa_th,
        gates: Gates {
            residency: residency_gate,
            cosine: cosine_gate,
            vqa: vqa_gate,
        },
    };
    r.finish();
    r.accepted = gate::accepts(&r, art.buckets.len());
    Ok(r)
}
