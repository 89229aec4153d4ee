//! The gates as a library: a [`GatePlan`] holds every setting, resolved
//! (the thresholds read, the executor chosen), and [`run`] gates the
//! artifact in one call, writing the report (or, for a partial run, the
//! partial report `--merge` combines) and recording acceptance.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};

use super::features::{ArtifactTower, ReferenceTower};
use super::{
    CosineGate, GateName, Gates, PlacementSource, Report, ResidencyBucket, ResidencyGate, Status,
    Tool, cosine, residency, task, vqa,
};
use crate::artifact::{Artifact, Cleared, sha256_file};
use crate::buckets::BucketsFile;
use crate::checkpoint::hub::HubEvents;
use crate::checkpoint::{resolve_model, weight_files};
use crate::error::{Error, Result};
use crate::exec::coreai::CoreAi;
use crate::exec::coreml::{CoreMl, Timeouts};
use crate::exec::{Executor, ExecutorKind, MilExecutor};
use crate::family;
use crate::family::Model;
use crate::interp::Precision;
use crate::lm::Vlm;
use crate::mlpackage::Package;
use crate::preprocess::PixelBatch;
use crate::runtime::Runtime;

/// What to gate and how, every setting resolved.
#[derive(Clone, Debug)]
pub struct GatePlan {
    /// The artifact directory.
    pub artifact: PathBuf,
    /// The reference's checkpoint (a directory or a repo id; default: the
    /// source the manifest records) and the revision of a repo id.
    pub model: Option<String>,
    pub revision: Option<String>,
    /// Where the hub's notes and download progress go.
    pub hub_events: HubEvents,
    /// Images for the cosine gate (default: the golden set).
    pub images: Option<PathBuf>,
    /// Texts for a text encoder's cosine gate, one per line (default: the
    /// golden texts).
    pub texts: Option<PathBuf>,
    /// Questions for the VQA gate (default: the golden set).
    pub vqa: Option<PathBuf>,
    /// Labelled images for the task gate (default: the golden set).
    pub task: Option<PathBuf>,
    /// Gate only these buckets (a partial run); empty: every bucket.
    pub buckets: Vec<String>,
    /// Combine the partial reports under `gate/partial/` instead of gating.
    pub merge: bool,
    /// Gates skipped on purpose.
    pub skip: Vec<GateName>,
    /// The thresholds.
    pub thresholds: BucketsFile,
    /// What runs the artifact.
    pub executor: ExecutorKind,
    /// Core ML's limits, when it runs the artifact.
    pub timeouts: Timeouts,
    /// How the interpreter runs, when it runs the artifact, and where each
    /// run's profile goes ([`MilExecutor`]).
    pub interp: crate::interp::Settings,
    pub on_profile: Option<fn(&crate::interp::Profile)>,
    /// The interpreter's numeric mode, where it runs the artifact: `ane`
    /// (the CLI's default: fp16 with the Neural Engine's measured limits,
    /// docs/numerics.md) or `fp16`; fp32 is refused.
    pub precision: Precision,
}

impl GatePlan {
    /// The interpreter as the gates run it: in the plan's precision, with
    /// the plan's settings.
    fn mil(&self) -> MilExecutor {
        MilExecutor {
            precision: self.precision,
            settings: self.interp,
            on_profile: self.on_profile,
        }
    }

    /// What runs `art` in this gate run, as `--executor` chose: Core ML
    /// (with CPU_AND_NE) on a Mac, the Core AI runtime on its `.aimodel`,
    /// or the interpreter.
    fn runner(&self, art: &Artifact) -> Result<Runner> {
        if self.executor.on_aimodel(art)? {
            let mut c = CoreAi::for_artifact(crate::home::find_env()?, art)?;
            c.served.timeouts = self.timeouts;
            return Ok(Runner::Coreai(c));
        }
        Ok(match self.executor.coreml("CPU_AND_NE", self.timeouts)? {
            Some(c) => Runner::Coreml(c),
            None => Runner::Mil(self.mil()),
        })
    }
}

/// What executes the artifact in a gate run, shared by its gates: the
/// children's clones share one child (and the models it loaded).
#[derive(Clone)]
enum Runner {
    Mil(MilExecutor),
    Coreml(CoreMl),
    Coreai(CoreAi),
}

impl Runner {
    fn executor(&self) -> &dyn Executor {
        match self {
            Runner::Mil(m) => m,
            Runner::Coreml(c) => c,
            Runner::Coreai(c) => c,
        }
    }

    /// Where the residency gate's placements come from with this runner.
    fn placement_source(&self) -> PlacementSource {
        match self {
            Runner::Mil(_) => PlacementSource::Predicted,
            Runner::Coreml(_) => PlacementSource::CoremlPlan,
            Runner::Coreai(_) => PlacementSource::CoreaiPredicted,
        }
    }

    /// The format this runner executes.
    fn format(&self) -> super::GatedFormat {
        match self {
            Runner::Coreai(_) => super::GatedFormat::Aimodel,
            _ => super::GatedFormat::Mlpackage,
        }
    }

    fn boxed(&self) -> Box<dyn Executor> {
        match self {
            Runner::Mil(m) => Box::new(*m),
            Runner::Coreml(c) => Box::new(c.clone()),
            Runner::Coreai(c) => Box::new(c.clone()),
        }
    }
}

/// What a gate run tells its caller as it goes.
pub enum Note<'a> {
    /// What it is working on.
    Progress(&'a str),
    /// Something the user should know that does not stop the run.
    Warning(&'a str),
}

/// What a gate run wrote.
#[derive(Clone, Debug)]
pub enum Written {
    /// A partial report, for `--merge` once every bucket is gated.
    Partial(PathBuf),
    /// `report.json` and `report.html` in this directory, and the result in
    /// the manifest.
    Report(PathBuf),
}

/// Gate `plan.artifact` (or merge its partial reports), write what the run
/// produced, and return the report. The report's statuses are the verdict
/// ([`super::exit_code`]); an `Err` is a run that could not be made.
pub fn run(plan: &GatePlan, note: &dyn Fn(Note)) -> Result<(Report, Written)> {
    let mut art = Artifact::open(&plan.artifact)?;
    check_inputs(plan, &art)?;
    // The gates judge exactly the bytes the manifest lists: verified before
    // any gate runs (in `gate_run`, beside hashing the source and opening
    // the packages).
    note(Note::Progress("verifying the artifact's files"));
    if plan.merge {
        art.verify()?;
    }
    let bfile = &plan.thresholds;
    let skipped: Vec<String> = {
        let mut v: Vec<String> = plan.skip.iter().map(|g| g.name().to_string()).collect();
        v.sort();
        v.dedup();
        v
    };
    let gate_dir = art.dir.join("gate");
    let vqa_th = vqa::VqaThresholds {
        agreement_min: bfile.gates.vqa_agreement_min,
        accuracy_drop_max: bfile.gates.vqa_accuracy_drop_max,
        informative_margin: bfile.gates.vqa_informative_margin,
    };
    let task_th = task::TaskThresholds {
        agreement_min: bfile.gates.task_agreement_min,
        accuracy_drop_max: bfile.gates.task_accuracy_drop_max,
        informative_margin: bfile.gates.task_informative_margin,
    };

    let report = if plan.merge {
        // Every part is checked before the third gate runs over them.
        let parts = super::check_parts(&art, read_partials(&gate_dir.join("partial"))?)?;
        let runner = plan.runner(&art)?;
        let (vqa, task) = third_gates(plan, &art, None, &vqa_th, &task_th, &runner, note)?;
        let aimodel = match aimodel_runner(plan, &art, &runner)? {
            Some(r) => Some(third_gates(
                plan,
                &art,
                None,
                &vqa_th,
                &task_th,
                &r,
                &aside(note),
            )?),
            None => None,
        };
        let third = super::ThirdGates { vqa, task, aimodel };
        let mut r = super::merge(&art, parts, third)?;
        r.vqa_thresholds = vqa_th;
        r.task_thresholds = task_th;
        r
    } else {
        gate_run(plan, &art, skipped, vqa_th, task_th, note)?
    };

    let partial =
        !plan.merge && !plan.buckets.is_empty() && report.buckets.len() < art.buckets.len();
    let written = if partial {
        let dir = gate_dir.join("partial");
        std::fs::create_dir_all(&dir).map_err(|e| Error::io(&dir, e))?;
        let path = dir.join(format!("{}.json", report.buckets.join("+")));
        let text = serde_json::to_string_pretty(&report)
            .map_err(|e| Error::Invalid(format!("report: {e}")))?;
        crate::tensor_file::write_atomic(&path, text.as_bytes())?;
        Written::Partial(path)
    } else {
        note(Note::Progress("writing the report"));
        report.write(&gate_dir)?;
        super::record(&mut art, &report, &gate_dir)?;
        Written::Report(gate_dir)
    };
    Ok((report, written))
}

/// The partial reports under `dir` (none when it does not exist), parsed.
fn read_partials(dir: &Path) -> Result<Vec<(PathBuf, Report)>> {
    let mut parts = Vec::new();
    if dir.is_dir() {
        let mut paths: Vec<PathBuf> = std::fs::read_dir(dir)
            .map_err(|e| Error::io(dir, e))?
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
    Ok(parts)
}

/// Every input the gates of this run will read, checked before any gate
/// runs, so that a wrong path or a malformed file is an error (exit 2) at
/// once rather than after minutes of work: the cosine gate's images, the
/// VQA gate's questions and their images, the task gate's labelled images
/// (given with `--task`, or the default set when it is there; without it
/// the gate reports `not_run`), the buckets asked for, and the executor.
/// The cosine gate's cases for the artifact's modality: images (`--images`,
/// else the golden images), or a text encoder's texts (`--texts`, else the
/// golden texts); the other option is an error rather than ignored.
fn cosine_cases(plan: &GatePlan, art: &Artifact) -> Result<Vec<cosine::Case>> {
    match art.cfg.input() {
        crate::family::Input::Pixels(_) => {
            if plan.texts.is_some() {
                return Err(Error::Invalid(format!(
                    "--texts is for text encoders; {} is an image tower (--images DIR)",
                    art.dir.display()
                )));
            }
            cosine::cases(plan.images.as_deref())
        }
        crate::family::Input::Tokens(_) => {
            if plan.images.is_some() {
                return Err(Error::Invalid(format!(
                    "--images is for image towers; {} is a text encoder (--texts FILE)",
                    art.dir.display()
                )));
            }
            cosine::text_cases(plan.texts.as_deref())
        }
    }
}

fn check_inputs(plan: &GatePlan, art: &Artifact) -> Result<()> {
    let skip = |g: GateName| plan.skip.contains(&g);
    let exists = |p: &Path| -> Result<()> {
        if p.is_file() {
            Ok(())
        } else {
            Err(Error::io(
                p,
                std::io::Error::new(std::io::ErrorKind::NotFound, "no such image file"),
            ))
        }
    };
    for b in &plan.buckets {
        art.bucket(b)?;
    }
    // The executor asked for can run here, on this artifact (Core AI needs
    // its .aimodel); nothing is started yet.
    plan.runner(art)?;
    if !plan.merge && !skip(GateName::Cosine) {
        for case in cosine_cases(plan, art)? {
            case.images.iter().try_for_each(|i| exists(i))?;
        }
    }
    if art.family.decoder().is_some() {
        if !skip(GateName::Vqa) {
            let file = vqa::question_file(plan.vqa.as_deref())?;
            for q in vqa::read_questions(&file)? {
                exists(&q.image)
                    .map_err(|e| Error::config(&file, format!("question `{}`: {e}", q.question)))?;
            }
        }
    } else if art.cfg.pooled_output().is_some() && !skip(GateName::Task) {
        let file = match &plan.task {
            Some(f) => Some(f.clone()),
            None => task::label_file(None, art.cfg.input().tokens().is_some()).ok(),
        };
        if let Some(file) = file {
            for l in task::read_labels(&file)? {
                if l.text.is_none() {
                    exists(&l.image).map_err(|e| Error::config(&file, e.to_string()))?;
                }
            }
        }
    }
    Ok(())
}

/// Whether `dir`'s config and weights hash as the manifest's source records.
fn source_matches(art: &Artifact, dir: &Path) -> Result<bool> {
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
fn model_dir(plan: &GatePlan, art: &Artifact) -> Result<PathBuf> {
    if let Some(m) = &plan.model {
        return resolve_model(m, plan.revision.as_deref(), &plan.hub_events);
    }
    art.source_dir()
}

/// The third gate and the one that does not apply: VQA for a family with a
/// language model, the task gate for one with a pooled output. `run` gives
/// the reference's checkpoint and whether the run is partial (the gate is
/// then deferred to `--merge`); `None`: a merge, which finds the checkpoint
/// itself.
fn third_gates(
    plan: &GatePlan,
    art: &Artifact,
    run: Option<(&Path, bool)>,
    vqa_th: &vqa::VqaThresholds,
    task_th: &task::TaskThresholds,
    runner: &Runner,
    note: &dyn Fn(Note),
) -> Result<(vqa::VqaGate, task::TaskGate)> {
    let skip = |g: GateName| plan.skip.contains(&g);
    let family = art.family.name();
    let partial = run.is_some_and(|r| r.1);
    let dir = match run {
        Some((d, _)) => d.to_path_buf(),
        None => model_dir(plan, art)?,
    };
    if art.family.decoder().is_some() {
        let v = if skip(GateName::Vqa) {
            vqa::unavailable(plan.vqa.as_deref(), true, "")?
        } else if partial {
            vqa::deferred(plan.vqa.as_deref())?
        } else {
            vqa_gate(plan, art, &dir, vqa_th, runner, note)?
        };
        let t = task::TaskGate::without(
            if skip(GateName::Task) {
                Status::Skipped
            } else {
                Status::NotApplicable
            },
            format!("{family} has a language model: the VQA gate is its third gate"),
        );
        return Ok((v, t));
    }
    let v = vqa::VqaGate {
        status: if skip(GateName::Vqa) {
            Status::Skipped
        } else {
            Status::NotApplicable
        },
        message: format!("{family} has no language model: the task gate is its third gate"),
        agreement: None,
        accuracy_reference: None,
        accuracy_artifact: None,
        majority: None,
        questions: vec![],
    };
    let text = art.cfg.input().tokens().is_some();
    let labels = |p: Option<&Path>| -> Result<Vec<task::Labelled>> {
        let l = task::read_labels(&task::label_file(p, text)?)?;
        if l.first().is_some_and(|l| l.text.is_some()) != text {
            return Err(Error::Invalid(format!(
                "the task gate's labelled set holds {}, but {} takes {}",
                if text { "images" } else { "texts" },
                art.dir.display(),
                art.cfg.input().noun()
            )));
        }
        Ok(l)
    };
    let t = match art.cfg.pooled_output() {
        None => task::TaskGate::without(
            Status::NotApplicable,
            format!("{family} has neither a language model nor a pooled output"),
        ),
        Some(_) if skip(GateName::Task) => {
            task::TaskGate::without(Status::Skipped, "skipped with --skip task")
        }
        // No labels to fit probes on: the gate cannot run (a file given
        // with --task that cannot be read stops the gate instead).
        Some(_) if let (None, Err(why)) = (&plan.task, task::label_file(None, text)) => {
            task::TaskGate::without(
                Status::NotRun,
                format!(
                    "no labelled images ({why}); the artifact cannot be accepted without the task gate"
                ),
            )
        }
        Some(_) if partial => {
            labels(plan.task.as_deref())?;
            task::TaskGate::without(
                Status::Deferred,
                "needs every bucket: runs when the partial reports are merged (--merge)",
            )
        }
        Some(pooling) => {
            let labelled = labels(plan.task.as_deref())?;
            task_gate(art, &dir, pooling, &labelled, task_th, runner, note)?
        }
    };
    Ok((v, t))
}

/// Labelled images the task gate gives the reference tower in one call (of
/// one grid; the tower runs them in passes of its own).
const TASK_IMAGES_PER_CALL: usize = 16;

/// The task gate: the reference's pooled embeddings of every labelled image
/// (the tower then dropped), the artifact's of the test images as the
/// cosine gate executes it, then the probes ([`task::evaluate`]).
fn task_gate(
    art: &Artifact,
    dir: &Path,
    pooling: crate::family::Pooling,
    labelled: &[task::Labelled],
    th: &task::TaskThresholds,
    runner: &Runner,
    note: &dyn Fn(Note),
) -> Result<task::TaskGate> {
    let ck = Model::open(dir)?;
    if art.cfg.input().tokens().is_some() {
        return text_task_gate(art, &ck, pooling, labelled, th, runner, note);
    }
    let pooled = pooling.output();
    let index = pooled_index(art, pooling)?;
    // Each image resized as the runtime resizes it: to fit the largest bucket.
    let largest = art.buckets.iter().map(|b| b.patches).max().unwrap_or(0);
    let (mut train, mut test_ref) = (Vec::new(), Vec::new());
    {
        let tower = crate::family::reference_tower(&ck)?;
        // Images of one grid run together (the encoders take several images
        // per forward, in passes of shared weights), a call at a time.
        let fitted = labelled.iter().map(|l| {
            let b = cosine::fit(
                &art.cfg,
                std::slice::from_ref(&l.image),
                ck.image_processor()?,
                largest,
            )?;
            Ok((l, b))
        });
        let (mut done, started) = (0, std::time::Instant::now());
        for call in runs(fitted, |(_, b)| b.grid_thw.clone(), TASK_IMAGES_PER_CALL) {
            done += pooled_reference(
                tower.as_ref(),
                &call?,
                index,
                pooling,
                &mut train,
                &mut test_ref,
            )?;
            note(Note::Progress(&format!(
                "task: reference {done}/{}{}",
                labelled.len(),
                super::jobs::eta(started.elapsed(), done, labelled.len())
            )));
        }
    }
    let rt = artifact_runtime(art, runner)?;
    let tests: Vec<&task::Labelled> = labelled
        .iter()
        .filter(|l| l.split == task::Split::Test)
        .collect();
    // The held-out images through the artifact: the first alone, the rest
    // side by side when the executor allows it (super::jobs).
    let jobs: Vec<(usize, &task::Labelled)> = tests.iter().copied().enumerate().collect();
    let embed = |&(_, l): &(usize, &task::Labelled)| -> Result<(Vec<f32>, String)> {
        let e = rt.embed_file(&l.image)?;
        let o = e
            .outputs
            .into_iter()
            .find(|o| o.name == pooled)
            .ok_or_else(|| Error::Invalid(format!("the artifact gave no `{pooled}`")))?;
        Ok((pooling.pool(&o.values, o.width), e.bucket))
    };
    let label =
        |&(_, l): &(usize, &task::Labelled)| format!("task: artifact {}", l.image.display());
    let test = artifact_side(&rt, &jobs, &embed, &label, test_ref, note)?;
    Ok(task::evaluate(
        labelled,
        &train,
        &test,
        &pooling.to_string(),
        th,
    ))
}

/// Where the task gate's pooled output stands among the family's outputs.
fn pooled_index(art: &Artifact, pooling: crate::family::Pooling) -> Result<usize> {
    let pooled = pooling.output();
    art.cfg
        .outputs(0)
        .iter()
        .position(|s| s.file_name == pooled)
        .ok_or_else(|| Error::Invalid(format!("the family has no output `{pooled}`")))
}

/// A text encoder's task gate: each labelled text tokenized as the runtime
/// does (truncated to the largest bucket; the checkpoint's tokenizer for the
/// reference, the artifact's for the artifact), embedded as the checkpoint's
/// users embed it (its sentence-transformers pooling where it has one, else
/// the family's pooled output), the reference's embeddings of every text
/// (several texts per forward), the artifact's of the test texts, then the
/// probes ([`task::evaluate`]).
fn text_task_gate(
    art: &Artifact,
    ck: &Model,
    pooling: crate::family::Pooling,
    labelled: &[task::Labelled],
    th: &task::TaskThresholds,
    runner: &Runner,
    note: &dyn Fn(Note),
) -> Result<task::TaskGate> {
    let sentence = art.cfg.tokens()?.sentence_pooling();
    let width = art.cfg.hidden_size();
    let pooled = pooling.output();
    let index = pooled_index(art, pooling)?;
    let per_token = art.cfg.outputs(0)[index].padded;
    let embed = |rows: &[f32]| match sentence {
        Some(p) => p.pool(rows, width),
        None => pooling.pool(rows, width),
    };
    let largest = art.buckets.iter().map(|b| b.patches).max().unwrap_or(0);
    let (mut train, mut test_ref) = (Vec::new(), Vec::new());
    {
        let encoder = crate::family::text_encoder(ck)?;
        let tok = ck.text_processor()?;
        let mut done = 0;
        for call in labelled.chunks(TASK_IMAGES_PER_CALL) {
            let tokens = call
                .iter()
                .map(|l| tok.encode(l.text.as_deref().unwrap_or_default(), largest))
                .collect::<Result<Vec<_>>>()?;
            let out = encoder.forward(&tokens, false)?;
            let all = crate::reference::to_vec(out.outputs.get(index).ok_or_else(|| {
                Error::Invalid(format!("the reference encoder gave no `{pooled}`"))
            })?)?;
            let mut at = 0;
            for (l, t) in call.iter().zip(&tokens) {
                // `pooled` is a row per token (last_hidden_state) or per text.
                let n = if per_token { t.len() } else { 1 };
                let v = embed(&all[at * width..(at + n) * width]);
                at += n;
                match l.split {
                    task::Split::Train => train.push(v),
                    task::Split::Test => test_ref.push(v),
                }
            }
            done += call.len();
            note(Note::Progress(&format!(
                "task: reference {done}/{}",
                labelled.len()
            )));
        }
    }
    let rt = artifact_runtime(art, runner)?;
    let jobs: Vec<&task::Labelled> = labelled
        .iter()
        .filter(|l| l.split == task::Split::Test)
        .collect();
    let wanted = if sentence.is_some() {
        "sentence_embedding"
    } else {
        pooled
    };
    let run = |l: &&task::Labelled| -> Result<(Vec<f32>, String)> {
        let e = rt.embed_text(l.text.as_deref().unwrap_or_default())?;
        let o = e
            .outputs
            .into_iter()
            .find(|o| o.name == wanted)
            .ok_or_else(|| Error::Invalid(format!("the artifact gave no `{wanted}`")))?;
        let v = if sentence.is_some() {
            o.values
        } else {
            pooling.pool(&o.values, o.width)
        };
        Ok((v, e.bucket))
    };
    let label = |l: &&task::Labelled| format!("task: artifact {:?}", l.describe());
    let test = artifact_side(&rt, &jobs, &run, &label, test_ref, note)?;
    let name = match sentence {
        Some(_) => "sentence_embedding".to_string(),
        None => pooling.to_string(),
    };
    Ok(task::evaluate(labelled, &train, &test, &name, th))
}

/// One held-out item's embedding from the artifact, and the bucket that ran it.
type Embedded = (Vec<f32>, String);

/// The task gate's artifact side: each held-out item (`jobs`, in the order
/// of `reference`, the reference's embeddings of them) embedded by `embed`
/// (its embedding and bucket), the first alone, the rest side by side when
/// the executor allows it ([`super::jobs`]).
fn artifact_side<J: Sync>(
    rt: &Runtime,
    jobs: &[J],
    embed: &(dyn Fn(&J) -> Result<Embedded> + Sync),
    label: &(dyn Fn(&J) -> String + Sync),
    reference: Vec<Vec<f32>>,
    note: &dyn Fn(Note),
) -> Result<Vec<task::Pooled>> {
    let progress = |m: &str| note(Note::Progress(m));
    let (done, _) = super::jobs::run_jobs(
        jobs,
        rt.executor().concurrent_runs(),
        embed,
        label,
        &progress,
    )?;
    Ok(reference
        .into_iter()
        .zip(done)
        .map(|(reference, (artifact, bucket))| task::Pooled {
            reference,
            artifact,
            bucket,
        })
        .collect())
}

/// `items` in runs of consecutive items with equal `key`, at most `max` in
/// a run (at least one); an item's error is passed on in place of its run.
fn runs<T, K: PartialEq>(
    items: impl Iterator<Item = Result<T>>,
    key: impl Fn(&T) -> K,
    max: usize,
) -> impl Iterator<Item = Result<Vec<T>>> {
    let mut items = items.fuse();
    let mut waiting: Option<T> = None;
    std::iter::from_fn(move || {
        let mut run: Vec<T> = waiting.take().into_iter().collect();
        while run.len() < max.max(1) {
            let item = match items.next() {
                Some(Ok(item)) => item,
                Some(Err(e)) => return Some(Err(e)),
                None => break,
            };
            if run.first().is_some_and(|first| key(first) != key(&item)) {
                waiting = Some(item);
                break;
            }
            run.push(item);
        }
        (!run.is_empty()).then_some(Ok(run))
    })
}

/// The reference's pooled embeddings of `call`'s images (one grid), in one
/// forward, each pushed to `train` or `test` by its split; how many.
fn pooled_reference(
    tower: &dyn crate::reference::VisionTower,
    call: &[(&task::Labelled, PixelBatch)],
    index: usize,
    pooling: crate::family::Pooling,
    train: &mut Vec<Vec<f32>>,
    test: &mut Vec<Vec<f32>>,
) -> Result<usize> {
    use candle_core::{Device, Tensor};
    let Some((_, first)) = call.first() else {
        return Ok(0);
    };
    let grids: Vec<[usize; 3]> = call
        .iter()
        .flat_map(|(_, b)| b.grid_thw.iter().copied())
        .collect();
    let values: Vec<f32> = call
        .iter()
        .flat_map(|(_, b)| b.pixel_values.iter().copied())
        .collect();
    let rows = values.len() / first.row_len.max(1);
    let pv = Tensor::from_vec(values, (rows, first.row_len), &Device::Cpu)?;
    let out = tower.forward(&pv, &grids, false)?;
    let name = pooling.output();
    let t = out
        .outputs
        .get(index)
        .ok_or_else(|| Error::Invalid(format!("the reference tower gave no `{name}`")))?;
    let width = t.dim(1)?;
    let all = crate::reference::to_vec(t)?;
    // The images share a grid, so each has the same number of rows.
    let per = all.len() / call.len();
    for ((l, _), rows) in call.iter().zip(all.chunks_exact(per.max(1))) {
        let v = pooling.pool(rows, width);
        match l.split {
            task::Split::Train => train.push(v),
            task::Split::Test => test.push(v),
        }
    }
    Ok(call.len())
}

/// The artifact loaded as the cosine gate executes it (the same child when
/// there is one), accepted or not.
fn artifact_runtime(art: &Artifact, runner: &Runner) -> Result<Runtime> {
    let executor = runner.boxed();
    // The gates run what they judge, whose files they verified as they
    // started: cleared without acceptance, and without hashing them again.
    Runtime::load(Cleared::verified(art.clone()), executor)
}

/// The VQA gate: the checkpoint's language model answers the questions from
/// the reference tower and from the artifact as the cosine gate executes it.
/// Without a loadable language model it is `not_run`, with the reason.
fn vqa_gate(
    plan: &GatePlan,
    art: &Artifact,
    dir: &Path,
    th: &vqa::VqaThresholds,
    runner: &Runner,
    note: &dyn Fn(Note),
) -> Result<vqa::VqaGate> {
    let vlm = match Vlm::load(dir, family::decoder) {
        Ok(v) => v,
        Err(e) => {
            return vqa::unavailable(
                plan.vqa.as_deref(),
                false,
                &format!("no language model to answer with ({e})"),
            );
        }
    };
    let questions = vqa::read_questions(&vqa::question_file(plan.vqa.as_deref())?)?;
    let ck = Model::open(dir)?;
    let reference = ReferenceTower::load(&ck)?;
    let rt = artifact_runtime(art, runner)?;
    vqa::run(
        &questions,
        &vlm,
        &reference,
        &ArtifactTower(&rt),
        th,
        &|m| note(Note::Progress(&format!("vqa: {m}"))),
    )
}

/// The reference's checkpoint (its directory and the checkpoint, checked to
/// be the artifact's model), whether it hashes as the manifest's source (a
/// warning where not), and the selected buckets' packages, by file name.
#[allow(clippy::type_complexity)]
fn open_sources(
    plan: &GatePlan,
    art: &Artifact,
    selected: &[&crate::artifact::BucketEntry],
    note: &dyn Fn(Note),
) -> Result<(PathBuf, Model, bool, HashMap<String, Package>)> {
    let dir = model_dir(plan, art)?;
    let ck = Model::open(&dir)?;
    if ck.vision != art.cfg {
        return Err(Error::checkpoint(
            &dir,
            "its vision config differs from the artifact's: not the model this artifact was built from",
        ));
    }
    note(Note::Progress("hashing the source checkpoint"));
    let matches = source_matches(art, &dir)?;
    if !matches {
        note(Note::Warning(&format!(
            "{} does not hash as the source recorded in the manifest",
            dir.display()
        )));
    }
    let mut pkgs: HashMap<String, Package> = HashMap::new();
    for p in selected.iter().filter_map(|b| b.package.as_ref()) {
        if !pkgs.contains_key(p) {
            note(Note::Progress(&format!("opening {p}")));
            pkgs.insert(p.clone(), Package::open(&art.dir.join(p))?);
        }
    }
    Ok((dir, ck, matches, pkgs))
}

/// Run the gates on the selected buckets.
fn gate_run(
    plan: &GatePlan,
    art: &Artifact,
    skipped: Vec<String>,
    vqa_th: vqa::VqaThresholds,
    task_th: task::TaskThresholds,
    note: &dyn Fn(Note),
) -> Result<Report> {
    let bfile = &plan.thresholds;
    let skip = |g: GateName| plan.skip.contains(&g);
    let selected: Vec<&crate::artifact::BucketEntry> = if plan.buckets.is_empty() {
        art.buckets.iter().collect()
    } else {
        plan.buckets
            .iter()
            .map(|n| art.bucket(n))
            .collect::<Result<Vec<_>>>()?
    };
    let thresholds: BTreeMap<String, crate::buckets::Thresholds> = selected
        .iter()
        .map(|b| (b.name.clone(), bfile.thresholds(&b.name)))
        .collect();

    // The artifact's files hash on a thread of their own while this one
    // hashes the source checkpoint and opens the packages (each a second or
    // so for a 2B-shaped tower); a modified artifact is the error reported
    // whatever else failed.
    let (verified, early) = std::thread::scope(|s| {
        let verifying = s.spawn(|| art.verify());
        let early = open_sources(plan, art, &selected, note);
        (verifying.join(), early)
    });
    verified.map_err(|_| {
        Error::Invalid("the thread verifying the artifact's files panicked".into())
    })??;
    let (dir, mut ck, matches, pkgs) = early?;

    // What runs the artifact as --executor chose (Core ML on a Mac, with
    // its plan of placements; the interpreter; Core AI on the .aimodel
    // alone), and, for an artifact that ships an .aimodel gated with
    // another executor, the Core AI runtime on it beside.
    let runner = plan.runner(art)?;
    let aimodel_runner = aimodel_runner(plan, art, &runner)?;
    let each = Each {
        plan,
        art,
        selected: &selected,
        pkgs: &pkgs,
        thresholds: &thresholds,
        note,
    };

    // 1. Residency.
    let residency_gate = each.residency(&runner)?;
    let aimodel_residency = aimodel_runner
        .as_ref()
        .map(|r| {
            let aside = aside(note);
            Each {
                note: &aside,
                ..each
            }
            .residency(r)
        })
        .transpose()?;

    // 2. Cosine. The reference runs first, over every case, and is dropped
    // before the artifact runs: the two towers' weights are never resident
    // together (the VQA gate loads the reference again). Both formats are
    // compared with the same reference runs.
    let (cosine_gate, aimodel_cosine) = if skip(GateName::Cosine) {
        let skipped = |r: &Runner| CosineGate {
            status: Status::Skipped,
            executor: r.executor().describe(),
            message: "skipped with --skip cosine".into(),
            headroom: Default::default(),
            cases: vec![],
            constants: vec![],
            seconds: Default::default(),
            side_by_side: 0,
        };
        (skipped(&runner), aimodel_runner.as_ref().map(skipped))
    } else {
        let cases = cosine_cases(plan, art)?;
        let with_th: Vec<(&crate::artifact::BucketEntry, f64)> = selected
            .iter()
            .map(|b| (*b, thresholds[&b.name].cosine_min))
            .collect();
        let progress = |m: &str| note(Note::Progress(&format!("cosine: {m}")));
        let started = std::time::Instant::now();
        let refs = {
            progress("loading the reference tower");
            let tower = crate::family::oracle(&ck)?;
            if let Some(w) = ck.weights.nonfinite_warning() {
                note(Note::Warning(&format!("{}: {w}", dir.display())));
            }
            // The tower holds its own f32 copies: the checkpoint's mapped
            // pages need not stay resident.
            ck.checkpoint.weights.unmap();
            let run = each.cosine_run(&ck, &runner);
            run.references(&tower, &with_th, &cases, &progress)?
        };
        let reference_s = started.elapsed().as_secs_f64();
        let main = each.cosine(&ck, &runner, &refs, &with_th, &cases, reference_s)?;
        let other = aimodel_runner
            .as_ref()
            .map(|r| {
                let aside = aside(note);
                Each {
                    note: &aside,
                    ..each
                }
                .cosine(&ck, r, &refs, &with_th, &cases, reference_s)
            })
            .transpose()?;
        (main, other)
    };

    // 3. VQA or task, over every bucket: a partial run leaves it to --merge.
    // The same child, with the models the cosine gate loaded.
    let partial = selected.len() < art.buckets.len();
    let (vqa_gate, task_gate) = third_gates(
        plan,
        art,
        Some((&dir, partial)),
        &vqa_th,
        &task_th,
        &runner,
        note,
    )?;
    let aimodel = match (aimodel_runner, aimodel_residency, aimodel_cosine) {
        (Some(r), Some(residency), Some(cosine)) => {
            let (vqa, task) = third_gates(
                plan,
                art,
                Some((&dir, partial)),
                &vqa_th,
                &task_th,
                &r,
                &aside(note),
            )?;
            Some(Gates {
                residency,
                cosine,
                vqa,
                task,
            })
        }
        _ => None,
    };

    let mut r = Report {
        schema: super::SCHEMA.into(),
        tool: Tool {
            name: "ane-export".into(),
            version: env!("CARGO_PKG_VERSION").into(),
        },
        artifact: art.dir.display().to_string(),
        artifact_digest: art.digest(),
        model: dir.display().to_string(),
        source_matches: matches,
        created_unix: super::now_unix(),
        passed: false,
        accepted: false,
        buckets: selected.iter().map(|b| b.name.clone()).collect(),
        skipped,
        thresholds,
        test_faults: art.test_faults(),
        vqa_thresholds: vqa_th,
        task_thresholds: task_th,
        format: runner.format(),
        gates: Gates {
            residency: residency_gate,
            cosine: cosine_gate,
            vqa: vqa_gate,
            task: task_gate,
        },
        aimodel,
    };
    r.finish();
    r.accepted = super::accepts(&r, art);
    Ok(r)
}

/// The Core AI runtime on the `.aimodel` beside `runner`, for an artifact
/// that ships one gated with another executor (`None` with `--executor
/// coreai`, whose runner is already it, and without an `.aimodel`).
fn aimodel_runner(plan: &GatePlan, art: &Artifact, runner: &Runner) -> Result<Option<Runner>> {
    if matches!(runner, Runner::Coreai(_)) || art.aimodel.is_none() {
        return Ok(None);
    }
    let mut c = CoreAi::for_artifact(crate::home::find_env()?, art)?;
    c.served.timeouts = plan.timeouts;
    Ok(Some(Runner::Coreai(c)))
}

/// `note` with its progress marked as the `.aimodel`'s.
fn aside<'a>(note: &'a dyn Fn(Note)) -> impl Fn(Note) + 'a {
    move |n| match n {
        Note::Progress(m) => note(Note::Progress(&format!("(.aimodel) {m}"))),
        w => note(w),
    }
}

/// What the residency and cosine gates of one run share, whichever format
/// they judge.
#[derive(Clone, Copy)]
struct Each<'a> {
    plan: &'a GatePlan,
    art: &'a Artifact,
    selected: &'a [&'a crate::artifact::BucketEntry],
    pkgs: &'a HashMap<String, Package>,
    thresholds: &'a BTreeMap<String, crate::buckets::Thresholds>,
    note: &'a dyn Fn(Note),
}

impl Each<'_> {
    /// The residency gate of the format `runner` executes: the static
    /// checker on each bucket's function (`predicted`), Core ML's plan on a
    /// Mac (`coreml-plan`, the static checks still applied), or the static
    /// rules on the Core AI program's ops (`coreai-predicted`).
    fn residency(&self, runner: &Runner) -> Result<ResidencyGate> {
        let source = runner.placement_source();
        if self.plan.skip.contains(&GateName::Residency) {
            return Ok(ResidencyGate {
                status: Status::Skipped,
                source,
                message: "skipped with --skip residency".into(),
                buckets: vec![],
            });
        }
        // The Core AI program's ops, listed once for every function.
        let coreai_ops = match runner {
            Runner::Coreai(c) => {
                (self.note)(Note::Progress("residency: listing the .aimodel's ops"));
                let json = c.ops().map_err(|e| {
                    Error::Invalid(format!("{}: the op listing: {e}", c.aimodel.display()))
                })?;
                let ops: residency::coreai::CoreAiOps =
                    serde_json::from_str(&json).map_err(|e| {
                        Error::Invalid(format!(
                            "{}: the op listing is not what `ane_export.coreai ops` writes: {e}",
                            c.aimodel.display()
                        ))
                    })?;
                Some(ops)
            }
            _ => None,
        };
        let mut buckets = Vec::new();
        for b in self.selected {
            (self.note)(Note::Progress(&format!("residency: {}", b.name)));
            // The package's function, where the artifact ships one.
            let package = match b.package_function() {
                Some((p, function)) => {
                    let pkg = &self.pkgs[p];
                    let f = pkg.program.function(Some(function)).map_err(|m| {
                        Error::checkpoint(&self.art.dir.join(p), format!("bucket {}: {m}", b.name))
                    })?;
                    Some((p, pkg, f))
                }
                None => None,
            };
            let p = match (runner, &coreai_ops, package) {
                (Runner::Coreai(c), Some(listing), _) => {
                    let name = b.aimodel_function.as_deref().unwrap_or(&b.name);
                    let ops = listing.functions.get(name).ok_or_else(|| {
                        Error::Invalid(format!(
                            "{}: the op listing has no function {name} (bucket {})",
                            c.aimodel.display(),
                            b.name
                        ))
                    })?;
                    // The signature the program shares with the package, as
                    // the manifest records it.
                    let seq = b
                        .inputs
                        .iter()
                        .filter_map(|(_, s)| s.last().copied())
                        .max()
                        .unwrap_or(0);
                    let outputs: Vec<Vec<usize>> =
                        b.outputs.iter().map(|(_, s)| s.clone()).collect();
                    residency::coreai::predict_coreai(name, ops, seq, &outputs)
                }
                (Runner::Coreml(c), _, Some((path, pkg, f))) => {
                    let bytes: u64 = pkg.weight_bytes().values().sum();
                    let checks = residency::predict(pkg, f, bytes).checks;
                    // Measured placement; the static checks still apply.
                    let mut p = c
                        .plan(&self.art.dir.join(path), &f.name)
                        .and_then(|json| super::plan::plan_to_prediction(&f.name, &json))
                        .map_err(|m| {
                            Error::Invalid(format!("bucket {}: MLComputePlan: {m}", b.name))
                        })?;
                    p.checks = checks;
                    p
                }
                (_, _, Some((_, pkg, f))) => {
                    let bytes: u64 = pkg.weight_bytes().values().sum();
                    residency::predict(pkg, f, bytes)
                }
                (_, _, None) => {
                    return Err(Error::Invalid(format!(
                        "bucket {}: no package to place (the artifact ships the .aimodel alone)",
                        b.name
                    )));
                }
            };
            let th = self.thresholds[&b.name].residency_min;
            let ok = p.fraction + 1e-12 >= th && p.failed_checks().is_empty();
            buckets.push(ResidencyBucket {
                bucket: b.name.clone(),
                status: if ok { Status::Pass } else { Status::Fail },
                threshold: th,
                prediction: p,
            });
        }
        let (status, message) = super::residency_status(&buckets, source);
        Ok(ResidencyGate {
            status,
            source,
            message,
            buckets,
        })
    }

    /// The cosine comparison as `runner` executes the artifact.
    fn cosine_run<'b>(&'b self, ck: &'b Model, runner: &'b Runner) -> cosine::CosineRun<'b> {
        cosine::CosineRun {
            artifact: self.art,
            reference_pre: &ck.processor,
            executor: runner.executor(),
            ane_limits: matches!(runner, Runner::Mil(_)) && self.plan.precision == Precision::Ane,
        }
    }

    /// The cosine gate of the format `runner` executes, against the
    /// reference runs `refs` (made in `reference_s` seconds).
    fn cosine(
        &self,
        ck: &Model,
        runner: &Runner,
        refs: &cosine::References,
        with_th: &[(&crate::artifact::BucketEntry, f64)],
        cases: &[cosine::Case],
        reference_s: f64,
    ) -> Result<CosineGate> {
        let run = self.cosine_run(ck, runner);
        let progress = |m: &str| (self.note)(Note::Progress(&format!("cosine: {m}")));
        let started = std::time::Instant::now();
        let (results, side_by_side) = run.run(refs, self.pkgs, with_th, cases, &progress)?;
        let seconds = [
            ("reference".to_string(), reference_s),
            ("artifact".to_string(), started.elapsed().as_secs_f64()),
        ]
        .into_iter()
        .collect();
        // Constants the outputs cannot show, read from each bucket's program
        // (the .aimodel is translated from it).
        let mut constants = Vec::new();
        for b in self.selected {
            let Some((p, function)) = b.package_function() else {
                continue;
            };
            let pkg = &self.pkgs[p];
            if let Ok(f) = pkg.program.function(Some(function)) {
                constants.extend(
                    cosine::constant_mismatches(pkg, f, self.art.cfg.layer_norm_eps())
                        .into_iter()
                        .map(|m| format!("{}: {m}", b.name)),
                );
            }
        }
        let headroom = {
            let (mut by_op, mut norms) = Default::default();
            for c in &results {
                cosine::headroom::add_run(&mut by_op, &mut norms, &c.peaks, &c.case, &c.bucket);
            }
            cosine::headroom::finish(by_op, norms, run.ane_limits)
        };
        let (status, message) = super::cosine_status(&results, &constants);
        Ok(CosineGate {
            status,
            executor: runner.executor().describe(),
            message,
            headroom,
            cases: results,
            constants,
            seconds,
            side_by_side,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ok(v: &[u32]) -> Vec<Result<u32>> {
        v.iter().map(|&x| Ok(x)).collect()
    }

    #[test]
    fn runs_split_at_a_new_key_and_at_the_limit() {
        let got: Vec<Vec<u32>> = runs(ok(&[1, 1, 2, 2, 2, 3]).into_iter(), |x| *x, 2)
            .collect::<Result<_>>()
            .unwrap();
        assert_eq!(got, vec![vec![1, 1], vec![2, 2], vec![2], vec![3]]);
        let got: Vec<Vec<u32>> = runs(ok(&[5, 5, 5]).into_iter(), |x| *x, 16)
            .collect::<Result<_>>()
            .unwrap();
        assert_eq!(got, vec![vec![5, 5, 5]]);
        // A limit of 0 still makes progress, one item a run.
        let got: Vec<Vec<u32>> = runs(ok(&[7, 7]).into_iter(), |x| *x, 0)
            .collect::<Result<_>>()
            .unwrap();
        assert_eq!(got, vec![vec![7], vec![7]]);
        assert_eq!(runs(ok(&[]).into_iter(), |x| *x, 4).count(), 0);
    }

    #[test]
    fn runs_pass_an_error_on() {
        let items = vec![Ok(1), Err(Error::Invalid("image 2".into())), Ok(1)];
        let first = runs(items.into_iter(), |x: &u32| *x, 4).next().unwrap();
        match first {
            Err(Error::Invalid(m)) => assert_eq!(m, "image 2"),
            other => panic!(
                "expected the item's error, got {:?}",
                other.map(|r| r.len())
            ),
        }
    }
}
